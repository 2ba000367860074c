"""A real local HTTP server with per-route fault injection, onto which a domain mounts its fake APIs.

Integration tests and the demo start it (in-process, or as a separate process through
`serve_from_command_line`) and point the service at its URL. A domain describes its fake API as a `FakeApi`
(`service/testing/routes.py`) and mounts it (a domain's `fakes` module). Faults are queued per
route and each one is consumed by exactly one call, so a test can script "the first two calls fail, the third
one times out" deterministically. A latency per route slows every call of it, like a slow provider.
`/_control/*` lets another process do all of that over HTTP. Every route handler runs on the server's one
thread (`service/testing/serving.py`, aiohttp's web server), between the answers of every other call: it must be
quick and never block.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, Final, Self, get_args

from service.testing.process import serve_from_command_line
from service.testing.routes import (
    CONTROL_PREFIX,
    Control,
    FakeApi,
    Handler,
    KeyReader,
    Reply,
    Request,
    Route,
    Router,
    json_field,
    json_reply,
    key_from_body,
    key_from_header,
    key_from_param,
    key_from_query,
    method_not_allowed,
    not_found,
)
from service.testing.scripted import (
    BODYLESS_STATUSES,
    DEFAULT_FAIL_BODY,
    Fault,
    FaultKind,
    Outage,
    check_seconds,
    check_times,
    format_retry_after,
    optional_key,
    play,
)
from service.testing.serving import HttpServer, Outcome

__all__ = [
    "Control",
    "FakeApi",
    "FaultServer",
    "Handler",
    "KeyReader",
    "Reply",
    "Request",
    "Route",
    "json_field",
    "json_reply",
    "key_from_body",
    "key_from_header",
    "key_from_param",
    "key_from_query",
    "method_not_allowed",
    "serve_from_command_line",
]

# Control names the server answers itself; a mounted API cannot take them.
_OWN_CONTROLS: Final = frozenset({"state", "reset", "faults", "latency"})


class FaultServer:
    """Fake APIs served over real HTTP, with fault injection, latency and observation per route."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, apis: Iterable[FakeApi] = ()) -> None:
        """Configure the address and mount the APIs; nothing listens until start()."""
        self._host = host
        self._port = port
        self._server: HttpServer | None = None
        self._bound_port = port
        # One lock for the server's state: handlers run on the server's thread, arrangements on the tests'.
        self._lock = threading.Lock()
        self._router = Router()
        self._apis: list[FakeApi] = []
        self._controls: dict[str, Control] = {"faults": self._control_fault, "latency": self._control_latency}
        self._faults: dict[str, deque[Fault]] = {}
        self._outages: dict[str, Outage] = {}
        self._calls: dict[str, Counter[str | None]] = {}
        self._latency: dict[str, float] = {}
        for api in apis:
            self.mount(api)

    def mount(self, api: FakeApi) -> None:
        """Serve an API's routes and controls too; ValueError if a name or a method and path is taken."""
        with self._lock:
            taken = _OWN_CONTROLS | self._controls.keys()
            clashing = sorted(name for name in api.controls if not name or name in taken or "/" in name)
            if clashing:
                raise ValueError(f"control names taken or invalid: {', '.join(clashing)}")
            self._router.add(api.routes)
            for route in api.routes:
                self._faults[route.name] = deque()
                self._calls[route.name] = Counter()
            self._controls.update(api.controls)
            self._apis.append(api)

    @property
    def routes(self) -> tuple[str, ...]:
        """The names of the routes served, in the order they were mounted."""
        with self._lock:
            return self._router.names

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Start serving on a daemon thread and return the base URL, e.g. `http://127.0.0.1:54321`."""
        if self._server is not None:
            raise RuntimeError(f"{type(self).__name__} is already started")
        server = HttpServer(self._host, self._port, self._answer)
        self._bound_port = server.start()
        self._server = server
        return self.url

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://{self._host}:{self._bound_port}"

    def stop(self) -> None:
        """Stop serving, drop open connections and wake delayed answers; safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> Self:
        """Start the server (`with FaultServer(apis=[...]) as server:`)."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server."""
        self.stop()

    # -- arrangement -----------------------------------------------------------------------------------------

    def fail_next(
        self,
        route: str,
        times: int = 1,
        status: int = 503,
        retry_after: float | str | None = None,
        body: object = None,
        key: str | None = None,
    ) -> None:
        """Answer the next `times` calls of a route (for `key`, if given) with `status` and no side effect."""
        self._check_route(route)
        check_times(times)
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
            raise ValueError(f"status must be an HTTP status between 200 and 599, got {status!r}")
        if status in BODYLESS_STATUSES:
            raise ValueError(f"status {status} cannot carry the injected body")
        try:
            # Serialise now so a bad body fails in the test that queued it, not later on the server's thread.
            encoded = json.dumps(DEFAULT_FAIL_BODY if body is None else body).encode()
        except (TypeError, ValueError) as error:
            raise ValueError(f"body must be JSON-serialisable: {error}") from error
        header = None if retry_after is None else format_retry_after(retry_after)
        self._enqueue(route, times, Fault("fail", status=status, retry_after=header, body=encoded, key=key))

    def delay_next(self, route: str, times: int = 1, seconds: float = 5.0, key: str | None = None) -> None:
        """Apply the next `times` calls normally but answer only after `seconds` (the client may time out)."""
        self._check_route(route)
        check_times(times)
        self._enqueue(route, times, Fault("delay", seconds=check_seconds(seconds), key=key))

    def cut_next(self, route: str, times: int = 1, after_apply: bool = True, key: str | None = None) -> None:
        """Close the connection without answering the next `times` calls, after or before applying them."""
        self._check_route(route)
        check_times(times)
        self._enqueue(route, times, Fault("cut", after_apply=bool(after_apply), key=key))

    def answer_next(
        self,
        route: str,
        status: int,
        body: bytes = b"",
        *,
        content_type: str | None = "text/html; charset=utf-8",
        headers: Sequence[tuple[str, str]] = (),
        times: int = 1,
        key: str | None = None,
    ) -> None:
        """Answer the next `times` calls of a route with exactly this status, body, Content-Type (None: none) and
        headers, and no side effect: what a wrong URL, a proxy or a login page answers (an HTML 404, a 308 with a
        Location, a 204, a 401)."""
        self._check_route(route)
        check_times(times)
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status, got {status!r}")
        fault = Fault(
            "fail", status=status, body=bytes(body), key=key, content_type=content_type or "", headers=tuple(headers)
        )
        self._enqueue(route, times, fault)

    def outage(self, route: str, seconds: float, status: int = 503, *, hang_every: int = 0, hang: float = 0.0) -> None:
        """Fail every call of a route for the next `seconds` with `status` (and hang every `hang_every`-th call
        `hang` seconds first, so that a client times out), then serve it again; queued faults wait meanwhile."""
        self._check_route(route)
        if not 500 <= status <= 599 and status != 429:
            raise ValueError(f"an outage answers 5xx or 429, got {status!r}")
        until = time.monotonic() + check_seconds(seconds)
        with self._lock:
            self._outages[route] = Outage(until, status, max(0, hang_every), check_seconds(hang))

    def outage_left(self, route: str) -> float:
        """Seconds left of a route's outage (0 when it is over)."""
        self._check_route(route)
        with self._lock:
            outage = self._outages.get(route)
        return 0.0 if outage is None else max(0.0, outage.until - time.monotonic())

    def set_latency(self, route: str, seconds: float) -> None:
        """Add `seconds` before every later call of a route is handled, faulted or not (0: none)."""
        self._check_route(route)
        latency = check_seconds(seconds)
        with self._lock:
            self._latency[route] = latency

    def clear_faults(self) -> None:
        """Drop every queued fault on every route (latencies stay)."""
        with self._lock:
            for queue in self._faults.values():
                queue.clear()
            self._outages.clear()

    def reset(self) -> None:
        """Forget faults, latencies and call counts, and reset every mounted API."""
        with self._lock:
            for queue in self._faults.values():
                queue.clear()
            for counter in self._calls.values():
                counter.clear()
            self._latency.clear()
            self._outages.clear()
            apis = list(self._apis)
        for api in apis:
            api.reset()

    # -- observation -----------------------------------------------------------------------------------------

    def calls(self, route: str, key: str | None = None) -> int:
        """Count requests received on a route (faulted ones included), or only those for one key."""
        self._check_route(route)
        with self._lock:
            counter = self._calls[route]
            return counter.total() if key is None else counter[key]

    def latency(self, route: str) -> float:
        """The latency every call of a route gets, in seconds."""
        self._check_route(route)
        with self._lock:
            return self._latency.get(route, 0.0)

    def state(self) -> dict[str, Any]:
        """Everything observable at once, as `GET /_control/state` returns it."""
        with self._lock:
            calls: dict[str, dict[str, int]] = {}
            for route, counter in self._calls.items():
                by_key: dict[str, int] = {}
                for key, count in counter.items():
                    # JSON object keys must be strings; a call without a key (e.g. no header) is "".
                    by_key[key or ""] = by_key.get(key or "", 0) + count
                calls[route] = by_key
            latency = {route: seconds for route, seconds in self._latency.items() if seconds}
            apis = list(self._apis)
        state: dict[str, Any] = {}
        for api in apis:
            state.update(api.snapshot())
        return {**state, "calls": calls, "latency": latency}

    # -- serving ---------------------------------------------------------------------------------------------

    async def _answer(self, request: Request) -> Outcome:
        """Route one request, count it, take its fault and play it; the serving layer carries the outcome out.

        Latency and delays are sleeps on the server's loop; stop() cancels them and the call goes unanswered.
        """
        if request.path.startswith(CONTROL_PREFIX):
            return self._control(request)
        with self._lock:
            resolved = self._router.resolve(request.method, request.path)
        if isinstance(resolved, Reply):
            return resolved
        route, params = resolved
        request = replace(request, params=params)
        fault, latency = self._begin(route.name, None if route.key is None else route.key(request))
        if latency:
            await asyncio.sleep(latency)
        return await play(fault, lambda: route.handler(request))

    def _begin(self, route: str, key: str | None) -> tuple[Fault | None, float]:
        """Count a call and take its fault in one step, so concurrent calls never share or skip a fault."""
        with self._lock:
            self._calls[route][key] += 1
            latency = self._latency.get(route, 0.0)
            outage = self._outages.get(route)
            if outage is not None and time.monotonic() < outage.until:
                count = self._calls[route].total()
                hang = outage.hang if outage.hang_every and count % outage.hang_every == 0 else 0.0
                # A 429 says when to come back, as rate limiters do.
                retry_after = "1" if outage.status == 429 else None
                body = json.dumps(DEFAULT_FAIL_BODY).encode()
                return Fault("fail", outage.status, retry_after, body, seconds=hang), latency
            queue = self._faults[route]
            for index, fault in enumerate(queue):
                if fault.key is None or fault.key == key:
                    del queue[index]
                    return fault, latency
            return None, latency

    def _check_route(self, route: str) -> None:
        """Raise ValueError for a route name this server does not serve (a typo would otherwise never fire)."""
        names = self.routes
        if route not in names:
            raise ValueError(f"unknown route {route!r}; expected one of {', '.join(names)}")

    def _enqueue(self, route: str, times: int, fault: Fault) -> None:
        """Append `times` copies of a fault to a route's FIFO queue."""
        with self._lock:
            self._faults[route].extend([fault] * times)

    # -- control over HTTP -----------------------------------------------------------------------------------

    def _control(self, request: Request) -> Reply:
        """Serve /_control/*, which lets another process drive a server it started."""
        name = request.path.removeprefix(CONTROL_PREFIX)
        if name == "state":
            return json_reply(200, self.state()) if request.method == "GET" else method_not_allowed("GET")
        if name == "reset":
            if request.method != "POST":
                return method_not_allowed("POST")
            self.reset()
            return json_reply(200, {"ok": True})
        with self._lock:
            command = self._controls.get(name)
        if command is None:
            return not_found()
        if request.method != "POST":
            return method_not_allowed("POST")
        if request.payload is None:
            return json_reply(400, {"error": "body must be a JSON object"})
        try:
            command(request.payload)
        except ValueError as error:
            return json_reply(400, {"error": str(error)})
        return json_reply(200, {"ok": True})

    def _control_fault(self, payload: dict[str, Any]) -> None:
        """Queue a fault described by a `POST /_control/faults` body."""
        route = json_field(payload, "route", str)
        kind = payload.get("kind")
        times = json_field(payload, "times", int, 1)
        key = optional_key(payload)
        if kind == "fail":
            retry_after = payload.get("retry_after")
            valid = isinstance(retry_after, int | float | str) and not isinstance(retry_after, bool)
            if retry_after is not None and not valid:
                raise ValueError("retry_after must be a number, a string or null")
            status = json_field(payload, "status", int, 503)
            self.fail_next(route, times, status, retry_after, payload.get("body"), key=key)
        elif kind == "delay":
            self.delay_next(route, times, json_field(payload, "seconds", float, 5.0), key=key)
        elif kind == "cut":
            self.cut_next(route, times, json_field(payload, "after_apply", bool, True), key=key)
        else:
            raise ValueError(f"kind must be one of {', '.join(get_args(FaultKind))}, got {kind!r}")

    def _control_latency(self, payload: dict[str, Any]) -> None:
        """Set a route's latency from a `POST /_control/latency` body (`{"route": ..., "seconds": ...}`)."""
        self.set_latency(json_field(payload, "route", str), json_field(payload, "seconds", float))

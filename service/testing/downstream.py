"""A real local HTTP server faking the customer, payment and email APIs, with per-route fault injection.

Integration tests and the demo start it (in-process through `Downstream`, or as a separate process with
`python -m service.testing.downstream`) and point order-service at its URL. Faults are queued per route and
each one is consumed by exactly one call, so a test can script "the first two calls fail, the third one
times out" deterministically.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import signal
import socket
import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Final, Literal, Self, TypeVar, get_args
from urllib.parse import parse_qs, unquote, urlsplit

CUSTOMERS_GET: Final = "customers.get"
PAYMENTS_POST: Final = "payments.post"
PAYMENTS_GET: Final = "payments.get"
EMAILS_POST: Final = "emails.post"
EMAILS_GET: Final = "emails.get"
ROUTES: Final = (CUSTOMERS_GET, PAYMENTS_POST, PAYMENTS_GET, EMAILS_POST, EMAILS_GET)

CustomerStatus = Literal["active", "blocked"]
FaultKind = Literal["fail", "delay", "cut"]
PaymentKind = Literal["capture", "refund"]

_T = TypeVar("_T")

_DEFAULT_FAIL_BODY: Final = {"error": "injected"}
# Statuses that cannot carry a body; an injected failure always sends one.
_BODYLESS_STATUSES: Final = frozenset({204, 304})
# An idle keep-alive connection holds a handler thread; a long-running demo must not accumulate them forever.
_IDLE_CONNECTION_TIMEOUT_S: Final = 60.0
# stop() must not hang on a wedged handler; they are daemon threads, so giving up on one is harmless.
_HANDLER_JOIN_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class _Fault:
    """One queued fault; it is consumed by exactly one call of its route."""

    kind: FaultKind
    status: int = 503
    retry_after: str | None = None
    body: bytes = b""
    seconds: float = 0.0
    after_apply: bool = True
    key: str | None = None  # only calls for this customer id / idempotency key / ref; None = any call


@dataclass(frozen=True, slots=True)
class _Reply:
    """A complete HTTP answer: status, serialised JSON body and extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True)
class _Request:
    """What the handler parsed from one call on a faked route."""

    route: str
    key: str | None
    payload: dict[str, Any] | None


def _reply(status: int, body: object, headers: tuple[tuple[str, str], ...] = ()) -> _Reply:
    """Build a JSON reply."""
    return _Reply(status, json.dumps(body).encode(), headers)


def _default_customer_status(customer_id: str) -> CustomerStatus | None:
    """Status of a customer nobody registered: the prefix decides, so tests need no setup for common cases."""
    if customer_id.startswith("blocked-"):
        return "blocked"
    if customer_id.startswith("missing-"):
        return None
    return "active"


def _check_route(route: str) -> None:
    """Raise ValueError for a route name this server does not fake (a typo would otherwise never fire)."""
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; expected one of {', '.join(ROUTES)}")


def _check_times(times: int) -> None:
    """Raise ValueError unless times is a positive integer."""
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive integer, got {times!r}")


def _format_retry_after(retry_after: float | str) -> str:
    """Render Retry-After: whole seconds as an integer (the RFC form), anything else verbatim."""
    if isinstance(retry_after, str):
        return retry_after
    if isinstance(retry_after, bool) or retry_after < 0:
        raise ValueError(f"retry_after must be a non-negative number or a string, got {retry_after!r}")
    return str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)


class Downstream:
    """Fake customer, payment and email APIs served over real HTTP, with fault injection and observation."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Configure the address; nothing listens until start()."""
        self._host = host
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        # One lock for all state: handlers run on many threads and every operation is tiny.
        self._lock = threading.Lock()
        self._customers: dict[str, CustomerStatus | None] = {}
        self._declined_orders: set[str] = set()
        self._payments: dict[str, dict[str, Any]] = {}
        self._emails: list[dict[str, Any]] = []
        self._faults: dict[str, deque[_Fault]] = {route: deque() for route in ROUTES}
        self._calls: dict[str, Counter[str | None]] = {route: Counter() for route in ROUTES}
        # Id sequences survive reset() so an id seen before a reset can never name a different record after.
        self._payment_seq = 0
        self._email_seq = 0

    # -- lifecycle -------------------------------------------------------------------------------------------

    def start(self) -> str:
        """Start serving on a daemon thread and return the base URL, e.g. `http://127.0.0.1:54321`."""
        if self._server is not None:
            raise RuntimeError("Downstream is already started")
        server = _Server((self._host, self._port), self)
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},  # shutdown() waits up to one poll interval; keep stop() quick
            name=f"downstream-{server.server_address[1]}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread
        return self.url

    @property
    def url(self) -> str:
        """Base URL of the running server."""
        if self._server is None:
            raise RuntimeError("Downstream is not started")
        return f"http://{self._host}:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stop serving, drop open connections and wake delayed answers; safe to call twice."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._server = self._thread = None
        server.shutdown()
        server.server_close()
        server.close_connections()
        thread.join()

    def __enter__(self) -> Self:
        """Start the server (`with Downstream() as ds:`)."""
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

    def set_customer(self, customer_id: str, status: CustomerStatus | None) -> None:
        """Register a customer as "active", "blocked" or unknown (None: 404), overriding the default rule."""
        if status not in (*get_args(CustomerStatus), None):
            raise ValueError(f"customer status must be 'active', 'blocked' or None, got {status!r}")
        with self._lock:
            self._customers[customer_id] = status

    def decline_order(self, order_id: str, declined: bool = True) -> None:
        """Make every new payment for this order answer 402 card_declined (declined=False: accept them again)."""
        with self._lock:
            if declined:
                self._declined_orders.add(order_id)
            else:
                self._declined_orders.discard(order_id)

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
        _check_route(route)
        _check_times(times)
        if isinstance(status, bool) or not isinstance(status, int) or not 200 <= status <= 599:
            raise ValueError(f"status must be an HTTP status between 200 and 599, got {status!r}")
        if status in _BODYLESS_STATUSES:
            raise ValueError(f"status {status} cannot carry the injected body")
        try:
            # Serialise now so a bad body fails in the test that queued it, not later inside a handler thread.
            encoded = json.dumps(_DEFAULT_FAIL_BODY if body is None else body).encode()
        except (TypeError, ValueError) as error:
            raise ValueError(f"body must be JSON-serialisable: {error}") from error
        header = None if retry_after is None else _format_retry_after(retry_after)
        self._enqueue(route, times, _Fault("fail", status=status, retry_after=header, body=encoded, key=key))

    def delay_next(self, route: str, times: int = 1, seconds: float = 5.0, key: str | None = None) -> None:
        """Apply the next `times` calls normally but answer only after `seconds` (the client may time out)."""
        _check_route(route)
        _check_times(times)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"seconds must be a non-negative number, got {seconds!r}")
        self._enqueue(route, times, _Fault("delay", seconds=float(seconds), key=key))

    def cut_next(self, route: str, times: int = 1, after_apply: bool = True, key: str | None = None) -> None:
        """Close the connection without answering the next `times` calls, after or before applying them."""
        _check_route(route)
        _check_times(times)
        self._enqueue(route, times, _Fault("cut", after_apply=bool(after_apply), key=key))

    def clear_faults(self) -> None:
        """Drop every queued fault on every route."""
        with self._lock:
            for queue in self._faults.values():
                queue.clear()

    def reset(self) -> None:
        """Forget payments, emails, registered customers, declines, faults and call counts."""
        with self._lock:
            self._customers.clear()
            self._declined_orders.clear()
            self._payments.clear()
            self._emails.clear()
            for queue in self._faults.values():
                queue.clear()
            for counter in self._calls.values():
                counter.clear()

    # -- observation -----------------------------------------------------------------------------------------

    def calls(self, route: str, key: str | None = None) -> int:
        """Count requests received on a route (faulted ones included), or only those for one key.

        The key is the customer id for customers.get, the idempotency key for payments.*, the ref for
        emails.*.
        """
        _check_route(route)
        with self._lock:
            counter = self._calls[route]
            return counter.total() if key is None else counter[key]

    def payments(self) -> dict[str, dict[str, Any]]:
        """Snapshot of the stored payments by idempotency key."""
        with self._lock:
            return copy.deepcopy(self._payments)

    def emails(self, ref: str | None = None) -> list[dict[str, Any]]:
        """Snapshot of the stored emails in arrival order, optionally only those with one ref."""
        with self._lock:
            return [dict(email) for email in self._emails if ref is None or email["ref"] == ref]

    def state(self) -> dict[str, Any]:
        """Everything observable at once, as `GET /_control/state` returns it."""
        with self._lock:
            calls: dict[str, dict[str, int]] = {}
            for route, counter in self._calls.items():
                by_key: dict[str, int] = {}
                for key, count in counter.items():
                    # JSON object keys must be strings; a call without a key (e.g. no Idempotency-Key) is "".
                    by_key[key or ""] = by_key.get(key or "", 0) + count
                calls[route] = by_key
            return {
                "calls": calls,
                "payments": copy.deepcopy(self._payments),
                "emails": [dict(email) for email in self._emails],
            }

    # -- used by the request handler -------------------------------------------------------------------------

    def _enqueue(self, route: str, times: int, fault: _Fault) -> None:
        """Append `times` copies of a fault to a route's FIFO queue."""
        with self._lock:
            self._faults[route].extend([fault] * times)

    def _begin(self, route: str, key: str | None) -> _Fault | None:
        """Count a call and take its fault in one step, so concurrent calls never share or skip a fault."""
        with self._lock:
            self._calls[route][key] += 1
            queue = self._faults[route]
            for index, fault in enumerate(queue):
                if fault.key is None or fault.key == key:
                    del queue[index]
                    return fault
            return None

    def _apply(self, request: _Request) -> _Reply:
        """Perform a call's effect and build its normal answer."""
        if request.route == CUSTOMERS_GET:
            return self._get_customer(request.key or "")
        if request.route == PAYMENTS_POST:
            return self._post_payment(request.key, request.payload)
        if request.route == PAYMENTS_GET:
            return self._get_payment(request.key)
        if request.route == EMAILS_POST:
            return self._post_email(request.payload)
        return _reply(200, self.emails(request.key))

    def _get_customer(self, customer_id: str) -> _Reply:
        """GET /customers/{id}."""
        with self._lock:
            if customer_id in self._customers:
                status = self._customers[customer_id]
            else:
                status = _default_customer_status(customer_id)
        if status is None:
            return _reply(404, {"error": "not found"})
        return _reply(200, {"id": customer_id, "status": status})

    def _post_payment(self, key: str | None, payload: dict[str, Any] | None) -> _Reply:
        """POST /payments: idempotent on the Idempotency-Key header, like real payment providers."""
        if not key:
            return _reply(400, {"error": "missing Idempotency-Key header"})
        if payload is None:
            return _reply(400, {"error": "body must be a JSON object"})
        problem = _payment_problem(payload)
        if problem is not None:
            return _reply(400, {"error": problem})
        with self._lock:
            stored = self._payments.get(key)
            if stored is not None:
                # A replay answers what the first call answered, even if the order was declined since.
                return _reply(200, {"payment_id": stored["payment_id"], "status": stored["status"]})
            if payload["order_id"] in self._declined_orders:
                return _reply(402, {"error": "card_declined"})
            self._payment_seq += 1
            payment = {
                "payment_id": f"pay_{self._payment_seq}",
                "status": "succeeded",
                "order_id": payload["order_id"],
                "amount_cents": payload["amount_cents"],
                "currency": payload["currency"],
                "kind": payload["kind"],
                "idempotency_key": key,
            }
            self._payments[key] = payment
        return _reply(201, {"payment_id": payment["payment_id"], "status": payment["status"]})

    def _get_payment(self, key: str | None) -> _Reply:
        """GET /payments?idempotency_key=K."""
        if key is None:
            return _reply(400, {"error": "missing idempotency_key query parameter"})
        with self._lock:
            stored = self._payments.get(key)
            payment = None if stored is None else dict(stored)
        if payment is None:
            return _reply(404, {"error": "not found"})
        return _reply(200, payment)

    def _post_email(self, payload: dict[str, Any] | None) -> _Reply:
        """POST /emails: deliberately NOT idempotent, so duplicate sends are visible to tests."""
        if payload is None:
            return _reply(400, {"error": "body must be a JSON object"})
        for name in ("to_customer", "template", "ref"):
            if not isinstance(payload.get(name), str):
                return _reply(400, {"error": f"{name} must be a string"})
        with self._lock:
            self._email_seq += 1
            email = {
                "email_id": f"em_{self._email_seq}",
                "to_customer": payload["to_customer"],
                "template": payload["template"],
                "ref": payload["ref"],
            }
            self._emails.append(email)
        return _reply(202, {"email_id": email["email_id"]})

    def _control(self, method: str, path: str, payload: dict[str, Any] | None) -> _Reply:
        """Serve /_control/*, which lets another process drive a server it started."""
        if path == "/_control/state":
            return _reply(200, self.state()) if method == "GET" else _method_not_allowed("GET")
        if path not in ("/_control/faults", "/_control/customers", "/_control/declines", "/_control/reset"):
            return _reply(404, {"error": "not found"})
        if method != "POST":
            return _method_not_allowed("POST")
        if path == "/_control/reset":
            self.reset()
            return _reply(200, {"ok": True})
        if payload is None:
            return _reply(400, {"error": "body must be a JSON object"})
        try:
            if path == "/_control/faults":
                self._control_fault(payload)
            elif path == "/_control/customers":
                self.set_customer(_field(payload, "id", str), _customer_status(payload.get("status")))
            else:
                self.decline_order(_field(payload, "order_id", str))
        except ValueError as error:
            return _reply(400, {"error": str(error)})
        return _reply(200, {"ok": True})

    def _control_fault(self, payload: dict[str, Any]) -> None:
        """Queue a fault described by a `POST /_control/faults` body."""
        route = _field(payload, "route", str)
        kind = payload.get("kind")
        times = _field(payload, "times", int, 1)
        if kind == "fail":
            retry_after = payload.get("retry_after")
            valid = isinstance(retry_after, int | float | str) and not isinstance(retry_after, bool)
            if retry_after is not None and not valid:
                raise ValueError("retry_after must be a number, a string or null")
            status = _field(payload, "status", int, 503)
            self.fail_next(route, times, status, retry_after, payload.get("body"), key=_optional_key(payload))
        elif kind == "delay":
            self.delay_next(route, times, _field(payload, "seconds", float, 5.0), key=_optional_key(payload))
        elif kind == "cut":
            self.cut_next(route, times, _field(payload, "after_apply", bool, True), key=_optional_key(payload))
        else:
            raise ValueError(f"kind must be one of {', '.join(get_args(FaultKind))}, got {kind!r}")


def _payment_problem(payload: dict[str, Any]) -> str | None:
    """Describe what is wrong with a payment body, or None when it is valid."""
    for name in ("order_id", "currency"):
        if not isinstance(payload.get(name), str) or not payload[name]:
            return f"{name} must be a non-empty string"
    amount = payload.get("amount_cents")
    if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
        return "amount_cents must be a non-negative integer"
    if payload.get("kind") not in get_args(PaymentKind):
        return f"kind must be one of {', '.join(get_args(PaymentKind))}"
    return None


def _field(payload: dict[str, Any], name: str, kind: type[_T], default: _T | None = None) -> _T:
    """Read a typed control field; absent or null falls back to `default` when there is one."""
    value = payload.get(name)
    if value is None and default is not None:
        return default
    # JSON has one number type: accept 5 where a float is expected, but never true/false as a number.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{name} must be a {kind.__name__}, got {value!r}")
    return value


def _customer_status(value: object) -> CustomerStatus | None:
    """Validate a customer status coming from JSON."""
    if value == "active":
        return "active"
    if value == "blocked":
        return "blocked"
    if value is None:
        return None
    raise ValueError(f"status must be 'active', 'blocked' or null, got {value!r}")


def _method_not_allowed(allowed: str) -> _Reply:
    """405 with the Allow header HTTP requires."""
    return _reply(405, {"error": "method not allowed"}, (("Allow", allowed),))


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its Downstream and can drop every open connection on stop."""

    # Handler threads must never keep the interpreter (a test run, the demo) alive.
    daemon_threads = True

    def __init__(self, address: tuple[str, int], downstream: Downstream) -> None:
        """Bind and listen."""
        super().__init__(address, _Handler)
        self.downstream = downstream
        # Set on stop so delayed answers wake up instead of outliving the server.
        self.stopping = threading.Event()
        self._connections_lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}

    def track(self, connection: socket.socket) -> None:
        """Remember a connection being served by the current thread."""
        with self._connections_lock:
            self._connections[connection] = threading.current_thread()

    def untrack(self, connection: socket.socket) -> None:
        """Forget a connection whose handler is done."""
        with self._connections_lock:
            self._connections.pop(connection, None)

    def close_connections(self) -> None:
        """Wake delayed answers, shut every open connection down and wait briefly for their handlers."""
        self.stopping.set()
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            # Unblocks a handler waiting for the next keep-alive request (its read returns EOF); OSError means
            # the client closed it first.
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join(_HANDLER_JOIN_TIMEOUT_S)


class _Handler(BaseHTTPRequestHandler):
    """Routes one connection's requests to the Downstream, applying that route's next fault."""

    # HTTP/1.1 gives keep-alive, which the service's pooled clients use; every answer has Content-Length.
    protocol_version = "HTTP/1.1"
    server_version = "order-service-downstream/1"
    sys_version = ""
    timeout = _IDLE_CONNECTION_TIMEOUT_S
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's delayed ACK
    # (~40 ms per answer), which would make every test and the demo crawl.
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        """Track the connection so stop() can close it."""
        super().setup()
        self.server.track(self.connection)

    def finish(self) -> None:
        """Untrack the connection."""
        try:
            super().finish()
        finally:
            self.server.untrack(self.connection)

    def handle(self) -> None:
        """Serve requests until the connection closes."""
        try:
            super().handle()
        except OSError:
            # Clients that time out or are cut hang up mid-answer: the faults cause it, it is no error.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Stay silent: per-request logging would drown test and demo output."""

    def do_GET(self) -> None:
        """Dispatch a GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Dispatch a POST."""
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        """Parse, count, apply faults and answer one request."""
        body = self._read_body()
        if body is None:
            return
        downstream = self.server.downstream
        parts = urlsplit(self.path)
        path = parts.path
        # keep_blank_values: `?ref=` asks for ref "" rather than for every email.
        query = {name: values[0] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
        payload = _parse_object(body)
        if path.startswith("/_control/"):
            self._send(downstream._control(method, path, payload))
            return
        request = self._route(method, path, query, payload)
        if isinstance(request, _Reply):
            self._send(request)
            return
        fault = downstream._begin(request.route, request.key)
        if fault is not None and fault.kind == "fail":
            headers = () if fault.retry_after is None else (("Retry-After", fault.retry_after),)
            self._send(_Reply(fault.status, fault.body, headers))
            return
        if fault is not None and fault.kind == "cut" and not fault.after_apply:
            self._cut()
            return
        reply = downstream._apply(request)
        if fault is not None and fault.kind == "cut":
            self._cut()
            return
        if fault is not None and fault.kind == "delay" and self.server.stopping.wait(fault.seconds):
            # The server is stopping: nobody should wait for this answer any more.
            self.close_connection = True
            return
        self._send(reply)

    def _route(
        self, method: str, path: str, query: dict[str, str], payload: dict[str, Any] | None
    ) -> _Request | _Reply:
        """Map a request to a faked route (with its counting key), or to a 404/405 answer."""
        if path.startswith("/customers/") and len(path) > len("/customers/"):
            if method != "GET":
                return _method_not_allowed("GET")
            return _Request(CUSTOMERS_GET, unquote(path[len("/customers/") :]), payload)
        if path == "/payments":
            if method == "POST":
                return _Request(PAYMENTS_POST, self.headers.get("Idempotency-Key"), payload)
            return _Request(PAYMENTS_GET, query.get("idempotency_key"), payload)
        if path == "/emails":
            if method == "POST":
                ref = None if payload is None else payload.get("ref")
                return _Request(EMAILS_POST, ref if isinstance(ref, str) else None, payload)
            return _Request(EMAILS_GET, query.get("ref"), payload)
        return _reply(404, {"error": "not found"})

    def _read_body(self) -> bytes | None:
        """Read the request body by Content-Length; answer and return None when it cannot be framed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # Without Content-Length the request cannot be skipped, so the connection cannot be reused.
            self._send(_reply(411, {"error": "Content-Length required"}), close=True)
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
            if length < 0:
                raise ValueError(length)
        except ValueError:
            self._send(_reply(400, {"error": "invalid Content-Length"}), close=True)
            return None
        return self.rfile.read(length) if length else b""

    def _send(self, reply: _Reply, close: bool = False) -> None:
        """Write a complete answer with Content-Length so keep-alive clients can frame it."""
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")  # also sets close_connection
        self.end_headers()
        self.wfile.write(reply.body)

    def _cut(self) -> None:
        """Drop the connection without a byte of answer, like a provider crashing or a proxy resetting."""
        self.close_connection = True
        with contextlib.suppress(OSError):  # the client may already have hung up
            self.connection.shutdown(socket.SHUT_RDWR)


def _parse_object(body: bytes) -> dict[str, Any] | None:
    """Decode a JSON object body; anything else (empty, invalid, not an object) is None."""
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return value if isinstance(value, dict) else None


def _optional_key(payload: dict[str, Any]) -> str | None:
    """The optional `key` a control request limits its fault to."""
    key = payload.get("key")
    if key is not None and not isinstance(key, str):
        raise ValueError("key must be a string")
    return key


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the fake APIs until SIGTERM or SIGINT, after printing the base URL as the only stdout line."""
    parser = argparse.ArgumentParser(
        prog="python -m service.testing.downstream",
        description="Fake customer, payment and email APIs with fault injection (see /_control/*).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one (default)")
    args = parser.parse_args(argv)

    stop_requested = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        """Only flag the stop: the main thread shuts the server down outside the signal handler."""
        stop_requested.set()

    # Installed before the URL is printed: a caller may send SIGTERM as soon as it has read the line.
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with Downstream(args.host, args.port) as downstream:
        print(downstream.url, flush=True)
        stop_requested.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

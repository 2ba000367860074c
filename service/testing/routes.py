"""What a fake API puts on the fault-injection server: routes, their handlers, and the values they exchange.

A route is a name, a method and a path pattern mapped to a plain function `Request -> Reply`; it may also say
how to read a key from the request, so that faults can target one key and calls are counted per key. A domain
bundles its routes, control commands, state and reset into one `FakeApi` and mounts it on a `FaultServer`
(`service/testing/faults.py`); the server never needs to know what the API is about.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar
from urllib.parse import unquote

_T = TypeVar("_T")

METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")
CONTROL_PREFIX: Final = "/_control/"
# `{name}` in a path pattern captures one non-empty segment (clients percent-encode a slash inside a value).
_PLACEHOLDER: Final = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed call: the route's handler and key reader get it."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    payload: dict[str, Any] | None
    params: Mapping[str, str] = field(default_factory=dict)

    def header(self, name: str) -> str | None:
        """A request header by case-insensitive name (the first one, when it was sent twice)."""
        return self.headers.get(name.lower())


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete HTTP answer: status, serialised body and extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


Handler = Callable[[Request], Reply]
KeyReader = Callable[[Request], str | None]
Control = Callable[[dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Route:
    """A faked endpoint: `name` for faults and counts, `method` and `path` (`/things/{id}`) to match."""

    name: str
    method: str
    path: str
    handler: Handler
    key: KeyReader | None = None


def _no_state() -> Mapping[str, object]:
    """The state of an API that shows none."""
    return {}


def _nothing_to_forget() -> None:
    """The reset of an API that keeps no state."""


@dataclass(frozen=True, slots=True)
class FakeApi:
    """One fake API as the server mounts it.

    `controls` become `POST /_control/<name>` with a JSON object body (a ValueError answers 400);
    `snapshot` adds its keys to `state()` beside the server's own `calls` and `latency`; `reset` forgets the
    API's state when the server is reset.
    """

    routes: Sequence[Route]
    controls: Mapping[str, Control] = field(default_factory=dict)
    snapshot: Callable[[], Mapping[str, object]] = _no_state
    reset: Callable[[], None] = _nothing_to_forget


def json_reply(status: int, body: object, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    """Build a JSON reply."""
    return Reply(status, json.dumps(body).encode(), headers)


def method_not_allowed(*allowed: str) -> Reply:
    """405 with the Allow header HTTP requires."""
    return json_reply(405, {"error": "method not allowed"}, (("Allow", ", ".join(allowed)),))


_NOT_FOUND_PAGE = b"<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1></body></html>\n"


def not_found() -> Reply:
    """404 for a path nothing serves: a web server's HTML page, as a wrong base URL meets, never an API's JSON
    answer (an API's own 404 carries a JSON `error`, contract §6)."""
    return Reply(404, _NOT_FOUND_PAGE, (("Content-Type", "text/html"),))


def key_from_param(name: str) -> KeyReader:
    """Read the key from a path placeholder, e.g. `{id}`."""
    return lambda request: request.params.get(name)


def key_from_header(name: str) -> KeyReader:
    """Read the key from a request header, e.g. `Idempotency-Key`."""
    return lambda request: request.header(name)


def key_from_query(name: str) -> KeyReader:
    """Read the key from a query parameter."""
    return lambda request: request.query.get(name)


def key_from_body(name: str) -> KeyReader:
    """Read the key from a string field of the JSON body; a missing or non-string field gives no key."""

    def read(request: Request) -> str | None:
        """The field, when the body is an object holding a string there."""
        value = None if request.payload is None else request.payload.get(name)
        return value if isinstance(value, str) else None

    return read


def json_field(payload: Mapping[str, Any], name: str, kind: type[_T], default: _T | None = None) -> _T:
    """Read a typed field of a JSON control body; absent or null falls back to `default` when there is one."""
    value = payload.get(name)
    if value is None and default is not None:
        return default
    # JSON has one number type: accept 5 where a float is expected, but never true/false as a number.
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{name} must be a {kind.__name__}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class _Compiled:
    """A route with its path pattern turned into a regular expression."""

    route: Route
    pattern: re.Pattern[str]


def _compile(path: str) -> re.Pattern[str]:
    """Turn `/things/{id}` into a regular expression matching the raw (still percent-encoded) path."""
    if not path.startswith("/") or path.startswith(CONTROL_PREFIX):
        raise ValueError(f"a route path starts with / and not with {CONTROL_PREFIX}, got {path!r}")
    names = _PLACEHOLDER.findall(path)
    if len(names) != len(set(names)):
        raise ValueError(f"a placeholder appears twice in {path!r}")
    literals = _PLACEHOLDER.split(path)[::2]
    if any("{" in literal or "}" in literal for literal in literals):
        raise ValueError(f"placeholders look like {{name}}, got {path!r}")
    captures = "".join(
        f"(?P<{name}>[^/]+){re.escape(literal)}" for name, literal in zip(names, literals[1:], strict=True)
    )
    return re.compile(re.escape(literals[0]) + captures)


class Router:
    """Finds the route of a request by path and method; not thread-safe, the server guards it."""

    def __init__(self) -> None:
        """Start with no routes."""
        self._routes: dict[str, _Compiled] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The route names, in the order they were added."""
        return tuple(self._routes)

    def add(self, routes: Iterable[Route]) -> None:
        """Add routes, all or none: ValueError for an unknown method, a bad path, or a name or endpoint taken."""
        added = dict(self._routes)
        for route in routes:
            if route.method not in METHODS:
                raise ValueError(f"method must be one of {', '.join(METHODS)}, got {route.method!r}")
            if route.name in added:
                raise ValueError(f"route {route.name!r} exists already")
            for other in added.values():
                if (other.route.method, other.route.path) == (route.method, route.path):
                    raise ValueError(f"{route.method} {route.path} is route {other.route.name!r} already")
            added[route.name] = _Compiled(route, _compile(route.path))
        self._routes = added

    def resolve(self, method: str, path: str) -> tuple[Route, dict[str, str]] | Reply:
        """The route with its decoded placeholders, or the 404 or 405 answer."""
        allowed: list[str] = []
        for compiled in self._routes.values():
            match = compiled.pattern.fullmatch(path)
            if match is None:
                continue
            if compiled.route.method == method:
                return compiled.route, {name: unquote(value) for name, value in match.groupdict().items()}
            allowed.append(compiled.route.method)
        return method_not_allowed(*sorted(set(allowed))) if allowed else not_found()

"""The console's web application assembled: its routes, security headers and error pages (contract §9); what the
pages, actions and login share (state, authentication, forms, rendering) is service/console/web.py.

Pages are rendered on the server (Jinja2, every value escaped); htmx, vendored, swaps fragments. The reads are
the CLI's own store queries, the actions `service.operations`'s: the console holds no rule of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.config import Settings
from service.console import routes, views
from service.console.sessions import LoginLimiter, Sessions
from service.console.web import InertJSON, Refused, State, Wiring, caller, log, read_session, render, safe_next
from service.explain import explain
from service.policy.operators import parse_tokens

# No inline script or style anywhere, no framing, forms post only here; record content cannot load anything.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_SECURITY_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]
_NO_STORE = (b"cache-control", b"no-store")


def security_headers(app: ASGIApp, names: Settings | type[Settings] = Settings) -> ASGIApp:
    """Every response gets the security headers; every one but a static asset is never cached. A request that
    fails unexpectedly (the database went away) answers 500 with one line, and logs one line, not a traceback."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [h for h in message.get("headers", []) if h[0] != b"cache-control" or static]
                headers += _SECURITY_HEADERS
                if not static:
                    headers.append(_NO_STORE)
                message["headers"] = headers
            await send(message)

        try:
            await app(scope, receive, sending)
        except Exception as error:
            said = explain(error, names)
            log.warning("console.request_failed", path=scope.get("path"), error=said)
            if not started:
                await PlainTextResponse(f"the console could not answer: {said}", status_code=500)(
                    scope, receive, sending
                )

    return wrapped


def _environment(program: str) -> jinja2.Environment:
    """Templates from the package, every value escaped, an unknown name an error rather than blank; `program` names
    the service on every page."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("service.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["age"] = views.age
    environment.filters["utc"] = views.utc
    environment.filters["printable"] = views.printable
    environment.filters["moment"] = views.header_moment
    environment.globals["program"] = program
    return environment


def create_app(wiring: Wiring) -> Starlette:
    """The console application for these settings (tokens already checked by the command)."""
    operators = parse_tokens(wiring.settings.console_tokens.get_secret_value())
    program = wiring.settings.program
    ttl = wiring.settings.console_session_ttl.total_seconds()
    state = State(
        wiring=wiring,
        operators=operators,
        sessions=Sessions(operators.values(), operators, ttl, program),
        limiter=LoginLimiter(),
        templates=Jinja2Templates(env=_environment(program)),
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for task in list(state.tasks):  # runs still going are stopped with the console; their rows say so
            task.cancel()
        await asyncio.gather(*state.tasks, return_exceptions=True)

    app = Starlette(
        routes=[*routes.ROUTES, Mount("/static", StaticFiles(directory=str(files("service.console") / "static")))],
        lifespan=lifespan,
        exception_handlers={Refused: _refused, 404: _not_found, 405: _not_allowed},
    )
    app.state.console = state
    app.add_middleware(_Sessions, state=state)
    app.add_middleware(_Outer, names=type(wiring.settings))
    return app


class _Outer:
    """The outermost layer: security headers on every response, errors included."""

    def __init__(self, app: ASGIApp, names: type[Settings]) -> None:
        self._app = security_headers(app, names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


class _Sessions:
    """Reads the request's session from the database once, before the route (which reads it synchronously)."""

    def __init__(self, app: ASGIApp, state: State) -> None:
        self._app, self._state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await read_session(self._state, scope)
        await self._app(scope, receive, send)


async def _refused(request: Request, error: Exception) -> Response:
    assert isinstance(error, Refused)
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else None
    if request.url.path.startswith("/api/") or request.headers.get("authorization"):
        return InertJSON({"error": error.reason}, status_code=error.status, headers=headers)
    if error.status == 401:
        wanted = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?{urlencode({'next': safe_next(wanted)})}", status_code=303)
    return render(request, "error.html", {"status": error.status, "reason": error.reason}, status=error.status)


async def _not_found(request: Request, error: Exception) -> Response:
    # Nothing about what exists is said before a login; and a wrong token is counted (then limited) here as on
    # every page, or a missing page would answer 404 to the right token and 401 to a wrong one without limit.
    try:
        caller(request)
    except Refused as refused:
        return await _refused(request, refused)
    return await _refused(request, Refused(404, "no such page"))


async def _not_allowed(request: Request, error: Exception) -> Response:
    return PlainTextResponse("method not allowed", status_code=405)

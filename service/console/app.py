"""The console's web application: authentication, security headers and the routes (contract §9).

Pages are rendered on the server (Jinja2, every value escaped); htmx, vendored, swaps fragments. The reads are
the CLI's own store queries, the actions `service.operations`'s: the console holds no rule of its own.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

import jinja2
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.config import Settings
from service.console import views
from service.console.sessions import COOKIE, LoginLimiter, Session, Sessions
from service.console.tokens import Operator, match, parse_tokens
from service.explain import explain
from service.ports import EffectSpec
from service.store.uow import UnitOfWork
from service.worker.reprocess import Options, Progress, Report, Selection

log = structlog.get_logger("console")

Reprocess = Callable[[Settings, Selection, Options, Progress], Awaitable[Report]]

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
LOGIN_COOKIE = "console_login"  # the login form's CSRF token (double submit), before there is a session


@dataclass(frozen=True)
class Wiring:
    """What the console needs from the composition root: settings, the database, the domain's effect specs and
    failing-field finder, and how to run a reprocess (the CLI's own path)."""

    settings: Settings
    engine: AsyncEngine
    effect_specs: Sequence[EffectSpec]
    failing_field: Callable[[bytes | None], tuple[str, str] | None]
    reprocess: Reprocess
    codes: Sequence[str]  # every error code a filter may name, the core's and the domain's


@dataclass
class RunProgress:
    """A reprocess run started from the console, as its page shows it live."""

    run_id: str | None = None
    stage: str = "starting"
    total: int = 0
    published: int = 0
    verified: int = 0
    done: bool = False
    error: str | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set once the run id exists, or it ended

    def opened(self, run_id: str) -> None:
        """The run's audit row exists."""
        self.run_id = run_id
        self.ready.set()

    def start(self, stage: str, total: int) -> None:
        """A stage begins."""
        self.stage, self.total, self.published, self.verified = stage, total, 0, 0

    def advance(self, published: int, verified: int) -> None:
        """Counts moved."""
        self.published, self.verified = published, verified

    def finish(self) -> None:
        """The stage ended."""


@dataclass
class State:
    """The console's state for the life of the process."""

    wiring: Wiring
    operators: dict[str, Operator]
    sessions: Sessions
    limiter: LoginLimiter
    templates: Jinja2Templates
    runs: dict[str, RunProgress] = field(default_factory=dict)  # reprocess runs started here, by launch id
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class Refused(Exception):
    """A request the console refuses: its status and a one-line reason."""

    def __init__(self, status: int, reason: str, *, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


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
    from service.console import routes

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
    app.add_middleware(_Outer, names=type(wiring.settings))
    return app


class _Outer:
    """The outermost layer: security headers on every response, errors included."""

    def __init__(self, app: ASGIApp, names: type[Settings]) -> None:
        self._app = security_headers(app, names)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def state_of(request: Request) -> State:
    """The console's state."""
    state: State = request.app.state.console
    return state


async def _refused(request: Request, error: Exception) -> Response:
    assert isinstance(error, Refused)
    headers = {"retry-after": str(error.retry_after)} if error.retry_after is not None else None
    if request.url.path.startswith("/api/") or request.headers.get("authorization"):
        return JSONResponse({"error": error.reason}, status_code=error.status, headers=headers)
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


def safe_next(path: str) -> str:
    """Where to go after a login: a path of this site only (never `//elsewhere` or a scheme)."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


def client_of(request: Request) -> str:
    """Who is knocking, for the login limit: the peer address (the console is on loopback or behind a proxy
    the operator runs; a forwarded header is not trusted)."""
    return request.client.host if request.client is not None else "unknown"


@dataclass(frozen=True)
class Caller:
    """Who makes a request, and how: a session (cookie, with its CSRF token) or a bearer token."""

    operator: Operator
    session: Session | None

    @property
    def csrf(self) -> str:
        """The CSRF token the page puts in its forms and htmx headers (none for a bearer token)."""
        return self.session.csrf if self.session is not None else ""


def _authenticated(request: Request) -> Caller | None:
    state = state_of(request)
    header = request.headers.get("authorization", "")
    if header:
        scheme, _, token = header.partition(" ")
        found = match(state.operators, token.strip()) if scheme.lower() == "bearer" else None
        return Caller(found, None) if found is not None else None
    session = state.sessions.read(request.cookies.get(COOKIE))
    return Caller(session.operator, session) if session is not None else None


def caller(request: Request, *, acts: bool = False) -> Caller:
    """The authenticated caller (401 otherwise); an action or reveal needs an operator (403 for a viewer). Wrong
    bearer tokens count against the client like failed logins, and past the limit none is even compared (429)."""
    state = state_of(request)
    bearer = bool(request.headers.get("authorization"))
    client = client_of(request)
    wait = state.limiter.blocked(client) if bearer else None
    if wait is not None:
        log.warning("console.bearer_limited", client=client, path=request.url.path)
        raise Refused(429, "too many wrong tokens from this address: wait a minute", retry_after=int(wait) + 1)
    found = _authenticated(request)
    if found is None:
        if bearer:
            state.limiter.failed(client)
            log.warning("console.bearer_refused", client=client, path=request.url.path)
        raise Refused(401, "log in first, or send Authorization: Bearer <token>")
    if acts and not found.operator.acts:
        raise Refused(403, f"{found.operator.name} is a viewer: only operators reveal payloads and act")
    request.state.caller = found  # the page rendered next needs it too: authenticated once per request
    return found


async def checked_form(request: Request, who: Caller) -> dict[str, Any]:
    """A POST's form, once its CSRF token (field `csrf` or header `X-CSRF-Token`) matches the session's; a
    bearer-token request carries no cookie, so there is nothing to forge."""
    form = await request.form()
    fields: dict[str, Any] = {}
    for name, value in form.multi_items():
        if isinstance(value, str):
            fields.setdefault(name, []).append(value)
    if who.session is not None:
        given = request.headers.get("x-csrf-token") or (fields.get("csrf") or [""])[0]
        if not secrets.compare_digest(given.encode(), who.session.csrf.encode()):
            raise Refused(403, "the form is stale or forged (no valid CSRF token): reload the page")
    return fields


def render(request: Request, template: str, context: dict[str, Any], *, status: int = 200) -> Response:
    """A page (or, for an htmx request of a fragment, the fragment) with the caller and CSRF token it needs."""
    found = getattr(request.state, "caller", None) or _authenticated(request)
    page = {
        "me": found.operator if found is not None else None,
        "csrf": found.csrf if found is not None else "",
        "path": request.url.path,
        **context,
    }
    return state_of(request).templates.TemplateResponse(request, template, page, status_code=status)


@asynccontextmanager
async def reading(request: Request) -> AsyncIterator[AsyncConnection]:
    """One read-only unit of work."""
    async with UnitOfWork(state_of(request).wiring.engine) as uow:
        yield uow.connection


@asynccontextmanager
async def changing(request: Request) -> AsyncIterator[AsyncConnection]:
    """One unit of work that commits when the block ends without an error."""
    async with UnitOfWork(state_of(request).wiring.engine) as uow:
        yield uow.connection
        await uow.commit()

"""What every page, action and login of the console shares: its state, who is calling, forms, rendering and units
of work (the application itself is assembled in service/console/app.py)."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.templating import Jinja2Templates
from starlette.types import Scope

from service import inert
from service.config import Settings
from service.console.sessions import COOKIE, LoginLimiter, Session, Sessions
from service.policy.operators import Operator, match
from service.ports import EffectSpec
from service.store.uow import UnitOfWork
from service.worker.reprocess_run import Options, Progress, Report, Selection

log = structlog.get_logger("console")

SESSION_STATE = "console_session"  # the request's state: its session, read from the database before the route
# What answers without a login: no session is looked up for them (a probe must not need the database's sessions).
UNAUTHENTICATED = ("/healthz", "/readyz", "/favicon.ico", "/static/")

Reprocess = Callable[[Settings, Selection, Options, Progress], Awaitable[Report]]


class InertJSON(JSONResponse):
    """A JSON answer of the console's API: exact values, every invisible character of record content as a `\\uXXXX`
    escape (`service.inert.json_text`), so that a client printing it cannot be steered by the content."""

    def render(self, content: Any) -> bytes:
        return inert.json_text(content).encode("utf-8")


@dataclass(frozen=True)
class Wiring:
    """What the console needs from the composition root: settings, the database, the domain's effect specs,
    failing-field finder and decoding, and how to run a reprocess (the CLI's own path)."""

    settings: Settings
    engine: AsyncEngine
    effect_specs: Sequence[EffectSpec]
    failing_field: Callable[[bytes | None], tuple[str, str] | None]
    reprocess: Reprocess
    codes: Sequence[str]  # every error code a filter may name, the core's and the domain's
    # The domain's decoding of a record's bytes, which an edit is checked with (None: this console edits nothing).
    decode: Callable[[bytes | None], Any] | None = None


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


async def read_session(state: State, scope: Scope) -> None:
    """Put the session the request's cookie names (None when none is live) in its state, for `caller`."""
    path = str(scope.get("path", ""))
    if any(path == public or (public.endswith("/") and path.startswith(public)) for public in UNAUTHENTICATED):
        return
    cookie = Request(scope).cookies.get(COOKIE)
    session = None
    if cookie:
        async with UnitOfWork(state.wiring.engine) as uow:
            session = await state.sessions.read(uow.connection, cookie)
            await uow.commit()
    scope.setdefault("state", {})[SESSION_STATE] = session


class Refused(Exception):
    """A request the console refuses: its status and a one-line reason."""

    def __init__(self, status: int, reason: str, *, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


def state_of(request: Request) -> State:
    """The console's state."""
    state: State = request.app.state.console
    return state


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
    session: Session | None = getattr(request.state, SESSION_STATE, None)
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
            if "\x00" in value:  # no stored text holds NUL (service/bounds.py)
                raise Refused(400, f"{name}: holds NUL, which no stored key, id or name holds")
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

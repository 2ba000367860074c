"""The operator console's security (issue 16, contract §9): who may see and do what, CSRF, the login limit,
the session cookie, the security headers, the audit of every action, and the JSON API other tools rely on.

Real PostgreSQL (a fresh migrated database per test); the console application runs in this process, driven by
httpx through its ASGI transport with its lifespan running; reprocessing is a stub that must never be reached.
Assertions are on status codes, headers and rows.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.routing import Route

from service.config import Settings
from service.console import routes
from service.console.app import create_app
from service.console.sessions import COOKIE, Sessions, session_id_hash
from service.console.web import Wiring
from service.containers import Container
from service.orders.domain import DOMAIN
from service.store import quarantine
from service.worker.reprocess_run import Options, Progress, Report, Selection
from tests.conftest import KAFKA
from tests.support import Topics, cli, rows, settings_for

OPERATOR_TOKEN = "operator-token-" + "a1b2c3d4" * 5
VIEWER_TOKEN = "viewer-token-" + "e5f6a7b8" * 5
TOKENS = f"ann:operator:{OPERATOR_TOKEN},vic:viewer:{VIEWER_TOKEN}"
BASE = "http://console.test"
CONSUMER = "orders-consumer"
HEAD = "orders/3/1200"  # failure ids hold slashes: topic/partition/offset
OTHERS = ("orders/0/7", "orders/1/42")
EFFECT = "K-9/payment.capture"
SECRET_PAYLOAD = b'{"orderId": "K-1", "card": "4111-SECRET-PAYLOAD"}'
# Every table an action could change: a refused request leaves each exactly as it was.
WATCHED = (
    "SELECT * FROM quarantine ORDER BY failure_id",
    "SELECT * FROM quarantine_annotations ORDER BY id",
    "SELECT * FROM quarantine_events ORDER BY id",
    "SELECT * FROM audit_log ORDER BY id",
    "SELECT * FROM key_blocks ORDER BY consumer_name, ordering_key",
    "SELECT * FROM retries ORDER BY consumer_name, message_id",
    "SELECT * FROM effects ORDER BY idempotency_key",
    "SELECT * FROM reprocess_runs ORDER BY id",
)
# A value for each path parameter of the routes, so that every route can be called.
PATH_VALUES = {"failure_id": HEAD, "key": EFFECT, "run_id": "r-1", "launch": "0123456789abcdef", "edit_id": "1"}
# Everything an action's form could hold, confirmed: were a refusal missing, the action would change rows.
ACTION_FORM = {
    "failure_id": HEAD,
    "note": "a note",
    "reason": "a reason",
    "text": "a text",
    "key": "K-1",
    "consumer": CONSUMER,
    "payload": '{"schema": "order.placed.v1"}',
    "set_headers": "fixed-by=nobody",
    "edit_id": "1",
    "decision": "approve",
    "confirm": "yes",
}
RETRY_FORM = {"key": EFFECT, "reason": "card fixed", "confirm": "yes"}
# What answers without authentication: an orchestrator's probes, and the icon every browser asks for.
PUBLIC = {"/healthz": (200, "ok"), "/readyz": (200, "ready"), "/favicon.ico": (204, "")}


# ---------------------------------------------------------------- the console under test


@dataclass
class Console:
    """A console application on this test's database, a client for it, and what reached the reprocess stub."""

    app: Starlette
    client: httpx.AsyncClient
    engine: AsyncEngine
    settings: Settings
    reprocessed: list[Selection] = field(default_factory=list)

    def client_from(self, host: str) -> httpx.AsyncClient:
        """Another client of the same application (a cookie jar of its own), from another peer address."""
        transport = httpx.ASGITransport(app=self.app, client=(host, 40_000))
        return httpx.AsyncClient(transport=transport, base_url=str(self.client.base_url))


def console_settings(database_url: str, **overrides: Any) -> Settings:
    """The console's settings for this test's database (the broker is never reached)."""
    values: dict[str, Any] = {"console_tokens": TOKENS, "console_session_ttl": "1h"}
    return settings_for(database_url, KAFKA, Topics("console"), **(values | overrides))


@contextlib.asynccontextmanager
async def serving(engine: AsyncEngine, database_url: str, **overrides: Any) -> AsyncIterator[Console]:
    """The console wired as `order-service console` wires it, its lifespan running, and a client for it."""
    settings = console_settings(database_url, **overrides)
    container = Container(settings=settings, domain=DOMAIN)
    reached: list[Selection] = []

    async def reprocess(owner: Settings, selection: Selection, options: Options, progress: Progress) -> Report:
        reached.append(selection)
        raise AssertionError("no test here reprocesses: a refused request reached the reprocessor")

    wiring = Wiring(
        settings=settings,
        engine=engine,
        effect_specs=container.effect_specs(),
        failing_field=container.failing_field(),
        reprocess=reprocess,
        codes=DOMAIN.error_codes,
    )
    app = create_app(wiring)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 40_000))
        base = BASE.replace("http:", "https:") if settings.console_behind_tls else BASE  # a Secure cookie comes back
        async with httpx.AsyncClient(transport=transport, base_url=base) as client:
            yield Console(app, client, engine, settings, reached)


@pytest.fixture
async def console(engine: AsyncEngine, database_url: str) -> AsyncIterator[Console]:
    """The console on a database holding three quarantined records, a held key and a failed effect."""
    await seed(engine)
    async with serving(engine, database_url) as served:
        yield served


def quarantined(
    failure_id: str,
    *,
    code: str = "MALFORMED_PAYLOAD",
    owner: str = "orders",
    key: str | None = "K-1",
    failed_at: datetime | None = None,
    payload: bytes | None = SECRET_PAYLOAD,
) -> quarantine.QuarantineRow:
    """A quarantined record as the consumer writes one."""
    when = failed_at or datetime.now(UTC) - timedelta(hours=2)
    return quarantine.QuarantineRow(
        failure_id=failure_id,
        message_id=f"m-{failure_id}",
        error_code=code,
        owner=owner,
        ordering_key=key,
        envelope={"failureId": failure_id, "errorCode": code},
        payload=payload,
        source_headers=[["traceparent", "00-abc-01"]],
        attempts=1,
        first_failed_at=when,
        last_failed_at=when,
    )


async def add(engine: AsyncEngine, records: list[quarantine.QuarantineRow]) -> None:
    """Quarantine these records with the consumer's own statement."""
    async with engine.begin() as connection:
        await connection.execute(
            text(quarantine.ADD_ROWS), {"consumer": CONSUMER, "quarantine_rows": quarantine.COLUMNS.encode(records)}
        )


async def seed(engine: AsyncEngine) -> None:
    """Three quarantined records (the first holds key K-1), and a failed capture."""
    now = datetime.now(UTC)
    await add(
        engine,
        [
            quarantined(HEAD, failed_at=now - timedelta(hours=3)),
            quarantined(OTHERS[0], code="SCHEMA_UNSUPPORTED", key="K-2", failed_at=now - timedelta(hours=2)),
            quarantined(
                OTHERS[1], code="INVALID_FIELD", owner="billing", key=None, failed_at=now - timedelta(minutes=5)
            ),
        ],
    )
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)"
                " VALUES (:consumer, 'K-1', :head, 'quarantined head')"
            ),
            {"consumer": CONSUMER, "head": HEAD},
        )
        await connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts, last_error_code)"
                " VALUES (:key, 'K-9', 'payment.capture', 'failed', '{\"amount\": 10}', 5, 'PROVIDER_REJECTED')"
            ),
            {"key": EFFECT},
        )


async def snapshot(engine: AsyncEngine) -> list[list[dict[str, Any]]]:
    """Every row of every table an action could change."""
    return [await rows(engine, query) for query in WATCHED]


# ---------------------------------------------------------------- logging in, and what pages carry


def field_value(html: str, name: str, *, form: str = "") -> str:
    """The value of the hidden field `name` of the page's first form (posting to `form`, when given)."""
    if form:
        start = html.find(f'action="{form}"')
        assert start >= 0, f"no form posting to {form} on the page"
        html = html[start:]
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found is not None, f"no {name} field on the page"
    return found.group(1)


async def log_in(client: httpx.AsyncClient, token: str, *, next_: str = "/") -> httpx.Response:
    """Fill in the login form as a browser does: its page (and CSRF cookie) first, then the post."""
    page = await client.get("/login", params={"next": next_})
    assert page.status_code == 200
    login = {name: field_value(page.text, name, form="/login") for name in ("csrf", "next")}
    return await client.post("/login", data={**login, "token": token})


async def session(client: httpx.AsyncClient, token: str) -> str:
    """Log `client` in with `token` (its cookie jar keeps the session); the session's CSRF token."""
    response = await log_in(client, token)
    assert response.status_code == 303, response.text
    overview = await client.get("/")
    assert overview.status_code == 200
    return field_value(overview.text, "csrf")


def bearer(token: str) -> dict[str, str]:
    """The header a tool sends."""
    return {"Authorization": f"Bearer {token}"}


def set_cookies(response: httpx.Response) -> dict[str, Any]:
    """The cookies a response sets, each with its attributes (`http.cookies.Morsel`)."""
    jar: SimpleCookie = SimpleCookie()
    for header in response.headers.get_list("set-cookie"):
        jar.load(header)
    return dict(jar)


def concrete(route: Route) -> str:
    """A route's path with a value for each of its parameters."""
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: PATH_VALUES[m.group(1)], route.path)


def every_route() -> Iterator[tuple[str, str]]:
    """(method, path) of every route the console declares, found in `routes.ROUTES` itself."""
    for route in routes.ROUTES:
        assert isinstance(route, Route)
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                yield method, concrete(route)


ACTION_ROUTES = [concrete(r) for r in routes.ROUTES if isinstance(r, Route) and r.path.startswith("/actions/")]


async def call(client: httpx.AsyncClient, method: str, path: str, **options: Any) -> httpx.Response:
    """One request to a route: a POST with a complete, confirmed action form."""
    if method == "POST":
        form = RETRY_FORM if path == "/actions/retry" else ACTION_FORM
        return await client.post(path, data=options.pop("data", form), **options)
    return await client.request(method, path, **options)


# ---------------------------------------------------------------- without a session or token


def test_the_route_table_names_every_kind_of_route_this_module_covers() -> None:
    # Given the console's declared routes, Then there are pages, API routes, actions, the login and the probe
    paths = {path for _, path in every_route()}
    assert {*PUBLIC, "/login", "/logout", "/", "/api/stats", f"/quarantine/{HEAD}"} <= paths
    assert set(ACTION_ROUTES) == {
        f"/actions/{name}"
        for name in (
            "reveal",
            "annotate",
            "resolve",
            "reprocess",
            "release",
            "retry",
            "open-edit",
            "edit",
            "decide-edit",
        )
    }


async def test_without_a_session_pages_redirect_to_the_login_the_api_and_actions_refuse_and_only_the_probes_answer(
    console: Console,
) -> None:
    # Given a database with records, a held key and a failed effect
    before = await snapshot(console.engine)

    # When every declared route is called without a session or a token
    answers = {(method, path): await call(console.client, method, path) for method, path in every_route()}

    # Then the probes and the icon answer, the login form shows, the login post wants its form, pages send to
    # the login, the API says 401, and no action goes through
    for (method, path), response in answers.items():
        where = f"{method} {path}: {response.status_code}"
        if path in PUBLIC:
            assert (response.status_code, response.text) == PUBLIC[path], where
        elif path == "/login":
            assert response.status_code == (200 if method == "GET" else 403), where
        elif path.startswith("/api/"):
            assert response.status_code == 401, where
            assert response.json() == {"error": "log in first, or send Authorization: Bearer <token>"}, where
        else:
            assert response.status_code in {303, 401}, where
            if response.status_code == 303:
                assert urlsplit(response.headers["location"]).path == "/login", where
        assert response.status_code >= 300 or (method == "GET" and path in {*PUBLIC, "/login"}), where
    assert (
        answers[("GET", f"/quarantine/{HEAD}")].headers["location"] == "/login?next=%2Fquarantine%2Forders%2F3%2F1200"
    )
    assert SECRET_PAYLOAD.decode() not in "".join(response.text for response in answers.values())
    assert await snapshot(console.engine) == before
    assert console.reprocessed == []


@pytest.mark.parametrize(
    "authorization",
    [
        f"Bearer {OPERATOR_TOKEN[:-1]}",
        f"Bearer {OPERATOR_TOKEN}x",
        f"Basic {OPERATOR_TOKEN}",
        OPERATOR_TOKEN,
        "Bearer ",
    ],
    ids=["truncated", "extended", "another-scheme", "no-scheme", "empty"],
)
async def test_a_wrong_bearer_token_is_refused_with_401_and_after_five_the_client_is_limited_on_every_route(
    console: Console, authorization: str
) -> None:
    # Given a token that is almost an operator's, or one sent in another scheme
    before = await snapshot(console.engine)

    # When every route is called with it, and then the same client and another send the right token
    answers = [
        await call(console.client, method, path, headers={"Authorization": authorization})
        for method, path in every_route()
        if path not in {*PUBLIC, "/login"}
    ]
    right_here = await console.client.get("/api/stats", headers=bearer(VIEWER_TOKEN))
    async with console.client_from("10.0.0.7") as elsewhere:
        right_elsewhere = await elsewhere.get("/api/stats", headers=bearer(VIEWER_TOKEN))

    # Then the first five are refused with 401, every later one (even the right token, from that client) with
    # 429 without being compared, each in JSON; another client is served; and nothing changed
    assert [response.status_code for response in answers] == [401] * 5 + [429] * (len(answers) - 5)
    assert all("error" in response.json() for response in answers)
    assert right_here.status_code == 429
    assert right_elsewhere.status_code == 200
    assert await snapshot(console.engine) == before


async def test_an_unknown_page_says_nothing_before_a_login_and_404_after_it(console: Console) -> None:
    # When a page that does not exist is asked for without, and then with, a token
    anonymous = await console.client.get("/no/such/page")
    known = await console.client.get("/no/such/page", headers=bearer(VIEWER_TOKEN))

    # Then the anonymous caller is sent to the login, the known one told 404
    assert anonymous.status_code == 303
    assert anonymous.headers["location"].startswith("/login?")
    assert known.status_code == 404


async def test_a_missing_page_is_no_way_around_the_limit_on_wrong_tokens(console: Console) -> None:
    # When a client tries wrong tokens on a page that does not exist (where the right one would answer 404),
    # then the right one
    wrong = [
        (await console.client.get("/no/such/page", headers=bearer(f"guess-{n}" * 8))).status_code for n in range(7)
    ]
    right = await console.client.get("/no/such/page", headers=bearer(VIEWER_TOKEN))

    # Then the wrong ones count as anywhere else: 401 five times, then 429, and the right one is not even
    # compared any more, so the answer tells a guesser nothing
    assert wrong == [401] * 5 + [429] * 2
    assert right.status_code == 429


# ---------------------------------------------------------------- viewers read, operators act


async def test_a_viewer_reads_every_page_but_is_refused_every_action_and_reveal_by_token_and_by_session(
    console: Console,
) -> None:
    # Given a viewer, by bearer token and by a logged-in session (with its valid CSRF token)
    csrf = await session(console.client, VIEWER_TOKEN)
    before = await snapshot(console.engine)

    # When the viewer reads the record page, then tries every action, with a complete confirmed form each time
    record = await console.client.get(f"/quarantine/{HEAD}")
    by_token = {path: await call(console.client, "POST", path, headers=bearer(VIEWER_TOKEN)) for path in ACTION_ROUTES}
    by_session = {
        path: await call(console.client, "POST", path, data={**ACTION_FORM, **RETRY_FORM, "csrf": csrf})
        for path in ACTION_ROUTES
    }
    also_header = {
        path: await call(console.client, "POST", path, headers={"X-CSRF-Token": csrf}) for path in ACTION_ROUTES
    }

    # Then the page offers the viewer no reveal and no action, each action is refused with 403, and no row
    # of any table changed, nor was anything reprocessed
    assert record.status_code == 200
    assert 'action="/actions/' not in record.text
    assert "Only operators reveal payloads." in record.text
    for answers in (by_token, by_session, also_header):
        assert {path: response.status_code for path, response in answers.items()} == dict.fromkeys(ACTION_ROUTES, 403)
    assert by_token["/actions/reveal"].json()["error"].startswith("vic is a viewer")
    assert SECRET_PAYLOAD.decode() not in "".join(r.text for r in [*by_token.values(), *by_session.values()])
    assert await snapshot(console.engine) == before
    assert console.reprocessed == []


async def test_an_operator_token_reveals_and_acts_without_a_csrf_token_for_it_carries_no_cookie(
    console: Console,
) -> None:
    # When an operator's tool reveals a payload with its bearer token
    revealed = await console.client.post("/actions/reveal", data={"failure_id": HEAD}, headers=bearer(OPERATOR_TOKEN))

    # Then it is shown, and audited under the operator's name
    assert revealed.status_code == 200
    assert "4111-SECRET-PAYLOAD" in revealed.text
    [row] = await rows(console.engine, "SELECT actor, action, selection FROM audit_log")
    assert (row["actor"], row["action"], row["selection"]["failure_id"]) == ("ann", "quarantine.reveal", HEAD)


# ---------------------------------------------------------------- CSRF


@pytest.mark.parametrize(
    "forged",
    [{}, {"csrf": ""}, {"csrf": "not-the-token"}, {"header": "not-the-token"}, {"other_session": True}],
    ids=["absent", "empty", "wrong-field", "wrong-header", "another-sessions-token"],
)
async def test_a_cookie_session_post_without_its_csrf_token_is_refused_and_changes_nothing(
    console: Console, forged: dict[str, Any]
) -> None:
    # Given an operator's session; and, for one case, another session's (valid) CSRF token
    await session(console.client, OPERATOR_TOKEN)
    before = await snapshot(console.engine)
    form = {**ACTION_FORM, "note": "forged"}
    headers = {}
    if "csrf" in forged:
        form["csrf"] = forged["csrf"]
    if "header" in forged:
        headers["X-CSRF-Token"] = forged["header"]
    if "other_session" in forged:
        async with console.client_from("127.0.0.1") as other:
            form["csrf"] = await session(other, OPERATOR_TOKEN)

    # When the session posts each action, and the logout, with that token
    answers = {path: await call(console.client, "POST", path, data=form, headers=headers) for path in ACTION_ROUTES}
    logout = await console.client.post("/logout", data=form, headers=headers)

    # Then each is refused with 403, and nothing changed
    assert {path: response.status_code for path, response in answers.items()} == dict.fromkeys(ACTION_ROUTES, 403)
    assert "no valid CSRF token" in answers["/actions/annotate"].text
    assert logout.status_code == 403
    assert await snapshot(console.engine) == before
    assert console.reprocessed == []


@pytest.mark.parametrize("carried_in", ["form", "header"])
async def test_a_cookie_session_post_with_its_csrf_token_acts(console: Console, carried_in: str) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)
    form = {**ACTION_FORM, "note": f"noted via the {carried_in}"}

    # When the session annotates a record with its CSRF token in the form or in the htmx header
    if carried_in == "form":
        response = await console.client.post("/actions/annotate", data={**form, "csrf": csrf})
    else:
        response = await console.client.post("/actions/annotate", data=form, headers={"X-CSRF-Token": csrf})

    # Then the note is added under the operator's name
    assert response.status_code == 200, response.text
    notes = await rows(console.engine, "SELECT failure_id, author, note FROM quarantine_annotations")
    assert notes == [{"failure_id": HEAD, "author": "ann", "note": f"noted via the {carried_in}"}]


async def test_an_unconfirmed_action_only_previews_and_changes_nothing(console: Console) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)
    before = await snapshot(console.engine)

    # When the operator asks to resolve a record without confirming
    form = {key: value for key, value in ACTION_FORM.items() if key != "confirm"}
    preview = await console.client.post("/actions/resolve", data={**form, "csrf": csrf})

    # Then a preview says what would happen, and nothing changed
    assert preview.status_code == 200
    assert HEAD in preview.text
    assert await snapshot(console.engine) == before


def confirm_form(preview: str) -> dict[str, list[str]]:
    """The hidden fields of a dry run's confirm form, as the browser posts them (HTML entities read back)."""
    start = preview.find('<form method="post">')
    assert start >= 0, "the dry run offers no confirmation"
    found: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', preview[start:]):
        found.setdefault(html.unescape(name), []).append(html.unescape(value))
    return found


@pytest.mark.parametrize("action", ["resolve", "annotate"])
async def test_a_confirmation_acts_on_exactly_the_records_its_dry_run_listed(console: Console, action: str) -> None:
    # Given an operator's session and the dry run of acting on every open record matching a code (one, now)
    csrf = await session(console.client, OPERATOR_TOKEN)
    asked = {"csrf": csrf, "scope": "matching", "match_error_code": "SCHEMA_UNSUPPORTED", "text": "producer bug"}
    preview = await console.client.post(f"/actions/{action}", data=asked)
    assert preview.status_code == 200, preview.text
    assert re.search(r'id="preview-count">1<', preview.text)
    # And a record matching the code quarantined after the operator read the dry run
    late = "orders/5/99"
    await add(console.engine, [quarantined(late, code="SCHEMA_UNSUPPORTED")])

    # When the operator confirms the dry run
    done = await console.client.post(f"/actions/{action}", data=confirm_form(preview.text))

    # Then exactly the record the dry run listed changed, and the late one is untouched
    assert done.status_code == 200, done.text
    assert OTHERS[0] in done.text
    assert late not in done.text
    if action == "resolve":
        statuses = await rows(
            console.engine, "SELECT failure_id, status FROM quarantine WHERE error_code = :c", c="SCHEMA_UNSUPPORTED"
        )
        assert {row["failure_id"]: row["status"] for row in statuses} == {OTHERS[0]: "resolved", late: "open"}
    else:
        notes = await rows(console.engine, "SELECT failure_id FROM quarantine_annotations")
        assert notes == [{"failure_id": OTHERS[0]}]
    [audit] = await rows(console.engine, "SELECT selection FROM audit_log")
    assert audit["selection"]["picked"] == [OTHERS[0]]


async def test_a_confirmation_of_a_selection_by_filter_without_its_dry_run_only_previews(console: Console) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)
    before = await snapshot(console.engine)

    # When a form confirms a selection by code that comes from no dry run
    form = {"csrf": csrf, "scope": "matching", "match_error_code": "SCHEMA_UNSUPPORTED", "text": "x", "confirm": "yes"}
    answer = await console.client.post("/actions/resolve", data=form)

    # Then it is answered with the dry run, and nothing changed: the query is never run again at confirm time
    assert answer.status_code == 200
    assert 'id="confirm"' in answer.text
    assert await snapshot(console.engine) == before


# ---------------------------------------------------------------- the login form


async def test_a_wrong_token_is_refused_with_401_and_counted(console: Console) -> None:
    # When a wrong token is tried four times, then the right one, then a wrong one again
    limiter = state_of_app(console).limiter
    wrong = [await log_in(console.client, "x" * 40) for _ in range(4)]
    after_four = limiter.blocked("127.0.0.1")
    right = await log_in(console.client, OPERATOR_TOKEN)
    fifth = await log_in(console.client, "y" * 40)

    # Then each wrong one got 401 and no session; four leave a try, the right one logs in, and the fifth
    # failure is the one that blocks the client for the rest of the minute
    assert [response.status_code for response in [*wrong, fifth]] == [401] * 5
    assert all(COOKIE not in set_cookies(response) for response in [*wrong, fifth])
    assert "that token is not valid" in wrong[0].text
    assert after_four is None
    assert right.status_code == 303
    assert COOKIE in set_cookies(right)
    blocked = limiter.blocked("127.0.0.1")
    assert blocked is not None
    assert 0 < blocked <= 60


def state_of_app(console: Console) -> Any:
    """The application's state (its limiter and sessions), as the routes see it."""
    return console.app.state.console


async def test_after_five_failures_even_the_right_token_is_refused_with_429_and_retry_after(
    console: Console, capsys: pytest.CaptureFixture[str]
) -> None:
    # Given five failed logins from one client, logged as they happen
    with structlog.testing.capture_logs() as events:
        failures = [await log_in(console.client, f"guess-{n}-" + "z" * 32) for n in range(5)]

        # When the same client then sends the right token, and another client does too
        limited = await log_in(console.client, OPERATOR_TOKEN)
        async with console.client_from("10.0.0.9") as elsewhere:
            other = await log_in(elsewhere, VIEWER_TOKEN)
    printed = capsys.readouterr()

    # Then the sixth is refused with 429 and Retry-After, without a session; the other client is not limited
    assert [response.status_code for response in failures] == [401] * 5
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["retry-after"]) <= 60
    assert "too many failed logins" in limited.text
    assert COOKIE not in set_cookies(limited)
    assert other.status_code == 303
    # And the log says what happened, by client, and never holds a token, right or wrong
    names = [event["event"] for event in events]
    assert names.count("console.login_failed") == 5
    assert "console.login_limited" in names
    assert all(event.get("client") == "127.0.0.1" for event in events if event["event"] != "console.login")
    logged = repr(events) + printed.out + printed.err
    for secret in [OPERATOR_TOKEN, VIEWER_TOKEN, *(f"guess-{n}-" + "z" * 32 for n in range(5))]:
        assert secret not in logged


async def test_a_login_post_without_the_forms_csrf_cookie_is_refused(console: Console) -> None:
    # When a login is posted from elsewhere: the right token, but no login form was loaded first
    response = await console.client.post("/login", data={"csrf": "made-up", "token": OPERATOR_TOKEN})

    # Then it is refused and no session is issued
    assert response.status_code == 403
    assert COOKIE not in set_cookies(response)


@pytest.mark.parametrize(
    "wanted",
    [
        "//evil.example",
        "https://evil.example",
        "http://evil.example/",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "/\t/evil.example",
        "//evil.example/%2F..",
    ],
)
async def test_a_login_goes_back_to_a_page_of_the_console_only(console: Console, wanted: str) -> None:
    # When an operator logs in from a link whose `next` points elsewhere, through the form as a browser does
    response = await log_in(console.client, OPERATOR_TOKEN, next_=wanted)
    # and when the target is posted as it is, past the form
    form = await console.client.get("/login")
    posted = await console.client.post(
        "/login", data={"csrf": field_value(form.text, "csrf", form="/login"), "token": OPERATOR_TOKEN, "next": wanted}
    )

    # Then each login lands on this console, and a plainly foreign target on its overview
    for landed in (response, posted):
        location = landed.headers["location"]
        assert landed.status_code == 303
        browser_sees = re.sub(r"[\t\n\r]", "", urljoin(BASE + "/login", location))  # as a browser resolves it
        assert urlsplit(browser_sees).netloc == "console.test", location
        if wanted.startswith(("//", "http", "javascript", "\\")):
            assert location == "/"


# ---------------------------------------------------------------- the session cookie


@pytest.mark.parametrize("behind_tls", [False, True])
async def test_the_session_cookie_is_httponly_samesite_strict_lives_the_ttl_and_is_secure_behind_tls(
    engine: AsyncEngine, database_url: str, behind_tls: bool
) -> None:
    # Given a console with a 90-minute session lifetime, with or without TLS in front
    async with serving(engine, database_url, console_session_ttl="90m", console_behind_tls=behind_tls) as served:
        # When an operator logs in
        form = await served.client.get("/login")
        response = await log_in(served.client, OPERATOR_TOKEN)

    # Then both cookies are HttpOnly and SameSite=Strict, the session lives 90 minutes, and both are Secure
    # exactly when TLS is in front
    cookie = set_cookies(response)[COOKIE]
    login = set_cookies(form)["console_login"]
    assert cookie["httponly"] is True
    assert cookie["samesite"].lower() == "strict"
    assert cookie["max-age"] == str(90 * 60)
    assert cookie["path"] == "/"
    assert bool(cookie["secure"]) is behind_tls
    assert login["httponly"] is True
    assert login["samesite"].lower() == "strict"
    assert bool(login["secure"]) is behind_tls
    assert OPERATOR_TOKEN not in cookie.value


async def _refused_with(console: Console, cookie: str) -> tuple[int, int]:
    """What a page and the API answer a request carrying only this session cookie."""
    console.client.cookies.clear()
    console.client.cookies.set(COOKIE, cookie)
    page = await console.client.get("/quarantine")
    api = await console.client.get("/api/stats")
    console.client.cookies.clear()
    return page.status_code, api.status_code


async def test_a_tampered_session_cookie_is_refused(console: Console) -> None:
    # Given a session cookie of a viewer
    await session(console.client, VIEWER_TOKEN)
    cookie = console.client.cookies[COOKIE]
    payload, _, signature = cookie.rpartition(".")

    # When its signature is changed, its content replaced, or it is cut short
    flipped = payload + "." + ("A" if signature[0] != "A" else "B") + signature[1:]
    # (the payload reversed whole: a compressed one starts with a dot, so its first dot-separated part is empty)
    swapped = payload[::-1] + "." + signature

    # Then each is refused (the page sends to the login, the API says 401), while the cookie itself works
    assert await _refused_with(console, cookie) == (200, 200)
    for forged in (flipped, swapped, cookie[:-3], "", "garbage", cookie + "x"):
        assert await _refused_with(console, forged) == (303, 401), forged


async def test_a_session_cookie_past_its_ttl_is_refused_and_one_within_it_is_not(console: Console) -> None:
    # Given two sessions opened (by the console's own login) a little more, and a little less, than the session
    # lifetime ago: their rows' clocks are moved back
    ttl = int(console.settings.console_session_ttl.total_seconds())
    opened = {}
    for name, ago in (("expired", ttl + 5), ("fresh", ttl - 60)):
        console.client.cookies.clear()
        await session(console.client, OPERATOR_TOKEN)
        async with console.engine.begin() as connection:
            await connection.execute(
                text(
                    "UPDATE console_sessions SET created_at = created_at - make_interval(secs => :ago),"
                    " expires_at = expires_at - make_interval(secs => :ago) WHERE id_hash = :id_hash"
                ),
                {"ago": ago, "id_hash": session_id_hash(console.client.cookies[COOKIE])},
            )
        opened[name] = console.client.cookies[COOKIE]

    # Then the expired one is refused, the fresh one accepted
    assert await _refused_with(console, opened["expired"]) == (303, 401)
    assert await _refused_with(console, opened["fresh"]) == (200, 200)


async def test_a_session_whose_token_was_removed_from_the_configuration_is_refused(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given a viewer's session and an operator's, both logged in
    await seed(engine)
    async with serving(engine, database_url) as served:
        await session(served.client, VIEWER_TOKEN)
        viewer_cookie = served.client.cookies[COOKIE]
        served.client.cookies.clear()
        await session(served.client, OPERATOR_TOKEN)
        operator_cookie = served.client.cookies[COOKIE]

    # When the console restarts with the operator's token removed
    async with serving(engine, database_url, console_tokens=f"vic:viewer:{VIEWER_TOKEN}") as restarted:
        # Then the operator's session is refused, and so is the viewer's (a changed configuration ends them all)
        assert await _refused_with(restarted, operator_cookie) == (303, 401)
        assert await _refused_with(restarted, viewer_cookie) == (303, 401)


async def test_a_session_is_refused_when_its_fingerprint_is_no_longer_known_even_with_the_same_key(
    console: Console,
) -> None:
    # Given an operator's session cookie
    await session(console.client, OPERATOR_TOKEN)
    cookie = console.client.cookies[COOKIE]
    operators = state_of_app(console).operators
    # When the sessions are read with the same token list but the operator's entry gone
    program = state_of_app(console).wiring.settings.program
    without = Sessions([o for t, o in operators.items() if t != OPERATOR_TOKEN], operators, 3600, program)
    same = Sessions(operators.values(), operators, 3600, program)

    # Then it is refused, and read as the operator while the entry is there
    async with console.engine.connect() as connection:
        assert await without.read(connection, cookie) is None
        found = await same.read(connection, cookie)
    assert found is not None
    assert found.operator.name == "ann"


# ---------------------------------------------------------------- security headers


async def test_every_response_carries_the_security_headers_and_pages_are_never_cached(console: Console) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)

    # When every route is called anonymously, with a token and with the session; and an error, a wrong
    # method and a static asset are fetched
    answers: list[tuple[str, httpx.Response]] = []
    async with console.client_from("127.0.0.3") as anonymous, console.client_from("127.0.0.4") as tool:
        for method, path in every_route():
            answers.append((f"anonymous {method} {path}", await call(anonymous, method, path)))
            answers.append((f"bearer {method} {path}", await call(tool, method, path, headers=bearer(VIEWER_TOKEN))))
            if method == "GET":
                answers.append((f"session {method} {path}", await console.client.get(path)))
    answers.append(("405", await console.client.post("/quarantine", data={"csrf": csrf})))
    answers.append(("404", await console.client.get("/quarantine/no/such/record")))
    answers.append(("400", await console.client.get("/api/quarantine", params={"limit": "-1"})))
    static = await console.client.get("/static/console.css")

    # Then every one carries the strict CSP (no inline script or style), no framing, no sniffing, and none
    # but the static asset may be cached
    assert {status for _, response in answers for status in [response.status_code]} >= {200, 303, 401, 403, 404, 405}
    for what, response in [*answers, ("static", static)]:
        csp = response.headers.get("content-security-policy", "")
        assert "'unsafe-inline'" not in csp, what
        assert "'unsafe-eval'" not in csp, what
        assert "default-src 'none'" in csp, what
        assert "frame-ancestors 'none'" in csp, what
        assert response.headers.get("x-frame-options") == "DENY", what
        assert response.headers.get("x-content-type-options") == "nosniff", what
        assert response.headers.get("referrer-policy") == "no-referrer", what
    for what, response in answers:
        assert response.headers.get("cache-control") == "no-store", what
    assert static.status_code == 200
    assert static.headers.get("cache-control") != "no-store"
    record = [r for what, r in answers if what == f"session GET /quarantine/{HEAD}"]
    assert [r.status_code for r in record] == [200]


# ---------------------------------------------------------------- the audit


async def test_every_action_taken_through_the_console_is_audited_under_the_tokens_name(console: Console) -> None:
    # Given an operator's session
    csrf = await session(console.client, OPERATOR_TOKEN)

    # When the operator reveals a payload, annotates and resolves records, releases a key and retries an effect
    done = {
        "reveal": await console.client.post("/actions/reveal", data={"csrf": csrf, "failure_id": HEAD}),
        "annotate": await console.client.post(
            "/actions/annotate", data={"csrf": csrf, "failure_id": OTHERS[0], "note": "INC-7", "confirm": "yes"}
        ),
        "resolve": await console.client.post(
            "/actions/resolve", data={"csrf": csrf, "failure_id": OTHERS[1], "reason": "fixed", "confirm": "yes"}
        ),
        "release": await console.client.post(
            "/actions/release", data={"csrf": csrf, "key": "K-1", "consumer": CONSUMER, "confirm": "yes"}
        ),
        "retry": await console.client.post(
            "/actions/retry", data={"csrf": csrf, "key": EFFECT, "reason": "card fixed", "confirm": "yes"}
        ),
    }

    # Then each worked, and each wrote one audit row with the operator's name, what it chose and what came of it
    assert {name: response.status_code for name, response in done.items()} == dict.fromkeys(done, 200)
    audit = await rows(console.engine, "SELECT actor, action, selection, result FROM audit_log ORDER BY id")
    assert [(row["actor"], row["action"]) for row in audit] == [
        ("ann", "quarantine.reveal"),
        ("ann", "quarantine.annotate"),
        ("ann", "quarantine.resolve"),
        ("ann", "parked.release"),
        ("ann", "effects.retry"),
    ]
    reveal, annotate, resolve, release, retry = audit
    assert (reveal["selection"]["failure_id"], reveal["selection"]["via"]) == (HEAD, "console")
    assert annotate["selection"]["picked"] == [OTHERS[0]]
    assert annotate["result"] == {"annotated": 1}
    assert (resolve["selection"]["reason"], resolve["result"]) == ("fixed", {"resolved": 1})
    assert release["selection"] == {"consumer": CONSUMER, "key": "K-1"}
    assert release["result"]["blocked_by"] == HEAD
    assert (retry["selection"]["keys"], retry["result"]["retried"]) == ([EFFECT], {EFFECT: "pending"})
    # And the changes themselves are there
    assert await rows(console.engine, "SELECT count(*) AS n FROM key_blocks") == [{"n": 0}]
    assert await rows(console.engine, "SELECT state FROM effects") == [{"state": "pending"}]
    assert await rows(console.engine, "SELECT status FROM quarantine WHERE failure_id = :id", id=OTHERS[1]) == [
        {"status": "resolved"}
    ]
    timeline = await rows(console.engine, "SELECT event, actor FROM quarantine_events WHERE failure_id = :id", id=HEAD)
    assert {"event": "payload revealed", "actor": "ann"} in timeline


# ---------------------------------------------------------------- the JSON API (contract §9)


async def test_the_api_lists_with_the_cli_filters_pages_by_limit_and_offset_and_counts_the_total(
    console: Console, database_url: str
) -> None:
    # Given three quarantined records and the CLI on the same database
    plain = settings_for(database_url, KAFKA, Topics("console"))
    queries: list[tuple[dict[str, str], list[str]]] = [
        ({}, []),
        ({"error_code": "SCHEMA_UNSUPPORTED"}, ["--error-code", "SCHEMA_UNSUPPORTED"]),
        ({"status": "open", "key": "K-1"}, ["--status", "open", "--key", "K-1"]),
        ({"message_id": f"m-{OTHERS[1]}"}, ["--message-id", f"m-{OTHERS[1]}"]),
        ({"older_than": "1h"}, ["--older-than", "1h"]),
        ({"since": _ago(150), "until": _ago(1)}, ["--since", _ago(150), "--until", _ago(1)]),
        ({"limit": "1", "offset": "1"}, ["--limit", "1", "--offset", "1"]),
    ]

    for query, flags in queries:
        # When the API and `quarantine list --json` are asked the same
        api = await console.client.get("/api/quarantine", params=query, headers=bearer(VIEWER_TOKEN))
        listed = json.loads((await cli(plain, "quarantine", "list", "--json", *flags)).stdout)

        # Then they list the same records, and the API adds the total and the page
        assert api.status_code == 200, (query, api.text)
        body = api.json()
        assert body["items"] == listed, query
        assert (body["limit"], body["offset"]) == (int(query.get("limit", 100)), int(query.get("offset", 0)))

    by_owner = (await console.client.get("/api/quarantine?owner=billing", headers=bearer(VIEWER_TOKEN))).json()
    paged = (await console.client.get("/api/quarantine?limit=2&offset=2", headers=bearer(VIEWER_TOKEN))).json()
    everything = (await console.client.get("/api/quarantine", headers=bearer(VIEWER_TOKEN))).json()
    assert [item["failure_id"] for item in everything["items"]] == [HEAD, *OTHERS]  # oldest first
    assert everything["total"] == 3
    assert [item["failure_id"] for item in by_owner["items"]] == [OTHERS[1]]
    assert (len(paged["items"]), paged["total"]) == (1, 3)
    assert all("payload" not in item for item in everything["items"])


def _ago(minutes: int) -> str:
    """An RFC 3339 timestamp this many minutes ago."""
    return (datetime.now(UTC) - timedelta(minutes=minutes)).isoformat()


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ({"status": "lost"}, "status"),
        ({"error_code": "NOT_A_CODE"}, "error_code"),
        ({"older_than": "soon"}, "older_than"),
        ({"since": "yesterday"}, "since"),
        ({"limit": "0"}, "limit"),
        ({"limit": "10001"}, "limit"),
        ({"offset": "-1"}, "offset"),
    ],
)
async def test_the_api_refuses_a_bad_filter_with_400_naming_it(
    console: Console, query: dict[str, str], problem: str
) -> None:
    # When the API is asked with a bad filter
    response = await console.client.get("/api/quarantine", params=query, headers=bearer(VIEWER_TOKEN))

    # Then it answers 400 naming the filter
    assert response.status_code == 400
    assert response.json()["error"].startswith(problem)


async def test_the_api_shows_one_record_by_its_slashed_failure_id_without_its_payload(console: Console) -> None:
    # When a record whose id holds slashes is asked for, and one that does not exist
    found = await console.client.get(f"/api/quarantine/{HEAD}", headers=bearer(VIEWER_TOKEN))
    missing = await console.client.get("/api/quarantine/orders/9/9", headers=bearer(VIEWER_TOKEN))

    # Then the record is there with its envelope, timeline and headers, but not its payload, and no reveal
    # was audited; the missing one is a 404 in JSON
    assert found.status_code == 200
    record = found.json()
    assert record["failure_id"] == HEAD
    assert record["envelope"] == {"failureId": HEAD, "errorCode": "MALFORMED_PAYLOAD"}
    assert record["source_headers"] == [["traceparent", "00-abc-01"]]
    assert [event["event"] for event in record["timeline"]][:1] == ["failed"] or record["timeline"] == []
    assert "payload" not in record
    assert "SECRET-PAYLOAD" not in found.text
    assert "4111" not in found.text
    assert await rows(console.engine, "SELECT * FROM audit_log") == []
    assert missing.status_code == 404
    assert missing.json() == {"error": "no quarantined record with failure id orders/9/9"}


async def test_the_api_stats_are_what_quarantine_stats_json_prints(console: Console, database_url: str) -> None:
    # Given the CLI on the same database
    plain = settings_for(database_url, KAFKA, Topics("console"))

    # When both are asked for the statistics
    api = await console.client.get("/api/stats", headers=bearer(VIEWER_TOKEN))
    printed = json.loads((await cli(plain, "quarantine", "stats", "--json")).stdout)

    # Then they agree (the oldest age up to the seconds between the two questions)
    assert api.status_code == 200
    stats = api.json()
    age, printed_age = stats.pop("oldest_open_age_seconds"), printed.pop("oldest_open_age_seconds")
    assert stats == printed
    assert 0 <= printed_age - age < 60
    assert 3 * 3600 - 60 < age < 3 * 3600 + 60
    assert stats["open"] == 3

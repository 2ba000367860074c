"""Repair in bulk from the console: a failure group (error code × owner) acted on from the overview, a range of
first-failed times on every bulk form, and a ramped reprocess asked for from the launch form.

Real PostgreSQL; the console application runs in this process, driven by httpx through its ASGI transport
(test_console_security.py's console); the reprocessor is a stub that records what reaches it (the ramp itself
runs on Kafka in test_reprocess_ramp.py)."""

from __future__ import annotations

import contextlib
import html
import re
from collections.abc import AsyncIterator

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.console.app import create_app
from service.console.web import Wiring
from service.containers import Container
from service.orders.domain import DOMAIN
from service.worker.reprocess_run import Options, Progress, Report, Selection
from tests.integration.test_console_security import (
    BASE,
    HEAD,
    OPERATOR_TOKEN,
    OTHERS,
    VIEWER_TOKEN,
    Console,
    confirm_form,
    console_settings,
    seed,
    session,
    snapshot,
)
from tests.support import eventually, rows


@contextlib.asynccontextmanager
async def console_recording(engine: AsyncEngine, database_url: str) -> AsyncIterator[tuple[Console, list[Options]]]:
    """The seeded console, its reprocessor a stub that answers a dry run with the selection's failure ids (the
    named ones, or the open records of its code and owner) and records the options of each real run."""
    await seed(engine)
    settings = console_settings(database_url)
    container = Container(settings=settings, domain=DOMAIN)
    runs: list[Options] = []

    async def reprocess(owner: Settings, selection: Selection, options: Options, progress: Progress) -> Report:
        chosen = list(selection.failure_ids) or [
            row["failure_id"]
            for row in await rows(
                engine,
                "SELECT failure_id FROM quarantine WHERE status = 'open' AND error_code = :code AND owner = :owner",
                code=selection.error_code,
                owner=selection.owner,
            )
        ]
        if not options.dry_run:
            runs.append(options)
        return Report(None, len(chosen), selection=chosen, statuses=dict.fromkeys(chosen, "open"))

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
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            yield Console(app, client, engine, settings), runs


def group_form(overview: str, code: str, owner: str) -> dict[str, list[str]]:
    """The fields of the overview's action form of one failure group, as the browser posts them."""
    for form in re.findall(r'<form class="group-actions".*?</form>', overview, flags=re.S):
        fields: dict[str, list[str]] = {}
        for name, value in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', form):
            fields.setdefault(html.unescape(name), []).append(html.unescape(value))
        if fields.get("match_error_code") == [code] and fields.get("match_owner") == [owner]:
            return fields
    raise AssertionError(f"the overview offers no action on the group {code} × {owner}")


async def test_a_failure_group_is_resolved_from_the_overview_through_its_dry_run(
    engine: AsyncEngine, database_url: str
) -> None:
    async with console_recording(engine, database_url) as (console, _):
        # Given an operator on the overview, where each failure group has its actions
        await session(console.client, OPERATOR_TOKEN)
        overview = (await console.client.get("/")).text
        form = group_form(overview, "INVALID_FIELD", "billing") | {"text": ["billing fixed their producer"]}

        # When the operator asks to resolve the INVALID_FIELD group of billing
        preview = await console.client.post("/actions/resolve", data=form)

        # Then the dry run lists exactly the group's open records, and nothing changed yet
        assert preview.status_code == 200, preview.text
        assert re.search(r'id="preview-count">1<', preview.text)
        assert OTHERS[1] in preview.text
        assert HEAD not in preview.text
        assert await rows(console.engine, "SELECT count(*) AS n FROM audit_log") == [{"n": 0}]

        # When it is confirmed
        done = await console.client.post("/actions/resolve", data=confirm_form(preview.text))

        # Then exactly the group was resolved, and the audit keeps the group it was asked for
        assert done.status_code == 200, done.text
        resolved = await rows(console.engine, "SELECT failure_id FROM quarantine WHERE status = 'resolved'")
        assert resolved == [{"failure_id": OTHERS[1]}]
        [audit] = await rows(console.engine, "SELECT actor, action, selection FROM audit_log")
        assert (audit["actor"], audit["action"]) == ("ann", "quarantine.resolve")
        selection = audit["selection"]
        assert (selection["error_code"], selection["owner"], selection["picked"]) == (
            "INVALID_FIELD",
            "billing",
            [OTHERS[1]],
        )


async def test_a_viewer_sees_the_groups_but_no_action_on_them(engine: AsyncEngine, database_url: str) -> None:
    async with console_recording(engine, database_url) as (console, _):
        await session(console.client, VIEWER_TOKEN)
        overview = (await console.client.get("/")).text
        assert "INVALID_FIELD" in overview
        assert 'class="group-actions"' not in overview


async def test_a_group_is_reprocessed_with_a_ramp_from_the_overview(engine: AsyncEngine, database_url: str) -> None:
    async with console_recording(engine, database_url) as (console, runs):
        # Given the overview's form of the MALFORMED_PAYLOAD group of orders, the ramp ticked
        await session(console.client, OPERATOR_TOKEN)
        overview = (await console.client.get("/")).text
        form = group_form(overview, "MALFORMED_PAYLOAD", "orders") | {"text": ["INC-9"], "ramp": ["yes"]}

        # When the operator asks to reprocess it, then confirms the dry run
        preview = await console.client.post("/actions/reprocess", data=form)
        assert preview.status_code == 200, preview.text
        assert "batches of 1, 2, 5, 20, 50, 100" in preview.text
        assert HEAD in preview.text
        assert OTHERS[1] not in preview.text
        launched = await console.client.post("/actions/reprocess", data=confirm_form(preview.text))

        # Then one run was started, ramped, on exactly the group's record
        assert launched.status_code == 303

        async def started() -> bool:
            return bool(runs)

        await eventually(started)
        assert [(options.ramp, options.reason, options.actor) for options in runs] == [(True, "INC-9", "ann")]


async def test_a_bulk_form_selects_by_a_range_of_first_failed_times(engine: AsyncEngine, database_url: str) -> None:
    async with console_recording(engine, database_url) as (console, _):
        # Given records first failed 3 h, 2 h and 5 min ago, and an operator
        csrf = await session(console.client, OPERATOR_TOKEN)
        asked = {"csrf": csrf, "scope": "matching", "text": "INC-4"}

        # When the operator annotates every open record first failed since 150 minutes ago, until 1 hour ago
        preview = await console.client.post(
            "/actions/annotate", data=asked | {"match_since": "150m", "match_until": "1h"}
        )

        # Then the dry run lists the one record in that range
        assert preview.status_code == 200, preview.text
        assert re.search(r'id="preview-count">1<', preview.text)
        assert OTHERS[0] in preview.text

        # And the list's filters travel to its bulk form
        listed = (await console.client.get("/quarantine", params={"since": "150m", "owner": "orders"})).text
        assert '<input type="hidden" name="match_since" value="150m">' in listed
        assert '<input type="hidden" name="match_owner" value="orders">' in listed


async def test_a_range_that_ends_before_it_starts_or_a_bad_time_is_400_and_changes_nothing(
    engine: AsyncEngine, database_url: str
) -> None:
    async with console_recording(engine, database_url) as (console, runs):
        csrf = await session(console.client, OPERATOR_TOKEN)
        before = await snapshot(console.engine)
        asked = {"csrf": csrf, "scope": "matching", "text": "x", "confirm": "yes"}
        for action, fields in (
            ("annotate", {"match_since": "1h", "match_until": "2h"}),
            ("resolve", {"match_since": "1h", "match_until": "2h"}),
            ("reprocess", {"match_since": "1h", "match_until": "2h"}),
            ("resolve", {"match_since": "yesterday"}),
        ):
            answer = await console.client.post(f"/actions/{action}", data=asked | fields)
            assert answer.status_code == 400, (action, fields, answer.text)
            assert "match_since" in answer.text or "match_until" in answer.text
        listing = await console.client.get("/quarantine", params={"since": "1h", "until": "2h"})
        assert listing.status_code == 400
        assert await snapshot(console.engine) == before
        assert runs == []

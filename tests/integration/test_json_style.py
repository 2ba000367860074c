"""One JSON style (contract §10): every `--json` output and every console API document has snake_case keys, at every
depth; only an embedded envelope or payload keeps what it holds (envelopes on topics keep camelCase).

The commands and routes are found in the CLI and the console themselves, so one added later without a case here
fails this test. Real PostgreSQL and Kafka; the CLI runs as a process, the console in this process.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.cli import command
from service.console import routes
from service.orders.domain import DOMAIN
from service.store import reprocess as reprocess_store
from tests.integration.test_console_security import OPERATOR_TOKEN, bearer, serving
from tests.support import Topics, cli, quarantine_as, settings_for
from tests.support.orders import quarantined_placement

SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")
EMBEDDED = {"envelope", "payload"}  # documents kept as they are stored: an envelope as it went to its topic
EFFECT = "J-1/payment.capture"


def non_snake_keys(document: Any, path: str = "$") -> Iterator[str]:
    """The path of every key, at any depth, that is not snake_case (not looking inside an embedded document)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if not isinstance(key, str) or not SNAKE_CASE.match(key):
                yield f"{path}.{key}"
            elif key not in EMBEDDED:
                yield from non_snake_keys(value, f"{path}.{key}")
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from non_snake_keys(value, f"{path}[{index}]")


def json_commands(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command of the CLI that takes --json, as the words that run it."""
    if any(param.name == "as_json" for param in group.params):
        yield prefix
    for name, sub in getattr(group, "commands", {}).items():
        yield from json_commands(sub, (*prefix, name))


def test_the_walk_finds_a_key_that_is_not_snake_case_at_any_depth_but_not_inside_an_envelope() -> None:
    document = {"ok": [{"fine_too": {"blockedBy": 1}}], "envelope": {"failureId": "x"}, "payload": {"A": 1}}
    assert list(non_snake_keys(document)) == ["$.ok[0].fine_too.blockedBy"]


async def test_every_json_output_and_api_document_has_snake_case_keys(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given a record holding its key, a failed effect, a set-aside outbox row and a reprocess run
    settings = settings_for(database_url, kafka, topics, ordering="key")
    record = f"{topics.source}/0/0"
    failed_at = datetime.now(UTC) - timedelta(hours=1)
    await quarantine_as(engine, settings.consumer_name, [quarantined_placement(record, "J-1", failed_at)])
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason)"
                " VALUES (:consumer, 'J-1', :record, 'quarantined')"
            ),
            {"consumer": settings.consumer_name, "record": record},
        )
        await connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts, last_error_code)"
                " VALUES (:key, 'J-1', 'payment.capture', 'failed', '{\"amountCents\": 1}', 5, 'PROVIDER_REJECTED')"
            ),
            {"key": EFFECT},
        )
        row_id = (
            await connection.execute(
                text(
                    "INSERT INTO outbox (topic, key, headers, payload, set_aside_at, set_aside_code)"
                    " VALUES ('t', 'k', '{}', 'x', now(), 'MESSAGE_TOO_LARGE') RETURNING id"
                )
            )
        ).scalar_one()
        await reprocess_store.start_run(
            connection, "rp-json", actor="ann", reason="r", selection={"failure_ids": [record]}, options={"rate": 1.0}
        )
    # Each command taking --json, in an order that leaves the next something to act on
    cases: dict[tuple[str, ...], tuple[str, ...]] = {
        ("quarantine", "list"): (),
        ("quarantine", "show"): (record,),
        ("quarantine", "stats"): (),
        ("quarantine", "annotate"): (record, "--note", "n"),
        ("reprocess",): ("--failure-id", record, "--reason", "r", "--dry-run"),
        ("reprocess", "list"): (),
        ("reprocess", "show"): ("rp-json",),
        ("parked", "list"): (),
        ("parked", "release"): ("J-1",),
        ("quarantine", "edit"): (record, "--set-header", "x-fix=1", "--actor", "alice", "--dry-run"),
        ("quarantine", "reject-edit"): (),  # an edit waiting for approval, made below
        ("quarantine", "approve-edit"): (),
        ("quarantine", "resolve"): (record, "--reason", "r"),
        ("effects", "list"): ("--state", "failed"),
        ("effects", "show"): (EFFECT,),
        ("effects", "retry"): (EFFECT, "--reason", "r"),
        ("outbox", "set-aside"): (),
        ("outbox", "put-back"): (str(row_id),),
        ("reconcile",): (),
        ("topics", "plan"): (),
        ("topics", "acls"): ("--principal", "User:order-service"),
        ("status",): (),
        ("quarantine", "erase"): (record, "--yes", "--author", "dpo"),
    }
    assert set(cases) == set(json_commands(command(DOMAIN))), "a command takes --json that this test does not run"

    # When each prints its JSON
    documents: dict[str, Any] = {}
    approving = settings_for(database_url, kafka, topics, ordering="key", console_edit_approval=True)
    for words, args in cases.items():
        if words in {("quarantine", "reject-edit"), ("quarantine", "approve-edit")}:
            edit = ("quarantine", "edit", record, "--set-header", "x-fix=1", "--actor", "alice", "--json")
            args = (str(json.loads((await cli(approving, *edit)).stdout)["edit_id"]), "--actor", "bob")
        done = await cli(approving, *words, *args, "--json")
        assert done.returncode == 0, (words, done.stderr)
        documents[" ".join(words)] = json.loads(done.stdout)
    # And each API route of the console answers
    api = [route.path for route in routes.ROUTES if route.path.startswith("/api/")]  # type: ignore[attr-defined]
    async with serving(engine, database_url) as console:
        for path in api:
            concrete = path.replace("{failure_id:path}", record)
            answer = await console.client.get(
                concrete, params={"consumer": settings.consumer_name}, headers=bearer(OPERATOR_TOKEN)
            )
            assert answer.status_code == 200, (path, answer.text)
            documents[path] = answer.json()

    # Then no key anywhere is other than snake_case (an envelope was there, and kept its own)
    assert {name: list(non_snake_keys(document)) for name, document in documents.items()} == {
        name: [] for name in documents
    }
    assert "failureId" in documents["quarantine show"]["envelope"]
    assert len(api) >= 3

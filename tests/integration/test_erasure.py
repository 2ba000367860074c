"""`quarantine erase` on a real PostgreSQL database: it removes the original bytes and header values of exactly the
records a selection names, keeps their facts, marks and audits the erasure; its dry run says exactly what the real
run does, with the same exit codes; and a record erased can no longer be reprocessed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import KAFKA
from tests.integration.test_console_security import CONSUMER, SECRET_PAYLOAD, add, quarantined
from tests.support import Topics, cli, rows, settings_for

FACTS = (
    "SELECT failure_id, consumer_name, message_id, error_code, status, owner, ordering_key, envelope, attempts,"
    " first_failed_at, last_failed_at FROM quarantine ORDER BY failure_id"
)
BYTES = (
    "SELECT failure_id, payload IS NOT NULL AS has_payload, source_headers, erased_at IS NOT NULL AS erased, erased_by"
    " FROM quarantine ORDER BY failure_id"
)


async def seed(engine: AsyncEngine) -> None:
    """Three records of key K-1 (one of them resolved) and one of key K-2."""
    now = datetime.now(UTC)
    await add(
        engine,
        [
            quarantined("s/0/1", key="K-1", failed_at=now - timedelta(hours=3)),
            quarantined("s/0/2", key="K-1", failed_at=now - timedelta(hours=2)),
            quarantined("s/0/3", key="K-1", failed_at=now - timedelta(hours=1)),
            quarantined("s/0/4", key="K-2", failed_at=now - timedelta(minutes=5)),
        ],
    )
    async with engine.begin() as connection:
        await connection.exec_driver_sql("UPDATE quarantine SET status = 'resolved' WHERE failure_id = 's/0/3'")


def settings(database_url: str) -> object:
    """The CLI's settings for this test's database, reading the seeded records' consumer."""
    return settings_for(database_url, KAFKA, Topics("erasure"), consumer_name=CONSUMER)


async def test_erasing_a_key_removes_the_bytes_of_each_of_its_records_keeps_their_facts_and_is_audited(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given three records of a data subject's key (one resolved) and one of another key
    await seed(engine)
    facts = await rows(engine, FACTS)
    config = settings(database_url)

    # When the key's records are erased, a dry run first, then for real
    dry = await cli(config, "quarantine", "erase", "--key", "K-1", "--dry-run", "--json")
    after_dry = await rows(engine, BYTES)
    real = await cli(config, "quarantine", "erase", "--key", "K-1", "--yes", "--author", "dpo", "--json")

    # Then the dry run named exactly the records the real run erased, and changed nothing
    named = [{"consumer": CONSUMER, "failure_id": f"s/0/{n}"} for n in (1, 2, 3)]
    assert json.loads(dry.stdout) == {"dry_run": True, "selected": named, "already_erased": [], "missing": []}
    assert all(row["has_payload"] for row in after_dry)
    assert json.loads(real.stdout) == {"dry_run": False, "erased": named, "already_erased": [], "missing": []}
    # And their bytes and header values are gone, their facts stay, the other key's record is untouched
    assert await rows(engine, FACTS) == facts
    assert await rows(engine, BYTES) == [
        *(
            {"failure_id": f"s/0/{n}", "has_payload": False, "source_headers": [["traceparent", ""]], "erased": True,
             "erased_by": "dpo"}
            for n in (1, 2, 3)
        ),
        {"failure_id": "s/0/4", "has_payload": True, "source_headers": [["traceparent", "00-abc-01"]],
         "erased": False, "erased_by": None},
    ]  # fmt: skip
    # And the erasure is audited once, with its selection and count, and in each record's timeline
    audit = await rows(engine, "SELECT actor, action, selection, result FROM audit_log")
    assert audit == [
        {
            "actor": "dpo",
            "action": "quarantine.erase",
            "selection": {
                "failure_ids": [],
                "key": "K-1",
                "consumer": None,
                "picked": [[CONSUMER, f"s/0/{n}"] for n in (1, 2, 3)],
                "missing": [],
            },
            "result": {"erased": 3, "already_erased": 0},
        }
    ]
    events = await rows(engine, "SELECT failure_id, actor FROM quarantine_events WHERE event = 'erased' ORDER BY 1")
    assert events == [{"failure_id": f"s/0/{n}", "actor": "dpo"} for n in (1, 2, 3)]
    # And `quarantine show` says when and by whom
    shown = await cli(config, "quarantine", "show", "s/0/1")
    assert "erased at " in shown.stdout
    assert "by dpo: its payload and header values are gone" in shown.stdout
    # And a second erasure finds them erased already
    again = await cli(config, "quarantine", "erase", "s/0/1", "--author", "dpo")
    assert again.stdout.strip() == "s/0/1: erased already"


async def test_an_unknown_failure_id_exits_1_in_the_dry_run_as_in_the_real_run(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given the records
    await seed(engine)
    before = await rows(engine, BYTES)
    config = settings(database_url)

    # When a known and an unknown failure id are erased, as a dry run and for real
    dry = await cli(config, "quarantine", "erase", "s/0/4", "nope/1/2", "--dry-run", check=False)
    unchanged = await rows(engine, BYTES)
    real = await cli(config, "quarantine", "erase", "s/0/4", "nope/1/2", "--yes", "--author", "dpo", check=False)

    # Then both name the unknown id and exit 1; the dry run changed nothing, the real run erased the known one
    assert (dry.returncode, real.returncode) == (1, 1)
    assert "quarantine erase: 1 records selected: s/0/4" in dry.stdout
    for finished in (dry, real):
        assert "no quarantined record with failure id nope/1/2" in finished.stderr
    assert unchanged == before
    assert real.stdout.strip() == "s/0/4: erased"
    assert [row["failure_id"] for row in await rows(engine, BYTES) if row["erased"]] == ["s/0/4"]


async def test_a_key_that_names_no_record_selects_nothing_and_exits_0(engine: AsyncEngine, database_url: str) -> None:
    await seed(engine)
    finished = await cli(settings(database_url), "quarantine", "erase", "--key", "NOBODY", "--author", "dpo")
    assert "no records selected: nothing changed" in finished.stderr
    assert all(row["has_payload"] for row in await rows(engine, BYTES))


async def test_reprocessing_an_erased_record_is_refused_naming_the_erasure(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given an erased record
    await seed(engine)
    config = settings(database_url)
    await cli(config, "quarantine", "erase", "s/0/2", "--author", "dpo")

    # When it is reprocessed (a dry run: the real run's exit code, nothing written)
    finished = await cli(config, "reprocess", "--failure-id", "s/0/2", "--reason", "retry", "--dry-run", check=False)

    # Then it is refused, in one line that says when and by whom it was erased, exit 1
    assert finished.returncode == 1
    assert "reprocess: s/0/2 was erased at " in finished.stderr
    assert "by dpo: its payload is gone, it cannot be reprocessed" in finished.stderr
    assert await rows(engine, "SELECT payload FROM quarantine WHERE failure_id = 's/0/1'") == [
        {"payload": SECRET_PAYLOAD}
    ]


EDIT = (
    "INSERT INTO quarantine_edits (consumer_name, failure_id, actor, state, payload_before, payload_after,"
    " headers_before, headers_after, diff, repeat_failures)"
    " VALUES (:consumer, :failure_id, 'alice', :state, :before, :after, CAST(:headers AS jsonb),"
    " CAST(:headers AS jsonb), :diff, 0)"
)
EDITS = (
    "SELECT failure_id, state, payload_before, payload_after, headers_before, headers_after, diff, decided_by"
    " FROM quarantine_edits ORDER BY failure_id"
)


async def test_erasing_a_record_erases_its_edits_too_and_turns_down_one_waiting_for_approval(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given records of key K-1, one with an edit waiting for approval and one with an edit sent, both quoting the
    # data subject's bytes and a header value; and a record of another key with an edit
    await seed(engine)
    headers = json.dumps([["customer-email", "jane@example.com"]])
    async with engine.begin() as connection:
        for failure_id, state in (("s/0/1", "pending_approval"), ("s/0/2", "sent"), ("s/0/4", "pending_approval")):
            await connection.execute(
                text(EDIT),
                {
                    "consumer": CONSUMER,
                    "failure_id": failure_id,
                    "state": state,
                    "before": SECRET_PAYLOAD,
                    "after": SECRET_PAYLOAD + b" ",
                    "headers": headers,
                    "diff": "- jane@example.com\n+ jane@example.com ",
                },
            )

        # And copies of them in the outbox (a reprocess run's, published; an edit's, not yet), and one of s/0/4
        for failure_id, published in (("s/0/1", "now()"), ("s/0/2", "NULL"), ("s/0/4", "NULL")):
            await connection.execute(
                text(
                    "INSERT INTO outbox (topic, key, headers, payload, published_at)"
                    f" VALUES ('erasure.reprocess', 'K', CAST(:headers AS jsonb), :payload, {published})"
                ),
                {
                    "headers": json.dumps(
                        [["customer-email", "jane@example.com"], ["failure-id", failure_id], ["consumer", CONSUMER]]
                    ),
                    "payload": SECRET_PAYLOAD,
                },
            )

    # When the key's records are erased
    real = await cli(settings(database_url), "quarantine", "erase", "--key", "K-1", "--yes", "--author", "dpo")
    assert real.returncode == 0, real.stderr

    # Then their edits hold no bytes, no header value and no diff, and the waiting one can no longer be sent; the
    # other key's edit is untouched
    edits = {row["failure_id"]: row for row in await rows(engine, EDITS)}
    for failure_id in ("s/0/1", "s/0/2"):
        edit = edits[failure_id]
        assert edit["payload_before"] is None
        assert bytes(edit["payload_after"]) == b""
        assert edit["headers_before"] == edit["headers_after"] == [["customer-email", ""]]
        assert edit["diff"] == "(erased)"
    assert (edits["s/0/1"]["state"], edits["s/0/1"]["decided_by"]) == ("rejected", "dpo")
    assert edits["s/0/2"]["state"] == "sent"
    assert bytes(edits["s/0/4"]["payload_before"]) == SECRET_PAYLOAD
    assert edits["s/0/4"]["state"] == "pending_approval"
    # And their copies hold no bytes and no header value, the unpublished one is never sent; s/0/4's is untouched
    copies = await rows(engine, "SELECT headers, payload, published_at FROM outbox ORDER BY id")
    assert [(bytes(copy["payload"]), copy["headers"][0]) for copy in copies] == [
        (b"", ["customer-email", ""]),
        (b"", ["customer-email", ""]),
        (SECRET_PAYLOAD, ["customer-email", "jane@example.com"]),
    ]
    assert [copy["published_at"] is not None for copy in copies] == [True, True, False]

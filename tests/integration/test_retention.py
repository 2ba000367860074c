"""Retention (docs/runbook.md, Retention and erasure): one `reconcile` pass removes exactly what is past its period,
on a real PostgreSQL database, with the default periods: the bytes of records closed 30 days ago, records closed
90 days ago with their timelines, audit rows of 400 days, runs of 90 days, console sessions ended 7 days ago.
Open records are never touched, however old."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import KAFKA
from tests.integration.test_console_security import CONSUMER, SECRET_PAYLOAD, add, quarantined
from tests.support import Topics, cli, rows, settings_for

# failure id: (status, days since it closed, or since it failed for an open one)
RECORDS = {
    "t/0/1": ("open", 500),
    "t/0/2": ("reprocessing", 500),
    "t/0/3": ("resolved", 100),
    "t/0/4": ("reprocessed", 95),
    "t/0/5": ("resolved", 40),
    "t/0/6": ("reprocessed", 31),
    "t/0/7": ("resolved", 1),
}


async def seed(engine: AsyncEngine) -> None:
    """The records above (each with a note), audit rows, runs, console sessions and heartbeats of several ages."""
    now = datetime.now(UTC)
    await add(
        engine, [quarantined(fid, failed_at=now - timedelta(days=days + 1)) for fid, (_, days) in RECORDS.items()]
    )
    async with engine.begin() as connection:
        for failure_id, (status, days) in RECORDS.items():
            params = {"fid": failure_id, "status": status, "at": now - timedelta(days=days), "c": CONSUMER}
            await connection.execute(
                text(
                    "INSERT INTO quarantine_annotations (consumer_name, failure_id, author, note)"
                    " VALUES (:c, :fid, 'ann', 'n')"
                ),
                params,
            )
            await connection.execute(
                text(
                    "UPDATE quarantine SET status = CAST(:status AS text), updated_at = :at,"
                    " resolved_at = CASE WHEN CAST(:status AS text) = 'resolved' THEN CAST(:at AS timestamptz) END"
                    " WHERE failure_id = :fid"
                ),
                params,
            )
        for days in (401, 399):
            await connection.execute(
                text(
                    "INSERT INTO audit_log (at, actor, action, selection, result) VALUES (:at, 'ann', 'x', '{}', '{}')"
                ),
                {"at": now - timedelta(days=days)},
            )
        for run_id, finished_days in (("old", 91), ("recent", 89), ("running", None)):
            started = now - timedelta(days=200)
            finished = None if finished_days is None else now - timedelta(days=finished_days)
            await connection.execute(
                text(
                    "INSERT INTO reprocess_runs (id, actor, reason, selection, options, outcome, started_at,"
                    " finished_at)"
                    " VALUES (:id, 'ann', 'r', '{}', '{}', 'done', :started, :finished)"
                ),
                {"id": run_id, "started": started, "finished": finished},
            )
            await connection.execute(
                text(
                    "INSERT INTO reprocess_items (run_id, consumer_name, failure_id, message_id, stage, attempt,"
                    " outcome)"
                    " VALUES (:id, :c, 't/0/7', 'm', 'published', 1, 'verified')"
                ),
                {"id": run_id, "c": CONSUMER},
            )
        for id_hash, expires, revoked in (("expired", 8, None), ("revoked", -1, 6), ("revoked-long-ago", -1, 9)):
            await connection.execute(
                text(
                    "INSERT INTO console_sessions (id_hash, operator, role, fingerprint, tokens_digest, expires_at,"
                    " revoked_at) VALUES (:h, 'ann', 'operator', 'f', 'd', :expires, :revoked)"
                ),
                {
                    "h": id_hash,
                    "expires": now - timedelta(days=expires),
                    "revoked": None if revoked is None else now - timedelta(days=revoked),
                },
            )
        for process_id, hours in (("gone-long-ago", 25), ("gone-lately", 23)):
            await connection.execute(
                text(
                    "INSERT INTO processes (process_id, role, consumer_name, host, pid, version, interval_seconds,"
                    " started_at, last_seen, facts) VALUES (:id, 'consume', :c, 'h', 1, 'v', 5, :at, :at, '{}')"
                ),
                {"id": process_id, "c": CONSUMER, "at": now - timedelta(hours=hours)},
            )


async def test_one_reconcile_pass_removes_exactly_what_is_past_its_period(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given records, audit rows, runs and sessions of every age, and the default retention periods
    await seed(engine)
    settings = settings_for(database_url, KAFKA, Topics("retention"))

    # When one reconcile pass runs
    finished = await cli(settings, "reconcile", "--json")

    # Then it reports what it removed
    summary = json.loads(finished.stdout)
    assert {name: summary[name] for name in summary if name.endswith(("_erased", "_purged")) and "box" not in name} == {
        "quarantine_payloads_erased": 2,
        "quarantine_purged": 2,
        "quarantine_events_purged": summary["quarantine_events_purged"],
        "audit_purged": 1,
        "runs_purged": 1,
        "console_sessions_purged": 2,
        "processes_purged": 1,
    }
    assert summary["quarantine_events_purged"] >= 4  # each purged record had at least its failure and its quarantine
    # And the records closed more than 90 days ago are gone with their notes and timelines; open ones stay whole
    kept = await rows(
        engine,
        "SELECT failure_id, payload IS NOT NULL AS has_payload, source_headers, erased_by FROM quarantine"
        " ORDER BY failure_id",
    )
    assert kept == [
        {
            "failure_id": "t/0/1",
            "has_payload": True,
            "source_headers": [["traceparent", "00-abc-01"]],
            "erased_by": None,
        },
        {
            "failure_id": "t/0/2",
            "has_payload": True,
            "source_headers": [["traceparent", "00-abc-01"]],
            "erased_by": None,
        },
        {
            "failure_id": "t/0/5",
            "has_payload": False,
            "source_headers": [["traceparent", ""]],
            "erased_by": "retention",
        },
        {
            "failure_id": "t/0/6",
            "has_payload": False,
            "source_headers": [["traceparent", ""]],
            "erased_by": "retention",
        },
        {
            "failure_id": "t/0/7",
            "has_payload": True,
            "source_headers": [["traceparent", "00-abc-01"]],
            "erased_by": None,
        },
    ]
    left = "SELECT DISTINCT failure_id FROM {} ORDER BY failure_id"
    expected = [{"failure_id": fid} for fid in ("t/0/1", "t/0/2", "t/0/5", "t/0/6", "t/0/7")]
    assert await rows(engine, left.format("quarantine_events")) == expected
    assert await rows(engine, left.format("quarantine_annotations")) == expected
    assert await rows(engine, "SELECT failure_id, actor FROM quarantine_events WHERE event = 'erased' ORDER BY 1") == [
        {"failure_id": "t/0/5", "actor": "retention"},
        {"failure_id": "t/0/6", "actor": "retention"},
    ]
    # And the audit, the runs and the sessions keep only what is within their periods
    assert await rows(engine, "SELECT count(*) AS n FROM audit_log WHERE at < now() - interval '400 days'") == [
        {"n": 0}
    ]
    assert await rows(engine, "SELECT count(*) AS n FROM audit_log") == [{"n": 1}]
    assert await rows(engine, "SELECT id FROM reprocess_runs ORDER BY id") == [{"id": "recent"}, {"id": "running"}]
    assert await rows(engine, "SELECT DISTINCT run_id FROM reprocess_items ORDER BY 1") == [
        {"run_id": "recent"},
        {"run_id": "running"},
    ]
    assert await rows(engine, "SELECT id_hash FROM console_sessions") == [{"id_hash": "revoked"}]
    assert await rows(engine, "SELECT process_id FROM processes") == [{"process_id": "gone-lately"}]
    # And no payload of an open record was touched
    assert await rows(engine, "SELECT payload FROM quarantine WHERE failure_id = 't/0/1'") == [
        {"payload": SECRET_PAYLOAD}
    ]


async def test_outside_a_purge_the_audit_tables_still_refuse_every_delete(engine: AsyncEngine) -> None:
    # Given an audit row
    async with engine.begin() as connection:
        await connection.execute(
            text("INSERT INTO audit_log (actor, action, selection, result) VALUES ('ann', 'x', '{}', '{}')")
        )
    # When anything but the retention purge deletes it, then the database refuses
    with pytest.raises(DBAPIError, match="audit_log is append-only"):
        async with engine.begin() as connection:
            await connection.execute(text("DELETE FROM audit_log"))


async def test_a_pass_purges_old_timeline_events_of_records_never_quarantined_and_the_edits_of_purged_records(
    engine: AsyncEngine, database_url: str
) -> None:
    # Given tier hand-offs of records that were never quarantined (one 100 days old, one of yesterday), and an
    # edit of a record closed 100 days ago
    await seed(engine)
    now = datetime.now(UTC)
    async with engine.begin() as connection:
        for failure_id, days in (("never/0/1", 100), ("never/0/2", 1)):
            await connection.execute(
                text(
                    "INSERT INTO quarantine_events (consumer_name, failure_id, at, event, error_code, attempts)"
                    " VALUES (:c, :fid, :at, 'failed', 'DOWNSTREAM_5XX', 1)"
                ),
                {"c": CONSUMER, "fid": failure_id, "at": now - timedelta(days=days)},
            )
        await connection.execute(
            text(
                "INSERT INTO quarantine_edits (consumer_name, failure_id, actor, state, payload_before, payload_after,"
                " headers_before, headers_after, diff, repeat_failures)"
                " VALUES (:c, 't/0/3', 'alice', 'sent', :p, :p, '[]', '[]', '', 0)"
            ),
            {"c": CONSUMER, "p": SECRET_PAYLOAD},
        )

    # When one reconcile pass runs
    finished = await cli(settings_for(database_url, KAFKA, Topics("retention")), "reconcile")
    assert finished.returncode == 0, finished.stderr

    # Then only yesterday's hand-off is left of the records never quarantined, and the purged record's edit is gone
    never = "SELECT failure_id FROM quarantine_events WHERE failure_id LIKE 'never/%' ORDER BY failure_id"
    assert [row["failure_id"] for row in await rows(engine, never)] == ["never/0/2"]
    assert await rows(engine, "SELECT failure_id FROM quarantine_edits") == []

"""A failure group (error code × owner) and a range of first-failed times as a bulk selection of the CLI's
quarantine resolve / annotate and reprocess, on real PostgreSQL."""

from __future__ import annotations

import json

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.config import Settings
from service.policy.records import SourceRecord
from tests.support import Topics, cli, quarantine_directly, rows, scalar, settings_for


async def _two_groups(engine: AsyncEngine, database_url: str, kafka: str, topics: Topics) -> Settings:
    """Three malformed records owned by team-a, first failed 3 h, 1 h and 1 min ago, and one of another code and
    owner."""
    settings = settings_for(database_url, kafka, topics, quarantine_owners="MALFORMED_PAYLOAD=team-a")
    records = [SourceRecord(topics.source, 0, n, 0, f"B-{n}".encode(), b"nope") for n in range(3)]
    records.append(SourceRecord(topics.source, 0, 3, 0, b"B-3", b'{"schema": "order.x.v1"}'))
    await quarantine_directly(settings, records)
    async with engine.begin() as connection:
        for offset, minutes in ((0, 180), (1, 60), (2, 1), (3, 1)):
            await connection.execute(
                text("UPDATE quarantine SET first_failed_at = now() - make_interval(mins => :m) WHERE failure_id = :f"),
                {"m": minutes, "f": f"{topics.source}/0/{offset}"},
            )
    return settings


async def test_a_failure_group_is_resolved_in_one_command_and_audited_as_a_group(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two failure groups in quarantine
    settings = await _two_groups(engine, database_url, kafka, topics)
    group = ["--error-code", "MALFORMED_PAYLOAD", "--owner", "team-a"]

    # When an operator resolves the malformed group of team-a, a dry run first
    dry = await cli(settings, "quarantine", "resolve", *group, "--reason", "producer fixed", "--dry-run")
    done = await cli(settings, "quarantine", "resolve", *group, "--reason", "producer fixed", "--yes", "--json")

    # Then the dry run named exactly the group, and the run resolved exactly it
    assert dry.stdout.startswith("quarantine resolve: 3 records selected: ")
    assert f"{topics.source}/0/3" not in dry.stdout
    assert sorted(json.loads(done.stdout)["resolved"]) == [f"{topics.source}/0/{n}" for n in range(3)]
    assert await rows(engine, "SELECT failure_id FROM quarantine WHERE status = 'open'") == [
        {"failure_id": f"{topics.source}/0/3"}
    ]
    # And the audit keeps the group it was asked for
    [entry] = await rows(engine, "SELECT selection FROM audit_log WHERE action = 'quarantine.resolve'")
    assert (entry["selection"]["error_code"], entry["selection"]["owner"]) == ("MALFORMED_PAYLOAD", "team-a")

    # And an owner with no open records selects nothing, exit 0 for a dry run
    none = await cli(settings, "quarantine", "resolve", "--owner", "nobody", "--reason", "x", "--dry-run")
    assert "no records selected" in none.stderr


async def test_a_range_of_first_failed_times_narrows_every_bulk_selection(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given malformed records first failed 3 h, 1 h and 1 min ago
    settings = await _two_groups(engine, database_url, kafka, topics)
    code = ["--error-code", "MALFORMED_PAYLOAD"]

    # When an operator selects by durations ago and by timestamps
    recent = await cli(settings, "quarantine", "annotate", *code, "--since", "2h", "--note", "n", "--dry-run")
    older = await cli(settings, "quarantine", "resolve", *code, "--until", "2h", "--reason", "r", "--dry-run")
    stamp = await scalar(engine, "SELECT to_char(now() - interval '90 minutes', 'YYYY-MM-DD\"T\"HH24:MI:SSOF')")
    window = await cli(
        settings, "quarantine", "annotate", *code, "--since", f"{stamp}:00", "--until", "30m", "--note", "n", "--yes"
    )
    rerun = await cli(settings, "reprocess", *code, "--since", "2h", "--until", "5m", "--reason", "r", "--dry-run")

    # Then each selects exactly the records first failed in its range
    assert recent.stdout.startswith("quarantine annotate: 2 records selected: ")
    assert f"{topics.source}/0/0" not in recent.stdout
    assert older.stdout.startswith(f"quarantine resolve: 1 records selected: {topics.source}/0/0")
    assert window.stdout == f"{topics.source}/0/1: note added\n"
    # (a malformed record does not decode: the dry run lists it as skipped, never as selected)
    assert [line for line in rerun.stdout.splitlines() if f"{topics.source}/" in line] == [
        f"  skipped (does not decode with today's schemas): {topics.source}/0/1"
    ]


async def test_a_range_that_ends_before_it_starts_or_a_bad_time_is_one_line_and_exit_2(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    settings = await _two_groups(engine, database_url, kafka, topics)
    for args in (
        ("quarantine", "resolve", "--since", "1h", "--until", "2h", "--reason", "r", "--yes"),
        ("quarantine", "annotate", "--since", "1h", "--until", "2h", "--note", "n", "--yes"),
        ("reprocess", "--since", "1h", "--until", "2h", "--reason", "r", "--yes"),
        ("reprocess", "--since", "yesterday", "--reason", "r", "--dry-run"),
        ("quarantine", "resolve", "--until", "2026-01-01T00:00:00", "--reason", "r", "--dry-run"),
    ):
        refused = await cli(settings, *args, check=False)
        assert refused.returncode == 2, (args, refused.stderr)
        assert "Traceback" not in refused.stderr
        assert "--since" in refused.stderr or "--until" in refused.stderr
    assert await scalar(engine, "SELECT count(*) FROM quarantine WHERE status = 'open'") == 4
    assert await scalar(engine, "SELECT count(*) FROM quarantine_annotations") == 0


async def test_effects_retry_selects_the_failed_effects_of_a_range_of_failure_times(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two failed captures, one failed 3 h ago and one 10 min ago
    settings = settings_for(database_url, kafka, topics)
    async with engine.begin() as connection:
        for key, minutes in (("K-1/payment.capture", 180), ("K-2/payment.capture", 10)):
            await connection.execute(
                text(
                    "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts, updated_at)"
                    " VALUES (:key, :aggregate, 'payment.capture', 'failed', '{}', 5,"
                    " now() - make_interval(mins => :m))"
                ),
                {"key": key, "aggregate": key.split("/")[0], "m": minutes},
            )

    # When an operator dry-runs a retry of what failed in the last hour, then of what failed before
    recent = await cli(settings, "effects", "retry", "--since", "1h", "--reason", "provider fixed", "--dry-run")
    older = await cli(settings, "effects", "retry", "--until", "1h", "--reason", "provider fixed", "--dry-run")
    backwards = await cli(
        settings, "effects", "retry", "--since", "1h", "--until", "2h", "--reason", "r", "--yes", check=False
    )

    # Then each names the one effect in its range, and a range ending before it starts is exit 2
    assert recent.stdout == "effects retry: 1 effects selected: K-2/payment.capture\n"
    assert older.stdout == "effects retry: 1 effects selected: K-1/payment.capture\n"
    assert backwards.returncode == 2
    assert "--until" in backwards.stderr
    assert await scalar(engine, "SELECT count(*) FROM effects WHERE state = 'failed'") == 2


async def test_a_ramp_with_a_sample_is_refused_as_exit_2(database_url: str, kafka: str, topics: Topics) -> None:
    settings = settings_for(database_url, kafka, topics)
    args = ("reprocess", "--error-code", "MALFORMED_PAYLOAD", "--ramp", "--sample", "2", "--reason", "r", "--yes")
    refused = await cli(settings, *args, check=False)
    assert refused.returncode == 2
    assert "--ramp" in refused.stderr
    assert "Traceback" not in refused.stderr

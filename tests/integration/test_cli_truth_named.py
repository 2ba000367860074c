"""A dry run on named ids says what the real run would do: an id that names nothing is named, exit 1 (contract §10)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.policy.records import SourceRecord
from tests.support import Topics, cli, quarantine_directly, rows, settings_for


async def _failed_effect(engine: AsyncEngine, key: str) -> None:
    async with engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO effects (idempotency_key, aggregate_id, kind, state, payload, attempts)"
                " VALUES (:key, split_part(:key, '/', 1), 'payment.capture', 'failed', '{}', 1)"
            ),
            {"key": key},
        )


async def _effect_states(engine: AsyncEngine) -> list[dict[str, object]]:
    return await rows(engine, "SELECT idempotency_key, state, attempts FROM effects ORDER BY idempotency_key")


async def _quarantine_states(engine: AsyncEngine) -> list[dict[str, object]]:
    return await rows(engine, "SELECT failure_id, status FROM quarantine ORDER BY failure_id")


async def test_retrying_an_unknown_effect_names_it_and_exits_1_dry_run_or_not_while_a_known_ones_dry_run_exits_0(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given one failed effect
    await _failed_effect(engine, "TN-2/payment.capture")
    settings = settings_for(database_url, kafka, topics)

    # When an operator dry-runs its retry, then dry-runs and runs a retry of a key that names no effect
    known = await cli(settings, "effects", "retry", "TN-2/payment.capture", "--reason", "r", "--dry-run", check=False)
    after_dry_run = await _effect_states(engine), await rows(engine, "SELECT action FROM audit_log")
    unknown = [
        await cli(settings, "effects", "retry", "NOPE/x", "--reason", "r", *dry_run, check=False)
        for dry_run in (("--dry-run",), ())
    ]

    # Then the known one is counted and nothing changed (no row, no audit)
    assert known.returncode == 0, known.stdout + known.stderr
    assert "effects retry: 1 effects selected: TN-2/payment.capture" in known.stdout
    assert after_dry_run == ([{"idempotency_key": "TN-2/payment.capture", "state": "failed", "attempts": 1}], [])
    # And the unknown key is named and the command fails, dry run or not
    for done in unknown:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "no effect with idempotency key NOPE/x" in done.stderr
        assert "selected: NOPE/x" not in done.stdout


async def test_retrying_a_known_and_an_unknown_effect_reads_the_same_in_the_dry_run_and_the_real_run(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given one failed effect
    await _failed_effect(engine, "TN-1/payment.capture")
    settings = settings_for(database_url, kafka, topics)
    retry = ("effects", "retry", "TN-1/payment.capture", "NOPE/x", "--reason", "r")

    # When an operator dry-runs a retry of it and of a key that names nothing, then runs it
    dry = await cli(settings, *retry, "--dry-run", check=False)
    after_dry_run = await _effect_states(engine)
    real = await cli(settings, *retry, "--yes", check=False)

    # Then both fail naming the unknown key; the dry run counts only the known one and changes nothing
    assert (dry.returncode, real.returncode) == (1, 1)
    assert "no effect with idempotency key NOPE/x" in dry.stderr
    assert "no effect with idempotency key NOPE/x" in real.stderr
    assert "effects retry: 1 effects selected: TN-1/payment.capture" in dry.stdout
    assert after_dry_run == [{"idempotency_key": "TN-1/payment.capture", "state": "failed", "attempts": 1}]
    assert "TN-1/payment.capture: pending" in real.stdout


async def test_resolving_an_unknown_failure_id_names_it_and_exits_1_dry_run_or_not_while_a_known_ones_dry_run_exits_0(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given one quarantined record
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, [SourceRecord(topics.source, 0, 0, 0, b"TQ-2", b"nope")])
    record = f"{topics.source}/0/0"

    # When an operator dry-runs resolving it, then dry-runs and runs resolving a failure id that no record has
    known = await cli(settings, "quarantine", "resolve", record, "--reason", "r", "--dry-run", check=False)
    after_dry_run = await _quarantine_states(engine), await rows(engine, "SELECT action FROM audit_log")
    unknown = [
        await cli(settings, "quarantine", "resolve", "nope/1/2", "--reason", "r", *dry_run, check=False)
        for dry_run in (("--dry-run",), ())
    ]

    # Then the known one is counted and nothing changed (no row, no audit)
    assert known.returncode == 0, known.stdout + known.stderr
    assert f"quarantine resolve: 1 records selected: {record}" in known.stdout
    assert after_dry_run == ([{"failure_id": record, "status": "open"}], [])
    # And the unknown id is named and the command fails, dry run or not
    for done in unknown:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "no quarantined record with failure id nope/1/2" in done.stderr
        assert "selected: nope/1/2" not in done.stdout


async def test_resolving_a_known_and_an_unknown_failure_id_reads_the_same_in_the_dry_run_and_the_real_run(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given one quarantined record
    settings = settings_for(database_url, kafka, topics)
    await quarantine_directly(settings, [SourceRecord(topics.source, 0, 0, 0, b"TQ-1", b"nope")])
    known = f"{topics.source}/0/0"
    resolve = ("quarantine", "resolve", known, "nope/1/2", "--reason", "r")

    # When an operator dry-runs resolving it and a failure id that no record has, then runs it
    dry = await cli(settings, *resolve, "--dry-run", check=False)
    after_dry_run = await _quarantine_states(engine)
    real = await cli(settings, *resolve, "--yes", check=False)

    # Then both fail naming the unknown id; the dry run counts only the known one and changes nothing
    assert (dry.returncode, real.returncode) == (1, 1)
    assert "no quarantined record with failure id nope/1/2" in dry.stderr
    assert "no quarantined record with failure id nope/1/2" in real.stderr
    assert f"quarantine resolve: 1 records selected: {known}" in dry.stdout
    assert after_dry_run == [{"failure_id": known, "status": "open"}]
    assert f"{known}: resolved" in real.stdout


async def test_annotating_an_unknown_failure_id_names_it_and_exits_1_dry_run_or_not(
    database_url: str, kafka: str, topics: Topics
) -> None:
    # When an operator dry-runs, then runs, a note on a failure id that no record has
    settings = settings_for(database_url, kafka, topics)
    runs = [
        await cli(settings, "quarantine", "annotate", "nope/1/2", "--note", "n", *dry_run, check=False)
        for dry_run in (("--dry-run",), ())
    ]

    # Then the id is named and the command fails, dry run or not
    for done in runs:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "no quarantined record with failure id nope/1/2" in done.stderr

"""Operator actions act on what the operator saw (issue 43): a reprocess run sends a record only if it is, in the
transaction that sends it, as it was when selected; a record resolved while the run goes on, or while its prompt
waits after the sample, is skipped, says so, and is never sent.

Real PostgreSQL and Kafka; the consumer and relay run in this process, the CLI as a process (under a terminal
where it asks). Records are quarantined with the consumer's own statement, with no downstream to fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pty
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from service import operations
from service.config import Settings
from tests.support import (
    ROOT,
    Topics,
    cli,
    env_for,
    eventually,
    quarantine_as,
    rows,
    running,
    scalar,
    settings_for,
)
from tests.support.orders import quarantined_placement

CODE = "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"


async def _two_quarantined(engine: AsyncEngine, settings: Settings, topics: Topics) -> tuple[str, str]:
    """Two placements quarantined by the consumer, the first failed first; their failure ids."""
    first, second = f"{topics.source}/0/0", f"{topics.source}/0/1"
    earlier = datetime.now(UTC) - timedelta(minutes=5)
    await quarantine_as(
        engine,
        settings.consumer_name,
        [
            quarantined_placement(first, "R-1", earlier),
            quarantined_placement(second, "R-2", earlier + timedelta(seconds=1)),
        ],
    )
    return first, second


async def _resolve(engine: AsyncEngine, settings: Settings, failure_id: str) -> None:
    """What `quarantine resolve ID --reason 'do not process'` does, in this process (it must land in a window)."""
    async with engine.begin() as connection:
        wanted = operations.Wanted((failure_id,), consumer=settings.consumer_name)
        picked = await wanted.pick(connection)
        await operations.resolve(connection, wanted, picked, "eve", "do not process")


async def _sent_back(engine: AsyncEngine, topics: Topics) -> list[str]:
    """The failure ids of the copies written for the reprocess topic."""
    found = await rows(
        engine,
        "SELECT h ->> 1 AS failure_id FROM outbox, jsonb_array_elements(headers) AS h"
        " WHERE topic = :topic AND h ->> 0 = 'failure-id' ORDER BY 1",
        topic=topics.reprocess,
    )
    return [row["failure_id"] for row in found]


def _order_of(failure_id: str) -> str:
    """The order id `_two_quarantined` gave the record at this failure id."""
    return f"R-{int(failure_id.rsplit('/', 1)[1]) + 1}"


async def _skipped_alone(engine: AsyncEngine, kept: str, skipped: str) -> None:
    """The run sent `kept` and applied it; `skipped` was not sent, has no order, and stays resolved."""
    items = {item["failure_id"]: item for item in await rows(engine, "SELECT * FROM reprocess_items")}
    assert {one: item["outcome"] for one, item in items.items()} == {kept: "reprocessed", skipped: "skipped"}
    assert items[skipped]["published_at"] is None
    assert items[skipped]["detail"] == "not sent: resolved now, open when selected"
    assert await rows(engine, "SELECT order_id FROM orders") == [{"order_id": _order_of(kept)}]
    assert await rows(engine, "SELECT status, resolution FROM quarantine WHERE failure_id = :id", id=skipped) == [
        {"status": "resolved", "resolution": "do not process"}
    ]
    statuses = {row["message_id"]: row["status"] for row in await rows(engine, "SELECT * FROM inbox")}
    assert statuses == {f"{_order_of(kept)}.1/placed": "processed", f"{_order_of(skipped)}.1/placed": "quarantined"}


async def test_a_record_resolved_while_a_rate_limited_run_goes_on_is_skipped_and_never_sent(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two quarantined placements and a consumer and relay running
    settings = settings_for(database_url, kafka, topics)
    first, second = await _two_quarantined(engine, settings, topics)
    async with running(settings, "consumer_loop", "relay"):
        # When a run sends them back at one record every five seconds, and the second is resolved once the first
        # is sent
        run = asyncio.create_task(
            cli(settings, "reprocess", "--error-code", CODE, "--rate", "0.2", "--reason", "fixed", "--yes", "--json")
        )
        await eventually(lambda: scalar(engine, "SELECT count(*) = 1 FROM reprocess_items"), timeout=60)
        await _resolve(engine, settings, second)
        report = json.loads((await run).stdout)

    # Then the second was never sent: no copy of it, no order; its row stays resolved, and the run says it skipped it
    assert await _sent_back(engine, topics) == [first]
    await _skipped_alone(engine, first, second)
    assert (report["published"], report["reprocessed"], report["skipped"]) == (1, 1, 1)
    [run_row] = await rows(engine, "SELECT outcome, counts FROM reprocess_runs")
    assert (run_row["outcome"], run_row["counts"]["skipped"]) == ("completed", 1)
    shown = json.loads((await cli(settings, "reprocess", "show", report["run_id"], "--json")).stdout)
    assert {item["failure_id"]: item["outcome"] for item in shown["items"]} == {first: "reprocessed", second: "skipped"}


@contextlib.asynccontextmanager
async def _at_a_terminal(settings: Settings, *args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """The CLI as a process whose standard input is a terminal (so that it asks), and the terminal's other end."""
    main, secondary = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "service",
        *args,
        cwd=ROOT,
        env=env_for(settings),
        stdin=secondary,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(secondary)
    try:
        yield process, main
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        os.close(main)


async def _asked(process: asyncio.subprocess.Process, question: str, *, timeout: float = 60.0) -> str:
    """What the process wrote on stderr up to and including `question` (a prompt ends without a newline)."""
    assert process.stderr is not None
    said = b""
    async with asyncio.timeout(timeout):
        while question.encode() not in said:
            chunk = await process.stderr.read(4096)
            assert chunk, f"the process ended without asking: {said.decode(errors='replace')}"
            said += chunk
    return said.decode()


async def test_a_record_resolved_while_the_prompt_after_the_sample_waits_is_not_sent_with_the_rest(
    engine: AsyncEngine, database_url: str, kafka: str, topics: Topics
) -> None:
    # Given two quarantined placements, one of which the deterministic sample of one takes
    settings = settings_for(database_url, kafka, topics)
    ids = await _two_quarantined(engine, settings, topics)
    sample, rest = sorted(ids, key=lambda one: hashlib.sha256(one.encode()).hexdigest())
    async with running(settings, "consumer_loop", "relay"):
        # When the operator runs a sample first, at a terminal, and the rest is resolved while the question waits
        command = ("reprocess", "--error-code", CODE, "--sample", "1", "--reason", "fixed", "--json")
        async with _at_a_terminal(settings, *command) as (process, terminal):
            said = await _asked(process, "Reprocess the remaining 1?")
            await _resolve(engine, settings, rest)
            os.write(terminal, b"y\n")
            out, err = await asyncio.wait_for(process.communicate(), timeout=120)

    # Then the sample was asked about, and the rest it counted then was not sent: it changed since
    assert "sample of 1: 1 reprocessed" in said
    assert process.returncode == 0, said + err.decode()
    report = json.loads(out)
    assert (report["published"], report["reprocessed"], report["skipped"]) == (1, 1, 1)
    assert await _sent_back(engine, topics) == [sample]
    await _skipped_alone(engine, sample, rest)

"""The round's look-up (service/store/lookups.py): what it finds, per consumer, and what it skips when there is
nothing to find."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.store import ROWS
from service.store import lookups

ME, OTHER = "orders-a", "orders-b"


async def _seed(engine: AsyncEngine, consumer: str) -> None:
    """A record in a retry tier (key k-1), a key held by a quarantined head (k-2) and a parked record (k-3)."""
    async with engine.begin() as connection:
        await connection.execute(
            text(
                """
                INSERT INTO retries (consumer_name, message_id, ordering_key, failure_id, attempts, tier_step,
                                     first_failed_at, last_failed_at, due_at, error_code)
                VALUES (:c, 'm-1', 'k-1', 'f-1', 1, 2, now(), now(), now(), 'DOWNSTREAM_TIMEOUT')
                """
            ),
            {"c": consumer},
        )
        await connection.execute(
            text(
                "INSERT INTO key_blocks (consumer_name, ordering_key, failure_id, reason) VALUES (:c, 'k-2', 'f', 'x')"
            ),
            {"c": consumer},
        )
        await connection.execute(
            text(
                """
                INSERT INTO parked (consumer_name, ordering_key, message_id, source_topic, source_partition,
                                    source_offset, timestamp_ms)
                VALUES (:c, 'k-3', 'm-3', 'orders', 0, 7, 0)
                """
            ),
            {"c": consumer},
        )


async def _known(engine: AsyncEngine, consumer: str) -> lookups.Known:
    async with engine.connect() as connection:
        return await lookups.known(
            connection, consumer, ROWS.lookup, ["m-1", "m-3", "m-9"], keys=["k-1", "k-2", "k-3", "k-9"]
        )


async def test_a_consumer_finds_its_own_retry_steps_blocked_keys_and_parked_records(engine: AsyncEngine) -> None:
    # Given: one consumer's record in a retry tier, held key and parked record
    await _seed(engine, ME)

    # When: that consumer looks its round up, and another consumer of the same tables does
    mine, theirs = await _known(engine, ME), await _known(engine, OTHER)

    # Then: the first finds each of them, the second none
    assert mine.steps == {"m-1": 2}
    assert mine.heads == {"k-1": "m-1"}
    assert mine.blocked == {"k-2"}
    assert (mine.parked, mine.parked_ids) == ({"k-3"}, {"m-3"})
    assert theirs == lookups.Known()


@pytest.mark.parametrize(("owner", "runs"), [(OTHER, False), (ME, True)], ids=["another's rows", "its own rows"])
async def test_the_searches_by_id_list_run_only_while_the_consumer_has_such_rows(
    owner: str, runs: bool, engine: AsyncEngine
) -> None:
    # Given: a retry, a held key and a parked record of `owner`, and a round of 2,000 ids
    await _seed(engine, owner)
    ids = orjson.dumps([f"m-{n}" for n in range(2000)]).decode()
    keys = orjson.dumps([f"k-{n}" for n in range(2000)]).decode()

    # When: this consumer's look-up runs under EXPLAIN ANALYZE
    async with engine.connect() as connection:
        statement = text(f"EXPLAIN (ANALYZE, FORMAT JSON) {ROWS.lookup.text}")
        parameters = {"consumer": ME, "ids": ids, "keys": keys, "aggregates": keys}
        (plan,) = (await connection.execute(statement, parameters)).scalar_one()

    # Then: the scans that search a table with an `= ANY` list ran only if the consumer has rows there (an index
    # scan sorts its whole list before it reads a page, empty table or not)
    searches = [node for node in _nodes(plan["Plan"]) if "ANY" in json.dumps(node.get("Index Cond", ""))]
    searches += [node for node in _nodes(plan["Plan"]) if "ANY" in json.dumps(node.get("Filter", ""))]
    assert searches, "the look-up no longer searches by id list: this test checks nothing"
    ran = [(node["Node Type"], node.get("Relation Name"), node["Actual Loops"]) for node in searches]
    assert all((loops > 0) is runs for _, _, loops in ran), ran


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)

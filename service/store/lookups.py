"""What a round must know before it decides, read by ONE statement over every table it consults.

A round of a few thousand records asks the inbox (terminal already?), the retry table (in a tier, at which
step?), under key ordering the retry heads, key blocks and parked records of its keys, and which of its aggregates
exist (what the handler looks up before applying, which aggregates the write locks). One statement is one round trip
and one encoding of each id array.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.store.recordset import recordset


@dataclass
class Known:
    """The database's answer for one round."""

    seen: dict[str, str] = field(default_factory=dict)  # message id -> inbox status
    steps: dict[str, int] = field(default_factory=dict)  # message id -> its step in the retry tiers
    aggregates: set[str] = field(default_factory=set)  # aggregates that exist
    heads: dict[str, str] = field(default_factory=dict)  # key -> the message id of its record in a retry tier
    head_ids: set[str] = field(default_factory=set)  # every record in a retry tier that holds its key
    blocked: set[str] = field(default_factory=set)  # keys held by a quarantined head
    parked: set[str] = field(default_factory=set)  # keys with parked records
    parked_ids: set[str] = field(default_factory=set)  # message ids parked already (a redelivery parks nothing)


# The inbox and the aggregates are probed by primary key once per id (`OFFSET 0` keeps each probe a subquery the
# planner cannot turn into a join): with `= ANY(:ids)` the planner scans the whole table once it is large. The id
# lists travel as JSON arrays, one orjson call each; where a table is searched by its index with `= ANY`,
# `ARRAY(SELECT ...)` turns the JSON into an array once per statement. An index scan sorts its `= ANY` array
# before it reads a page, empty table or not, so each such part first asks whether the consumer has a row in that
# table at all (`_ANY_ROW`, a one-time filter): most rounds meet no retry, block or parked record. (Figures:
# docs/performance.md, "Why the hot path is shaped this way".)
_ANY_ROW = "AND EXISTS (SELECT FROM {table} WHERE consumer_name = :consumer)"
_LOOKUP = f"""
    SELECT 'seen' AS kind, m.id AS name, s.status AS value FROM json_array_elements_text(CAST(:ids AS json)) AS m(id)
     CROSS JOIN LATERAL (SELECT status FROM inbox WHERE consumer_name = :consumer AND message_id = m.id OFFSET 0) s
    UNION ALL
    SELECT 'step', message_id, CAST(tier_step AS text) FROM retries
     WHERE consumer_name = :consumer AND message_id = ANY(ARRAY(SELECT json_array_elements_text(CAST(:ids AS json))))
       {_ANY_ROW.format(table="retries")}
    UNION ALL
    SELECT 'aggregate', m.id, NULL FROM json_array_elements_text(CAST(:aggregates AS json)) AS m(id)
     WHERE EXISTS ({{exists}} OFFSET 0)
    UNION ALL
    SELECT 'head', ordering_key, message_id FROM retries
     WHERE consumer_name = :consumer AND ordering_key = ANY(ARRAY(SELECT json_array_elements_text(CAST(:keys AS json))))
       {_ANY_ROW.format(table="retries")}
    UNION ALL
    SELECT 'blocked', ordering_key, NULL FROM key_blocks
     WHERE consumer_name = :consumer AND ordering_key = ANY(ARRAY(SELECT json_array_elements_text(CAST(:keys AS json))))
       {_ANY_ROW.format(table="key_blocks")}
    UNION ALL
    SELECT 'parked_id', message_id, NULL FROM parked
     WHERE consumer_name = :consumer AND ordering_key = ANY(ARRAY(SELECT json_array_elements_text(CAST(:keys AS json))))
       AND message_id = ANY(ARRAY(SELECT json_array_elements_text(CAST(:ids AS json))))
       {_ANY_ROW.format(table="parked")}
    UNION ALL
    SELECT DISTINCT 'parked', ordering_key, NULL FROM parked
     WHERE consumer_name = :consumer AND ordering_key = ANY(ARRAY(SELECT json_array_elements_text(CAST(:keys AS json))))
       {_ANY_ROW.format(table="parked")}
    """


def statement(exists: str) -> TextClause:
    """The round's look-up, with `exists`: the domain's probe for one aggregate id `m.id` (AggregateRows)."""
    return text(_LOOKUP.format(exists=exists))


async def known(
    connection: AsyncConnection,
    consumer: str,
    lookup: TextClause,
    message_ids: Collection[str],
    *,
    aggregates: Collection[str] = (),
    keys: Collection[str] = (),
) -> Known:
    """Look up these message ids, and the aggregates and keys asked for (none when empty), with `statement()`."""
    answer = Known()
    if not message_ids:
        return answer
    result = await connection.execute(
        lookup,
        {
            "consumer": consumer,
            "ids": recordset(list(message_ids)),
            "aggregates": recordset(list(aggregates)),
            "keys": recordset(list(keys)),
        },
    )
    for kind, name, value in result:
        if kind == "seen":
            answer.seen[name] = value
        elif kind == "step":
            answer.steps[name] = int(value)
        elif kind == "aggregate":
            answer.aggregates.add(name)
        elif kind == "head":
            answer.heads[name] = value
            answer.head_ids.add(value)
        elif kind == "blocked":
            answer.blocked.add(name)
        elif kind == "parked_id":
            answer.parked_ids.add(name)
        else:
            answer.parked.add(name)
    return answer

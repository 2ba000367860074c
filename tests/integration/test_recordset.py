"""Rows travel to PostgreSQL as one JSON document of arrays and come back as typed columns, values intact."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.policy.records import EARLIEST_MS, LATEST_MS, time_of
from service.store import inbox, outbox
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.recordset import Columns
from service.store.uow import UnitOfWork

COLUMNS = Columns(
    ("name", "text"),
    ("count", "int"),
    ("big", "bigint"),
    ("document", "jsonb"),
    ("raw", "bytea"),
    ("at", "timestamptz"),
)


@dataclass
class _Row:
    name: str | None
    count: int | None
    big: int | None
    document: Any
    raw: bytes | None
    at: datetime | None


async def test_every_column_type_comes_back_as_it_was_sent_and_nulls_as_sql_nulls(engine: AsyncEngine) -> None:
    # Given a row with awkward values and a row of nulls (a JSON null in a jsonb column included)
    moment = datetime(2026, 11, 30, 12, 34, 56, 789000, tzinfo=UTC)
    awkward = _Row('qu"ote \\ back ✓', 2**31 - 1, 2**62, {"a": [1, None, "x"]}, b"\x00\xff not utf-8", moment)
    nulls = _Row(None, None, None, None, None, None)

    # When they go through one document and are read back by position
    async with engine.connect() as connection:
        result = await connection.execute(
            text(f"SELECT *, document IS NULL FROM ({COLUMNS.select('rows')}) AS v"),
            {"rows": COLUMNS.encode([awkward, nulls])},
        )
        back = [tuple(row) for row in result]

    # Then each value has its SQL type and value, and every null is SQL NULL
    assert back == [
        ('qu"ote \\ back ✓', 2**31 - 1, 2**62, {"a": [1, None, "x"]}, b"\x00\xff not utf-8", moment, False),
        (None, None, None, None, None, None, True),
    ]


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(documents=st.lists(st.dictionaries(st.text(max_size=8), _JSON_VALUES, max_size=5), min_size=1, max_size=10))
async def test_a_json_message_is_stored_as_the_exact_bytes_of_its_document_beside_raw_bytes(
    documents: list[dict[str, Any]], engine: AsyncEngine
) -> None:
    # Given messages of generated JSON documents (any text: quotes, backslashes, NUL, other scripts) and, among
    # them, a copy's raw bytes (Hypothesis prints the documents on failure)
    messages = [OutboxMessage.json("t", "K", {"n": str(n)}, document) for n, document in enumerate(documents)]
    messages.insert(len(messages) // 2, OutboxMessage("t", "K", {}, b"\x00\xff not utf-8"))

    # When they are added in one statement (and rolled back: nothing is kept)
    async with UnitOfWork(engine) as uow:
        ids = await outbox.add(uow.connection, messages)
        result = await uow.connection.execute(
            text("SELECT payload FROM outbox WHERE id = ANY(:ids) ORDER BY id"), {"ids": ids}
        )
        stored = [row.payload for row in result]

    # Then each document's payload is exactly the bytes orjson wrote for it, the raw bytes are intact, and each
    # message's `value` (what the bench's raw producer sends) is what was stored
    expected = [orjson.dumps(document) for document in documents]
    expected.insert(len(documents) // 2, b"\x00\xff not utf-8")
    assert stored == expected
    assert [message.value for message in messages] == stored


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stamps=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=20, unique=True))
async def test_an_inbox_row_keeps_its_record_timestamp_to_the_millisecond(
    stamps: list[int], engine: AsyncEngine
) -> None:
    # Given inbox rows whose records carry any int64 timestamp (milliseconds; Hypothesis prints them on failure)
    rows = [InboxRow(f"m-{stamp}", "processed", "t", 0, n, None, None, stamp) for n, stamp in enumerate(stamps)]

    # When the round's insert writes them (rolled back: nothing is kept)
    async with UnitOfWork(engine) as uow:
        await uow.connection.execute(text(inbox.ADD_ROWS), {"consumer": "c", "inbox_rows": inbox.COLUMNS.encode(rows)})
        result = await uow.connection.execute(
            text("SELECT message_id, received_at FROM inbox WHERE consumer_name = 'c'")
        )
        stored = dict(tuple(row) for row in result)

    # Then each `received_at` is its timestamp exactly, with nothing below the millisecond, or the nearest moment
    # a datetime holds: the same as the envelope's (`time_of`)
    assert stored == {f"m-{stamp}": time_of(stamp) for stamp in stamps}
    inside = [stamp for stamp in stamps if EARLIEST_MS <= stamp <= LATEST_MS]
    assert all(
        stored[f"m-{stamp}"] == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=stamp) for stamp in inside
    )

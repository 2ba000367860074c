"""Rows travel to PostgreSQL as one JSON document of arrays and come back as typed columns, values intact."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from service.store.recordset import Columns

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

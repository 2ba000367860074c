"""A batch of rows as ONE statement parameter: a JSON array that SQL turns back into rows.

Hot-path inserts take a whole round in one statement. Passing one array parameter per column (`unnest`) makes
the driver inspect every element of every array in Python; one JSON document, serialised by orjson in a single
call and read by PostgreSQL's `json_to_recordset(CAST(:rows AS json)) AS v(<column> <type>, ...)`, costs a
fraction of that and keeps the statement text (and its prepared plan) the same for any batch size.

Which of the two functions reads the document is the SQL's choice, by the columns: a row with a `jsonb` column
(an order's details, an effect's payload, an outbox message's headers) is read faster by `jsonb_to_recordset`
(the document is parsed into jsonb once, and each nested value is taken from it as is: 2-3 times faster for
such rows), a flat row (the inbox) by `json_to_recordset`.

Rows are dataclasses (their field names are the recordset's column names) or dicts. `bytes` travel as
PostgreSQL's hex form (`\\x…`), which a `bytea` column reads as is; datetimes as RFC 3339 text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson


def recordset(rows: Sequence[Any]) -> str:
    """The rows as one JSON array for `json_to_recordset` (or values, for `json_array_elements_text`)."""
    return orjson.dumps(rows, default=_bytes_as_hex).decode()


def _bytes_as_hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    raise TypeError(f"{type(value).__name__} cannot go into a recordset")

"""A batch of rows as ONE statement parameter: a JSON array that SQL turns back into rows.

Hot-path inserts take a whole round in one statement. One JSON document, serialised by orjson in one call,
costs the driver a fraction of one array parameter per column, and keeps the statement text (and its
prepared plan) the same for any batch size.

Each row travels as a JSON array of its values in the order of its `Columns`, and SQL reads the document as
`jsonb` once and takes each value by position (`e->>0`, `CAST(e->>3 AS int)`, `e->2` for a `jsonb` column):
no key names per row, and no key matching. `bytes` travel as base64 (`decode(…, 'base64')`), datetimes as RFC
3339 text. The measurements behind each choice: docs/performance.md, "Why the hot path is shaped this way".
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import orjson


class Columns:
    """The columns of one kind of row: attribute names and SQL types, in the order each row's values travel."""

    def __init__(self, *columns: tuple[str, str]) -> None:
        assert len(columns) > 1, "attrgetter returns a bare value for one name"
        self._columns = columns
        self._values = attrgetter(*(name for name, _ in columns))

    def encode(self, rows: Sequence[Any]) -> str:
        """The rows (objects with these attributes) as one JSON array of arrays."""
        return orjson.dumps(list(map(self._values, rows)), default=_bytes_as_base64).decode()

    def select(self, parameter: str) -> str:
        """SQL for the rows of the `:parameter` document, one column per name, typed."""
        values = ", ".join(_read(position, name, kind) for position, (name, kind) in enumerate(self._columns))
        return f"SELECT {values} FROM jsonb_array_elements(CAST(:{parameter} AS jsonb)) AS e"


def recordset(values: Sequence[str]) -> str:
    """Plain values (ids) as one JSON array, for `json_array_elements_text`."""
    return orjson.dumps(values).decode()


def _read(position: int, name: str, kind: str) -> str:
    if kind == "jsonb":
        return f"NULLIF(e->{position}, 'null') AS {name}"  # a JSON null is SQL NULL, as for the other types
    if kind == "text":
        return f"e->>{position} AS {name}"
    if kind == "bytea":
        return f"decode(e->>{position}, 'base64') AS {name}"
    return f"CAST(e->>{position} AS {kind}) AS {name}"


def _bytes_as_base64(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()
    raise TypeError(f"{type(value).__name__} cannot go into a recordset")

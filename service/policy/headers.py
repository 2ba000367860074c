"""Kafka headers as JSON that a `jsonb` column can hold, byte-exact.

`jsonb` cannot hold NUL, and JSON strings cannot hold bytes that are not UTF-8, so a header is stored as
`[name, value]` when both are such text, else with the parts that are not in base64 and a third element naming
them (`"value"`, `"name"` or `"name,value"`). Rows written before (`[[name, text]]` lists, `{name: text}`
objects) read back as the text they hold.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from service.policy.records import text_of

Headers = tuple[tuple[str, bytes], ...]


def to_json(headers: Iterable[tuple[str, bytes]]) -> list[list[str]]:
    """Headers as a JSON list that reads back to the same names and bytes."""
    stored: list[list[str]] = []
    for name, value in headers:
        encoded = []
        if "\x00" in name:
            name = base64.b64encode(name.encode("utf-8", "surrogateescape")).decode("ascii")
            encoded.append("name")
        text = text_of(value)
        if text is None:
            text = base64.b64encode(value).decode("ascii")
            encoded.append("value")
        stored.append([name, text, ",".join(encoded)] if encoded else [name, text])
    return stored


def from_json(stored: Any) -> Headers:
    """The headers `to_json` stored (or an older row's text headers)."""
    if isinstance(stored, dict):
        return tuple((str(name), str(value).encode()) for name, value in stored.items())
    headers = []
    for entry in stored or ():
        name, text = str(entry[0]), str(entry[1])
        encoded = set(str(entry[2]).split(",")) if len(entry) > 2 else set()
        if "name" in encoded:
            name = base64.b64decode(name).decode("utf-8", "surrogateescape")
        headers.append((name, base64.b64decode(text) if "value" in encoded else text.encode()))
    return tuple(headers)

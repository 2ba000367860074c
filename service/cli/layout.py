"""How a command lays out what it prints for a person: tables that never cut an id, `show` as labelled sections.

Every value from a record passes through `service.inert.shown` first, so a control character, a bidi override or
an escape sequence is printed as its escape, never acted on by the terminal.
"""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Column, Table

from service import inert
from service.moments import epoch_millis, utc

_BORDERS = 3  # a column's padding on both sides and its rule


def tables() -> Console:
    """A console for tables of record content (keys, ids): shown as they are, never read as Rich markup."""
    return Console(markup=False, highlight=False)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    prose: Collection[int] = (),
    console: Console | None = None,
) -> None:
    """Rows as a table when it fits the terminal with every id and code whole on one line (free-text columns,
    `prose`, wrap at word boundaries); else each row as a block of `name  value` lines, which never cuts a value."""
    console = console or tables()
    cells = [[inert.shown(value) for value in row] for row in rows]
    if _narrowest(headers, cells, prose) <= console.width:
        table = Table(
            *(
                Column(header, overflow="fold") if index in prose else Column(header, no_wrap=True)
                for index, header in enumerate(headers)
            )
        )
        for row in cells:
            table.add_row(*row)
        console.print(table)
        return
    width = max(cell_len(header) for header in headers)
    for number, row in enumerate(cells):
        if number:
            console.out("")
        for header, value in zip(headers, row, strict=True):
            console.out(f"{header:<{width}}  {value}")


def _narrowest(headers: Sequence[str], cells: Sequence[Sequence[str]], prose: Collection[int]) -> int:
    """How wide a table of these cells must be for no id, code or word to be cut."""
    total = 1
    for index, header in enumerate(headers):
        column = [row[index] for row in cells]
        if index in prose:
            words = [cell_len(word) for value in [header, *column] for word in value.split()]
            total += max(words, default=1)
        else:
            total += max(cell_len(value) for value in [header, *column])
        total += _BORDERS - 1
    return total


def print_tsv(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Rows as tab-separated values with a header line: each cell escaped by `service.inert.escaped` (a tab, a
    newline, a backslash and every invisible character as its backslash escape; `service.inert.unescaped` decodes
    it)."""
    for row in (headers, *rows):
        sys.stdout.write("\t".join(inert.escaped(value) for value in row) + "\n")


def section(console: Console, title: str, lines: Iterable[str]) -> None:
    """A labelled section of a `show` command: its title, then its lines indented (none: `-`)."""
    console.out(title)
    printed = False
    for line in lines:
        console.out(f"  {line}")
        printed = True
    if not printed:
        console.out("  -")


def facts(pairs: Iterable[tuple[str, Any]]) -> list[str]:
    """`name  value` lines, the names aligned: a timestamp in UTC with `Z`, nothing as `-`, content escaped."""
    shown = [(name, value_of(value)) for name, value in pairs]
    width = max((len(name) for name, _ in shown), default=0)
    return [f"{name:<{width}}  {value}" for name, value in shown]


def value_of(value: Any) -> str:
    """One value as a `show` command prints it."""
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return utc(value)
    if isinstance(value, bytes | memoryview):
        return f"({len(bytes(value))} bytes)"
    return inert.shown(value)


def document(value: Any) -> list[str]:
    """A JSON document (an envelope, a payload) indented, inert (`service.inert.json_text`), as lines."""
    if value is None:
        return []
    return inert.json_text(value, indent=2, sort_keys=True, default=str).splitlines()


def headers(stored: Any) -> list[str]:
    """Source headers (as `service.policy.headers.to_json` stores them) as `name  value` lines: a part stored as
    base64 says so, and a value holding epoch milliseconds is also shown as its UTC time."""
    pairs: list[Any] = list(stored.items()) if isinstance(stored, dict) else list(stored or [])
    lines = []
    for pair in pairs:
        name, value = str(pair[0]), str(pair[1]) if len(pair) > 1 else ""
        encoded = str(pair[2]) if len(pair) > 2 else ""
        moment = None if encoded else epoch_millis(value)
        note = f" ({utc(moment)})" if moment else f" (base64: {encoded})" if encoded else ""
        lines.append((inert.shown(name), value_of(value) + note))
    width = max((len(name) for name, _ in lines), default=0)
    return [f"{name:<{width}}  {value}" for name, value in lines]


def print_sections(row: dict[str, Any], console: Console | None = None) -> None:
    """A row of a `show` command as sections: `facts` (each scalar column, named in words), then each document
    column (a dict or a list) as its own section of indented JSON."""
    console = console or tables()
    scalars = [(name.replace("_", " "), value) for name, value in row.items() if not isinstance(value, dict | list)]
    section(console, "facts", facts(scalars))
    for name, value in row.items():
        if isinstance(value, dict | list):
            section(console, name.replace("_", " "), document(value))

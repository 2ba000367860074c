"""CLI tables show record content (keys, ids) as it is: never read as Rich markup (a key `[/x]` crashed them)."""

from __future__ import annotations

import pytest
from rich.table import Table

from service.cli.common import tables as _tables


@pytest.mark.parametrize("key", ["[/x]", "[red]not red[/red]", "[bold", "A-1 [link=https://evil]"])
def test_a_key_that_looks_like_markup_is_shown_literally(key: str) -> None:
    console = _tables()
    table = Table("key")
    table.add_row(key)

    with console.capture() as captured:
        console.print(table)

    assert key in captured.get()

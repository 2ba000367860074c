"""Record content is inert in every output: control characters, bidi overrides and escape sequences are printed
as escapes, and the escaped text decodes back to the exact value (TSV, JSON)."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from service import inert
from service.cli import layout

PROPERTY = settings(max_examples=300, deadline=None, database=None, print_blob=True)

BIDI = [chr(c) for c in (0x200E, 0x200F, 0x061C, *range(0x202A, 0x202F), *range(0x2066, 0x206A))]
CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
SEQUENCES = [
    "\x1b]52;c;aGVsbG8=\x07",  # OSC 52: write the clipboard
    "\x1b[2J",  # clear the screen
    "\x1b]0;owned\x1b\\",  # set the window title
    "\x9b31m",  # C1 CSI
    "\\x1b",  # text that looks like an escape
    "\\",
    "Zürich",
]


def dangerous(text: str) -> list[str]:
    """The characters of `text` a terminal or a browser would act on or hide."""
    return [char for char in text if char in CONTROLS or char in BIDI]


hostile = st.lists(st.one_of(st.text(), st.sampled_from(SEQUENCES), st.sampled_from(BIDI + CONTROLS)), max_size=8).map(
    "".join
)


@PROPERTY
@given(hostile)
def test_shown_and_escaped_text_hold_no_dangerous_character_and_escaped_text_decodes_back_exactly(value: str) -> None:
    shown, escaped = inert.shown(value), inert.escaped(value)

    assert dangerous(shown) == dangerous(escaped) == []
    assert "\n" not in shown + escaped
    assert inert.unescaped(escaped) == value
    if value.isprintable():
        assert shown == value


@PROPERTY
@given(st.dictionaries(hostile, st.one_of(hostile, st.lists(hostile, max_size=3)), max_size=4))
def test_json_keeps_exact_values_and_writes_dangerous_characters_as_escapes(document: dict[str, object]) -> None:
    for indent in (None, 2):
        written = inert.json_text(document, indent=indent, sort_keys=True)

        assert [char for char in dangerous(written) if char != "\n"] == []
        assert json.loads(written) == document


@PROPERTY
@given(st.lists(st.tuples(hostile, hostile), max_size=5))
def test_tsv_cells_hold_no_dangerous_character_and_decode_back_exactly(rows: list[tuple[str, str]]) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        layout.print_tsv(("key", "message id"), rows)

    lines = printed.getvalue().splitlines()
    cells = [line.split("\t") for line in lines]
    assert all(dangerous(cell) == [] for line in cells for cell in line)
    assert [tuple(inert.unescaped(cell) for cell in line) for line in cells[1:]] == rows


@PROPERTY
@given(st.lists(st.tuples(hostile, hostile), min_size=1, max_size=4), st.sampled_from([80, 120]))
def test_a_table_holds_no_dangerous_character(rows: list[tuple[str, str]], width: int) -> None:
    console = Console(file=io.StringIO(), width=width, markup=False, highlight=False, color_system=None)

    layout.print_table(("key", "message id"), rows, console=console)

    assert dangerous(console.file.getvalue().replace("\n", "")) == []  # type: ignore[attr-defined]


def test_readable_text_is_shown_as_it_is_and_json_keeps_non_ascii_letters_readable() -> None:
    assert inert.shown("Zürich A-1001 [x]") == "Zürich A-1001 [x]"
    assert inert.json_text({"city": "Zürich"}) == '{"city": "Zürich"}'


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("a\x1b]52;c;eA==\x07", "a\\x1b]52;c;eA==\\x07"),
        ("\u202eevil", "\\u202eevil"),
        ("tab\there\nnext", "tab\\there\\nnext"),
        ("\x9b", "\\x9b"),
        ("\U000e0041", "\\U000e0041"),
    ],
)
def test_each_dangerous_character_is_shown_as_its_escape(value: str, shown: str) -> None:
    assert inert.shown(value) == inert.escaped(value) == shown
    assert inert.unescaped(shown) == value


def test_only_escaped_text_doubles_a_backslash() -> None:
    assert inert.shown("C:\\x1b") == "C:\\x1b"
    assert inert.escaped("C:\\x1b") == "C:\\\\x1b"
    assert inert.unescaped("C:\\\\x1b") == "C:\\x1b"


@pytest.mark.parametrize("text", ["\\", "\\q", "\\x1", "ab\\u12"])
def test_a_backslash_that_starts_no_escape_is_not_an_escaped_value(text: str) -> None:
    with pytest.raises(ValueError, match="starts no escape"):
        inert.unescaped(text)


def _lines_of(width: int, headers: tuple[str, ...], rows: list[tuple[str, ...]], prose: set[int]) -> list[str]:
    console = Console(file=io.StringIO(), width=width, markup=False, highlight=False, color_system=None)
    layout.print_table(headers, rows, prose=prose, console=console)
    return str(console.file.getvalue()).splitlines()  # type: ignore[attr-defined]


@pytest.mark.parametrize("width", [80, 120])
def test_a_table_never_cuts_an_id_or_a_word_at_any_width(width: int) -> None:
    headers = ("failure id", "message id", "error code", "status", "owner", "key", "attempts", "first failed (UTC)")
    rows = [
        (
            f"orders.v1/0/{n}",
            f"2f1c9a8e-6b7d-4c1e-9a3b-{n:012d}",
            "MALFORMED_PAYLOAD",
            "open",
            "order-intake-team",
            f"A-100{n}",
            "1",
            "2026-12-01T10:00:00Z",
        )
        for n in range(3)
    ]

    lines = _lines_of(width, headers, rows, set())

    assert all(len(line) <= width for line in lines)
    for row in rows:
        for value in row:
            assert any(value in line for line in lines), (value, lines)


def test_a_free_text_column_wraps_at_words_and_the_table_stays_a_table() -> None:
    detail = "the provider answered 503 three times in a row and the breaker opened for thirty seconds"

    lines = _lines_of(80, ("run", "detail"), [("R-2f1c9a8e", detail)], {1})

    assert lines[0].startswith("┏")
    assert any("R-2f1c9a8e" in line for line in lines)
    words = " ".join(line.strip("│┃ ").split("│")[-1].strip() for line in lines[3:-1])
    assert detail.split() == words.split()


def test_epoch_millisecond_header_values_are_shown_with_their_utc_time() -> None:
    lines = layout.headers([["sent-at", "1785000000000"], ["id", "12"], ["raw", "/w==", "value"]])

    assert lines == ["sent-at  1785000000000 (2026-07-25T17:20:00Z)", "id       12", "raw      /w== (base64: value)"]

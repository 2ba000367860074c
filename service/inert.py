"""Record content made inert for a terminal or a page (pure; no I/O).

Keys, message ids, header names and values, payloads, notes and error details come from outside. Printed as they
are, a control character (`ESC ] 52 ; c ; …` writes the operator's clipboard, `ESC [ 2J` clears the screen), a
bidi override (U+202E reverses the text after it) or an invisible character could hide, spoof or act. Every
output path shows such content through this module, losslessly:

- `shown` is the form for people (tables, `show`, plain lines, every console element): every character that
  `str.isprintable` rejects (C0, DEL, C1, bidi marks, overrides and isolates, zero-width and other format
  characters, line and paragraph separators, non-ASCII spaces) as `\\t`, `\\n`, `\\r`, `\\xNN`, `\\uNNNN` or
  `\\UNNNNNNNN`; visible text, a backslash included, is left as it is;
- `escaped` is the form for tab-separated and comma-separated values: `shown` with a backslash written as
  `\\\\` too, so that the escaped text is unambiguous and `unescaped` gives the exact value back;
- `json_text` is JSON as `json.dumps` writes it with `ensure_ascii=False` (`Zürich` stays readable), but with
  every character `str.isprintable` rejects written as a `\\uXXXX` escape: `json.loads` reads the exact value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_NAMED = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNNAMED = {value: key for key, value in _NAMED.items()}
_ESCAPE = re.compile(r"\\(?:[\\tnr]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _escaped(char: str) -> str:
    """One character as the escape that names it."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def is_inert(text: str) -> bool:
    """Whether `text` holds only characters a terminal or a page shows as themselves (no control, bidi or other
    invisible character; a newline is not one: one value is one line)."""
    return text.isprintable()


def shown(value: object) -> str:
    """Record content as one line of visible text, for a person: what every table, `show` section, plain line and
    console element prints."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def escaped(value: object) -> str:
    """Record content as one TSV or CSV cell that decodes back exactly (`unescaped`): `shown`, and a backslash
    as `\\\\`."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(char if char.isprintable() and char != "\\" else _escaped(char) for char in text)


def unescaped(text: str) -> str:
    """The exact value `escaped` wrote; a backslash that starts no escape `escaped` writes is a ValueError."""

    def one(match: re.Match[str]) -> str:
        escape = match.group()
        return _UNNAMED.get(escape) or chr(int(escape[2:], 16))

    decoded = _ESCAPE.sub(one, text)
    if "\\" in _ESCAPE.sub("", text):
        raise ValueError(f"not an escaped value: a backslash starts no escape in {text!r}")
    return decoded


def visible_json(written: str) -> str:
    """JSON text (as `json.dumps(..., ensure_ascii=False)` writes it, indented or not) with every character
    `str.isprintable` rejects written as a JSON escape. Outside strings JSON holds only printable ASCII, spaces and
    (indented) newlines, so only string content changes, and the document reads back the same."""
    if written.replace("\n", "").isprintable():
        return written
    return "".join(char if char.isprintable() or char == "\n" else json.dumps(char)[1:-1] for char in written)


def json_text(
    value: Any, *, indent: int | None = None, sort_keys: bool = False, default: Callable[[Any], Any] | None = None
) -> str:
    """`value` as JSON, readable (non-ASCII letters as they are) and inert (`visible_json`)."""
    return visible_json(json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=default))

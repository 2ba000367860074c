"""How the console shows what it reads (pure; no I/O): ages, payloads, the last day's chart, record content.

Everything a record holds is untrusted: it reaches a page only as text (Jinja2 escapes it) or as hex, never as
HTML, an attribute the page did not choose, or a URL. (A trace link is the operator's URL around a trace id that was
checked to be 32 hex digits: nothing else of the record gets into it.)
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from service import inert
from service.addresses import TRACE_PLACEHOLDER
from service.moments import epoch_millis
from service.moments import utc as utc  # the one timestamp style of every output

HEX_LIMIT = 64 * 1024  # bytes shown as hex at most; the rest is counted, not shown
TEXT_LIMIT = 256 * 1024  # characters of a text payload shown at most
_SHOWN_CONTROL = set("\n\t")
_TRACE_ID = re.compile(r"[0-9a-f]{32}")  # a W3C trace id as the service writes one: lowercase hex


def age(seconds: float | None) -> str:
    """A duration as an operator reads it: `45s`, `12m`, `3h 20m`, `5d 4h`; `-` for none."""
    if seconds is None:
        return "-"
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m"
    return f"{secs}s"


def printable(value: Any) -> str:
    """Record content (a key, a header, an id) as one line of visible text: control characters, bidi overrides and
    every other invisible character as escapes (`service.inert.shown`); HTML escaping is the template's."""
    return inert.shown(value)


def pretty(document: Any) -> str:
    """A JSON document (an envelope, an effect's payload) indented, for a `<pre>`, every invisible character as a
    JSON escape (`service.inert.json_text`); HTML escaping is the template's."""
    return inert.json_text(document, indent=2, sort_keys=True, default=str)


def header_moment(value: Any) -> str:
    """The UTC time a header value of epoch milliseconds names (`2026-12-01T10:00:00Z`); empty for any other."""
    moment = epoch_millis(value)
    return utc(moment) if moment is not None else ""


@dataclass(frozen=True)
class Trace:
    """A record's trace: the id its envelope holds (None: none), and the link to it (None: no trace URL is set, or
    the id is not one a link may carry)."""

    trace_id: str | None
    url: str | None


def trace(envelope: Any, url_template: str) -> Trace:
    """The trace of a record's envelope (`traceId`), linked through `url_template` (ORDERS_CONSOLE_TRACE_URL) only
    when the id is exactly 32 lowercase hex digits: a stored envelope is outside input, and anything else in a link
    could lead anywhere. Nothing else is quoted: the template is the operator's, checked at start-up."""
    found = envelope.get("traceId") if isinstance(envelope, dict) else None
    trace_id = found if isinstance(found, str) else None
    if not url_template or trace_id is None or _TRACE_ID.fullmatch(trace_id) is None:
        return Trace(trace_id, None)
    return Trace(trace_id, url_template.replace(TRACE_PLACEHOLDER, trace_id))


@dataclass(frozen=True)
class PayloadView:
    """A revealed payload: as text when it is UTF-8 (with JSON indented), else as hex; and how much is cut."""

    kind: str  # "text", "json", "hex" or "none"
    body: str
    size: int
    shown: int  # bytes (hex) or characters (text) shown
    cut: bool = False  # whether more was there than is shown (characters and bytes differ: it cannot be inferred)


def payload_view(payload: bytes | memoryview | None) -> PayloadView:
    """How a revealed payload is shown: text escaped (by the template), binary as hex, never as HTML."""
    if payload is None:
        return PayloadView("none", "", 0, 0)
    raw = bytes(payload)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _hex(raw)
    if any(not char.isprintable() and char not in _SHOWN_CONTROL for char in text):
        return _hex(raw)  # NUL or other control characters: text would hide them
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict | list):
        shown = inert.json_text(document, indent=2)
        return PayloadView("json", shown[:TEXT_LIMIT], len(raw), min(len(shown), TEXT_LIMIT), len(shown) > TEXT_LIMIT)
    return PayloadView("text", text[:TEXT_LIMIT], len(raw), min(len(text), TEXT_LIMIT), len(text) > TEXT_LIMIT)


def _hex(raw: bytes) -> PayloadView:
    """Bytes as lines of 16: offset, hex, and the printable ASCII characters (others as `.`)."""
    part = raw[:HEX_LIMIT]
    visible = set(string.ascii_letters + string.digits + string.punctuation + " ")
    lines = []
    for offset in range(0, len(part), 16):
        chunk = part[offset : offset + 16]
        ascii_ = "".join(chr(byte) if chr(byte) in visible else "." for byte in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  {ascii_}")
    return PayloadView("hex", "\n".join(lines), len(raw), len(part), len(part) < len(raw))


@dataclass(frozen=True)
class Bar:
    """One bar of the last day's chart: where it is drawn, and what it counts."""

    x: float
    y: float
    height: float
    code: str
    hour: str
    count: int


@dataclass(frozen=True)
class Chart:
    """The records quarantined per hour over the last 24 hours, stacked by error code, as SVG geometry."""

    width: int
    height: int
    bars: list[Bar]
    codes: list[str]
    peak: int
    total: int


CHART_WIDTH, CHART_HEIGHT, _HOURS = 480, 120, 24


def chart(now: float, rows: Sequence[dict[str, Any]]) -> Chart:
    """Stack the per-code hourly counts (`error_code`, `hour` as epoch seconds, `quarantined`) into 24 columns
    ending at the hour of `now`; the tallest column fills the height."""
    current = int(now // 3600) * 3600
    first = current - (_HOURS - 1) * 3600
    columns: dict[int, list[tuple[str, int]]] = {}
    for row in rows:
        hour = int(float(row["hour"]))
        if first <= hour <= current:
            columns.setdefault(hour, []).append((str(row["error_code"]), int(row["quarantined"])))
    peak = max((sum(count for _, count in stack) for stack in columns.values()), default=0)
    slot = CHART_WIDTH / _HOURS
    bars = []
    for index in range(_HOURS):
        hour = first + index * 3600
        top = float(CHART_HEIGHT)
        for code, count in sorted(columns.get(hour, [])):
            height = CHART_HEIGHT * count / peak if peak else 0.0
            top -= height
            label = datetime.fromtimestamp(hour, UTC).strftime("%H:00")
            bars.append(Bar(round(index * slot + 1, 1), round(top, 1), round(height, 1), code, label, count))
    codes = sorted({bar.code for bar in bars})
    return Chart(CHART_WIDTH, CHART_HEIGHT, bars, codes, peak, sum(bar.count for bar in bars))


def palette_index(code: str, codes: Sequence[str]) -> int:
    """Which of the stylesheet's eight series colours a code is drawn in (`series-N`)."""
    return codes.index(code) % 8 if code in codes else 0

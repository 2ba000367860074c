"""What an operator may pass as a number, a duration, a timestamp or a text filter: one parser each, shared by the
command line (a bad value is exit 2) and the console (a 400).

Each returns a value in range or raises ValueError with a one-line message, never another exception: a value the
database would refuse (an offset beyond `bigint`, an age no `timestamptz` holds, NUL in a text) is refused here, where
it can be named, instead of failing as a driver error. Pure: no I/O.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from service.durations import parse_duration

BIGINT_MAX = 2**63 - 1  # PostgreSQL's bigint: ids, offsets and counts in SQL
# The longest age a filter takes: 100 years, older than any record, and far within what a timedelta and a timestamp
# hold either side of now (an age is subtracted from now in SQL, where 99999999 days is out of range).
LONGEST_AGE = timedelta(days=36_500)
_WHOLE = re.compile(r"[0-9]{1,19}", re.ASCII)
_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?", re.ASCII)
# The longest text filter: a key, an id or a name is far shorter; a longer one is a paste gone wrong.
LONGEST_TEXT = 10_000


def whole(value: str, *, low: int = 0, high: int = BIGINT_MAX) -> int:
    """A whole number written in ASCII digits, from `low` to `high`."""
    text = value.strip()
    if not _WHOLE.fullmatch(text) or not low <= int(text) <= high:
        raise ValueError(f"{_shown(value)} is not a whole number from {low} to {high}")
    return int(text)


def decimal(value: str, *, low: float, high: float) -> float:
    """A decimal number (`0.5`, `10`; no exponent, infinity or NaN), from `low` to `high`."""
    text = value.strip()
    if not _DECIMAL.fullmatch(text) or not low <= float(text) <= high:
        raise ValueError(f"{_shown(value)} is not a number from {low:g} to {high:g}")
    return float(text)


def age(value: str) -> timedelta:
    """A duration an age filter takes (`30s`, `1h`, `7d`), at most `LONGEST_AGE`."""
    if "\x00" in value:
        raise ValueError(f"{_shown(value)} is not a duration like 500ms, 30s, 5m, 1h or 7d")
    found = parse_duration(value)  # its ValueError names the form
    if found > LONGEST_AGE:
        raise ValueError(f"{_shown(value)} is longer than {LONGEST_AGE.days}d")
    return found


def moment(value: str, *, zone_required: bool) -> datetime:
    """An RFC 3339 timestamp in UTC; without a zone, UTC is assumed unless `zone_required`."""
    try:
        found = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{_shown(value)} is not an RFC 3339 timestamp") from None
    if found.tzinfo is None:
        if zone_required:
            raise ValueError(f"{_shown(value)} needs a time zone (e.g. Z)")
        found = found.replace(tzinfo=UTC)
    try:
        return found.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first moment a datetime holds
        raise ValueError(f"{_shown(value)} is out of range") from None


def moment_or_ago(value: str, now: datetime, *, zone_required: bool) -> datetime:
    """A point in time as an operator writes it: RFC 3339 (`moment`) or a duration before `now` (`2h`: two hours
    ago), at most `LONGEST_AGE` ago."""
    try:
        parse_duration(value)
    except ValueError:
        pass
    else:
        return now - age(value)
    try:
        return moment(value, zone_required=zone_required)
    except ValueError as error:
        if "is not an RFC 3339 timestamp" in str(error):
            raise ValueError(f"{_shown(value)} is neither an RFC 3339 timestamp nor a duration ago like 2h") from None
        raise


def text(value: str) -> str:
    """A text filter (a key, an id, a name): no NUL, which no stored text holds (PostgreSQL's text cannot; a record
    whose key holds NUL is stored without an ordering key, its envelope keeping the bytes as `keyBase64`)."""
    if "\x00" in value:
        raise ValueError(f"{_shown(value)} holds NUL, which no stored key, id or name holds")
    if len(value) > LONGEST_TEXT:
        raise ValueError(f"is longer than {LONGEST_TEXT} characters")
    return value


def _shown(value: str) -> str:
    """A value as a message quotes it: escaped (one line), and cut when long."""
    shown = repr(value[:60])
    return shown + " …" if len(value) > 60 else shown

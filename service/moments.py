"""Moments as every output shows them (pure): ISO 8601 in UTC to the second with `Z`, and epoch milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# 13 digits of milliseconds since the epoch span 2001-09-09 to 2286-11-20: a header value in that range that is
# only digits is a timestamp as Kafka clients write them (the record's own timestamp is one).
_EPOCH_MILLIS_DIGITS = 13


def utc(moment: datetime | None) -> str:
    """A timestamp in UTC to the second, ISO 8601 (`2026-12-01T10:00:00Z`); `-` for none."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def epoch_millis(value: Any) -> datetime | None:
    """The moment a header value of 13 ASCII digits (epoch milliseconds) names; None for any other value."""
    if not isinstance(value, str) or len(value) != _EPOCH_MILLIS_DIGITS or not (value.isascii() and value.isdigit()):
        return None
    return datetime.fromtimestamp(int(value) / 1000, UTC)

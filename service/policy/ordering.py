"""Ordering policy (ORDERS_ORDERING): what a record may do while an earlier record of its key is unfinished.

- `key`: while a record of key K waits in a retry tier (or was quarantined from one), later records of K are
  parked in PostgreSQL and released in their original order once K is free.
- `versioned`: records carry a per-order `sequence`; one not newer than the order's applied sequence is a
  terminal no-op (stale); newer ones apply at once.
- `unordered`: nothing is held back; records of one key may be applied out of order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Route(StrEnum):
    """Where a record goes before any business logic runs."""

    APPLY = "apply"
    PARK = "park"  # a new record behind a held key: store it, commit its offset, apply it later
    HOLD = "hold"  # a parked record whose key is held again: leave it parked


@dataclass(frozen=True)
class KeyState:
    """What holds a key right now."""

    retrying_message_id: str | None = None  # the head waiting in a retry tier
    blocked: bool = False  # the head was quarantined: only an operator or a reprocess frees it
    has_parked: bool = False  # earlier records of the key are parked


def route(mode: str, state: KeyState, *, message_id: str, from_parked: bool) -> Route:
    """Decide whether a record of a key may be applied now."""
    if mode != "key":
        return Route.APPLY
    held = state.blocked or (state.retrying_message_id not in (None, message_id))
    if from_parked:
        return Route.HOLD if held else Route.APPLY
    return Route.PARK if held or state.has_parked else Route.APPLY


def is_stale(mode: str, sequence: int | None, applied: int | None) -> bool:
    """Under `versioned`, a record whose sequence is not newer than the order's applied one changes nothing."""
    return mode == "versioned" and sequence is not None and applied is not None and sequence <= applied

"""The handler seam: what the core's processor asks of a domain in every round.

The processor owns the failure state machine, ordering, the inbox, the outbox and the one transaction of a
round. A domain supplies, through one `Handler` (the order domain: `service/orders/handler.py`):
- `decode`: a record's bytes as a message (with its aggregate id and schema name) or a `DecodeFailure`;
- `creates` and `sequence`: whether a message creates its aggregate, and its per-aggregate sequence;
- `context_key` and `look_up`: an outside fact a message needs, looked up before the transaction, at most once
  per key and round, concurrently (a transient failure raises `RecordFailure` and is retried like any other);
- `apply`: the pure rule, `(message, current, looked up) -> Applied | Rejected` (service/policy/handling.py); an
  applied result carries the new aggregate state (`aggregate`, with its `version` and `sequence`), its effects
  and its events;
- `event` and `rejection`: the documents the outbox publishes for an event and for a rejection;
- `lock` and `rows`: the aggregate store: read and lock a round's current aggregates inside its transaction,
  and write the new and changed ones as part of its one statement (`service/store/batch.py`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.codes import Code
from service.policy.handling import Applied, Rejected
from service.policy.records import Coordinates
from service.store.batch import AggregateRows


class Handler(Protocol):
    """A domain's part of a round (see the module docstring)."""

    rows: AggregateRows  # how the round's one write statement writes the aggregates

    @property
    def downstream(self) -> str | None:
        """The name of the look-up's downstream (backpressure, metrics); None when it is not configured."""

    def decode(self, value: bytes | None) -> Any:
        """The message the bytes hold, or a `DecodeFailure`; never raises for bad input."""

    def creates(self, message: Any) -> bool:
        """Whether the message creates its aggregate (the round does not read or lock it then)."""

    def sequence(self, message: Any) -> int | None:
        """The message's per-aggregate sequence, for `versioned` ordering."""

    def context_key(self, message: Any, known: Collection[str]) -> str | None:
        """What to look up before applying the message (`known`: the aggregates that exist), or None."""

    async def look_up(self, key: str) -> Any:
        """The outside fact for `key`; raises `RecordFailure` when it cannot be had now."""

    def apply(self, message: Any, current: Any | None, looked_up: Mapping[str, Any]) -> Applied | Rejected:
        """The pure rule: an applied result or a `Rejected`."""

    def event(self, event: Any, version: int, message_id: str) -> tuple[str, str, dict[str, Any]]:
        """An event's (type, aggregate id, document) for `<source>.events`."""

    def rejection(
        self,
        message_id: str,
        aggregate_id: str | None,
        code: Code,
        schema: str | None,
        origin: Coordinates,
        at: datetime,
    ) -> tuple[str, dict[str, Any]]:
        """A rejection's (type, document) for `<source>.rejected`."""

    async def lock(self, connection: AsyncConnection, ids: Iterable[str]) -> dict[str, Any]:
        """The current aggregates with these ids, locked for the round's transaction."""

"""The seam between a round's shell (service/worker/processor.py) and its database: what the shell reads and writes,
as two small protocols, and their PostgreSQL implementation.

A round reads its facts (one statement), then opens one transaction: it locks the aggregates it changes, applies
the decided value (service/store/round_write.py) and commits. Unit tests drive the shell with a fake of these
protocols; the integration tests with this implementation.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Collection, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from service.errors import InfrastructureUnavailable
from service.policy import ordering
from service.policy.decide import RoundWrite
from service.policy.delivery import Delivery
from service.policy.round import Facts
from service.ports import Handler
from service.store import lookups, parking, round_write
from service.store.parking import StoredParked
from service.store.round_write import Rows
from service.store.uow import UnitOfWork, one_statement

# A member's claim on the parked records it releases; renewed every release cycle (half a second) while they are
# in its memory, so it only runs out when the member is gone or stalled, and another member then takes them.
_RELEASE_LEASE = timedelta(seconds=30)


class RoundTransaction(Protocol):
    """A round's one transaction: its exit rolls back unless `commit` was called."""

    async def __aenter__(self) -> RoundTransaction: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def lock(self, ids: list[str]) -> Mapping[str, Any]:
        """The current aggregates with these ids, locked until the transaction ends."""

    async def apply(self, write: RoundWrite[Rows]) -> None:
        """Write the decided value."""

    async def commit(self) -> None:
        """Commit what was applied."""


class RoundStore(Protocol):
    """What a consumer's rounds read and write."""

    async def facts(self, due: Collection[Delivery], *, keys: bool) -> Facts:
        """What the database says about these deliveries (`keys`: and their keys' ordering state)."""

    def transaction(self) -> RoundTransaction:
        """A new transaction, to be entered with `async with`."""

    async def releasable(self, busy: set[str], keys: int, per_key: int) -> list[StoredParked]:
        """Claim parked records of keys that are free again, oldest first (`busy`: keys in memory already)."""

    async def let_go(self) -> None:
        """Give up this member's claims on parked records."""


class PostgresRounds:
    """A consumer's rounds on PostgreSQL; the domain's handler reads, locks and writes its aggregates."""

    def __init__(self, engine: AsyncEngine, consumer: str, handler: Handler[Any, Any, Any]) -> None:
        self._engine = engine
        self._consumer = consumer
        self._handler = handler
        # Who claims parked records for release: one process, one lease holder (several members share a table).
        self._member = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"

    async def facts(self, due: Collection[Delivery], *, keys: bool) -> Facts:
        """The round's one look-up (service/store/lookups.py), as the decision's facts."""
        wanted = {d.key for d in due if d.key} if keys else set()
        # Which aggregates exist decides what the handler looks up and which aggregates the write must lock.
        aggregate_ids = {d.aggregate_id for d in due if d.aggregate_id}
        async with one_statement(self._engine) as connection:
            known = await lookups.known(
                connection,
                self._consumer,
                self._handler.rows.lookup,
                {d.message_id for d in due},
                aggregates=aggregate_ids,
                keys=wanted,
            )
        states = {
            key: ordering.KeyState(known.heads.get(key), key in known.blocked, key in known.parked)
            for key in known.heads.keys() | known.blocked | known.parked
        }
        return Facts(known.seen, known.steps, known.head_ids, known.parked_ids, known.aggregates, states)

    def transaction(self) -> _Transaction:
        """A new transaction on its own connection."""
        return _Transaction(UnitOfWork(self._engine), self._consumer, self._member, self._handler)

    async def releasable(self, busy: set[str], keys: int, per_key: int) -> list[StoredParked]:
        """Claim parked records of free keys under this member's lease; `busy` keys' claims are renewed."""
        async with UnitOfWork(self._engine) as uow:
            stored = await parking.releasable(
                uow.connection,
                self._consumer,
                self._member,
                exclude=busy,
                keys=keys,
                per_key=per_key,
                lease=_RELEASE_LEASE,
            )
            await uow.commit()
        return stored

    async def let_go(self) -> None:
        """Give up this member's claims (on the way out), so another member takes them now."""
        try:
            async with UnitOfWork(self._engine) as uow:
                await parking.unclaim(uow.connection, self._member)
                await uow.commit()
        except InfrastructureUnavailable:
            pass  # the leases end on their own


class _Transaction:
    """One round's transaction (a `UnitOfWork`: driver errors are translated on its exit)."""

    def __init__(self, uow: UnitOfWork, consumer: str, member: str, handler: Handler[Any, Any, Any]) -> None:
        self._uow = uow
        self._consumer = consumer
        self._member = member
        self._handler = handler

    async def __aenter__(self) -> _Transaction:
        await self._uow.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._uow.__aexit__(exc_type, exc, tb)

    async def lock(self, ids: list[str]) -> Mapping[str, Any]:
        """The domain's current aggregates, locked (`Handler.lock`)."""
        return await self._handler.lock(self._uow.connection, ids)

    async def apply(self, write: RoundWrite[Rows]) -> None:
        """The decided value, written (service/store/round_write.py)."""
        await round_write.apply(self._uow.connection, self._consumer, self._member, self._handler.rows, write)

    async def commit(self) -> None:
        """Commit the transaction."""
        await self._uow.commit()

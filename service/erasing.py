"""Erasing quarantined records on request, as the CLI does it: which records a selection names, then their bytes
and header values removed and the act audited, in the caller's one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.operations import Wanted
from service.store import audit, erasure
from service.store.quarantine import RecordKey


@dataclass(frozen=True)
class ErasureSelection:
    """What an operator named: failure ids (of one consumer, when named), or every record of an ordering key."""

    failure_ids: tuple[str, ...] = ()
    key: str | None = None
    consumer: str | None = None

    async def pick(self, connection: AsyncConnection) -> Picked:
        """The records named now (SeveralConsumers, from `Wanted.pick`, when an id is several consumers')."""
        if self.key is not None:
            return Picked(await erasure.of_key(connection, self.key, self.consumer))
        chosen = await Wanted(self.failure_ids, consumer=self.consumer).pick(connection)
        return Picked(chosen.records, list(chosen.missing))

    def described(self) -> dict[str, Any]:
        """The selection as the audit keeps it."""
        return {"failure_ids": list(self.failure_ids), "key": self.key, "consumer": self.consumer}


@dataclass(frozen=True)
class Picked:
    """The records a selection names, and the named failure ids no record has."""

    records: list[RecordKey]
    missing: list[str] = field(default_factory=list)

    def by_consumer(self) -> list[tuple[str, list[str]]]:
        """The records grouped by consumer name."""
        ordered = sorted(self.records, key=lambda record: record.consumer_name)
        return [(name, [r.failure_id for r in group]) for name, group in groupby(ordered, lambda r: r.consumer_name)]


async def already_erased(connection: AsyncConnection, picked: Picked) -> list[RecordKey]:
    """The picked records erased before."""
    found: list[RecordKey] = []
    for consumer, failure_ids in picked.by_consumer():
        done = await erasure.already_erased(connection, consumer, failure_ids)
        found += [RecordKey(consumer, one) for one in failure_ids if one in done]
    return found


async def erase(
    connection: AsyncConnection, selection: ErasureSelection, picked: Picked, actor: str
) -> tuple[list[RecordKey], list[RecordKey]]:
    """Erase the picked records not erased yet, and audit it; the records erased now, and those erased before."""
    erased: list[RecordKey] = []
    for consumer, failure_ids in picked.by_consumer():
        erased += [RecordKey(consumer, one) for one in await erasure.erase(connection, consumer, failure_ids, actor)]
    before = [record for record in picked.records if record not in erased]
    await audit.record(
        connection,
        actor,
        "quarantine.erase",
        {**selection.described(), "picked": [list(record) for record in picked.records], "missing": picked.missing},
        {"erased": len(erased), "already_erased": len(before)},
    )
    return erased, before

"""What operators do, once: the actions and selections the CLI and the console both call.

Each action runs in the caller's unit of work and writes its audit row (actor, selection, result) in the same
transaction as its change, so an action is never done without its audit, nor audited without being done. The
CLI turns the results into lines and exit codes, the console into pages; neither repeats a rule of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.policy import repairs
from service.store import audit, parking, quarantine, quarantine_reads
from service.store import effects as effects_store
from service.store import reprocess as reprocess_store
from service.store.quarantine import RecordKey

LARGEST_SELECTION = 100_000  # a selection larger than this is refused: narrow it, or work through it in parts


class SelectionTooLarge(Exception):
    """A selection matched more records than an action takes at once."""

    def __init__(self, total: int) -> None:
        super().__init__(f"the selection holds {total} records, more than {LARGEST_SELECTION}: narrow it")
        self.total = total


class SeveralConsumers(Exception):
    """A failure id, or a selection, is quarantined under several consumer names and none was named: each consumer
    keeps its own record of a failure (contract §7), so an action must say whose it means."""

    def __init__(self, consumers: Sequence[str], failure_id: str | None = None) -> None:
        names = ", ".join(consumers)
        said = f"{failure_id} is quarantined" if failure_id is not None else "the selection spans"
        super().__init__(f"{said} under several consumers: {names}")
        self.consumers, self.failure_id = list(consumers), failure_id


@dataclass(frozen=True)
class Picked:
    """The records a selection means: one consumer's failure ids (in the order asked or listed), and the named
    failure ids that no record has (under that consumer, when one was named)."""

    consumer: str | None  # None: no record was found
    failure_ids: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()

    @property
    def records(self) -> list[RecordKey]:
        """The records themselves."""
        return [RecordKey(self.consumer, one) for one in self.failure_ids] if self.consumer is not None else []

    @property
    def named(self) -> list[str]:
        """Every failure id the selection stands for, found or not: what an operator is told and asked about."""
        return [*self.failure_ids, *self.missing]


@dataclass(frozen=True)
class Wanted:
    """What an operator asked for: failure ids, or open records matching code, key, age, owner and a range of
    first-failed times [since, until) (or both: the ids among the matching ones), of one consumer when it is
    named."""

    ids: tuple[str, ...] = ()
    error_code: str | None = None
    key: str | None = None
    older_than: timedelta | None = None
    consumer: str | None = None
    owner: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def selecting(self) -> bool:
        """Whether the filters select records (rather than only naming them)."""
        filters = (self.error_code, self.key, self.older_than, self.owner, self.since, self.until)
        return any(one is not None for one in filters)

    async def pick(self, connection: AsyncConnection) -> Picked:
        """The records this selection means, now: SelectionTooLarge when the filters match too many, and
        SeveralConsumers when they, or a named failure id, are several consumers' and no consumer was named."""
        if not self.selecting:
            found = await quarantine_reads.consumers_of(connection, self.ids, self.consumer)
            return _one_consumer(
                [(one, name) for one in self.ids for name in found.get(one, [])],
                missing=[one for one in self.ids if one not in found],
                default=self.consumer,
            )
        rows, total = await quarantine_reads.listing(
            connection,
            error_code=self.error_code,
            status="open",
            older_than=self.older_than,
            key=self.key,
            owner=self.owner,
            since=self.since,
            until=self.until,
            consumer=self.consumer,
            limit=LARGEST_SELECTION,
        )
        if total > LARGEST_SELECTION and not self.ids:
            raise SelectionTooLarge(total)
        named = set(self.ids)
        listed = [(row["failure_id"], row["consumer_name"]) for row in rows if not named or row["failure_id"] in named]
        return _one_consumer(listed, missing=[], default=self.consumer)

    def described(self) -> dict[str, Any]:
        """The selection as the audit keeps it."""
        return {
            "failure_ids": list(self.ids),
            "error_code": self.error_code,
            "key": self.key,
            "older_than_seconds": self.older_than.total_seconds() if self.older_than else None,
            "consumer": self.consumer,
            "owner": self.owner,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
        }


def _one_consumer(found: list[tuple[str, str]], *, missing: list[str], default: str | None) -> Picked:
    """The picked records when they are one consumer's (SeveralConsumers otherwise, naming a failure id that
    several consumers hold, if one does)."""
    consumers = sorted({name for _, name in found})
    if len(consumers) > 1:
        holders: dict[str, list[str]] = {}
        for failure_id, name in found:
            holders.setdefault(failure_id, []).append(name)
        shared = [(one, names) for one, names in holders.items() if len(names) > 1]
        raise SeveralConsumers(shared[0][1], shared[0][0]) if shared else SeveralConsumers(consumers)
    consumer = consumers[0] if consumers else default
    return Picked(consumer, tuple(failure_id for failure_id, _ in found), tuple(missing))


async def locate(connection: AsyncConnection, failure_id: str, consumer: str | None) -> RecordKey | None:
    """The record a failure id names (under `consumer` when given); None when there is none, SeveralConsumers when
    several consumers have one and none was named."""
    names = (await quarantine_reads.consumers_of(connection, [failure_id], consumer)).get(failure_id, [])
    if len(names) > 1:
        raise SeveralConsumers(names, failure_id)
    return RecordKey(names[0], failure_id) if names else None


async def reveal(
    connection: AsyncConnection, record: RecordKey, actor: str, shown_as: Sequence[str], *, via: str = "cli"
) -> dict[str, Any] | None:
    """One quarantined record with its payload, the reveal audited and written to the record's timeline (None:
    no such record, nothing audited)."""
    found = await quarantine_reads.get(connection, record)
    if found is None:
        return None
    await audit.record(
        connection,
        actor,
        "quarantine.reveal",
        {"consumer": record.consumer_name, "failure_id": record.failure_id, "as": list(shown_as), "via": via},
        {"revealed": True},
    )
    await quarantine.log_event(connection, record, "payload revealed", actor, f"as {', '.join(shown_as)}")
    return found


async def annotate(connection: AsyncConnection, wanted: Wanted, picked: Picked, actor: str, note: str) -> list[str]:
    """Append `note` to each picked record; the failure ids that exist (and got it)."""
    added = [
        record.failure_id for record in picked.records if await quarantine.annotate(connection, record, actor, note)
    ]
    await audit.record(
        connection,
        actor,
        "quarantine.annotate",
        {**wanted.described(), "consumer": picked.consumer, "picked": list(picked.failure_ids)},
        {"annotated": len(added)},
    )
    return added


async def resolve(
    connection: AsyncConnection, wanted: Wanted, picked: Picked, actor: str, reason: str
) -> dict[str, str | None]:
    """Close each picked open record without reprocessing it, freeing the key it held; per failure id (the missing
    ones too), its previous status (`open`: resolved now; None: no such record)."""
    outcomes: dict[str, str | None] = {}
    for record in picked.records:
        previous = await quarantine.resolve(connection, record, reason, actor)
        if repairs.resolves(previous):
            await parking.unblock_failures(connection, record.consumer_name, [record.failure_id])
        outcomes[record.failure_id] = previous
    outcomes |= dict.fromkeys(picked.missing)
    resolved = sum(repairs.resolves(previous) for previous in outcomes.values())
    await audit.record(
        connection,
        actor,
        "quarantine.resolve",
        {**wanted.described(), "consumer": picked.consumer, "picked": list(picked.failure_ids), "reason": reason},
        {"resolved": resolved},
    )
    return outcomes


async def resolve_preview(connection: AsyncConnection, picked: Picked) -> dict[str, str | None]:
    """What `resolve` would find, changing nothing: per failure id (the missing ones too), its status now
    (`repairs.resolves` says which it would close)."""
    found = await quarantine.statuses(connection, picked.records)
    outcomes: dict[str, str | None] = {record.failure_id: found.get(record) for record in picked.records}
    return outcomes | dict.fromkeys(picked.missing)


@dataclass(frozen=True)
class Release:
    """What releasing a key did: under which consumer, and what held it (None: several consumers hold it)."""

    consumer: str
    released: parking.Released | None


async def key_holders(connection: AsyncConnection, key: str, consumer: str | None) -> list[str]:
    """The consumer names under which a key is held or has parked records (only `consumer`, when named)."""
    return [name for name in await parking.holders(connection, key) if consumer in (None, name)]


async def release_key(
    connection: AsyncConnection, key: str, consumer: str | None, default_consumer: str, actor: str
) -> Release:
    """Free a held key under the consumer its records are stored with (`consumer` when given); audited. When
    several consumers hold it and none was named, nothing changes (`released` is None, `consumer` names them)."""
    names = await key_holders(connection, key, consumer)
    if len(names) > 1:
        return Release(", ".join(names), None)
    chosen = names[0] if names else (consumer or default_consumer)
    released = await parking.release(connection, chosen, key)
    await audit.record(
        connection,
        actor,
        "parked.release",
        {"consumer": chosen, "key": key},
        {"freed": released.freed, "blocked_by": released.blocked_by, "parked": released.parked},
    )
    return Release(chosen, released)


async def failed_effects(
    connection: AsyncConnection,
    keys: Sequence[str],
    kind: str | None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[str]:
    """The effects a retry means: the named keys, or the failed effects of `kind` and failed in [since, until)
    (among the named, if any)."""
    if kind is None and since is None and until is None:
        return list(dict.fromkeys(keys))
    rows, _ = await effects_store.listing(
        connection, ["failed"], kind=kind, since=since, until=until, limit=LARGEST_SELECTION
    )
    picked = [row["idempotency_key"] for row in rows]
    return [one for one in picked if one in set(keys)] if keys else picked


async def retry_preview(
    connection: AsyncConnection,
    selection: Sequence[str],
    destination: Callable[[str], str],
    waiting: Mapping[str, Sequence[str]],
) -> dict[str, tuple[str | None, str | None]]:
    """What `retry_effects` would do, changing nothing: the same decisions, on the rows as they are now."""
    return await effects_store.retry_plan(connection, list(selection), destination, waiting, lock=False)


async def retry_effects(
    connection: AsyncConnection,
    selection: Sequence[str],
    kind: str | None,
    reason: str,
    actor: str,
    destination: Callable[[str], str],
    waiting: Mapping[str, Sequence[str]],
) -> dict[str, tuple[str | None, str | None]]:
    """Give failed effects a fresh budget (`destination(kind)`: pending or uncertain); audited. Per key, its
    state before and where it went (None: not retried)."""
    outcomes = await effects_store.retry(connection, list(selection), destination, waiting)
    retried = {one: goes_to for one, (_, goes_to) in outcomes.items() if goes_to}
    await audit.record(
        connection,
        actor,
        "effects.retry",
        {"keys": list(selection), "kind": kind, "reason": reason},
        {"retried": retried, "skipped": len(outcomes) - len(retried)},
    )
    return outcomes


async def reprocess_owners(
    connection: AsyncConnection,
    failure_ids: Sequence[str],
    error_code: str | None,
    since: datetime | None,
    until: datetime | None,
    consumer: str | None,
    owner: str | None = None,
) -> list[tuple[str, str]]:
    """The (consumer name, source topic) pairs a reprocess selection was quarantined under (`consumer`: only it)."""
    found = await reprocess_store.owners(
        connection, failure_ids=tuple(failure_ids), error_code=error_code, since=since, until=until, owner=owner
    )
    return [pair for pair in found if consumer in (None, pair[0])]

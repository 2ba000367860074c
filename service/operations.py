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

from service.store import audit, parking, quarantine
from service.store import effects as effects_store
from service.store import reprocess as reprocess_store

LARGEST_SELECTION = 100_000  # a selection larger than this is refused: narrow it, or work through it in parts


class SelectionTooLarge(Exception):
    """A selection matched more records than an action takes at once."""

    def __init__(self, total: int) -> None:
        super().__init__(f"the selection holds {total} records, more than {LARGEST_SELECTION}: narrow it")
        self.total = total


@dataclass(frozen=True)
class Wanted:
    """What an operator asked for: failure ids, or open records matching code, key and age (or both: the ids
    among the matching ones)."""

    ids: tuple[str, ...] = ()
    error_code: str | None = None
    key: str | None = None
    older_than: timedelta | None = None

    @property
    def selecting(self) -> bool:
        """Whether the filters select records (rather than only naming them)."""
        return self.error_code is not None or self.key is not None or self.older_than is not None

    async def pick(self, connection: AsyncConnection) -> list[str]:
        """The failure ids this selection means, now (SelectionTooLarge when the filters match too many)."""
        if not self.selecting:
            return list(self.ids)
        rows, total = await quarantine.listing(
            connection,
            error_code=self.error_code,
            status="open",
            older_than=self.older_than,
            key=self.key,
            limit=LARGEST_SELECTION,
        )
        if total > LARGEST_SELECTION and not self.ids:
            raise SelectionTooLarge(total)
        picked = [row["failure_id"] for row in rows]
        return [one for one in picked if one in set(self.ids)] if self.ids else picked

    def described(self) -> dict[str, Any]:
        """The selection as the audit keeps it."""
        return {
            "failure_ids": list(self.ids),
            "error_code": self.error_code,
            "key": self.key,
            "older_than_seconds": self.older_than.total_seconds() if self.older_than else None,
        }


async def reveal(
    connection: AsyncConnection, failure_id: str, actor: str, shown_as: Sequence[str], *, via: str = "cli"
) -> dict[str, Any] | None:
    """One quarantined record with its payload, the reveal audited and written to the record's timeline (None:
    no such record, nothing audited)."""
    found = await quarantine.get(connection, failure_id)
    if found is None:
        return None
    await audit.record(
        connection,
        actor,
        "quarantine.reveal",
        {"failure_id": failure_id, "as": list(shown_as), "via": via},
        {"revealed": True},
    )
    await quarantine.log_event(connection, failure_id, "payload revealed", actor, f"as {', '.join(shown_as)}")
    return found


async def annotate(
    connection: AsyncConnection, wanted: Wanted, selection: Sequence[str], actor: str, note: str
) -> list[str]:
    """Append `note` to each selected record; the ids that exist (and got it)."""
    added = [one for one in selection if await quarantine.annotate(connection, one, actor, note)]
    await audit.record(
        connection,
        actor,
        "quarantine.annotate",
        {**wanted.described(), "picked": list(selection)},
        {"annotated": len(added)},
    )
    return added


async def resolve(
    connection: AsyncConnection, wanted: Wanted, selection: Sequence[str], actor: str, reason: str
) -> dict[str, str | None]:
    """Close each selected open record without reprocessing it, freeing the key it held; per id, its previous
    status (`open`: resolved now; None: no such record)."""
    outcomes: dict[str, str | None] = {}
    for one in selection:
        previous = await quarantine.resolve(connection, one, reason, actor)
        if previous == "open":
            await parking.unblock_failures(connection, [one])
        outcomes[one] = previous
    resolved = sum(previous == "open" for previous in outcomes.values())
    await audit.record(
        connection,
        actor,
        "quarantine.resolve",
        {**wanted.described(), "picked": list(selection), "reason": reason},
        {"resolved": resolved},
    )
    return outcomes


@dataclass(frozen=True)
class Release:
    """What releasing a key did: under which consumer, and what held it (None: several consumers hold it)."""

    consumer: str
    released: parking.Released | None


async def release_key(
    connection: AsyncConnection, key: str, consumer: str | None, default_consumer: str, actor: str
) -> Release:
    """Free a held key under the consumer its records are stored with (`consumer` when given); audited. When
    several consumers hold it and none was named, nothing changes (`released` is None, `consumer` names them)."""
    names = [name for name in await parking.holders(connection, key) if consumer in (None, name)]
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


async def failed_effects(connection: AsyncConnection, keys: Sequence[str], kind: str | None) -> list[str]:
    """The effects a retry means: the named keys, or the failed effects of `kind` (among the named, if any)."""
    if kind is None:
        return list(dict.fromkeys(keys))
    rows, _ = await effects_store.listing(connection, ["failed"], kind=kind, limit=LARGEST_SELECTION)
    picked = [row["idempotency_key"] for row in rows]
    return [one for one in picked if one in set(keys)] if keys else picked


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
) -> list[tuple[str, str]]:
    """The (consumer name, source topic) pairs a reprocess selection was quarantined under (`consumer`: only it)."""
    found = await reprocess_store.owners(
        connection, failure_ids=tuple(failure_ids), error_code=error_code, since=since, until=until
    )
    return [pair for pair in found if consumer in (None, pair[0])]

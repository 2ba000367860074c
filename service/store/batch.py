"""A round's rows in ONE statement: inbox rows, new and changed aggregates, effects, quarantine rows, outbox
messages.

Each kind of row is a recordset parameter (service/store/recordset.py) read by its table's fragment, and the
fragments are data-modifying CTEs of one statement: one round trip instead of six, and one wait for the event
loop to come back to this round instead of six (the other round in flight is planning meanwhile). PostgreSQL runs
every data-modifying CTE to completion whether or not the final SELECT reads it.

The inbox rows and the new aggregates are plain inserts, not `ON CONFLICT DO NOTHING`: the round's look-up found
those message ids and aggregates absent, so one that exists now was committed meanwhile by a concurrent consumer,
and the unique violation fails the whole transaction, which the caller redoes (`ConcurrentWrite`): a speculative
insert would cost every row an index probe and a WAL record for a case only a race produces (measured in
docs/performance.md, "Why the hot path is shaped this way").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import TextClause, exc, text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.errors import ConcurrentWrite
from service.store import effects, inbox, lookups, outbox, quarantine
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.quarantine import QuarantineRow
from service.store.recordset import Columns


@dataclass(frozen=True, eq=False)
class AggregateRows:
    """How a domain's aggregates are written in the round's one statement (the aggregate store seam).

    `create` inserts the recordset parameter `created_aggregates`, `update` applies `changed_aggregates`, both
    rows of `columns`; `raced_key` is the constraint whose violation on `create` means a concurrent member
    created the aggregate first (the round is then redone, with it locked). `exists` selects the aggregate whose
    id is `m.id`, by its primary key: the round's look-up (service/store/lookups.py) asks which exist.
    """

    columns: Columns
    create: str
    update: str
    raced_key: str
    exists: str
    statement: TextClause = field(init=False)
    lookup: TextClause = field(init=False)

    def __post_init__(self) -> None:
        statement = text(
            f"""
            WITH inbox_added AS ({inbox.ADD_ROWS}),
                 aggregates_created AS ({self.create}),
                 aggregates_changed AS ({self.update}),
                 effects_added AS ({effects.ADD_ROWS}),
                 quarantined AS ({quarantine.ADD_ROWS}),
                 outbox_added AS ({outbox.ADD_ROWS})
            SELECT 1
            """
        )
        object.__setattr__(self, "statement", statement)
        object.__setattr__(self, "lookup", lookups.statement(self.exists))


async def write(
    connection: AsyncConnection,
    consumer: str,
    aggregates: AggregateRows,
    *,
    inbox_rows: Sequence[InboxRow],
    created: Sequence[Any],
    changed: Sequence[Any],
    new_effects: Sequence[Any],
    quarantined: Sequence[QuarantineRow],
    messages: Sequence[OutboxMessage],
) -> None:
    """Write a round's rows in the caller's transaction; raise `ConcurrentWrite` when another consumer won a race."""
    if not (inbox_rows or created or changed or new_effects or quarantined or messages):
        return
    try:
        await connection.execute(
            aggregates.statement,
            {
                "consumer": consumer,
                "inbox_rows": inbox.COLUMNS.encode(inbox_rows),
                "created_aggregates": aggregates.columns.encode(created),
                "changed_aggregates": aggregates.columns.encode(changed),
                "effect_rows": effects.COLUMNS.encode(new_effects),
                "quarantine_rows": quarantine.COLUMNS.encode(quarantined),
                "outbox_rows": outbox.COLUMNS.encode(messages),
            },
        )
    except exc.IntegrityError as error:
        if _constraint(error) in ("pk_inbox", aggregates.raced_key):
            raise ConcurrentWrite("a message id or an aggregate was written concurrently") from error
        raise


def _constraint(error: exc.IntegrityError) -> str | None:
    """The name of the violated constraint, as the driver (asyncpg, the cause of SQLAlchemy's error) reports it."""
    return getattr(error.orig.__cause__, "constraint_name", None) if error.orig is not None else None

"""A round's rows in ONE statement: inbox rows, new and changed orders, effects, quarantine rows, outbox messages.

Each kind of row is a recordset parameter (service/store/recordset.py) read by its table's fragment, and the
fragments are data-modifying CTEs of one statement: one round trip instead of six, and one wait for the event
loop to come back to this round instead of six (the other round in flight is planning meanwhile). PostgreSQL runs
every data-modifying CTE to completion whether or not the final SELECT reads it; the counts tell the caller
whether a concurrent consumer won a race for a message id or an order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.domain.model import Effect, Order
from service.store import effects, inbox, orders, outbox, quarantine
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.quarantine import QuarantineRow
from service.store.recordset import recordset

_WRITE = text(
    f"""
    WITH inbox_added AS ({inbox.ADD_ROWS}),
         orders_created AS ({orders.CREATE_ROWS}),
         orders_changed AS ({orders.UPDATE_ROWS}),
         effects_added AS ({effects.ADD_ROWS}),
         quarantined AS ({quarantine.ADD_ROWS}),
         outbox_added AS ({outbox.ADD_ROWS})
    SELECT (SELECT count(*) FROM inbox_added), (SELECT count(*) FROM orders_created)
    """
)


@dataclass(frozen=True)
class Written:
    """How many inbox rows and new orders the statement inserted (fewer than given: a concurrent consumer won)."""

    inbox_rows: int
    orders_created: int


async def write(
    connection: AsyncConnection,
    consumer: str,
    *,
    inbox_rows: Sequence[InboxRow],
    created: Sequence[Order],
    changed: Sequence[Order],
    new_effects: Sequence[Effect],
    quarantined: Sequence[QuarantineRow],
    messages: Sequence[OutboxMessage],
) -> Written:
    """Write a round's rows in the caller's transaction."""
    if not (inbox_rows or created or changed or new_effects or quarantined or messages):
        return Written(0, 0)
    result = await connection.execute(
        _WRITE,
        {
            "consumer": consumer,
            "inbox_rows": recordset(inbox_rows),
            "created_orders": recordset(created),
            "changed_orders": recordset(changed),
            "effect_rows": recordset(effects.rows(new_effects)),
            "quarantine_rows": recordset(quarantined),
            "outbox_rows": recordset(messages),
        },
    )
    inserted, created_count = result.one()
    return Written(int(inserted), int(created_count))

"""A round's rows in ONE statement: inbox rows, new and changed orders, effects, quarantine rows, outbox messages.

Each kind of row is a recordset parameter (service/store/recordset.py) read by its table's fragment, and the
fragments are data-modifying CTEs of one statement: one round trip instead of six, and one wait for the event
loop to come back to this round instead of six (the other round in flight is planning meanwhile). PostgreSQL runs
every data-modifying CTE to completion whether or not the final SELECT reads it.

The inbox rows and the new orders are plain inserts, not `ON CONFLICT DO NOTHING`: the round's look-up found
those message ids and orders absent, so one that exists now was committed meanwhile by a concurrent consumer,
and the unique violation fails the whole transaction, which the caller redoes (`ConcurrentWrite`): a speculative
insert would cost every row an index probe and a WAL record for a case only a race produces (measured in
docs/performance.md, "Why the hot path is shaped this way").
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import exc, text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.errors import ConcurrentWrite
from service.orders import store as orders
from service.orders.model import Effect, Order
from service.store import effects, inbox, outbox, quarantine
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.quarantine import QuarantineRow

_WRITE = text(
    f"""
    WITH inbox_added AS ({inbox.ADD_ROWS}),
         orders_created AS ({orders.CREATE_ROWS}),
         orders_changed AS ({orders.UPDATE_ROWS}),
         effects_added AS ({effects.ADD_ROWS}),
         quarantined AS ({quarantine.ADD_ROWS}),
         outbox_added AS ({outbox.ADD_ROWS})
    SELECT 1
    """
)
# The keys a concurrent consumer can take first: a message id (the inbox) and a new order.
_RACED_KEYS = frozenset({"pk_inbox", "pk_orders"})


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
) -> None:
    """Write a round's rows in the caller's transaction; raise `ConcurrentWrite` when another consumer won a race."""
    if not (inbox_rows or created or changed or new_effects or quarantined or messages):
        return
    try:
        await connection.execute(
            _WRITE,
            {
                "consumer": consumer,
                "inbox_rows": inbox.COLUMNS.encode(inbox_rows),
                "created_orders": orders.COLUMNS.encode(created),
                "changed_orders": orders.COLUMNS.encode(changed),
                "effect_rows": effects.COLUMNS.encode(new_effects),
                "quarantine_rows": quarantine.COLUMNS.encode(quarantined),
                "outbox_rows": outbox.COLUMNS.encode(messages),
            },
        )
    except exc.IntegrityError as error:
        if _constraint(error) in _RACED_KEYS:
            raise ConcurrentWrite("a message id or order was written concurrently") from error
        raise


def _constraint(error: exc.IntegrityError) -> str | None:
    """The name of the violated constraint, as the driver (asyncpg, the cause of SQLAlchemy's error) reports it."""
    return getattr(error.orig.__cause__, "constraint_name", None) if error.orig is not None else None

"""A round's write: the one decided value (service/policy/decide.py) applied in the caller's transaction.

The rows come made (service/worker/writes.py); this module only runs the statements, in an order that matters: the
reprocessed records' rows move before the batch writes their inbox rows, and the retry rows go last, after the
records that finish them are terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection

from service.codes import ErrorCode
from service.errors import ConcurrentWrite
from service.policy.decide import RoundWrite
from service.policy.delivery import Delivery
from service.policy.retry import AttemptHistory
from service.store import batch, inbox, parking, quarantine, retries
from service.store.batch import AggregateRows
from service.store.effects import NewEffect
from service.store.inbox import InboxRow
from service.store.outbox import OutboxMessage
from service.store.parking import ParkedRecord
from service.store.quarantine import QuarantineRow, RecordKey
from service.store.retries import RetryRow


@dataclass(slots=True)
class Rows:
    """A round's rows, built once per write and handed to the store."""

    inbox_rows: list[InboxRow] = field(default_factory=list)
    reopened: list[InboxRow] = field(default_factory=list)  # quarantined messages a reprocess applied: moved
    requarantined: list[tuple[Delivery, ErrorCode, AttemptHistory]] = field(default_factory=list)
    messages: list[OutboxMessage] = field(default_factory=list)
    quarantined: list[QuarantineRow] = field(default_factory=list)
    parked: list[ParkedRecord] = field(default_factory=list)
    retrying: list[RetryRow] = field(default_factory=list)
    effects: list[NewEffect] = field(default_factory=list)  # the plan's effects, with their span contexts


async def apply(
    connection: AsyncConnection, consumer: str, member: str, aggregates: AggregateRows, write: RoundWrite[Rows]
) -> None:
    """Write what the round decided, in the caller's open transaction (`member`: who claims parked records;
    `aggregates`: how the domain's aggregates are written). Raises `ConcurrentWrite` when a concurrent writer moved
    a row the decision read."""
    plan, rows, c = write.plan, write.rows, connection
    reopened = await inbox.reopen(c, consumer, rows.reopened)
    if len(reopened) != len(rows.reopened):
        raise ConcurrentWrite("a quarantined message was moved concurrently")
    await quarantine.mark_reprocessed(c, consumer, plan.reprocessed)
    await parking.unblock_failures(c, consumer, plan.reprocessed)
    for again, failed_code, history in rows.requarantined:
        await quarantine.requarantine(
            c, RecordKey(consumer, again.origin.failure_id), failed_code.value, history.attempts, history.last_failed_at
        )
    await batch.write(
        c,
        consumer,
        aggregates,
        inbox_rows=rows.inbox_rows,
        created=plan.created,
        changed=plan.changed,
        new_effects=rows.effects,
        quarantined=rows.quarantined,
        messages=rows.messages,
    )
    await parking.park(c, consumer, rows.parked)
    await parking.unpark(c, plan.unparked)
    await parking.unclaim(c, member, plan.unclaimed)
    await parking.block(c, consumer, plan.blocks)
    await retries.upsert(c, consumer, rows.retrying)
    if rows.retrying:
        # A member that lost the partition while it wrote may hand over a record the new owner has already
        # finished: no retry row may outlive its record's terminal state.
        await retries.drop_finished(c, consumer, [row.message_id for row in rows.retrying])
    await retries.finish(c, consumer, plan.finished)

"""Edit and retry: an operator corrects a quarantined record's payload or headers, and the corrected copy goes back
once, as a reprocess run's copy does (service/worker/reprocess.py `copy_of`), under the record's original message id.

The CLI and the console both call these functions. An edit is checked with the consumer's own decoding before
anything is written (a payload the consumer would quarantine again is refused, with the reason); it is kept with
its diff in `quarantine_edits`, audited and written to the record's timeline, in the transaction that puts its copy
in the outbox. The quarantine row keeps the original bytes. Because the copy carries the original message id, the
inbox applies the message once, whichever comes first: the edit, a second send of it, or a reprocess of the
original. With approvals on (<PREFIX>CONSOLE_EDIT_APPROVAL), an edit waits until another operator approves it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.config import Settings
from service.policy.edits import EditRefused, HeaderChanges, Verdict, diff, judge
from service.policy.headers import from_json, to_json
from service.store import audit, outbox, quarantine, quarantine_reads
from service.store import edits as store
from service.store.quarantine import RecordKey
from service.store.reprocess import Candidate, copy_of

# The reprocess topic of a source topic (the consumer's `<source>.reprocess`): where an edit's copy goes.
TopicOf = Callable[[str], str]


def reprocess_topic_of(settings: Settings) -> TopicOf:
    """The reprocess topic of a record's source topic, named as `settings` name it for that source."""
    return lambda source: settings.model_copy(update={"source_topic": source}).topics.reprocess


@dataclass(frozen=True)
class Checking:
    """How an edit is checked: the domain's decoding, and its finder of an invalid payload's first bad field."""

    decode: Callable[[bytes | None], Any]
    failing_field: Callable[[bytes | None], tuple[str, str] | None]


@dataclass(frozen=True)
class Proposed:
    """What an edit did, or (`state` `dry_run`) would do: its id, state, diff and the domain's verdict."""

    record: RecordKey
    edit_id: int | None
    state: str  # dry_run, pending_approval or sent
    diff: str
    verdict: Verdict


async def propose(
    connection: AsyncConnection,
    record: RecordKey,
    *,
    payload: bytes | None,
    changes: HeaderChanges,
    actor: str,
    checking: Checking,
    approval: bool,
    topic_of: TopicOf,
    dry_run: bool = False,
) -> Proposed:
    """Check an edit of one open record and (unless `dry_run`) keep it: sent now, or pending a second operator's
    approval when `approval`. EditRefused (nothing written) when the record cannot be edited or the edit is not
    valid; a dry run returns an invalid verdict instead of refusing it, so that it can be shown."""
    candidate = await _editable(connection, record)
    under_way = await store.under_way(connection, record)
    if under_way is not None:
        edit_id, state = under_way
        said = "waits for approval" if state == "pending_approval" else "was sent and has not failed again"
        raise EditRefused(f"edit {edit_id} of {record.failure_id} {said}: one edit at a time")
    headers_before = from_json(candidate.source_headers)
    headers_after = changes.apply(headers_before)
    payload_after = candidate.payload if payload is None else payload
    assert payload_after is not None  # `_editable` refuses a record without its bytes
    if payload_after == candidate.payload and headers_after == headers_before:
        raise EditRefused("the edit changes nothing: give a corrected payload or header")
    said = diff(candidate.payload, payload_after, headers_before, headers_after)
    verdict = judge(payload_after, checking.decode, checking.failing_field)
    if dry_run:
        return Proposed(record, None, "dry_run", said, verdict)
    if not verdict.valid:
        raise EditRefused(f"the edited payload {verdict.reason()}: nothing sent")
    state = "pending_approval" if approval else "sent"
    edit_id = await store.add(
        connection,
        record,
        actor=actor,
        state=state,
        payload_before=candidate.payload,
        payload_after=payload_after,
        headers_before=candidate.source_headers,
        headers_after=to_json(headers_after),
        diff=said,
        repeat_failures=candidate.repeat_failures,
    )
    await quarantine.log_event(connection, record, "edited", actor, f"edit {edit_id}, {state.replace('_', ' ')}")
    await _audit(connection, actor, "quarantine.edit", record, edit_id, state)
    if state == "sent":
        await _send(connection, candidate, edit_id, payload_after, to_json(headers_after), topic_of)
    return Proposed(record, edit_id, state, said, verdict)


async def decide(
    connection: AsyncConnection, edit_id: int, *, approve: bool, actor: str, topic_of: TopicOf
) -> dict[str, Any]:
    """Approve (send) or reject an edit that waits for approval; its row as it is now. The author may reject
    (withdraw) their own edit, never approve it."""
    seen = await store.get(connection, edit_id)
    if seen is None:
        raise EditRefused(f"no edit {edit_id}")
    # The record's row first, then the edit's: the order an erasure or a resolve takes them in (no deadlock).
    await quarantine.lock_status(connection, RecordKey(seen["consumer_name"], seen["failure_id"]))
    edit = await store.get(connection, edit_id, lock=True)
    if edit is None:  # purged with its record meanwhile
        raise EditRefused(f"no edit {edit_id}")
    if edit["state"] != "pending_approval":
        raise EditRefused(f"edit {edit_id} is {edit['state']}, not pending approval")
    if approve and edit["actor"] == actor:
        raise EditRefused(f"edit {edit_id} is {actor}'s own: another operator approves it")
    record = RecordKey(edit["consumer_name"], edit["failure_id"])
    state = "sent" if approve else "rejected"
    if approve:
        candidate = await _editable(connection, record)
        await _send(connection, candidate, edit_id, bytes(edit["payload_after"]), list(edit["headers_after"]), topic_of)
    await store.decide(connection, edit_id, state, actor)
    await quarantine.log_event(
        connection, record, "edit approved" if approve else "edit rejected", actor, f"edit {edit_id}"
    )
    await _audit(
        connection, actor, "quarantine.approve_edit" if approve else "quarantine.reject_edit", record, edit_id, state
    )
    found = await store.get(connection, edit_id)
    assert found is not None
    return found


async def _editable(connection: AsyncConnection, record: RecordKey) -> Candidate:
    """The record as a copy is made of it, its row locked until the transaction ends: EditRefused unless it is
    open and still holds its original bytes."""
    status = await quarantine.lock_status(connection, record)
    if status is None:
        raise EditRefused(f"no quarantined record with failure id {record.failure_id} under {record.consumer_name}")
    if status != "open":
        raise EditRefused(f"{record.failure_id} is {status}, not open: nothing to edit")
    row = await quarantine_reads.get(connection, record)
    assert row is not None
    if row["payload"] is None:
        raise EditRefused(f"{record.failure_id} holds no payload (erased, or never stored): nothing to edit")
    return Candidate(
        consumer_name=record.consumer_name,
        failure_id=record.failure_id,
        message_id=row["message_id"],
        ordering_key=row["ordering_key"],
        error_code=row["error_code"],
        status=status,
        payload=bytes(row["payload"]),
        source_headers=list(row["source_headers"]),
        envelope=dict(row["envelope"]),
        repeat_failures=row["repeat_failures"],
        trace_context=await quarantine.trace_context_of(connection, record),
    )


async def _send(
    connection: AsyncConnection,
    candidate: Candidate,
    edit_id: int,
    payload: bytes,
    headers: list[list[str]],
    topic_of: TopicOf,
) -> None:
    """The edit's copy into the outbox, for the record's consumer on its source's reprocess topic."""
    topic = topic_of(str(candidate.envelope.get("source", {}).get("topic", "")))
    copy = copy_of(
        candidate,
        topic,
        sender=("reprocess-edit-id", str(edit_id)),
        attempt=1,
        payload=payload,
        headers=from_json(headers),
    )
    await outbox.add(connection, [copy])


async def _audit(
    connection: AsyncConnection, actor: str, action: str, record: RecordKey, edit_id: int, state: str
) -> None:
    await audit.record(
        connection,
        actor,
        action,
        {"consumer": record.consumer_name, "failure_id": record.failure_id, "edit_id": edit_id},
        {"state": state},
    )

"""The round's shell (service/worker/processor.py) driven by a fake round store and a tiny domain of things: what it
writes, once, and what a failure of a look-up or of a write does to the round. No database, no Kafka."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from service.adapters.breakers import Breakers
from service.codes import ErrorCode
from service.errors import RecordFailure
from service.policy.breaker import Outcome, State, Verdict
from service.policy.classify import Failure
from service.policy.decide import RoundWrite
from service.store.round_write import Rows
from service.worker.middleware import FaultPoints, classified, faulty_write, timed
from tests.support.rounds import FakeRounds, Things, processor, record


async def _attempt(store: FakeRounds, *values: bytes, handler: Things | None = None, **options: Any) -> Any:
    """One round of records at offsets 0, 1, … (one key each unless the value says otherwise)."""
    shell = processor(store, handler, **options)
    due = [shell.pending(record(offset, value, key=f"K{offset}")) for offset, value in enumerate(values)]
    return await shell.attempt_round({delivery: delivery.arrival for delivery in due}, asyncio.Event())


async def test_a_record_is_applied_once_in_one_committed_write() -> None:
    # Given an empty store
    store = FakeRounds()

    # When a round attempts one creation
    attempted = await _attempt(store, b"create:T-1")

    # Then it left, one transaction committed its inbox row, its thing and its event
    assert len(attempted.left) == 1
    assert not attempted.retry
    assert (store.transactions, store.written()) == (1, [("m0", "apply")])
    assert store.inbox == {"m0": "processed"}
    assert store.things["T-1"].version == 1
    [write] = store.committed
    assert [message.topic for message in write.rows.messages] == ["things.events"]


async def test_a_duplicate_leaves_and_writes_no_second_inbox_row_or_change() -> None:
    # Given a store in which the message was processed already
    store = FakeRounds()
    await _attempt(store, b"create:T-1")

    # When the same message comes again
    attempted = await _attempt(store, b"create:T-1")

    # Then it left as a duplicate, with nothing written but the step
    assert len(attempted.left) == 1
    assert store.written() == [("m0", "apply"), ("m0", "duplicate")]
    duplicate = store.committed[-1]
    assert (duplicate.rows.inbox_rows, duplicate.rows.messages, duplicate.plan.created) == ([], [], ())


async def test_input_that_does_not_decode_is_quarantined_at_once() -> None:
    store = FakeRounds()

    attempted = await _attempt(store, b"not a thing")

    assert len(attempted.left) == 1
    assert not attempted.retry
    assert store.written() == [("m0", "quarantine")]
    [quarantined] = store.committed[0].rows.quarantined
    assert (quarantined.error_code, quarantined.owner) == ("MALFORMED_PAYLOAD", "producers")
    assert store.inbox == {"m0": "quarantined"}


async def test_a_failed_look_up_leaves_a_retry_state_and_writes_nothing() -> None:
    # Given a directory that is unavailable
    async def unavailable(key: str) -> Any:
        raise RecordFailure(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream="directory")

    store = FakeRounds()

    # When a creation that needs it is attempted
    attempted = await _attempt(store, b"create:T-1", handler=Things(unavailable))

    # Then it stays, with its failure in its retry state, and no transaction was opened
    assert not attempted.left
    [state] = attempted.retry.values()
    assert state.last_code is ErrorCode.DOWNSTREAM_UNAVAILABLE
    assert state.history.attempts == 1
    assert (store.transactions, store.inbox) == (0, {})


async def test_the_failures_of_a_round_whose_look_ups_open_the_breaker_spend_no_record_attempt() -> None:
    # Given a directory in an outage, behind its breaker (5 failed calls of 2+ keys open it): the first 4 answers
    # of the run are charged by the breaker, the 5th opens it
    breakers = Breakers()
    guard = breakers["directory"]

    async def outage(key: str) -> Any:
        ticket = guard.admit(key)
        if ticket is None:
            raise RecordFailure(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream="directory", charged=False)
        charged = guard.record(ticket, Outcome(Verdict.FAILED, ErrorCode.DOWNSTREAM_UNAVAILABLE, target=key))
        raise RecordFailure(ErrorCode.DOWNSTREAM_UNAVAILABLE, downstream="directory", charged=charged)

    store = FakeRounds()

    # When one round's eight creations all need it
    creations = [f"create:T-{n}".encode() for n in range(8)]
    attempted = await _attempt(store, *creations, handler=Things(outage), breakers=breakers)

    # Then the breaker opened, and none of them spent an attempt: they wait for it (an outage is no record's failure;
    # else each member's opening run would charge a record again, and a record moving between members pays each time)
    assert guard.breaker.state is State.OPEN
    assert len(attempted.retry) == 8
    assert [state.history.attempts for state in attempted.retry.values()] == [0] * 8
    assert all(state.breaker == "directory" for state in attempted.retry.values())


async def test_a_look_up_that_outlasts_the_processing_timeout_fails_with_processing_timeout() -> None:
    # Given a directory that never answers
    async def never(key: str) -> Any:
        await asyncio.Event().wait()

    store = FakeRounds()

    # When a creation that needs it is attempted with a short processing timeout
    attempted = await _attempt(store, b"create:T-1", handler=Things(never), timeout=timedelta(milliseconds=10))

    # Then it failed with PROCESSING_TIMEOUT, and nothing was written
    [state] = attempted.retry.values()
    assert state.last_code is ErrorCode.PROCESSING_TIMEOUT
    assert store.transactions == 0


async def test_a_record_whose_write_fails_does_not_fail_its_neighbours() -> None:
    # Given a store that refuses any write holding the record at offset 1
    store = FakeRounds(refuse=lambda write: any(step.delivery.message_id == "m1" for step in write.plan.steps))

    # When a round attempts three records of three keys
    attempted = await _attempt(store, b"create:A", b"create:B", b"create:C")

    # Then the round was written one record at a time: the other two left, the refused one is retried
    assert sorted(d.message_id for d in attempted.left) == ["m0", "m2"]
    assert store.written() == [("m0", "apply"), ("m2", "apply")]
    [(failed, state)] = attempted.retry.items()
    assert failed.message_id == "m1"
    assert state.last_code is ErrorCode.UNEXPECTED_ERROR


async def test_a_quarantine_whose_write_fails_is_quarantined_by_the_last_resort() -> None:
    # Given a store that refuses every ordinary quarantine write
    store = FakeRounds(refuse=lambda write: bool(write.rows.quarantined) and not write.last_resort)

    # When a record that does not decode is attempted
    attempted = await _attempt(store, b"not a thing")

    # Then it left through the last resort, whose row keeps nothing taken from the record as text
    assert len(attempted.left) == 1
    assert not attempted.retry
    assert store.written() == [("m0", "last_resort")]
    [quarantined] = store.committed[0].rows.quarantined
    assert quarantined.ordering_key is None
    assert quarantined.envelope["lastResort"] is True


async def test_the_armed_quarantine_write_fault_sends_the_record_the_last_resort_way() -> None:
    store = FakeRounds()

    attempted = await _attempt(store, b"not a thing", faults=FaultPoints(fail_at="quarantine-write"))

    assert len(attempted.left) == 1
    assert store.written() == [("m0", "last_resort")]


async def test_a_look_up_wrapped_in_its_middleware_returns_each_failure_as_its_code() -> None:
    async def raising(error: BaseException) -> Any:
        raise error

    async def look_up(key: str) -> Any:
        return await raising({"t": TimeoutError(), "r": RecordFailure(ErrorCode.RATE_LIMITED), "x": KeyError()}[key])

    call = classified("directory")(timed(5)(look_up))

    answers = [await call(key) for key in ("t", "r", "x")]

    assert answers == [
        Failure(ErrorCode.PROCESSING_TIMEOUT, downstream="directory"),
        Failure(ErrorCode.RATE_LIMITED),
        Failure(ErrorCode.UNEXPECTED_ERROR),
    ]


async def test_unarmed_fault_points_leave_the_write_as_it_is() -> None:
    async def apply(write: RoundWrite[Rows]) -> None:
        pass

    assert faulty_write(FaultPoints())(apply) is apply

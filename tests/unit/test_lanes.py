"""The lanes of fetched records: which records a round may take, and how far a partition may be committed when
rounds overlap and finish in any order. No Kafka, no database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dependency_injector import providers
from hypothesis import given
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.config import Topics
from service.containers import Container
from service.orders.domain import DOMAIN
from service.orders.messages import decode
from service.orders.settings import OrderSettings
from service.policy.delivery import Delivery, RetryState
from service.policy.records import SourceRecord
from service.policy.redelivery import tier_headers
from service.policy.retry import AttemptHistory
from service.worker.lanes import Lanes
from service.worker.processor import Processor

TOPIC = "orders"
LANE = (TOPIC, 0)


def _pending(offset: int, key: str, topic: str = TOPIC) -> Delivery:
    record = SourceRecord(topic, 0, offset, 0, key.encode(), b"{}", ((("message-id", f"{key}.{offset}".encode())),))
    return Delivery(record, decode(record.value), record.coordinates, 0)


def _ids(round_: Iterable[Delivery]) -> set[str]:
    """What the consumer loop tells `take` about a round in flight: its message ids, aggregates and keys."""
    return {i for p in round_ for i in (p.message_id, p.aggregate_id, p.key) if i is not None}


def _offsets(records: Iterable[Delivery]) -> list[int]:
    return [p.record.offset for p in records]


def test_a_later_round_that_settles_first_commits_nothing_past_the_earlier_one_then_everything() -> None:
    # Given six records of six keys in one lane, taken by two overlapping rounds of four and two
    lanes = Lanes(round_size=4, bound=12)
    lanes.add(LANE, [_pending(n, f"K{n}") for n in range(6)])
    first = lanes.take(0.0, []).due
    second = lanes.take(0.0, [_ids(first)]).due
    assert (_offsets(first), _offsets(second)) == ([0, 1, 2, 3], [4, 5])

    # When the later round settles first, then the earlier one
    after_second = lanes.settle(second, set(second))
    after_first = lanes.settle(first, set(first))

    # Then the partition may first be committed only up to the earlier round's first record, then past the last
    assert (after_second, after_first) == ({LANE: 0}, {LANE: 6})
    assert lanes.held() == 0


def test_a_record_that_is_not_terminal_holds_the_commit_position_and_is_taken_again() -> None:
    # Given a round of four records, of which the third did not reach a terminal state
    lanes = Lanes(round_size=4, bound=12)
    lanes.add(LANE, [_pending(n, f"K{n}") for n in range(4)])
    taken = lanes.take(0.0, []).due

    # When the round settles
    position = lanes.settle(taken, {p for p in taken if p.record.offset != 2})

    # Then the position stops at that record, which is the only one left and is taken by the next round
    assert position == {LANE: 2}
    assert _offsets(lanes.take(0.0, []).due) == [2]


def test_a_round_that_settles_after_its_partition_was_revoked_and_assigned_again_moves_no_offset() -> None:
    # Given a round of four records in flight, of which the third will not be terminal
    lanes = Lanes(round_size=4, bound=12)
    lanes.add(LANE, [_pending(n, f"K{n}") for n in range(4)])
    old = lanes.take(0.0, []).due

    # When the partition is revoked and assigned back, the first two records are fetched again, and the old round
    # settles before a new one takes them
    lanes.forget([LANE])
    lanes.add(LANE, [_pending(n, f"K{n}") for n in range(2)])
    stale = lanes.settle(old, {p for p in old if p.record.offset != 2})
    new = lanes.take(0.0, []).due
    fresh = lanes.settle(new, set(new))

    # Then the old round moves nothing, and the new one only past what it applied
    assert (stale, fresh) == ({}, {LANE: 2})


def test_records_of_a_key_that_a_round_in_flight_writes_wait_for_it() -> None:
    # Given a round in flight with the records of keys A and B
    lanes = Lanes(round_size=2, bound=6)
    lanes.add(LANE, [_pending(0, "A"), _pending(1, "B")])
    first = lanes.take(0.0, []).due

    # When more records arrive: another of key A, then one of key C, then a second one of key A
    lanes.add(LANE, [_pending(2, "A"), _pending(3, "C"), _pending(4, "A")])

    # Then only key C may go into a second round while the first is in flight
    assert _offsets(lanes.take(0.0, [_ids(first)]).due) == [3]


def test_a_record_not_due_yet_holds_back_its_key_but_not_the_other_keys() -> None:
    # Given a lane whose first record of key A waits for a blocking retry at t=5
    lanes = Lanes(round_size=10, bound=30)
    record = SourceRecord(TOPIC, 0, 0, 0, b"A", b"{}")
    waiting = Delivery(record, decode(record.value), record.coordinates, 0, arrival=RetryState(due=5.0))
    lanes.add(LANE, [waiting, _pending(1, "B"), _pending(2, "A")])

    # When a round is taken at t=1 and settles, and the next at t=5
    early = lanes.take(1.0, []).due
    lanes.settle(early, set(early))
    next_due = lanes.next_due(1.0)
    later = lanes.take(5.0, []).due

    # Then at t=1 only key B goes, the next due time is t=5, and then both of key A go, in order
    assert (_offsets(early), next_due, _offsets(later)) == ([1], 5.0, [0, 2])


def test_a_lane_stalls_its_partition_when_it_holds_all_but_a_rounds_worth() -> None:
    # Given rounds of two and room for six records, so a lane may hold four
    lanes = Lanes(round_size=2, bound=6)
    lanes.add(LANE, [_pending(n, f"K{n}") for n in range(3)])
    lanes.add(("orders", 1), [_pending(n, f"P{n}") for n in range(4)])
    lanes.add(("(parked)/K9", -1), [_pending(n, "K9") for n in range(5)])

    # Then only the partition whose lane is full stalls (a parked key's lane is no partition), and the fetcher
    # has no room left
    assert lanes.stalled(0.0) == {("orders", 1)}
    assert (lanes.held(), lanes.room()) == (12, -6)
    assert lanes.parked_keys() == {"K9"}


def test_a_record_waiting_for_a_breaker_keeps_its_partition_fetching_and_is_due_when_the_breaker_closes() -> None:
    # Given a round whose record waits for the customers' breaker until t=10, and another record waiting on another
    lanes = Lanes(round_size=2, bound=12)
    record, other = _pending(0, "A"), _pending(1, "B")
    lanes.add(LANE, [record, other])
    taken = lanes.take(0.0, []).due
    lanes.settle(
        taken, set(), {record: RetryState(due=10.0, breaker="customers"), other: RetryState(due=10.0, breaker="stock")}
    )

    # Then its partition keeps fetching (records that need no customer flow meanwhile), and nothing is due before t=10
    assert lanes.stalled(0.0) == set()
    assert (lanes.take(5.0, []).due, lanes.next_due(0.0)) == ({}, 10.0)

    # When the customers' breaker closes, Then its records are due at once, and the other breaker's still wait
    assert lanes.wake("customers") == 1
    assert list(lanes.take(5.0, []).due) == [record]


def test_only_a_retry_tier_lane_stalls_behind_a_head_that_is_not_due_whatever_the_topic_names() -> None:
    # Given a source topic whose name holds ".retry.", whose head waits for a blocking retry at t=10, and its own
    # retry tier's lane, whose head (a tier copy) is due at t=10 too
    lanes = Lanes(round_size=2, bound=12)
    source = ("shop.retry.orders", 0)
    failing = _pending(0, "A", topic=source[0])
    lanes.add(source, [failing])
    lanes.settle(lanes.take(0.0, []).due, set(), {failing: RetryState(due=10.0)})
    tier = ("shop.retry.orders.retry.30s", 0)
    record = SourceRecord(tier[0], 0, 0, 0, b"B", b"{}", (("message-id", b"B.0"),))
    copy = Delivery(record, decode(record.value), record.coordinates, 0, arrival=RetryState(due=10.0), in_tier=True)
    lanes.add(tier, [copy])

    # When the consumer asks which partitions must not fetch at t=5
    stalled = lanes.stalled(5.0)

    # Then only the tier's: records behind a tier's head are due later still, while the source partition's next
    # records (other keys) may be applied meanwhile
    assert stalled == {tier}
    assert lanes.stalled(10.0) == set()


async def test_a_record_read_from_a_retry_tier_is_a_tier_copy_and_one_from_the_source_is_not() -> None:
    # Given a processor whose source topic's name holds ".retry.", a record of that topic, and a copy of it on the
    # topic's 30 s tier, due in an hour
    processor = _processor("shop.retry.orders")
    processor_name = "order-service"  # the default consumer name, which `_processor` keeps
    topics = Topics("shop.retry.orders")
    original = SourceRecord(topics.source, 0, 7, 0, b"A", b"{}", (("message-id", b"A.7"),))
    now = datetime.now(UTC)
    headers = tier_headers(
        original,
        "A.7",
        original.coordinates,
        0,
        AttemptHistory.first(now),
        now + timedelta(hours=1),
        ErrorCode.DOWNSTREAM_TIMEOUT,
        consumer=processor_name,
    )
    copy = SourceRecord(topics.retry("30s"), 0, 0, 0, b"A", b"{}", tuple(headers))

    # When the consumer loop turns both into deliveries, in their lanes
    delivered, copied = processor.pending(original), processor.pending(copy)
    lanes = Lanes(round_size=2, bound=12)
    lanes.add((original.topic, 0), [delivered])
    lanes.add((copy.topic, 0), [copied])

    # Then only the copy is a tier copy, and only its partition waits for it to be due
    assert (delivered.in_tier, copied.in_tier) == (False, True)
    assert lanes.stalled(asyncio.get_running_loop().time()) == {(copy.topic, 0)}


def _processor(source_topic: str) -> Processor:
    """The container's processor, with no database or HTTP client behind it (`pending` needs neither)."""
    settings = OrderSettings(
        database_url="postgresql+asyncpg://nobody@127.0.0.1/none",
        kafka_bootstrap_servers="127.0.0.1:1",
        source_topic=source_topic,
    )
    container = Container(settings=settings, domain=DOMAIN)
    container.engine.override(providers.Object(None))
    container.http.override(providers.Object(None))
    processor: Processor = container.processor()
    return processor


def test_a_failed_delivery_keeps_its_retry_state_in_the_lanes_until_it_leaves() -> None:
    # Given a round of one record that fails and must wait until t=3
    lanes = Lanes(round_size=2, bound=6)
    record = _pending(0, "A")
    lanes.add(LANE, [record])
    first = lanes.take(0.0, []).due
    retried = RetryState(due=3.0)
    lanes.settle(first, set(), {record: retried})

    # Then the lanes hand it out again only when it is due, with that state; the delivery itself is unchanged
    assert (first, lanes.take(2.9, []).due, lanes.next_due(0.0)) == ({record: RetryState()}, {}, 3.0)
    again = lanes.take(3.0, []).due
    assert again == {record: retried}

    # And when it leaves, its state goes with it
    lanes.settle(again, {record})
    assert (lanes.state(record), lanes.held(), lanes.next_due(0.0)) == (RetryState(), 0, None)


def test_a_round_that_settles_after_its_lane_was_forgotten_keeps_no_retry_state_for_it() -> None:
    # Given a round in flight whose lane is revoked before it settles with a failure
    lanes = Lanes(round_size=2, bound=6)
    record = _pending(0, "A")
    lanes.add(LANE, [record])
    taken = lanes.take(0.0, []).due
    lanes.forget([LANE])

    # When the round settles
    lanes.settle(taken, set(), {record: RetryState(due=9.0, breaker="customers")})

    # Then nothing of it stays: no state, no due time, no stalled partition
    assert (lanes.state(record), lanes.next_due(0.0), lanes.stalled(0.0)) == (RetryState(), None, set())


_SHIPPED = b'{"schema": "order.shipped.v1", "order_id": "%s", "carrier": "c", "tracking_number": "t"}'


def _record(partition: int, offset: int, key: str | None, order: str | None, message_id: str) -> Delivery:
    """A record of `key` (None: none) about `order` (None: a value that does not decode, so no aggregate)."""
    value = _SHIPPED % order.encode() if order is not None else b"{}"
    headers = (("message-id", message_id.encode()),)
    record = SourceRecord(TOPIC, partition, offset, 0, key.encode() if key is not None else None, value, headers)
    return Delivery(record, decode(record.value), record.coordinates, 0)


def _looked_up_one_by_one(
    lanes: dict[tuple[str, int], list[Delivery]],
    left: set[Delivery],
    in_flight: set[Delivery],
    states: dict[Delivery, RetryState],
    frozen: tuple[str, int] | None,
    now: float,
    busy: list[set[str]],
    size: int,
) -> list[Delivery]:
    """What a round may take, by the rule itself: in lane order, skipping a frozen lane, each record still in its
    lane and not in flight is taken unless it is not due yet, one of its message id, aggregate and key is written
    by a round in flight, or an earlier record of its thread (its key, else itself) in its lane waits."""
    taken: list[Delivery] = []
    for lane, records in lanes.items():
        if lane == frozen:
            continue
        waiting: set[tuple[str, int, str]] = set()
        for delivery in records:
            if delivery in left or delivery in in_flight:
                continue
            ids = {delivery.message_id, delivery.aggregate_id, delivery.key}
            due = states.get(delivery, RetryState()).due
            if due > now or any(ids & round_ for round_ in busy) or delivery.thread in waiting:
                waiting.add(delivery.thread)
                continue
            taken.append(delivery)
            if len(taken) == size:
                return taken
    return taken


@given(data=st.data())
def test_a_round_takes_what_looking_up_each_record_in_each_round_in_flight_would_take(data: st.DataObject) -> None:
    # Given two partitions' lanes of records of a few keys (or none), orders (or values that do not decode) and
    # message ids, some of them repeated; a first round that settled with some records left and others back to
    # wait with retry states, a second round in flight, perhaps a frozen lane, and rounds in flight whose ids
    # overlap the records at random
    keys = st.sampled_from([None, None, "A", "B", "C"])
    orders = st.sampled_from([None, None, "o1", "o2", "A"])
    message_ids = st.sampled_from([f"m{n}" for n in range(8)])
    size = data.draw(st.integers(1, 6), label="round size")
    lanes = Lanes(round_size=size, bound=1_000)
    model: dict[tuple[str, int], list[Delivery]] = {}
    for partition in (0, 1):
        rows = data.draw(st.lists(st.tuples(keys, orders, message_ids), max_size=12), label=f"partition {partition}")
        records = [_record(partition, n, key, order, mid) for n, (key, order, mid) in enumerate(rows)]
        lanes.add((TOPIC, partition), records)
        model[(TOPIC, partition)] = records
    first = list(lanes.take(1.0, []).due)
    left = set(data.draw(st.lists(st.sampled_from(first), unique=True), label="left")) if first else set()
    states = {
        delivery: RetryState(due=data.draw(st.sampled_from([0.5, 5.0]), label="due"))
        for delivery in first
        if delivery not in left and data.draw(st.booleans(), label="retried")
    }
    lanes.settle(first, left, states)
    second = list(lanes.take(1.0, []).due)
    assert second == _looked_up_one_by_one(model, left, set(), states, None, 1.0, [], size)
    in_flight = set(second)
    frozen = data.draw(st.sampled_from([None, (TOPIC, 0), (TOPIC, 1)]), label="frozen")
    if frozen is not None:
        lanes.freeze([frozen])
    everything = {i for records in model.values() for d in records for i in (d.message_id, d.aggregate_id, d.key)}
    pool = sorted((everything - {None}) | {"elsewhere"})
    busy = data.draw(st.lists(st.sets(st.sampled_from(pool)), max_size=3), label="rounds in flight")

    # When the next round is taken
    taken = lanes.take(1.0, busy)

    # Then it holds what the record-by-record rule gives, in the same order, with their retry states, and its ids
    # are their message ids, aggregates and keys
    expected = _looked_up_one_by_one(model, left, in_flight, states, frozen, 1.0, busy, size)
    assert list(taken.due) == expected
    assert taken.due == {delivery: states.get(delivery, RetryState()) for delivery in expected}
    assert taken.ids == {i for d in expected for i in (d.message_id, d.aggregate_id, d.key) if i is not None}


def test_importing_the_lanes_loads_neither_the_processor_nor_structlog() -> None:
    # The lanes are plain data structures over immutable deliveries: no logging, no database, no Kafka.
    code = (
        "import sys, service.worker.lanes; "
        "heavy = ('structlog', 'service.worker.processor', 'sqlalchemy', 'aiokafka'); "
        "loaded = [m for m in heavy if m in sys.modules]; "
        "assert not loaded, loaded"
    )

    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])

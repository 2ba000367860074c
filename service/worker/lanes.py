"""The consumer's lanes: fetched records waiting in order until they are terminal, which of them a round may
attempt now, and how far each partition may be committed.

No Kafka and no database here. The consumer loop fetches into the lanes, starts rounds of what `take` hands
out, and after each round asks `settle` which offsets it may commit: never past a record that is not terminal,
whatever order overlapping rounds finish in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

from service.policy.delivery import FRESH, PARKED_TOPIC, Delivery, RetryState

Lane = tuple[str, int]  # a (topic, partition), or the parked records of one key (partition -1)


class Taken(NamedTuple):
    """What `take` hands a round: its deliveries with their retry states, in lane order, and `round_ids` of them."""

    due: dict[Delivery, RetryState]
    ids: set[str]


class Lanes:
    """Deliveries fetched (or unparked) and not yet terminal, per lane, in order, with their retry states.

    A delivery is an immutable value; what changes from round to round is its `RetryState`, which the lanes
    hold (only for the deliveries whose state is not `FRESH`) and replace when a round settles.
    """

    def __init__(self, round_size: int, bound: int) -> None:
        self._round_size = round_size  # a round attempts at most this many records
        self._bound = bound  # records held in all lanes, at most
        self._lanes: dict[Lane, deque[Delivery]] = {}
        self._states: dict[Delivery, RetryState] = {}  # deliveries in the lanes whose state is not FRESH
        self._in_flight: set[Delivery] = set()  # taken by a round that has not settled yet
        self._done: dict[Lane, int] = {}  # per partition: the offset after the highest record that left
        self._frozen: set[Lane] = set()  # revoked, being handed over: no new round takes from them

    def add(self, lane: Lane, records: Sequence[Delivery]) -> None:
        """Append deliveries to the end of their lane, each in the retry state it arrived with."""
        self._lanes.setdefault(lane, deque()).extend(records)
        for delivery in records:
            if delivery.arrival is not FRESH:
                self._states[delivery] = delivery.arrival

    def held(self) -> int:
        """How many records the lanes hold."""
        return sum(map(len, self._lanes.values()))

    def waiting(self) -> int:
        """How many records the lanes hold that no round has taken (some may not be due yet)."""
        return self.held() - len(self._in_flight)

    def room(self) -> int:
        """How many more records may be fetched before the bound."""
        return self._bound - self.held()

    def head(self, lane: Lane) -> Delivery | None:
        """The first record of a lane, if it holds any."""
        records = self._lanes.get(lane)
        return records[0] if records else None

    def state(self, delivery: Delivery) -> RetryState:
        """The delivery's retry state now."""
        return self._states.get(delivery, FRESH)

    def parked_keys(self) -> set[str]:
        """The keys whose parked records are in memory already."""
        return {lane[0].removeprefix(f"{PARKED_TOPIC}/") for lane in self._lanes if lane[1] < 0}

    def take(self, now: float, busy: Sequence[Collection[str]]) -> Taken:
        """Up to a round's worth of deliveries that may be attempted now, with their retry states, in lane order;
        in flight until `settle`. Due, not in a round already, with no earlier record of their key still waiting,
        and sharing no message id, aggregate or key with a record that a round in flight writes (`busy`: the ids
        of each such round), so two rounds never touch the same rows."""
        # Each id of each record is looked up once, in the union of the rounds' ids (built in C), not in each
        # round's ids in turn; the round's own ids are built once, here, for the rounds taken after it.
        due = self._due(now, set().union(*busy))
        ids = round_ids(due)
        self._in_flight.update(due)
        states = self._states
        if not states:
            return Taken(dict.fromkeys(due, FRESH), ids)  # the common case: nothing waits for a retry
        return Taken({delivery: states.get(delivery, FRESH) for delivery in due}, ids)

    def _due(self, now: float, in_flight_ids: set[str]) -> list[Delivery]:
        due: list[Delivery] = []
        in_flight, states = self._in_flight, self._states
        for lane, records in self._lanes.items():
            if lane in self._frozen:
                continue
            waiting: set[tuple[str, int, str]] = set()
            for delivery in records:
                if delivery in in_flight:
                    continue  # records behind it that share its key are held by the ids of its round
                state = states.get(delivery) if states else None
                if (state is not None and state.due > now) or (in_flight_ids and _shares(delivery, in_flight_ids)):
                    waiting.add(delivery.thread)
                elif not waiting or delivery.thread not in waiting:
                    due.append(delivery)
                    if len(due) >= self._round_size:
                        return due
        return due

    def next_due(self, now: float) -> float | None:
        """The earliest time after `now` at which a waiting record becomes due, if any does."""
        in_flight = self._in_flight
        return min(
            (state.due for delivery, state in self._states.items() if state.due > now and delivery not in in_flight),
            default=None,
        )

    def settle(
        self,
        attempted: Iterable[Delivery],
        left: Collection[Delivery],
        retried: Mapping[Delivery, RetryState] | None = None,
    ) -> dict[Lane, int]:
        """End a round: the deliveries it `attempted` are no longer in flight, those that `left` (terminal) leave
        their lanes, and those that failed take their new retry state (`retried`); return the offset each
        partition may now be committed up to, for the partitions that moved.

        Rounds finish in any order, so records may leave a lane from its middle or its end: the highest offset
        that left each partition is remembered. Only records still in the lane count: after a rebalance the lane
        may be a new one, refetched from the committed offset, and this round's records are not in it."""
        # A delivery no longer in flight was in a lane that was forgotten while the round ran (revoked).
        settled = self._in_flight.intersection(attempted)
        self._in_flight -= settled
        if retried or self._states:  # else there is no retry state to book
            self._book(settled, left, retried or {})
        positions: dict[Lane, int] = {}
        for lane in {delivery.lane for delivery in left}:
            records = self._lanes.get(lane)
            if records is None:
                continue
            remaining: deque[Delivery] = deque()
            top = -1
            for delivery in records:
                if delivery in left:
                    top = max(top, delivery.record.offset)
                else:
                    remaining.append(delivery)
            if top < 0:
                continue
            if lane[1] >= 0:
                self._done[lane] = max(self._done.get(lane, 0), top + 1)
                # Up to the first record that is not terminal yet (or still in a round), never past it; when none
                # is left, up to the highest record that left.
                positions[lane] = remaining[0].record.offset if remaining else self._done[lane]
            if remaining:
                self._lanes[lane] = remaining
            else:
                del self._lanes[lane]
        return positions

    def _book(
        self, settled: Iterable[Delivery], left: Collection[Delivery], retried: Mapping[Delivery, RetryState]
    ) -> None:
        """Keep the new retry states of the settled deliveries that failed, and drop those of the ones that left."""
        for delivery in settled:
            if delivery in left:
                self._states.pop(delivery, None)
            elif (new := retried.get(delivery)) is not None:
                self._states[delivery] = new

    def wake(self, downstream: str) -> int:
        """Make the records that wait for this downstream's breaker due now (it closed); return how many."""
        woken = {
            delivery: replace(state, due=0.0)
            for delivery, state in self._states.items()
            if state.breaker == downstream and state.verdict is None and state.due > 0.0
        }
        self._states.update(woken)
        return len(woken)

    def stalled(self, now: float) -> set[Lane]:
        """The partitions that must not fetch now.

        A partition stops fetching while its head is a retry tier's copy that is not due (records behind it are due
        later still), or while its lane is full: it holds all that may be fetched but a round's worth, which is left
        to the other lanes (a blocked lane must not starve them). Records waiting for a downstream's breaker do not
        stop it: the records that do not need that downstream flow meanwhile."""
        return {lane for lane, records in self._lanes.items() if lane[1] >= 0 and self._stalls(lane, records, now)}

    def freeze(self, lanes: Iterable[Lane]) -> None:
        """Take nothing more from these lanes (their partitions are being revoked) until they are forgotten."""
        self._frozen.update(lanes)

    def forget(self, lanes: Iterable[Lane]) -> None:
        """Drop the lanes of revoked partitions: their records were not terminal; the next owner gets them."""
        for lane in lanes:
            self._frozen.discard(lane)
            for delivery in self._lanes.pop(lane, ()):
                self._states.pop(delivery, None)
                self._in_flight.discard(delivery)
            self._done.pop(lane, None)

    def _stalls(self, lane: Lane, records: deque[Delivery], now: float) -> bool:
        return _stall_reason(records, self.state, self._bound - self._round_size, now) is not None

    def why_stalled(self, lane: Lane, now: float) -> str | None:
        """Why a partition must not fetch now (what its heartbeat says), or None when it may."""
        records = self._lanes.get(lane)
        return _stall_reason(records, self.state, self._bound - self._round_size, now) if records else None


def _stall_reason(
    records: deque[Delivery], state: Callable[[Delivery], RetryState], full: int, now: float
) -> str | None:
    # A tier copy at the head that is not due: the records behind it in its tier are due later still. Its
    # delivery says so, not the topic's name (a source topic may be called `shop.retry.orders`).
    if records and records[0].in_tier and state(records[0]).due > now:
        return "retry tier: its head is not due yet"
    if len(records) >= full:
        return "backpressure: its lane is full"
    return None


def round_ids(deliveries: Collection[Delivery]) -> set[str]:
    """The message ids, aggregates and keys of a round's deliveries: what no other round in flight may write."""
    ids = {d.message_id for d in deliveries}
    ids |= {d.aggregate_id for d in deliveries if d.aggregate_id is not None}
    ids |= {d.key for d in deliveries if d.key is not None}
    return ids


def _shares(delivery: Delivery, ids: set[str]) -> bool:
    """Whether the delivery's message id, aggregate or key is one of `ids`."""
    return delivery.message_id in ids or delivery.aggregate_id in ids or delivery.key in ids

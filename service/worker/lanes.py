"""The consumer's lanes: fetched records waiting in order until they are terminal, which of them a round may
attempt now, and how far each partition may be committed.

No Kafka and no database here. The consumer loop fetches into the lanes, starts rounds of what `take` hands
out, and after each round asks `settle` which offsets it may commit: never past a record that is not terminal,
whatever order overlapping rounds finish in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence

from service.worker.processor import PARKED_TOPIC, Pending

Lane = tuple[str, int]  # a (topic, partition), or the parked records of one key (partition -1)


class Lanes:
    """Records fetched (or unparked) and not yet terminal, per lane, in order."""

    def __init__(self, round_size: int, bound: int) -> None:
        self._round_size = round_size  # a round attempts at most this many records
        self._bound = bound  # records held in all lanes, at most
        self._lanes: dict[Lane, deque[Pending]] = {}
        self._backpressured: dict[Lane, set[Pending]] = {}  # records waiting because a downstream said so
        self._done: dict[Lane, int] = {}  # per partition: the offset after the highest record that left
        self._frozen: set[Lane] = set()  # revoked, being handed over: no new round takes from them

    def add(self, lane: Lane, records: Iterable[Pending]) -> None:
        """Append records to the end of their lane."""
        self._lanes.setdefault(lane, deque()).extend(records)

    def held(self) -> int:
        """How many records the lanes hold."""
        return sum(map(len, self._lanes.values()))

    def room(self) -> int:
        """How many more records may be fetched before the bound."""
        return self._bound - self.held()

    def head(self, lane: Lane) -> Pending | None:
        """The first record of a lane, if it holds any."""
        records = self._lanes.get(lane)
        return records[0] if records else None

    def parked_keys(self) -> set[str]:
        """The keys whose parked records are in memory already."""
        return {lane[0].removeprefix(f"{PARKED_TOPIC}/") for lane in self._lanes if lane[1] < 0}

    def take(self, now: float, busy: Sequence[Collection[str | None]]) -> list[Pending]:
        """Up to a round's worth of records that may be attempted now, marked in flight until `settle`: due, not
        in a round already, with no earlier record of their key still waiting, and sharing no message id, order
        or key with a record that a round in flight writes (`busy`: the ids of each such round), so two rounds
        never touch the same rows."""
        due = self._due(now, busy)
        for pending in due:
            pending.in_flight = True
        return due

    def _due(self, now: float, busy: Sequence[Collection[str | None]]) -> list[Pending]:
        due: list[Pending] = []
        for lane, records in self._lanes.items():
            if lane in self._frozen:
                continue
            waiting: set[tuple[str, int, str]] = set()
            for pending in records:
                if pending.in_flight:
                    continue  # records behind it that share its key are held by `_shares_ids`
                if pending.due > now or (busy and _shares_ids(pending, busy)):
                    waiting.add(pending.thread)
                elif not waiting or pending.thread not in waiting:
                    due.append(pending)
                    if len(due) >= self._round_size:
                        return due
        return due

    def next_due(self, now: float) -> float | None:
        """The earliest time after `now` at which a waiting record becomes due, if any does."""
        return min(
            (p.due for records in self._lanes.values() for p in records if p.due > now and not p.in_flight),
            default=None,
        )

    def settle(self, attempted: Iterable[Pending], left: set[Pending]) -> dict[Lane, int]:
        """End a round: the records it `attempted` are no longer in flight, those that `left` (terminal) leave
        their lanes; return the offset each partition may now be committed up to, for the partitions that moved.

        Rounds finish in any order, so records may leave a lane from its middle or its end: the highest offset
        that left each partition is remembered. Only records still in the lane count: after a rebalance the lane
        may be a new one, refetched from the committed offset, and this round's records are not in it."""
        for pending in attempted:
            pending.in_flight = False
            if pending.backpressure and pending not in left:
                self._backpressured.setdefault(pending.lane, set()).add(pending)
            elif pending.lane in self._backpressured:
                self._backpressured[pending.lane].discard(pending)
        positions: dict[Lane, int] = {}
        for lane in {pending.lane for pending in left}:
            records = self._lanes.get(lane)
            if records is None:
                continue
            remaining: deque[Pending] = deque()
            top = -1
            for pending in records:
                if pending in left:
                    top = max(top, pending.record.offset)
                else:
                    remaining.append(pending)
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

    def stalled(self, now: float) -> set[Lane]:
        """The partitions that must not fetch now.

        A partition stops fetching while a downstream asked us to slow down (backpressure), while the head of a
        retry tier is not due (records behind it are due later still), or while its lane is full: it holds all
        that may be fetched but a round's worth, which is left to the other lanes (a blocked lane must not
        starve them)."""
        return {lane for lane, records in self._lanes.items() if lane[1] >= 0 and self._stalls(lane, records, now)}

    def freeze(self, lanes: Iterable[Lane]) -> None:
        """Take nothing more from these lanes (their partitions are being revoked) until they are forgotten."""
        self._frozen.update(lanes)

    def forget(self, lanes: Iterable[Lane]) -> None:
        """Drop the lanes of revoked partitions: their records were not terminal; the next owner gets them."""
        for lane in lanes:
            self._frozen.discard(lane)
            self._lanes.pop(lane, None)
            self._backpressured.pop(lane, None)
            self._done.pop(lane, None)

    def _stalls(self, lane: Lane, records: deque[Pending], now: float) -> bool:
        if any(p.due > now for p in self._backpressured.get(lane, ())):
            return True
        if ".retry." in lane[0] and records and records[0].due > now:
            return True
        return len(records) >= self._bound - self._round_size


def _shares_ids(pending: Pending, busy: Sequence[Collection[str | None]]) -> bool:
    """Whether a round in flight writes a record with the same message id, order or key."""
    return any(pending.message_id in ids or pending.aggregate_id in ids or pending.key in ids for ids in busy)

"""A consumer's rounds without I/O: a tiny domain of "things" and a round store in memory, for the processor's unit
tests (tests/unit/test_round_shell.py). No order rules: the core's shell must work for any domain."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from service.adapters.breakers import Breakers
from service.codes import Code, ErrorCode
from service.config import Topics
from service.metrics import Metrics
from service.policy.decide import RoundWrite
from service.policy.delivery import Delivery
from service.policy.handling import DecodeFailure, Rejected
from service.policy.owners import Owners
from service.policy.records import Coordinates, SourceRecord
from service.policy.retry import Budget, RetryPolicy
from service.policy.round import Facts
from service.store.round_write import Rows
from service.tracing import Tracing
from service.worker.downtime import Downtime
from service.worker.middleware import FaultPoints
from service.worker.processor import Processor, RoundSettings

NOW = datetime(2024, 5, 1, tzinfo=UTC)
TOPIC = "things"


@dataclass(frozen=True)
class Message:
    """`create:T-1` or `change:T-1`; `refuse:T-1` is rejected by the rule."""

    action: str
    aggregate_id: str
    schema_name: str = "thing.v1"


@dataclass(frozen=True)
class Thing:
    aggregate_id: str
    version: int = 1
    sequence: int | None = None


@dataclass(frozen=True)
class Notify:
    """A thing's one effect, as domains give them (idempotency key, aggregate, kind, payload)."""

    idempotency_key: str
    aggregate_id: str
    kind: str = "notify"
    payload: Any = None


@dataclass(frozen=True)
class Done:
    aggregate: Thing
    effects: tuple[Notify, ...]
    events: tuple[str, ...]


class Things:
    """The domain's handler: bytes `action:id`; a creation asks the directory (`look_up`) about its thing."""

    downstream = "directory"
    rows: Any = None  # the aggregate store's statement: the fake store writes no SQL

    def __init__(self, look_up: Callable[[str], Awaitable[Any]] | None = None) -> None:
        self._look_up = look_up

    def decode(self, value: bytes | None) -> Message | DecodeFailure:
        action, _, aggregate_id = (value or b"").decode(errors="replace").partition(":")
        if action not in ("create", "change", "refuse") or not aggregate_id:
            return DecodeFailure(ErrorCode.MALFORMED_PAYLOAD)
        return Message(action, aggregate_id)

    def creates(self, message: Message) -> bool:
        return message.action == "create"

    def sequence(self, message: Message) -> int | None:
        return None

    def context_key(self, message: Message, known: Collection[str]) -> str | None:
        return message.aggregate_id if self._look_up is not None and message.action == "create" else None

    async def look_up(self, key: str) -> Any:
        assert self._look_up is not None
        return await self._look_up(key)

    def apply(self, message: Message, current: Thing | None, looked_up: Mapping[str, Any]) -> Done | Rejected:
        if message.action == "refuse" or (current is None) != (message.action == "create"):
            return Rejected(ErrorCode.INVALID_FIELD)
        thing = Thing(message.aggregate_id, current.version + 1 if current else 1)
        return Done(thing, (Notify(f"{thing.aggregate_id}/notify", thing.aggregate_id),), (f"thing.{message.action}d",))

    def event(self, event: Any, version: int, message_id: str) -> tuple[str, str, dict[str, Any]]:
        return event, message_id, {"version": version}

    def rejection(
        self, message_id: str, aggregate_id: str | None, code: Code, schema: str | None, origin: Coordinates, at: Any
    ) -> tuple[str, dict[str, Any]]:
        return "thing.rejected", {"messageId": message_id, "code": code.value}

    async def lock(self, connection: Any, ids: Iterable[str]) -> dict[str, Thing]:
        raise AssertionError("the fake store locks its own things")


@dataclass
class FakeRounds:
    """A `RoundStore` in memory: the committed inbox and things, every committed write, and a rule that refuses
    some writes (as a database refuses content)."""

    inbox: dict[str, str] = field(default_factory=dict)  # message id -> status
    things: dict[str, Thing] = field(default_factory=dict)
    committed: list[RoundWrite[Rows]] = field(default_factory=list)
    refuse: Callable[[RoundWrite[Rows]], bool] = lambda write: False
    transactions: int = 0

    async def facts(self, due: Collection[Delivery], *, keys: bool) -> Facts:
        return Facts(dict(self.inbox), {}, set(), set(), set(self.things), {})

    def transaction(self) -> FakeTransaction:
        self.transactions += 1
        return FakeTransaction(self)

    async def releasable(self, busy: set[str], keys: int, per_key: int) -> list[Any]:
        return []

    async def let_go(self) -> None:
        pass

    def written(self) -> list[tuple[str, str]]:
        """Every committed write's steps: (message id, what it wrote)."""
        return [(step.delivery.message_id, step.write.value) for write in self.committed for step in write.plan.steps]


class FakeTransaction:
    """One transaction of a `FakeRounds`: what it applied is kept only when it commits."""

    def __init__(self, store: FakeRounds) -> None:
        self._store = store
        self._applied: RoundWrite[Rows] | None = None

    async def __aenter__(self) -> FakeTransaction:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._applied = None

    async def lock(self, ids: list[str]) -> dict[str, Thing]:
        return {i: self._store.things[i] for i in ids if i in self._store.things}

    async def apply(self, write: RoundWrite[Rows]) -> None:
        if self._store.refuse(write):
            raise ValueError("the store refuses this write")
        self._applied = write

    async def commit(self) -> None:
        write = self._applied
        assert write is not None
        store = self._store
        store.committed.append(write)
        store.inbox.update((row.message_id, row.status) for row in [*write.rows.inbox_rows, *write.rows.reopened])
        store.things.update((thing.aggregate_id, thing) for thing in (*write.plan.created, *write.plan.changed))


def processor(
    store: FakeRounds,
    handler: Things | None = None,
    *,
    timeout: timedelta = timedelta(seconds=5),
    faults: FaultPoints | None = None,
    breakers: Breakers | None = None,
    tracing: Tracing | None = None,
) -> Processor:
    """A processor of things on `store`, its clock stopped at NOW."""
    settings = RoundSettings(Topics(TOPIC), "things-service", "key", timeout, faults=faults or FaultPoints())
    return Processor(
        settings,
        store,
        handler or Things(),  # type: ignore[arg-type]
        Owners(producers="producers", oncall="oncall"),
        RetryPolicy(Budget(5, timedelta(minutes=5))),
        Metrics("things"),
        lambda: NOW,
        random.Random(1),
        Downtime(),
        breakers,
        tracing,
    )


def record(offset: int, value: bytes, *, key: str = "T-1") -> SourceRecord:
    """A record of the things topic, its message id `m<offset>`."""
    return SourceRecord(TOPIC, 0, offset, 0, key.encode(), value, (("message-id", f"m{offset}".encode()),))

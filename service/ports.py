"""The seam between the core and a domain: the one module a domain imports from the core.

A domain describes itself to the core with one `Domain` value (its names, its settings, its message decoding, its
`Handler`, its effect kinds, its codes and owners, its migrations, its fake downstream APIs); the core builds its
command line, workers, console and migrations from that value and names no domain itself. The names below the
`Domain` (a handler's values, the effect outcomes, the HTTP client's helpers for a downstream, the store's
recordsets, the fault-injection server for fake APIs) are the core's public API for a domain, re-exported here so
that a domain depends on this module alone. A console script (a domain's `__main__`, its composition root) starts
the command line with `service.launch.launch`, which sits above the command line and this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from service.adapters.answers import Exchange, Own, api_error, call_outcome, lookup_failure, lookup_outcome, refusal
from service.adapters.breakers import Breakers
from service.adapters.http import Answer, Credentials, Downstream, HttpClient, path_segment
from service.codes import Code, DomainCode, ErrorCode, FailureKind, registered
from service.config import BaseUrl, Settings, Topics, read_as_the_core_does
from service.credentials import check_credentials
from service.errors import DownstreamError, RecordFailure
from service.fields import AggregateId
from service.policy.effects import (
    CallOutcome,
    EffectDecision,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    NotSent,
    Refused,
    Sent,
    Unknown,
)
from service.policy.envelope import event_headers, iso
from service.policy.handling import Aggregate, Applied, DecodeFailure, Rejected
from service.policy.owners import Owners
from service.policy.records import Coordinates
from service.readers import Reader, read_by
from service.store.batch import AggregateRows
from service.store.effects import EffectRow
from service.store.outbox import OutboxMessage
from service.store.outbox import add as add_to_outbox
from service.store.recordset import Columns
from service.store.tables import metadata

__all__ = [
    "Aggregate",
    "AggregateId",
    "AggregateRows",
    "Answer",
    "Applied",
    "BaseUrl",
    "CallOutcome",
    "Code",
    "Columns",
    "Coordinates",
    "Credentials",
    "DecodeFailure",
    "Domain",
    "DomainCode",
    "Downstream",
    "DownstreamError",
    "EffectDecision",
    "EffectKind",
    "EffectRegistry",
    "EffectRow",
    "EffectSpec",
    "ErrorCode",
    "Exchange",
    "FailureKind",
    "FakeApi",
    "FaultServer",
    "Found",
    "Handler",
    "LookupFailed",
    "LookupOutcome",
    "Missing",
    "NotSent",
    "OutboxMessage",
    "Own",
    "Owners",
    "Plumbing",
    "Reader",
    "RecordFailure",
    "Refused",
    "Rejected",
    "Reply",
    "Request",
    "Route",
    "Sent",
    "Settings",
    "Settled",
    "Topics",
    "Unknown",
    "add_to_outbox",
    "api_error",
    "call_outcome",
    "check_credentials",
    "event_headers",
    "iso",
    "json_field",
    "json_reply",
    "key_from_body",
    "key_from_header",
    "key_from_param",
    "key_from_query",
    "lookup_failure",
    "lookup_outcome",
    "metadata",
    "path_segment",
    "read_as_the_core_does",
    "read_by",
    "refusal",
    "registered",
    "serve_from_command_line",
]

if TYPE_CHECKING:
    from service.testing.faults import (
        FakeApi,
        FaultServer,
        Reply,
        Request,
        Route,
        json_field,
        json_reply,
        key_from_body,
        key_from_header,
        key_from_param,
        key_from_query,
        serve_from_command_line,
    )

# The fault-injection server's names, for a domain's fake APIs (demos and tests): imported on first use, as a
# running service never needs them.
_FAKES = frozenset(
    {
        "FakeApi",
        "FaultServer",
        "Reply",
        "Request",
        "Route",
        "json_field",
        "json_reply",
        "key_from_body",
        "key_from_header",
        "key_from_param",
        "key_from_query",
        "serve_from_command_line",
    }
)


def __getattr__(name: str) -> Any:
    """A fault-injection server's name, imported now (PEP 562)."""
    if name in _FAKES:
        from service.testing import faults

        return getattr(faults, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


M = TypeVar("M")  # a domain's message
A = TypeVar("A")  # a domain's aggregate
F = TypeVar("F")  # an outside fact a message needs (a look-up's answer)


class Handler(Protocol[M, A, F]):
    """A domain's part of a consumer's round; the core's processor owns the rest (the failure state machine,
    ordering, the inbox, the outbox and the round's one transaction).

    - `decode`: a record's bytes as a message (with its aggregate id and schema name) or a `DecodeFailure`;
    - `creates` and `sequence`: whether a message creates its aggregate, and its per-aggregate sequence;
    - `context_key` and `look_up`: an outside fact a message needs, looked up before the transaction, at most once
      per key and round, concurrently (a transient failure raises `RecordFailure` and is retried like any other);
    - `apply`: the pure rule, `(message, current, looked up) -> Applied | Rejected`; an applied result carries the
      new aggregate state (`aggregate`, with its `version` and `sequence`), its effects and its events;
    - `event` and `rejection`: the documents the outbox publishes for an event and for a rejection;
    - `lock` and `rows`: the aggregate store: read and lock a round's current aggregates inside its transaction,
      and write the new and changed ones as part of its one statement (`AggregateRows`).
    """

    rows: AggregateRows  # how the round's one write statement writes the aggregates

    @property
    def downstream(self) -> str | None:
        """The name of the look-up's downstream (backpressure, metrics); None when it is not configured."""

    def decode(self, value: bytes | None) -> M | DecodeFailure:
        """The message the bytes hold, or a `DecodeFailure`; never raises for bad input."""

    def creates(self, message: M) -> bool:
        """Whether the message creates its aggregate (the round does not read or lock it then)."""

    def sequence(self, message: M) -> int | None:
        """The message's per-aggregate sequence, for `versioned` ordering."""

    def context_key(self, message: M, known: Collection[str]) -> str | None:
        """What to look up before applying the message (`known`: the aggregates that exist), or None."""

    async def look_up(self, key: str) -> F:
        """The outside fact for `key`; raises `RecordFailure` when it cannot be had now."""

    def apply(self, message: M, current: A | None, looked_up: Mapping[str, F]) -> Applied | Rejected:
        """The pure rule: an applied result or a `Rejected`."""

    def event(self, event: Any, version: int, message_id: str) -> tuple[str, str, dict[str, Any]]:
        """An event's (type, aggregate id, document) for `<source>.events`."""

    def rejection(
        self,
        message_id: str,
        aggregate_id: str | None,
        code: Code,
        schema: str | None,
        origin: Coordinates,
        at: datetime,
    ) -> tuple[str, dict[str, Any]]:
        """A rejection's (type, document) for `<source>.rejected`."""

    async def lock(self, connection: AsyncConnection, ids: Iterable[str]) -> dict[str, A]:
        """The current aggregates with these ids, locked for the round's transaction."""


@dataclass(frozen=True)
class EffectSpec:
    """The static facts of a kind of effect.

    `idempotent`: the provider takes the effect's idempotency key, so a repeat cannot act twice; otherwise a
    repeat is made only after a look-up found nothing. `waits_for`: a kind of effect of the same aggregate
    that must be resolved (sent or failed) before this one is claimed. `provider_setting`: the setting whose
    value (a URL) enables the calls; unset, the effects of this kind stay pending.
    """

    name: str
    idempotent: bool
    provider_setting: str
    waits_for: str | None = None

    @property
    def downstream(self) -> str:
        """The provider's name, whose circuit breaker its calls go through: the URL setting without `_url`
        (`provider_url` → `provider`), as its client names itself (`Downstream.downstream`)."""
        return self.provider_setting.removesuffix("_url")


# An effect and the decision that settled it (its state moved in the same transaction).
Settled = tuple[EffectRow, EffectDecision]


class EffectKind(Protocol):
    """One kind of effect: its facts, its call, its look-up, and what its outcome writes. The core does the rest:
    claims under a lease, the attempt budget, never a blind repeat of a call that is not idempotent (a look-up
    first), the reconciler's look-ups, and the effect's state machine."""

    spec: EffectSpec

    @property
    def enabled(self) -> bool:
        """False when its provider is not configured: the effects wait, pending."""

    async def call(self, effect: EffectRow) -> CallOutcome:
        """Make the external call (outside any transaction)."""

    async def look_up(self, effect: EffectRow) -> LookupOutcome:
        """Ask the provider whether the effect happened (the reconciler, and before a repeat)."""

    async def on_outcomes(self, connection: AsyncConnection, topics: Topics, settled: Sequence[Settled]) -> None:
        """Write what follows from settled decisions of this kind (events, aggregate changes), in the caller's
        transaction. They come in aggregate order: lock aggregates in that order, as the
        consumer's round does, so that the two never wait on each other in a cycle. The transaction joins by
        key look-ups only (hash and merge joins off: `service.store.effects.join_by_key`): join the batch to
        your tables on indexed keys."""


class EffectRegistry:
    """The kinds a domain registered, by name."""

    def __init__(self, kinds: Iterable[EffectKind]) -> None:
        self._kinds = {kind.spec.name: kind for kind in kinds}

    def __getitem__(self, name: str) -> EffectKind:
        return self._kinds[name]

    def get(self, name: str) -> EffectKind | None:
        """The kind, or None for a kind no domain registers (a row left by an older version)."""
        return self._kinds.get(name)

    def enabled(self) -> list[str]:
        """The kinds whose provider is configured."""
        return [name for name, kind in self._kinds.items() if kind.enabled]

    def disabled(self) -> list[EffectSpec]:
        """The kinds whose provider is not configured."""
        return [kind.spec for kind in self._kinds.values() if not kind.enabled]

    def quiet_time(self, name: str, lease: timedelta) -> timedelta:
        """How long a resend of this kind waits before the look-up that decides it: for a kind without
        idempotency, the lease, as no call is given longer and its provider may still act on a request it took
        before we stopped waiting; none for an idempotent kind (a repeat cannot act twice)."""
        kind = self._kinds.get(name)
        return timedelta(0) if kind is not None and kind.spec.idempotent else lease

    def dependencies(self) -> Sequence[tuple[str, str]]:
        """(kind, the kind it waits for) pairs."""
        return [(name, kind.spec.waits_for) for name, kind in self._kinds.items() if kind.spec.waits_for]


@dataclass(frozen=True)
class Plumbing:
    """What the core hands a domain's factories: the process's settings (the domain's class), its one HTTP client
    and its circuit breakers, one per downstream."""

    settings: Any  # the `Domain.settings` class's instance
    http: HttpClient
    breakers: Breakers

    def credentials(self, downstream: str) -> Credentials:
        """A downstream's credentials from its settings (`<downstream>_token`, `_ca_file`, …)."""
        return Credentials.of(self.settings, downstream)


@dataclass(frozen=True)
class Domain:
    """A domain as the core sees it: everything the core's command line, workers, console and migrations take
    from a domain. A domain package exports exactly one (`DOMAIN`); one entry point picks it.

    Names: `program` (the console script and distribution; the default consumer name), `summary` (the command
    line's one-line help), `env_prefix` (every setting's variable is the prefix and the field's name in
    capitals; the `settings` class reads with it), `metrics_prefix` (`<prefix>_records_total`), `alerts_prefix`
    (the alert rules' names), `logger_root` (every logger's name starts with it).
    Behaviour: `settings` (the core's settings class extended with the domain's), `decode` and `failing_field`
    (a stored payload as a message, and the path and rule of an invalid one's first bad field), `handler` and
    `effects` (built per process from its `Plumbing`), `effect_specs`, `codes` (its registered codes), `owners`
    (who owns a quarantined record by default), `migrations` (its Alembic version locations, beside the
    core's), `fakes` (the module that serves its fake downstream APIs, `python -m <fakes>`, for demos and
    tests). Each command's `--help` lists the settings it reads from the settings class's fields (their readers).
    """

    program: str
    summary: str
    env_prefix: str
    metrics_prefix: str
    alerts_prefix: str
    logger_root: str
    settings: type[Settings]
    decode: Callable[[bytes | None], Any]
    failing_field: Callable[[bytes | None], tuple[str, str] | None]
    handler: Callable[[Plumbing], Handler[Any, Any, Any]]
    effects: Callable[[Plumbing], EffectRegistry]
    effect_specs: tuple[EffectSpec, ...]
    codes: tuple[type[DomainCode], ...]
    owners: Owners
    migrations: tuple[str | os.PathLike[str], ...] = ()
    fakes: str | None = None

    def __post_init__(self) -> None:
        named = (self.settings.variable(""), self.settings.program)
        if named != (self.env_prefix, self.program):
            raise ValueError(
                f"{self.settings.__name__} names {named}, not the domain's {self.env_prefix, self.program}"
            )

    @property
    def error_codes(self) -> tuple[str, ...]:
        """Every error code a filter may name: the core's and the domain's."""
        return tuple(registered(*self.codes))

    def variable(self, setting: str) -> str:
        """The environment variable of a setting (`database_url` → `<PREFIX>DATABASE_URL`)."""
        return self.settings.variable(setting)

"""The effect registry: what the core's effect worker and reconciler need to know of each kind of effect.

A domain registers one `EffectKind` per kind it emits (the order domain: `service/orders/effects.py`). The
core does the rest: claims under a lease, the attempt budget, never a blind repeat of a call that is not
idempotent (a look-up first), the reconciler's look-ups, and the effect's state machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from service.config import Topics
from service.policy.effects import CallOutcome, EffectDecision, LookupOutcome
from service.store.effects import EffectRow


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
        (`payments_url` → `payments`), as its client names itself (`Downstream.downstream`)."""
        return self.provider_setting.removesuffix("_url")


# An effect and the decision that settled it (its state moved in the same transaction).
Settled = tuple[EffectRow, EffectDecision]


class EffectKind(Protocol):
    """One kind of effect: its facts, its call, its look-up, and what its outcome writes."""

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


def waiting_for(specs: Iterable[EffectSpec]) -> dict[str, list[str]]:
    """Per kind, the kinds that wait for it (`waits_for`)."""
    found: dict[str, list[str]] = {}
    for spec in specs:
        if spec.waits_for:
            found.setdefault(spec.waits_for, []).append(spec.name)
    return found


def retry_state(spec: EffectSpec | None) -> str:
    """Where an operator's retry puts a failed effect: `pending` (called again) when its provider takes an
    idempotency key, so a second call cannot act twice; `uncertain` when it does not, so the reconciler looks
    it up first and it is made again only if the provider has no trace of it (also for a kind no domain
    registers: the safe side)."""
    return "pending" if spec is not None and spec.idempotent else "uncertain"

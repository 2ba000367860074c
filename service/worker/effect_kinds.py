"""The core's reading of a domain's effect kinds (service/ports.py `EffectSpec`, `EffectRegistry`): which kinds
wait for which, and where an operator's retry puts a failed effect."""

from __future__ import annotations

from collections.abc import Iterable

from service.ports import EffectSpec


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

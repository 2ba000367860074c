"""The core's reading of a domain's effect kinds (service/ports.py `EffectSpec`, `EffectRegistry`): which kinds
wait for which, where an operator's retry puts a failed effect, and how a listing shows its last error."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

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


def last_error(row: Mapping[str, Any], unconfigured: Collection[str]) -> str:
    """An effect's last error as an operator's listing shows it: the one stored with it, never one inferred from the
    configuration of the process that reads it (which is not the worker's). Only an effect that never had an
    attempt nor an error, still pending, of a kind whose provider URL this process lacks (`unconfigured`), is said
    to wait on a provider not configured *here*: a hint about this machine, kept apart from the stored facts."""
    if row["last_error_code"]:
        return str(row["last_error_code"])
    if row["state"] == "pending" and not row["attempts"] and row["kind"] in unconfigured:
        return "provider not configured here"
    return ""

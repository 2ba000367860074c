"""The lines the console's actions say about each item: the same words in a dry run's preview (what it would
leave as it is) and on the done page (what it did), from the decisions the real run applies (service.policy.repairs)."""

from __future__ import annotations

from service.policy.repairs import resolves

__all__ = ["no_record", "resolved", "resolves", "retried"]


def no_record(failure_id: str) -> str:
    """A failure id with no record, in the done page's words."""
    return f"{failure_id}: no such record"


def resolved(failure_id: str, previous: str | None) -> str:
    """What resolving a record in status `previous` does (or did), in the done page's words."""
    if resolves(previous):
        return f"{failure_id}: resolved"
    return f"{failure_id}: {previous or 'no such record'}, not open: unchanged"


def retried(key: str, was: str | None, went: str | None) -> str:
    """What retrying an effect does (or did), in the done page's words."""
    if went == "pending":
        return f"{key}: pending: the effect worker calls it again"
    if went:
        return f"{key}: {went}: the reconciler looks it up"
    return f"{key}: {was or 'no such effect'}: not retried"

"""What an operator's repair does to each item it names (pure; no I/O): a real run applies these decisions, its dry
run reports them, so the two cannot tell different stories (contract §10)."""

from __future__ import annotations

from collections.abc import Sequence

RESOLVABLE = "open"  # the one status a resolve closes


def resolves(status: str | None) -> bool:
    """Whether resolving a record in this status (None: no such record) closes it; any other is left as it is."""
    return status == RESOLVABLE


def effect_retry(state: str | None, goes_to: str, moved: Sequence[str] = ()) -> tuple[str | None, str | None]:
    """An operator's retry of one effect: what it was, and where it goes (None: left as it is). Only a failed effect
    is retried, and only while the effects of its aggregate that wait for it still wait (`moved` names those that
    went ahead on its failure, with their state: an undo that found nothing to undo would be overtaken)."""
    if state != "failed":
        return state, None
    if moved:
        return f"failed, and what waited for it went ahead ({', '.join(moved)})", None
    return "failed", goes_to

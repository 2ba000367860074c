"""How a reprocess run verifies an item: by its business state before the copy was published and now, never by
Kafka delivery (service/worker/reprocess.py reads the states, decides with `judge` and records the outcome)."""

from __future__ import annotations

from typing import NamedTuple, Protocol


class BusinessState(Protocol):
    """An item's business state (service/store/reprocess.py `ItemState`)."""

    @property
    def inbox_status(self) -> str | None:
        """The message's inbox status, if it has a row."""

    @property
    def quarantine_status(self) -> str:
        """The quarantine row's status (`reprocessed` once a reprocessed copy reached a terminal state)."""

    @property
    def repeat_failures(self) -> int:
        """How often the record was quarantined again."""

    @property
    def effects(self) -> int:
        """How many effects its aggregate has."""


class Judgement(NamedTuple):
    """An item's outcome (None: not decided yet) and why, in a few words."""

    outcome: str | None
    detail: str


_UNDECIDED = Judgement(None, "")


def judge(before: BusinessState, after: BusinessState, consumed: bool) -> Judgement:
    """Compare an item's business state before publishing and now; `consumed` says the consumer has read
    everything published, the copy included."""
    if after.repeat_failures > before.repeat_failures:
        return Judgement("failed_again", f"quarantined again (repeat {after.repeat_failures})")
    if before.inbox_status in ("processed", "rejected"):
        if after.effects > before.effects:
            return Judgement("unexpected_duplicate", f"effects grew from {before.effects} to {after.effects}")
        # Nothing changes for a no-op: it is verified once the consumer has read everything published.
        return Judgement("noop", f"already {before.inbox_status}") if consumed else _UNDECIDED
    if after.inbox_status in ("processed", "rejected") and after.quarantine_status == "reprocessed":
        return Judgement("reprocessed", f"inbox {after.inbox_status}, {after.effects} effects")
    return _UNDECIDED

"""How a reprocess run verifies an item by its business state (service/policy/verification.py): failed again,
an unexpected duplicate, a no-op once the consumer has read everything, reprocessed, or not decided yet.
Table-driven, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from service.policy.verification import Judgement, judge


@dataclass(frozen=True)
class State:
    inbox_status: str | None = "quarantined"
    quarantine_status: str = "open"
    repeat_failures: int = 0
    effects: int = 0


QUARANTINED = State()
PROCESSED = State("processed", "open", 0, 1)


@pytest.mark.parametrize(
    ("before", "after", "consumed", "expected"),
    [
        (QUARANTINED, State(repeat_failures=1), True, Judgement("failed_again", "quarantined again (repeat 1)")),
        (QUARANTINED, State(repeat_failures=1), False, Judgement("failed_again", "quarantined again (repeat 1)")),
        (
            PROCESSED,
            State("processed", "open", 0, 2),
            False,
            Judgement("unexpected_duplicate", "effects grew from 1 to 2"),
        ),
        (PROCESSED, PROCESSED, True, Judgement("noop", "already processed")),
        (State("rejected"), State("rejected"), True, Judgement("noop", "already rejected")),
        (PROCESSED, PROCESSED, False, Judgement(None, "")),
        (
            QUARANTINED,
            State("processed", "reprocessed", 0, 1),
            False,
            Judgement("reprocessed", "inbox processed, 1 effects"),
        ),
        (
            QUARANTINED,
            State("rejected", "reprocessed", 0, 0),
            True,
            Judgement("reprocessed", "inbox rejected, 0 effects"),
        ),
        (QUARANTINED, State("processed", "open", 0, 1), True, Judgement(None, "")),
        (QUARANTINED, QUARANTINED, True, Judgement(None, "")),
        (State(None), State(None), True, Judgement(None, "")),
    ],
    ids=[
        "quarantined again",
        "quarantined again, before the consumer caught up",
        "an applied item gained an effect",
        "already processed: a no-op once consumed",
        "already rejected: a no-op once consumed",
        "already processed: undecided until consumed",
        "applied by the copy",
        "rejected by the copy",
        "processed but its quarantine row not yet marked",
        "nothing changed yet",
        "no inbox row yet",
    ],
)
def test_an_item_is_judged_by_its_business_state_before_and_after(
    before: State, after: State, consumed: bool, expected: Judgement
) -> None:
    assert judge(before, after, consumed) == expected


def test_a_failure_again_is_seen_before_an_effect_that_grew() -> None:
    # A record applied before, sent back, and quarantined again: the repeat decides, not the effects.
    assert judge(PROCESSED, State("processed", "open", 1, 2), True).outcome == "failed_again"

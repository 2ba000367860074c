"""The effect state machine (service/policy/effects.py): what a provider's answer to a call (`after_call`) and a
reconciler's look-up (`after_lookup`) mean for an effect row. Table-driven, no I/O."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from service.codes import ErrorCode
from service.policy.effects import (
    CallOutcome,
    EffectDecision,
    EffectPolicy,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    NotSent,
    Refused,
    Sent,
    Unknown,
    after_call,
    after_lookup,
)

POLICY = EffectPolicy(
    max_attempts=4, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=10), max_reconciles=2
)


@pytest.mark.parametrize(
    ("outcome", "attempts", "expected"),
    [
        (Sent("ref-1"), 1, EffectDecision("sent", reference="ref-1")),
        (Sent("ref-1"), 4, EffectDecision("sent", reference="ref-1")),
        (Refused(ErrorCode.PROVIDER_REJECTED), 1, EffectDecision("failed", ErrorCode.PROVIDER_REJECTED)),
        (Unknown(ErrorCode.OUTCOME_UNKNOWN), 1, EffectDecision("uncertain", ErrorCode.OUTCOME_UNKNOWN)),
        (Unknown(ErrorCode.OUTCOME_UNKNOWN), 4, EffectDecision("uncertain", ErrorCode.OUTCOME_UNKNOWN)),
        (
            NotSent(ErrorCode.PROVIDER_UNAUTHORIZED, retry_after=timedelta(0), charged=False),
            4,
            EffectDecision("pending", ErrorCode.PROVIDER_UNAUTHORIZED, retry_in=timedelta(0), unmade=True),
        ),
        (
            NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE, charged=False),
            4,
            EffectDecision("pending", ErrorCode.DOWNSTREAM_UNAVAILABLE, retry_in=timedelta(0), unmade=True),
        ),
        (
            NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE),
            4,
            EffectDecision("failed", ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED),
        ),
        (NotSent(ErrorCode.RATE_LIMITED), 5, EffectDecision("failed", ErrorCode.RATE_LIMITED_EXHAUSTED)),
    ],
    ids=[
        "sent",
        "sent on the last attempt",
        "refused: failed for good",
        "may have been acted on: uncertain",
        "uncertain even past the attempts: the look-up decides",
        "credentials refused: the breaker it opened waited for, no attempt spent",
        "the breaker open: waits for it, no attempt spent, even on the last attempt",
        "transient on the last attempt: exhausted",
        "transient past the last attempt: exhausted",
    ],
)
def test_a_calls_answer_decides_the_effects_next_state(
    outcome: CallOutcome, attempts: int, expected: EffectDecision
) -> None:
    assert after_call(outcome, attempts, POLICY, random.Random(3)) == expected


@pytest.mark.parametrize(
    ("attempts", "lowest", "highest"),
    [
        (1, timedelta(seconds=0.5), timedelta(seconds=1)),
        (2, timedelta(seconds=1), timedelta(seconds=2)),
        (3, timedelta(seconds=2), timedelta(seconds=4)),
    ],
)
def test_a_transient_answer_waits_a_growing_jittered_backoff(
    attempts: int, lowest: timedelta, highest: timedelta
) -> None:
    decision = after_call(NotSent(ErrorCode.DOWNSTREAM_TIMEOUT), attempts, POLICY, random.Random(attempts))

    assert (decision.state, decision.code, decision.unmade) == ("pending", ErrorCode.DOWNSTREAM_TIMEOUT, False)
    assert decision.retry_in is not None
    assert lowest <= decision.retry_in <= highest


def test_the_backoff_never_exceeds_its_ceiling_however_many_attempts() -> None:
    patient = EffectPolicy(max_attempts=1_000, base_delay=timedelta(seconds=1), max_delay=timedelta(seconds=10))

    decision = after_call(NotSent(ErrorCode.DOWNSTREAM_TIMEOUT), 999, patient, random.Random(1))

    assert decision.retry_in is not None
    assert timedelta(seconds=5) <= decision.retry_in <= timedelta(seconds=10)


def test_a_retry_after_longer_than_the_backoff_is_waited_in_full() -> None:
    asked = NotSent(ErrorCode.RATE_LIMITED, retry_after=timedelta(minutes=2))

    assert after_call(asked, 1, POLICY, random.Random(1)).retry_in == timedelta(minutes=2)


@pytest.mark.parametrize(
    ("outcome", "reconciles", "expected"),
    [
        (Found("ref-9"), 0, EffectDecision("sent", reference="ref-9")),
        (Found("ref-9"), 5, EffectDecision("sent", reference="ref-9")),
        (LookupFailed(ErrorCode.DOWNSTREAM_UNAVAILABLE), 0, None),
        (Missing(), 0, EffectDecision("pending", ErrorCode.OUTCOME_UNKNOWN, retry_in=timedelta(0))),
        (Missing(), 1, EffectDecision("pending", ErrorCode.OUTCOME_UNKNOWN, retry_in=timedelta(0))),
        (Missing(), 2, EffectDecision("failed", ErrorCode.NOT_FOUND_AFTER_RECONCILE)),
    ],
    ids=[
        "found: sent",
        "found after several reconciles: sent",
        "the look-up failed: stays uncertain",
        "not found: sent back to be made",
        "not found again: sent back once more",
        "not found after the last reconcile: failed",
    ],
)
def test_a_look_up_decides_an_uncertain_effects_next_state(
    outcome: LookupOutcome, reconciles: int, expected: EffectDecision | None
) -> None:
    assert after_lookup(outcome, reconciles, POLICY) == expected

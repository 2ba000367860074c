"""`classify`: what to do with a record that failed, as data (quarantine, retry now, retry later, reject)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from service.codes import ErrorCode, FailureKind
from service.policy.retry import AttemptHistory, RetryPolicy


class Action(StrEnum):
    """The ways out of a failure."""

    RETRY = "retry"  # blocking: try again in place after `delay`, holding the partition
    RETRY_LATER = "retry_later"  # non-blocking: send to the retry tier whose delay is `delay`
    QUARANTINE = "quarantine"
    REJECT = "reject"


@dataclass(frozen=True)
class Failure:
    """One failed attempt: a stable code and, for rate limits, the server's requested pause. Not `charged`: the
    downstream's breaker was open (or opened on it), so no attempt is spent and the record waits `retry_after`."""

    code: ErrorCode
    retry_after: timedelta | None = None
    downstream: str | None = None
    charged: bool = True


@dataclass(frozen=True)
class Decision:
    """The state machine's answer; the shell applies it in one transaction."""

    action: Action
    code: ErrorCode
    delay: timedelta | None = None


def classify(
    failure: Failure,
    history: AttemptHistory,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random,
    *,
    in_tier: bool = False,
) -> Decision:
    """Decide the next step for a record whose attempt number `history.attempts` just failed.

    `in_tier` says the attempt was a delivery from a retry tier: no blocking retries happen there, since
    they would hold up the tier's partition for the records behind it.
    """
    kind = failure.code.kind
    if kind is FailureKind.REJECTED:
        return Decision(Action.REJECT, failure.code)
    if kind is FailureKind.INVALID:
        return Decision(Action.QUARANTINE, failure.code)
    plan = policy.for_kind(kind)
    exhausted = Decision(Action.QUARANTINE, failure.code.exhausted())
    if history.attempts >= plan.total.max_attempts:
        return exhausted

    def within(limit: timedelta, delay: timedelta) -> bool:
        # Waiting past a budget only to give up afterwards would hold the record for nothing.
        return history.elapsed(now) + delay <= limit

    if not in_tier and history.attempts < plan.blocking.max_attempts:
        delay = plan.backoff(history.attempts, rng)
        if failure.retry_after is not None:
            delay = max(delay, failure.retry_after)
        if within(plan.blocking.max_elapsed, delay) and within(plan.total.max_elapsed, delay):
            return Decision(Action.RETRY, failure.code, delay)
    if plan.tiers:
        delay = plan.tier_delay(history.tier_step + 1)
        if within(plan.total.max_elapsed, delay):
            return Decision(Action.RETRY_LATER, failure.code, delay)
    return exhausted

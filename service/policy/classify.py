"""`classify`: what to do with a record that failed, as data (quarantine, retry after a delay, reject)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from service.domain.codes import ErrorCode, FailureKind
from service.policy.retry import AttemptHistory, RetryPolicy


class Action(StrEnum):
    """The three ways out of a failure."""

    RETRY = "retry"
    QUARANTINE = "quarantine"
    REJECT = "reject"


@dataclass(frozen=True)
class Failure:
    """One failed attempt: a stable code and, for rate limits, the server's requested pause."""

    code: ErrorCode
    retry_after: timedelta | None = None


@dataclass(frozen=True)
class Decision:
    """The state machine's answer; the shell applies it in one transaction."""

    action: Action
    code: ErrorCode
    delay: timedelta | None = None


def classify(
    failure: Failure, history: AttemptHistory, policy: RetryPolicy, now: datetime, rng: random.Random
) -> Decision:
    """Decide the next step for a record whose attempt number `history.attempts` just failed."""
    kind = failure.code.kind
    if kind is FailureKind.REJECTED:
        return Decision(Action.REJECT, failure.code)
    if kind is FailureKind.INVALID:
        return Decision(Action.QUARANTINE, failure.code)
    budget = policy.budget(kind)
    delay = policy.backoff(history.attempts, rng)
    if failure.retry_after is not None:
        delay = max(delay, failure.retry_after)
    # Waiting past the elapsed budget only to give up afterwards would hold the partition for nothing.
    out_of_attempts = history.attempts >= budget.max_attempts
    out_of_time = (now + delay) - history.first_failed_at > budget.max_elapsed
    if out_of_attempts or out_of_time:
        return Decision(Action.QUARANTINE, failure.code.exhausted())
    return Decision(Action.RETRY, failure.code, delay)

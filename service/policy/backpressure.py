"""Backpressure: when a downstream asks us to slow down, pause instead of spending retry attempts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from service.domain.codes import ErrorCode, FailureKind
from service.policy.classify import Failure


@dataclass(frozen=True)
class BackpressurePolicy:
    """When to pause fetching, and for how long.

    A 429 with `Retry-After` pauses for that long. A run of `after_failures` consecutive transient failures
    from one downstream pauses for `pause`, doubling with each further failure of the run, up to `max_pause`.
    """

    after_failures: int = 5
    pause: timedelta = timedelta(seconds=2)
    max_pause: timedelta = timedelta(minutes=1)


def run_after_round(before: int, failed_now: int, policy: BackpressurePolicy) -> int:
    """The length of a downstream's run of consecutive failures after a round in which `failed_now` records failed
    on it (and none succeeded). A round of many failures is one outage seen many times: it may bring the run up
    to the threshold at once (the breaker opens before the records caught in it spend their attempts), but past
    the threshold the run grows by one per round, so the pause doubles per round, not per record."""
    if failed_now <= 0:
        return before
    return max(before + 1, min(before + failed_now, policy.after_failures))


def pause_for(failure: Failure, consecutive_failures: int, policy: BackpressurePolicy) -> timedelta | None:
    """How long to pause the partition of a record that failed this way, or None to treat it as an attempt."""
    if failure.code is ErrorCode.RATE_LIMITED and failure.retry_after:
        return min(failure.retry_after, policy.max_pause)
    if failure.code.kind is FailureKind.TRANSIENT and consecutive_failures >= policy.after_failures:
        doublings = min(consecutive_failures - policy.after_failures, 16)
        pause: timedelta = min(policy.max_pause, policy.pause * 2**doublings)
        return pause
    return None

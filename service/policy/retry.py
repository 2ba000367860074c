"""Retry budget, backoff and the retry schedule: how many attempts, how much time, and when.

A record's budget (attempts AND elapsed time since its first failure) spans everything: the blocking
retries of its first delivery and every non-blocking retry tier after it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from service.codes import FailureKind
from service.durations import format_duration, parse_duration
from service.policy import backoff

# RocketMQ's delay levels 3..18 (its retry schedule for concurrent consumers): retry n waits
# ROCKETMQ_DELAYS[n - 1], and every retry after the 16th waits the last one, 2h.
_ROCKETMQ_LEVELS = ("10s", "30s", "1m", "2m", "3m", "4m", "5m", "6m", "7m", "8m", "9m", "10m", "20m", "30m", "1h", "2h")
ROCKETMQ_DELAYS = tuple(parse_duration(level) for level in _ROCKETMQ_LEVELS)
ROCKETMQ_MAX_RETRIES = 16
# RocketMQ's orderly consumers retry in place at a fixed interval (suspendCurrentQueueTimeMillis, 1s).
ORDERLY_INTERVAL = timedelta(seconds=1)


@dataclass(frozen=True)
class Budget:
    """Both limits apply: a record stops retrying at whichever is reached first."""

    max_attempts: int
    max_elapsed: timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """The whole retry plan of a record: blocking phase, non-blocking tiers, and the overall budget."""

    total: Budget
    blocking: Budget = Budget(3, timedelta(seconds=5))
    tiers: tuple[timedelta, ...] = ()
    base_delay: timedelta = timedelta(milliseconds=200)
    max_delay: timedelta = timedelta(seconds=5)

    @property
    def unknown(self) -> RetryPolicy:
        """Unknown failures are probably bugs: retrying them long only delays the quarantine.

        At most 2 attempts (within the blocking budget), a quarter of the elapsed budget, no tiers.
        """
        total = Budget(min(2, self.total.max_attempts), self.total.max_elapsed / 4)
        blocking = Budget(min(2, self.blocking.max_attempts), min(self.blocking.max_elapsed, total.max_elapsed))
        return replace(self, total=total, blocking=blocking, tiers=())

    def for_kind(self, kind: FailureKind) -> RetryPolicy:
        """The plan for a failure kind (only transient and unknown failures are retried)."""
        return self.unknown if kind is FailureKind.UNKNOWN else self

    def backoff(self, attempt: int, rng: random.Random) -> timedelta:
        """Exponential backoff with equal jitter (service/policy/backoff.py)."""
        return backoff.equal_jitter(backoff.exponential(self.base_delay, attempt, self.max_delay), rng)

    def tier_delay(self, step: int) -> timedelta:
        """The wait before tier retry number `step` (1-based); past the last tier, the last delay repeats."""
        return self.tiers[min(step, len(self.tiers)) - 1]

    @property
    def tier_labels(self) -> tuple[str, ...]:
        """The distinct tier delays as topic suffixes (`30s`, `5m`), in schedule order."""
        return tuple(dict.fromkeys(format_duration(delay) for delay in self.tiers))

    @property
    def horizon(self) -> timedelta:
        """The longest time after its first delivery that a record can still be delivered again."""
        return self.total.max_elapsed


def build_policy(
    tiers: str,
    ordering: str,
    *,
    max_attempts: int | None,
    max_elapsed: timedelta | None,
    blocking: Budget,
) -> RetryPolicy:
    """The policy for the configured tiers (`30s,5m` or `rocketmq`), filling in documented defaults.

    Defaults: without tiers (`ORDERS_RETRY_TIERS=`), the blocking phase is the whole budget and the budget
    defaults to the blocking one. With tier delays, every tier is tried once after the blocking attempts
    and the elapsed budget is the larger of 15 minutes and twice the tiers' sum. With `rocketmq`, max
    retries N means at most N+1 deliveries (default N = 16, so 17 attempts), no blocking retries, and 24
    hours; in strict per-key mode (`ORDERS_ORDERING=key`) every retry waits the fixed orderly interval
    instead of the growing table.
    """
    if tiers == "rocketmq":
        delays = (ORDERLY_INTERVAL,) if ordering == "key" else ROCKETMQ_DELAYS
        attempts = max_attempts or ROCKETMQ_MAX_RETRIES + 1
        elapsed = max_elapsed or timedelta(hours=24)
        return RetryPolicy(Budget(attempts, elapsed), Budget(1, elapsed), delays)
    delays = tuple(parse_duration(part) for part in tiers.split(",") if part.strip())
    if not delays:
        # No tiers: every retry is a blocking one, so the blocking phase is the whole budget.
        budget = Budget(max_attempts or blocking.max_attempts, max_elapsed or blocking.max_elapsed)
        return RetryPolicy(budget, budget, ())
    attempts = max_attempts or blocking.max_attempts + len(delays)
    elapsed = max_elapsed or max(timedelta(minutes=15), 2 * sum(delays, timedelta()))
    return RetryPolicy(Budget(attempts, elapsed), blocking, delays)


@dataclass(frozen=True)
class AttemptHistory:
    """What the record has been through so far; it travels with the record through the tiers."""

    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime
    tier_step: int = 0  # how many non-blocking tier deliveries the record has had
    # Time since its first failure that does not count against its elapsed budget: while our own database or broker
    # was unreachable, and while a tier copy waited past its due time for our relay, broker or consumer.
    excused: timedelta = timedelta(0)

    def failed_again(self, now: datetime, excused: timedelta = timedelta(0)) -> AttemptHistory:
        """The history after one more failed attempt (`excused`: more time not to count since the last one)."""
        return replace(self, attempts=self.attempts + 1, last_failed_at=now, excused=self.excused + excused)

    def excusing(self, excused: timedelta) -> AttemptHistory:
        """The history with more time not to count against the elapsed budget."""
        return replace(self, excused=self.excused + excused) if excused > timedelta(0) else self

    def elapsed(self, now: datetime) -> timedelta:
        """How much of the elapsed budget the record has spent by `now`."""
        return now - self.first_failed_at - self.excused

    def sent_to_tier(self) -> AttemptHistory:
        """The history of the copy that goes to the next tier."""
        return replace(self, tier_step=self.tier_step + 1)

    @staticmethod
    def first(now: datetime) -> AttemptHistory:
        """The history after the first failed attempt."""
        return AttemptHistory(1, now, now)

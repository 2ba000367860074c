"""Retry budget and backoff: how many attempts and how much time a failing record may use."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.domain.codes import FailureKind


@dataclass(frozen=True)
class Budget:
    """Both limits apply: a record stops retrying at whichever is reached first."""

    max_attempts: int
    max_elapsed: timedelta


@dataclass(frozen=True)
class RetryPolicy:
    """Budgets per failure kind and the backoff curve of blocking retries."""

    transient: Budget
    base_delay: timedelta = timedelta(milliseconds=200)
    max_delay: timedelta = timedelta(seconds=5)

    @property
    def unknown(self) -> Budget:
        """Unknown failures are probably bugs: retrying them long only delays the quarantine.

        They get at most 2 attempts and a quarter of the transient elapsed budget.
        """
        return Budget(min(2, self.transient.max_attempts), self.transient.max_elapsed / 4)

    def budget(self, kind: FailureKind) -> Budget:
        """The budget for a failure kind (only transient and unknown failures are retried)."""
        return self.unknown if kind is FailureKind.UNKNOWN else self.transient

    def backoff(self, attempt: int, rng: random.Random) -> timedelta:
        """Exponential backoff with equal jitter: half fixed so retries never bunch at zero, half random."""
        # Cap the exponent first: 2**999 times a delay overflows timedelta long before the cap applies.
        doublings = min(max(0, attempt - 1), 32)
        ceiling: timedelta = min(self.max_delay, self.base_delay * (2**doublings))
        half = ceiling / 2
        return half + half * rng.random()


@dataclass(frozen=True)
class AttemptHistory:
    """What the record has been through so far; it travels with the record."""

    attempts: int
    first_failed_at: datetime
    last_failed_at: datetime

    def failed_again(self, now: datetime) -> AttemptHistory:
        """The history after one more failed attempt."""
        return AttemptHistory(self.attempts + 1, self.first_failed_at, now)

    @staticmethod
    def first(now: datetime) -> AttemptHistory:
        """The history after the first failed attempt."""
        return AttemptHistory(1, now, now)

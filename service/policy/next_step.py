"""The next step of a delivery whose attempt failed: retry in place, hand over to a retry tier, quarantine, or
pause because the downstream asked us to slow down.

Pure: `next_step` reads the delivery's retry state, the failure, the budgets (service/policy/retry.py), the
backpressure policy (service/policy/backpressure.py) with the downstream's run of consecutive failures, the
clock and a random source for the backoff's jitter, and returns the step with the delivery's new retry state.
The processor applies it (its log lines, the pause's record); the lanes keep the new state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ClassVar

from service.domain.codes import ErrorCode
from service.policy.backpressure import BackpressurePolicy, pause_for
from service.policy.classify import Action, Failure, classify
from service.policy.delivery import Delivery, RetryState
from service.policy.retry import AttemptHistory, RetryPolicy


@dataclass(frozen=True, slots=True)
class RetryInPlace:
    """Attempt it again after `delay`, in place: the records of its key behind it wait."""

    action: ClassVar[str] = Action.RETRY.value
    state: RetryState
    delay: timedelta


@dataclass(frozen=True, slots=True)
class ToTier:
    """Hand it over to the retry tier whose delay is `delay` on the next write (a copy via the outbox)."""

    action: ClassVar[str] = Action.RETRY_LATER.value
    state: RetryState
    delay: timedelta


@dataclass(frozen=True, slots=True)
class Quarantine:
    """Quarantine it with `code` on the next write: invalid input, or its budget is spent. `delay`: its
    quarantine was the write that failed, and the next one waits this long (see `next_step`)."""

    action: ClassVar[str] = Action.QUARANTINE.value
    state: RetryState
    code: ErrorCode
    delay: timedelta | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait `duration` without spending an attempt, pausing its partition: the downstream asked for it."""

    action: ClassVar[str] = "pause"
    state: RetryState
    duration: timedelta


NextStep = RetryInPlace | ToTier | Quarantine | Pause

# How long a record whose quarantine write failed waits before the next: the first wait, doubled with each
# refusal in a row, up to the longest.
_FIRST_QUARANTINE_WAIT = timedelta(seconds=1)
_LONGEST_QUARANTINE_WAIT = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Budgets:
    """The retry plan of a delivery, and of a reprocessed one: the blocking retries only (if it fails again it
    goes back to quarantine, nothing flows back on its own)."""

    policy: RetryPolicy
    reprocess: RetryPolicy

    @staticmethod
    def of(policy: RetryPolicy) -> Budgets:
        """The budgets of a consumer whose retry plan is `policy`."""
        return Budgets(policy, replace(policy, tiers=()))


def next_step(
    delivery: Delivery,
    state: RetryState,
    failure: Failure,
    *,
    budgets: Budgets,
    backpressure: BackpressurePolicy,
    failing: int,
    now: datetime,
    loop_now: float,
    rng: random.Random,
) -> NextStep:
    """Decide what follows the failed attempt of `delivery` (retry state `state`).

    `failing` is the length of the run of consecutive transient failures of the failure's downstream, after
    this round (service/policy/backpressure.py, `run_after_round`); `now` is the wall clock, `loop_now` the loop
    time that due times are on.
    """
    pause = pause_for(failure, failing, backpressure)
    if pause is not None:
        started = state.history.first_failed_at if state.history else now
        # The elapsed budget still runs while it waits, so a downstream that never comes back still ends in
        # quarantine: a pause that would end past the budget is an ordinary failed attempt instead.
        if (now + pause) - started <= budgets.policy.for_kind(failure.code.kind).total.max_elapsed:
            history = state.history or AttemptHistory(0, now, now)
            due = loop_now + pause.total_seconds()
            return Pause(RetryState(history, due, True, state.verdict, state.next_tier, state.last_code), pause)
    history = state.history.failed_again(now) if state.history else AttemptHistory.first(now)
    verdict = state.verdict or (delivery.decoded.code if delivery.failed else None)
    if verdict is not None:
        # The attempt that failed was its quarantine: a spent budget, or input that does not decode (quarantined
        # with its own code, not an exhausted budget's). A database that refuses it, and its last resort, for
        # other than an outage (a constraint, a trigger) refuses the next one too; a lock or statement timeout is
        # over soon. The record holds its key, as any record not yet terminal does, and the next try waits twice
        # as long as the last one, from 1 s to 5 min, instead of following at once, for ever.
        refused = state.refused + 1
        delay = min(_FIRST_QUARANTINE_WAIT * 2 ** min(refused - 1, 16), _LONGEST_QUARANTINE_WAIT)
        due = loop_now + delay.total_seconds()
        return Quarantine(RetryState(history, due, False, verdict, None, failure.code, refused), verdict, delay)
    policy = budgets.reprocess if delivery.reprocess else budgets.policy
    decision = classify(failure, history, policy, now, rng, in_tier=delivery.in_tier)
    if decision.action is Action.RETRY and decision.delay is not None:
        due = loop_now + decision.delay.total_seconds()
        retried = RetryState(history, due, False, state.verdict, state.next_tier, failure.code)
        return RetryInPlace(retried, decision.delay)
    if decision.action is Action.RETRY_LATER and decision.delay is not None:
        return ToTier(RetryState(history, loop_now, False, None, decision.delay, failure.code), decision.delay)
    # Quarantine (a rejection answered by a look-up is no business outcome of the record: quarantined too).
    return Quarantine(RetryState(history, loop_now, False, decision.code, None, failure.code), decision.code)

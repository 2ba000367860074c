"""The next step of a delivery whose attempt failed: retry in place, hand over to a retry tier, quarantine, or wait
for the downstream's circuit breaker without spending an attempt.

Pure: `next_step` reads the delivery's retry state, the failure (whether the downstream's breaker charged it:
service/policy/breaker.py), the budgets (service/policy/retry.py), the clock, the process's own downtime so far and
a random source for the backoff's jitter, and returns the step with the delivery's new retry state. The processor
applies it (its log lines); the lanes keep the new state.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import ClassVar

from service.codes import ErrorCode, FailureKind
from service.policy import backoff
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
class Wait:
    """Wait `duration` for the downstream's breaker without spending an attempt (the records of its key behind it
    wait too; other keys and records that do not need the downstream flow)."""

    action: ClassVar[str] = "wait"
    state: RetryState
    duration: timedelta


NextStep = RetryInPlace | ToTier | Quarantine | Wait

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
    now: datetime,
    loop_now: float,
    rng: random.Random,
    downtime: float = 0.0,
) -> NextStep:
    """Decide what follows the failed attempt of `delivery` (retry state `state`).

    `now` is the wall clock, `loop_now` the loop time that due times are on; `downtime`: how long, in seconds, this
    process has so far been unable to work because its own database or broker was unreachable (the part of it since
    the record's last failure does not count against its elapsed budget).
    """
    excused = timedelta(seconds=max(0.0, downtime - state.downtime_mark)) if state.history else timedelta(0)
    verdict = state.verdict or (delivery.decoded.code if delivery.failed else None)
    if verdict is not None:
        # The attempt that failed was its quarantine: a spent budget, or input that does not decode (quarantined
        # with its own code, not an exhausted budget's). A database that refuses it, and its last resort, for
        # other than an outage (a constraint, a trigger) refuses the next one too; a lock or statement timeout is
        # over soon. The record holds its key, as any record not yet terminal does, and the next try waits twice
        # as long as the last one, from 1 s to 5 min, instead of following at once, for ever.
        history = state.history.failed_again(now, excused) if state.history else AttemptHistory.first(now)
        refused = state.refused + 1
        delay = backoff.exponential(_FIRST_QUARANTINE_WAIT, refused, _LONGEST_QUARANTINE_WAIT)
        due = loop_now + delay.total_seconds()
        waited = RetryState(history, due, state.breaker, verdict, None, failure.code, refused, downtime)
        return Quarantine(waited, verdict, delay)
    policy = budgets.reprocess if delivery.reprocess else budgets.policy
    if not failure.charged:
        return _wait_for_breaker(state, failure, policy, now, loop_now, downtime, excused)
    history = state.history.failed_again(now, excused) if state.history else AttemptHistory.first(now)
    decision = classify(failure, history, policy, now, rng, in_tier=delivery.in_tier)
    if decision.action is Action.RETRY and decision.delay is not None:
        due = loop_now + decision.delay.total_seconds()
        retried = RetryState(history, due, None, state.verdict, state.next_tier, failure.code, 0, downtime)
        return RetryInPlace(retried, decision.delay)
    if decision.action is Action.RETRY_LATER and decision.delay is not None:
        handed = RetryState(history, loop_now, None, None, decision.delay, failure.code, 0, downtime)
        return ToTier(handed, decision.delay)
    # Quarantine (a rejection answered by a look-up is no business outcome of the record: quarantined too).
    spent = RetryState(history, loop_now, None, decision.code, None, failure.code, 0, downtime)
    return Quarantine(spent, decision.code)


def charged_once(
    failure: Failure, waiting: Sequence[Delivery], due: Mapping[Delivery, RetryState]
) -> dict[Delivery, Failure]:
    """The failure of one call that every delivery of `waiting` needed (one look-up asked for many records: many
    records about one thing), charged to one of them: the one with the fewest attempts spent, the first in lane order
    among equals. One call is one attempt: charging each record that waited on it would spend a hundred records in a
    few calls, and no breaker could tell an outage from it (one request failing is not enough to open one). The others
    wait for the downstream uncharged (`Wait`), their elapsed budgets running; the one charged changes from call to
    call. A failure that is not transient (a bug's) is each record's own."""
    if len(waiting) == 1 or not failure.charged or failure.code.kind is not FailureKind.TRANSIENT:
        return dict.fromkeys(waiting, failure)
    payer = min(waiting, key=lambda delivery: _attempts(due[delivery]))
    spared = replace(failure, charged=False)
    return {delivery: failure if delivery is payer else spared for delivery in waiting}


def _attempts(state: RetryState) -> int:
    return state.history.attempts if state.history is not None else 0


# How long a record refused by a breaker waits when the breaker gave no time (its probe is out): it is woken as soon
# as the breaker closes anyway.
_BREAKER_POLL = timedelta(seconds=1)


def _wait_for_breaker(
    state: RetryState,
    failure: Failure,
    policy: RetryPolicy,
    now: datetime,
    loop_now: float,
    downtime: float,
    excused: timedelta,
) -> Wait | Quarantine:
    """A failure the downstream's breaker did not charge: the record waits for the breaker, spending no attempt. Its
    elapsed budget keeps running (from its first failure, or from now: a record the breaker refused before its first
    call has failed now); once it is spent, the record is quarantined with the breaker named, the one quarantine that
    follows no failed attempt of its own."""
    history = state.history.excusing(excused) if state.history else AttemptHistory(0, now, now)
    left = policy.for_kind(failure.code.kind).total.max_elapsed - history.elapsed(now)
    if left <= timedelta(0):
        code = failure.code.exhausted()
        spent = RetryState(history, loop_now, failure.downstream, code, None, failure.code, 0, downtime)
        return Quarantine(spent, code)
    wait = min(failure.retry_after if failure.retry_after is not None else _BREAKER_POLL, left)
    waiting = RetryState(
        history, loop_now + wait.total_seconds(), failure.downstream, None, None, failure.code, 0, downtime
    )
    return Wait(waiting, wait)

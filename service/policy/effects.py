"""The effect state machine: what a provider's answer (or a reconciler's look-up) means for an effect row.

pending ──claim──▶ in_flight ──answer──▶ sent | failed | pending (retry later) | uncertain
in_flight ──lease expired (a crashed worker)──▶ uncertain
uncertain ──look-up──▶ sent (found) | pending (not found, at most `max_reconciles` times) | failed
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta

from service.codes import Code, ErrorCode
from service.policy import backoff


@dataclass(frozen=True)
class Sent:
    """The provider did it; `reference` is its id (a charge's id, a message's id)."""

    reference: str


@dataclass(frozen=True)
class Refused:
    """A permanent answer (402, 422): the effect will never succeed; a core code or one the domain registers."""

    code: Code


@dataclass(frozen=True)
class NotSent:
    """A transient failure before the provider acted (429, 5xx, connection refused), or a call the provider's breaker
    did not let out: safe to try again. `charged`: it spends one of the effect's attempts (not while the breaker is
    open, nor for our own configuration)."""

    code: ErrorCode
    retry_after: timedelta | None = None
    charged: bool = True


@dataclass(frozen=True)
class Unknown:
    """The request may have been acted on (timeout after sending, connection cut mid-request)."""

    code: ErrorCode


CallOutcome = Sent | Refused | NotSent | Unknown


@dataclass(frozen=True)
class Found:
    """The provider's look-up knows the effect."""

    reference: str


@dataclass(frozen=True)
class Missing:
    """The provider's look-up does not know the effect: it has not happened, or not yet (a request it still
    works on)."""


@dataclass(frozen=True)
class LookupFailed:
    """The look-up itself failed; the effect stays uncertain until the next reconcile. `charged`: it counts against
    the provider (not when its breaker refused it or the answer was not the API's own)."""

    code: ErrorCode
    charged: bool = True


LookupOutcome = Found | Missing | LookupFailed


@dataclass(frozen=True)
class EffectPolicy:
    """Retry budget of effect calls, and how often the reconciler may send a not-found effect back."""

    max_attempts: int = 8
    base_delay: timedelta = timedelta(seconds=1)
    max_delay: timedelta = timedelta(minutes=5)
    max_reconciles: int = 3
    # An effect whose call is answered as if our URL or credentials were wrong while its provider answers the others
    # (its breaker cleared it: one request's trouble) is tried again this much later, spending nothing.
    alone_misconfigured_wait: timedelta = timedelta(seconds=30)


# The answers that are about our configuration, not the effect (401/403; a redirect, 404, 405 to a call).
_OUR_CONFIGURATION = frozenset({ErrorCode.PROVIDER_UNAUTHORIZED, ErrorCode.PROVIDER_MISCONFIGURED})


@dataclass(frozen=True)
class EffectDecision:
    """The next state of an effect row."""

    state: str
    code: Code | None = None
    reference: str | None = None
    retry_in: timedelta | None = None
    # The claim made no call that counts (handed back unmade, or refused our credentials): not an attempt.
    unmade: bool = False


def after_call(
    outcome: CallOutcome,
    attempts: int,
    policy: EffectPolicy,
    rng: random.Random,
    *,
    quiet: timedelta = timedelta(0),
) -> EffectDecision:
    """Decide an effect's state from the provider's answer to attempt number `attempts`.

    `quiet`: how long the provider may still act on a request it answered with a 5xx (a gateway's answer while
    the provider works on), for a kind whose resend is decided by a look-up: the retry waits at least that long.
    """
    if isinstance(outcome, Sent):
        return EffectDecision("sent", reference=outcome.reference)
    if isinstance(outcome, Refused):
        return EffectDecision("failed", outcome.code)
    if isinstance(outcome, Unknown):
        return EffectDecision("uncertain", outcome.code)
    if not outcome.charged:
        # Not this effect's doing, so it keeps its budget whole. Refused by its provider's breaker, or answered with
        # what the API never answers (which opened it): claimed again once the breaker lets calls through (the lanes
        # wait for it; a 429's Retry-After is kept for processes whose breaker is closed). Answered so while the
        # provider answers the others (the breaker charged it as its own trouble): a while later, so that it cannot
        # keep a provider busy.
        if outcome.retry_after is not None:
            retry_in = outcome.retry_after
        else:
            retry_in = policy.alone_misconfigured_wait if outcome.code in _OUR_CONFIGURATION else timedelta(0)
        return EffectDecision("pending", outcome.code, retry_in=retry_in, unmade=True)
    if attempts >= policy.max_attempts:
        return EffectDecision("failed", outcome.code.exhausted())
    delay = backoff.equal_jitter(backoff.exponential(policy.base_delay, attempts, policy.max_delay), rng)
    if outcome.retry_after is not None:
        delay = max(delay, outcome.retry_after)
    if outcome.code is ErrorCode.DOWNSTREAM_UNAVAILABLE:
        delay = max(delay, quiet)
    return EffectDecision("pending", outcome.code, retry_in=delay)


def after_lookup(
    outcome: LookupOutcome, reconciles: int, policy: EffectPolicy, *, quiet: timedelta = timedelta(0)
) -> EffectDecision | None:
    """Decide an uncertain effect's state from a look-up; None leaves it uncertain for the next run.

    `reconciles` counts the times it was already sent back to pending as not found. `quiet`: how long the
    provider may still act on the request whose answer we did not get. Not found now is not "never": for a kind
    whose resend is decided by a look-up (no idempotency), the next attempt, and its look-up, waits that long.
    """
    if isinstance(outcome, Found):
        return EffectDecision("sent", reference=outcome.reference)
    if isinstance(outcome, LookupFailed):
        return None
    if reconciles >= policy.max_reconciles:
        return EffectDecision("failed", ErrorCode.NOT_FOUND_AFTER_RECONCILE)
    return EffectDecision("pending", ErrorCode.OUTCOME_UNKNOWN, retry_in=quiet)


# A claim and its outcomes cost two commits whatever their size, so a lane claims what its calls can make within
# this long at the recent pace of its provider: many at once from a fast provider, one round of calls from a slow
# one (a claimed effect waits for its call under its lease, where no other worker can take it).
CLAIM_HORIZON_SECONDS = 0.2
MAX_CLAIM = 500


def claim_size(concurrency: int, call_seconds: float | None, rounds_in_lease: int) -> int:
    """How many effects a lane claims at once, with `concurrency` calls in flight that recently took
    `call_seconds` each (None: no call yet): whole rounds of calls within CLAIM_HORIZON_SECONDS, at least one
    round, at most MAX_CLAIM (or one round, when that is more), and never more rounds than `rounds_in_lease`,
    how many rounds of calls that each take their longest fit in the lease (a provider may slow down at once)."""
    if call_seconds is None:
        return concurrency
    rounds = min(int(CLAIM_HORIZON_SECONDS / max(call_seconds, 1e-6)), max(rounds_in_lease, 1))
    return max(concurrency, min(MAX_CLAIM, concurrency * rounds))

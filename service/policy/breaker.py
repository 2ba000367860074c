"""A circuit breaker per downstream: a pure state machine over immutable values.

```
closed ──a run of `threshold` failed calls; an answer not the API's own; a 429 with Retry-After──▶ open (a run of
         one request alone: suspecting it)
open ──its time is up: the next call is the one probe──▶ half_open
open ──a request whose probe has not failed in this spell asks (suspects only)──▶ half_open, its probe
half_open ──the probe is answered by the API──▶ closed
half_open ──the probe fails, and `threshold` different requests' probes (2 for answers not the API's own) have failed
            in this spell──▶ open again, for twice as long (at most `longest_open`), suspecting nobody
half_open ──the probe fails, fewer different requests' probes having failed──▶ open, suspecting those requests
```

While the breaker is not closed, no call is charged to a record or an effect: a call it refuses is not made, and
a failed call is charged only when the breaker is closed before and after it (`record` says so). The run that
opens it is charged up to its last call, which opens it and is charged to nobody: in a round of many look-ups
that fail together, only the first `threshold - 1` are charged, and only if their answers come first. A run of one
request alone (one key failing again and again, or the one key that a hundred records wait on) opens it suspecting
that request: any other request may probe at once, and the first that is answered closes it, so a request that fails
alone holds back nobody while other requests are made, and is charged again (as its record's own trouble) once it
closes; when it is the only request there is, it waits with everyone for the probe, as in any outage. An answer that
is not the API's own opens it at once and is charged to nobody: it is our configuration (a wrong URL, a refused
credential), never the record's, and a record must not spend its attempts on it (contract §6); seen by one request
alone, it suspects that request the same way (a wrong URL answers the next request as it answered the first, and
the breaker stays open for everyone).
A probe is held to the same rule: a request that fails alone again and again (a key its downstream never finds)
must not keep the breaker open once the downstream is back. When a probe fails, the breaker stays open for twice as
long, but the request is a suspect: any other request may probe at once, and the first that is answered closes it.
Only when `threshold` different requests' probes have failed (2 for answers not the API's own) is it an outage that
every request waits out. A suspect is refused until the breaker closes, and then charged as any lone failure is.
Clock readings are seconds on a monotonic clock; the shell (service/adapters/breakers.py) reads it and keeps
the current value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from service.codes import ErrorCode
from service.policy import backoff


class State(StrEnum):
    """Where a breaker stands."""

    CLOSED = "closed"  # calls go through
    OPEN = "open"  # calls are refused until `until`
    HALF_OPEN = "half_open"  # one probe call is out; the others are refused until it is answered


class Verdict(StrEnum):
    """What one call said about its downstream."""

    OK = "ok"  # the API answered as itself (a refusal or "not found" of its own included): it works
    FAILED = "failed"  # an outage: 5xx, 429, a timeout, a connection refused or cut
    MISCONFIGURED = "misconfigured"  # an answer that is not the API's own: our URL or credentials, not an outage


class Admission(StrEnum):
    """What `admit` lets a call do."""

    CALL = "call"  # closed: go ahead
    PROBE = "probe"  # the one call that tries a downstream whose breaker is open
    REFUSED = "refused"  # not made: the breaker is open, or its probe is out


@dataclass(frozen=True, slots=True)
class Outcome:
    """A call's verdict, the code of a failure, and a 429's Retry-After in seconds."""

    verdict: Verdict
    code: ErrorCode | None = None
    retry_after: float | None = None
    target: str | None = None  # what was asked for (a looked-up key, an idempotency key); None: cannot tell apart
    status: int | None = None  # the HTTP status of the answer, when there was one (logged: 401 or a wrong URL?)


OK = Outcome(Verdict.OK)


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a breaker opens and for how long (seconds)."""

    threshold: int = 5  # consecutive failed calls that open it
    first_open: float = 2.0  # how long it stays open the first time; doubled with each failed probe
    longest_open: float = 60.0
    probe_timeout: float = 60.0  # a probe never answered (its task cancelled) is given up after this long
    # A 429's Retry-After is honoured, at least this long (a `Retry-After: 0` would make every call a probe) and at
    # most this long (a provider's number may be anything).
    shortest_retry_after: float = 1.0
    longest_retry_after: float = 600.0


@dataclass(frozen=True, slots=True)
class Breaker:
    """One downstream's breaker."""

    state: State = State.CLOSED
    failures: int = 0  # closed: the run of consecutive failed calls
    targets: frozenset[str] = frozenset()  # closed: the requests the run failed on (two are enough to know)
    openings: int = 0  # times it opened since it was last closed: how long it stays open
    until: float = 0.0  # open: when the probe may go; half-open: when a probe never answered is given up
    since: float | None = None  # when it left closed
    code: ErrorCode | None = None  # the failure that opened it (and keeps it open)
    misconfigured: bool = False  # opened by an answer that is not the API's own
    status: int | None = None  # the HTTP status of the answer that opened it, if any
    # open or half-open: the requests whose probes failed in this spell; any other request may probe before `until`
    suspects: frozenset[str] = frozenset()
    # Suspects that another request's answer cleared (it closed the breaker): their failures are their own, charged to
    # their records or effects, and never open it again (a hostile key a firewall refuses cannot make it flap). Kept
    # through openings by one request alone; forgotten when it opens for everyone, or when the request is answered.
    cleared: frozenset[str] = frozenset()

    def wait(self, now: float) -> float:
        """How long a refused call should wait before it is tried again, in seconds (0 when closed).

        A probe that is out is answered within the HTTP timeout: a refused call waits a second and is woken at once
        by the shell when the breaker moves."""
        if self.state is State.CLOSED:
            return 0.0
        if self.state is State.OPEN:
            return max(0.0, self.until - now)
        return min(1.0, max(0.0, self.until - now))


CLOSED = Breaker()


def admit(breaker: Breaker, now: float, policy: BreakerPolicy, target: str | None = None) -> tuple[Admission, Breaker]:
    """May a call asking for `target` be made now? A breaker whose open time is up (or whose probe was never answered)
    lets exactly one call through, as its probe, and a new spell of suspects begins; before then, an open breaker with
    suspects lets one call through as its probe if it asks for another request than theirs."""
    if breaker.state is State.CLOSED:
        return Admission.CALL, breaker
    if now >= breaker.until:
        return Admission.PROBE, replace(
            breaker, state=State.HALF_OPEN, until=now + policy.probe_timeout, suspects=frozenset()
        )
    if breaker.state is State.OPEN and breaker.suspects and target is not None and target not in breaker.suspects:
        return Admission.PROBE, replace(breaker, state=State.HALF_OPEN, until=now + policy.probe_timeout)
    return Admission.REFUSED, breaker


def record(
    breaker: Breaker, outcome: Outcome, now: float, policy: BreakerPolicy, *, probe: bool
) -> tuple[Breaker, bool]:
    """The breaker after a call's outcome, and whether the call is charged to its record or effect (a failure while
    the breaker stays closed). `probe`: the call was admitted as the probe."""
    if probe and breaker.state is State.HALF_OPEN:
        if outcome.verdict is Verdict.OK:
            return replace(CLOSED, cleared=_clear(breaker.cleared, breaker.suspects, outcome.target)), False
        return _probe_failed(breaker, outcome, now, policy), False
    if breaker.state is not State.CLOSED:
        # A call admitted before the breaker opened, answered now: the probe decides. A longer Retry-After keeps it
        # open longer.
        later = now + _retry_after(outcome.retry_after, policy) if outcome.retry_after is not None else 0.0
        if breaker.state is State.OPEN and later > breaker.until:
            return replace(breaker, until=later), False
        return breaker, False
    if outcome.verdict is Verdict.OK:
        if breaker.failures == 0 and outcome.target not in breaker.cleared:
            return breaker, False
        return replace(CLOSED, cleared=breaker.cleared - {outcome.target}), False
    if outcome.retry_after is not None:
        return _open(breaker, outcome, now, policy), False
    if outcome.target in breaker.cleared:
        return breaker, True  # its own trouble, as another request's answer showed: charged, never a run's
    failures = breaker.failures + 1
    targets = breaker.targets
    if outcome.target is not None and len(targets) < 2:
        targets = targets | {outcome.target}
    # An answer not the API's own is our URL or credentials, never the record's: it opens at once.
    if failures >= policy.threshold or outcome.verdict is Verdict.MISCONFIGURED:
        opened = _open(breaker, outcome, now, policy)
        if outcome.target is not None and targets == {outcome.target}:
            # One request alone: suspected, so that any other may probe at once (a request that fails alone, or that
            # some proxy answers oddly, holds back nobody once another request is answered).
            return replace(opened, suspects=targets, cleared=breaker.cleared), False
        return opened, False
    return replace(breaker, failures=failures, targets=targets), True


def release(breaker: Breaker, now: float) -> Breaker:
    """A probe that ended without an answer (its task was cancelled): the next call probes instead."""
    if breaker.state is State.HALF_OPEN:
        return replace(breaker, state=State.OPEN, until=now)
    return breaker


def _probe_failed(breaker: Breaker, outcome: Outcome, now: float, policy: BreakerPolicy) -> Breaker:
    """Open again after a failed probe: suspecting its request while too few different requests' probes failed in this
    spell to tell an outage from a request that fails alone; the spell's first failure doubles the open time."""
    again = bool(breaker.suspects)  # not the spell's first failed probe: its opening was counted
    if outcome.target is None or outcome.retry_after is not None:
        return _open(breaker, outcome, now, policy, again=again)  # cannot tell requests apart; a 429 speaks for all
    suspects = breaker.suspects | {outcome.target}
    threshold = 2 if outcome.verdict is Verdict.MISCONFIGURED else policy.threshold
    opened = _open(breaker, outcome, now, policy, again=again)
    if len(suspects) >= min(threshold, policy.threshold):
        return opened
    return replace(opened, suspects=suspects, cleared=breaker.cleared)


_MOST_CLEARED = 16  # cleared requests kept at once (a breaker is a small value; more are charged as runs are)


def _clear(cleared: frozenset[str], suspects: frozenset[str], closer: str | None) -> frozenset[str]:
    """The cleared requests once `closer`'s answer closed the breaker that suspected `suspects`."""
    more = (cleared | suspects) - {closer}
    return more if len(more) <= _MOST_CLEARED else cleared - {closer}


def _open(breaker: Breaker, outcome: Outcome, now: float, policy: BreakerPolicy, *, again: bool = False) -> Breaker:
    """Open for the current opening's time from now; `again`: this opening was already counted (not doubled)."""
    openings = breaker.openings if again else breaker.openings + 1
    # A 429's Retry-After is the provider's own word for how long; otherwise the wait doubles with each opening.
    if outcome.retry_after is not None:
        duration = _retry_after(outcome.retry_after, policy)
    else:
        duration = backoff.exponential(policy.first_open, openings, policy.longest_open)
    return Breaker(
        state=State.OPEN,
        failures=0,
        openings=openings,
        until=now + duration,
        since=breaker.since if breaker.since is not None else now,
        code=outcome.code or breaker.code or ErrorCode.DOWNSTREAM_UNAVAILABLE,
        misconfigured=outcome.verdict is Verdict.MISCONFIGURED,
        status=outcome.status,
    )


def _retry_after(seconds: float, policy: BreakerPolicy) -> float:
    return min(max(seconds, policy.shortest_retry_after), policy.longest_retry_after)

"""The circuit breaker's state machine (service/policy/breaker.py): pure, table-driven, and a property over any
sequence of calls, outcomes and clock readings: nothing is ever charged while the breaker is not closed."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from service.codes import ErrorCode
from service.policy.breaker import (
    CLOSED,
    OK,
    Admission,
    Breaker,
    BreakerPolicy,
    Outcome,
    State,
    Verdict,
    admit,
    record,
    release,
)

POLICY = BreakerPolicy()
FAILED = Outcome(Verdict.FAILED, ErrorCode.DOWNSTREAM_UNAVAILABLE)
WRONG = Outcome(Verdict.MISCONFIGURED, ErrorCode.DOWNSTREAM_MISCONFIGURED)
SLOW_DOWN = Outcome(Verdict.FAILED, ErrorCode.RATE_LIMITED, retry_after=7.0)


def failing(times: int, now: float = 0.0, target: str | None = None) -> tuple[Breaker, list[bool]]:
    """A closed breaker after `times` failed calls at `now` (of one request, or each of its own), and whether each was
    charged."""
    breaker, charges = CLOSED, []
    for n in range(times):
        outcome = replace(FAILED, target=target or f"customer-{n}")
        breaker, charged = record(breaker, outcome, now, POLICY, probe=False)
        charges.append(charged)
    return breaker, charges


def test_by_default_five_failed_calls_in_a_row_open_it_for_two_seconds_doubling_to_a_minute() -> None:
    assert BreakerPolicy() == BreakerPolicy(threshold=5, first_open=2.0, longest_open=60.0, probe_timeout=60.0)


def test_a_run_of_failures_is_charged_until_the_call_that_opens_the_breaker() -> None:
    # Given a closed breaker, When five calls fail in a row
    breaker, charges = failing(5, now=10.0)

    # Then the first four were charged to their records, the fifth opened it and was charged to nobody
    assert charges == [True, True, True, True, False]
    assert (breaker.state, breaker.until, breaker.since, breaker.code) == (
        State.OPEN,
        12.0,
        10.0,
        ErrorCode.DOWNSTREAM_UNAVAILABLE,
    )


def test_a_run_of_one_request_alone_opens_it_suspecting_that_request_so_any_other_probes_at_once() -> None:
    # Given the directory failing for one customer only (a dead record, or the one customer a hundred orders wait on)
    breaker, charges = failing(5, target="customer-dead")

    # Then the run is charged as any run is, and its last call opens the breaker suspecting that request
    assert charges == [True, True, True, True, False]
    assert (breaker.state, breaker.suspects) == (State.OPEN, {"customer-dead"})
    # And that request waits, while another is let through at once as the probe: answered, it closes the breaker, and
    # the dead record's next failures are charged to it again (its own trouble holds back nobody)
    assert admit(breaker, 0.1, POLICY, "customer-dead")[0] is Admission.REFUSED
    admission, probing = admit(breaker, 0.1, POLICY, "customer-2")
    assert admission is Admission.PROBE
    closed, _ = record(probing, OK, 0.2, POLICY, probe=True)
    assert closed == replace(CLOSED, cleared=frozenset({"customer-dead"}))
    again = closed
    for _ in range(3 * POLICY.threshold):
        again, charged = record(again, replace(FAILED, target="customer-dead"), 0.3, POLICY, probe=False)
        assert (again, charged) == (closed, True)  # never a run's again: it cannot make the breaker flap
    # (an outage is still seen: the others' run opens it for everyone, and forgets what was cleared)
    outage = closed
    for n in range(POLICY.threshold):
        outage, _ = record(outage, replace(FAILED, target=f"customer-{n}"), 0.4, POLICY, probe=False)
    assert (outage.state, outage.suspects, outage.cleared) == (State.OPEN, frozenset(), frozenset())
    # And when it is the only request there is, it probes once the open time is up, as in any outage
    assert admit(breaker, 2.0, POLICY, "customer-dead")[0] is Admission.PROBE


def test_a_run_of_two_requests_opens_it_for_everyone() -> None:
    breaker, _ = failing(4, target="customer-1")
    opened, charged = record(breaker, replace(FAILED, target="customer-2"), 0.0, POLICY, probe=False)
    assert (opened.state, opened.suspects, charged) == (State.OPEN, frozenset(), False)
    assert admit(opened, 0.1, POLICY, "customer-3")[0] is Admission.REFUSED


def test_a_success_ends_the_run() -> None:
    breaker, _ = failing(4)
    breaker, charged = record(breaker, OK, 0.0, POLICY, probe=False)
    assert (breaker, charged) == (CLOSED, False)
    assert failing(4)[0].failures == 4


@pytest.mark.parametrize(
    ("outcome", "open_for"),
    [
        (SLOW_DOWN, 7.0),
        (replace(SLOW_DOWN, retry_after=6000.0), 600.0),
        (replace(SLOW_DOWN, retry_after=0.0), 1.0),
    ],
    ids=["retry-after", "retry-after-capped", "retry-after-0-floored"],
)
def test_a_429_with_retry_after_opens_it_at_once_for_that_long_charging_nothing(
    outcome: Outcome, open_for: float
) -> None:
    breaker, charged = record(CLOSED, outcome, 100.0, POLICY, probe=False)
    assert (breaker.state, breaker.until - 100.0, breaker.misconfigured, charged) == (
        State.OPEN,
        open_for,
        False,
        False,
    )
    assert breaker.code is ErrorCode.RATE_LIMITED


def test_an_answer_not_the_apis_own_opens_it_at_once_charged_to_nobody_suspecting_a_lone_request() -> None:
    # Given an answer that is not the API's own to one request (a wrong URL's HTML 404, a login page)
    breaker, charged = record(CLOSED, replace(WRONG, target="c-1", status=401), 0.0, POLICY, probe=False)

    # Then it opens at once as misconfigured, charged to nobody (contract §6), suspecting the request
    assert (breaker.state, breaker.misconfigured, breaker.status, breaker.until, charged) == (
        State.OPEN,
        True,
        401,
        2.0,
        False,
    )
    assert breaker.code is ErrorCode.DOWNSTREAM_MISCONFIGURED
    assert breaker.suspects == {"c-1"}
    # And that request waits, while any other may probe at once (a proxy answering one request oddly holds back nobody)
    assert admit(breaker, 0.5, POLICY, "c-1")[0] is Admission.REFUSED
    admission, probing = admit(breaker, 0.5, POLICY, "c-2")
    assert admission is Admission.PROBE
    # When the other request gets the same answer (a wrong URL answers every request so), Then everyone waits it out
    reopened, charged = record(probing, replace(WRONG, target="c-2"), 0.6, POLICY, probe=True)
    assert (reopened.state, reopened.suspects, charged) == (State.OPEN, frozenset(), False)
    assert admit(reopened, 0.7, POLICY, "c-3")[0] is Admission.REFUSED
    # And when it is answered as the API's own, it closes; the lone request's next such answer is its own trouble:
    # charged, and it does not open the breaker again (a hostile key a firewall refuses cannot make it flap)
    closed, charged = record(admit(breaker, 0.5, POLICY, "c-2")[1], OK, 0.6, POLICY, probe=True)
    assert (closed, charged) == (replace(CLOSED, cleared=frozenset({"c-1"})), False)
    assert record(closed, replace(WRONG, target="c-1"), 0.7, POLICY, probe=False) == (closed, True)
    # (until it is answered as the API's own again)
    assert record(closed, replace(OK, target="c-1"), 0.8, POLICY, probe=False) == (CLOSED, False)


def test_a_misconfiguration_after_failures_of_two_requests_opens_it_suspecting_nobody() -> None:
    breaker, _ = record(CLOSED, replace(FAILED, target="c-1"), 0.0, POLICY, probe=False)
    breaker, _ = record(breaker, replace(FAILED, target="c-2"), 0.0, POLICY, probe=False)
    opened, charged = record(breaker, replace(WRONG, target="c-3"), 0.0, POLICY, probe=False)
    assert (opened.state, opened.misconfigured, opened.suspects, charged) == (State.OPEN, True, frozenset(), False)


def test_while_open_every_call_is_refused_until_its_time_then_exactly_one_probe_goes() -> None:
    breaker, _ = failing(5, now=0.0)
    assert admit(breaker, 1.9, POLICY) == (Admission.REFUSED, breaker)
    admission, probing = admit(breaker, 2.0, POLICY)
    assert (admission, probing.state, probing.until) == (Admission.PROBE, State.HALF_OPEN, 62.0)
    assert admit(probing, 2.5, POLICY)[0] is Admission.REFUSED  # the others wait for the probe


def test_a_probe_that_succeeds_closes_it_and_one_that_fails_reopens_it_twice_as_long() -> None:
    breaker, _ = failing(5, now=0.0)
    _, probing = admit(breaker, 2.0, POLICY)
    assert record(probing, OK, 2.1, POLICY, probe=True) == (CLOSED, False)
    reopened, charged = record(probing, FAILED, 2.1, POLICY, probe=True)
    assert (reopened.state, reopened.until, reopened.openings, reopened.since, charged) == (
        State.OPEN,
        2.1 + 4.0,
        2,
        0.0,
        False,
    )


def test_the_open_time_doubles_with_each_failed_probe_up_to_a_minute() -> None:
    breaker, now, times = failing(5, now=0.0)[0], 0.0, []
    for _ in range(8):
        times.append(breaker.until - now)
        now = breaker.until
        _, probing = admit(breaker, now, POLICY)
        breaker, _ = record(probing, FAILED, now, POLICY, probe=True)
    assert times == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_a_probe_failing_alone_lets_another_request_probe_at_once_and_its_answer_closes_the_breaker() -> None:
    # Given a breaker opened by an outage whose time is up, and a request that fails alone (a customer the directory
    # never finds) that happens to be the probe
    breaker, _ = failing(5, now=0.0)
    _, probing = admit(breaker, 2.0, POLICY, "dead")
    suspecting, charged = record(probing, replace(FAILED, target="dead"), 2.1, POLICY, probe=True)
    # Then the breaker stays open, twice as long, for that request: it is refused, charged nothing
    assert (suspecting.state, suspecting.until, suspecting.openings, suspecting.suspects, charged) == (
        State.OPEN,
        2.1 + 4.0,
        2,
        frozenset({"dead"}),
        False,
    )
    assert admit(suspecting, 2.2, POLICY, "dead")[0] is Admission.REFUSED
    assert admit(suspecting, 2.2, POLICY)[0] is Admission.REFUSED  # a call that cannot be told apart waits too
    # But another request probes at once, the only call out, and the downstream's answer closes it
    admission, second = admit(suspecting, 2.2, POLICY, "healthy")
    assert (admission, second.state) == (Admission.PROBE, State.HALF_OPEN)
    assert admit(second, 2.3, POLICY, "other")[0] is Admission.REFUSED
    closed, charged = record(second, OK, 2.3, POLICY, probe=True)
    assert (closed, charged) == (replace(CLOSED, cleared=frozenset({"dead"})), False)
    # And the lone request, called again with the breaker closed, is charged: its own trouble, never a run's
    assert record(closed, replace(FAILED, target="dead"), 2.4, POLICY, probe=False) == (closed, True)
    assert record(CLOSED, replace(FAILED, target="dead"), 2.4, POLICY, probe=False) == (
        replace(CLOSED, failures=1, targets=frozenset({"dead"})),
        True,
    )


@pytest.mark.parametrize(("outcome", "probes"), [(FAILED, POLICY.threshold), (WRONG, 2)])
def test_an_outage_reopens_it_for_all_once_threshold_different_requests_probes_failed_doubling_once_per_spell(
    outcome: Outcome, probes: int
) -> None:
    breaker, _ = failing(5, now=0.0)
    now, charges = 2.0, []
    for n in range(probes):
        admission, probing = admit(breaker, now, POLICY, f"customer-{n}")
        assert admission is Admission.PROBE
        breaker, charged = record(probing, replace(outcome, target=f"customer-{n}"), now, POLICY, probe=True)
        charges.append(charged)
        now += 0.1
    last = now - 0.1
    assert (breaker.state, breaker.suspects, breaker.openings, breaker.until) == (State.OPEN, frozenset(), 2, last + 4)
    assert admit(breaker, now, POLICY, "customer-new")[0] is Admission.REFUSED
    assert not any(charges)


def test_a_lone_failing_request_that_probes_each_time_the_time_is_up_doubles_it_as_before() -> None:
    # (nothing else in the process needs the downstream: its time runs as for an outage, its spell begins afresh)
    breaker, now, times = failing(5, now=0.0)[0], 0.0, []
    for _ in range(4):
        times.append(breaker.until - now)
        now = breaker.until
        _, probing = admit(breaker, now, POLICY, "dead")
        assert probing.suspects == frozenset()
        breaker, _ = record(probing, replace(FAILED, target="dead"), now, POLICY, probe=True)
    assert (times, breaker.suspects) == ([2.0, 4.0, 8.0, 16.0], frozenset({"dead"}))


def test_a_probe_answered_429_speaks_for_every_request() -> None:
    breaker, _ = failing(5, now=0.0)
    _, probing = admit(breaker, 2.0, POLICY, "a")
    after, _ = record(probing, replace(SLOW_DOWN, target="a"), 2.0, POLICY, probe=True)
    assert (after.suspects, after.until) == (frozenset(), 9.0)
    assert admit(after, 2.1, POLICY, "b")[0] is Admission.REFUSED


def test_a_late_answer_of_a_call_made_before_it_opened_changes_nothing_but_a_longer_retry_after() -> None:
    breaker, _ = failing(5, now=0.0)
    assert record(breaker, OK, 1.0, POLICY, probe=False) == (breaker, False)
    assert record(breaker, FAILED, 1.0, POLICY, probe=False) == (breaker, False)
    longer, charged = record(breaker, SLOW_DOWN, 1.0, POLICY, probe=False)
    assert (longer.until, charged) == (8.0, False)


def test_a_probe_that_ends_without_an_answer_hands_its_turn_to_the_next_call() -> None:
    breaker, _ = failing(5, now=0.0)
    _, probing = admit(breaker, 2.0, POLICY)
    released = release(probing, 3.0)
    assert admit(released, 3.0, POLICY)[0] is Admission.PROBE


def test_a_probe_never_answered_is_given_up_after_the_probe_timeout() -> None:
    breaker, _ = failing(5, now=0.0)
    _, probing = admit(breaker, 2.0, POLICY)
    assert admit(probing, 61.9, POLICY)[0] is Admission.REFUSED
    assert admit(probing, 62.0, POLICY)[0] is Admission.PROBE


@pytest.mark.parametrize(
    ("breaker", "now", "expected"),
    [(CLOSED, 0.0, 0.0), (Breaker(State.OPEN, until=10.0), 4.0, 6.0), (Breaker(State.HALF_OPEN, until=50.0), 4.0, 1.0)],
)
def test_a_refused_call_waits_until_the_probe_may_go_or_a_second_while_one_is_out(
    breaker: Breaker, now: float, expected: float
) -> None:
    assert breaker.wait(now) == expected


@dataclass(frozen=True)
class _Call:
    """One step of a sequence: a call admitted at `at` and answered `took` seconds later with `outcome`
    (None: it never answered, cancelled)."""

    at: float
    took: float
    outcome: Outcome | None


_outcomes = st.sampled_from(
    [
        OK,
        FAILED,
        WRONG,
        SLOW_DOWN,
        Outcome(Verdict.FAILED, ErrorCode.DOWNSTREAM_TIMEOUT, target="a"),
        Outcome(Verdict.FAILED, ErrorCode.DOWNSTREAM_UNAVAILABLE, target="b"),
    ]
)
_calls = st.lists(
    st.builds(
        _Call,
        at=st.floats(min_value=0.0, max_value=5.0),
        took=st.floats(min_value=0.0, max_value=5.0),
        outcome=st.none() | _outcomes,
    ),
    max_size=60,
)


@settings(max_examples=300, print_blob=True)
@given(_calls, st.integers(min_value=1, max_value=6))
def test_no_sequence_of_outcomes_and_clock_readings_charges_a_call_while_the_breaker_is_not_closed(
    calls: list[_Call], threshold: int
) -> None:
    # Given a breaker and calls that overlap in any way (each admitted, then answered in any order later)
    rules = BreakerPolicy(threshold=threshold)
    breaker, now = CLOSED, 0.0
    pending: list[tuple[float, int, bool, Outcome | None]] = []  # (answered at, order, probe, outcome)
    for order, call in enumerate(calls):
        now += call.at
        # answers due by now come first, in time order
        for answer in sorted((p for p in pending if p[0] <= now), key=lambda p: p[:2]):
            pending.remove(answer)
            breaker = _answer(breaker, answer[0], answer[2], answer[3], rules)
        target = call.outcome.target if call.outcome is not None else None
        before = breaker
        admission, breaker = admit(breaker, now, rules, target)
        note(f"{now:.3f} admit {target} -> {admission} {breaker.state}")
        # Then a refused call is never made, and a probe only goes from a breaker that is not closed
        if admission is Admission.REFUSED:
            assert breaker.state is not State.CLOSED
            assert now < breaker.until
            continue
        # and a probe before the open time is up asks for a request whose probe has not failed in this spell
        if admission is Admission.PROBE and now < before.until:
            assert before.state is State.OPEN
            assert target is not None
            assert target not in before.suspects
        assert (admission is Admission.PROBE) == (breaker.state is State.HALF_OPEN)
        pending.append((now + call.took, order, admission is Admission.PROBE, call.outcome))
    for answered_at, _, probe, outcome in sorted(pending, key=lambda p: p[:2]):
        breaker = _answer(breaker, answered_at, probe, outcome, rules)


def _answer(breaker: Breaker, now: float, probe: bool, outcome: Outcome | None, rules: BreakerPolicy) -> Breaker:
    """Record one answer and check the charging rule on it."""
    if outcome is None:
        return release(breaker, now) if probe else breaker
    after, charged = record(breaker, outcome, now, rules, probe=probe)
    note(f"{now:.3f} {outcome.verdict} probe={probe}: {breaker.state} -> {after.state} charged={charged}")
    if charged:
        # Charged only for a failure that leaves a closed breaker closed: never while it is open or half-open.
        assert breaker.state is State.CLOSED
        assert after.state is State.CLOSED
        assert outcome.verdict is not Verdict.OK
        assert outcome.retry_after is None
        assert after.failures == breaker.failures + 1
        # ... below the threshold, or of one request only
        assert after.failures < rules.threshold or (len(after.targets) < 2 and outcome.target is not None)
    if after.state is State.OPEN and breaker.state is not State.OPEN:
        assert after.until >= now + 1.0
    return after

"""The process's circuit breakers, one per downstream, shared by everything in it that calls that downstream.

The decisions are pure (service/policy/breaker.py); a `Guard` keeps one downstream's current value, reads the
monotonic clock, logs each transition once, keeps the metrics, and tells whoever waits that the breaker moved
(the consumer wakes the records that wait for it, an effect lane claims again). `Breakers` makes a guard per
downstream on first use. A breaker is the process's own: members do not share it, each opens on what its own
calls see (README, Backpressure).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from service.metrics import Metrics
from service.policy import breaker as policy
from service.policy.breaker import OK, Admission, Breaker, BreakerPolicy, Outcome, State
from service.policy.heartbeat import BreakerView

log = structlog.get_logger("breaker")

Listener = Callable[[str, Breaker], None]
_STATE_VALUES = {State.CLOSED: 0, State.HALF_OPEN: 1, State.OPEN: 2}


@dataclass(frozen=True, slots=True)
class Ticket:
    """A call the breaker let through; `probe` when it is the one call that tries an open breaker."""

    probe: bool


CALL, PROBE = Ticket(probe=False), Ticket(probe=True)


class Guard:
    """One downstream's breaker in this process."""

    def __init__(
        self,
        name: str,
        rules: BreakerPolicy,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._rules = rules
        self._metrics = metrics
        self._clock = clock
        self._breaker = policy.CLOSED
        self._listeners: list[Listener] = []
        self._moved = asyncio.Event()
        if metrics is not None:
            # Read at each scrape: an open breaker whose time is up and that no call has probed yet (nothing needed
            # it) is no longer known to be open.
            metrics.breaker_state.labels(downstream=name).set_function(self.state_value)
            metrics.breaker_open_seconds.labels(downstream=name).set_function(self.open_seconds)
            metrics.downstream_misconfigured.labels(downstream=name).set_function(self.misconfigured_value)

    @property
    def breaker(self) -> Breaker:
        """The breaker's current value."""
        return self._breaker

    def admit(self, target: str | None = None) -> Ticket | None:
        """A ticket for a call asking for `target`, or None when the breaker refuses it (the call is not made)."""
        if self._breaker is policy.CLOSED:
            return CALL  # (the common case, as `policy.admit` decides it, without its call: once per downstream call)
        admission, after = policy.admit(self._breaker, self._clock(), self._rules, target)
        self._move(after)
        if admission is Admission.REFUSED:
            return None
        return PROBE if admission is Admission.PROBE else CALL

    def record(self, ticket: Ticket, outcome: Outcome) -> bool:
        """Take a call's outcome; return whether the call is charged to its record or effect."""
        if outcome is OK and self._breaker is policy.CLOSED:
            return False  # (a success that leaves a closed breaker as it is, as `policy.record` decides it)
        after, charged = policy.record(self._breaker, outcome, self._clock(), self._rules, probe=ticket.probe)
        self._move(after)
        return charged

    def release(self, ticket: Ticket) -> None:
        """A call that ended without an outcome (cancelled): a probe's turn goes to the next call."""
        if ticket.probe:
            self._move(policy.release(self._breaker, self._clock()))

    def wait(self) -> float:
        """How long a refused call waits before it is tried again, in seconds."""
        return self._breaker.wait(self._clock())

    def state_value(self) -> float:
        """The state as the metric shows it: 0 closed, 1 half-open (a probe is out, or the next call probes), 2 open."""
        breaker, now = self._breaker, self._clock()
        if breaker.state is State.OPEN and now >= breaker.until:
            return 1.0
        return float(_STATE_VALUES[breaker.state])

    def open_seconds(self) -> float:
        """How long the breaker has been away from closed (0 when closed): up to now while a probe is out, else up to
        the end of its open time. A breaker that nothing probes (no call needs its downstream) stops growing there,
        so that an idle one does not look like an outage that never ends."""
        breaker = self._breaker
        if breaker.since is None:
            return 0.0
        end = self._clock() if breaker.state is State.HALF_OPEN else min(self._clock(), breaker.until)
        return max(0.0, end - breaker.since)

    def misconfigured_value(self) -> float:
        """1 while the breaker is open on answers that are not the API's own and its open time runs, else 0."""
        return 1.0 if self._breaker.misconfigured and self.state_value() == 2.0 else 0.0

    def view(self) -> BreakerView:
        """The breaker as the process's heartbeat shows it."""
        breaker = self._breaker
        state = {0.0: State.CLOSED, 1.0: State.HALF_OPEN, 2.0: State.OPEN}[self.state_value()]
        code = breaker.code.value if breaker.code else None
        return BreakerView(self.name, state.value, code, breaker.misconfigured, self.open_seconds())

    def listen(self, listener: Listener) -> None:
        """Call `listener(name, breaker)` after every transition."""
        self._listeners.append(listener)

    @property
    def moving(self) -> asyncio.Event:
        """An event set at the breaker's next transition (a fresh one after each)."""
        return self._moved

    def _move(self, after: Breaker) -> None:
        before = self._breaker
        self._breaker = after
        if after.state is before.state:
            return  # a longer Retry-After while open, a probe given up and taken again: not a transition
        self._report(before, after)
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
        for listener in self._listeners:
            listener(self.name, after)

    def _report(self, before: Breaker, after: Breaker) -> None:
        code = after.code.value if after.code else None
        if after.state is State.OPEN:
            log.warning(
                "breaker_open",
                downstream=self.name,
                error_code=code,
                status=after.status,
                misconfigured=after.misconfigured,
                open_seconds=round(after.until - self._clock(), 3),
                openings=after.openings,
                suspects=len(after.suspects),
                was=before.state.value,
            )
        elif after.state is State.HALF_OPEN:
            log.info("breaker_half_open", downstream=self.name, error_code=code)
        else:
            seconds = None if before.since is None else round(self._clock() - before.since, 3)
            log.info("breaker_closed", downstream=self.name, was_open_seconds=seconds)
        if self._metrics is not None:
            self._metrics.breaker_transitions.labels(downstream=self.name, state=after.state.value).inc()


class Breakers:
    """The process's breakers by downstream name, made on first use."""

    def __init__(self, rules: BreakerPolicy | None = None, metrics: Metrics | None = None) -> None:
        self._rules = rules or BreakerPolicy()
        self._metrics = metrics
        self._guards: dict[str, Guard] = {}
        self._listeners: list[Listener] = []

    def __getitem__(self, name: str) -> Guard:
        guard = self._guards.get(name)
        if guard is None:
            guard = self._guards[name] = Guard(name, self._rules, self._metrics)
            for listener in self._listeners:
                guard.listen(listener)
        return guard

    def listen(self, listener: Listener) -> None:
        """Call `listener(name, breaker)` after every transition of every breaker, present and future."""
        self._listeners.append(listener)
        for guard in self._guards.values():
            guard.listen(listener)

    def views(self) -> tuple[BreakerView, ...]:
        """Every breaker of the process as its heartbeat shows it (an open one whose time is up: half-open)."""
        return tuple(guard.view() for guard in self._guards.values())

    def open(self) -> dict[str, Breaker]:
        """The breakers that are not closed, by downstream."""
        return {name: guard.breaker for name, guard in self._guards.items() if guard.breaker.state is not State.CLOSED}

"""A round's one decision (service/policy/decide.py): the plan and its rows as one value, from immutable inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.policy.decide import RoundWrite, decide
from service.policy.delivery import FRESH, Delivery, RetryState
from service.policy.round import Facts, RoundPlan, Write, survey
from tests.support.rounds import NOW, Thing, Things, record


def _due(*values: bytes) -> dict[Delivery, RetryState]:
    things = Things()
    return {Delivery(r, things.decode(r.value), r.coordinates, 0): FRESH for r in map(record, range(2), values)}


def test_decide_holds_the_plan_and_the_rows_its_builder_made_from_the_plan_at_the_clock_reading() -> None:
    # Given a round of a change to an existing thing and a creation of a new one, and a builder that tells its inputs
    due = _due(b"change:T-1", b"create:T-2")
    round_ = survey(due, Facts({}, {}, set(), set(), {"T-1"}, {}), "key")
    seen: list[tuple[RoundPlan, Mapping[Delivery, RetryState], Any]] = []

    def rows(plan: RoundPlan, states: Mapping[Delivery, RetryState], now: Any) -> str:
        seen.append((plan, states, now))
        return "the rows"

    # When the round is decided with T-1 locked at version 3
    write = decide(list(due), round_, {}, {"T-1": Thing("T-1", 3)}, NOW, Things(), rows)

    # Then one value holds the plan, the rows made from that very plan, and no last resort
    assert isinstance(write, RoundWrite)
    assert (write.rows, write.last_resort, seen) == ("the rows", False, [(write.plan, due, NOW)])
    assert [step.write for step in write.plan.steps] == [Write.APPLY, Write.APPLY]
    assert (write.plan.changed, write.plan.created) == ((Thing("T-1", 4),), (Thing("T-2", 1),))


def test_decide_for_the_last_resort_says_so_and_quarantines_the_one_delivery() -> None:
    due = _due(b"not a thing")
    round_ = survey(due, Facts({}, {}, set(), set(), set(), {}), "key")

    write = decide(list(due), round_, {}, {}, NOW, Things(), lambda plan, states, now: None, last_resort=True)

    assert write.last_resort
    assert [(step.write, step.code) for step in write.plan.steps] == [(Write.LAST_RESORT, Things().decode(b"").code)]

"""A round's one decision: everything its write holds, as one value.

Pure: given the round (its due deliveries, their retry states and the facts the database gave), what the domain's
downstream answered, the aggregates the write locked and the clock's reading, `decide` makes the plan
(service/policy/round.py, `plan_round`) and the plan's rows. The rows are the store's values, so they are made by
the `RowBuilder` the caller passes (service/worker/writes.py), as the domain's rules are; the store then applies the
value as it is (service/store/round_write.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from service.policy.delivery import Delivery, RetryState
from service.policy.handling import Aggregate
from service.policy.round import Round, RoundPlan, Rules, plan_round

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class RowBuilder(Protocol[R_co]):
    """Makes a plan's rows (pure): `(plan, the deliveries' retry states, now) -> rows`."""

    def __call__(self, plan: RoundPlan, due: Mapping[Delivery, RetryState], now: datetime, /) -> R_co:
        """The rows of `plan`, written at `now`."""


@dataclass(frozen=True, slots=True)
class RoundWrite(Generic[R]):
    """What one transaction of a round writes: the plan, its rows, and whether it is the last-resort quarantine of
    one delivery (its envelope holds nothing taken from the record but its identities)."""

    plan: RoundPlan
    rows: R
    last_resort: bool = False


def decide(
    writable: Sequence[Delivery],
    round_: Round,
    looked_up: Mapping[str, Any],
    current: Mapping[str, Aggregate],
    now: datetime,
    rules: Rules,
    rows: RowBuilder[R],
    *,
    last_resort: bool = False,
) -> RoundWrite[R]:
    """What the writable deliveries of `round_` write (`current`: the aggregates the write locked; `now`: the
    clock's reading for the rows' times)."""
    plan = plan_round(writable, round_, looked_up, current, rules, last_resort=last_resort)
    return RoundWrite(plan, rows(plan, round_.due, now), last_resort)

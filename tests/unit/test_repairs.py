"""The decisions an operator's repair applies, and its dry run reports (service/policy/repairs.py)."""

from __future__ import annotations

import pytest

from service.policy import repairs


@pytest.mark.parametrize(
    ("status", "closes"),
    [("open", True), ("resolved", False), ("reprocessing", False), ("reprocessed", False), (None, False)],
)
def test_a_resolve_closes_an_open_record_and_leaves_any_other_as_it_is(status: str | None, closes: bool) -> None:
    assert repairs.resolves(status) is closes


@pytest.mark.parametrize(
    ("state", "moved", "outcome"),
    [
        ("failed", (), ("failed", "pending")),
        ("failed", ("R/refund is sent",), ("failed, and what waited for it went ahead (R/refund is sent)", None)),
        ("sent", (), ("sent", None)),
        ("uncertain", (), ("uncertain", None)),
        ("pending", (), ("pending", None)),
        (None, (), (None, None)),
    ],
    ids=["failed", "overtaken", "sent", "uncertain", "pending", "unknown"],
)
def test_a_retry_sends_only_a_failed_effect_whose_dependents_still_wait_where_its_kind_goes(
    state: str | None, moved: tuple[str, ...], outcome: tuple[str | None, str | None]
) -> None:
    assert repairs.effect_retry(state, "pending", moved) == outcome

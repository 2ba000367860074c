"""The retention periods (`ORDERS_RETENTION_*`): their defaults, and the range each must be in."""

from __future__ import annotations

from datetime import timedelta

import pytest

from service.config import ConfigurationError, load_settings
from service.orders.settings import OrderSettings
from service.store.retention import Retention

VARIABLES = (
    "ORDERS_RETENTION_QUARANTINE_PAYLOAD",
    "ORDERS_RETENTION_QUARANTINE",
    "ORDERS_RETENTION_AUDIT",
    "ORDERS_RETENTION_RUNS",
    "ORDERS_RETENTION_CONSOLE_SESSIONS",
)


def test_without_a_variable_the_documented_periods_apply() -> None:
    assert Retention.of(load_settings(OrderSettings)) == Retention(
        quarantine_payload=timedelta(days=30),
        quarantine=timedelta(days=90),
        audit=timedelta(days=400),
        runs=timedelta(days=90),
        console_sessions=timedelta(days=7),
    )


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize(("value", "expected"), [("1h", timedelta(hours=1)), ("36500d", timedelta(days=36_500))])
def test_a_period_at_either_end_of_its_range_is_read(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: timedelta
) -> None:
    monkeypatch.setenv(variable, value)
    field = variable.removeprefix("ORDERS_").lower()
    assert getattr(load_settings(OrderSettings), field) == expected


@pytest.mark.parametrize("variable", VARIABLES)
@pytest.mark.parametrize("value", ["0s", "59m", "36501d", "99999999d", "forever", "30"])
def test_a_period_outside_its_range_stops_start_up_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(OrderSettings)
    message = str(raised.value)
    assert message.startswith(f"invalid configuration: {variable}"), message
    assert "\n" not in message

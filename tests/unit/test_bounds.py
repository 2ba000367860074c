"""The bounds every flag and query parameter is parsed with (service/bounds.py): any text gives a value in range
or one line saying why not, never another exception."""

from __future__ import annotations

from datetime import UTC, timedelta
from functools import partial

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service import bounds
from service.cli import bounded

# Text an operator or a hostile client could send: anything, and near misses of each accepted form.
ANY_TEXT = (
    st.text()
    | st.from_regex(r"\A-?[0-9]{0,25}(\.[0-9]{0,15})?(ms|s|m|h|d)?\Z")
    | st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "1e400",
            "²",
            "１２",
            "99999999d",
            "99999999999999999999",
            "\x00",
            "1\x00",
            "0001-01-01T00:00+01:00",
        ]
    )
)


def _refused_in_one_line(call: object, text: str) -> object:
    try:
        return call(text)  # type: ignore[operator]
    except ValueError as error:
        message = str(error)
        assert message
        assert "\n" not in message
        return None


@given(ANY_TEXT)
def test_a_whole_number_is_in_range_or_refused_in_one_line(text: str) -> None:
    found = _refused_in_one_line(lambda value: bounds.whole(value, low=0, high=bounds.BIGINT_MAX), text)
    assert found is None or (isinstance(found, int) and 0 <= found <= bounds.BIGINT_MAX)


@given(ANY_TEXT)
def test_a_decimal_is_finite_and_in_range_or_refused_in_one_line(text: str) -> None:
    for parse, low, high in ((bounded.rate, 0.01, 10_000), (bounded.fraction, 0, 1), (bounded.seconds, 1, 86_400)):
        found = _refused_in_one_line(parse, text)
        assert found is None or (isinstance(found, float) and low <= found <= high)


@given(ANY_TEXT)
def test_an_age_is_at_most_a_hundred_years_or_refused_in_one_line(text: str) -> None:
    found = _refused_in_one_line(bounds.age, text)
    assert found is None or (isinstance(found, timedelta) and timedelta(0) <= found <= bounds.LONGEST_AGE)


@given(ANY_TEXT | st.datetimes().map(lambda moment: moment.isoformat()))
def test_a_timestamp_is_in_utc_or_refused_in_one_line(text: str) -> None:
    for parse in (partial(bounds.moment, zone_required=True), partial(bounds.moment, zone_required=False)):
        found = _refused_in_one_line(parse, text)
        assert found is None or found.tzinfo == UTC  # type: ignore[attr-defined]


@given(st.text())
def test_a_text_filter_holds_no_nul_or_is_refused_in_one_line(text: str) -> None:
    found = _refused_in_one_line(bounds.text, text)
    assert (found is None) == ("\x00" in text or len(text) > bounds.LONGEST_TEXT)


@pytest.mark.parametrize(
    ("parse", "text"),
    [
        (bounds.age, "99999999d"),
        (lambda value: bounds.whole(value), "99999999999999999999"),
        (lambda value: bounds.whole(value, low=0, high=10), "²"),
        (bounded.rate, "nan"),
        (bounded.seconds, "inf"),
        (bounds.text, "K-\x00"),
        (lambda value: bounds.moment(value, zone_required=False), "0001-01-01T00:00:00+01:00"),
    ],
)
def test_the_values_that_reached_the_database_before_are_refused(parse: object, text: str) -> None:
    with pytest.raises(ValueError, match=r".+"):
        parse(text)  # type: ignore[operator]


def test_values_in_range_are_taken_as_written() -> None:
    assert bounds.whole(" 42 ", low=1, high=100) == 42
    assert bounds.age("7d") == timedelta(days=7)
    assert bounded.rate("2.5") == 2.5
    assert bounds.moment("2026-01-02T03:04:05+01:00", zone_required=True).hour == 2

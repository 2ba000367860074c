"""A provider's Retry-After, whatever it holds, is capped or ignored, never raised into the effect worker."""

from __future__ import annotations

import pytest

from service.adapters.http import MAX_RETRY_AFTER, Answer, call_status, retry_after


@pytest.mark.parametrize("value", ["99999999999999", "9" * 5000, "\u00b2"])
def test_a_hostile_retry_after_is_capped_or_ignored_never_raised(value: str) -> None:
    # Given a 429 whose Retry-After is a huge number of seconds, more digits than int() reads, or a digit
    # that str.isdigit accepts and int() refuses
    answer = Answer(429, {"retry-after": value}, b"")

    # When the effect's call reads it, Then it is capped (or ignored), and the call ends as an outcome
    assert retry_after(answer) in (MAX_RETRY_AFTER, None)
    assert call_status(answer).code is not None

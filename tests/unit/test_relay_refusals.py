"""Which Kafka refusals set an outbox row aside, and with which code (the rest are waited out and retried)."""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaConnectionError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordListTooLargeError,
    RecordTooLargeError,
)

from service.worker.relay import _REFUSED, Relay, _set_aside_code


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MessageSizeTooLargeError(), "MESSAGE_TOO_LARGE"),
        (RecordTooLargeError(), "MESSAGE_TOO_LARGE"),
        (RecordListTooLargeError(), "MESSAGE_TOO_LARGE"),
        (InvalidTimestampError(), "MESSAGE_INVALID"),
    ],
)
def test_a_refusal_for_content_sets_the_row_aside_with_its_code(error: Exception, code: str) -> None:
    assert isinstance(error, _REFUSED)
    assert _set_aside_code(error) == code  # type: ignore[arg-type]


@pytest.mark.parametrize("error", [KafkaConnectionError(), NotLeaderForPartitionError(), CorruptRecordException()])
def test_an_outage_or_a_leader_change_is_not_a_refusal(error: Exception) -> None:
    assert not isinstance(error, _REFUSED)


def test_a_relay_that_published_since_its_last_start_backs_off_from_the_first_step_again() -> None:
    # Given a relay that has committed 3 batches, restarted after an outage that had grown its backoff to 16 s
    relay = Relay(None, None, None, lambda: None, lambda: None)  # type: ignore[arg-type]
    relay._batches = 3

    # When it fails again, having published nothing since that start, or having published a batch
    failed_again = relay._backoff(16.0, batches=3)
    relay._batches = 4
    new_outage = relay._backoff(16.0, batches=3)

    # Then the same outage keeps its backoff, and a new one starts from one second, not from where the last ended
    assert (failed_again, new_outage) == (16.0, 1.0)

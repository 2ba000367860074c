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

from service.worker.relay import _REFUSED, _set_aside_code


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

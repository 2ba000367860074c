"""Which Kafka refusals set an outbox row aside, and with which code (the rest are waited out and retried)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import errors as kafka_errors
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
    UnknownError,
    UnknownTopicOrPartitionError,
    for_code,
)

from service.adapters.kafka import InvalidRecordError, make_producer, register_error_codes
from service.orders.settings import OrderSettings
from service.policy.backoff import outage_wait
from service.store.outbox import ClaimedRow
from service.worker import relay as relay_module
from service.worker.publishing import TopicMissing, _resolve, refusals, set_aside_code
from service.worker.relay import Relay


def _relay(one_by_one: Any) -> Relay:
    """A relay whose one-by-one producer is `one_by_one`, with nothing else to reach (no database, no metrics)."""
    return Relay(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        lambda: None,  # type: ignore[arg-type,return-value]
        lambda: one_by_one,
        start_client=None,  # type: ignore[arg-type]
        batch_size=1,
        names=OrderSettings,
    )


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MessageSizeTooLargeError(), "MESSAGE_TOO_LARGE"),
        (RecordTooLargeError(), "MESSAGE_TOO_LARGE"),
        (RecordListTooLargeError(), "MESSAGE_TOO_LARGE"),
    ],
)
def test_a_refusal_for_content_sets_the_row_aside_with_its_code(error: KafkaError, code: str) -> None:
    assert isinstance(error, refusals())
    assert set_aside_code(error) == code


@pytest.mark.parametrize(
    "error",
    [
        KafkaConnectionError(),
        NotLeaderForPartitionError(),
        CorruptRecordException(),  # sent again before it is taken for one (below)
        InvalidTimestampError(),  # the relay's records carry its clock's time: the clock is wrong, not the row
        UnknownError(),
    ],
)
def test_an_outage_a_leader_change_or_a_clock_is_not_a_refusal(error: Exception) -> None:
    assert not isinstance(error, refusals())


class _ScriptedProducer:
    """Answers each send of a row (by payload) with the next error of its script, then takes it."""

    def __init__(self, scripts: dict[bytes, list[KafkaError]]) -> None:
        self.scripts = scripts
        self.sent: list[bytes] = []

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def send(self, topic: str, value: bytes, **_: Any) -> asyncio.Future[None]:
        self.sent.append(value)
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        script = self.scripts.get(value, [])
        if script:
            answer.set_exception(script.pop(0))
        else:
            answer.set_result(None)
        return answer


async def test_a_row_alone_is_set_aside_for_a_corrupt_answer_only_when_the_broker_says_it_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given rows whose lone sends get: a corrupt-record answer once (a CRC error in transit), twice (Kafka before
    # 2.5 refusing a record without a key on a compacted topic), INVALID_RECORD, a size refusal, and nothing
    monkeypatch.setattr(relay_module, "_SUSPECT_PAUSE_SECONDS", 0.0)
    producer = _ScriptedProducer(
        {
            b"once": [CorruptRecordException()],
            b"twice": [CorruptRecordException(), CorruptRecordException()],
            b"invalid": [InvalidRecordError()],
            b"large": [MessageSizeTooLargeError()],
        }
    )
    relay = _relay(producer)
    rows = [
        ClaimedRow(n, "t", "K", (), value, None)
        for n, value in enumerate([b"once", b"twice", b"invalid", b"large", b"fine"])
    ]

    # When the relay sends them one by one
    published, refused, error = await relay._one_by_one(rows)

    # Then the fault passed with the second try; the corrupt answer said twice, and the refusals said once, set the
    # rows aside with their codes; each row was sent at most twice, in order
    assert [row.payload for row in published] == [b"once", b"fine"]
    assert [(row.payload, set_aside_code(refusal)) for row, refusal in refused] == [
        (b"twice", "MESSAGE_INVALID"),
        (b"invalid", "MESSAGE_INVALID"),
        (b"large", "MESSAGE_TOO_LARGE"),
    ]
    assert error is None
    assert producer.sent == [b"once", b"once", b"twice", b"twice", b"invalid", b"large", b"fine"]


async def test_an_unexpected_server_error_stops_the_rows_and_sets_none_aside() -> None:
    # Given rows of one key whose lone sends get the broker's UNKNOWN_SERVER_ERROR (a fault that lasts a while)
    producer = _ScriptedProducer({b"1": [UnknownError()] * 5, b"2": [UnknownError()] * 5})
    relay = _relay(producer)
    rows = [ClaimedRow(n, "t", "K", (), value, None) for n, value in enumerate([b"1", b"2"])]

    # When the relay sends them one by one
    published, refused, error = await relay._one_by_one(rows)

    # Then nothing is set aside (the key keeps its order): the error ends the pass, to be waited out
    assert (published, refused, type(error)) == ([], [], UnknownError)
    assert producer.sent == [b"1"]


def test_invalid_record_is_told_apart_from_an_unexpected_server_error() -> None:
    # Given the relay's producers made (they register the codes aiokafka does not know)
    register_error_codes()

    # When the broker answers INVALID_RECORD (87) or UNKNOWN_SERVER_ERROR (-1), Then the first is a refusal of the
    # content, the second is not
    assert for_code(87) is InvalidRecordError
    assert isinstance(for_code(87)(), refusals())
    assert not isinstance(for_code(-1)(), refusals())


def test_a_relay_that_published_since_its_last_start_backs_off_from_the_first_step_again() -> None:
    # Given a relay that has committed 3 batches, restarted after an outage of 4 failed starts that had grown its
    # backoff to 16 s
    relay = _relay(None)
    relay._batches = 3

    # When it fails again, having published nothing since that start, or having published a batch
    failed_again = outage_wait(relay._failed(4, batches=3))
    relay._batches = 4
    new_outage = outage_wait(relay._failed(4, batches=3))

    # Then the same outage keeps its backoff, and a new one starts from one second, not from where the last ended
    assert (failed_again, new_outage) == (16.0, 1.0)


class _Listing:
    def __init__(self, topics: set[str] | None) -> None:
        self._topics = topics

    async def fetch_all_metadata(self) -> _Listing:
        if self._topics is None:
            raise KafkaConnectionError()
        return self

    def topics(self) -> set[str]:
        assert self._topics is not None
        return self._topics


class _ListingProducer:
    def __init__(self, topics: set[str] | None) -> None:
        self.client = _Listing(topics)


async def test_a_missing_topic_is_claimed_again_once_the_broker_lists_it_and_not_while_no_broker_answers() -> None:
    # Given a relay that found two topics missing
    relay = _relay(None)
    relay._missed([(ClaimedRow(1, "a", "K", (), b"", None), TopicMissing("a"))])
    relay._missed(
        [(ClaimedRow(2, "b", "K", (), b"", None), TopicMissing("b")), (ClaimedRow(3, "c", "K", (), b"", None), None)]
    )
    assert relay._missing == {"a", "b"}

    # When it asks while no broker answers, then while the broker lists one of them
    await relay._look_for_missing(_ListingProducer(None))
    unanswered = set(relay._missing)
    await relay._look_for_missing(_ListingProducer({"a", "other"}))

    # Then no answer changes nothing, and the listed topic is claimed again while the other still waits
    assert (unanswered, set(relay._missing)) == ({"a", "b"}, {"b"})


class _MetadataProducer:
    """Answers `partitions_for` for the topics it has, and gives up on the others once all are being asked."""

    def __init__(self, present: set[str], asked: int) -> None:
        self.client = _Listing(present)
        self._present = present
        self._asked = asyncio.Event()
        self._expected = asked
        self.in_flight = 0
        self.most_in_flight = 0

    async def partitions_for(self, topic: str) -> set[int]:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.most_in_flight >= self._expected:
            self._asked.set()
        try:
            await asyncio.wait_for(self._asked.wait(), timeout=5)
            if topic not in self._present:
                raise UnknownTopicOrPartitionError()
            return {0, 1}
        finally:
            self.in_flight -= 1


async def test_a_batchs_topics_are_asked_for_at_once_so_missing_ones_cost_one_wait_not_one_each() -> None:
    # Given a batch with rows of two topics the broker does not have and one it has (aiokafka waits up to its
    # request timeout for each topic it cannot find)
    producer = _MetadataProducer({"present"}, asked=3)
    partitions: dict[str, list[int]] = {}

    # When the relay resolves the batch's topics
    missing = await _resolve(producer, {"gone-1", "gone-2", "present"}, partitions)  # type: ignore[arg-type]

    # Then all three were asked at once, the two missing ones are told apart from the present one
    assert producer.most_in_flight == 3
    assert (missing, partitions) == ({"gone-1", "gone-2"}, {"present": [0, 1]})


async def test_a_pass_of_corrupt_answers_pauses_once_not_once_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a row its partition takes, then three that a broker before Kafka 2.5 refuses, each time, as corrupt
    # (keyless rows for a compacted topic)
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    monkeypatch.setattr(relay_module.asyncio, "sleep", pause)
    corrupt = {value: [CorruptRecordException(), CorruptRecordException()] for value in (b"1", b"2", b"3")}
    producer = _ScriptedProducer(corrupt)
    relay = _relay(producer)
    rows = [ClaimedRow(n, "t", None, (), value, None) for n, value in enumerate([b"ok", b"1", b"2", b"3"])]

    # When the relay sends them one by one
    published, refused, error = await relay._one_by_one(rows)

    # Then the three are set aside after two answers each (their partition took a row: it is healthy), and the
    # pass paused once
    assert ([row.payload for row in published], [row.payload for row, _ in refused], error) == (
        [b"ok"],
        [b"1", b"2", b"3"],
        None,
    )
    assert pauses == [relay_module._SUSPECT_PAUSE_SECONDS]


async def test_corrupt_answers_on_a_partition_that_takes_nothing_end_the_pass_until_they_repeat_pass_after_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given rows of one key whose partition answers every send as corrupt (a fault that lasts, or keyless rows of a
    # compacted topic on a broker before Kafka 2.5: the relay cannot tell which)
    monkeypatch.setattr(relay_module, "_SUSPECT_PAUSE_SECONDS", 0.0)
    producer = _ScriptedProducer({value: [CorruptRecordException()] * 100 for value in (b"1", b"2")})
    relay = _relay(producer)
    rows = [ClaimedRow(n, "t", "K", (), value, None) for n, value in enumerate([b"1", b"2"])]

    # When the relay sends them one by one in three passes (its backoff between them)
    passes = [await relay._one_by_one(rows) for _ in range(3)]

    # Then the first two passes set nothing aside and end with the error (the key keeps its order), and the third
    # sets the first row aside, the answer being the row's
    assert [(published, [row.id for row, _ in refused], type(error)) for published, refused, error in passes] == [
        ([], [], CorruptRecordException),
        ([], [], CorruptRecordException),
        ([], [0], CorruptRecordException),
    ]


class _DeniedAndSlow:
    """Refuses one topic at once (no permission to describe it) and never answers for the other."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    async def partitions_for(self, topic: str) -> set[int]:
        if topic == "denied":
            raise TopicAuthorizationFailedError(topic)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(topic)
            raise
        return set()


async def test_a_topic_that_fails_ends_the_questions_about_the_batchs_other_topics() -> None:
    # Given a batch with a topic the relay may not describe and one whose metadata does not come
    producer = _DeniedAndSlow()

    # When the relay resolves the batch's topics, Then the failure ends it, and the other question is cancelled,
    # not left running into a producer that stops
    with pytest.raises(TopicAuthorizationFailedError):
        await _resolve(producer, {"denied", "slow"}, {})  # type: ignore[arg-type]
    assert producer.cancelled == ["slow"]


async def test_the_relays_producers_teach_aiokafka_invalid_record(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an aiokafka that does not know INVALID_RECORD (87) yet
    monkeypatch.delitem(kafka_errors.kafka_errors, 87, raising=False)
    assert for_code(87) is UnknownError

    # When a relay's producer is made, Then the broker's 87 reaches the relay as InvalidRecordError
    producer = make_producer(OrderSettings())
    assert for_code(87) is InvalidRecordError
    await producer.stop()


async def test_a_later_aiokafkas_own_invalid_record_error_is_a_refusal_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given an aiokafka that knows INVALID_RECORD itself (registration leaves its class in place)
    class TheirInvalidRecord(kafka_errors.BrokerResponseError):  # type: ignore[misc]
        errno = 87

    monkeypatch.setitem(kafka_errors.kafka_errors, 87, TheirInvalidRecord)
    register_error_codes()
    producer = _ScriptedProducer({b"keyless": [TheirInvalidRecord()]})
    relay = _relay(producer)

    # When a row gets it, sent alone
    published, refused, error = await relay._one_by_one([ClaimedRow(1, "t", None, (), b"keyless", None)])

    # Then it is set aside as invalid, not waited out for ever
    assert (published, error) == ([], None)
    assert [(row.id, set_aside_code(refusal)) for row, refusal in refused] == [(1, "MESSAGE_INVALID")]

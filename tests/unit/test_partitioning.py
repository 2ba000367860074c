"""The relay picks each row's partition itself (it builds the record batches): it must be Kafka's own pick."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner, murmur2
from hypothesis import example, given
from hypothesis import strategies as st

from service.adapters import kafka


@given(st.binary(max_size=200))
@example(b"")
@example(b"order-1")
def test_murmur2_is_aiokafkas_for_any_bytes(data: bytes) -> None:
    assert kafka.murmur2(data) == murmur2(data)


@given(st.binary(max_size=100), st.integers(min_value=1, max_value=1000))
def test_a_keyed_record_goes_to_the_partition_the_producer_would_pick(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert kafka.partition_of(key, partitions) == DefaultPartitioner()(key, partitions, partitions)


@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, unique=True))
def test_a_record_without_a_key_goes_to_one_of_the_topics_partitions(partitions: list[int]) -> None:
    assert kafka.partition_of(None, sorted(partitions)) in partitions

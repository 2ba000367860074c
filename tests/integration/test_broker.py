"""The suite runs on the broker its users deploy, Apache Kafka 4 or newer, never silently on the old 2.3, and
leaves no topics on it."""

from __future__ import annotations

import asyncio
import struct
import uuid

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from tests.support import Topics, create_topics, delete_topics, eventually

API_VERSIONS, PRODUCE, FETCH = 18, 0, 1
# Apache Kafka 2.3.0 serves Produce up to v7 and Fetch v0-v11; Kafka 4.0 removed Fetch v0-v3 (KIP-896).
KAFKA_2_3_MAX = {PRODUCE: 7, FETCH: 11}


async def api_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    """The broker's answer to ApiVersions v0: each API key's (min, max) version, read off the wire."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    client_id = b"order-service-tests"
    request = struct.pack(">hhih", API_VERSIONS, 0, 1, len(client_id)) + client_id
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(struct.pack(">i", len(request)) + request)
        await writer.drain()
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))
        body = await asyncio.wait_for(reader.readexactly(size), 10)
    finally:
        writer.close()
        await writer.wait_closed()
    _correlation_id, error, count = struct.unpack_from(">ihi", body)
    assert error == 0, f"ApiVersions answered error {error}"
    entries = (struct.unpack_from(">hhh", body, 10 + 6 * index) for index in range(count))
    return {key: (low, high) for key, low, high in entries}


async def test_the_broker_is_apache_kafka_4_or_newer(kafka: str) -> None:
    versions = await api_versions(kafka)

    assert versions[FETCH][1] > KAFKA_2_3_MAX[FETCH], versions[FETCH]
    assert versions[PRODUCE][1] > KAFKA_2_3_MAX[PRODUCE], versions[PRODUCE]
    assert versions[FETCH][0] >= 4, "a broker that still serves Fetch v0-v3 predates Kafka 4 (KIP-896)"


async def _listed(kafka: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_tests_topics_are_deleted_after_it_those_it_made_by_writing_included(kafka: str) -> None:
    # Given a test's topics, one more made by writing to it (auto-creation), and another test's topics
    mine, other = Topics(f"t{uuid.uuid4().hex[:10]}"), Topics(f"t{uuid.uuid4().hex[:10]}")
    await create_topics(kafka, mine)
    await create_topics(kafka, other)
    producer = AIOKafkaProducer(bootstrap_servers=kafka)
    await producer.start()
    try:
        await producer.send_and_wait(f"{mine.source}.wide", b"x")
    finally:
        await producer.stop()
    assert {*mine.all(), f"{mine.source}.wide"} <= await _listed(kafka)

    # When the test's topics are deleted (the `topics` fixture does it after each test)
    await delete_topics(kafka, mine)

    # Then none of them is left, and the other test's are all there
    async def gone() -> bool:
        return not any(name.startswith(mine.source) for name in await _listed(kafka))

    await eventually(gone, timeout=30)
    assert set(other.all()) <= await _listed(kafka)
    await delete_topics(kafka, other)

"""The suite runs on the broker its users deploy, Apache Kafka 4 or newer, never silently on the old 2.3."""

from __future__ import annotations

import asyncio
import struct

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

"""A client certificate rotated on disk while the process runs is presented on the next connection, without a
restart (service/adapters/certificates.py): real TLS, the tests' CA, a local server that requires a client
certificate and says whose it got."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.adapters import certificates
from tests.support.secured import SecuredKafka


@pytest.fixture
async def tls_server(secured_kafka: SecuredKafka) -> AsyncIterator[tuple[int, list[str]]]:
    """A TLS server on loopback with the broker's certificate, requiring a client certificate of the test CA; the
    common names it saw, in order."""
    broker = Path(secured_kafka.ca_file).parent / "kafka-broker.pem"
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=secured_kafka.ca_file)
    context.load_cert_chain(broker, broker.with_suffix(".key"))
    context.verify_mode = ssl.CERT_REQUIRED
    seen: list[str] = []

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peercert")
        seen.append(next(value for rdn in peer["subject"] for key, value in rdn if key == "commonName"))
        writer.write(b"hello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0, ssl=context)
    async with server:
        yield server.sockets[0].getsockname()[1], seen


async def connect(port: int, context: ssl.SSLContext) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost")
    try:
        return await reader.readline()
    finally:
        writer.close()


async def test_a_rotated_client_certificate_is_presented_on_the_next_connection(
    secured_kafka: SecuredKafka, tls_server: tuple[int, list[str]], tmp_path: Path
) -> None:
    # Given the service's TLS context made from a client certificate's files (CN=admin)
    port, seen = tls_server
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    admin_cert, admin_key = secured_kafka.certificate("admin")
    shutil.copy(admin_cert, cert)
    shutil.copy(admin_key, key)
    context = certificates.context_for(secured_kafka.ca_file, str(cert), str(key))
    assert await connect(port, context) == b"hello\n"

    # When the files are replaced by another certificate (CN=service), and the watcher looks
    service_cert, service_key = secured_kafka.certificate("service")
    shutil.copy(service_key, key)
    assert certificates.reload() == 0  # caught half-way (the key is not the certificate's): the old one is kept
    assert await connect(port, context) == b"hello\n"
    shutil.copy(service_cert, cert)
    assert certificates.reload() == 1

    # Then the same context presents the new certificate, and nothing changed is loaded again
    assert await connect(port, context) == b"hello\n"
    assert certificates.reload() == 0
    assert seen == ["admin", "admin", "service"]

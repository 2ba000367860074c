"""The secured infrastructure itself, with plain clients and no service: the secured broker takes a record over each
of SCRAM-SHA-512, mutual TLS and OAUTHBEARER and refuses what it must (a wrong password, an expired token, another
CA, a principal without ACLs, a topic nobody created); the TLS-only PostgreSQL role logs in over verified TLS only.
The service's own behaviour on this infrastructure is tested elsewhere."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import time
import uuid
from typing import Any

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.abc import AbstractTokenProvider
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, TopicAuthorizationFailedError
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.admin import SaslAuthenticateRequest
from aiokafka.protocol.metadata import MetadataRequest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from service.store.connect import database
from tests.support.secured import LISTENERS, Acl, Listener, PgTls, SecuredAdmin, SecuredKafka

TOPIC_AUTHORIZATION_FAILED = 29
UNKNOWN_TOPIC_OR_PARTITION = 3


class IssuerTokens(AbstractTokenProvider):  # type: ignore[misc]
    """A token from the local issuer at every authentication: all a test needs."""

    def __init__(self, kafka: SecuredKafka, client_id: str) -> None:
        self.url = kafka.token_url
        self.auth = (client_id, kafka.client_secret(client_id))

    async def token(self) -> str:
        async with httpx.AsyncClient() as http:
            answer = await http.post(self.url, data={"grant_type": "client_credentials"}, auth=self.auth)
        answer.raise_for_status()
        token: str = answer.json()["access_token"]
        return token


def options(kafka: SecuredKafka, listener: Listener, principal: str, **extra: Any) -> dict[str, Any]:
    """A plain client's options for `listener` as `principal`."""
    provider = IssuerTokens(kafka, principal) if listener == "oauth" else None
    return kafka.client_options(listener, principal, token_provider=provider, **extra)


async def connect(client_options: dict[str, Any]) -> Any:
    """One authenticated connection to the bootstrap broker: its errors are the broker's own answer."""
    settings = dict(client_options)
    host, _, port = settings.pop("bootstrap_servers").rpartition(":")
    return await create_conn(host, int(port), request_timeout_ms=10_000, **settings)


async def new_topic(admin: SecuredAdmin) -> str:
    """A fresh one-partition topic, made by the super user."""
    name = f"s{uuid.uuid4().hex[:10]}"
    await admin.create_topics([name])
    return name


@pytest.mark.parametrize("listener", LISTENERS)
async def test_a_record_goes_through_each_listener_with_only_its_read_and_write_acls(
    listener: Listener, secured_kafka: SecuredKafka, secured_admin: SecuredAdmin
) -> None:
    topic = await new_topic(secured_admin)
    await secured_admin.grant(Acl("User:service", "TOPIC", topic, "WRITE"), Acl("User:service", "TOPIC", topic, "READ"))
    client = options(secured_kafka, listener, "service")

    producer = AIOKafkaProducer(**client)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"over " + listener.encode(), key=b"A-1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**client, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        record = await asyncio.wait_for(consumer.getone(), timeout=10)
    finally:
        await consumer.stop()

    assert (record.key, record.value) == (b"A-1", b"over " + listener.encode())


async def test_a_wrong_scram_password_is_refused(secured_kafka: SecuredKafka) -> None:
    client = secured_kafka.client_options("scram", "service")
    client["sasl_plain_password"] = "not-" + secured_kafka.password("service")

    with pytest.raises(SaslAuthenticationFailed):
        await connect(client)


async def test_an_expired_oauth_token_is_refused(secured_kafka: SecuredKafka) -> None:
    tokens = IssuerTokens(secured_kafka, "expired")
    claims = json.loads(base64.urlsafe_b64decode((await tokens.token()).split(".")[1] + "=="))
    assert claims["exp"] < time.time()

    connection = await connect(secured_kafka.client_options("oauth", "expired", token_provider=tokens))
    try:
        # aiokafka takes the broker's error challenge (RFC 7628 §3.2.2) for success, and does not answer it: the
        # client's answer (a lone 0x01) is what makes the broker send its refusal.
        answer = await connection.send(SaslAuthenticateRequest(b"\x01"))
    finally:
        await connection.close()

    assert (answer.error_code, answer.error_message) == (SaslAuthenticationFailed.errno, '{"status":"invalid_token"}')


async def test_the_issuer_refuses_a_wrong_client_secret(secured_kafka: SecuredKafka) -> None:
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            secured_kafka.token_url, data={"grant_type": "client_credentials"}, auth=("service", "wrong")
        )

    assert (answer.status_code, answer.json()) == (401, {"error": "invalid_client"})


@pytest.mark.parametrize("listener", LISTENERS)
def test_a_client_that_trusts_only_another_ca_cannot_verify_the_broker(
    listener: Listener, secured_kafka: SecuredKafka
) -> None:
    host, _, port = secured_kafka.bootstrap(listener).rpartition(":")
    context = ssl.create_default_context(cafile=secured_kafka.other_ca_file)

    with socket.create_connection((host, int(port)), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        context.wrap_socket(raw, server_hostname=host)


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
async def test_the_mutual_tls_listener_refuses_a_client_without_a_certificate_of_the_ca(
    certificate: str, secured_kafka: SecuredKafka
) -> None:
    client = secured_kafka.client_options("mtls", "untrusted_service")
    if certificate == "none":
        client["ssl_context"] = create_ssl_context(cafile=secured_kafka.ca_file)

    with pytest.raises(KafkaConnectionError):
        await connect(client)


async def test_a_principal_without_acls_can_neither_see_nor_read_a_topic(
    secured_kafka: SecuredKafka, secured_admin: SecuredAdmin
) -> None:
    topic = await new_topic(secured_admin)

    connection = await connect(secured_kafka.client_options("scram", "intruder"))
    try:
        metadata = await connection.send(MetadataRequest([topic]))
    finally:
        await connection.close()
    assert [(error, name) for error, name, *_ in metadata.topics] == [(TOPIC_AUTHORIZATION_FAILED, topic)]

    # Allowed to see it, still not to read it.
    await secured_admin.grant(Acl("User:intruder", "TOPIC", topic, "DESCRIBE"))
    consumer = AIOKafkaConsumer(**secured_kafka.client_options("scram", "intruder"), auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        with pytest.raises(TopicAuthorizationFailedError):
            await asyncio.wait_for(consumer.getone(), timeout=10)
    finally:
        await consumer.stop()


async def test_the_broker_creates_no_topic_on_demand_even_for_the_super_user(
    secured_kafka: SecuredKafka, secured_admin: SecuredAdmin
) -> None:
    topic = f"s{uuid.uuid4().hex[:10]}"

    connection = await connect(secured_kafka.client_options("scram", "admin"))
    try:
        metadata = await connection.send(MetadataRequest([topic], allow_auto_topic_creation=True))
    finally:
        await connection.close()

    assert [(error, name) for error, name, *_ in metadata.topics] == [(UNKNOWN_TOPIC_OR_PARTITION, topic)]
    assert topic not in await secured_admin.topic_names()


async def test_the_tls_role_logs_in_over_tls_that_verifies_the_server(pg_tls: PgTls) -> None:
    context = ssl.create_default_context(cafile=pg_tls.ca_file)

    connection = await asyncpg.connect(
        host=pg_tls.host, port=pg_tls.port, user=pg_tls.role, password=pg_tls.password, database="postgres", ssl=context
    )
    try:
        row = await connection.fetchrow("SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await connection.close()

    assert (row["current_user"], row["ssl"]) == (pg_tls.role, True)


@pytest.mark.parametrize(
    ("how", "refusal"),
    [
        ("without TLS", asyncpg.InvalidAuthorizationSpecificationError),
        ("with a wrong password", asyncpg.InvalidPasswordError),
        ("trusting only another CA", ssl.SSLCertVerificationError),
    ],
)
async def test_the_tls_role_is_refused(how: str, refusal: type[Exception], pg_tls: PgTls) -> None:
    password = "wrong" if how == "with a wrong password" else pg_tls.password
    tls: ssl.SSLContext | bool = ssl.create_default_context(
        cafile=pg_tls.other_ca_file if how == "trusting only another CA" else pg_tls.ca_file
    )
    if how == "without TLS":
        tls = False

    with pytest.raises(refusal):
        await asyncpg.connect(
            host=pg_tls.host, port=pg_tls.port, user=pg_tls.role, password=password, database="postgres", ssl=tls
        )


async def test_a_tests_own_database_is_usable_by_the_tls_role_through_its_url(tls_database_url: str) -> None:
    target = database(tls_database_url)
    engine = create_async_engine(target.url, connect_args=target.connect_args())
    try:
        async with engine.connect() as connection:
            role = await connection.scalar(text("SELECT current_user"))
            await connection.execute(text("SELECT count(*) FROM inbox"))
    finally:
        await engine.dispose()

    assert role == "service_tls"

"""Kafka clients (aiokafka) and the translation of their records into `SourceRecord`."""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.conn import create_conn
from aiokafka.protocol.metadata import MetadataRequest

from service.adapters import certificates, oauth
from service.config import Settings
from service.explain import causes, explain, kafka_reason
from service.policy.backoff import outage_wait
from service.policy.records import SourceRecord
from service.stopping import sleep_unless_stopped

log = structlog.get_logger("kafka")
_WORD = struct.Struct("<I")
_M = 0x5BD1E995


def to_source(record: ConsumerRecord[bytes, bytes]) -> SourceRecord:
    """An aiokafka record as a library-neutral SourceRecord."""
    # By position (topic, partition, offset, timestamp_ms, key, value, headers), as it runs once per record
    # (docs/performance.md, "What the consumer does per record"). The client hands the headers over as a tuple of
    # pairs, which `tuple` returns as it is; a header without a value arrives as None, and most records carry none.
    headers = tuple(record.headers)
    for _, value in headers:
        if value is None:
            headers = tuple([(name, value or b"") for name, value in headers])
            break
    # A record of the oldest format (magic 0) has no timestamp: the client gives None, Kafka's own "none" is -1.
    timestamp = record.timestamp
    if timestamp is None:
        timestamp = -1
    return SourceRecord(record.topic, record.partition, record.offset, timestamp, record.key, record.value, headers)


# The longest the broker holds a fetch that has less than FETCH_MIN_BYTES to give. aiokafka sends one fetch per
# broker at a time, and only for the partitions it holds no unread records of: while the records of the source's
# partitions wait in its buffer, the fetch it sends asks only for the empty retry tiers, and the broker holds it
# this long while the source's partitions run dry behind it (aiokafka's default, 500 ms, stalled drains).
# At a steady rate a fetch that returned as soon as one record had come was made as often as the producers send,
# each paid for in the consumer and the broker, for rounds that start at most every 20 ms anyway
# (service/worker/spacing.py). A fetch waits for FETCH_MIN_BYTES or this long, whichever comes first: a backlog is
# fetched at once, a steady rate in about one fetch per round. The price is an idle consumer's fifty empty fetches
# a second; docs/performance.md has both sides' figures.
FETCH_MAX_WAIT_MS = 20
FETCH_MIN_BYTES = 512 * 1024


def client_options(settings: Settings) -> dict[str, Any]:
    """The bootstrap servers and the security options every Kafka client of the service takes (contract §11):
    TLS with the CA file (host names always verified) and a client certificate for mutual TLS, SASL with PLAIN,
    SCRAM or OAUTHBEARER (a token of the OAuth 2 client-credentials grant, service/adapters/oauth.py)."""
    protocol = settings.kafka_security_protocol
    options: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap_servers, "security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = certificates.context_for(
            settings.kafka_ssl_cafile, settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile
        )
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = settings.kafka_sasl_mechanism
        options["sasl_mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = oauth.provider_for(settings)
        else:
            password = settings.kafka_sasl_password
            options["sasl_plain_username"] = settings.kafka_sasl_username
            options["sasl_plain_password"] = password.get_secret_value() if password is not None else None
    return options


def make_admin(settings: Settings) -> AIOKafkaAdminClient:
    """An admin client (topics, ACLs, group offsets), with the service's security options."""
    return AIOKafkaAdminClient(client_id=f"{settings.consumer_name}-admin", **client_options(settings))


def make_consumer(settings: Settings) -> AIOKafkaConsumer:
    """A group member with manual commits: offsets move only after records are terminal."""
    return AIOKafkaConsumer(
        **client_options(settings),
        group_id=settings.consumer_name,
        client_id=f"{settings.consumer_name}-consumer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=settings.batch_size,
        fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
        fetch_min_bytes=FETCH_MIN_BYTES,
    )


# The client checks a message's size before compression; the broker checks the compressed batch against its
# `message.max.bytes`. A source record the broker took compressed (a large, repetitive order) must be able to
# go to a retry tier: the client lets through up to this much, compression shrinks it, and the broker has the last
# word (a refusal sets the row aside, see service/worker/relay.py).
MAX_UNCOMPRESSED_MESSAGE = 32 * 1024 * 1024
# The producer builds one batch per partition while the last one is on its way, and sends the next only once the
# broker answered for it (idempotent: one request in flight per partition): a partition's rate is a batch per round
# trip. Batches of 16 KiB (the client's default) hold about forty outbox rows; these hold about a thousand, and stay
# well under the broker's default `message.max.bytes` (1 MiB) compressed, also when compression cannot shrink them.
MAX_BATCH = 512 * 1024
# zstd (Kafka 2.1 and later; aiokafka through cramjam): far cheaper per batch than aiokafka's gzip, which is level 9
# (docs/performance.md). A reader of the topics the service writes needs a client that reads zstd.
COMPRESSION = "zstd"


class InvalidRecordError(kafka_errors.BrokerResponseError):  # type: ignore[misc]
    """INVALID_RECORD (87, Kafka 2.5 and later): the broker refuses the record's content, e.g. a record without a
    key on a compacted topic. aiokafka 0.14 does not know the code and reports it as `UnknownError`, as it does the
    broker's UNKNOWN_SERVER_ERROR (a fault): registered, the relay can tell the two apart."""

    errno = 87
    message = "INVALID_RECORD"
    description = "The broker refused the record's content."


def register_error_codes() -> None:
    """Teach aiokafka the broker answers the relay must tell apart from `UnknownError` (InvalidRecordError); a code
    that a later aiokafka knows itself is left to it."""
    kafka_errors.kafka_errors.setdefault(InvalidRecordError.errno, InvalidRecordError)


def make_producer(settings: Settings, *, idempotent: bool = True) -> AIOKafkaProducer:
    """An idempotent producer: broker-side retries never duplicate or reorder a partition's messages.

    `idempotent=False` is for records sent one at a time and awaited each: a refused record does not break the
    sequence numbers of the records after it, as it does for an idempotent producer.
    """
    register_error_codes()
    return AIOKafkaProducer(
        **client_options(settings),
        client_id=f"{settings.consumer_name}-relay",
        enable_idempotence=idempotent,
        acks="all",
        linger_ms=5,
        max_batch_size=MAX_BATCH,
        request_timeout_ms=15_000,
        compression_type=COMPRESSION,
        max_request_size=MAX_UNCOMPRESSED_MESSAGE,
    )


async def diagnose(settings: Settings) -> BaseException | None:
    """Why a client could not connect, when the client does not say: aiokafka answers every failed bootstrap with
    "Unable to bootstrap" and logs the cause (a certificate that does not verify, a refused login). One connection to
    the first bootstrap server with the same options raises that cause; None when it connects."""
    options = client_options(settings)
    host, _, port = options.pop("bootstrap_servers").split(",")[0].strip().rpartition(":")
    try:
        async with asyncio.timeout(15):
            connection = await create_conn(host.strip("[]"), int(port), request_timeout_ms=10_000, **options)
    except Exception as error:
        return error
    try:
        async with asyncio.timeout(15):
            metadata: Any = await connection.send(MetadataRequest([]))
    except Exception as error:
        return error
    finally:
        connection.close()
    if not metadata.brokers and settings.kafka_sasl_mechanism == "OAUTHBEARER":
        # aiokafka's OAUTHBEARER takes the broker's refusal of a token (an expired one, say: RFC 7628's
        # {"status":"invalid_token"}) for a login; the broker then answers as to a client that never logged in.
        refused: BaseException = kafka_errors.SaslAuthenticationFailed("the broker refused the OAuth token")
        return refused
    return None


async def start_with_backoff(
    start: Callable[[], Awaitable[Any]],
    stop: asyncio.Event,
    what: str,
    settings: Settings | None = None,
) -> bool:
    """Call `start` until it succeeds or `stop` is set; one clear log line per failed try, no traceback, saying why
    when `settings` let the cause be found (`diagnose`)."""
    failures = 0
    names = settings if settings is not None else Settings
    while not stop.is_set():
        try:
            await start()
            return True
        except Exception as error:
            failures += 1
            delay = outage_wait(failures)
            cause = await diagnose(settings) if settings is not None and _unexplained(error) else None
            if cause is not None and not _named_by(cause):
                cause = None  # (unreachable, as the client said)
            log.warning(
                "kafka_unavailable",
                client=what,
                error=type(error).__name__,
                reason=kafka_reason([*causes(cause), *causes(error)], names=names) if cause else explain(error, names),
                retry_in_seconds=delay,
            )
            log.debug("kafka_unavailable_detail", exc_info=error)
            await sleep_unless_stopped(stop, delay)
    return False


@contextlib.asynccontextmanager
async def diagnosed(settings: Settings) -> AsyncIterator[None]:
    """For a short command's Kafka clients: a failed bootstrap is raised as its cause (`diagnose`), so that the
    command's one line says why (service/explain.py)."""
    try:
        yield
    except (kafka_errors.KafkaConnectionError, kafka_errors.NodeNotReadyError) as error:
        cause = await diagnose(settings)
        if cause is None or not _named_by(cause):
            raise  # (unreachable, as it said)
        raise cause from error


def _named_by(cause: BaseException) -> bool:
    """Whether a diagnosed cause says more than "unreachable": a login, a certificate, an ACL, a token endpoint."""
    return kafka_reason([*causes(cause), kafka_errors.KafkaConnectionError()]) is not None


def _unexplained(error: BaseException) -> bool:
    """A failed start whose cause aiokafka kept to its log: its bootstrap's KafkaConnectionError, or a node that never
    became ready (a connection the broker closed after the login)."""
    return isinstance(error, kafka_errors.KafkaConnectionError | kafka_errors.NodeNotReadyError)


async def stop_quietly(client: Any) -> None:
    """Close a Kafka client that may never have started (stopped while waiting for the broker): without it the
    client warns `Unclosed AIOKafkaConsumer` on the way out."""
    try:
        await client.stop()
    except Exception as error:  # it was never up: nothing to flush or leave
        log.debug("kafka_client_stop_failed", error=type(error).__name__)


async def group_lag(settings: Settings, topic: str) -> int:
    """Records of `topic` that the consumer group has not committed yet (all partitions)."""
    admin = make_admin(settings)
    consumer = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False)
    try:
        async with diagnosed(settings):
            await admin.start()
            await consumer.start()
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or set())]
        if not partitions:
            await consumer.topics()
            partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or set())]
        committed = await admin.list_consumer_group_offsets(settings.consumer_name, partitions=partitions)
        ends = await consumer.end_offsets(partitions)
    finally:
        await stop_quietly(consumer)
        try:
            await admin.close()
        except Exception as error:  # it never connected
            log.debug("kafka_admin_close_failed", error=type(error).__name__)
    lag = 0
    for partition in partitions:
        done = committed.get(partition)
        lag += ends[partition] - (done.offset if done is not None and done.offset >= 0 else 0)
    return int(lag)


def partition_of(key: bytes | None, partitions: Sequence[int]) -> int:
    """The partition Kafka's default partitioner picks for `key` among a topic's `partitions` (sorted): the
    murmur2 hash of the key, as the Java client and aiokafka compute it; any one for a record without a key."""
    if key is None:
        return random.choice(partitions)
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as an unsigned 32-bit int: aiokafka's
    `aiokafka.partitioner.murmur2`, a word at a time (faster: docs/performance.md; a test holds the two equal)."""
    length = len(data)
    h = 0x9747B28C ^ length
    end = length & ~3
    for (k,) in _WORD.iter_unpack(data[:end]):
        k = (k * _M) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * _M) & 0xFFFFFFFF
        h = ((h * _M) & 0xFFFFFFFF) ^ k
    extra = length - end
    if extra:
        if extra == 3:
            h ^= data[end + 2] << 16
        if extra >= 2:
            h ^= data[end + 1] << 8
        h = ((h ^ data[end]) * _M) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * _M) & 0xFFFFFFFF
    return h ^ (h >> 15)

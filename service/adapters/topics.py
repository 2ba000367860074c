"""The broker's side of the declared topics (contract §11): what exists, asked without creating anything; creating
and altering topics. Every client takes the service's security options (service/adapters/kafka.py).

A broker with `auto.create.topics.enable` creates a topic that a metadata request names, unless the request says
not to: the admin client's `describe_topics` does not say so, which would make a start-up check create what it
checks. The metadata here is asked for with `allow_auto_topic_creation=False`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka.admin import NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.metadata import MetadataRequest

from service.adapters.kafka import client_options, diagnosed, make_admin
from service.config import Settings
from service.errors import TopicsMissing, TopicsProblem
from service.policy.topics import Alter, Create, Observed, TopicSpec, declared_topics, not_ready_line

log = structlog.get_logger("topics")

_UNKNOWN_TOPIC = 3  # UNKNOWN_TOPIC_OR_PARTITION: the broker does not have it
_LEADER_NOT_AVAILABLE = 5  # a topic just created, before its leaders are elected: it exists
_TOPIC_AUTHORIZATION_FAILED = 29
_CLUSTER_AUTHORIZATION_FAILED = 31
_TOPIC_ALREADY_EXISTS = 36
_DYNAMIC_TOPIC_CONFIG = 1  # DescribeConfigs v1+: a config set on the topic itself
# The longest one look at the broker may take: a long-running process says so and tries again rather than hang.
LOOK_SECONDS = 30.0


def declared(settings: Settings) -> tuple[TopicSpec, ...]:
    """The topics these settings declare (contract §4), with their configs."""
    policy = settings.retry_policy()
    return declared_topics(
        settings.topics, policy.tier_labels, horizon=policy.horizon, dedup_window=settings.dedup_window
    )


@dataclass(frozen=True)
class Found:
    """Of the topics asked for: those the broker does not have, and those this principal may not describe."""

    missing: tuple[str, ...]
    not_authorized: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Every topic exists and may be described."""
        return not self.missing and not self.not_authorized


async def _metadata(settings: Settings, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The broker's metadata of each named topic (error code, partitions), creating none."""
    client = AIOKafkaClient(**client_options(settings), client_id=f"{settings.consumer_name}-topics")
    try:
        async with asyncio.timeout(LOOK_SECONDS), diagnosed(settings):
            await client.bootstrap()
            response = await client.send(
                client.get_random_node(), MetadataRequest(list(names), allow_auto_topic_creation=False)
            )
    finally:
        await client.close()
    return {topic["topic"]: topic for topic in response.to_object()["topics"]}


def _exists(topic: dict[str, Any]) -> bool:
    code = topic["error_code"]
    if code in (0, _LEADER_NOT_AVAILABLE):
        return True
    if code in (_UNKNOWN_TOPIC, _TOPIC_AUTHORIZATION_FAILED):
        return False
    raise TopicsProblem(f"describing topic {topic['topic']} failed: {for_code(code).message}")


async def look(settings: Settings, names: Sequence[str]) -> Found:
    """Which of `names` the broker does not have, or will not describe to this principal."""
    return _found(await _metadata(settings, names), names)


def _found(topics: dict[str, dict[str, Any]], names: Sequence[str]) -> Found:
    missing, refused = [], []
    for name in names:
        topic = topics.get(name, {"topic": name, "error_code": _UNKNOWN_TOPIC})
        if topic["error_code"] == _TOPIC_AUTHORIZATION_FAILED:
            refused.append(name)
        elif not _exists(topic):
            missing.append(name)
    return Found(tuple(missing), tuple(refused))


def not_ready(settings: Settings, found: Found) -> TopicsMissing:
    """The error (its one line) for topics that are missing or may not be described."""
    line = not_ready_line(found.missing, found.not_authorized, source=settings.topics.source, program=settings.program)
    return TopicsMissing(line, found.missing, found.not_authorized)


async def require(settings: Settings, names: Sequence[str]) -> None:
    """Raise TopicsMissing unless every one of `names` exists and may be described (a short command's start-up
    check); a broker that cannot be reached raises its own error."""
    found = await look(settings, names)
    if not found.complete:
        raise not_ready(settings, found)


async def observe(settings: Settings, specs: Sequence[TopicSpec]) -> dict[str, Observed]:
    """The declared topics the broker has: partitions, replication factor and configs (the missing ones are left
    out). Raises TopicsProblem, naming the operation, when this principal may not describe one."""
    names = [spec.name for spec in specs]
    topics = await _metadata(settings, names)
    found = _found(topics, names)
    if found.not_authorized:
        raise TopicsProblem(f"not authorized: DESCRIBE on topic {found.not_authorized[0]}")
    present = [name for name in names if name not in found.missing]
    if not present:
        return {}
    configs = await _configs(settings, present)
    observed = {}
    for name in present:
        partitions = topics[name]["partitions"]
        every, overrides = configs[name]
        observed[name] = Observed(
            partitions=len(partitions),
            replication_factor=max((len(partition["replicas"]) for partition in partitions), default=0),
            configs=every,
            overrides=overrides,
        )
    return observed


async def _configs(
    settings: Settings, names: Sequence[str]
) -> dict[str, tuple[dict[str, str | None], dict[str, str | None]]]:
    """Each topic's configs: every value, and those set on the topic itself."""
    admin = make_admin(settings)
    try:
        async with diagnosed(settings):
            await admin.start()
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    finally:
        await _close(admin)
    found: dict[str, tuple[dict[str, str | None], dict[str, str | None]]] = {}
    for response in responses:
        for code, _, _, name, entries in response.resources:
            if code == _TOPIC_AUTHORIZATION_FAILED:
                raise TopicsProblem(f"not authorized: DESCRIBE_CONFIGS on topic {name}")
            if code:
                raise TopicsProblem(f"describing the configs of topic {name} failed: {for_code(code).message}")
            every = {entry[0]: entry[1] for entry in entries}
            # Version 0 answers "is default" where later ones name the source: set on the topic is "not default".
            if response.API_VERSION == 0:
                overrides = {entry[0]: entry[1] for entry in entries if not entry[3]}
            else:
                overrides = {entry[0]: entry[1] for entry in entries if entry[3] == _DYNAMIC_TOPIC_CONFIG}
            found[name] = (every, overrides)
    return found


@dataclass(frozen=True)
class Outcome:
    """One topic's creation or alteration: None when done, else the one line that says why not."""

    name: str
    failure: str | None


async def create(settings: Settings, creates: Sequence[Create]) -> list[Outcome]:
    """Create topics; one that exists meanwhile (a concurrent apply) counts as created."""
    if not creates:
        return []
    # NewTopic refuses -1 without an assignment; an empty one passes it through, and -1 asks for the broker's default
    # replication factor (CreateTopics, Kafka 2.4 and later: an older broker needs ORDERS_TOPIC_REPLICATION_FACTOR).
    topics = [
        NewTopic(
            each.name,
            each.partitions,
            each.replication_factor or -1,
            replica_assignments={},
            topic_configs=dict(each.configs),
        )
        for each in creates
    ]
    admin = make_admin(settings)
    try:
        async with diagnosed(settings):
            await admin.start()
        response = await admin.create_topics(topics)
    finally:
        await _close(admin)
    outcomes = []
    for name, code, *message in response.topic_errors:  # (version 0 answers no message)
        outcomes.append(Outcome(name, _refusal(code, message[0] if message else None, "CREATE", name)))
    return outcomes


async def alter(settings: Settings, alters: Sequence[Alter]) -> list[Outcome]:
    """Set topics' configs (AlterConfigs: each topic's whole set of its own configs, see `Alter`)."""
    outcomes, wanted = [], []
    for each in alters:
        if any(value is None for _, value in each.configs):
            # A sensitive config set on the topic is described without its value: AlterConfigs would drop it.
            outcomes.append(Outcome(each.name, f"topic {each.name} has a sensitive config set: alter it by hand"))
        else:
            wanted.append(ConfigResource(ConfigResourceType.TOPIC, each.name, configs=dict(each.configs)))
    if not wanted:
        return outcomes
    admin = make_admin(settings)
    try:
        async with diagnosed(settings):
            await admin.start()
        responses = await admin.alter_configs(wanted)
    finally:
        await _close(admin)
    for response in responses:
        for code, message, _, name in response.resources:
            outcomes.append(Outcome(name, _refusal(code, message, "ALTER_CONFIGS", name)))
    return outcomes


def _refusal(code: int, message: str | None, operation: str, name: str) -> str | None:
    """One line for a topic the broker refused to create or alter, naming the operation; None when it did not."""
    if code in (0, _TOPIC_ALREADY_EXISTS):
        return None
    if code == _TOPIC_AUTHORIZATION_FAILED:
        return f"not authorized: {operation} on topic {name}"
    if code == _CLUSTER_AUTHORIZATION_FAILED:
        return f"not authorized: {operation} on the cluster (or on topic {name})"
    said = f": {message.splitlines()[0]}" if message else ""
    return f"{operation} on topic {name} failed: {for_code(code).message}{said}"


async def _close(admin: Any) -> None:
    try:
        await admin.close()
    except Exception as error:  # it never connected
        log.debug("kafka_admin_close_failed", error=type(error).__name__)

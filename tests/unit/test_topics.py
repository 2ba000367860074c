"""The declared topics, the plan `topics plan` shows and `topics apply` follows, the ACLs the service needs and the
start-up check of a long-running process (contract §11): the pure parts, without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest
import structlog

from service.adapters.topics import Found, declared
from service.cli.environment import reads
from service.config import Settings
from service.errors import TokenUnavailable
from service.orders.settings import OrderSettings
from service.policy.topics import (
    CONSUMED,
    PUBLISHED,
    AclBinding,
    Action,
    Observed,
    Role,
    apply_steps,
    check_principal,
    copies_retention,
    kafka_acls_commands,
    named,
    not_ready_line,
    plan_topics,
    service_acls,
)
from service.worker.topics_check import TopicsCheck

DAY_MS = 86_400_000


def _settings(**values: object) -> Settings:
    """Settings of the source topic `shop`, the default tiers 30s and 5m, and `values`."""
    return OrderSettings(**({"source_topic": "shop", "retry_tiers": "30s,5m"} | values))  # type: ignore[arg-type]


def _seen(partitions: int = 3, replication: int = 1, **configs: str) -> Observed:
    return Observed(partitions, replication, configs, configs)


def _as_declared(settings: Settings, partitions: int = 3) -> dict[str, Observed]:
    """Every declared topic as the broker would have it after `apply`."""
    return {spec.name: _seen(partitions, 1, **dict(spec.configs)) for spec in declared(settings)}


def test_the_declared_topics_are_the_contract_topics_in_order_with_their_configs() -> None:
    # Given the default settings (tiers 30s and 5m, horizon 15m, dedup window 7d) for the source topic `shop`
    settings = _settings()

    # When the declared topics are derived
    specs = declared(settings)

    # Then they are the topics of contract §4, the source without configs of its own
    copies = (("cleanup.policy", "delete"), ("retention.ms", str(8 * DAY_MS)))
    week = (("cleanup.policy", "delete"), ("retention.ms", str(7 * DAY_MS)))
    assert [(spec.name, spec.role, spec.configs) for spec in specs] == [
        ("shop", Role.SOURCE, ()),
        ("shop.retry.30s", Role.RETRY, copies),
        ("shop.retry.5m", Role.RETRY, copies),
        ("shop.quarantine", Role.QUARANTINE, (("cleanup.policy", "delete"), ("retention.ms", str(30 * DAY_MS)))),
        ("shop.reprocess", Role.REPROCESS, copies),
        ("shop.rejected", Role.REJECTED, week),
        ("shop.events", Role.EVENTS, week),
    ]


def test_without_tiers_no_retry_topic_is_declared() -> None:
    specs = declared(_settings(retry_tiers=""))

    assert [spec.name for spec in specs] == [
        "shop",
        "shop.quarantine",
        "shop.reprocess",
        "shop.rejected",
        "shop.events",
    ]


@pytest.mark.parametrize(
    ("horizon", "window", "kept"),
    [
        (timedelta(minutes=15), timedelta(days=7), timedelta(days=8)),  # the defaults: a week and a quarter hour
        (timedelta(hours=24), timedelta(days=7), timedelta(days=8)),  # rocketmq's horizon
        (timedelta(minutes=15), timedelta(hours=1), timedelta(days=7)),  # never less than a week
        (timedelta(days=2), timedelta(days=7), timedelta(days=9)),
    ],
)
def test_copies_outlive_the_dedup_window_and_the_retry_horizon(
    horizon: timedelta, window: timedelta, kept: timedelta
) -> None:
    assert copies_retention(horizon, window) == kept
    assert copies_retention(horizon, window) >= horizon + window


def test_consume_reads_the_source_the_tiers_and_reprocess_and_the_relay_writes_every_derived_topic() -> None:
    specs = declared(_settings(retry_tiers="1s"))

    assert named(specs, CONSUMED) == ("shop", "shop.retry.1s", "shop.reprocess")
    assert named(specs, PUBLISHED) == (
        "shop.retry.1s",
        "shop.quarantine",
        "shop.reprocess",
        "shop.rejected",
        "shop.events",
    )


def test_on_an_empty_broker_everything_is_created_the_source_only_with_create_source() -> None:
    # Given a broker without any of the topics, and no partition or replication setting
    plan = plan_topics(declared(_settings()), {}, partitions=None, replication_factor=None)

    # Then every topic is missing, is created with 6 partitions at the broker's replication factor
    assert not plan.as_declared
    assert plan.missing == tuple(spec.name for spec in declared(_settings()))
    assert {(topic.action, topic.partitions, topic.replication_factor) for topic in plan.topics} == {
        (Action.CREATE, 6, None)
    }
    # And only the source needs a flag
    assert [(topic.spec.name, topic.flag) for topic in plan.topics if topic.flag] == [("shop", "--create-source")]


def test_derived_topics_take_the_source_topics_partition_count_unless_the_setting_says() -> None:
    # Given a broker that has only the source topic, with 12 partitions
    observed = {"shop": _seen(12)}
    specs = declared(_settings())

    # When the plan is made without, then with ORDERS_TOPIC_PARTITIONS
    by_source = plan_topics(specs, observed, partitions=None, replication_factor=None)
    by_setting = plan_topics(specs, observed, partitions=4, replication_factor=3)

    # Then the derived topics get the source's count, or the setting's; the source is never to be changed
    assert {topic.partitions for topic in by_source.topics} == {12}
    assert [(t.spec.name, t.action) for t in by_source.topics if t.action is not Action.CREATE] == [
        ("shop", Action.NONE)
    ]
    assert {topic.partitions for topic in by_setting.topics if topic.spec.role is not Role.SOURCE} == {4}
    assert {topic.replication_factor for topic in by_setting.topics} == {3}
    assert by_setting.topics[0].notes == (
        "has 12 partitions, declared 4: apply never changes a partition count",
        "has replication factor 1, declared 3: apply never changes it (a partition reassignment does)",
    )
    assert by_setting.topics[0].action is Action.NONE


def test_topics_as_declared_need_nothing() -> None:
    settings = _settings()

    plan = plan_topics(declared(settings), _as_declared(settings), partitions=None, replication_factor=None)

    assert plan.as_declared
    assert {topic.action for topic in plan.topics} == {Action.NONE}
    assert apply_steps(plan, alter=True, create_source=True) == apply_steps(plan, alter=False, create_source=False)
    assert not apply_steps(plan, alter=True, create_source=True).creates


def test_a_topic_with_other_configs_drifts_and_is_altered_only_with_alter_keeping_its_own_overrides() -> None:
    # Given a quarantine topic kept one day, with a size limit the platform team set on it
    settings = _settings()
    observed = _as_declared(settings)
    observed["shop.quarantine"] = Observed(
        3,
        1,
        {"cleanup.policy": "delete", "retention.ms": str(DAY_MS), "max.message.bytes": "2000000"},
        {"retention.ms": str(DAY_MS), "max.message.bytes": "2000000"},
    )

    # When the plan is made
    plan = plan_topics(declared(settings), observed, partitions=None, replication_factor=None)

    # Then it drifts, and apply changes it only with --alter
    assert plan.drifted == ("shop.quarantine",)
    assert not plan.as_declared
    (quarantine,) = [topic for topic in plan.topics if topic.action is not Action.NONE]
    assert (quarantine.action, quarantine.flag) == (Action.ALTER, "--alter")
    assert [(c.name, c.current, c.declared) for c in quarantine.changed_configs] == [
        ("retention.ms", str(DAY_MS), str(30 * DAY_MS))
    ]
    without = apply_steps(plan, alter=False, create_source=False)
    assert (without.alters, [topic.spec.name for topic in without.left]) == ((), ["shop.quarantine"])
    # And altering repeats the topic's own overrides (AlterConfigs replaces them all) under the declared values
    (change,) = apply_steps(plan, alter=True, create_source=False).alters
    assert change.configs == (
        ("cleanup.policy", "delete"),
        ("max.message.bytes", "2000000"),
        ("retention.ms", str(30 * DAY_MS)),
    )


def test_more_partitions_than_declared_is_a_note_never_an_action() -> None:
    settings = _settings(topic_partitions=2)
    observed = _as_declared(settings, partitions=2)
    observed["shop.retry.30s"] = _seen(8, 1, **dict(declared(settings)[1].configs))

    plan = plan_topics(declared(settings), observed, partitions=2, replication_factor=None)
    steps = apply_steps(plan, alter=True, create_source=True)

    assert plan.as_declared
    assert (steps.creates, steps.alters, steps.left) == ((), (), ())
    assert [topic.notes for topic in plan.topics if topic.notes] == [
        ("has 8 partitions, declared 2: apply never changes a partition count",)
    ]


def test_apply_creates_the_missing_topics_and_the_source_only_when_asked() -> None:
    settings = _settings(retry_tiers="")
    observed = _as_declared(settings)
    del observed["shop"]
    del observed["shop.events"]
    plan = plan_topics(declared(settings), observed, partitions=None, replication_factor=None)

    plain = apply_steps(plan, alter=False, create_source=False)
    with_source = apply_steps(plan, alter=False, create_source=True)

    assert [create.name for create in plain.creates] == ["shop.events"]
    assert [topic.spec.name for topic in plain.left] == ["shop"]
    assert [(c.name, c.partitions, c.replication_factor) for c in with_source.creates] == [
        ("shop", 6, None),
        ("shop.events", 6, None),
    ]
    assert with_source.left == ()


PRINCIPAL = "User:svc"


def test_the_acls_are_exactly_the_contracts_bindings() -> None:
    bindings = service_acls(PRINCIPAL, "shop", "order-service")

    assert [(b.operation, b.resource_type, b.pattern_type, b.resource_name) for b in bindings] == [
        ("READ", "TOPIC", "LITERAL", "shop"),
        ("WRITE", "TOPIC", "LITERAL", "shop"),
        ("DESCRIBE", "TOPIC", "LITERAL", "shop"),
        ("DESCRIBE_CONFIGS", "TOPIC", "LITERAL", "shop"),
        ("READ", "TOPIC", "PREFIXED", "shop."),
        ("WRITE", "TOPIC", "PREFIXED", "shop."),
        ("DESCRIBE", "TOPIC", "PREFIXED", "shop."),
        ("DESCRIBE_CONFIGS", "TOPIC", "PREFIXED", "shop."),
        ("READ", "GROUP", "LITERAL", "order-service"),
        ("DESCRIBE", "GROUP", "LITERAL", "order-service"),
    ]
    assert {(b.principal, b.permission, b.host) for b in bindings} == {(PRINCIPAL, "ALLOW", "*")}
    assert not [b for b in bindings if b.resource_type == "CLUSTER" or b.operation == "CREATE"]


def test_the_kafka_acls_commands_grant_each_pattern_once() -> None:
    commands = kafka_acls_commands(service_acls(PRINCIPAL, "shop", "order-service"), "kafka:9092")

    common = "kafka-acls.sh --bootstrap-server kafka:9092 --command-config admin.properties --add"
    common += " --allow-principal User:svc --allow-host '*'"
    topic_operations = "--operation Read --operation Write --operation Describe --operation DescribeConfigs"
    assert commands == (
        f"{common} {topic_operations} --topic shop --resource-pattern-type literal",
        f"{common} {topic_operations} --topic shop. --resource-pattern-type prefixed",
        f"{common} --operation Read --operation Describe --group order-service --resource-pattern-type literal",
    )


def test_a_binding_is_an_allow_from_any_host() -> None:
    assert AclBinding("User:a", "READ", "TOPIC", "t", "LITERAL") == AclBinding(
        "User:a", "READ", "TOPIC", "t", "LITERAL", "ALLOW", "*"
    )


@pytest.mark.parametrize("principal", ["User:svc", "User:CN=svc.example.com", "Group:ops"])
def test_a_principal_is_type_colon_name(principal: str) -> None:
    assert check_principal(principal) == principal


@pytest.mark.parametrize("principal", ["svc", "User:", ":svc", "User:a b", ""])
def test_anything_else_is_not_a_principal(principal: str) -> None:
    with pytest.raises(ValueError, match="Type:name"):
        check_principal(principal)


def test_the_not_ready_line_names_the_topics_and_what_to_run() -> None:
    assert (
        not_ready_line(["shop.retry.30s"], [], source="shop", program="order-service")
        == "topic shop.retry.30s does not exist: run `order-service topics apply`"
    )
    assert (
        not_ready_line(["shop", "shop.events"], [], source="shop", program="order-service")
        == "topics shop, shop.events do not exist: its producers create shop, or "
        "`order-service topics apply --create-source`"
    )
    assert (
        not_ready_line([], ["shop.events"], source="shop", program="order-service")
        == "not authorized: DESCRIBE on topic shop.events: grant the ACLs `order-service topics acls` prints"
    )


def test_the_topics_commands_read_no_database() -> None:
    assert "ORDERS_DATABASE_URL" not in reads("topics plan", OrderSettings)
    assert "ORDERS_DATABASE_URL" not in reads("topics", OrderSettings)
    assert {"ORDERS_TOPIC_PARTITIONS", "ORDERS_TOPIC_REPLICATION_FACTOR", "ORDERS_DEDUP_WINDOW"} <= set(
        reads("topics apply", OrderSettings)
    )
    assert "ORDERS_CONSUMER_NAME" in reads("topics acls", OrderSettings)
    assert "ORDERS_DATABASE_URL" in reads("consume", OrderSettings)
    assert "ORDERS_DATABASE_URL" in reads("status", OrderSettings)  # the heartbeats are rows


class _Broker:
    """Answers the start-up check's looks from a script: missing topics first, then none."""

    def __init__(self, answers: Sequence[Found]) -> None:
        self.answers = list(answers)
        self.looks = 0

    async def look(self, names: Sequence[str]) -> Found:
        self.looks += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


async def _no_sleep(stop: asyncio.Event, seconds: float) -> None:
    await asyncio.sleep(0)


async def test_a_process_is_not_ready_while_its_topics_are_missing_and_says_so_once_per_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a broker that lacks a tier topic for two looks, then has it
    missing = Found(("shop.retry.1s",), ())
    broker = _Broker([missing, missing, Found((), ())])
    check = TopicsCheck(broker.look, source="shop", program="order-service", names=OrderSettings)
    stop = asyncio.Event()
    # (the backoff's steps are logged, not waited: a unit test does not sleep)
    monkeypatch.setattr("service.worker.topics_check.sleep_unless_stopped", _no_sleep)

    # When the process waits for its topics
    with structlog.testing.capture_logs() as logs:
        waiting = asyncio.create_task(check.wait(["shop", "shop.retry.1s"], stop))
        await asyncio.sleep(0)
        ready_while_missing = check.ready
        found = await asyncio.wait_for(waiting, timeout=10)

    # Then it was not ready meanwhile, said so once per look with the topic and the command, and is ready now
    assert ready_while_missing is False
    assert found is True
    assert check.ready is True
    said = [line for line in logs if line["event"] == "topics_missing"]
    assert [(line["missing"], line["retry_in_seconds"]) for line in said] == [
        (["shop.retry.1s"], 1.0),
        (["shop.retry.1s"], 2.0),
    ]
    assert all("order-service topics apply" in line["fix"] for line in said)
    assert broker.looks == 3


class _RefusingTokens:
    """A broker reached through a token endpoint that refuses the client's credentials, then gives a token."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.looks = 0

    async def look(self, names: Sequence[str]) -> Found:
        self.looks += 1
        if self.looks <= self.refusals:
            raise TokenUnavailable("the OAuth token endpoint refused the client credentials (HTTP 401)")
        return Found((), ())


async def test_a_token_endpoint_that_refuses_is_an_outage_waited_out_never_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given an OAUTHBEARER broker whose token endpoint refuses twice (a wrong secret, fixed by its rotation)
    broker = _RefusingTokens(2)
    check = TopicsCheck(broker.look, source="shop", program="order-service", names=OrderSettings)
    monkeypatch.setattr("service.worker.topics_check.sleep_unless_stopped", _no_sleep)

    # When the process checks its topics
    with structlog.testing.capture_logs() as logs:
        waiting = asyncio.create_task(check.wait(["shop"], asyncio.Event()))
        await asyncio.sleep(0)
        problem_while_refused, ready_while_refused = check.problem, check.ready
        found = await asyncio.wait_for(waiting, timeout=10)

    # Then it waited, not ready, saying why once per step in the line a short command exits with, and went on
    assert (ready_while_refused, found, check.ready, check.problem) == (False, True, True, None)
    said = [line for line in logs if line["event"] == "kafka_unavailable"]
    assert [line["retry_in_seconds"] for line in said] == [1.0, 2.0]
    assert problem_while_refused == said[0]["reason"]
    assert said[0]["reason"].startswith("the OAuth token endpoint refused the client credentials (HTTP 401) (")
    assert "ORDERS_KAFKA_OAUTH_TOKEN_URL" in said[0]["reason"]


async def test_a_stopped_process_stops_waiting_for_its_topics() -> None:
    broker = _Broker([Found(("shop",), ())])
    check = TopicsCheck(broker.look, source="shop", program="order-service", names=OrderSettings)
    stop = asyncio.Event()

    waiting = asyncio.create_task(check.wait(["shop"], stop))
    await asyncio.sleep(0)
    stop.set()

    assert await asyncio.wait_for(waiting, timeout=5) is False
    assert check.ready is False


async def test_a_process_that_needs_no_topic_is_ready_at_once() -> None:
    broker = _Broker([Found(("shop",), ())])
    check = TopicsCheck(broker.look, source="shop", program="order-service", names=OrderSettings)

    assert await check.wait([], asyncio.Event()) is True
    assert check.ready is True
    assert broker.looks == 0

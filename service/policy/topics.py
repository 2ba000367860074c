"""The topics the service declares (contract §4, §11), what `topics apply` would change on a broker that has some of
them, and the ACLs the service's own principal needs. Pure values: the broker's side is service/adapters/topics.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Protocol

# The partitions of a topic `apply` creates when neither ORDERS_TOPIC_PARTITIONS nor the source topic says.
DEFAULT_PARTITIONS = 6
# Retry tier and reprocess copies are records on their way: one deleted before the consumer read it never reaches a
# terminal state. They are kept for the dedup window (the outage an operator plans to survive: README, Dedup window)
# plus the retry horizon, in whole days, and at least a week (Kafka's own default, so never less than a default).
COPIES_MIN_RETENTION = timedelta(days=7)
# The quarantine topic is the record of failures other teams alert and report on; the bytes stay in PostgreSQL.
QUARANTINE_RETENTION = timedelta(days=30)
# Rejections and domain events are read by other teams: a week (a reader down over a long weekend catches up), said
# explicitly because managed clusters' defaults vary (Event Hubs keeps a day).
EVENTS_RETENTION = timedelta(days=7)
_DAY = timedelta(days=1)


class Role(StrEnum):
    """What a topic is to the service (contract §4)."""

    SOURCE = "source"
    RETRY = "retry"
    QUARANTINE = "quarantine"
    REPROCESS = "reprocess"
    REJECTED = "rejected"
    EVENTS = "events"


# What `consume` reads and what the relay writes (everything else reaches Kafka through the outbox, by the relay).
CONSUMED = frozenset({Role.SOURCE, Role.RETRY, Role.REPROCESS})
PUBLISHED = frozenset({Role.RETRY, Role.REPROCESS, Role.QUARANTINE, Role.REJECTED, Role.EVENTS})


class TopicNames(Protocol):
    """The topic names derived from the source topic (service.config.Topics)."""

    source: str
    quarantine: str
    reprocess: str
    rejected: str
    events: str

    def retry(self, delay_label: str) -> str:
        """The retry tier topic of one delay."""
        ...


@dataclass(frozen=True)
class TopicSpec:
    """One declared topic: its name, its role and the configs the service sets on it (name → value, sorted)."""

    name: str
    role: Role
    configs: tuple[tuple[str, str], ...] = ()


def copies_retention(horizon: timedelta, dedup_window: timedelta) -> timedelta:
    """How long the retry tier and reprocess topics keep a copy: the dedup window plus the retry horizon, rounded up
    to whole days, at least COPIES_MIN_RETENTION."""
    days = math.ceil((dedup_window + horizon) / _DAY)
    return max(COPIES_MIN_RETENTION, days * _DAY)


def _deleted_after(kept: timedelta) -> tuple[tuple[str, str], ...]:
    """Configs of a topic whose records are deleted after `kept`. `delete`, never `compact`: the service keys records
    by the ordering key, and compaction would keep only a key's last copy, envelope or event."""
    return (("cleanup.policy", "delete"), ("retention.ms", str(int(kept.total_seconds() * 1000))))


def declared_topics(
    names: TopicNames, tier_labels: Iterable[str], *, horizon: timedelta, dedup_window: timedelta
) -> tuple[TopicSpec, ...]:
    """Every topic of contract §4, in its order, with the configs the service declares. The source topic has none:
    its producers own it."""
    copies = _deleted_after(copies_retention(horizon, dedup_window))
    return (
        TopicSpec(names.source, Role.SOURCE),
        *(TopicSpec(names.retry(label), Role.RETRY, copies) for label in tier_labels),
        TopicSpec(names.quarantine, Role.QUARANTINE, _deleted_after(QUARANTINE_RETENTION)),
        TopicSpec(names.reprocess, Role.REPROCESS, copies),
        TopicSpec(names.rejected, Role.REJECTED, _deleted_after(EVENTS_RETENTION)),
        TopicSpec(names.events, Role.EVENTS, _deleted_after(EVENTS_RETENTION)),
    )


def named(specs: Iterable[TopicSpec], roles: Collection[Role]) -> tuple[str, ...]:
    """The names of the declared topics in these roles, in declared order."""
    return tuple(spec.name for spec in specs if spec.role in roles)


@dataclass(frozen=True)
class Observed:
    """A topic as the broker has it: partitions, replication factor, every config's value, and the configs set on the
    topic itself (`overrides`: AlterConfigs replaces all of them at once, so an alteration must repeat them)."""

    partitions: int
    replication_factor: int
    configs: Mapping[str, str | None]
    overrides: Mapping[str, str | None]


class Action(StrEnum):
    """What `topics apply` does to one topic."""

    NONE = "none"
    CREATE = "create"
    ALTER = "alter"


@dataclass(frozen=True)
class ConfigState:
    """One declared config of a topic: its value on the broker (None: no topic yet) and the declared one."""

    name: str
    current: str | None
    declared: str

    @property
    def differs(self) -> bool:
        """Whether the topic exists with another value."""
        return self.current is not None and self.current != self.declared


@dataclass(frozen=True)
class TopicPlan:
    """One topic: what exists, what is declared, and what `apply` does (`flag`: the apply flag it needs for that)."""

    spec: TopicSpec
    observed: Observed | None
    partitions: int
    replication_factor: int | None  # None: the broker's default
    configs: tuple[ConfigState, ...]
    action: Action
    flag: str | None
    notes: tuple[str, ...]

    @property
    def exists(self) -> bool:
        """Whether the broker has the topic."""
        return self.observed is not None

    @property
    def changed_configs(self) -> tuple[ConfigState, ...]:
        """The declared configs the existing topic has other values of."""
        return tuple(config for config in self.configs if config.differs)


@dataclass(frozen=True)
class Plan:
    """Every declared topic's plan, in declared order."""

    topics: tuple[TopicPlan, ...]

    @property
    def missing(self) -> tuple[str, ...]:
        """Topics the broker does not have."""
        return tuple(topic.spec.name for topic in self.topics if not topic.exists)

    @property
    def drifted(self) -> tuple[str, ...]:
        """Existing topics with a declared config of another value."""
        return tuple(topic.spec.name for topic in self.topics if topic.changed_configs)

    @property
    def as_declared(self) -> bool:
        """Nothing missing and no declared config different: `topics plan --check` passes."""
        return not self.missing and not self.drifted


def plan_topics(
    specs: Sequence[TopicSpec],
    observed: Mapping[str, Observed],
    *,
    partitions: int | None,
    replication_factor: int | None,
) -> Plan:
    """Compare the declared topics with what the broker has (`observed`, by name). A topic is created with
    `partitions`, else the source topic's count, else DEFAULT_PARTITIONS; with `replication_factor`, else the broker's
    default. An existing topic's partitions and replication factor are never changed: a difference is a note."""
    source = next((observed.get(spec.name) for spec in specs if spec.role is Role.SOURCE), None)
    wanted = partitions or (source.partitions if source is not None else DEFAULT_PARTITIONS)
    plans = []
    for spec in specs:
        seen = observed.get(spec.name)
        current = seen.configs if seen is not None else {}
        configs = tuple(ConfigState(name, current.get(name), value) for name, value in spec.configs)
        plans.append(_topic_plan(spec, seen, wanted, replication_factor, configs))
    return Plan(tuple(plans))


def _topic_plan(
    spec: TopicSpec,
    seen: Observed | None,
    partitions: int,
    replication_factor: int | None,
    configs: tuple[ConfigState, ...],
) -> TopicPlan:
    if seen is None:
        # The producers own the source topic: apply creates it only when asked to.
        flag = "--create-source" if spec.role is Role.SOURCE else None
        return TopicPlan(spec, None, partitions, replication_factor, configs, Action.CREATE, flag, ())
    notes = []
    if seen.partitions != partitions:
        # Never changed: fewer would lose records, more would move keys to other partitions under a running consumer
        # (per-key order breaks for the records in flight).
        notes.append(f"has {seen.partitions} partitions, declared {partitions}: apply never changes a partition count")
    if replication_factor is not None and seen.replication_factor != replication_factor:
        notes.append(
            f"has replication factor {seen.replication_factor}, declared {replication_factor}: "
            "apply never changes it (a partition reassignment does)"
        )
    changed = any(config.differs for config in configs)
    action, flag = (Action.ALTER, "--alter") if changed else (Action.NONE, None)
    return TopicPlan(spec, seen, partitions, replication_factor, configs, action, flag, tuple(notes))


@dataclass(frozen=True)
class Create:
    """A topic to create: CreateTopics with a replication factor of -1 asks for the broker's default (Kafka 2.4+)."""

    name: str
    partitions: int
    replication_factor: int | None
    configs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Alter:
    """An existing topic's configs to set: every config set on the topic itself, with the declared values over them
    (AlterConfigs replaces the topic's whole set); `changes` are the declared ones that differ."""

    name: str
    configs: tuple[tuple[str, str | None], ...]
    changes: tuple[ConfigState, ...]


@dataclass(frozen=True)
class Steps:
    """What one `topics apply` does with its flags, and the plans of the topics it leaves as they are on purpose
    (the source topic without --create-source, configs without --alter)."""

    creates: tuple[Create, ...]
    alters: tuple[Alter, ...]
    left: tuple[TopicPlan, ...]


def apply_steps(plan: Plan, *, alter: bool, create_source: bool) -> Steps:
    """The creations and alterations `apply` makes. It never deletes a topic and never changes a partition count or a
    replication factor; it creates the source topic only with `create_source` and alters configs only with `alter`."""
    creates, alters, left = [], [], []
    allowed = {"--create-source": create_source, "--alter": alter, None: True}
    for topic in plan.topics:
        if topic.action is Action.NONE:
            continue
        if not allowed[topic.flag]:
            left.append(topic)
        elif topic.action is Action.CREATE:
            creates.append(
                Create(topic.spec.name, topic.partitions, topic.replication_factor, topic.spec.configs),
            )
        else:
            assert topic.observed is not None
            configs = dict(topic.observed.overrides) | dict(topic.spec.configs)
            alters.append(Alter(topic.spec.name, tuple(sorted(configs.items())), topic.changed_configs))
    return Steps(tuple(creates), tuple(alters), tuple(left))


def not_ready_line(missing: Sequence[str], not_authorized: Sequence[str], *, source: str, program: str) -> str:
    """The one line a process says while topics it needs are missing or may not be described (contract §11)."""
    parts = []
    if missing:
        listed = ", ".join(missing)
        parts.append(f"topic {listed} does not exist" if len(missing) == 1 else f"topics {listed} do not exist")
    if not_authorized:
        parts.append("not authorized: " + ", ".join(f"DESCRIBE on topic {name}" for name in not_authorized))
    if missing and source in missing:
        fix = f"its producers create {source}, or `{program} topics apply --create-source`"
    elif missing:
        fix = f"run `{program} topics apply`"
    else:
        fix = f"grant the ACLs `{program} topics acls` prints"
    return "; ".join(parts) + f": {fix}"


# ACLs (contract §11, "Least privilege"): Kafka's names for operations, resource and pattern types.
TOPIC_OPERATIONS = ("READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
GROUP_OPERATIONS = ("READ", "DESCRIBE")
_PRINCIPAL = re.compile(r"[A-Za-z][A-Za-z0-9]*:[^\s,]+")


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW binding for the service's principal, from any host."""

    principal: str
    operation: str
    resource_type: str
    resource_name: str
    pattern_type: str
    permission: str = "ALLOW"
    host: str = "*"


def check_principal(principal: str) -> str:
    """A Kafka principal, `Type:name` (`User:my-service`); ValueError otherwise."""
    if not _PRINCIPAL.fullmatch(principal):
        raise ValueError("a principal is Type:name, e.g. User:svc")
    return principal


def service_acls(principal: str, source: str, group: str) -> tuple[AclBinding, ...]:
    """Exactly the bindings the service's principal needs (contract §11): on the source topic (LITERAL) and on the
    topics prefixed `<source>.` (PREFIXED) READ, WRITE, DESCRIBE and DESCRIBE_CONFIGS; on its one consumer group (the
    consumer name: the only group id it uses, LITERAL) READ and DESCRIBE. Nothing on the cluster, no CREATE."""
    patterns: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
        ("TOPIC", source, "LITERAL", TOPIC_OPERATIONS),
        ("TOPIC", f"{source}.", "PREFIXED", TOPIC_OPERATIONS),
        ("GROUP", group, "LITERAL", GROUP_OPERATIONS),
    )
    return tuple(
        AclBinding(principal, operation, kind, name, pattern)
        for kind, name, pattern, operations in patterns
        for operation in operations
    )


def kafka_acls_commands(bindings: Sequence[AclBinding], bootstrap_servers: str) -> tuple[str, ...]:
    """The `kafka-acls.sh --add` commands that grant `bindings`: one per principal and resource pattern."""
    grouped: dict[tuple[str, str, str, str, str], list[str]] = {}
    for binding in bindings:
        key = (binding.principal, binding.host, binding.resource_type, binding.resource_name, binding.pattern_type)
        grouped.setdefault(key, []).append(binding.operation)
    commands = []
    for (principal, host, kind, name, pattern), operations in grouped.items():
        words = [
            "kafka-acls.sh",
            f"--bootstrap-server {bootstrap_servers}",
            "--command-config admin.properties",
            "--add",
            f"--allow-principal {_quoted(principal)}",
            f"--allow-host {_quoted(host)}",
            *(f"--operation {_camel(operation)}" for operation in operations),
            f"--{kind.lower()} {_quoted(name)}",
            f"--resource-pattern-type {pattern.lower()}",
        ]
        commands.append(" ".join(words))
    return tuple(commands)


def _camel(operation: str) -> str:
    """kafka-acls.sh's spelling of an operation: DESCRIBE_CONFIGS → DescribeConfigs."""
    return "".join(word.capitalize() for word in operation.split("_"))


def _quoted(word: str) -> str:
    """A word a POSIX shell takes as it is (`*` and names with shell characters quoted)."""
    return word if re.fullmatch(r"[A-Za-z0-9_.:@%+=/-]+", word) else "'" + word.replace("'", "'\\''") + "'"

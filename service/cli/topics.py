"""`<program> topics plan / apply / acls`: the declared topics and the ACLs the service needs (contract §11)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta
from typing import Annotated, Any

import typer

from service.adapters import topics
from service.cli.common import JsonFlag, configured, domain, print_json, run_async, show_rows
from service.config import Settings
from service.durations import format_duration
from service.policy.topics import (
    Action,
    Plan,
    Role,
    Steps,
    TopicPlan,
    apply_steps,
    check_principal,
    kafka_acls_commands,
    plan_topics,
    service_acls,
)

app = typer.Typer(
    help="The topics the service declares (contract §4) and the ACLs it needs; `apply` runs as a privileged principal.",
    no_args_is_help=True,
)


async def _plan(settings: Settings) -> Plan:
    """The declared topics against what the broker has."""
    specs = topics.declared(settings)
    observed = await topics.observe(settings, specs)
    return plan_topics(
        specs,
        observed,
        partitions=settings.topic_partitions,
        replication_factor=settings.topic_replication_factor,
    )


@app.command("plan")
def topics_plan(
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when a topic is missing or a declared config differs.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """For every topic of contract §4: what exists (partitions, replication factor, the declared configs) and what
    `topics apply` would create or change. Changes nothing."""
    settings = configured()
    plan = run_async(lambda _: _plan(settings))
    if as_json:
        print_json(_plan_document(plan))
    else:
        show_rows(
            ("topic", "role", "partitions", "replication factor", "configs", "apply"),
            [_plan_row(topic) for topic in plan.topics],
        )
        for topic in plan.topics:
            for note in topic.notes:
                typer.echo(f"note: {topic.spec.name} {note}")
        typer.echo(_summary(plan))
    if check and not plan.as_declared:
        raise typer.Exit(1)


def _plan_row(topic: TopicPlan) -> tuple[str, ...]:
    seen = topic.observed
    declared_rf = str(topic.replication_factor) if topic.replication_factor else "broker default"
    if seen is None:
        partitions, replication = f"- (creates {topic.partitions})", f"- (creates {declared_rf})"
    else:
        partitions = str(seen.partitions)
        if seen.partitions != topic.partitions:
            partitions += f" (declared {topic.partitions})"
        replication = str(seen.replication_factor)
        if topic.replication_factor and topic.replication_factor != seen.replication_factor:
            replication += f" (declared {topic.replication_factor})"
    configs = " ".join(_config(config.name, config.current, config.declared, seen is None) for config in topic.configs)
    if topic.spec.role is Role.SOURCE:
        configs = "its producers'"
    return topic.spec.name, topic.spec.role.value, partitions, replication, configs, _doing(topic)


def _config(name: str, current: str | None, declared: str, missing: bool) -> str:
    if missing or current == declared:
        return f"{name}={_readable(name, declared)}"
    return f"{name}={_readable(name, current)} (declared {_readable(name, declared)})"


def _readable(name: str, value: str | None) -> str:
    """A config's value, a duration in milliseconds also as the contract writes durations: 691200000 (8d)."""
    if value is None:
        return "(hidden)"
    if name.endswith(".ms") and value.isdigit() and int(value) > 0:
        return f"{value} ({format_duration(timedelta(milliseconds=int(value)))})"
    return value


def _doing(topic: TopicPlan) -> str:
    if topic.action is Action.NONE:
        return "nothing"
    changed = ", ".join(config.name for config in topic.changed_configs)
    what = "create" if topic.action is Action.CREATE else f"alter {changed}"
    return f"{what} (with {topic.flag})" if topic.flag else what


def _summary(plan: Plan) -> str:
    if plan.as_declared:
        return "every declared topic exists as declared"
    parts = []
    if plan.missing:
        parts.append(f"missing: {', '.join(plan.missing)}")
    if plan.drifted:
        parts.append(f"other configs: {', '.join(plan.drifted)}")
    flags = sorted({topic.flag for topic in plan.topics if topic.flag})
    command = " ".join([f"`{domain().program} topics apply", *flags]) + "`"
    return "; ".join(parts) + f": {command} changes that"


def _plan_document(plan: Plan) -> dict[str, Any]:
    """`topics plan --json` (snake_case keys, contract §10; Kafka's config names are values, never keys)."""
    return {
        "topics": [
            {
                "topic": topic.spec.name,
                "role": topic.spec.role.value,
                "exists": topic.exists,
                "partitions": topic.observed.partitions if topic.observed else None,
                "replication_factor": topic.observed.replication_factor if topic.observed else None,
                "declared_partitions": topic.partitions,
                "declared_replication_factor": topic.replication_factor,
                "configs": [asdict(config) for config in topic.configs],
                "action": topic.action.value,
                "apply_flag": topic.flag,
                "notes": list(topic.notes),
            }
            for topic in plan.topics
        ],
        "missing": list(plan.missing),
        "drifted": list(plan.drifted),
        "as_declared": plan.as_declared,
    }


@app.command("apply")
def topics_apply(
    alter: Annotated[
        bool, typer.Option("--alter", help="Also set the declared configs of existing topics that differ.")
    ] = False,
    create_source: Annotated[
        bool, typer.Option("--create-source", help="Also create the source topic (its producers own it).")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would do; change nothing.")] = False,
) -> None:
    """Create the declared topics that are missing (partitions <PREFIX>TOPIC_PARTITIONS, else the source topic's,
    else 6; replication <PREFIX>TOPIC_REPLICATION_FACTOR, else the broker's default). Never deletes a topic or changes a
    partition count; changes an existing topic's configs only with --alter, creates the source only with
    --create-source. Needs CREATE (and ALTER_CONFIGS with --alter) on the topics: a privileged principal."""
    settings = configured()
    plan = run_async(lambda _: _plan(settings))
    steps = apply_steps(plan, alter=alter, create_source=create_source)
    failures: list[str] = []
    if dry_run:
        _say(steps, plan, ("would create", "would alter"))
    else:
        outcomes = run_async(lambda _: _apply(settings, steps))
        failures = [outcome.failure for outcome in outcomes if outcome.failure]
        done = {outcome.name for outcome in outcomes if outcome.failure is None}
        _say(steps, plan, ("created", "altered"), done)
    for failure in failures:
        typer.echo(f"{domain().program} topics apply: {failure}", err=True)
    if failures:
        raise typer.Exit(1)


async def _apply(settings: Settings, steps: Steps) -> list[topics.Outcome]:
    return [*await topics.create(settings, steps.creates), *await topics.alter(settings, steps.alters)]


def _say(steps: Steps, plan: Plan, verbs: tuple[str, str], done: set[str] | None = None) -> None:
    """One line per topic apply changed (or would), per topic it leaves on purpose, and per note."""
    for create in steps.creates:
        if done is None or create.name in done:
            replication = create.replication_factor or "the broker's default"
            configs = "".join(f", {name}={value}" for name, value in create.configs)
            shape = f"{create.partitions} partitions, replication factor {replication}"
            typer.echo(f"{verbs[0]} {create.name}: {shape}{configs}")
    for change in steps.alters:
        if done is None or change.name in done:
            changed = ", ".join(f"{c.name} {c.current} -> {c.declared}" for c in change.changes)
            typer.echo(f"{verbs[1]} {change.name}: {changed}")
    for topic in steps.left:
        if topic.action is Action.CREATE:
            typer.echo(f"left {topic.spec.name}: it does not exist; its producers own it ({topic.flag} creates it)")
        else:
            changed = ", ".join(f"{c.name} is {c.current}, declared {c.declared}" for c in topic.changed_configs)
            typer.echo(f"left {topic.spec.name}: {changed} ({topic.flag} changes it)")
    for topic in plan.topics:
        for note in topic.notes:
            typer.echo(f"note: {topic.spec.name} {note}")
    if not steps.creates and not steps.alters and not steps.left:
        typer.echo("every declared topic exists as declared; nothing to do")


@app.command("acls")
def topics_acls(
    principal: Annotated[
        str, typer.Option("--principal", help="The service's Kafka principal, Type:name (User:<program>).")
    ],
    kafka_acls: Annotated[
        bool, typer.Option("--kafka-acls", help="Print the kafka-acls.sh commands that grant them instead.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """The ACL bindings the service's principal needs, exactly (contract §11): READ, WRITE, DESCRIBE and
    DESCRIBE_CONFIGS on the source topic (LITERAL) and on the topics prefixed `<source>.` (PREFIXED); READ and DESCRIBE
    on its consumer group (LITERAL). Nothing on the cluster, no CREATE. Asks no broker."""
    settings = configured()
    try:
        check_principal(principal)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--principal") from None
    bindings = service_acls(principal, settings.source_topic, settings.consumer_name)
    if as_json:
        print_json({"bindings": [asdict(binding) for binding in bindings]})
    elif kafka_acls:
        for command in kafka_acls_commands(bindings, settings.kafka_bootstrap_servers):
            typer.echo(command)
    else:
        show_rows(
            ("permission", "principal", "host", "operation", "resource type", "pattern type", "resource name"),
            [
                (b.permission, b.principal, b.host, b.operation, b.resource_type, b.pattern_type, b.resource_name)
                for b in bindings
            ],
        )

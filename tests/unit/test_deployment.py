"""docker-compose.yml cannot run here (no Docker engine): check statically that it, and the operator docs, name
only things that exist."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from service.adapters.topics import declared
from service.cli import app
from service.config import ENV_PREFIX
from service.metrics import Metrics
from service.orders.settings import OrderSettings as Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _cli_commands() -> set[str]:
    group = typer.main.get_command(app)
    return set(group.commands)  # type: ignore[attr-defined]


def _service_containers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in compose["services"].items() if spec.get("image") == "order-service:local"}


def _commands_of(spec: dict[str, Any]) -> set[str]:
    """The order-service commands a container runs: its command, or the ones its shell script calls."""
    if "entrypoint" not in spec:
        return {spec["command"][0]}
    return set(re.findall(r"order-service (\w+)", " ".join(spec["command"])))


def test_every_service_image_command_is_an_order_service_command(compose: dict[str, Any]) -> None:
    commands = _cli_commands()
    used = set().union(*(_commands_of(spec) for spec in _service_containers(compose).values()))
    assert used <= commands, used - commands
    assert {"migrate", "consume", "relay", "effects", "reconcile"} <= used


def test_the_reconciler_runs_on_a_schedule(compose: dict[str, Any]) -> None:
    reconciler = _service_containers(compose)["reconciler"]
    script = " ".join(reconciler["command"])
    assert "order-service reconcile" in script
    assert re.search(r"sleep \d+", script)


def test_every_orders_variable_is_a_setting(compose: dict[str, Any]) -> None:
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    named = set(re.findall(r"\bORDERS_[A-Z_]+\b", (ROOT / "docker-compose.yml").read_text()))
    assert named, "the compose file configures the service through ORDERS_* variables"
    assert named <= fields, named - fields


def test_the_compose_settings_are_valid_settings(compose: dict[str, Any]) -> None:
    environment = _service_containers(compose)["consume"]["environment"]
    values = {
        key.removeprefix(ENV_PREFIX).lower(): value
        for key, value in environment.items()
        if not str(value).startswith("${")
    }
    settings = Settings(**values)
    assert settings.kafka_bootstrap_servers == "kafka:9092"


def test_dependencies_name_existing_services_with_valid_conditions(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, spec in services.items():
        for dependency, condition in (spec.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert condition["condition"] in {
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            }
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


def test_long_running_services_have_healthchecks_and_run_after_migrate_and_topics_apply(
    compose: dict[str, Any],
) -> None:
    for name, spec in _service_containers(compose).items():
        if spec["command"] == ["migrate"]:
            assert spec["depends_on"]["postgres"]["condition"] == "service_healthy"
            continue
        if spec["command"][:2] == ["topics", "apply"]:
            assert spec["depends_on"]["kafka"]["condition"] == "service_healthy"
            continue
        assert spec["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert spec["depends_on"]["topics"]["condition"] == "service_completed_successfully", name
        if "entrypoint" in spec:
            continue  # the scheduled reconciler serves no HTTP
        assert "/readyz" in " ".join(spec["healthcheck"]["test"]), name
        assert spec["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def _local_kafka_version() -> str:
    """The Kafka version scripts/kafka-local runs by default (and its pom's default)."""
    script = (ROOT / "scripts" / "kafka-local").read_text()
    version = re.search(r"VERSION=\$\{KAFKA_LOCAL_VERSION:-([\d.]+)\}", script)
    pom = re.search(r"<kafka.version>([\d.]+)</kafka.version>", (ROOT / "scripts" / "kafka" / "pom.xml").read_text())
    assert version
    assert pom
    assert version.group(1) == pom.group(1), "scripts/kafka-local and scripts/kafka/pom.xml name other versions"
    return version.group(1)


def test_the_platform_is_postgres_16_and_the_local_kafka_4_in_kraft_mode(compose: dict[str, Any]) -> None:
    services = compose["services"]
    version = _local_kafka_version()
    assert version.startswith("4.")
    assert services["postgres"]["image"].startswith("postgres:16")
    assert services["kafka"]["image"] == f"apache/kafka:{version}"
    assert "controller" in services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"]
    assert "KAFKA_ZOOKEEPER_CONNECT" not in services["kafka"]["environment"]


def test_the_topics_are_created_by_topics_apply_from_the_image_and_are_the_contract_topics(
    compose: dict[str, Any],
) -> None:
    # Given the compose file's one-shot topic creation
    topics = compose["services"]["topics"]
    environment = {
        key.removeprefix(ENV_PREFIX).lower(): value
        for key, value in topics["environment"].items()
        if not str(value).startswith("${")
    }

    # Then it is `order-service topics apply`, creating the source topic too (no producer here owns it)
    assert topics["image"] == "order-service:local"
    assert topics["command"] == ["topics", "apply", "--create-source"]
    assert Settings(**environment).topic_partitions == 12
    # And the topics it declares, with the service's own settings, are the contract's
    created = {spec.name for spec in declared(Settings(**environment))}
    assert created == {
        "orders",
        "orders.retry.30s",
        "orders.retry.5m",
        "orders.reprocess",
        "orders.quarantine",
        "orders.rejected",
        "orders.events",
    }


def _stages(dockerfile: str) -> list[str]:
    """The Dockerfile's build stages, each from its FROM line to the next."""
    return ["FROM" + part for part in re.split(r"^FROM", dockerfile, flags=re.MULTILINE)[1:]]


def test_the_image_installs_the_built_wheel_with_hashed_pins_into_a_slim_non_root_stage() -> None:
    build, final = _stages((ROOT / "Dockerfile").read_text())

    assert "python -m build --wheel" in build
    assert "pip install --no-deps /dist/order_service-*.whl" in build
    assert "--require-hashes --no-deps -r requirements/runtime.txt" in build
    assert "pip install -e" not in build + final
    assert final.startswith("FROM python:3.11-slim\n")
    assert "COPY --from=build /opt/order-service /opt/order-service" in final
    assert not re.search(r"\b(gcc|build-essential|apt-get)\b", final), "the final stage installs no compilers"
    assert re.search(r"^USER 10001$", final, flags=re.MULTILINE)
    assert 'ENTRYPOINT ["order-service"]' in final
    for copied in re.findall(r"^COPY (?!--from)(.+) \S+$", build, flags=re.MULTILINE):
        for path in copied.split():
            assert (ROOT / path).exists(), path


def test_compose_migrates_with_the_image(compose: dict[str, Any]) -> None:
    migrate = compose["services"]["migrate"]
    assert migrate["image"] == "order-service:local"
    assert migrate["build"] == "."
    assert migrate["command"] == ["migrate"]


def _exposed_names() -> set[str]:
    """Every sample name the service's registry can expose (counters as *_total, histograms as *_bucket, ...)."""
    from service.metrics import Metrics

    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        names |= {family.name + suffix for suffix in ("_total", "_bucket", "_sum", "_count", "_created")}
    return names


def test_the_contract_metric_names_exist() -> None:
    assert {
        "orders_records_total",
        "orders_failures_total",
        "orders_quarantine_open",
        "orders_quarantine_oldest_age_seconds",
        "orders_outbox_pending",
        "orders_outbox_oldest_age_seconds",
        "orders_effects",
        "orders_consumer_lag",
    } <= _exposed_names()


def test_alerts_and_the_dashboard_use_only_metrics_the_service_exposes() -> None:
    text = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    text += (ROOT / "deploy/grafana/dashboards/order-service.json").read_text()
    used = set(re.findall(r"\borders_[a-z_]+", text))
    assert used, "alerts and dashboard query order-service metrics"
    assert used <= _exposed_names(), used - _exposed_names()


def test_every_alert_links_to_a_runbook_section_that_exists() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())["groups"][0]["rules"]
    runbook = (ROOT / "docs/runbook.md").read_text().lower()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip()).replace(" ", "-")
        for line in runbook.splitlines()
        if line.startswith("#")
    }
    assert len(rules) == 10
    for rule in rules:
        link = rule["annotations"]["runbook_url"]
        assert link.startswith("docs/runbook.md#"), rule["alert"]
        assert link.split("#", 1)[1] in anchors, link


def test_prometheus_and_grafana_are_provisioned_from_files_in_the_repository(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            assert (ROOT / volume.split(":")[0]).exists(), volume
    scrape = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = scrape["scrape_configs"][0]["static_configs"][0]["targets"]
    assert {target.split(":")[0] for target in targets} == {"consume", "relay", "effects"}
    assert all(target.endswith(":9108") for target in targets)


def test_every_metric_the_docs_and_alerts_name_is_one_the_service_exports() -> None:
    # Given the names the service registers (a counter is exported with `_total`, a histogram with its series)
    exported: set[str] = set()
    for family in Metrics().registry.collect():
        exported |= {family.name, *(sample.name for sample in family.samples)}
        if family.type == "counter":
            exported.add(f"{family.name}_total")

    # When the operator-facing texts name metrics
    texts = ["README.md", "docs/runbook.md", "docs/template-guide.md", "deploy/prometheus/alerts.yml"]
    named = {name for path in texts for name in re.findall(r"\borders_[a-z_]+", (ROOT / path).read_text())}

    # Then each of them exists (a renamed metric must be renamed in the docs too)
    assert named
    assert named - exported == set()


def test_the_console_colours_ages_by_the_alerts_thresholds() -> None:
    """The overview shows the oldest open record and the outbox's oldest row in red past the same thresholds as
    the alerts that page for them."""
    from service.console import pages

    rules = {
        rule["alert"]: rule["expr"]
        for group in yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    }

    assert rules["OrdersQuarantineOldestTooOld"].endswith(f"> {pages.OLDEST_OPEN_ALERT_SECONDS}")
    assert rules["OrdersOutboxStuck"].endswith(f"> {pages.OUTBOX_OLDEST_ALERT_SECONDS}")

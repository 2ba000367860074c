"""docker-compose.yml and its secured overlay docker-compose.secured.yml cannot run here (no Docker engine): check
statically that they, and the operator docs, name only things that exist, and that the secured stack gives every
secret as a file and each principal only its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
import typer
import yaml

from service.adapters.topics import declared
from service.cli import application
from service.config import load_settings, secret_fields
from service.metrics import Metrics
from service.orders.domain import DOMAIN
from service.orders.settings import ENV_PREFIX
from service.orders.settings import OrderSettings as Settings
from service.policy.topics import kafka_acls_commands, service_acls

ROOT = Path(__file__).resolve().parents[2]
SECURED = ROOT / "docker-compose.secured.yml"
COMPOSE_DIR = ROOT / "deploy" / "compose"
MATERIAL = ".local/compose-secured"  # where deploy/compose/secured-material writes, as the overlay names it
SECRETS_DIR = "/run/secrets"  # where compose mounts a service's secrets
SECRET_VARIABLES = {f"{ENV_PREFIX}{name.upper()}" for name in secret_fields(Settings)}
SETTINGS = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
PATH_VARIABLES = {f"{ENV_PREFIX}KAFKA_SSL_{what}" for what in ("CAFILE", "CERTFILE", "KEYFILE")}
LONG_RUNNING = {"consume", "relay", "effects", "reconciler", "console"}
RESET = object()  # `!reset`: compose removes what an earlier file set


class _ComposeLoader(yaml.SafeLoader):
    """YAML as compose reads it, with its `!reset` tag."""


_ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)


def _load(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=_ComposeLoader)  # type: ignore[no-any-return]


def _unique_key(attribute: str, item: Any) -> Any:
    """What compose merges a service's volumes, secrets and configs by: the target (a secret's, by default its name)."""
    if isinstance(item, str):
        return item.split(":")[1] if attribute == "volumes" else item
    return item.get("target", item.get("source"))


def _merged(base: Any, override: Any, path: tuple[str, ...] = ()) -> Any:
    """Compose's merge of a later file into an earlier one (https://docs.docker.com/reference/compose-file/merge/):
    mappings merge, `command`, `entrypoint` and `healthcheck.test` are replaced, a service's volumes, secrets and
    configs merge by target, other sequences are appended; `!reset` removes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is RESET:
                merged.pop(key, None)
            else:
                merged[key] = _merged(base[key], value, (*path, key)) if key in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list):
        if path[-1] in {"command", "entrypoint"} or path[-2:] == ("healthcheck", "test"):
            return override
        if len(path) == 3 and path[0] == "services" and path[2] in {"volumes", "secrets", "configs"}:
            by_key = {_unique_key(path[2], item): item for item in base}
            by_key |= {_unique_key(path[2], item): item for item in override}
            return list(by_key.values())
        return base + override
    return override


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def secured(compose: dict[str, Any]) -> dict[str, Any]:
    """docker-compose.yml with docker-compose.secured.yml merged in, as `docker compose -f … -f …` runs it."""
    return _merged(compose, _load(SECURED))  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=["plain", "secured"])
def stack(request: pytest.FixtureRequest, compose: dict[str, Any], secured: dict[str, Any]) -> dict[str, Any]:
    """Each stack: docker-compose.yml alone, and with the secured overlay."""
    return compose if request.param == "plain" else secured


def _cli_commands() -> set[str]:
    group = typer.main.get_command(application(DOMAIN))
    return set(group.commands)  # type: ignore[attr-defined]


def _service_containers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: spec for name, spec in compose["services"].items() if spec.get("image") == "order-service:local"}


def _commands_of(spec: dict[str, Any]) -> set[str]:
    """The order-service commands a container runs: its command, or the ones its shell script calls."""
    if "entrypoint" not in spec:
        return {spec["command"][0]}
    return set(re.findall(r"order-service (\w+)", " ".join(spec["command"])))


def test_every_service_image_command_is_an_order_service_command(stack: dict[str, Any]) -> None:
    commands = _cli_commands()
    used = set().union(*(_commands_of(spec) for spec in _service_containers(stack).values()))
    assert used <= commands, used - commands
    assert {"migrate", "consume", "relay", "effects", "reconcile"} <= used


def test_the_reconciler_runs_on_a_schedule(stack: dict[str, Any]) -> None:
    reconciler = _service_containers(stack)["reconciler"]
    script = " ".join(reconciler["command"])
    assert "order-service reconcile" in script
    assert re.search(r"sleep \d+", script)


@pytest.mark.parametrize(
    "path", [ROOT / "docker-compose.yml", SECURED, *sorted(COMPOSE_DIR.iterdir())], ids=lambda path: path.name
)
def test_every_orders_variable_is_a_setting(path: Path) -> None:
    # A secret may be given as a file: `<VARIABLE>_FILE` exists for the secret settings only (contract §11).
    files = {f"{variable}_FILE" for variable in SECRET_VARIABLES}
    named = set(re.findall(r"\bORDERS_[A-Z_]+\b", path.read_text()))
    if path.parent == ROOT:
        assert named, "the compose file configures the service through ORDERS_* variables"
    assert named <= SETTINGS | files, named - SETTINGS - files


def test_the_compose_settings_are_valid_settings(compose: dict[str, Any]) -> None:
    environment = _service_containers(compose)["consume"]["environment"]
    values = {
        key.removeprefix(ENV_PREFIX).lower(): value
        for key, value in environment.items()
        if not str(value).startswith("${")
    }
    settings = Settings(**values)
    assert settings.kafka_bootstrap_servers == "kafka:9092"


def test_dependencies_name_existing_services_with_valid_conditions(stack: dict[str, Any]) -> None:
    services = stack["services"]
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
    stack: dict[str, Any],
) -> None:
    for name, spec in _service_containers(stack).items():
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


def _environment(spec: dict[str, Any]) -> dict[str, str]:
    """A container's variables as compose sets them: `${NAME:-default}` and `${NAME-default}` are the default (nothing
    is exported here)."""
    return {
        key: re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", str(value)) for key, value in (spec.get("environment") or {}).items()
    }


def _secret_files(spec: dict[str, Any]) -> dict[str, str]:
    """The files a container finds in /run/secrets: their path, and the top-level secret each one is."""
    mounted = {}
    for secret in spec.get("secrets", []):
        source = secret if isinstance(secret, str) else secret["source"]
        target = source if isinstance(secret, str) else secret.get("target", source)
        mounted[target if target.startswith("/") else f"{SECRETS_DIR}/{target}"] = source
    return mounted


def _named_files(environment: dict[str, str]) -> dict[str, str]:
    """Every file a container's settings name: the `_FILE` variables, the Kafka TLS files, the database URL's."""
    named = {name: value for name, value in environment.items() if name.endswith("_FILE") or name in PATH_VARIABLES}
    query = parse_qs(environment.get(f"{ENV_PREFIX}DATABASE_URL", "").partition("?")[2])
    files = ("sslrootcert", "sslcert", "sslkey")
    named |= {f"{ENV_PREFIX}DATABASE_URL {name}": query[name][0] for name in files if name in query}
    return named


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What deploy/compose/secured-material makes, made in a temporary directory."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (scripts/bootstrap installs it)")
    directory = tmp_path_factory.mktemp("compose-secured")
    subprocess.run(
        [COMPOSE_DIR / "secured-material"],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "COMPOSE_SECURED_DIR": str(directory)},
    )
    return directory


def test_the_plain_stack_stays_open_for_development(compose: dict[str, Any]) -> None:
    # docker-compose.yml alone: the plaintext broker, the password in the URL, no secret files
    for spec in _service_containers(compose).values():
        environment = _environment(spec)
        assert f"{ENV_PREFIX}KAFKA_SECURITY_PROTOCOL" not in environment
        assert environment[f"{ENV_PREFIX}KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
        assert "secrets" not in spec
    assert "secrets" not in compose


def test_the_secured_stack_gives_every_secret_as_a_file_and_nothing_secret_in_a_variable(
    secured: dict[str, Any],
) -> None:
    declared_secrets = secured["secrets"]
    for name, spec in _service_containers(secured).items():
        environment = _environment(spec)
        mounted = _secret_files(spec)
        # No secret by value: each secret setting is its `_FILE`; the URL is given, but carries no password
        assert not (SECRET_VARIABLES - {f"{ENV_PREFIX}DATABASE_URL"}) & set(environment), name
        assert not re.match(r"[^:]+://[^/@]*:[^/@]*@", environment.get(f"{ENV_PREFIX}DATABASE_URL", "")), name
        # Every file a setting names is a secret the container mounts, declared as a file
        for variable, path in _named_files(environment).items():
            assert path in mounted, f"{name}: {variable}={path} is no secret it mounts"
        for source in mounted.values():
            assert declared_secrets[source]["file"].startswith(f"{MATERIAL}/"), source
    # The overlay's every secret, config and script exists or is made by deploy/compose/secured-material
    for config in secured["configs"].values():
        assert (ROOT / config["file"]).is_file(), config


def test_the_secured_stack_configuration_is_one_the_service_accepts(
    secured: dict[str, Any], material: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the files deploy/compose/secured-material makes, each mounted where compose mounts it
    for secret in secured["secrets"].values():
        assert (material / secret["file"].removeprefix(f"{MATERIAL}/")).is_file(), secret
    for name, spec in _service_containers(secured).items():
        secrets = tmp_path / name
        secrets.mkdir()
        for path, source in _secret_files(spec).items():
            made = material / secured["secrets"][source]["file"].removeprefix(f"{MATERIAL}/")
            (secrets / path.removeprefix(f"{SECRETS_DIR}/")).write_bytes(made.read_bytes())
        for variable in [variable for variable in os.environ if variable.startswith(ENV_PREFIX)]:
            monkeypatch.delenv(variable)
        for variable, value in _environment(spec).items():
            monkeypatch.setenv(variable, value.replace(f"{SECRETS_DIR}/", f"{secrets}/"))

        # When the container's process reads its settings, then they are accepted, and secured
        settings = load_settings(Settings)
        assert settings.kafka_security_protocol == "SASL_SSL", name
        assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512", name
        assert settings.kafka_ssl_cafile, name
        assert settings.kafka_sasl_password is not None, name
        if name != "topics":
            query = parse_qs(settings.database_url.get_secret_value().partition("?")[2])
            assert query["sslmode"] == ["verify-full"], name
            assert settings.database_password is not None, name
        if name == "console":
            assert settings.console_tokens.get_secret_value(), "the console's tokens from their file"


def test_the_secured_topics_service_is_the_admin_and_gets_no_database_secret(secured: dict[str, Any]) -> None:
    containers = _service_containers(secured)
    topics, consume = containers["topics"], containers["consume"]
    topics_environment, consume_environment = _environment(topics), _environment(consume)
    password = f"{ENV_PREFIX}KAFKA_SASL_PASSWORD_FILE"

    # Its own principal and password, at the same path as the service's
    username = f"{ENV_PREFIX}KAFKA_SASL_USERNAME"
    assert topics_environment[username] != consume_environment[username]
    assert topics_environment[password] == consume_environment[password]
    path = topics_environment[password]
    assert _secret_files(topics)[path] != _secret_files(consume)[path]
    # Every other container logs in as the service
    for name, spec in containers.items():
        if name != "topics":
            assert _environment(spec)[username] == consume_environment[username], name
            assert _secret_files(spec)[path] == _secret_files(consume)[path], name
    # Nothing of the database
    assert not [variable for variable in topics_environment if variable.startswith(f"{ENV_PREFIX}DATABASE")]
    assert not [source for source in _secret_files(topics).values() if "database" in source]


def test_the_secured_broker_knows_both_principals_and_grants_the_service_what_topics_acls_prints(
    secured: dict[str, Any],
) -> None:
    containers = _service_containers(secured)
    service, admin = (_environment(containers[name]) for name in ("consume", "topics"))
    broker = (COMPOSE_DIR / "kafka-secured.sh").read_text()
    acls = (COMPOSE_DIR / "kafka-acls.sh").read_text()
    variables = dict(re.findall(r"^([A-Z]+)=(\S+)$", broker, flags=re.MULTILINE))

    # The SCRAM users the broker's storage is formatted with are the two principals; only the admin is a super user
    users = set(re.findall(r"SCRAM-SHA-512=\[name=\$(\w+),", broker))
    assert {variables[user] for user in users} == {service[f"{ENV_PREFIX}KAFKA_SASL_USERNAME"], "admin"}
    assert admin[f"{ENV_PREFIX}KAFKA_SASL_USERNAME"] == variables["ADMIN"] == "admin"
    assert "super.users=User:broker;User:$ADMIN\n" in broker
    assert f"sasl.enabled.mechanisms={service[f'{ENV_PREFIX}KAFKA_SASL_MECHANISM']}\n" in broker
    # The clients' listener is the one every container bootstraps from
    host, port = service[f"{ENV_PREFIX}KAFKA_BOOTSTRAP_SERVERS"].split(":")
    assert f"CLIENTS://:{port}," in broker
    assert "CLIENTS:SASL_SSL" in broker
    assert "auto.create.topics.enable=false" in broker
    assert "allow.everyone.if.no.acl.found=false" in broker

    # The one-shot ACL service runs exactly the commands `order-service topics acls --kafka-acls` prints
    bindings = service_acls(
        f"User:{service[f'{ENV_PREFIX}KAFKA_SASL_USERNAME']}",
        service[f"{ENV_PREFIX}SOURCE_TOPIC"],
        service[f"{ENV_PREFIX}CONSUMER_NAME"],
    )
    expected = kafka_acls_commands(bindings, service[f"{ENV_PREFIX}KAFKA_BOOTSTRAP_SERVERS"])
    granted = tuple(line for line in acls.splitlines() if line.startswith("kafka-acls.sh "))
    assert granted == expected
    assert secured["services"]["kafka-acls"]["image"] == secured["services"]["kafka"]["image"]
    assert host == "kafka"


def test_the_secured_service_containers_start_after_the_acls_are_granted(secured: dict[str, Any]) -> None:
    services = secured["services"]
    assert services["kafka-acls"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "admin.properties" in " ".join(services["kafka"]["healthcheck"]["test"])
    for name in LONG_RUNNING:
        assert services[name]["depends_on"]["kafka-acls"]["condition"] == "service_completed_successfully", name


def test_the_secured_stack_keeps_its_own_data_volumes(compose: dict[str, Any], secured: dict[str, Any]) -> None:
    # Its SCRAM users and database role are made with the new passwords: never over the plain stack's data
    for name in ("postgres", "kafka"):
        plain = {volume.split(":")[0] for volume in compose["services"][name]["volumes"]}
        mounted = {volume.split(":")[0] for volume in secured["services"][name]["volumes"]}
        assert mounted
        assert not mounted & plain, name
        assert mounted <= set(secured["volumes"]), name
    assert "POSTGRES_PASSWORD" not in secured["services"]["postgres"]["environment"]


@pytest.mark.parametrize(
    "script", sorted(path for path in COMPOSE_DIR.iterdir() if path.suffix != ".conf"), ids=lambda path: path.name
)
def test_every_script_of_the_secured_stack_is_valid_bash(script: Path) -> None:
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)


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
    for family in Metrics(DOMAIN.metrics_prefix).registry.collect():
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
    for family in Metrics(DOMAIN.metrics_prefix).registry.collect():
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


def test_the_plain_stack_traces_into_its_jaeger_and_the_console_links_there(compose: dict[str, Any]) -> None:
    services = compose["services"]
    endpoint = services["consume"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint.endswith("http://jaeger:4318}")  # overridable; the OTLP/HTTP receiver of the jaeger service
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert "jaeger" not in (services["consume"].get("depends_on") or {})  # export never holds the service back
    link = services["console"]["environment"]["ORDERS_CONSOLE_TRACE_URL"]
    assert link.startswith("http://localhost:16686/")
    assert link.count("{trace_id}") == 1
    assert "127.0.0.1:16686:16686" in services["jaeger"]["ports"]

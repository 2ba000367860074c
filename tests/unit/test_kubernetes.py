"""The Kubernetes manifests (deploy/kubernetes) checked offline: against the API's schemas, and against the service
they run (its commands, settings, health server and alert rules). There is no cluster and no kustomize binary
here, so `_build` renders a kustomization in the small way these manifests need.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from service.cli import app
from service.config import ENV_PREFIX, load_settings
from service.durations import parse_duration
from service.orders.settings import OrderSettings as Settings

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
OVERLAY = KUBERNETES / "overlays" / "example"
KUSTOMIZATIONS = sorted(path.parent for path in KUBERNETES.rglob("kustomization.yaml"))
# The oldest Kubernetes release the manifests are written for; kubernetes-validate ships its schemas.
KUBERNETES_VERSION = "1.31"
# The source topic's partition count, as the ScaledObject's annotation and the README state it.
SOURCE_PARTITIONS = 12
PARTITIONS_ANNOTATION = "order-service/source-partitions"
# Operators' objects: not in the Kubernetes schemas, so their required fields are checked by hand below.
CUSTOM_RESOURCES = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CLUSTER_SCOPED = {"Namespace"}
CONFIGMAP = "order-service"
DATABASE_SECRET = "order-service-database"
LONG_RUNNING = {"consume", "relay", "effects"}
WITHOUT_DATABASE = {"topics"}  # commands that never connect to PostgreSQL
PROBES = ("startupProbe", "livenessProbe", "readinessProbe")
_QUANTITY_UNITS = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30}

Object = dict[str, Any]


def _documents(path: Path) -> list[Object]:
    """Every non-empty YAML document of a file."""
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def _kustomization(directory: Path) -> Object:
    """The kustomization.yaml of a directory."""
    (kustomization,) = _documents(directory / "kustomization.yaml")
    return kustomization


def _named_paths(directory: Path) -> list[Path]:
    """The files and directories a kustomization names: its resources and its patches."""
    kustomization = _kustomization(directory)
    patches = [directory / patch["path"] for patch in kustomization.get("patches", [])]
    return [directory / resource for resource in kustomization.get("resources", [])] + patches


def _identity(obj: Object) -> tuple[str, str]:
    """What a strategic-merge patch names its target by."""
    return obj["kind"], obj["metadata"]["name"]


def _is_named_list(value: Any) -> bool:
    """A list strategic merge merges item by item: containers, env, ports, volumes (all keyed by `name`)."""
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) and "name" in item for item in value)


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge, as far as these patches need it: maps merge, named lists merge by name, the rest replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{key: _merge(base[key], value) if key in base else value for key, value in patch.items()}}
    if _is_named_list(base) and _is_named_list(patch):
        merged = {item["name"]: item for item in base}
        for item in patch:
            merged[item["name"]] = _merge(merged[item["name"]], item) if item["name"] in merged else item
        return list(merged.values())
    return patch


def _unmatched_names(base: Any, patch: Any, where: str = "") -> list[str]:
    """Named list items of a patch that its target lacks: kustomize would add them, so a typo adds a container."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return [
            miss for key in patch if key in base for miss in _unmatched_names(base[key], patch[key], f"{where}.{key}")
        ]
    misses: list[str] = []
    if _is_named_list(base) and _is_named_list(patch):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            at = f"{where}[{item['name']}]"
            misses += _unmatched_names(by_name[item["name"]], item, at) if item["name"] in by_name else [at]
    return misses


def _generated_secret(generator: Object) -> Object:
    """The Secret a secretGenerator of literals makes (kustomize also appends a hash to its name; this does not)."""
    pairs = dict(literal.split("=", 1) for literal in generator["literals"])
    data = {key: base64.b64encode(value.encode()).decode() for key, value in pairs.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": generator["name"]},
        "type": "Opaque",
        "data": data,
    }


def _build(directory: Path) -> list[Object]:
    """A small `kustomize build`: resources, generated Secrets, strategic-merge patch files, namespace, images."""
    kustomization = _kustomization(directory)
    objects: list[Object] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += _build(path) if path.is_dir() else _documents(path)
    objects += [_generated_secret(generator) for generator in kustomization.get("secretGenerator", [])]
    for entry in kustomization.get("patches", []):
        (patch,) = _documents(directory / entry["path"])
        objects = [_merge(obj, patch) if _identity(obj) == _identity(patch) else obj for obj in objects]
    if namespace := kustomization.get("namespace"):
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    for image in kustomization.get("images", []):
        for container in _containers(objects):
            if container["image"].split(":")[0] == image["name"]:
                container["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return objects


def _pod_spec(obj: Object) -> Object | None:
    """The pod template's spec of a workload; None for an object that runs no pods."""
    if obj["kind"] in {"Deployment", "Job"}:
        return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return None


def _pod_labels(obj: Object) -> dict[str, str]:
    """The labels of a workload's pods."""
    template = obj["spec"]["jobTemplate"]["spec"]["template"] if obj["kind"] == "CronJob" else obj["spec"]["template"]
    return template["metadata"]["labels"]  # type: ignore[no-any-return]


def _workloads(objects: list[Object]) -> list[tuple[Object, Object]]:
    """Every object that runs pods, with its pod spec."""
    return [(obj, spec) for obj in objects if (spec := _pod_spec(obj)) is not None]


def _containers(objects: list[Object]) -> list[Object]:
    """Every container of every workload."""
    return [container for _, spec in _workloads(objects) for container in spec["containers"]]


def _the(objects: list[Object], kind: str, name: str | None = None) -> Object:
    """The one object of a kind (and a name)."""
    (found,) = [obj for obj in objects if obj["kind"] == kind and name in (None, obj["metadata"]["name"])]
    return found


def _deployment_running(objects: list[Object], command: str) -> Object:
    """The Deployment whose container runs `order-service <command>`."""
    (found,) = [obj for obj, spec in _workloads(objects) if spec["containers"][0]["args"][0] == command]
    return found


def _configuration(objects: list[Object]) -> dict[str, str]:
    """What the ConfigMap sets."""
    return _the(objects, "ConfigMap", CONFIGMAP)["data"]  # type: ignore[no-any-return]


def _selects(selector: Object, labels: dict[str, str]) -> bool:
    """Whether a `matchLabels` selector picks pods with these labels."""
    return bool(selector["matchLabels"]) and selector["matchLabels"].items() <= labels.items()


def _quantity(text: str | int) -> float:
    """A Kubernetes quantity (`250m`, `1`, `512Mi`) as a number."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(text))
    assert match is not None, f"{text!r} is not a quantity"
    return float(match[1]) * _QUANTITY_UNITS[match[2]]


def _render_prometheus_rule() -> str:
    """What deploy/kubernetes/render_prometheus_rule.py writes, computed now."""
    spec = importlib.util.spec_from_file_location("render_prometheus_rule", KUBERNETES / "render_prometheus_rule.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=[BASE, OVERLAY], ids=lambda path: str(path.relative_to(KUBERNETES)))
def objects(request: pytest.FixtureRequest) -> list[Object]:
    """The objects of the base, then of the example overlay, as `kubectl apply -k` would send them."""
    return _build(request.param)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda path: str(path.relative_to(KUBERNETES)))
def test_every_file_a_kustomization_names_exists(directory: Path) -> None:
    missing = [
        path for path in _named_paths(directory) if not (path.is_file() or (path / "kustomization.yaml").is_file())
    ]

    assert not missing, missing


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda path: str(path.relative_to(KUBERNETES)))
def test_every_manifest_file_is_named_by_its_kustomization(directory: Path) -> None:
    files = {path for path in directory.glob("*.yaml") if path.name != "kustomization.yaml"}

    assert files <= set(_named_paths(directory)), files - set(_named_paths(directory))


def test_every_overlay_patch_targets_an_object_of_the_base_and_its_named_items() -> None:
    base = {_identity(obj): obj for obj in _build(BASE)}

    for entry in _kustomization(OVERLAY)["patches"]:
        (patch,) = _documents(OVERLAY / entry["path"])
        assert _identity(patch) in base, f"{entry['path']} patches no object of the base"
        assert not _unmatched_names(base[_identity(patch)], patch), entry["path"]


def test_every_built_in_object_is_valid_against_the_kubernetes_schema(objects: list[Object]) -> None:
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_RESOURCES:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {'.'.join(map(str, error.path))}: {error.message}")


def test_every_custom_resource_has_the_fields_its_operator_requires(objects: list[Object]) -> None:
    scaled = _the(objects, "ScaledObject")
    assert _the(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    assert scaled["spec"]["triggers"]
    for trigger in scaled["spec"]["triggers"]:
        # KEDA's trigger metadata is a map of strings: `lagThreshold: 500` unquoted is rejected.
        assert trigger["type"]
        assert all(isinstance(value, str) for value in trigger["metadata"].values()), trigger["metadata"]

    rule = _the(objects, "PrometheusRule")
    assert rule["spec"]["groups"]
    for group in rule["spec"]["groups"]:
        assert group["name"]
        assert group["rules"]
        for each in group["rules"]:
            assert each["expr"]
            assert ("alert" in each) != ("record" in each), each

    monitor = _the(objects, "PodMonitor")
    scraped = [obj for obj in objects if obj["kind"] == "Deployment"]
    assert all(_selects(monitor["spec"]["selector"], _pod_labels(obj)) for obj in scraped)
    ports = {port["name"] for obj in scraped for port in obj["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {endpoint["port"] for endpoint in monitor["spec"]["podMetricsEndpoints"]} <= ports


def test_keda_scales_consume_on_the_lag_of_its_consumer_group_on_the_source_topic(objects: list[Object]) -> None:
    scaled = _the(objects, "ScaledObject")
    config = _configuration(objects)
    (trigger,) = scaled["spec"]["triggers"]

    assert scaled["spec"]["scaleTargetRef"]["name"] == _deployment_running(objects, "consume")["metadata"]["name"]
    assert trigger["type"] == "kafka"
    assert trigger["metadata"]["bootstrapServers"] == config["ORDERS_KAFKA_BOOTSTRAP_SERVERS"]
    assert trigger["metadata"]["consumerGroup"] == config["ORDERS_CONSUMER_NAME"]
    assert trigger["metadata"]["topic"] == config["ORDERS_SOURCE_TOPIC"]
    assert int(trigger["metadata"]["lagThreshold"]) > 0
    assert trigger["metadata"]["allowIdleConsumers"] == "false"


def test_keda_never_scales_consume_beyond_the_source_partitions(objects: list[Object]) -> None:
    scaled = _the(objects, "ScaledObject")

    assert scaled["metadata"]["annotations"][PARTITIONS_ANNOTATION] == str(SOURCE_PARTITIONS)
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"] <= SOURCE_PARTITIONS
    assert "replicas" not in _deployment_running(objects, "consume")["spec"], "KEDA owns the replica count"


def test_every_command_a_manifest_runs_is_a_command_of_the_cli(objects: list[Object]) -> None:
    for container in _containers(objects):
        assert "command" not in container, "the image's entrypoint is `order-service`; the command goes in args"
        # Typer vendors click: a group is what has `commands`, `quarantine list` names a subcommand.
        command: Any = typer.main.get_command(app)
        for word in container["args"]:
            if not hasattr(command, "commands"):
                break
            assert word in command.commands, f"`order-service {word}` is not a command"
            command = command.commands[word]
        flags = {arg.split("=", 1)[0] for arg in container["args"] if arg.startswith("-")}
        options = {option for parameter in command.params for option in parameter.opts}
        assert flags <= options, flags - options


def test_each_command_runs_as_the_workload_its_lifetime_needs(objects: list[Object]) -> None:
    runs = {(obj["kind"], spec["containers"][0]["args"][0]) for obj, spec in _workloads(objects)}

    one_shot = {("Job", "migrate"), ("Job", "topics"), ("CronJob", "reconcile")}
    assert runs == one_shot | {("Deployment", name) for name in LONG_RUNNING}


def test_every_probe_asks_a_path_the_health_server_serves(objects: list[Object]) -> None:
    served = set(re.findall(r'path == "(/\w+)"', (ROOT / "service" / "health.py").read_text()))
    assert {"/healthz", "/readyz"} <= served

    for container in _containers(objects):
        for probe in PROBES:
            if probe in container:
                assert container[probe]["httpGet"]["path"] in served, f"{container['name']} {probe}"


def test_every_long_running_container_is_probed_for_liveness_and_readiness(objects: list[Object]) -> None:
    for name in LONG_RUNNING:
        (container,) = _deployment_running(objects, name)["spec"]["template"]["spec"]["containers"]
        # Liveness must not depend on PostgreSQL or Kafka: an outage would restart every pod at once.
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_every_container_port_and_probe_port_is_the_metrics_port(objects: list[Object]) -> None:
    port = int(_configuration(objects).get("ORDERS_METRICS_PORT", Settings.model_fields["metrics_port"].default))

    for container in _containers(objects):
        named = {each["name"]: each["containerPort"] for each in container.get("ports", [])}
        assert set(named.values()) <= {port}, container["name"]
        for probe in PROBES:
            if probe in container:
                probed = container[probe]["httpGet"]["port"]
                assert named.get(probed, probed) == port, f"{container['name']} {probe}"


def test_every_orders_variable_a_manifest_names_is_a_setting() -> None:
    fields = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    texts = [path.read_text() for path in KUBERNETES.rglob("*") if path.suffix in {".yaml", ".md"}]
    named = {name for text in texts for name in re.findall(r"\bORDERS_[A-Z0-9_]+\b", text)}

    assert "ORDERS_DATABASE_URL" in named
    assert named <= fields, named - fields


def test_the_configuration_every_container_gets_is_one_the_service_accepts(
    objects: list[Object], monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = {obj["metadata"]["name"]: obj["data"] for obj in objects if obj["kind"] == "Secret"}
    for container in _containers(objects):
        for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
            monkeypatch.delenv(name)
        for source in container["envFrom"]:
            if "configMapRef" in source:
                values = _the(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
            else:
                encoded = secrets.get(source["secretRef"]["name"], {})
                values = {key: base64.b64decode(value).decode() for key, value in encoded.items()}
            for key, value in values.items():
                monkeypatch.setenv(key, value)
        for variable in container.get("env", []):
            monkeypatch.setenv(variable["name"], variable["value"])

        load_settings(Settings)


def test_every_container_reads_the_configmap_and_the_database_secret(objects: list[Object]) -> None:
    for container in _containers(objects):
        if container["args"][0] in WITHOUT_DATABASE:
            # It never connects to PostgreSQL, so it gets no database password (least privilege).
            assert container["envFrom"] == [{"configMapRef": {"name": CONFIGMAP}}], container["name"]
            continue
        assert container["envFrom"] == [
            {"configMapRef": {"name": CONFIGMAP}},
            {"secretRef": {"name": DATABASE_SECRET}},
        ], container["name"]


def test_only_the_overlay_makes_the_database_secret() -> None:
    assert not [obj for obj in _build(BASE) if obj["kind"] == "Secret"], "the base holds no password"
    secret = _the(_build(OVERLAY), "Secret", DATABASE_SECRET)
    assert set(secret["data"]) == {"ORDERS_DATABASE_URL"}
    assert "example" in base64.b64decode(secret["data"]["ORDERS_DATABASE_URL"]).decode()


def test_every_container_runs_as_a_non_root_user_on_a_read_only_root_filesystem(objects: list[Object]) -> None:
    for _, spec in _workloads(objects):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] == 10001
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            # With the root filesystem read-only, Python must not try to write its bytecode cache.
            assert {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"} in container["env"]


def test_every_container_has_resource_requests_within_its_limits(objects: list[Object]) -> None:
    for container in _containers(objects):
        resources = container["resources"]
        for resource in ("cpu", "memory"):
            request, limit = resources["requests"][resource], resources["limits"][resource]
            assert _quantity(request) <= _quantity(limit), f"{container['name']} {resource}: {request} > {limit}"


def test_the_grace_period_outlasts_the_processing_timeout(objects: list[Object]) -> None:
    configured = _configuration(objects).get("ORDERS_PROCESSING_TIMEOUT")
    timeout = parse_duration(configured) if configured else Settings.model_fields["processing_timeout"].default

    for name in LONG_RUNNING:
        grace = _deployment_running(objects, name)["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")
        # Unset, Kubernetes' default is 30s: no longer than the default timeout.
        assert (grace or 30) > timeout.total_seconds(), name


def test_the_reconciler_cron_job_forbids_concurrent_runs(objects: list[Object]) -> None:
    cron = _the(objects, "CronJob")

    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def test_every_job_retries_a_bounded_number_of_times_and_is_cleaned_up(objects: list[Object]) -> None:
    jobs = [obj for obj in objects if obj["kind"] == "Job"]

    assert {job["metadata"]["name"] for job in jobs} == {"order-service-migrate", "order-service-topics-apply"}
    for job in jobs:
        assert 1 <= job["spec"]["backoffLimit"] <= 10
        assert job["spec"]["ttlSecondsAfterFinished"] > 0


def test_the_topics_job_applies_the_declared_topics_and_leaves_the_source_to_its_producers(
    objects: list[Object],
) -> None:
    job = _the(objects, "Job", "order-service-topics-apply")
    (container,) = job["spec"]["template"]["spec"]["containers"]

    assert container["args"] == ["topics", "apply"]


def test_a_disruption_budget_covers_consume(objects: list[Object]) -> None:
    budgets = [obj for obj in objects if obj["kind"] == "PodDisruptionBudget"]
    consume = _pod_labels(_deployment_running(objects, "consume"))

    assert any(_selects(budget["spec"]["selector"], consume) for budget in budgets)


def test_every_deployment_selects_its_own_pods_only(objects: list[Object]) -> None:
    deployments = [obj for obj in objects if obj["kind"] == "Deployment"]

    for deployment in deployments:
        selected = [other for other in deployments if _selects(deployment["spec"]["selector"], _pod_labels(other))]
        assert selected == [deployment], deployment["metadata"]["name"]


def test_the_overlay_runs_one_pinned_image_everywhere() -> None:
    (image,) = _kustomization(OVERLAY)["images"]

    assert image["newTag"] not in {"", "latest"}
    assert {container["image"] for container in _containers(_build(OVERLAY))} == {
        f"{image['newName']}:{image['newTag']}"
    }


def test_the_prometheus_rule_is_alerts_yml_rendered_now() -> None:
    committed = BASE / "prometheusrule.yaml"
    alerts = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())

    assert committed.read_text() == _render_prometheus_rule(), "run deploy/kubernetes/render_prometheus_rule.py"
    assert _the(_documents(committed), "PrometheusRule")["spec"]["groups"] == alerts["groups"]

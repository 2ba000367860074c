"""The Kubernetes manifests (deploy/kubernetes) checked offline: against the API's schemas, and against the service
they run (its commands, settings, secrets as files, health server and alert rules). There is no cluster here, so
`_build` renders a kustomization in the small way these manifests need; where `kubectl` (or `kustomize`) is
installed, a test checks that it renders the same objects.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import kubernetes_validate
import pytest
import typer
import yaml

from service.cli import application
from service.config import load_settings, secret_fields
from service.durations import parse_duration
from service.orders.domain import DOMAIN
from service.orders.settings import ENV_PREFIX
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
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
CLUSTER_SCOPED = {"Namespace"}
CONFIGMAP = "order-service"
# The service's pods: the shared ConfigMap, then where their secret files are; their Secret, their ServiceAccount.
SECRET_FILES = "order-service-secret-files"
SERVICE_SECRET = "order-service"
SERVICE_ACCOUNT = "order-service"
# The topics Job (`topics apply`, a more privileged Kafka principal): its own ConfigMap, Secret and ServiceAccount.
TOPICS_CONFIGMAP = "order-service-topics"
TOPICS_SECRET = "order-service-topics"
TOPICS_ACCOUNT = "order-service-topics"
SECRETS_DIR = "/etc/order-service/secrets"  # where every pod mounts its own principal's Secret
USER_ID = 10001
LONG_RUNNING = {"consume", "relay", "effects"}
WITHOUT_DATABASE = {"topics"}  # commands that never connect to PostgreSQL
# What an overlay must add to the base: the Secret with the database URL (the base alone holds no secret).
OVERLAY_SUPPLIES = {SERVICE_SECRET: {"database-url": "postgresql+asyncpg://orders@postgres:5432/orders"}}
# Every secret setting (contract §11), as a variable: given by value, it would be a secret in the environment.
SECRET_VARIABLES = {f"{ENV_PREFIX}{name.upper()}" for name in secret_fields(Settings)}
# The settings that name a file besides the `_FILE` variables; the database URL's query names files too.
PATH_VARIABLES = {f"{ENV_PREFIX}KAFKA_SSL_{what}" for what in ("CAFILE", "CERTFILE", "KEYFILE")}
DATABASE_URL_FILES = ("sslrootcert", "sslcert", "sslkey")
# KEDA's Kafka scaler's names for a SASL mechanism.
KEDA_SASL = {
    "PLAIN": "plaintext",
    "SCRAM-SHA-256": "scram_sha256",
    "SCRAM-SHA-512": "scram_sha512",
    "OAUTHBEARER": "oauthbearer",
}
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


def _generators(kustomization: Object) -> list[tuple[str, Object]]:
    """The ConfigMap and Secret generators of a kustomization, each with the kind it makes."""
    return [
        (kind, generator)
        for key, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret"))
        for generator in kustomization.get(key, [])
    ]


def _generator_files(directory: Path, generator: Object) -> dict[str, Path]:
    """The files a generator reads, by the key each becomes (`key=path`, or the file's name)."""
    files = {}
    for entry in generator.get("files", []):
        key, _, path = entry.rpartition("=")
        files[key or Path(path).name] = directory / path
    return files


def _named_paths(directory: Path) -> list[Path]:
    """The files and directories a kustomization names: its resources, its patches and its generators' files."""
    kustomization = _kustomization(directory)
    patches = [directory / patch["path"] for patch in kustomization.get("patches", [])]
    generated = [
        path for _, generator in _generators(kustomization) for path in _generator_files(directory, generator).values()
    ]
    return [directory / resource for resource in kustomization.get("resources", [])] + patches + generated


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


def _generated(directory: Path, kind: str, generator: Object) -> Object:
    """The ConfigMap or Secret a generator of literals and files makes (kustomize also appends a hash of the content
    to its name, unless told not to, and rewrites the references to it; this keeps the name)."""
    pairs = dict(literal.split("=", 1) for literal in generator.get("literals", []))
    pairs |= {key: path.read_text() for key, path in _generator_files(directory, generator).items()}
    made: Object = {"apiVersion": "v1", "kind": kind, "metadata": {"name": generator["name"]}}
    if kind == "Secret":
        made["type"] = "Opaque"
        pairs = {key: base64.b64encode(value.encode()).decode() for key, value in pairs.items()}
    made["data"] = pairs
    return made


def _build(directory: Path) -> list[Object]:
    """A small `kustomize build`: resources, generated ConfigMaps and Secrets, strategic-merge patch files, namespace,
    images."""
    kustomization = _kustomization(directory)
    objects: list[Object] = []
    for resource in kustomization.get("resources", []):
        path = directory / resource
        objects += _build(path) if path.is_dir() else _documents(path)
    objects += [_generated(directory, kind, generator) for kind, generator in _generators(kustomization)]
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


def _data(objects: list[Object], kind: str, name: str) -> dict[str, str] | None:
    """What a ConfigMap or Secret of the build holds, decoded; None when the build has no such object."""
    found = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"] == name]
    if not found:
        return None
    (obj,) = found
    data: dict[str, str] = obj.get("data") or {}
    if kind == "Secret":
        return {key: base64.b64decode(value).decode() for key, value in data.items()}
    return dict(data)


def _environment(objects: list[Object], container: Object) -> dict[str, str]:
    """The variables a container gets, as the kubelet sets them: its envFrom ConfigMaps in order (a later one wins),
    then its env. Only ConfigMaps and plain values: a Secret as environment fails here (secrets are files)."""
    environment: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert set(source) == {"configMapRef"}, f"{container['name']} takes a Secret as environment: {source}"
        data = _data(objects, "ConfigMap", source["configMapRef"]["name"])
        assert data is not None, f"{container['name']}: no ConfigMap {source['configMapRef']['name']}"
        environment |= data
    for variable in container.get("env", []):
        assert set(variable) == {"name", "value"}, f"{container['name']}: {variable['name']} is not a plain value"
        environment[variable["name"]] = variable["value"]
    return environment


def _volume_source(volume: Object) -> tuple[str, str, bool]:
    """The kind and name of the object a volume shows as files, and whether the pod starts without it."""
    if "secret" in volume:
        return "Secret", volume["secret"]["secretName"], volume["secret"].get("optional", False)
    assert "configMap" in volume, f"volume {volume['name']}: only Secrets and ConfigMaps are mounted"
    return "ConfigMap", volume["configMap"]["name"], volume["configMap"].get("optional", False)


def _mounts(objects: list[Object], spec: Object, container: Object) -> dict[str, dict[str, str]]:
    """The directories a container mounts, each with its files as the pod sees them: one per key of the Secret or
    ConfigMap (or per `items` entry). A Secret the base lacks is what an overlay must supply (OVERLAY_SUPPLIES); an
    optional object the build lacks is an empty directory."""
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    mounted = {}
    for mount in container.get("volumeMounts", []):
        assert "subPath" not in mount, f"{container['name']}: a subPath mount never sees a rotated secret"
        volume = volumes[mount["name"]]
        kind, name, optional = _volume_source(volume)
        data = _data(objects, kind, name)
        if data is None:
            assert optional or name in OVERLAY_SUPPLIES, f"{container['name']} mounts {kind} {name}, which none makes"
            data = {} if optional else OVERLAY_SUPPLIES[name]
        items = volume["secret" if kind == "Secret" else "configMap"].get("items")
        if items:
            data = {item["path"]: data[item["key"]] for item in items if item["key"] in data}
        mounted[mount["mountPath"].rstrip("/")] = data
    return mounted


def _mount_of(mounts: dict[str, dict[str, str]], path: str) -> str | None:
    """The mounted directory a path is in, if any."""
    return next((directory for directory in mounts if path.startswith(f"{directory}/")), None)


def _file(mounts: dict[str, dict[str, str]], path: str) -> str | None:
    """What a container reads at a path: the file of the volume mounted there; None when there is no such file."""
    directory = _mount_of(mounts, path)
    return None if directory is None else mounts[directory].get(path.removeprefix(f"{directory}/"))


def _named_files(environment: dict[str, str], mounts: dict[str, dict[str, str]]) -> dict[str, str]:
    """Every file a container's settings name, by the setting: the `_FILE` variables, the TLS file settings, and the
    database URL's sslrootcert, sslcert and sslkey (from the URL's file where it is one)."""
    named = {name: value for name, value in environment.items() if name.endswith("_FILE") or name in PATH_VARIABLES}
    url = environment.get(f"{ENV_PREFIX}DATABASE_URL")
    if f"{ENV_PREFIX}DATABASE_URL_FILE" in environment:
        url = _file(mounts, environment[f"{ENV_PREFIX}DATABASE_URL_FILE"])
    query = parse_qs((url or "").partition("?")[2])
    named |= {f"{ENV_PREFIX}DATABASE_URL {name}": query[name][0] for name in DATABASE_URL_FILES if name in query}
    return named


def _settings(
    objects: list[Object], spec: Object, container: Object, root: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    """The settings a container starts with: its environment, and its mounted files written under `root` (every path
    that names them moved there too, in the variables and in the files: the database URL names its CA)."""
    mounts = _mounts(objects, spec, container)

    def moved(text: str) -> str:
        for directory in sorted(mounts, key=len, reverse=True):
            text = text.replace(f"{directory}/", f"{root}{directory}/")
        return text

    for directory, files in mounts.items():
        for key, content in files.items():
            path = Path(f"{root}{directory}") / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(moved(content))
    for name in [name for name in os.environ if name.startswith(ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in _environment(objects, container).items():
        monkeypatch.setenv(name, moved(value))
    return load_settings(Settings)


def _service_pods(objects: list[Object]) -> list[tuple[Object, Object]]:
    """Every workload that runs as the service's principal: all but the topics Job."""
    return [(obj, spec) for obj, spec in _workloads(objects) if spec["containers"][0]["args"][0] != "topics"]


def _topics_job(objects: list[Object]) -> tuple[Object, Object]:
    """The topics Job and its pod spec."""
    job = _the(objects, "Job", "order-service-topics-apply")
    return job, job["spec"]["template"]["spec"]


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


def _kustomize() -> list[str] | None:
    """The command that renders a kustomization here, `kustomize build` or `kubectl kustomize`; None without either."""
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


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


@pytest.mark.skipif(_kustomize() is None, reason="neither kustomize nor kubectl is installed")
@pytest.mark.parametrize("directory", [BASE, OVERLAY], ids=lambda path: str(path.relative_to(KUBERNETES)))
def test_kustomize_renders_the_objects_the_small_build_renders(directory: Path) -> None:
    command = _kustomize()
    assert command is not None
    rendered = subprocess.run(
        [*command, str(directory)], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    built = [document for document in yaml.safe_load_all(rendered) if document is not None]

    # kustomize appends a hash of its content to a generated object's name, and rewrites the references to it
    generated = {generator["name"] for _, generator in _generators(_kustomization(directory))}
    hashed = {
        obj["metadata"]["name"]: obj["metadata"]["name"].rpartition("-")[0]
        for obj in built
        if obj["kind"] in {"ConfigMap", "Secret"}
        and obj["metadata"]["name"].rpartition("-")[0] in generated
        and re.fullmatch(r"[a-z0-9]{10}", obj["metadata"]["name"].rpartition("-")[2])
    }
    text = json.dumps(built)
    for name, unhashed in hashed.items():
        text = text.replace(f'"{name}"', f'"{unhashed}"')

    def identity(obj: Object) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    def decoded(obj: Object) -> Object:
        """A Secret's values decoded: kustomize folds long base64 lines."""
        if obj["kind"] != "Secret":
            return obj
        return {**obj, "data": {key: base64.b64decode(value) for key, value in obj["data"].items()}}

    rendered_objects = sorted(map(decoded, json.loads(text)), key=identity)
    assert rendered_objects == sorted(map(decoded, _build(directory)), key=identity)


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

    secrets = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Secret"}
    authentications = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "TriggerAuthentication"}
    for trigger in scaled["spec"]["triggers"]:
        if "authenticationRef" in trigger:
            assert trigger["authenticationRef"]["name"] in authentications
    for authentication in authentications.values():
        for reference in authentication["spec"]["secretTargetRef"]:
            assert {"parameter", "name", "key"} <= set(reference), reference
            # KEDA reads these by name: a Secret of the build (kustomize does not rewrite names in a custom
            # resource, so a generated one keeps its name), with that key.
            assert reference["key"] in secrets[reference["name"]]["data"], reference

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


def test_keda_reads_the_lag_as_securely_as_the_service_reaches_kafka(objects: list[Object]) -> None:
    config = _configuration(objects)
    protocol = config.get(f"{ENV_PREFIX}KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
    (trigger,) = _the(objects, "ScaledObject")["spec"]["triggers"]
    if protocol == "PLAINTEXT":
        assert "authenticationRef" not in trigger
        return

    # Given the parameters KEDA's Kafka scaler gets from its TriggerAuthentication
    authentication = _the(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    parameters = {
        reference["parameter"]: (_data(objects, "Secret", reference["name"]) or {})[reference["key"]]
        for reference in authentication["spec"]["secretTargetRef"]
    }

    # Then it uses TLS and SASL as the service does, and verifies the brokers with the same CA
    assert parameters.get("tls") == ("enable" if protocol in {"SSL", "SASL_SSL"} else None)
    if protocol.startswith("SASL_"):
        assert parameters["sasl"] == KEDA_SASL[config.get(f"{ENV_PREFIX}KAFKA_SASL_MECHANISM", "PLAIN")]
        assert parameters["username"]
        assert parameters["password"]
    if f"{ENV_PREFIX}KAFKA_SSL_CAFILE" in config:
        ca = config[f"{ENV_PREFIX}KAFKA_SSL_CAFILE"]
        consume = _deployment_running(objects, "consume")["spec"]["template"]["spec"]
        assert parameters["ca"] == _file(_mounts(objects, consume, consume["containers"][0]), ca)


def test_keda_never_scales_consume_beyond_the_source_partitions(objects: list[Object]) -> None:
    scaled = _the(objects, "ScaledObject")

    assert scaled["metadata"]["annotations"][PARTITIONS_ANNOTATION] == str(SOURCE_PARTITIONS)
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"] <= SOURCE_PARTITIONS
    assert "replicas" not in _deployment_running(objects, "consume")["spec"], "KEDA owns the replica count"


def test_every_command_a_manifest_runs_is_a_command_of_the_cli(objects: list[Object]) -> None:
    for container in _containers(objects):
        assert "command" not in container, "the image's entrypoint is `order-service`; the command goes in args"
        # Typer vendors click: a group is what has `commands`, `quarantine list` names a subcommand.
        command: Any = typer.main.get_command(application(DOMAIN))
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
    # A secret is given as a file: `<VARIABLE>_FILE` exists for the secret settings only (contract §11).
    files = {f"{variable}_FILE" for variable in SECRET_VARIABLES}
    texts = [path.read_text() for path in KUBERNETES.rglob("*") if path.suffix in {".yaml", ".md"}]
    named = {name for text in texts for name in re.findall(r"\bORDERS_[A-Z0-9_]+\b", text)}

    assert {"ORDERS_DATABASE_URL_FILE", "ORDERS_KAFKA_SASL_PASSWORD_FILE"} <= named
    assert named <= fields | files, named - fields - files


def test_the_configuration_every_container_gets_is_one_the_service_accepts(
    objects: list[Object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every file it is told to read exists and every combination is accepted: a SASL protocol with its credentials,
    # a CA file that is a CA bundle, a database URL whose sslrootcert is one, neither a secret and its _FILE.
    for _, spec in _workloads(objects):
        for container in spec["containers"]:
            _settings(objects, spec, container, tmp_path / container["name"], monkeypatch)


def test_no_pod_gets_a_secret_as_environment(objects: list[Object]) -> None:
    for _, spec in _workloads(objects):
        for container in spec["containers"]:
            # `_environment` refuses envFrom secretRef and env valueFrom (secretKeyRef).
            environment = _environment(objects, container)
            # Nor is a secret written into a ConfigMap or the pod spec: each is a `_FILE` variable naming a file.
            assert not SECRET_VARIABLES & set(environment), (
                f"{container['name']}: {SECRET_VARIABLES & set(environment)}"
            )


def test_each_pod_reads_the_shared_configmap_then_its_own(objects: list[Object]) -> None:
    for _, spec in _workloads(objects):
        (container,) = spec["containers"]
        own = TOPICS_CONFIGMAP if container["args"][0] in WITHOUT_DATABASE else SECRET_FILES
        assert container["envFrom"] == [{"configMapRef": {"name": CONFIGMAP}}, {"configMapRef": {"name": own}}]


def test_every_secret_is_a_read_only_file_only_the_service_user_can_read(objects: list[Object]) -> None:
    for _, spec in _workloads(objects):
        secrets = {volume["name"]: volume["secret"] for volume in spec["volumes"] if "secret" in volume}
        assert secrets, "every pod mounts its principal's Secret"
        for secret in secrets.values():
            # Root's files, group fsGroup: 0440 (or 0400, which the kubelet widens to 0440 for fsGroup), never others.
            assert secret["defaultMode"] in {0o400, 0o440}, oct(secret["defaultMode"])
            assert not any("mode" in item for item in secret.get("items", []))
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"] == USER_ID
        for container in spec["containers"]:
            for mount in container["volumeMounts"]:
                assert mount["readOnly"] is True, f"{container['name']}: {mount['mountPath']}"
                if mount["name"] in secrets:
                    assert mount["mountPath"] == SECRETS_DIR


def test_every_file_a_pod_is_told_to_read_is_in_a_volume_it_mounts(objects: list[Object]) -> None:
    built = {(obj["kind"], obj["metadata"]["name"]) for obj in objects}
    for _, spec in _workloads(objects):
        for container in spec["containers"]:
            mounts = _mounts(objects, spec, container)
            environment = _environment(objects, container)
            volumes = {volume["name"]: volume for volume in spec["volumes"]}
            sources = {mount["mountPath"].rstrip("/"): volumes[mount["name"]] for mount in container["volumeMounts"]}
            for variable, path in _named_files(environment, mounts).items():
                directory = _mount_of(mounts, path)
                assert directory, f"{container['name']}: {variable}={path} is in no volume it mounts"
                kind, name, _ = _volume_source(sources[directory])
                # The file is a key of the Secret or ConfigMap mounted there (where the build has it).
                if (kind, name) in built or name in OVERLAY_SUPPLIES:
                    assert _file(mounts, path) is not None, (
                        f"{container['name']}: {variable}: {kind} {name} lacks {path}"
                    )


def test_the_base_holds_no_secret_and_the_overlay_only_example_values() -> None:
    assert not [obj for obj in _build(BASE) if obj["kind"] == "Secret"], "the base holds no secret"
    secrets = [obj for obj in _build(OVERLAY) if obj["kind"] == "Secret"]
    assert {obj["metadata"]["name"] for obj in secrets} >= {SERVICE_SECRET, TOPICS_SECRET}
    for secret in secrets:
        for key, value in (_data(secrets, "Secret", secret["metadata"]["name"]) or {}).items():
            if re.search(r"password|token|secret", key):
                # Unmistakably a placeholder: never a value that could be a real password.
                assert value.startswith("EXAMPLE-ONLY-"), f"{secret['metadata']['name']} {key}"
    service = _data(secrets, "Secret", SERVICE_SECRET) or {}
    url = service["database-url"]
    # The password is a secret of its own (ORDERS_DATABASE_PASSWORD_FILE), so the URL holds none.
    assert re.match(r"postgresql\+asyncpg://[^:@/]+@", url), "the example URL carries no password"


def test_each_pod_runs_as_its_own_service_account_without_a_token(objects: list[Object]) -> None:
    for name in (SERVICE_ACCOUNT, TOPICS_ACCOUNT):
        assert _the(objects, "ServiceAccount", name)["automountServiceAccountToken"] is False

    for _, spec in _workloads(objects):
        assert spec["automountServiceAccountToken"] is False
        topics = spec["containers"][0]["args"][0] in WITHOUT_DATABASE
        assert spec["serviceAccountName"] == (TOPICS_ACCOUNT if topics else SERVICE_ACCOUNT)


def test_the_topics_job_has_its_own_principal_and_no_database_secret(
    objects: list[Object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, spec = _topics_job(objects)
    (container,) = spec["containers"]

    # Its own Secret only, at the path where the service's pods have theirs; never the service's
    mounted = {_volume_source(volume)[:2] for volume in spec["volumes"]}
    assert ("Secret", TOPICS_SECRET) in mounted
    assert {name for kind, name in mounted if kind == "Secret"} == {TOPICS_SECRET}
    topics_secret = _data(objects, "Secret", TOPICS_SECRET)
    if topics_secret is not None:
        assert not [key for key in topics_secret if key.startswith("database")], "no database secret"
    # And nothing of the database in its environment: no URL, no password, no file naming them
    environment = _environment(objects, container)
    assert not [name for name in environment if name.startswith(f"{ENV_PREFIX}DATABASE")]

    # With SASL, it logs in as another principal than the service's, with another password
    topics = _settings(objects, spec, container, tmp_path / "topics", monkeypatch)
    for _, service_spec in _service_pods(objects):
        service = _settings(objects, service_spec, service_spec["containers"][0], tmp_path / "service", monkeypatch)
        assert topics.kafka_security_protocol == service.kafka_security_protocol
        if not topics.kafka_security_protocol.startswith("SASL_"):
            continue
        if topics.kafka_sasl_mechanism == "OAUTHBEARER":
            assert topics.kafka_oauth_client_id != service.kafka_oauth_client_id
            assert topics.kafka_oauth_client_secret != service.kafka_oauth_client_secret
        else:
            assert topics.kafka_sasl_username != service.kafka_sasl_username
            assert topics.kafka_sasl_password != service.kafka_sasl_password


def test_the_base_is_plaintext_and_the_example_overlay_secured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base, overlay = _build(BASE), _build(OVERLAY)

    # The base names no security setting: PLAINTEXT Kafka, no TLS file, no principal
    for _, spec in _workloads(base):
        environment = _environment(base, spec["containers"][0])
        assert not [name for name in environment if name.startswith(f"{ENV_PREFIX}KAFKA_") and "BOOTSTRAP" not in name]

    # The example overlay: SASL_SSL with SCRAM-SHA-512, the brokers' CA, PostgreSQL verified with verify-full
    for _, spec in _service_pods(overlay):
        settings = _settings(overlay, spec, spec["containers"][0], tmp_path, monkeypatch)
        assert settings.kafka_security_protocol == "SASL_SSL"
        assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
        assert settings.kafka_ssl_cafile
        assert settings.kafka_sasl_password is not None
        query = parse_qs(settings.database_url.get_secret_value().partition("?")[2])
        assert query["sslmode"] == ["verify-full"]
        assert query["sslrootcert"]
        assert settings.database_password is not None


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

"""scripts/new-service starts a new service from this one (issue 15): the copy carries the team's names, and
its own unit tests and an integration test on real PostgreSQL and Kafka pass in it.

The copy runs in a virtualenv of its own that borrows this checkout's pinned packages but not its editable
install: with only PYTHONPATH, the checkout's install would still map `service.migrations`, and any module
the copy lacks, back to the checkout, and the copy would test the template's code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.slow

SCAFFOLD = ROOT / "scripts" / "new-service"
NAMES = ["--name", "catalog-service"]  # the rest derived: catalog, CATALOG_, catalog_, catalog.*
ENV_PREFIX = "CATALOG_"
# Where ORDERS_ may remain: a constant of the benchmark's sample, not a variable.
ORDERS_LEFT = {"ORDERS_PER_BLOCK"}
INTEGRATION_TEST = "tests/integration/test_consumer.py::test_the_same_record_delivered_twice_has_one_effect"


def new_service(target: Path, *names: str) -> subprocess.CompletedProcess[str]:
    """Run the scaffold into `target`."""
    return subprocess.run(
        [sys.executable, str(SCAFFOLD), str(target), *names], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """catalog-service, made by the scaffold from this working tree."""
    target = tmp_path_factory.mktemp("scaffold") / "catalog-service"
    result = new_service(target, *NAMES)
    assert result.returncode == 0, result.stdout + result.stderr
    return target


@pytest.fixture(scope="module")
def python(copy: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a virtualenv with the copy installed (editable) over this checkout's packages."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    interpreter = str(venv / "bin" / "python")
    purelib = subprocess.run(
        [interpreter, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # A plain path line: the checkout's packages, without running the .pth of its editable install.
    Path(purelib, "template-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install = [interpreter, "-m", "pip", "install", "--quiet", "--no-deps", "--editable", str(copy)]
    result = subprocess.run(install, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return interpreter


def copy_env(copy: Path) -> dict[str, str]:
    """This environment without the template's variables, with the test addresses under the copy's prefix."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ORDERS_", "PYTEST_"))}
    # Its own template database, so that it never meets this run's.
    dbname = os.environ.get("ORDERS_TEST_DBNAME", "order_service_test") + "_copy"
    return env | {
        "PYTHONPATH": str(copy),
        f"{ENV_PREFIX}TEST_PG_PORT": os.environ.get("ORDERS_TEST_PG_PORT", "55432"),
        f"{ENV_PREFIX}TEST_KAFKA": os.environ.get("ORDERS_TEST_KAFKA", "127.0.0.1:19092"),
        f"{ENV_PREFIX}TEST_DBNAME": dbname,
    }


def pytest_in(copy: Path, python: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest in the copy, with the copy's interpreter."""
    command = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(command, cwd=copy, env=copy_env(copy), capture_output=True, text=True, timeout=300)


def texts(copy: Path) -> dict[str, str]:
    """Every text file of the copy, by its path."""
    found = {}
    for path in copy.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            try:
                found[path.relative_to(copy).as_posix()] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
    return found


def test_the_copy_carries_the_teams_names(copy: Path) -> None:
    project = tomllib.loads((copy / "pyproject.toml").read_text())
    config = (copy / "service" / "config.py").read_text()
    files = texts(copy)

    assert project["project"]["name"] == "catalog-service"
    assert project["project"]["scripts"] == {"catalog-service": "service.__main__:main"}
    assert "service.catalog" in project["tool"]["setuptools"]["packages"]
    assert 'ENV_PREFIX = "CATALOG_"' in config
    assert 'metrics_prefix="catalog"' in (copy / "service" / "catalog" / "domain.py").read_text()
    assert 'source_topic: str = Field(default="catalog"' in config
    # The compose file's topics are the copy's: its source topic, created with `topics apply` from its image
    assert "SOURCE_TOPIC: catalog\n" in files["docker-compose.yml"]
    assert 'command: ["topics", "apply", "--create-source"]' in files["docker-compose.yml"]
    dashboards = files["deploy/prometheus/alerts.yml"] + files["deploy/grafana/dashboards/catalog-service.json"]
    assert "catalog_consumer_lag" in dashboards
    assert not re.search(r"\borders_", dashboards)


def test_the_domain_package_moved_and_the_old_names_are_gone(copy: Path) -> None:
    files = texts(copy)

    assert not (copy / "service" / "orders").exists()
    assert (copy / "service" / "catalog" / "__init__.py").is_file()
    left = {name for text in files.values() for name in re.findall(r"\bORDERS_[A-Z0-9_]*", text)}
    assert left <= ORDERS_LEFT, left - ORDERS_LEFT
    assert [path for path, text in files.items() if "order-service" in text or "service.orders" in text] == []
    assert not (copy / "scripts" / "new-service").exists(), "the scaffold belongs to the template"


def test_the_copys_unit_tests_pass(copy: Path, python: str) -> None:
    result = pytest_in(copy, python, "tests/unit")

    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert re.search(r"\b\d+ passed\b", result.stdout), result.stdout[-2000:]


def test_an_integration_test_of_the_copy_passes_on_real_postgresql_and_kafka(copy: Path, python: str) -> None:
    result = pytest_in(copy, python, INTEGRATION_TEST)

    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-3000:]
    assert re.search(r"\b1 passed\b", result.stdout), result.stdout[-2000:]


@pytest.mark.parametrize(
    ("names", "says"),
    [
        (["--name", "Inventory_Service"], "--name 'Inventory_Service'"),
        (["--name", "catalog-service", "--domain", "class"], "--domain 'class'"),
        (["--name", "catalog-service", "--domain", "store"], "part of the core"),
        (["--name", "catalog-service", "--env-prefix", "CATALOG"], "--env-prefix 'CATALOG'"),
        (["--name", "catalog-service", "--topic-prefix", "a topic"], "--topic-prefix 'a topic'"),
        ([], "--name"),
    ],
)
def test_bad_names_are_refused_in_one_line_with_exit_code_2(tmp_path: Path, names: list[str], says: str) -> None:
    result = new_service(tmp_path / "copy", *names)

    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert says in result.stderr
    assert not (tmp_path / "copy").exists()


def test_a_target_that_is_not_empty_is_refused(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("someone's\n")

    result = new_service(tmp_path, *NAMES)

    assert result.returncode == 2
    assert "not an empty directory" in result.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["README.md"]

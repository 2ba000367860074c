"""scripts/new-service renders the template (copier.yml, template/) into a small project that depends on this
checkout's core: the project's own scripts/test passes there on real PostgreSQL and Kafka, and `copier update`
brings a later template change into a project that was committed and changed since.

The project's virtualenv borrows this run's installed packages (no download) through a path line, not this
checkout's editable install: its `service` is the core's wheel the scaffold built, installed without
dependencies, and the core's pytest plugin is found through that wheel's entry point, as in a project installed
from an index. The plugins this run has and the project does not are turned off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

from tests.support import ROOT

pytestmark = pytest.mark.slow

NAME, DOMAIN, PREFIX = "shipments-service", "shipments", "SHIPMENTS_"
# Installed here, not in the project: pytest would load them from the borrowed packages.
OTHER_PLUGINS = "-p no:asyncio -p no:pytest_postgresql -p no:anyio -p no:hypothesispytest"
GIT = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def run(*command: str | Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; a failure shows its output."""
    result = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, f"{command}: {result.stdout[-4000:]}{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shipments-service, rendered by the scaffold from this working tree."""
    target = tmp_path_factory.mktemp("new-service") / NAME
    run(sys.executable, ROOT / "scripts" / "new_service.py", target, "--name", NAME, "--domain", DOMAIN, cwd=ROOT)
    return target


def borrow_packages(project: Path) -> None:
    """The project's .venv as scripts/bootstrap leaves it, from this run's packages and the core's wheel."""
    venv = project / ".venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=project)
    python = venv / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=project).stdout
    # Plain path lines: this run's packages (without running its editable install's .pth) and the project.
    Path(purelib.strip(), "borrowed.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n{project}\n")
    (wheel,) = (project / "wheels").glob("*.whl")
    run(python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel, cwd=project)
    stamp = hashlib.sha256((project / "pyproject.toml").read_bytes()).hexdigest()[:16]
    (venv / f".installed-{stamp}").touch()


def test_the_project_is_small_holds_no_core_and_records_its_answers(project: Path) -> None:
    files = [path.relative_to(project).as_posix() for path in project.rglob("*") if path.is_file()]
    answers = yaml.safe_load((project / ".copier-answers.yml").read_text())
    pyproject = (project / "pyproject.toml").read_text()

    assert len(files) < 40, files
    assert not (project / "service").exists()
    assert {"scripts/test", "scripts/demo", "README.md", "docker-compose.yml", "Dockerfile"} <= set(files)
    assert any(name.startswith("deploy/kubernetes/") for name in files)
    assert f"{DOMAIN}/migrations/versions/{DOMAIN}_0001_items.py" in files
    assert answers["core"] == "order-service==0.1.0"
    assert answers["core_wheels"] == "wheels"
    assert answers["_src_path"] == str(ROOT)
    assert answers["_commit"]
    assert '"order-service==0.1.0"' in pyproject
    assert (project / "wheels" / "order_service-0.1.0-py3-none-any.whl").is_file()
    assert os.access(project / "scripts" / "test", os.X_OK)


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["--name", "Shipments", "--domain", DOMAIN], "--name 'Shipments': lower-case words joined by hyphens"),
        (["--name", NAME, "--domain", "service"], "--domain 'service': a lower-case Python identifier"),
        (["--name", NAME, "--domain", DOMAIN, "--env-prefix", "ship"], "--env-prefix 'ship': upper-case, ending in _"),
    ],
)
def test_bad_names_are_one_line_and_exit_2_before_anything_is_written(
    arguments: list[str], says: str, tmp_path: Path
) -> None:
    target = tmp_path / "new"
    command = [sys.executable, str(ROOT / "scripts" / "new_service.py"), str(target), *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    assert result.returncode == 2
    assert result.stderr.startswith(f"new-service: {says}")
    assert result.stderr.count("\n") == 1
    assert not target.exists()


def test_the_projects_scripts_test_passes_on_real_postgresql_and_kafka(project: Path) -> None:
    borrow_packages(project)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ORDERS_", "PYTEST_"))}
    env |= {
        f"{PREFIX}TEST_PG_PORT": os.environ.get("ORDERS_TEST_PG_PORT", "55432"),
        f"{PREFIX}TEST_KAFKA": os.environ.get("ORDERS_TEST_KAFKA", "127.0.0.1:19092"),
        # Its own databases, so that it never meets this run's.
        f"{PREFIX}TEST_DBNAME": os.environ.get("ORDERS_TEST_DBNAME", "order_service_test") + "_new",
        "PYTEST_ADDOPTS": OTHER_PLUGINS,
    }

    result = run(project / "scripts" / "test", cwd=project, env=env)

    assert "4 passed" in result.stdout, result.stdout[-3000:]


def test_copier_update_brings_a_template_change_into_a_project_that_changed_since(tmp_path: Path) -> None:
    env = os.environ | GIT
    # Given the template at v1 in a repository of its own, and a project rendered from it, committed and changed
    template = tmp_path / "template-repo"
    template.mkdir()
    shutil.copy(ROOT / "copier.yml", template)
    shutil.copytree(ROOT / "template", template / "template")
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "v1"], ["tag", "v1"]):
        run("git", *command, cwd=template, env=env)
    project = tmp_path / "project"
    data = ["--data", f"name={NAME}", "--data", f"domain={DOMAIN}", "--data", "core=order-service==0.1.0"]
    run(sys.executable, "-m", "copier", "copy", "--defaults", "--quiet", *data, template, project, cwd=tmp_path)
    model = project / DOMAIN / "model.py"
    own = model.read_text().replace('"item.registered"', '"item.created"')
    model.write_text(own)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the project, its own event name"]):
        run("git", *command, cwd=project, env=env)

    # When the template changes (v2) and the project is updated
    readme = template / "template" / "README.md.jinja"
    readme.write_text(readme.read_text() + "\n## Runbook\n\nWhat to do when {{ name }} pages you.\n")
    for command in (["commit", "-qam", "a runbook section"], ["tag", "v2"]):
        run("git", *command, cwd=template, env=env)
    run(sys.executable, "-m", "copier", "update", "--defaults", "--quiet", cwd=project, env=env)

    # Then the change arrives, the project's own change stays, and the answers name v2
    assert f"What to do when {NAME} pages you." in (project / "README.md").read_text()
    assert model.read_text() == own
    assert yaml.safe_load((project / ".copier-answers.yml").read_text())["_commit"] == "v2"

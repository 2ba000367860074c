"""The wheel is the whole service: built with `python -m build`, installed (not editable) into a fresh virtualenv
outside the checkout, it migrates a fresh database and consumes records, as a team deploying from a package
index would run it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE

import psycopg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from service.orders.fakes import Downstream
from tests.support import ROOT, Topics, env_for, eventually, make_engine, produce, rows, scalar, settings_for

pytestmark = pytest.mark.slow

PG_SERVER = f"postgres@127.0.0.1:{os.environ.get('ORDERS_TEST_PG_PORT', '55432')}"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel `python -m build` makes of the checkout, and what the build printed."""
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (wheel,) = out.glob("order_service-*.whl")
    return wheel, result.stdout + result.stderr


@pytest.fixture(scope="module")
def installed(built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bin/` of a fresh virtualenv, outside the checkout, with the wheel and its hashed runtime pins."""
    wheel, _ = built
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps"]
    requirements = ROOT / "requirements" / "runtime.txt"
    subprocess.run([*pip, "--require-hashes", "-r", str(requirements)], check=True, timeout=600)
    subprocess.run([*pip, str(wheel)], check=True, timeout=120)
    return venv / "bin"


@pytest.fixture
def fresh_database() -> Iterator[str]:
    """An empty database (not migrated), dropped afterwards."""
    name = f"wheel_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(f"postgresql://{PG_SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+asyncpg://{PG_SERVER}/{name}"
    with psycopg.connect(f"postgresql://{PG_SERVER}/postgres", autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_wheel_holds_every_module_and_migration_and_the_build_prints_no_deprecation(
    built: tuple[Path, str],
) -> None:
    wheel, output = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    expected = {path.relative_to(ROOT).as_posix() for path in (ROOT / "service").rglob("*.py")}
    expected |= {
        "service/migrations/" + path.relative_to(ROOT / "migrations").as_posix()
        for path in (ROOT / "migrations").rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    # The console's templates and vendored assets travel as package data.
    expected |= {
        path.relative_to(ROOT).as_posix()
        for folder in ("templates", "static")
        for path in (ROOT / "service" / "console" / folder).iterdir()
    }

    assert expected <= names, sorted(expected - names)
    assert "Deprecat" not in output, output
    assert not any(name.startswith(("migrations/", "tests/")) for name in names)


def test_the_installed_command_prints_its_version_from_any_directory(installed: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [str(installed / "order-service"), "--version"], cwd=tmp_path, capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("order-service 0.")


async def test_the_installed_wheel_migrates_a_fresh_database_and_consumes_records_from_outside_the_checkout(
    installed: Path, fresh_database: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    settings = settings_for(fresh_database, kafka, topics, customers_url=downstream.url)
    # Neither the checkout nor its modules are visible to the installed command.
    env = {k: v for k, v in env_for(settings).items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PATH"] = f"{installed}{os.pathsep}{env.get('PATH', '')}"

    # Given a fresh database migrated by the installed command, run from a directory outside the checkout
    migrate = await asyncio.create_subprocess_exec(
        installed / "order-service", "migrate", cwd=tmp_path, env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(migrate.communicate(), timeout=120)
    assert migrate.returncode == 0, err.decode()
    assert "latest revision" in out.decode()

    # When it consumes a handful of orders
    await produce(kafka, topics.source, [(f"W-{n}", placed_order(f"W-{n}"), {}) for n in range(5)])
    log = (tmp_path / "consume.log").open("wb")
    consumer = await asyncio.create_subprocess_exec(
        installed / "order-service", "consume", cwd=tmp_path, env=env, stdout=log, stderr=log
    )
    engine: AsyncEngine = make_engine(fresh_database)
    try:
        # Then every record is processed into the inbox and an order
        await eventually(
            lambda: scalar(engine, "SELECT count(*) = 5 FROM inbox WHERE status = 'processed'"), timeout=60
        )
        orders = await rows(engine, "SELECT order_id, status FROM orders ORDER BY order_id")
        assert orders == [{"order_id": f"W-{n}", "status": "placed"} for n in range(5)]
    finally:
        consumer.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(consumer.wait(), timeout=60)
        log.close()
        await engine.dispose()
    assert code == 0, (tmp_path / "consume.log").read_text(errors="replace")[-3000:]


def placed_order(order_id: str) -> dict[str, object]:
    """An `order.placed.v1` for a known tenant and an active customer."""
    return {
        "schema": "order.placed.v1",
        "order_id": order_id,
        "tenant": "acme",
        "customer_id": "c-1",
        "currency": "EUR",
        "items": [{"sku": "sku-1", "quantity": 1, "unit_price_cents": 500}],
    }

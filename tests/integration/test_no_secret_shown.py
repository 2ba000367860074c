"""No secret is ever shown (contract §11): every command runs with a canary in every secret setting, at
`ORDERS_LOG_LEVEL=debug` (the level that shows stack traces), against a real database and broker, and nothing it
prints — its help, its output, its log lines, its one-line failures — holds a canary.

The secrets are taken from the settings themselves (`secret_fields`: the one place that says which settings are
secret), so a secret setting added later is covered without touching this test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from service.config import secret_fields
from service.orders.fakes import Downstream
from service.orders.settings import OrderSettings
from tests.support import ROOT, Topics, wait_until

pytestmark = pytest.mark.slow

CANARY = "canary-7Qz"


def canaries(database_url: str, kafka: str, topics: Topics, downstream: Downstream) -> dict[str, str]:
    """The environment: a distinct canary in each secret setting the service has (its database password in the URL
    as well), the rest pointing at this test's database, broker and fake downstreams."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    user_host = database_url.removeprefix("postgresql+asyncpg://")
    user, _, rest = user_host.partition("@")
    secrets = {
        "database_url": f"postgresql+asyncpg://{user}:{CANARY}-url@{rest}",
        "console_tokens": f"ann:operator:{CANARY}-console-{'x' * 32}",
    }
    for field in secret_fields(OrderSettings):
        env[f"ORDERS_{field.upper()}"] = secrets.get(field, f"{CANARY}-{field}")
    return env | {
        "ORDERS_KAFKA_BOOTSTRAP_SERVERS": kafka,
        "ORDERS_SOURCE_TOPIC": topics.source,
        "ORDERS_CONSUMER_NAME": f"{topics.source}-consumer",
        "ORDERS_RETRY_TIERS": "1s,2s",
        "ORDERS_METRICS_PORT": "0",
        "ORDERS_LOG_LEVEL": "debug",
        "ORDERS_CUSTOMERS_URL": downstream.url,
        "ORDERS_PAYMENTS_URL": downstream.url,
        "ORDERS_EMAILS_URL": downstream.url,
        "ORDERS_CONSOLE_BIND": f"127.0.0.1:{_free_port()}",
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(env: dict[str, str], *args: str) -> str:
    """A short command's whole output (stdout and stderr)."""
    done = subprocess.run(
        [sys.executable, "-m", "service", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return done.stdout + done.stderr


SHORT = [
    ("--help",),
    ("--version",),
    ("migrate",),
    ("migrate", "--help"),
    ("quarantine", "list"),
    ("quarantine", "list", "--json"),
    ("quarantine", "stats", "--json"),
    ("quarantine", "show", "nope/0/0"),
    ("quarantine", "show", "--help"),
    ("quarantine", "resolve", "--error-code", "INVALID_FIELD", "--reason", "r", "--author", "a", "--dry-run"),
    ("reprocess", "--error-code", "INVALID_FIELD", "--reason", "r", "--author", "a", "--dry-run"),
    ("reprocess", "list"),
    ("reprocess", "--help"),
    ("effects", "list", "--json"),
    ("effects", "--help"),
    ("reconcile", "--json"),
    ("reconcile", "--help"),
    ("parked", "list"),
    ("outbox", "set-aside"),
    ("consume", "--help"),
    ("relay", "--help"),
    ("run", "--help"),
    ("console", "--help"),
]
LONG = [("run",), ("consume",), ("relay",), ("effects",), ("console",)]


def test_no_command_shows_a_secret_at_any_log_level(
    database_url: str, kafka: str, topics: Topics, downstream: Downstream, tmp_path: Path
) -> None:
    env = canaries(database_url, kafka, topics, downstream)
    printed: dict[str, str] = {}

    # When every short command runs, and its help
    for args in SHORT:
        printed[" ".join(args)] = run(env, *args)

    # And every long-running one runs for a moment and is stopped
    for args in LONG:
        log = tmp_path / f"{args[0]}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "service", *args], cwd=ROOT, env=env, stdout=out, stderr=out
            )
            try:
                assert wait_until(lambda log=log: log.stat().st_size > 200, timeout=30), log.read_text()
            finally:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
        printed[args[0]] = log.read_text(errors="replace")

    # Then none of it holds a secret
    leaked = {command: _around(text) for command, text in printed.items() if CANARY in text}
    assert not leaked, leaked
    assert any("database" in text for text in printed.values())  # (the commands did run: they talked of it)


def _around(text: str) -> str:
    """The line that leaked, to say where."""
    index = text.index(CANARY)
    return text[max(0, index - 200) : index + 50]

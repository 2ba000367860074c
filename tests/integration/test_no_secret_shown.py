"""No secret is ever shown (contract §11): every command of the command line runs with a canary in every secret
setting, at `ORDERS_LOG_LEVEL=debug` (the level that shows stack traces), against a real database and broker, and
nothing it prints — its help, its output, its log lines, its one-line failures — holds a canary; nor does anything a
long-running process serves (`/metrics`, `/healthz`, `/readyz`) or the console (every page, API answer and action's
dry run, its login). Against the secured broker's SCRAM and OAUTHBEARER listeners, a canary password or client
secret is refused, and the lines that say so hold no canary either.

The secrets are taken from the settings themselves (`secret_fields`: the one place that says which settings are
secret), the commands and the console's routes from the command line and the console themselves, so a secret
setting, command or page added later is covered (a command this file does not know how to run fails
`test_every_command_is_run`).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy.ext.asyncio import AsyncEngine

from service.cli import command
from service.config import secret_fields
from service.console.routes import ROUTES
from service.orders.domain import DOMAIN
from service.orders.fakes import Downstream
from service.orders.settings import OrderSettings
from tests.support import ROOT, Topics, eventually, produce, scalar
from tests.support.orders import placed
from tests.support.secured import Listener, SecuredKafka

pytestmark = pytest.mark.slow

CANARY = "canary-7Qz"
CONSOLE_TOKEN = f"{CANARY}-console-{'x' * 32}"

# What the commands act on, filled in once the consumer has made it: a quarantined record (its key held), and an
# effect whose first attempts failed.
FAILURE, EFFECT, KEY = "{failure}", "{effect}", "K-1"
MISSING = "999999"  # an id nothing has: the command looks it up and says so
SHORT: list[tuple[str, ...]] = [
    ("--help",),
    ("--version",),
    ("migrate",),
    ("status",),
    ("status", "--json"),
    ("reconcile", "--json", "--max-seconds", "10"),
    ("quarantine", "list"),
    ("quarantine", "list", "--json"),
    ("quarantine", "stats", "--json"),
    ("quarantine", "show", FAILURE),
    ("quarantine", "show", "nope/0/0"),
    ("quarantine", "resolve", "--error-code", "INVALID_FIELD", "--reason", "r", "--author", "a", "--dry-run"),
    ("quarantine", "annotate", FAILURE, "--note", "n", "--author", "a", "--dry-run"),
    ("quarantine", "erase", FAILURE, "--author", "a", "--dry-run"),
    ("quarantine", "edit", FAILURE, "--set-header", "fixed-by=a", "--author", "a", "--dry-run"),
    ("quarantine", "approve-edit", MISSING, "--author", "a"),
    ("quarantine", "reject-edit", MISSING, "--author", "a"),
    ("reprocess", "--error-code", "INVALID_FIELD", "--reason", "r", "--author", "a", "--dry-run"),
    ("reprocess", "list"),
    ("reprocess", "show", MISSING),
    ("effects", "list", "--json", "--state", "sent"),
    ("effects", "show", EFFECT),
    ("effects", "retry", "--kind", "payment.capture", "--reason", "r", "--author", "a", "--dry-run"),
    ("parked", "list"),
    ("parked", "release", KEY, "--author", "a", "--dry-run"),
    ("outbox", "set-aside"),
    ("outbox", "put-back", MISSING, "--author", "a", "--dry-run"),
    ("topics", "plan"),
    ("topics", "apply", "--dry-run"),
    ("topics", "acls", "--principal", "User:x"),
    ("topics", "acls", "--principal", "User:x", "--kafka-acls"),
]
LONG = ["run", "consume", "relay", "effects", "console"]
# A value for each path parameter of the console's routes, so that every route is asked for.
PATH_VALUES = {
    "failure_id": FAILURE,
    "key": EFFECT,
    "run_id": MISSING,
    "launch": "0123456789abcdef",
    "edit_id": MISSING,
}
QUERIES = {"/keys/detail": {"key": KEY, "consumer": "{consumer}"}}
# An action's form without `confirm`: each answers its dry run (a reveal shows the payload, audited).
ACTION_FORM = {
    "failure_id": FAILURE,
    "note": "n",
    "reason": "r",
    "key": KEY,
    "consumer": "{consumer}",
    "payload": '{"schema": "order.placed.v1"}',
    "set_headers": "fixed-by=a",
    "edit_id": MISSING,
    "decision": "reject",
}
NOT_ACTIONS = {"/login", "/logout"}  # the login is driven as a browser does it


def canaries(database_url: str, kafka: str, topics: Topics, downstream: Downstream) -> dict[str, str]:
    """The environment: a distinct canary in each secret setting the service has (its database password in the URL
    as well), the rest pointing at this test's database, broker and fake downstreams."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    user_host = database_url.removeprefix("postgresql+asyncpg://")
    user, _, rest = user_host.partition("@")
    secrets = {
        "database_url": f"postgresql+asyncpg://{user}:{CANARY}-url@{rest}",
        "console_tokens": f"ann:operator:{CONSOLE_TOKEN}",
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


def test_every_command_is_run() -> None:
    # Given every command of the command line (a group that acts on its own, as `effects` does, is one too)
    commands = set(_commands(_cli()))

    # Then this file runs each of them, a short one to its end, a long-running one for a moment
    run = {_command_of(args) for args in SHORT if not args[0].startswith("-")} | {(name,) for name in LONG}
    assert commands - run == set(), "run these commands in test_no_secret_shown.py (SHORT or LONG)"
    assert run - commands == set(), "these are no commands (any more)"


async def test_no_command_page_or_metric_shows_a_secret(
    database_url: str, kafka: str, topics: Topics, downstream: Downstream, engine: AsyncEngine, tmp_path: Path
) -> None:
    env = canaries(database_url, kafka, topics, downstream)
    consumer = env["ORDERS_CONSUMER_NAME"]
    printed: dict[str, str] = {}

    # When every command's help is asked for (in this process: help reads no setting, and costs no start-up)
    printed |= _helps(env)

    # And the long-running processes run, each with its own metrics port, on records that leave something to show:
    # a malformed one and an invalid one quarantined, a placement whose payment fails twice
    ports = {name: _free_port() for name in LONG if name != "console"}
    downstream.fail_next("payments.post", times=2, status=500)
    async with _Running(env, ports, tmp_path) as running:
        await produce(
            kafka,
            topics.source,
            [
                (KEY, b"{not json", {}),
                ("A-2", placed("A-2") | {"items": []}, {}),
                ("A-1", placed("A-1"), {}),
            ],
            partition=0,
        )
        await eventually(lambda: _made(engine), timeout=60)
        values = {"failure": f"{topics.source}/0/0", "effect": "A-1/payment.capture", "consumer": consumer}

        # And everything the processes serve is read
        served = await _served(env, ports, values)

    # And every short command runs on what they left (after them: at debug, their logging would slow it down)
    outputs = await _short_commands(env, [_filled(args, values) for args in SHORT])
    printed |= outputs | served | running.logs

    # Then they ran their real paths (no usage error, the records shown, the broker asked) ...
    assert not [name for name, text in outputs.items() if re.search(r"\(see order-service .*--help\)", text)]
    assert "MALFORMED_PAYLOAD" in outputs[f"quarantine show {values['failure']}"]
    assert "payment.capture" in outputs[f"effects show {values['effect']}"]
    assert topics.quarantine in outputs["topics plan"]
    assert "orders_" in served["GET /metrics (run)"]
    assert "MALFORMED_PAYLOAD" in served["GET /quarantine"]

    # ... and none of it holds a secret
    leaked = {name: _around(text) for name, text in printed.items() if CANARY in text}
    assert not leaked, leaked


@pytest.mark.parametrize("listener", ["scram", "oauth"])
async def test_a_canary_login_refused_by_the_secured_broker_is_not_shown(
    listener: Listener,
    database_url: str,
    kafka: str,
    topics: Topics,
    downstream: Downstream,
    secured_kafka: SecuredKafka,
    tmp_path: Path,
) -> None:
    # Given the service's secured settings with a canary for the password (SCRAM) or the client secret (OAuth)
    env = canaries(database_url, kafka, topics, downstream)
    secret = "ORDERS_KAFKA_SASL_PASSWORD" if listener == "scram" else "ORDERS_KAFKA_OAUTH_CLIENT_SECRET"
    env |= secured_kafka.kafka_env(listener, "service") | {secret: env[secret]}
    refused = "Kafka refused the login" if listener == "scram" else "the OAuth token endpoint refused"

    # When a consumer starts and a few short commands run meanwhile, at debug (stack traces, the Kafka client's own
    # lines) and at info (a failure's one line, explained)
    commands = [("topics", "plan"), ("quarantine", "list")]
    async with _Running(env, {"consume": 0}, tmp_path, names=["consume"]) as running:
        debug, info = await asyncio.gather(
            _short_commands(env, commands), _short_commands(env | {"ORDERS_LOG_LEVEL": "info"}, commands)
        )
        await eventually(lambda: _logged(running, "consume", refused), timeout=60)
    printed = debug | {f"{name} (info)": text for name, text in info.items()} | running.logs

    # Then the broker (or its token endpoint) refused each, and what they printed says so without the canary
    assert refused in info["topics plan"], info["topics plan"]
    leaked = {name: _around(text) for name, text in printed.items() if CANARY in text}
    assert not leaked, leaked


@functools.cache
def _cli() -> Any:
    """The command line's click command, built once."""
    return command(DOMAIN)


def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command's path: the leaves, and the groups that act when named alone."""
    if path and getattr(group, "invoke_without_command", False):
        yield path
    for name, sub in group.commands.items():
        if hasattr(sub, "commands"):
            yield from _commands(sub, (*path, name))
        else:
            yield (*path, name)


def _command_of(args: Sequence[str]) -> tuple[str, ...]:
    """The command a command line runs (its leading command names)."""
    node = _cli()
    path: tuple[str, ...] = ()
    for word in args:
        sub = getattr(node, "commands", {}).get(word)
        if sub is None:
            break
        node, path = sub, (*path, word)
    return path


def _helps(env: dict[str, str]) -> dict[str, str]:
    """Every group's and command's `--help`."""
    app = _cli()
    paths = {(), *_commands(app)} | {path[:i] for path in _commands(app) for i in range(1, len(path))}
    runner = CliRunner()
    shown = {}
    for path in sorted(paths):
        result = runner.invoke(app, [*path, "--help"], env=env, prog_name="order-service")
        assert result.exit_code == 0, (path, result.output)
        shown[" ".join((*path, "--help"))] = result.output
    return shown


def _filled(args: tuple[str, ...], values: dict[str, str]) -> tuple[str, ...]:
    return tuple(_fill(arg, values) for arg in args)


def _fill(text: str, values: dict[str, str]) -> str:
    """`text` with its placeholders (`{failure}`, `{effect}`, `{consumer}`) filled in."""
    for name, value in values.items():
        text = text.replace(f"{{{name}}}", value)
    return text


async def _made(engine: AsyncEngine) -> bool:
    """Whether the consumer quarantined both bad records and the effects worker tried the payment."""
    quarantined = await scalar(engine, "SELECT count(*) FROM quarantine")
    tried = await scalar(engine, "SELECT count(*) FROM effects WHERE attempts > 0")
    return bool(quarantined >= 2 and tried >= 1)


async def _short_commands(env: dict[str, str], commands: Sequence[tuple[str, ...]]) -> dict[str, str]:
    """Each short command's whole output (stdout and stderr), a few run at a time."""
    at_once = asyncio.Semaphore(max(2, (os.cpu_count() or 2) * 2))

    async def one(args: tuple[str, ...]) -> tuple[str, str]:
        async with at_once:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "service", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
            )
            out, err = await asyncio.wait_for(process.communicate(), timeout=120)
        return " ".join(args), (out + err).decode(errors="replace")

    return dict(await asyncio.gather(*(one(args) for args in commands)))


class _Running:
    """The long-running processes, started together, each logging to its own file; stopped (SIGTERM) at the end."""

    def __init__(self, env: dict[str, str], ports: dict[str, int], tmp_path: Path, names: Sequence[str] = LONG) -> None:
        self.env, self.ports, self.names = env, ports, names
        self.log_paths = {name: tmp_path / f"{name}.log" for name in names}
        self.logs: dict[str, str] = {}
        self._processes: dict[str, asyncio.subprocess.Process] = {}

    async def __aenter__(self) -> _Running:
        for name in self.names:
            env = self.env | {"ORDERS_METRICS_PORT": str(self.ports.get(name, 0))}
            with self.log_paths[name].open("wb") as out:
                self._processes[name] = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "service", name, cwd=ROOT, env=env, stdout=out, stderr=out
                )
        return self

    async def __aexit__(self, *exc: object) -> None:
        exited = [name for name, process in self._processes.items() if process.returncode is not None]
        await asyncio.gather(*(self._stop(process) for process in self._processes.values()))
        self.logs = {name: self.log(name) for name in self.names}
        if exc[0] is None:  # each ran its real path until it was stopped
            assert not exited, {name: self.logs[name][-2000:] for name in exited}

    def log(self, name: str) -> str:
        """What a process has logged so far."""
        return self.log_paths[name].read_text(errors="replace")

    @staticmethod
    async def _stop(process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def _logged(running: _Running, name: str, text: str) -> bool:
    return text in running.log(name)


async def _served(env: dict[str, str], ports: dict[str, int], values: dict[str, str]) -> dict[str, str]:
    """Everything the processes serve: each one's metrics and probes, and every console route, as the operator (its
    token a bearer, and once through the login form) and as a stranger with a wrong token."""
    console = f"http://{env['ORDERS_CONSOLE_BIND']}"
    shown: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=30) as http:

        async def listening() -> bool:
            for url in [console, *(f"http://127.0.0.1:{port}" for port in ports.values())]:
                try:
                    await http.get(f"{url}/healthz")
                except httpx.TransportError:
                    return False
            return True

        await eventually(listening, timeout=30)
        for name, port in ports.items():
            for path in ("/metrics", "/healthz", "/readyz"):
                shown[f"GET {path} ({name})"] = _text(await http.get(f"http://127.0.0.1:{port}{path}"))

        bearer = {"Authorization": f"Bearer {CONSOLE_TOKEN}"}
        for route in ROUTES:
            methods = getattr(route, "methods", None) or {"GET"}
            path = re.sub(r"\{(\w+)(:\w+)?\}", lambda part: PATH_VALUES[part[1]], route.path)
            path = _fill(path, values)
            if "GET" in methods:
                query = {name: _fill(value, values) for name, value in QUERIES.get(route.path, {}).items()}
                shown[f"GET {path}"] = _text(await http.get(console + path, params=query, headers=bearer))
            elif route.path not in NOT_ACTIONS:
                form = {name: _fill(value, values) for name, value in ACTION_FORM.items()}
                shown[f"POST {path}"] = _text(await http.post(console + path, data=form, headers=bearer))
        wrong = {"Authorization": f"Bearer {CANARY}-wrong-{'y' * 32}"}
        shown["GET / (a wrong token)"] = _text(await http.get(console + "/", headers=wrong))

    async with httpx.AsyncClient(base_url=console, timeout=30) as browser:
        page = await browser.get("/login")
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert csrf, page.text
        logged_in = await browser.post("/login", data={"csrf": csrf[1], "token": CONSOLE_TOKEN, "next": "/"})
        assert logged_in.status_code == 303, logged_in.text
        shown["POST /login"] = _text(logged_in)
        shown["GET / (a session)"] = _text(await browser.get("/"))
    return shown


def _text(response: httpx.Response) -> str:
    """A response as the client sees it: status, headers and body."""
    return f"{response.status_code} {response.headers}\n{response.text}"


def _around(text: str) -> str:
    """The line that leaked, to say where."""
    index = text.index(CANARY)
    return text[max(0, index - 200) : index + 50]

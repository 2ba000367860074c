"""What goes wrong on secured infrastructure is one line, with its exit code, and shows no secret (contract §11): a
wrong password, a token the issuer refuses or that has expired, a CA that does not sign the broker, a missing ACL, a
missing topic, a secret given twice, a database certificate that does not verify, a non-TLS login where only TLS is
allowed. A long-running process says so once per backoff step and does not exit.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import make_url

from tests.support import ROOT, ServiceProcess, Topics, eventually
from tests.support.secured import PgTls, SecuredAdmin, SecuredKafka, least_privilege

pytestmark = pytest.mark.slow


def base_env(topics: Topics) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    return env | {
        "ORDERS_SOURCE_TOPIC": topics.source,
        "ORDERS_CONSUMER_NAME": f"{topics.source}-svc",
        "ORDERS_RETRY_TIERS": "1s,2s",
        "ORDERS_METRICS_PORT": "0",
    }


async def cli(env: dict[str, str], *args: str) -> tuple[int, str]:
    """A short command: its exit code and everything it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", *args, cwd=ROOT, env=env, stdout=-1, stderr=-1
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode() + err.decode()


def secrets(kafka: SecuredKafka, pg: PgTls) -> list[str]:
    return [
        *(kafka.password(user) for user in ("admin", "service", "intruder")),
        *(kafka.client_secret(client) for client in ("admin", "service", "intruder", "expired")),
        pg.password,
    ]


@pytest.fixture
def topics() -> Topics:
    """Topic names for this test, made on the secured broker by the test that needs them."""
    return Topics(f"s{uuid.uuid4().hex[:10]}")


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("wrong password", "Kafka refused the login"),
        ("wrong client secret", "the OAuth token endpoint refused the client credentials (HTTP 401)"),
        ("expired token", "Kafka refused the login"),
        ("another CA", "Kafka's certificate does not verify"),
        ("no ACL", "not authorized: DESCRIBE"),
    ],
)
async def test_a_short_command_refused_by_the_secured_broker_says_why_in_one_line_and_exits_1(
    case: str,
    expected: str,
    secured_kafka: SecuredKafka,
    secured_admin: SecuredAdmin,
    pg_tls: PgTls,
    topics: Topics,
) -> None:
    # Given the service's settings broken in one way
    await secured_admin.create_test_topics(topics)
    env = base_env(topics)
    if case == "wrong password":
        env |= secured_kafka.kafka_env("scram", "service") | {"ORDERS_KAFKA_SASL_PASSWORD": "not-the-password-42"}
    elif case == "wrong client secret":
        env |= secured_kafka.kafka_env("oauth", "service") | {"ORDERS_KAFKA_OAUTH_CLIENT_SECRET": "not-the-secret-42"}
    elif case == "expired token":
        env |= secured_kafka.kafka_env("oauth", "expired")
    elif case == "another CA":
        env |= secured_kafka.kafka_env("scram", "service") | {"ORDERS_KAFKA_SSL_CAFILE": secured_kafka.other_ca_file}
    else:
        env |= secured_kafka.kafka_env("mtls", "intruder")

    # When a command that asks the broker runs
    code, printed = await cli(env, "topics", "plan")

    # Then it exits 1 with one line that says why, and no secret
    lines = [line for line in printed.splitlines() if line.strip()]
    assert code == 1, printed
    assert len(lines) == 1, printed
    assert expected in lines[0], printed
    assert not [secret for secret in secrets(secured_kafka, pg_tls) if secret in printed]


async def test_a_consumer_without_its_group_acl_says_so_once_per_backoff_step_and_keeps_running(
    secured_kafka: SecuredKafka, secured_admin: SecuredAdmin, pg_tls: PgTls, tls_database_url: str, tmp_path: Path
) -> None:
    # Given the service's principal with every binding of the contract but its group's
    topics = Topics(f"s{uuid.uuid4().hex[:10]}")
    await secured_admin.create_test_topics(topics)
    group = f"{topics.source}-svc"
    await secured_admin.grant(
        *(acl for acl in least_privilege("User:service", topics.source, group) if acl.resource_type != "GROUP")
    )
    env = base_env(topics) | secured_kafka.kafka_env("scram", "service", secrets_in_files=True)
    env |= {"ORDERS_DATABASE_URL": tls_database_url, "ORDERS_RETRY_TIERS": "1s,2s"}

    # When it consumes
    process = ServiceProcess.with_env("consume", env, tmp_path / "consume.log")
    try:
        # Then it names the operation and the group, and goes on waiting (no exit, no crash loop)
        await eventually(lambda: _logged(process, f"not authorized: READ on group {group}"), timeout=60)
        assert process.process.poll() is None, process.log()[-3000:]
    finally:
        assert process.terminate() == 0
    assert "Traceback" not in process.log()
    assert not [secret for secret in secrets(secured_kafka, pg_tls) if secret in process.log()]


@pytest.mark.parametrize(
    ("command", "case", "expected"),
    [
        ("consume", "wrong client secret", "the OAuth token endpoint refused the client credentials (HTTP 401)"),
        ("relay", "wrong client secret", "the OAuth token endpoint refused the client credentials (HTTP 401)"),
        ("consume", "wrong password", "Kafka refused the login"),
        ("consume", "another CA", "Kafka's certificate does not verify"),
    ],
)
async def test_a_long_running_process_refused_by_the_secured_broker_waits_not_ready_saying_why_once_per_step(
    command: str,
    case: str,
    expected: str,
    secured_kafka: SecuredKafka,
    secured_admin: SecuredAdmin,
    pg_tls: PgTls,
    tls_database_url: str,
    tmp_path: Path,
) -> None:
    # Given the service's settings broken in one way, its topics and ACLs in place
    topics = Topics(f"s{uuid.uuid4().hex[:10]}")
    await secured_admin.create_test_topics(topics)
    await secured_admin.grant(*least_privilege("User:service", topics.source, f"{topics.source}-svc"))
    port = _free_port()
    env = base_env(topics) | {"ORDERS_DATABASE_URL": tls_database_url, "ORDERS_METRICS_PORT": str(port)}
    if case == "wrong client secret":
        env |= secured_kafka.kafka_env("oauth", "service") | {"ORDERS_KAFKA_OAUTH_CLIENT_SECRET": "not-the-secret-42"}
    elif case == "wrong password":
        env |= secured_kafka.kafka_env("scram", "service") | {"ORDERS_KAFKA_SASL_PASSWORD": "not-the-password-42"}
    else:
        env |= secured_kafka.kafka_env("scram", "service") | {"ORDERS_KAFKA_SSL_CAFILE": secured_kafka.other_ca_file}

    # When the long-running process starts
    process = ServiceProcess.with_env(command, env, tmp_path / f"{command}.log")
    try:
        # Then it says why, once per backoff step (twice here), is not ready, and goes on waiting: no exit, no crash
        await eventually(lambda: _said_twice(process, expected), timeout=60)
        assert process.process.poll() is None, process.log()[-3000:]
        assert await _ready(port) == 503
    finally:
        assert process.terminate() == 0
    assert "Traceback" not in process.log()
    assert not [secret for secret in [*secrets(secured_kafka, pg_tls), "not-the-"] if secret in process.log()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _ready(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code


async def _said_twice(process: ServiceProcess, text: str) -> bool:
    return process.log().count(text) >= 2


async def test_a_secret_given_twice_is_exit_2_and_one_line(secured_kafka: SecuredKafka, topics: Topics) -> None:
    env = base_env(topics) | secured_kafka.kafka_env("scram", "service", secrets_in_files=True)
    env["ORDERS_KAFKA_SASL_PASSWORD"] = secured_kafka.password("service")

    code, printed = await cli(env, "topics", "plan")

    assert (code, printed.strip()) == (
        2,
        "invalid configuration: ORDERS_KAFKA_SASL_PASSWORD and ORDERS_KAFKA_SASL_PASSWORD_FILE are both set: "
        "give the secret one way",
    )


@pytest.mark.parametrize(
    ("sslmode", "ca", "expected"),
    [
        ("verify-full", "other", "the database's certificate does not verify"),
        ("disable", "test", "the database refused the login"),
    ],
    ids=["another CA", "no TLS"],
)
@pytest.mark.parametrize("command", [("quarantine", "stats"), ("migrate",)], ids=["quarantine stats", "migrate"])
async def test_a_database_that_cannot_be_trusted_or_refuses_a_plain_login_is_one_line(
    command: tuple[str, ...],
    sslmode: str,
    ca: str,
    expected: str,
    pg_tls: PgTls,
    tls_database_url: str,
    secured_kafka: SecuredKafka,
) -> None:
    # Given the TLS-only role, reached with another CA, or without TLS
    url = tls_database_url.replace("sslmode=verify-full", f"sslmode={sslmode}")
    if ca == "other":
        url = url.replace(pg_tls.ca_file, pg_tls.other_ca_file)
    env = base_env(Topics("unused")) | {"ORDERS_DATABASE_URL": url}

    # When a command reads the database
    code, printed = await cli(env, *command)

    # Then it exits 1 with one line saying why, and no password
    lines = [line for line in printed.splitlines() if line.strip()]
    assert code == 1, printed
    assert len(lines) == 1, printed
    assert expected in lines[0], printed
    assert pg_tls.password not in printed


async def _logged(process: ServiceProcess, text: str) -> bool:
    return text in process.log()


async def test_migrate_reaches_the_database_over_verify_full(pg_tls: PgTls, tls_database_url: str) -> None:
    # Given the TLS-only role on a migrated database, reached with sslmode=verify-full, its password from a file
    url = pg_tls.database_url(make_url(tls_database_url).database or "", with_password=False)
    env = base_env(Topics("unused")) | {
        "ORDERS_DATABASE_URL": url,
        "ORDERS_DATABASE_PASSWORD_FILE": pg_tls.password_file,
    }

    # When migrate runs, Then it reads the schema's revision over TLS, has nothing to apply, and shows no password
    code, printed = await cli(env, "migrate")
    assert code == 0, printed
    assert "nothing to apply" in printed, printed
    assert pg_tls.password not in printed


async def test_a_missing_topic_on_the_secured_broker_is_named_in_one_line_with_what_to_run(
    secured_kafka: SecuredKafka, secured_admin: SecuredAdmin, pg_tls: PgTls, tls_database_url: str
) -> None:
    # Given the service's principal with exactly its ACLs, and none of its topics created (no automatic creation)
    topics = Topics(f"s{uuid.uuid4().hex[:10]}")
    await secured_admin.grant(*least_privilege("User:service", topics.source, f"{topics.source}-svc"))
    env = base_env(topics) | secured_kafka.kafka_env("scram", "service", secrets_in_files=True)
    env |= {"ORDERS_DATABASE_URL": tls_database_url}

    # When an operator starts a reprocess run, and checks the plan
    code, printed = await cli(env, "reprocess", "--error-code", "MALFORMED_PAYLOAD", "--reason", "fixed", "--yes")
    checked, plan = await cli(env, "topics", "plan", "--check")

    # Then the run exits 1 with one line naming the topic and `topics apply`; the check exits 1 naming what is missing
    assert (code, printed.strip()) == (
        1,
        f"order-service reprocess: topic {topics.reprocess} does not exist: run `order-service topics apply`",
    )
    assert checked == 1, plan
    assert topics.reprocess in plan
    assert not [secret for secret in secrets(secured_kafka, pg_tls) if secret in printed + plan]

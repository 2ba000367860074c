"""The secured infrastructure of contract §11 for integration tests: the secured broker of scripts/kafka-local-secured
(SCRAM-SHA-512 over TLS, mutual TLS, OAUTHBEARER; the authorizer on, no automatic topic creation) and the TLS-only
PostgreSQL role of scripts/pg-local.

`scripts/test` starts both and passes their descriptions (JSON files under .local/, written by those scripts) in
ORDERS_TEST_SECURED and ORDERS_TEST_PG_TLS; without them, the scripts' default paths are read. A test asks for:

- `secured_kafka`: the broker's listeners, users, certificates and OAuth clients; `kafka_env(listener, principal)`
  is the ORDERS_KAFKA_* environment that makes the service connect as that principal (User:service by default).
- `secured_admin`: the super user's admin connection (SCRAM): topics and ACL bindings, each deleted after the test.
- `secured_topics`: a test's topics (as `topics` makes them on the plaintext broker), made by the super user.
- `pg_tls` and `tls_database_url`: the TLS role, and an ORDERS_DATABASE_URL (sslmode=verify-full, the test CA) on
  the test's own database, which the role is granted.

Registered in tests/conftest.py as a plugin, so that every test module sees these fixtures.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote, urlencode

import pytest
from aiokafka.abc import AbstractTokenProvider
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.client import AIOKafkaClient
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest

from tests.support import ROOT, Topics, kafka_reachable

SECURED_DESCRIPTION = Path(
    os.environ.get("ORDERS_TEST_SECURED", ROOT / ".local" / "kafka-secured" / "description.json")
)
PG_TLS_DESCRIPTION = Path(os.environ.get("ORDERS_TEST_PG_TLS", ROOT / ".local" / "pg-tls" / "description.json"))

Listener = Literal["scram", "mtls", "oauth"]
LISTENERS: tuple[Listener, ...] = ("scram", "mtls", "oauth")

# Kafka's wire codes for ACL bindings (org.apache.kafka.common.acl / resource).
RESOURCE_TYPES = {"ANY": 1, "TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"ANY": 1, "LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {
    "ANY": 1,
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}
PERMISSIONS = {"ANY": 1, "DENY": 2, "ALLOW": 3}


def _name_of(codes: dict[str, int], code: int) -> str:
    return next((name for name, value in codes.items() if value == code), str(code))


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL binding: `principal` may do `operation` on the resource (`LITERAL` name or `PREFIXED` names)."""

    principal: str
    resource_type: str
    name: str
    operation: str
    pattern: str = "LITERAL"
    permission: str = "ALLOW"
    host: str = "*"

    def wire(self) -> tuple[int, str, int, str, str, int, int]:
        """The binding as CreateAcls/DeleteAcls (v1) carry it."""
        return (
            RESOURCE_TYPES[self.resource_type],
            self.name,
            PATTERN_TYPES[self.pattern],
            self.principal,
            self.host,
            OPERATIONS[self.operation],
            PERMISSIONS[self.permission],
        )


def least_privilege(principal: str, source: str, group: str, group_pattern: str = "LITERAL") -> list[Acl]:
    """The bindings contract §11 gives the service's principal: READ, WRITE, DESCRIBE and DESCRIBE_CONFIGS on the
    source topic (LITERAL) and on the topics prefixed `<source>.` (PREFIXED); READ and DESCRIBE on its group."""
    topic_operations = ("READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")
    return [
        *(Acl(principal, "TOPIC", source, operation) for operation in topic_operations),
        *(Acl(principal, "TOPIC", f"{source}.", operation, "PREFIXED") for operation in topic_operations),
        *(Acl(principal, "GROUP", group, operation, group_pattern) for operation in ("READ", "DESCRIBE")),
    ]


@dataclass(frozen=True)
class SecuredKafka:
    """The secured broker as scripts/kafka-local-secured describes it."""

    description: dict[str, Any]

    @classmethod
    def load(cls, path: Path = SECURED_DESCRIPTION) -> SecuredKafka:
        """The description at `path`."""
        return cls(json.loads(path.read_text()))

    @property
    def ca_file(self) -> str:
        """The test CA, which signs the broker's certificate."""
        return str(self.description["ca_file"])

    @property
    def other_ca_file(self) -> str:
        """An unrelated CA: a client that trusts only it cannot verify the broker."""
        return str(self.description["other_ca_file"])

    @property
    def token_url(self) -> str:
        """The local OAuth issuer's token endpoint."""
        return str(self.description["oauth"]["token_url"])

    def bootstrap(self, listener: Listener) -> str:
        """The bootstrap address of a listener."""
        return str(self.description["listeners"][listener]["bootstrap"])

    def password(self, user: str) -> str:
        """A SCRAM user's password (admin, service, intruder)."""
        return str(self.description["scram_users"][user]["password"])

    def client_secret(self, client_id: str) -> str:
        """An OAuth client's secret (admin, service, intruder, expired)."""
        return str(self.description["oauth"]["clients"][client_id]["secret"])

    def certificate(self, name: str) -> tuple[str, str]:
        """A client certificate and its key (admin, service, intruder; untrusted_service: another CA's)."""
        cert = self.description["client_certs"][name]
        return str(cert["cert_file"]), str(cert["key_file"])

    def kafka_env(
        self, listener: Listener, principal: str = "service", *, secrets_in_files: bool = False
    ) -> dict[str, str]:
        """The service's settings (contract §11) that connect it to `listener` as User:`principal`; with
        `secrets_in_files`, the password or client secret as `<VARIABLE>_FILE`."""
        protocol = self.description["listeners"][listener]["security_protocol"]
        env = {
            "ORDERS_KAFKA_BOOTSTRAP_SERVERS": self.bootstrap(listener),
            "ORDERS_KAFKA_SECURITY_PROTOCOL": protocol,
            "ORDERS_KAFKA_SSL_CAFILE": self.ca_file,
        }
        if listener == "scram":
            user = self.description["scram_users"][principal]
            env |= {"ORDERS_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "ORDERS_KAFKA_SASL_USERNAME": principal}
            if secrets_in_files:
                env["ORDERS_KAFKA_SASL_PASSWORD_FILE"] = user["password_file"]
            else:
                env["ORDERS_KAFKA_SASL_PASSWORD"] = user["password"]
        elif listener == "mtls":
            env["ORDERS_KAFKA_SSL_CERTFILE"], env["ORDERS_KAFKA_SSL_KEYFILE"] = self.certificate(principal)
        else:
            client = self.description["oauth"]["clients"][principal]
            env |= {
                "ORDERS_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
                "ORDERS_KAFKA_OAUTH_TOKEN_URL": self.token_url,
                "ORDERS_KAFKA_OAUTH_CLIENT_ID": principal,
            }
            if secrets_in_files:
                env["ORDERS_KAFKA_OAUTH_CLIENT_SECRET_FILE"] = client["secret_file"]
            else:
                env["ORDERS_KAFKA_OAUTH_CLIENT_SECRET"] = client["secret"]
        return env

    def settings_fields(self, listener: Listener, principal: str = "service") -> dict[str, str]:
        """`kafka_env` as keyword arguments of the settings class (tests.support.settings_for's overrides)."""
        return {
            name.removeprefix("ORDERS_").lower(): value for name, value in self.kafka_env(listener, principal).items()
        }

    def client_options(
        self,
        listener: Listener,
        principal: str = "service",
        *,
        cafile: str | None = None,
        token_provider: AbstractTokenProvider | None = None,
    ) -> dict[str, Any]:
        """aiokafka's keyword arguments for a plain client of `listener` as `principal` (certificate name for mutual
        TLS); `cafile` replaces the test CA; OAUTHBEARER needs the `token_provider`."""
        certfile, keyfile = self.certificate(principal) if listener == "mtls" else (None, None)
        context = create_ssl_context(cafile=cafile or self.ca_file, certfile=certfile, keyfile=keyfile)
        options: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap(listener),
            "security_protocol": self.description["listeners"][listener]["security_protocol"],
            "ssl_context": context,
        }
        if listener == "scram":
            options |= {
                "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": principal,
                "sasl_plain_password": self.password(principal),
            }
        elif listener == "oauth":
            if token_provider is None:
                raise ValueError("OAUTHBEARER needs a token provider")
            options |= {"sasl_mechanism": "OAUTHBEARER", "sasl_oauth_token_provider": token_provider}
        return options


class SecuredAdmin:
    """The super user's (User:admin, SCRAM) admin connection: topics and ACL bindings, each remembered so that
    `cleanup` deletes exactly what the test made. aiokafka's admin has no ACL calls: the CreateAcls, DeleteAcls and
    DescribeAcls requests (v1, which Kafka 4 still takes) go through its client."""

    def __init__(self, kafka: SecuredKafka) -> None:
        self._options = kafka.client_options("scram", "admin")
        self._admin = AIOKafkaAdminClient(client_id="tests-secured-admin", **self._options)
        self._client = AIOKafkaClient(client_id="tests-secured-acls", **self._options)
        self._topics: set[str] = set()
        self._acls: list[Acl] = []

    async def start(self) -> None:
        """Connect."""
        await self._admin.start()
        await self._client.bootstrap()

    async def close(self) -> None:
        """Disconnect (without cleaning up)."""
        await self._admin.close()
        await self._client.close()

    async def create_topics(self, names: Iterable[str], partitions: int = 1) -> None:
        """Create topics (as the super user: the service's principal has no CREATE)."""
        new = [name for name in names if name not in self._topics]
        if not new:
            return
        self._topics.update(new)
        response = await self._admin.create_topics([NewTopic(name, partitions, 1) for name in new])
        failed = [(name, code) for name, code, *_ in response.topic_errors if code]
        if failed:
            raise AssertionError(f"the secured broker did not create these topics (name, error code): {failed}")

    def track(self, names: Iterable[str]) -> None:
        """Delete these topics (made by someone else: `topics apply`) at cleanup too."""
        self._topics.update(names)

    async def create_test_topics(self, topics: Topics, source_partitions: int = 3) -> None:
        """A test's topics, as the `topics` fixture makes them on the plaintext broker."""
        await self.create_topics([topics.source], source_partitions)
        await self.create_topics(topics.all()[1:])

    async def topic_names(self) -> list[str]:
        """Every topic on the broker."""
        names: list[str] = await self._admin.list_topics()
        return names

    async def grant(self, *acls: Acl) -> None:
        """Create ACL bindings."""
        for acl in acls:
            self._acls.append(acl)
            response = await self._send(CreateAclsRequest(*acl.wire()))
            for code, message in response.creation_responses:
                if code:
                    raise AssertionError(f"CreateAcls {acl}: error {code} {message}")

    async def revoke(self, *acls: Acl) -> None:
        """Delete exactly these ACL bindings."""
        for acl in acls:
            response = await self._send(DeleteAclsRequest(*acl.wire()))
            for code, message, _matching in response.filter_responses:
                if code:
                    raise AssertionError(f"DeleteAcls {acl}: error {code} {message}")
            if acl in self._acls:
                self._acls.remove(acl)

    async def acls(self, principal: str | None = None) -> list[Acl]:
        """The ACL bindings on the broker, of `principal` or of everyone, sorted."""
        request = DescribeAclsRequest(
            RESOURCE_TYPES["ANY"], None, PATTERN_TYPES["ANY"], principal, None, OPERATIONS["ANY"], PERMISSIONS["ANY"]
        )
        response = await self._send(request)
        if response.error_code:
            raise AssertionError(f"DescribeAcls: error {response.error_code} {response.error_message}")
        return sorted(
            Acl(
                principal=acl_principal,
                resource_type=_name_of(RESOURCE_TYPES, resource_type),
                name=name,
                operation=_name_of(OPERATIONS, operation),
                pattern=_name_of(PATTERN_TYPES, pattern),
                permission=_name_of(PERMISSIONS, permission),
                host=host,
            )
            for resource_type, name, pattern, bindings in response.resources
            for acl_principal, host, operation, permission in bindings
        )

    async def cleanup(self) -> None:
        """Delete the ACL bindings and topics this admin made (a topic gone meanwhile is no error)."""
        await self.revoke(*list(self._acls))
        existing = set(await self.topic_names())
        names = sorted(name for name in self._topics if name in existing)
        if names:
            await self._admin.delete_topics(names)
        self._topics.clear()

    async def _send(self, request: Any) -> Any:
        return await self._client.send(self._client.get_random_node(), request)


@dataclass(frozen=True)
class PgTls:
    """The TLS-only role of scripts/pg-local: it logs in only over TLS (hostssl, scram-sha-256)."""

    description: dict[str, Any]

    @classmethod
    def load(cls, path: Path = PG_TLS_DESCRIPTION) -> PgTls:
        """The description at `path`."""
        return cls(json.loads(path.read_text()))

    @property
    def host(self) -> str:
        return str(self.description["host"])

    @property
    def port(self) -> int:
        return int(self.description["port"])

    @property
    def role(self) -> str:
        return str(self.description["role"])

    @property
    def password(self) -> str:
        return str(self.description["password"])

    @property
    def password_file(self) -> str:
        """The password's file, for ORDERS_DATABASE_PASSWORD_FILE."""
        return str(self.description["password_file"])

    @property
    def ca_file(self) -> str:
        """The test CA, which signs the server's certificate."""
        return str(self.description["ca_file"])

    @property
    def other_ca_file(self) -> str:
        """An unrelated CA: a client that trusts only it cannot verify the server."""
        return str(self.description["other_ca_file"])

    def database_url(self, dbname: str, *, with_password: bool = True, sslmode: str = "verify-full") -> str:
        """An ORDERS_DATABASE_URL for `dbname` as the role, verifying the server's certificate and host name with
        the test CA; without the password, give it as ORDERS_DATABASE_PASSWORD(_FILE)."""
        credentials = quote(self.role, safe="")
        if with_password:
            credentials += ":" + quote(self.password, safe="")
        query = urlencode({"sslmode": sslmode, "sslrootcert": self.ca_file}, safe="/")
        return f"postgresql+asyncpg://{credentials}@{self.host}:{self.port}/{quote(dbname, safe='')}?{query}"

    def grant(self, connection: Any) -> None:
        """Let the role use the database `connection` (a superuser's psycopg connection to it) is on: its tables,
        sequences and functions, and creating objects in `public`. Its objects stay the migrating owner's."""
        for statement in (
            "GRANT USAGE, CREATE ON SCHEMA public TO {role}",
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {role}",
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO {role}",
        ):
            connection.execute(statement.format(role=f'"{self.role}"'))
        connection.commit()


@pytest.fixture(scope="session")
def secured_kafka() -> SecuredKafka:
    """The secured broker; the test fails, not skips, when it is not running."""
    if not SECURED_DESCRIPTION.is_file():
        pytest.fail(f"no {SECURED_DESCRIPTION}: run scripts/kafka-local-secured start (scripts/test does)")
    kafka = SecuredKafka.load()
    if not kafka_reachable(kafka.bootstrap("scram")):
        pytest.fail(f"no secured broker at {kafka.bootstrap('scram')}: run scripts/kafka-local-secured start")
    return kafka


@pytest.fixture
async def secured_admin(secured_kafka: SecuredKafka) -> AsyncIterator[SecuredAdmin]:
    """The super user's admin connection; what the test made with it is deleted after the test."""
    admin = SecuredAdmin(secured_kafka)
    await admin.start()
    try:
        yield admin
        await admin.cleanup()
    finally:
        await admin.close()


@pytest.fixture
async def secured_topics(secured_admin: SecuredAdmin) -> Topics:
    """Fresh topic names for this test on the secured broker (source with 3 partitions), made by the super user and
    deleted after the test. No principal but the super users may use them until the test grants ACLs."""
    topics = Topics(f"s{uuid.uuid4().hex[:10]}")
    await secured_admin.create_test_topics(topics)
    return topics


@pytest.fixture(scope="session")
def pg_tls() -> PgTls:
    """The TLS-only PostgreSQL role; the test fails, not skips, when scripts/pg-local has not described it."""
    if not PG_TLS_DESCRIPTION.is_file():
        pytest.fail(f"no {PG_TLS_DESCRIPTION}: run scripts/pg-local start (scripts/test does)")
    return PgTls.load()


@pytest.fixture
def tls_database_url(postgresql: Any, pg_tls: PgTls) -> str:
    """An ORDERS_DATABASE_URL on this test's migrated database as the TLS role (sslmode=verify-full)."""
    pg_tls.grant(postgresql)
    return pg_tls.database_url(postgresql.info.dbname)

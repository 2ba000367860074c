"""One line for an operator, instead of a stack trace: what failed at the edge of a command, and what to do.

The command line (service/cli.py) turns any exception that ends a command into one line on stderr and exit
code 1 (contract §10); a stack trace only at <PREFIX>LOG_LEVEL=debug. The causes an operator can act on are
named: a database that does not exist or is not migrated, one that cannot be reached, a broker that cannot
be reached, a port already in use; and on secured infrastructure (contract §11) a refused login, a certificate that
does not verify, a missing ACL (the operation and the resource), a token endpoint that refuses. Never a secret: the
lines name settings, never their values; the program and the variables are the running service's (`names`: its
settings, or their class).
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import Iterator

from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    KafkaError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnsupportedSaslMechanismError,
)

from service.config import Settings
from service.errors import InfrastructureUnavailable, SchemaNotCurrent, TokenUnavailable, TopicsProblem
from service.store.uow import sqlstate

# PostgreSQL's SQLSTATEs for the causes named here.
_NO_DATABASE = "3D000"  # invalid_catalog_name
_NO_TABLE = "42P01"  # undefined_table
_AUTHENTICATION = ("28000", "28P01")


def causes(error: BaseException) -> Iterator[BaseException]:
    """The error, the members of an exception group, their causes and the driver errors under them."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        for linked in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(linked, BaseException):
                pending.append(linked)


def first_line(error: BaseException) -> str:
    """The first line of an error's message (PostgreSQL's own words, e.g. `database "x" does not exist`)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


Names = Settings | type[Settings]  # the settings (or their class) that name the program and its variables


def _acls(names: Names) -> str:
    return f"`{names.program} topics acls` lists what the service's principal needs"


def kafka_reason(found: list[BaseException], doing: str | None = None, names: Names = Settings) -> str | None:
    """The one line for a Kafka failure on secured infrastructure, or None: a login refused, a certificate that does
    not verify, an operation the broker's ACLs refuse (`doing`: the operation, when the caller knows it: READ for a
    consumer, WRITE for a producer), a token endpoint that gives no token."""
    # A certificate or a TLS handshake is Kafka's only when a Kafka client failed on it (the database's are below).
    kafka = any(isinstance(cause, KafkaError | TokenUnavailable) for cause in found)
    v = names.variable
    for cause in found:
        if isinstance(cause, TokenUnavailable):
            return f"{cause} ({v('kafka_oauth_token_url')}, {v('kafka_oauth_client_id')}, _CLIENT_SECRET)"
        if isinstance(cause, SaslAuthenticationFailed | AuthenticationFailedError):
            return (
                f"Kafka refused the login ({v('kafka_sasl_mechanism')}, {v('kafka_sasl_username')}, "
                f"{v('kafka_sasl_password')}, or the OAuth client)"
            )
        if isinstance(cause, UnsupportedSaslMechanismError):
            return f"Kafka does not take this SASL mechanism ({v('kafka_sasl_mechanism')})"
        if isinstance(cause, ssl.SSLCertVerificationError) and kafka:
            return f"Kafka's certificate does not verify: {cause.verify_message} ({v('kafka_ssl_cafile')})"
        if isinstance(cause, ssl.SSLError) and kafka:
            return f"the TLS handshake with Kafka failed: {cause.reason or type(cause).__name__} ({v('kafka_ssl_')}*)"
        if isinstance(cause, GroupAuthorizationFailedError):
            return f"not authorized: READ on group {_named(cause)} ({_acls(names)})"
        if isinstance(cause, TopicAuthorizationFailedError):
            operation = doing or "DESCRIBE, READ or WRITE"
            return f"not authorized: {operation} on topic {_named(cause)} ({_acls(names)})"
        if isinstance(cause, ClusterAuthorizationFailedError | TransactionalIdAuthorizationFailed):
            return f"not authorized on the cluster: {type(cause).__name__} ({_acls(names)})"
    return None


def _named(error: KafkaError) -> str:
    """The resource an authorization error names (aiokafka puts the topic or the group in its arguments)."""
    names = [str(arg) for arg in error.args if isinstance(arg, str | set | list | tuple | frozenset)]
    return ", ".join(sorted(names)) if names else "(not named by the broker)"


def explain(error: BaseException, names: Names = Settings, *, metrics_port: int | None = None) -> str:
    """One line saying what went wrong and, where there is one, what to do."""
    found = list(causes(error))
    v = names.variable
    for cause in found:
        if isinstance(cause, SchemaNotCurrent | TopicsProblem):
            return str(cause)
    for cause in found:
        state = sqlstate(cause)
        if state == _NO_DATABASE:
            return f"{first_line(cause)} ({v('database_url')})"
        if state == _NO_TABLE:
            return f"the database is not migrated: run `{names.program} migrate`"
        if state in _AUTHENTICATION:
            return f"the database refused the login: {first_line(cause)} ({v('database_url')})"
    kafka = kafka_reason(found, names=names)
    if kafka is not None:
        return kafka
    for cause in found:
        if isinstance(cause, ssl.SSLCertVerificationError):
            reason = cause.verify_message
            return f"the database's certificate does not verify: {reason} ({v('database_url')} sslrootcert)"
    for cause in found:
        if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
            port = f" {metrics_port}" if metrics_port else ""
            return f"port{port} is already in use: set {v('metrics_port')} to a free port (0 disables it)"
    for cause in found:
        if isinstance(cause, InfrastructureUnavailable):
            return f"the database is unreachable ({v('database_url')})"
        if isinstance(cause, KafkaConnectionError):
            return f"Kafka is unreachable ({v('kafka_bootstrap_servers')})"
        if isinstance(cause, KafkaError):
            return f"Kafka failed: {type(cause).__name__} ({v('kafka_bootstrap_servers')})"
        if isinstance(cause, ConnectionError | TimeoutError):
            return f"a connection failed: {type(cause).__name__}"
    return f"unexpected error ({type(error).__name__}); {v('log_level')}=debug shows the stack trace"

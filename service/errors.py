"""The service's exceptions: a small hierarchy, each carrying a stable error code.

Driver and HTTP errors are translated into these at one boundary (the adapters) and keep `__cause__`,
so the state machine only ever sees codes, never library exceptions or their messages.
"""

from __future__ import annotations

from datetime import timedelta

from service.codes import ErrorCode


class ServiceError(Exception):
    """Base of every error the service raises on purpose."""


class RecordFailure(ServiceError):
    """Processing one record failed in a way the state machine classifies by `code`.

    The message is the code itself: never a downstream's response text, which may carry secrets.
    """

    def __init__(
        self,
        code: ErrorCode,
        *,
        retry_after: timedelta | None = None,
        downstream: str | None = None,
        charged: bool = True,
    ):
        super().__init__(code.value)
        self.code = code
        self.retry_after = retry_after
        self.downstream = downstream
        # False while the downstream's breaker is open: no attempt is spent, the record waits `retry_after`.
        self.charged = charged


class DownstreamError(RecordFailure):
    """A downstream HTTP service answered with a transient failure, an answer not its own, or could not be reached,
    or its breaker refused the call."""


class InfrastructureUnavailable(ServiceError):
    """PostgreSQL or Kafka cannot be reached: wait and retry the same work; no record attempt is spent."""


class TokenUnavailable(ServiceError):
    """Kafka's OAuth token endpoint gave no token: an outage of the broker's authentication, waited out
    (service/adapters/oauth.py)."""


class ConcurrentWrite(ServiceError):
    """Another member of the group wrote one of a round's message ids or aggregates first: the round's transaction is
    rolled back and the round redone (it then finds them written); no record attempt is spent."""


class SchemaNotCurrent(ServiceError):
    """The database is not at the schema revision this version needs: never migrated, or older (run `migrate`)."""


class SchemaNewer(SchemaNotCurrent):
    """The database is at a revision this version does not know: a newer release migrated it. `migrate` cannot
    help and waiting cannot either; only that newer release may use it."""


class TopicsProblem(ServiceError):
    """A declared topic cannot be used or changed (contract §11): missing, not authorized, or refused by the broker.
    The message is the one line an operator reads: the topic, and the operation where one was refused."""


class TopicsMissing(TopicsProblem):
    """Topics a process reads or writes do not exist, or may not be described (DESCRIBE on the topic)."""

    def __init__(self, line: str, missing: tuple[str, ...], not_authorized: tuple[str, ...]) -> None:
        super().__init__(line)
        self.missing = missing
        self.not_authorized = not_authorized

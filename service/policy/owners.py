"""Who owns a quarantined record: a queue nobody owns is deferred data loss."""

from __future__ import annotations

from service.domain.codes import ErrorCode, FailureKind

PRODUCERS = "order-producers"
ONCALL = "order-service-oncall"


def owner_for(code: ErrorCode) -> str:
    """Bad input belongs to the team that produced it; exhausted retries belong to this service's on-call."""
    return PRODUCERS if code in _PRODUCER_CODES else ONCALL


_PRODUCER_CODES = frozenset(
    code for code in ErrorCode if code.kind is FailureKind.INVALID and code.name.count("_EXHAUSTED") == 0
)

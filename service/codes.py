"""The bounded, documented set of error codes and the kind of failure each one is.

The core's codes (`ErrorCode`) are the failures any domain meets: invalid input, transient downstream trouble,
the unexpected, an exhausted budget, and the generic outcomes of an effect. A domain registers its own permanent
business answers (rejections, refused effects) as a `DomainCode` subclass (listed in its `Domain`'s
`codes`); they are all of kind `rejected`: terminal, never retried.
"""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    """What a failure means for the record, which decides what the state machine does with it."""

    INVALID = "invalid"  # the bytes can never be processed: quarantine at once
    REJECTED = "rejected"  # a permanent business answer: terminal, never retried
    TRANSIENT = "transient"  # a downstream or resource problem: retry within the budget
    UNKNOWN = "unknown"  # a bug or a surprise: retry with a smaller budget


class ErrorCode(StrEnum):
    """The core's stable error codes; envelopes, inbox rows, metrics and alerts use these strings."""

    MALFORMED_PAYLOAD = "MALFORMED_PAYLOAD"
    SCHEMA_UNSUPPORTED = "SCHEMA_UNSUPPORTED"
    INVALID_FIELD = "INVALID_FIELD"
    UNREADABLE_RECORD = "UNREADABLE_RECORD"  # the Kafka client cannot decode the record (e.g. a non-UTF-8 header name)

    RATE_LIMITED = "RATE_LIMITED"
    DOWNSTREAM_UNAVAILABLE = "DOWNSTREAM_UNAVAILABLE"
    DOWNSTREAM_TIMEOUT = "DOWNSTREAM_TIMEOUT"
    DOWNSTREAM_UNREACHABLE = "DOWNSTREAM_UNREACHABLE"
    PROCESSING_TIMEOUT = "PROCESSING_TIMEOUT"
    # An answer that is not the API's own (an HTML page, a redirect, 401/403, a body that is not its document):
    # our URL or credentials. Waited out behind the downstream's breaker, never a record's fate.
    DOWNSTREAM_MISCONFIGURED = "DOWNSTREAM_MISCONFIGURED"

    UNEXPECTED_ERROR = "UNEXPECTED_ERROR"

    PROVIDER_REJECTED = "PROVIDER_REJECTED"
    NOT_FOUND_AFTER_RECONCILE = "NOT_FOUND_AFTER_RECONCILE"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    PROVIDER_UNAUTHORIZED = "PROVIDER_UNAUTHORIZED"
    PROVIDER_MISCONFIGURED = "PROVIDER_MISCONFIGURED"
    PROVIDER_IN_PROGRESS = "PROVIDER_IN_PROGRESS"

    RATE_LIMITED_EXHAUSTED = "RATE_LIMITED_EXHAUSTED"
    DOWNSTREAM_UNAVAILABLE_EXHAUSTED = "DOWNSTREAM_UNAVAILABLE_EXHAUSTED"
    DOWNSTREAM_TIMEOUT_EXHAUSTED = "DOWNSTREAM_TIMEOUT_EXHAUSTED"
    DOWNSTREAM_UNREACHABLE_EXHAUSTED = "DOWNSTREAM_UNREACHABLE_EXHAUSTED"
    PROCESSING_TIMEOUT_EXHAUSTED = "PROCESSING_TIMEOUT_EXHAUSTED"
    DOWNSTREAM_MISCONFIGURED_EXHAUSTED = "DOWNSTREAM_MISCONFIGURED_EXHAUSTED"
    UNEXPECTED_ERROR_EXHAUSTED = "UNEXPECTED_ERROR_EXHAUSTED"

    @property
    def kind(self) -> FailureKind:
        """The kind of failure this code stands for."""
        return _KINDS[self]

    def exhausted(self) -> ErrorCode:
        """The code a retryable failure ends with once its budget is spent: `<CODE>_EXHAUSTED`."""
        return ErrorCode(f"{self.value}_EXHAUSTED")


_KINDS: dict[ErrorCode, FailureKind] = {
    ErrorCode.MALFORMED_PAYLOAD: FailureKind.INVALID,
    ErrorCode.SCHEMA_UNSUPPORTED: FailureKind.INVALID,
    ErrorCode.INVALID_FIELD: FailureKind.INVALID,
    ErrorCode.UNREADABLE_RECORD: FailureKind.INVALID,
    ErrorCode.RATE_LIMITED: FailureKind.TRANSIENT,
    ErrorCode.DOWNSTREAM_UNAVAILABLE: FailureKind.TRANSIENT,
    ErrorCode.DOWNSTREAM_TIMEOUT: FailureKind.TRANSIENT,
    ErrorCode.DOWNSTREAM_UNREACHABLE: FailureKind.TRANSIENT,
    ErrorCode.PROCESSING_TIMEOUT: FailureKind.TRANSIENT,
    ErrorCode.DOWNSTREAM_MISCONFIGURED: FailureKind.TRANSIENT,
    ErrorCode.UNEXPECTED_ERROR: FailureKind.UNKNOWN,
    # Effect outcomes, never a record's failure: the kind only keeps them out of the record retry rules;
    # service/policy/effects.py decides what each means for its effect.
    ErrorCode.PROVIDER_REJECTED: FailureKind.REJECTED,
    ErrorCode.NOT_FOUND_AFTER_RECONCILE: FailureKind.REJECTED,
    ErrorCode.OUTCOME_UNKNOWN: FailureKind.REJECTED,
    # The provider refuses our credentials (401, 403): our configuration; the effect waits, spending no attempt.
    ErrorCode.PROVIDER_UNAUTHORIZED: FailureKind.REJECTED,
    # The provider has no such endpoint (404, 405 to a call): our configuration (its URL) too; the effect waits.
    ErrorCode.PROVIDER_MISCONFIGURED: FailureKind.REJECTED,
    # The provider is still working on the same idempotency key (409): the outcome is looked up, never guessed.
    ErrorCode.PROVIDER_IN_PROGRESS: FailureKind.REJECTED,
    # An exhausted code is where a retryable failure ends: it is terminal like invalid input.
    ErrorCode.RATE_LIMITED_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.DOWNSTREAM_TIMEOUT_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.DOWNSTREAM_UNREACHABLE_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.PROCESSING_TIMEOUT_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.DOWNSTREAM_MISCONFIGURED_EXHAUSTED: FailureKind.INVALID,
    ErrorCode.UNEXPECTED_ERROR_EXHAUSTED: FailureKind.INVALID,
}


class DomainCode(StrEnum):
    """The base of a domain's registered codes: permanent business answers, terminal, never retried.

    A domain subclasses it with its members (`class ItemCode(DomainCode): ITEM_NOT_FOUND = "ITEM_NOT_FOUND"`);
    its values must not be core codes (`registered` checks).
    """

    @property
    def kind(self) -> FailureKind:
        """Always `rejected`: a domain's code is a business answer."""
        return FailureKind.REJECTED


# What a rejection, an inbox row or an effect's outcome may carry: a core code or a domain's.
Code = ErrorCode | DomainCode


def registered(*domains: type[DomainCode]) -> dict[str, FailureKind]:
    """Every code, the core's and the domains', with its kind; raises ValueError on a code defined twice."""
    codes: dict[str, FailureKind] = {code.value: code.kind for code in ErrorCode}
    for domain in domains:
        for code in domain:
            if code.value in codes:
                raise ValueError(f"{domain.__name__}.{code.name} is defined twice ({code.value})")
            codes[code.value] = code.kind
    return codes

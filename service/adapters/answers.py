"""What a downstream's answer means: to its breaker (`judge`: an outage, the API's own answer, a misconfiguration),
to a record's look-up (`lookup_failure`) and to an effect's call or look-up (`call_outcome`, `lookup_outcome`), for
any domain's clients; the calls themselves are service/adapters/http.py's.

Two kinds of call reach a downstream. A look-up before the transaction (a record's outside context) fails as a
`DownstreamError` (`lookup_failure`), retried like any record failure, or waiting for the breaker uncharged. An
effect's call ends as a `CallOutcome` (service/policy/effects.py, `call_outcome`): `NotSent` when the provider surely
did not act, `Unknown` when it may have, so that a look-up decides before any repeat.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from service.adapters.transport import Answer, ConnectFailed, TimedOut, TransportError
from service.codes import ErrorCode
from service.errors import DownstreamError
from service.policy.breaker import OK, Outcome, Verdict
from service.policy.effects import CallOutcome, LookupFailed, NotSent, Unknown

MAX_RETRY_AFTER = timedelta(minutes=10)  # a longer Retry-After would park a record or an effect for too long
_LONGEST = int(MAX_RETRY_AFTER.total_seconds())
_SECONDS = re.compile(r"[0-9]+", re.ASCII)


@dataclass(frozen=True, slots=True)
class Exchange:
    """One call through its downstream's breaker: the answer (or the transport error), what it said about the
    downstream, and whether it is charged to its record or effect. `refused`: the breaker did not let it be made
    (`outcome` then says why it is open)."""

    answer: Answer | None
    error: TransportError | None
    outcome: Outcome
    charged: bool
    refused: bool = False
    wait: timedelta | None = None  # not charged: how long before it is worth trying again
    body: Any = None  # the answer's JSON document, read once (None when it is not JSON)

    @property
    def own(self) -> Answer | None:
        """The answer, when it is the API's own (its document, its refusal, its "not found"); else None."""
        return self.answer if self.outcome.verdict is Verdict.OK else None


# Whether a (non-5xx, non-429) answer, with its JSON document (None: not JSON), is the API's own.
Own = Callable[[Answer, Any], bool]


def judge(answer: Answer, own: Own, body: Any = None) -> Outcome:
    """What an answer says about its downstream (contract §6, "Which answers are the API's own"): 429, 5xx, 408 and
    425 are an outage (a 429 with Retry-After opens the breaker for that long); any other answer works if it is the
    API's own (`own`: a JSON document of the API, a 404 with a JSON `error`), and is a misconfiguration if not (an
    HTML page, a redirect, 204, 401/403, a body that is not the documented document)."""
    status = answer.status_code
    if status == 429:
        pause = retry_after(answer)
        seconds = pause.total_seconds() if pause is not None else None
        return Outcome(Verdict.FAILED, ErrorCode.RATE_LIMITED, seconds, status=status)
    if status >= 500 or status in (408, 425):
        return Outcome(Verdict.FAILED, ErrorCode.DOWNSTREAM_UNAVAILABLE, status=status)
    try:
        its_own = own(answer, body)
    except (TypeError, ValueError, KeyError, AttributeError):
        its_own = False  # a body shaped so that reading it fails is no document of the API's
    return OK if its_own else Outcome(Verdict.MISCONFIGURED, ErrorCode.DOWNSTREAM_MISCONFIGURED, status=status)


# Answers to a call that are never an API's own refusal (contract §6): our credentials (401, 403), our URL (404, 405:
# the call's endpoint is not there), a proxy's (407), and those of an outage (408, 425, 429: `judge`).
NOT_REFUSALS = frozenset({401, 403, 404, 405, 407, 408, 425, 429})


def refusal(answer: Answer, body: Any) -> bool:
    """Whether a call's answer (its JSON document `body`) is an API's own refusal of it: a 4xx that is not about our
    configuration or an outage, with a JSON body."""
    status = answer.status_code
    return 400 <= status < 500 and status not in NOT_REFUSALS and body is not None


def is_json(answer: Answer) -> bool:
    """Whether the answer says its body is JSON (`application/json`, or a `+json` type)."""
    media = answer.headers.get("content-type", "").partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def document(answer: Answer) -> Any:
    """The answer's JSON body, or None when it is not JSON (by its Content-Type or its bytes)."""
    if not is_json(answer):
        return None
    try:
        return answer.json()
    except ValueError:
        return None


def api_error(body: Any) -> bool:
    """Whether an answer's JSON document is the API's own error document: an object with an `error` field."""
    return isinstance(body, dict) and "error" in body


def transport_code(error: TransportError) -> ErrorCode:
    """The code of an exchange that ended in a transport error: a timeout, or a downstream not reached."""
    timed_out = isinstance(error, TimedOut) or (isinstance(error, ConnectFailed) and error.timed_out)
    return ErrorCode.DOWNSTREAM_TIMEOUT if timed_out else ErrorCode.DOWNSTREAM_UNREACHABLE


def retry_after(response: Answer) -> timedelta | None:
    """The `Retry-After` of a response in seconds form, capped; HTTP-date forms (and anything else) are ignored."""
    value = response.headers.get("retry-after", "").strip()
    if not _SECONDS.fullmatch(value):
        return None
    # Capped before it is read: a provider's number of seconds may be any length.
    digits = value.lstrip("0") or "0"
    return timedelta(seconds=min(int(digits) if len(digits) <= 6 else _LONGEST, _LONGEST))


def lookup_failure(exchange: Exchange, downstream: str) -> DownstreamError:
    """A record's look-up that did not get the API's own answer, as the record's failure: charged to it only while
    the downstream's breaker is closed; otherwise it waits for the breaker (`retry_after`), spending nothing."""
    code = exchange.outcome.code or ErrorCode.UNEXPECTED_ERROR
    return DownstreamError(code, retry_after=exchange.wait, downstream=downstream, charged=exchange.charged)


def call_outcome(exchange: Exchange) -> CallOutcome | None:
    """An effect call's exchange, when it is not the API's own answer: None when it is (the domain's client reads
    its document).

    Refused by the breaker, an outage's 429/5xx/408/425, a connection never made: not sent (charged only while the
    breaker is closed). A timeout after sending, a connection cut: unknown, the look-up decides. An answer that is
    not the API's own: 401/403 `PROVIDER_UNAUTHORIZED`, a redirect, 404, 405 and the like (or a certificate refused)
    `PROVIDER_MISCONFIGURED`, not sent and charged to nobody (our configuration, not the effect); a 2xx that is not
    its document (a 204, a body without the reference) may have been acted on by whatever answered: unknown, looked
    up.
    """
    if exchange.refused:
        # Claimed again as soon as the breaker lets calls through; in the effect's own words (PROVIDER_*).
        code = _provider_code(exchange.outcome.code, exchange.outcome.status)
        return NotSent(code, retry_after=timedelta(0), charged=False)
    if exchange.error is not None:
        if exchange.outcome.verdict is Verdict.MISCONFIGURED:  # a certificate refused: nothing left
            return _misconfigured(ErrorCode.PROVIDER_MISCONFIGURED, exchange)
        if isinstance(exchange.error, ConnectFailed):
            return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE, charged=exchange.charged)
        return Unknown(transport_code(exchange.error))
    answer = exchange.answer
    assert answer is not None
    verdict = exchange.outcome.verdict
    if verdict is Verdict.OK:
        return None
    if verdict is Verdict.FAILED:
        code = exchange.outcome.code or ErrorCode.DOWNSTREAM_UNAVAILABLE
        return NotSent(code, retry_after(answer) if code is ErrorCode.RATE_LIMITED else None, charged=exchange.charged)
    status = answer.status_code
    if 200 <= status < 300:
        return Unknown(ErrorCode.PROVIDER_MISCONFIGURED)
    return _misconfigured(_provider_code(exchange.outcome.code, status), exchange)


def _misconfigured(code: ErrorCode, exchange: Exchange) -> NotSent:
    """Never charged: our configuration, not the effect. Behind the breaker it opened (or found open), claimed again
    once its open time is up (so that an effect due before it is the probe, not this one again); its own trouble (the
    breaker charged it: the provider answers the others), after the longest wait (service/policy/effects.py)."""
    if exchange.charged:
        return NotSent(code, charged=False)
    return NotSent(code, retry_after=exchange.wait or timedelta(0), charged=False)


def lookup_outcome(exchange: Exchange) -> LookupFailed | None:
    """A provider look-up's exchange when it is not the API's own answer (the effect stays as it is); None when it
    is (the domain's client reads it)."""
    if exchange.refused:
        return LookupFailed(_provider_code(exchange.outcome.code, exchange.outcome.status), charged=False)
    verdict = exchange.outcome.verdict
    if exchange.error is not None and verdict is not Verdict.MISCONFIGURED:  # (a certificate refused is ours)
        return LookupFailed(transport_code(exchange.error), charged=exchange.charged)
    if verdict is Verdict.OK:
        return None
    if verdict is Verdict.FAILED:
        return LookupFailed(exchange.outcome.code or ErrorCode.DOWNSTREAM_UNAVAILABLE, charged=exchange.charged)
    return LookupFailed(_provider_code(exchange.outcome.code, exchange.outcome.status), charged=False)


def _provider_code(code: ErrorCode | None, status: int | None) -> ErrorCode:
    """A provider's failure in an effect's words: our credentials (401, 403) or our URL (any other answer that is not
    its own) as PROVIDER_UNAUTHORIZED / PROVIDER_MISCONFIGURED; an outage's code as it is."""
    if code is ErrorCode.DOWNSTREAM_MISCONFIGURED:
        return ErrorCode.PROVIDER_UNAUTHORIZED if status in (401, 403) else ErrorCode.PROVIDER_MISCONFIGURED
    return code or ErrorCode.DOWNSTREAM_UNAVAILABLE

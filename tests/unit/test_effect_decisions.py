"""What a provider's answer means for an effect (README "Effects and the reconciler"): a documented table,
decided without I/O."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from service.adapters.http import Answer
from service.codes import ErrorCode
from service.containers import http_connections
from service.orders.codes import OrderCode
from service.orders.effects import order_effects
from service.orders.providers import EmailsClient, PaymentsClient
from service.orders.settings import OrderSettings
from service.policy.effects import (
    MAX_CLAIM,
    EffectDecision,
    EffectPolicy,
    Found,
    LookupFailed,
    Missing,
    NotSent,
    Refused,
    Sent,
    Unknown,
    after_call,
    after_lookup,
    claim_size,
)
from service.worker.consumer import CONTEXT_LOOKUPS

POLICY = EffectPolicy(max_attempts=3)


JSON = "application/json"
# An answer that is not the API's own opened the provider's breaker: the effect is claimed again once its open time
# (the first: 2 s) is up, so that an effect due before it is the probe
WAIT_FOR_BREAKER = timedelta(seconds=2)


class _Answers:
    """An HTTP client that answers every POST with one status, Content-Type and body."""

    def __init__(self, status: int, content_type: str, body: bytes, headers: dict[str, str]) -> None:
        self._answer = Answer(status, CIMultiDict({"content-type": content_type, **headers}), body)

    async def post(self, url: str, json: object = None, headers: object = None, tls: object = None) -> Answer:
        return self._answer


async def answered(
    status: int, body: object = None, headers: dict[str, str] | None = None, content_type: str = JSON
) -> object:
    """The call outcome a payment provider's answer with this status means (to a provider whose breaker is closed)."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body if body is not None else {})
    payments = PaymentsClient(_Answers(status, content_type, raw, headers or {}), "http://payments.test")  # type: ignore[arg-type]
    outcome = await payments.pay("A-1/payment.capture", {}, "capture")
    if isinstance(outcome, NotSent) and outcome.retry_after:  # the breaker's open time left, read off its clock
        return replace(outcome, retry_after=timedelta(seconds=round(outcome.retry_after.total_seconds())))
    return outcome


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (201, Sent("p-1")),
        (200, Sent("p-1")),
        (402, Refused(OrderCode.PAYMENT_DECLINED)),
        (422, Refused(ErrorCode.PROVIDER_REJECTED)),
        (400, Refused(ErrorCode.PROVIDER_REJECTED)),
        (
            401,
            NotSent(ErrorCode.PROVIDER_UNAUTHORIZED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),  # our credentials: spends nothing
        (403, NotSent(ErrorCode.PROVIDER_UNAUTHORIZED, retry_after=WAIT_FOR_BREAKER, charged=False)),
        (409, Unknown(ErrorCode.PROVIDER_IN_PROGRESS)),
        (429, NotSent(ErrorCode.RATE_LIMITED)),
        (500, NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)),
        (503, NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)),
        (408, NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)),  # the provider timed out waiting for our request
        (425, NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)),  # too early: send it again
        (
            404,
            NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),  # a call's endpoint: our URL, not the effect
        (405, NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False)),
        (
            308,
            NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),  # http → https: our URL
        (410, Refused(ErrorCode.PROVIDER_REJECTED)),
    ],
)
async def test_each_provider_status_means_one_documented_outcome(status: int, expected: object) -> None:
    assert await answered(status, {"payment_id": "p-1"}) == expected


@pytest.mark.parametrize(
    ("status", "content_type", "body", "expected"),
    [
        (204, "", b"", Unknown(ErrorCode.PROVIDER_MISCONFIGURED)),
        (200, "text/html", b"<html>welcome</html>", Unknown(ErrorCode.PROVIDER_MISCONFIGURED)),
        (201, JSON, b"[]", Unknown(ErrorCode.PROVIDER_MISCONFIGURED)),
        (
            402,
            "text/html",
            b"<html>pay me</html>",
            NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),
        (
            404,
            "text/html",
            b"<html>not found</html>",
            NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),
        (
            404,
            JSON,
            b'{"error": "not found"}',
            NotSent(ErrorCode.PROVIDER_MISCONFIGURED, retry_after=WAIT_FOR_BREAKER, charged=False),
        ),
    ],
    ids=["204", "html-200", "json-not-the-document", "html-402", "html-404", "json-404-to-a-call"],
)
async def test_an_answer_that_is_not_the_providers_own_fails_nothing(
    status: int, content_type: str, body: bytes, expected: object
) -> None:
    # Given answers a wrong URL, a proxy or a login page give (contract §6, "Which answers are the API's own")
    # When the capture's outcome is read, Then nothing is declined or failed: what may have been acted on (a 2xx)
    # is looked up, the rest is not sent, and neither spends an attempt
    assert await answered(status, body, content_type=content_type) == expected


@pytest.mark.parametrize("code", [ErrorCode.PROVIDER_UNAUTHORIZED, ErrorCode.PROVIDER_MISCONFIGURED])
def test_credentials_or_a_url_refused_spend_no_attempt_however_often(
    code: ErrorCode,
) -> None:
    # One call answered so opened its provider's breaker; it is claimed again, its budget whole, as soon as the breaker
    # lets calls through (the lanes wait for it)
    refused = after_call(NotSent(code, retry_after=timedelta(0), charged=False), 99, POLICY, random.Random(1))
    assert refused == EffectDecision("pending", code, retry_in=timedelta(0), unmade=True)
    # One so answered while its provider answers the others (the breaker charged it: its own trouble) waits 30 s
    alone = after_call(NotSent(code, charged=False), 99, POLICY, random.Random(1))
    assert alone == EffectDecision("pending", code, retry_in=POLICY.alone_misconfigured_wait, unmade=True)


def test_a_provider_still_working_on_the_key_makes_the_effect_uncertain_for_a_look_up() -> None:
    decision = after_call(Unknown(ErrorCode.PROVIDER_IN_PROGRESS), 1, POLICY, random.Random(1))

    assert decision.state == "uncertain"
    assert decision.code is ErrorCode.PROVIDER_IN_PROGRESS


def test_a_transient_answer_spends_an_attempt_and_the_last_one_fails_exhausted() -> None:
    retried = after_call(NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE), 1, POLICY, random.Random(1))
    last = after_call(NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE), 3, POLICY, random.Random(1))

    assert retried.state == "pending"
    assert not retried.unmade
    assert retried.retry_in is not None
    assert timedelta(0) < retried.retry_in <= POLICY.base_delay
    assert last == EffectDecision("failed", ErrorCode.DOWNSTREAM_UNAVAILABLE_EXHAUSTED)


QUIET = timedelta(seconds=30)


def test_a_resend_decided_by_a_look_up_waits_a_quiet_time_for_the_provider_after_a_5xx() -> None:
    # Given a 5xx answer (perhaps a gateway's, while the provider still works on the request) and a 429 (not taken)
    unavailable, limited = NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE), NotSent(ErrorCode.RATE_LIMITED)

    # When they are decided for a kind whose resend is decided by a look-up (a quiet time) and for one that is not
    waited = after_call(unavailable, 1, POLICY, random.Random(1), quiet=QUIET)
    idempotent = after_call(unavailable, 1, POLICY, random.Random(1))
    rate_limited = after_call(limited, 1, POLICY, random.Random(1), quiet=QUIET)

    # Then only the 5xx of the first kind waits the quiet time before its next attempt (and its look-up)
    assert (waited.state, waited.retry_in) == ("pending", QUIET)
    assert idempotent.retry_in is not None
    assert idempotent.retry_in <= POLICY.base_delay
    assert rate_limited.retry_in is not None
    assert rate_limited.retry_in <= POLICY.base_delay


def test_an_effect_a_look_up_did_not_find_is_attempted_again_only_after_its_providers_quiet_time() -> None:
    # Given an uncertain effect whose look-up found nothing, one that was found, and a look-up that failed
    # When the reconciler decides them with a quiet time
    missing = after_lookup(Missing(), 0, POLICY, quiet=QUIET)
    found = after_lookup(Found("em-1"), 0, POLICY, quiet=QUIET)
    failed = after_lookup(LookupFailed(ErrorCode.DOWNSTREAM_UNAVAILABLE), 0, POLICY, quiet=QUIET)

    # Then the missing one goes back to pending due only after the quiet time: its provider may still act on the
    # request whose answer never came, and the next attempt looks it up again first
    assert missing == EffectDecision("pending", ErrorCode.OUTCOME_UNKNOWN, retry_in=QUIET)
    assert found == EffectDecision("sent", reference="em-1")
    assert failed is None


@pytest.mark.parametrize(
    ("concurrency", "call_seconds", "rounds_in_lease", "expected"),
    [
        (32, None, 6, 32),  # no call yet: one round
        (32, 0.0005, 100, MAX_CLAIM),  # a fast provider: as many as a claim may hold
        (32, 0.0005, 6, 192),  # ... but no more rounds than could each take their longest within the lease
        (32, 0.1, 6, 64),  # 100 ms a call: two rounds fit the horizon
        (32, 2.0, 6, 32),  # a slow provider: one round, never less
        (32, 0.0005, 0, 32),  # a lease shorter than two calls: still one round
        (800, 0.0005, 100, 800),  # one round is more than MAX_CLAIM: one round
    ],
)
def test_a_lane_claims_what_its_calls_can_make_within_the_horizon(
    concurrency: int, call_seconds: float | None, rounds_in_lease: int, expected: int
) -> None:
    assert claim_size(concurrency, call_seconds, rounds_in_lease) == expected


@given(
    concurrency=st.integers(min_value=1, max_value=1000),
    faster=st.floats(min_value=0, max_value=60, allow_nan=False),
    slower=st.floats(min_value=0, max_value=60, allow_nan=False),
    rounds_in_lease=st.integers(min_value=0, max_value=1000),
)
def test_a_claim_is_one_round_at_least_and_shrinks_as_calls_slow_down(
    concurrency: int, faster: float, slower: float, rounds_in_lease: int
) -> None:
    faster, slower = sorted((faster, slower))
    size = claim_size(concurrency, faster, rounds_in_lease)
    assert concurrency <= size <= max(concurrency, min(MAX_CLAIM, concurrency * max(rounds_in_lease, 1)))
    assert claim_size(concurrency, slower, rounds_in_lease) <= size


@pytest.mark.parametrize("concurrency", [1, 17, 18, 32, 47, 48, 1000])
def test_the_http_client_holds_every_effect_kinds_calls_and_the_consumers_look_ups_at_once(concurrency: int) -> None:
    # Given `run` (consume and effects in one process, one HTTP client) with any effect concurrency: each of the
    # order domain's effect kinds calls up to that many at once, and the consumer's rounds look customers up
    clients = (PaymentsClient(None, "http://payments.test"), EmailsClient(None, "http://emails.test"))  # type: ignore[arg-type]
    needed = len(order_effects(*clients).enabled()) * concurrency + CONTEXT_LOOKUPS

    # When the client is sized, Then every one of those calls has a connection without waiting for another's
    assert http_connections(OrderSettings(effect_concurrency=concurrency)) >= needed

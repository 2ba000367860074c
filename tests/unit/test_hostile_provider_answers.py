"""What a provider or a message can put into an HTTP exchange: a Retry-After is capped or ignored, never raised; an
id is always one path segment."""

from __future__ import annotations

from urllib.parse import unquote

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from service.adapters.answers import MAX_RETRY_AFTER, judge, retry_after
from service.adapters.http import Answer, path_segment
from service.codes import ErrorCode
from service.orders.codes import OrderCode
from service.orders.effects import order_effects
from service.orders.providers import FAILED_STATUSES, UNDONE_STATUSES, EmailsClient, PaymentsClient, _answer
from service.policy.effects import Found, LookupFailed, Missing, NotSent, Refused, Sent, Unknown
from service.store.effects import EffectRow


@pytest.mark.parametrize("value", ["99999999999999", "9" * 5000, "\u00b2"])
def test_a_hostile_retry_after_is_capped_or_ignored_never_raised(value: str) -> None:
    # Given a 429 whose Retry-After is a huge number of seconds, more digits than int() reads, or a digit
    # that str.isdigit accepts and int() refuses
    answer = Answer(429, {"retry-after": value}, b"")

    # When the effect's call reads it, Then it is capped (or ignored), and the answer is read as an outage
    assert retry_after(answer) in (MAX_RETRY_AFTER, None)
    assert judge(answer, lambda _answer, _body: True).code is ErrorCode.RATE_LIMITED


@given(st.text())
def test_an_id_in_a_path_is_one_segment_whatever_it_holds(value: str) -> None:
    # Given any id from a message (slashes, dots, `..`, spaces, percent signs, non-ASCII)
    # When it is put in a URL's path, Then it is one segment that reads back as the id, and no `.` or `..` segment
    segment = path_segment(value)
    assert "/" not in segment
    assert "." not in segment
    assert unquote(segment) == value


def test_dot_segments_are_encoded() -> None:
    assert [path_segment(value) for value in (".", "..", "a/b c")] == ["%2E", "%2E%2E", "a%2Fb%20c"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@given(json_values)
def test_a_body_with_a_byte_order_mark_reads_as_the_same_json(value: object) -> None:
    body = orjson.dumps(value)
    assert Answer(200, {}, b"\xef\xbb\xbf" + body).json() == Answer(200, {}, body).json() == value


@pytest.mark.parametrize("body", [b"", b"\xef\xbb\xbf", b"\xef\xbb\xbf\xef\xbb\xbf{}", b"{", b"\xff"])
def test_a_body_that_is_not_json_raises_value_error(body: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):  # (a ValueError, as the callers catch)
        Answer(200, {}, body).json()


JSON = {"content-type": "application/json"}


class _Answering:
    """An HTTP client whose every GET and POST is answered with one status and JSON body."""

    def __init__(self, body: object, status: int = 200) -> None:
        self._body = orjson.dumps(body)
        self._status = status

    async def get(self, url: str, params: object = None, headers: object = None, tls: object = None) -> Answer:
        return Answer(self._status, JSON, self._body)

    async def post(self, url: str, json: object = None, headers: object = None, tls: object = None) -> Answer:
        return Answer(self._status, JSON, self._body)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["email_id", "x"]), inner, max_size=2),
    max_leaves=6,
)


@given(_JSON)
@example(None)
@example({})
@example([])
@example([{"email_id": None}])
@example([{"email_id": "em-1"}])
@example([{"email_id": None}, {"email_id": "em-2"}])
async def test_an_email_look_up_says_nothing_was_sent_only_for_an_empty_list(body: object) -> None:
    # Given any JSON a provider (or a proxy in front of it) answers a look-up by ref with, status 200
    emails = EmailsClient(_Answering(body), "http://emails.test")  # type: ignore[arg-type]

    # When the look-up reads it
    outcome = await emails.find("A-1/email.shipped")

    # Then only an empty list is "not sent" (which lets the email be sent again), a list with an email that has an
    # id is "sent" with the first such id, and anything else is a failed look-up that leaves the effect for later
    ids = [email.get("email_id") for email in body if isinstance(email, dict)] if isinstance(body, list) else []
    usable = [str(i) for i in ids if isinstance(i, str | int) and not isinstance(i, bool) and i != ""]
    if body == [] and isinstance(body, list):
        assert outcome == Missing()
    elif usable:
        assert outcome == Found(usable[0])
    else:
        assert isinstance(outcome, LookupFailed)


@pytest.mark.parametrize("body", [{"payment_id": None}, {"payment_id": ""}, {"payment_id": {}}, {"payment_id": True}])
async def test_a_capture_answered_without_a_usable_payment_id_is_left_to_a_look_up(body: object) -> None:
    # Given a 201 whose payment id is null, empty, an object or a boolean: not the provider's documented answer
    payments = PaymentsClient(_Answering(body, 201), "http://payments.test")  # type: ignore[arg-type]

    # When the call's outcome is read, Then it is not recorded as sent with that id: whatever answered may have
    # acted, a look-up decides
    assert await payments.pay("A-1/payment.capture", {}, "capture") == Unknown(ErrorCode.PROVIDER_MISCONFIGURED)


@pytest.mark.parametrize(
    ("kind", "status"),
    [
        ("capture", "failed"),
        ("capture", "FAILED"),
        ("capture", "declined"),
        ("capture", " Rejected "),
        ("capture", "canceled"),
        ("capture", "Voided"),
        ("capture", "expired"),
        ("refund", "failed"),
        ("refund", "refused"),
        ("refund", "canceled"),  # a cancelled refund moved no money back
        ("refund", "Expired"),
    ],
)
@pytest.mark.parametrize("code", [200, 201])
async def test_a_payment_answered_with_a_status_that_took_no_money_is_declined_and_a_look_up_finds_none(
    kind: str, status: str, code: int
) -> None:
    # Given a provider that answers a payment, and a look-up of its key, with a status that says it took no money
    body = {"payment_id": "pay-1", "status": status}

    # When the call's outcome and the look-up's are read
    called = _answer(Answer(code, JSON, orjson.dumps(body)), body, "payment_id", kind)
    found = await PaymentsClient(_Answering(body), "http://payments.test").find(f"A-1/payment.{kind}", kind)  # type: ignore[arg-type]

    # Then it is declined, as with a 402 (not `sent`, no `payment.captured`), and the look-up says no payment took
    # the money (a refund then has nothing to refund)
    assert called == Refused(OrderCode.PAYMENT_DECLINED)
    assert found == Missing()


@pytest.mark.parametrize("status", ["voided", "Voided"])
async def test_a_refund_answered_voided_is_done(status: str) -> None:
    # Given a refund the provider made as a void of the capture: it answers the refund, and its look-up, `voided`
    body = {"payment_id": "ref-1", "status": status}

    # When the call's outcome and the look-up's are read, Then the refund is sent (for a capture the same words
    # would say it took no money)
    assert _answer(Answer(201, JSON, orjson.dumps(body)), body, "payment_id", "refund") == Sent("ref-1")
    found = await PaymentsClient(_Answering(body), "http://payments.test").find("A-1/payment.refund", "refund")  # type: ignore[arg-type]
    assert found == Found("ref-1")


@given(
    st.sampled_from(["capture", "refund"]),
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12)),
)
@example("capture", "captured")
@example("capture", "pending")
@example("capture", "failed-ish")
async def test_a_payment_with_any_other_status_is_sent_with_its_id(kind: str, status: object) -> None:
    # Given a 201 with a payment id and any other status (or none, or not a text)
    if isinstance(status, str) and status.strip().lower() in FAILED_STATUSES | UNDONE_STATUSES:
        return
    body = {"payment_id": "pay-1", "status": status}

    # When the call's outcome and the look-up's are read, Then both record the payment
    assert _answer(Answer(201, JSON, orjson.dumps(body)), body, "payment_id", kind) == Sent("pay-1")
    found = await PaymentsClient(_Answering(body), "http://payments.test").find(f"A-1/payment.{kind}", kind)  # type: ignore[arg-type]
    assert found == Found("pay-1")


class _Payments:
    """A payment provider's look-ups by idempotency key: `answers` per key, each a status code and a JSON body (a
    key without one is not known: 404); a payment call is recorded and answered 201."""

    def __init__(self, answers: dict[str, tuple[int, object]]) -> None:
        self._answers = answers
        self.posted: list[str] = []

    async def get(self, url: str, params: dict[str, str], headers: object = None, tls: object = None) -> Answer:
        status, body = self._answers.get(params["idempotency_key"], (404, {"error": "not found"}))
        return Answer(status, JSON, orjson.dumps(body))

    async def post(
        self, url: str, json: object = None, headers: dict[str, str] | None = None, tls: object = None
    ) -> Answer:
        self.posted.append(str((headers or {}).get("Idempotency-Key")))
        return Answer(201, JSON, orjson.dumps({"payment_id": "new-1"}))


_REFUND = EffectRow("A-1/payment.refund", "A-1", "payment.refund", {"kind": "refund"}, 1, 0, "failed")


@pytest.mark.parametrize(
    ("refund_answer", "outcome"),
    [
        ((200, {"payment_id": "ref-1", "status": "voided"}), Sent("ref-1")),
        ((200, {"payment_id": "ref-1", "status": "succeeded"}), Sent("ref-1")),
        ((404, {"error": "not found"}), Refused(OrderCode.CAPTURE_FAILED)),
        ((404, {}), NotSent(ErrorCode.PROVIDER_MISCONFIGURED, charged=False)),  # not the provider's own "not found"
        ((503, {}), NotSent(ErrorCode.DOWNSTREAM_UNAVAILABLE)),
    ],
)
async def test_a_refund_whose_capture_reads_as_voided_asks_for_itself_before_it_says_capture_failed(
    refund_answer: tuple[int, object], outcome: object
) -> None:
    # Given a capture that failed on our side, and a refund of it sent again after an attempt whose answer was lost:
    # the provider made that attempt as a void of the capture, whose look-up now answers `voided`
    voided = (200, {"payment_id": "cap-1", "status": "voided"})
    http = _Payments({"A-1/payment.capture": voided, "A-1/payment.refund": refund_answer})
    clients = (PaymentsClient(http, "http://payments.test"), EmailsClient(None, "http://emails.test"))  # type: ignore[arg-type]
    refund = order_effects(*clients)["payment.refund"]

    # When the refund is called
    called = await refund.call(_REFUND)

    # Then it is the refund the provider made (not CAPTURE_FAILED, which would publish payment.failed for money that
    # went back), or CAPTURE_FAILED when the provider knows no such refund, or a wait when it cannot say; nothing is
    # posted again either way
    assert called == outcome
    assert http.posted == []


_CAPTURE_B = {"order_id": "B-1", "amount_cents": 1000, "currency": "EUR", "kind": "capture"}


@pytest.mark.parametrize(
    ("echoed", "outcome"),
    [
        ({}, Sent("pay-B")),  # the contract's answer echoes neither
        ({"idempotency_key": "B-1/payment.capture", "order_id": "B-1", "amount_cents": 1000}, Sent("pay-B")),
        ({"idempotency_key": "A-1/payment.capture"}, Unknown(ErrorCode.UNEXPECTED_ERROR)),
        ({"order_id": "A-1"}, Unknown(ErrorCode.UNEXPECTED_ERROR)),
        ({"idempotency_key": "B-1/payment.capture", "order_id": "A-1"}, Unknown(ErrorCode.UNEXPECTED_ERROR)),
        ({"idempotency_key": "b-1/payment.capture"}, Unknown(ErrorCode.UNEXPECTED_ERROR)),  # keys are exact
        ({"idempotency_key": None}, Unknown(ErrorCode.UNEXPECTED_ERROR)),
        ({"order_id": "A-1", "status": "failed"}, Unknown(ErrorCode.UNEXPECTED_ERROR)),  # not B's refusal either
    ],
    ids=[
        "none",
        "its-own",
        "another-key",
        "another-order",
        "its-key-another-order",
        "key-case",
        "null-key",
        "declined",
    ],
)
async def test_a_payment_answer_that_names_another_payment_is_unknown_never_sent(
    echoed: dict[str, object], outcome: object
) -> None:
    # Given a 201 to payment B that may echo the payment's idempotency key or order id (a provider's late second
    # answer to payment A, read on a kept connection as B's, echoes A's)
    answer = {"payment_id": "pay-B", "status": "succeeded", **echoed}
    payments = PaymentsClient(_Answering(answer, 201), "http://payments.test")  # type: ignore[arg-type]

    # When payment B's call reads it
    called = await payments.pay("B-1/payment.capture", _CAPTURE_B, "capture")

    # Then it is sent only when every field it echoes is B's; otherwise B's effect is uncertain, and the reconciler
    # looks it up by its key
    assert called == outcome

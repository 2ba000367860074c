"""Payment and email provider clients (contract §6). Answers become CallOutcome / LookupOutcome values.

The one distinction that matters: did the provider possibly act? A refused connection did not; a timeout
while waiting for the answer, or a connection cut mid-request, may have — that effect is `uncertain` and only
a look-up can tell.
"""

from __future__ import annotations

from typing import Any

from service.orders.codes import OrderCode
from service.ports import (
    Answer,
    CallOutcome,
    Downstream,
    ErrorCode,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    Own,
    Refused,
    Sent,
    Unknown,
    api_error,
    call_outcome,
    lookup_outcome,
    refusal,
)


def _reference(document: Any, field: str) -> str | None:
    """The provider's id for what it did: a non-empty text or a number in `document[field]`; None otherwise (a
    null, an empty text, a list: an answer we cannot record as a reference)."""
    value = document.get(field) if isinstance(document, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return str(value)


# A payment's `status` (contract §6 leaves its values open) that says the provider did not move the money: the
# capture or refund failed as with a 402, whatever the HTTP status. Compared without case; the words payment
# providers commonly answer a failed or cancelled payment with, and for a capture also a voided one (a refund
# made as a void of the capture may answer `voided`: for a refund that says it was done).
FAILED_STATUSES = frozenset(
    {"failed", "failure", "declined", "rejected", "refused", "error", "canceled", "cancelled", "expired"}
)
UNDONE_STATUSES = frozenset({"voided", "requires_payment_method"})


def _declined(document: Any, kind: str) -> bool:
    """Whether a payment document of this kind (`capture`, `refund`) says it took no money."""
    status = document.get("status") if isinstance(document, dict) else None
    if not isinstance(status, str):
        return False
    status = status.strip().lower()
    return status in FAILED_STATUSES or (kind == "capture" and status in UNDONE_STATUSES)


def _call_own(reference_field: str, payment_kind: str | None = None) -> Own:
    """A call's own answers: a 2xx JSON document with its reference (or, for a payment, a status that says it took no
    money), or a JSON refusal (402, 409, 422, any 4xx that is not about our configuration)."""

    def own(answer: Answer, body: Any) -> bool:
        if answer.status_code not in (200, 201, 202):
            return refusal(answer, body)
        # (its reference first: a call's answer has one, and a declined payment's too, as a rule)
        return _reference(body, reference_field) is not None or (
            payment_kind is not None and _declined(body, payment_kind)
        )

    return own


def _answer(response: Answer, body: Any, reference_field: str, payment_kind: str | None = None) -> CallOutcome:
    """What the provider's own answer to a call (`body`: its JSON document) means for the effect."""
    status = response.status_code
    if status in (200, 201, 202):
        if payment_kind is not None and _declined(body, payment_kind):
            return Refused(OrderCode.PAYMENT_DECLINED)
        reference = _reference(body, reference_field)
        # Without its id it did something, but we cannot tell what: let a look-up decide.
        return Sent(reference) if reference is not None else Unknown(ErrorCode.UNEXPECTED_ERROR)
    if status == 402:
        return Refused(OrderCode.PAYMENT_DECLINED)
    if status == 409:
        return Unknown(ErrorCode.PROVIDER_IN_PROGRESS)  # still working on this key: a look-up decides
    return Refused(ErrorCode.PROVIDER_REJECTED)


def _payment_found(kind: str) -> Own:
    """A payment look-up's own answers: a payment document (a JSON object with its id, or one that took no money),
    or a 404 with the API's JSON `error` (none under that key)."""

    def own(answer: Answer, body: Any) -> bool:
        if answer.status_code == 404:
            return api_error(body)
        return (
            answer.status_code == 200
            and isinstance(body, dict)
            and (_declined(body, kind) or _reference(body, "payment_id") is not None)
        )

    return own


def _emails_found(answer: Answer, body: Any) -> bool:
    """The email look-up's own answer: a JSON list (empty: none sent with that ref)."""
    return answer.status_code == 200 and isinstance(body, list)


def _answers_another(answered: Any, idempotency_key: str, body: dict[str, Any]) -> bool:
    """Whether a payment document echoes an `idempotency_key` or an `order_id` other than the request's. Contract §6
    documents neither field in the answer, so only a present one that differs counts: the answer is another
    payment's (a provider's late second answer, read on a kept connection as this request's)."""
    if not isinstance(answered, dict):
        return False
    echoed = (("idempotency_key", idempotency_key), ("order_id", body.get("order_id")))
    return any(field in answered and answered[field] != expected for field, expected in echoed)


class PaymentsClient(Downstream):
    """The idempotent payment provider: the same Idempotency-Key always returns the same payment."""

    downstream = "payments"

    async def pay(self, idempotency_key: str, body: dict[str, Any], kind: str) -> CallOutcome:
        """A payment of this kind (`capture`, `refund`), identified by the effect's idempotency key."""
        exchange = await self._post(
            "/payments",
            _call_own("payment_id", kind),
            body,
            target=idempotency_key,
            headers={"Idempotency-Key": idempotency_key},
        )
        answer = exchange.own
        if answer is None:
            outcome = call_outcome(exchange)
            assert outcome is not None
            return outcome
        if answer.status_code in (200, 201, 202) and _answers_another(exchange.body, idempotency_key, body):
            # Neither sent (its id is another payment's) nor refused: whether this one was made, a look-up by its
            # key tells.
            return Unknown(ErrorCode.UNEXPECTED_ERROR)
        return _answer(answer, exchange.body, "payment_id", kind)

    async def find(self, idempotency_key: str, kind: str) -> LookupOutcome:
        """Look a payment of this kind (`capture`, `refund`) up by its idempotency key."""
        exchange = await self._get("/payments", _payment_found(kind), params={"idempotency_key": idempotency_key})
        answer = exchange.own
        if answer is None:
            failed = lookup_outcome(exchange)
            assert failed is not None
            return failed
        if answer.status_code == 404:
            return Missing()
        body = exchange.body
        if _declined(body, kind):
            # It took no money: as if there were none (a capture is then sent again, and the provider answers the
            # same key with the same failure; a refund finds nothing to refund).
            return Missing()
        reference = _reference(body, "payment_id")
        assert reference is not None  # (its own answer has one)
        return Found(reference)


class EmailsClient(Downstream):
    """The email provider; it is NOT idempotent, so a resend is only ever made after a look-up by ref."""

    downstream = "emails"

    async def send(self, body: dict[str, Any]) -> CallOutcome:
        """Send one email; `body["ref"]` identifies it for look-ups."""
        exchange = await self._post("/emails", _call_own("email_id"), body, target=str(body.get("ref")))
        answer = exchange.own
        if answer is None:
            outcome = call_outcome(exchange)
            assert outcome is not None
            return outcome
        return _answer(answer, exchange.body, "email_id")

    async def find(self, ref: str) -> LookupOutcome:
        """Look up the emails sent with this ref."""
        exchange = await self._get("/emails", _emails_found, params={"ref": ref})
        answer = exchange.own
        if answer is None:
            # Only a list says what was sent (an empty one that nothing was). Anything else (null, `{}`, `false`: a
            # proxy's or a broken provider's answer) cannot tell, and taking it for "nothing" would send it again.
            failed = lookup_outcome(exchange)
            assert failed is not None
            return failed
        sent = exchange.body
        if not sent:
            return Missing()
        # Any email listed was sent; the first with an id we can record is the effect's reference.
        reference = next(filter(None, (_reference(email, "email_id") for email in sent)), None)
        return Found(reference) if reference is not None else LookupFailed(ErrorCode.UNEXPECTED_ERROR)

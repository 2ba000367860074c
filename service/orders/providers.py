"""Payment and email provider clients (contract §6). Answers become CallOutcome / LookupOutcome values.

The one distinction that matters: did the provider possibly act? A refused connection did not; a timeout
while waiting for the answer, or a connection cut mid-request, may have — that effect is `uncertain` and only
a look-up can tell.
"""

from __future__ import annotations

from typing import Any

from service.adapters.http import Answer, Downstream, TransportError, call_status, call_transport, lookup_status
from service.domain.codes import ErrorCode
from service.orders.codes import OrderCode
from service.policy.effects import (
    CallOutcome,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    Refused,
    Sent,
    Unknown,
)


def _reference(document: Any, field: str) -> str | None:
    """The provider's id for what it did: a non-empty text or a number in `document[field]`; None otherwise (a
    null, an empty text, a list: an answer we cannot record as a reference)."""
    value = document.get(field) if isinstance(document, dict) else None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        return None
    return str(value)


def _json(response: Answer) -> Any:
    """The answer's JSON body, or None when it is not JSON."""
    try:
        return response.json()
    except ValueError:
        return None


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


def _answer(response: Answer, reference_field: str, payment_kind: str | None = None) -> CallOutcome:
    status = response.status_code
    if status in (200, 201, 202):
        document = _json(response)
        if payment_kind is not None and _declined(document, payment_kind):
            return Refused(OrderCode.PAYMENT_DECLINED)
        reference = _reference(document, reference_field)
        # Without its id it did something, but we cannot tell what: let a look-up decide.
        return Sent(reference) if reference is not None else Unknown(ErrorCode.UNEXPECTED_ERROR)
    if status == 402:
        return Refused(OrderCode.PAYMENT_DECLINED)
    return call_status(response)


class PaymentsClient(Downstream):
    """The idempotent payment provider: the same Idempotency-Key always returns the same payment."""

    async def pay(self, idempotency_key: str, body: dict[str, Any], kind: str) -> CallOutcome:
        """A payment of this kind (`capture`, `refund`), identified by the effect's idempotency key."""
        try:
            response = await self._http.post(
                f"{self._base_url}/payments", json=body, headers={"Idempotency-Key": idempotency_key}
            )
        except TransportError as error:
            return call_transport(error)
        return _answer(response, "payment_id", kind)

    async def find(self, idempotency_key: str, kind: str) -> LookupOutcome:
        """Look a payment of this kind (`capture`, `refund`) up by its idempotency key."""
        try:
            response = await self._http.get(f"{self._base_url}/payments", params={"idempotency_key": idempotency_key})
        except TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code == 404:
            return Missing()
        if response.status_code != 200:
            return lookup_status(response)
        document = _json(response)
        if _declined(document, kind):
            # It took no money: as if there were none (a capture is then sent again, and the provider answers the
            # same key with the same failure; a refund finds nothing to refund).
            return Missing()
        reference = _reference(document, "payment_id")
        return Found(reference) if reference is not None else LookupFailed(ErrorCode.UNEXPECTED_ERROR)


class EmailsClient(Downstream):
    """The email provider; it is NOT idempotent, so a resend is only ever made after a look-up by ref."""

    async def send(self, body: dict[str, Any]) -> CallOutcome:
        """Send one email; `body["ref"]` identifies it for look-ups."""
        try:
            response = await self._http.post(f"{self._base_url}/emails", json=body)
        except TransportError as error:
            return call_transport(error)
        return _answer(response, "email_id")

    async def find(self, ref: str) -> LookupOutcome:
        """Look up the emails sent with this ref."""
        try:
            response = await self._http.get(f"{self._base_url}/emails", params={"ref": ref})
        except TransportError:
            return LookupFailed(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if response.status_code != 200:
            return lookup_status(response)
        sent = _json(response)
        # Only a list says what was sent: an empty one that nothing was. Anything else (null, `{}`, `false`: a proxy's
        # or a broken provider's answer) cannot tell, and taking it for "nothing" would send the email again.
        if not isinstance(sent, list):
            return LookupFailed(ErrorCode.UNEXPECTED_ERROR)
        if not sent:
            return Missing()
        # Any email listed was sent; the first with an id we can record is the effect's reference.
        reference = next(filter(None, (_reference(email, "email_id") for email in sent)), None)
        return Found(reference) if reference is not None else LookupFailed(ErrorCode.UNEXPECTED_ERROR)

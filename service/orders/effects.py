"""The order domain's effects (contract §6): capture and refund at the payment provider, the shipped email.

Each outcome of a payment changes the order (`payment_status`, its version) and publishes a `payment.*` event
on `<source>.events`; an email changes nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from service.orders import store
from service.orders.codes import OrderCode
from service.orders.providers import EmailsClient, PaymentsClient
from service.ports import (
    CallOutcome,
    EffectDecision,
    EffectKind,
    EffectRegistry,
    EffectRow,
    EffectSpec,
    Found,
    LookupFailed,
    LookupOutcome,
    Missing,
    NotSent,
    OutboxMessage,
    Refused,
    Sent,
    Settled,
    Topics,
    add_to_outbox,
    event_headers,
)

CAPTURE = EffectSpec("payment.capture", idempotent=True, provider_setting="payments_url")
REFUND = EffectSpec("payment.refund", idempotent=True, provider_setting="payments_url", waits_for="payment.capture")
SHIPPED_EMAIL = EffectSpec("email.shipped", idempotent=False, provider_setting="emails_url")
SPECS = (CAPTURE, REFUND, SHIPPED_EMAIL)


class _Payment:
    """A payment effect: the idempotent provider, keyed by the effect's idempotency key."""

    def __init__(self, spec: EffectSpec, payments: PaymentsClient) -> None:
        self.spec = spec
        self._payments = payments
        self._kind = "capture" if spec is CAPTURE else "refund"  # what the provider's statuses are read as

    @property
    def enabled(self) -> bool:
        """False when ORDERS_PAYMENTS_URL is unset."""
        return self._payments.enabled

    async def call(self, effect: EffectRow) -> CallOutcome:
        """Capture or refund."""
        if self.spec is REFUND and effect.prerequisite_state == "failed":
            # A capture that failed on our side (refused, exhausted, never found) may still have happened at the
            # provider: ask before deciding that there is nothing to refund.
            captured = await self._payments.find(f"{effect.aggregate_id}/{CAPTURE.name}", "capture")
            if isinstance(captured, Missing):
                # A capture reads as gone after a refund made as its void: this refund's own, if an earlier
                # attempt of it reached the provider and its answer was lost.
                refunded = await self._payments.find(effect.idempotency_key, self._kind)
                if isinstance(refunded, Found):
                    return Sent(refunded.reference)
                if isinstance(refunded, LookupFailed):
                    return NotSent(refunded.code, charged=refunded.charged)
                return Refused(OrderCode.CAPTURE_FAILED)
            if isinstance(captured, LookupFailed):
                return NotSent(captured.code, charged=captured.charged)
        return await self._payments.pay(effect.idempotency_key, effect.payload, self._kind)

    async def look_up(self, effect: EffectRow) -> LookupOutcome:
        """The payment made under the effect's idempotency key, if any."""
        return await self._payments.find(effect.idempotency_key, self._kind)

    async def on_outcomes(self, connection: AsyncConnection, topics: Topics, settled: Sequence[Settled]) -> None:
        """Each sent or failed payment: the order's payment status, its version, and one `payment.*` event."""
        changes = [
            (effect, decision, *outcome)
            for effect, decision in settled
            if (outcome := _OUTCOMES.get((effect.kind, decision.state))) is not None
        ]
        if not changes:
            return  # not settled yet (pending, uncertain): nothing follows
        # The orders' row locks first, then the outbox rows: their ids are then taken after every change of the
        # order that committed before, so the relay publishes one order's events in the order they happened.
        versions = await store.set_payment_statuses(
            connection, [store.PaymentStatus(effect.aggregate_id, status) for effect, _, status, _ in changes]
        )
        messages = [
            _event(topics, effect, decision, event_type, versions.get(effect.aggregate_id))
            for effect, decision, _, event_type in changes
        ]
        await add_to_outbox(connection, messages)


# Per kind and settled state: the order's payment status and the event that announces it.
_OUTCOMES = {
    (CAPTURE.name, "sent"): ("captured", "payment.captured"),
    (REFUND.name, "sent"): ("refunded", "payment.refunded"),
    (CAPTURE.name, "failed"): ("failed", "payment.failed"),
    (REFUND.name, "failed"): ("failed", "payment.failed"),
}


def _event(
    topics: Topics, effect: EffectRow, decision: EffectDecision, event_type: str, version: int | None
) -> OutboxMessage:
    """The `payment.*` event of a settled payment."""
    payload: dict[str, Any]
    if decision.state == "failed":
        payload = {"kind": effect.kind, "errorCode": decision.code.value if decision.code else None}
    else:
        payload = {"paymentId": decision.reference}
    document = {
        "type": event_type,
        "orderId": effect.aggregate_id,
        "orderVersion": version,
        "effect": effect.idempotency_key,
        **payload,
    }
    headers = event_headers(effect.idempotency_key, event_type, None)
    # The span of the call or look-up that settled it, while tracing: the relay's `send` span continues it.
    return OutboxMessage.json(topics.events, effect.aggregate_id, headers, document, effect.trace_context)


class _ShippedEmail:
    """The shipped email: a provider without idempotency, looked up by the email's ref."""

    spec = SHIPPED_EMAIL

    def __init__(self, emails: EmailsClient) -> None:
        self._emails = emails

    @property
    def enabled(self) -> bool:
        """False when ORDERS_EMAILS_URL is unset."""
        return self._emails.enabled

    async def call(self, effect: EffectRow) -> CallOutcome:
        """Send the email."""
        return await self._emails.send(effect.payload)

    async def look_up(self, effect: EffectRow) -> LookupOutcome:
        """The email sent with this effect's ref, if any."""
        return await self._emails.find(str(effect.payload["ref"]))

    async def on_outcomes(self, connection: AsyncConnection, topics: Topics, settled: Sequence[Settled]) -> None:
        """An email's outcome changes nothing else."""


def order_effects(payments: PaymentsClient, emails: EmailsClient) -> EffectRegistry:
    """The order domain's effect kinds, with their clients."""
    kinds: list[EffectKind] = [_Payment(CAPTURE, payments), _Payment(REFUND, payments), _ShippedEmail(emails)]
    return EffectRegistry(kinds)

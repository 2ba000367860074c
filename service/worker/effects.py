"""The effect worker: executes pending external effects (payments, emails) with stable idempotency keys.

Per batch: claim (lease) in one short transaction, call the providers outside any transaction, then record
every outcome — with its events and order changes — in one transaction. Never a second email for one ref:
an email is only sent again after a look-up by its ref found nothing.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import timedelta
from typing import Any

import structlog
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from service.adapters.providers import EmailsClient, PaymentsClient
from service.config import Settings, Topics
from service.domain.codes import ErrorCode
from service.errors import ConcurrentWrite, InfrastructureUnavailable
from service.metrics import Metrics
from service.policy.effects import (
    CallOutcome,
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
)
from service.policy.envelope import event_headers
from service.stopping import sleep_unless_stopped
from service.store import effects, outbox
from service.store.effects import EffectRow
from service.store.outbox import OutboxMessage
from service.store.uow import UnitOfWork

log = structlog.get_logger("order_service.effects")

_IDLE_POLL_SECONDS = 0.2
_CONCURRENCY = 16
_CLAIM = _CONCURRENCY * 4


async def record_outcome(
    connection: AsyncConnection,
    topics: Topics,
    effect: EffectRow,
    decision: EffectDecision,
    *,
    from_state: str,
    owner: str | None = None,
) -> bool:
    """Write an effect's next state and what follows from it (events, the order's payment status), in the
    caller's transaction. False when the effect moved meanwhile (another process owns it now)."""
    if not await effects.settle(connection, effect.idempotency_key, decision, from_state=from_state, owner=owner):
        return False
    event = _event_for(effect, decision)
    if event is None:
        return True
    # The order's row lock first, then the outbox row: its id is then taken after every change of the order
    # that committed before, so the relay publishes one order's events in the order they happened.
    status = {"payment.capture": "captured", "payment.refund": "refunded"}[effect.kind]
    version = await connection.scalar(
        text(
            """
            UPDATE orders SET details = details || jsonb_build_object('payment_status', CAST(:status AS text)),
                              version = version + 1, updated_at = now()
            WHERE order_id = :order_id
            RETURNING version
            """
        ),
        {"status": status if decision.state == "sent" else "failed", "order_id": effect.order_id},
    )
    event_type, payload = event
    headers = event_headers(effect.idempotency_key, event_type, None)
    document = {
        "type": event_type,
        "orderId": effect.order_id,
        "orderVersion": version,
        "effect": effect.idempotency_key,
        **payload,
    }
    await outbox.add(connection, [OutboxMessage.json(topics.events, effect.order_id, headers, document)])
    return True


def _event_for(effect: EffectRow, decision: EffectDecision) -> tuple[str, dict[str, Any]] | None:
    if not effect.kind.startswith("payment."):
        return None
    if decision.state == "failed":
        return "payment.failed", {"kind": effect.kind, "errorCode": decision.code.value if decision.code else None}
    if decision.state == "sent":
        event_type = "payment.captured" if effect.kind == "payment.capture" else "payment.refunded"
        return event_type, {"paymentId": decision.reference}
    return None


class EffectWorker:
    """Claims pending effects with FOR UPDATE SKIP LOCKED and a lease; several workers may run at once."""

    def __init__(
        self,
        settings: Settings,
        engine: AsyncEngine,
        payments: PaymentsClient,
        emails: EmailsClient,
        policy: EffectPolicy,
        metrics: Metrics,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._payments = payments
        self._emails = emails
        self._policy = policy
        self._metrics = metrics
        self._rng = rng
        self._owner = f"effects-{uuid.uuid4().hex[:12]}"
        self._limit = asyncio.Semaphore(_CONCURRENCY)
        # An unset provider URL disables its calls: those effects stay pending (visible in `effects list`).
        self._families = [family for family, client in (("payment", payments), ("email", emails)) if client.enabled]

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set; a database outage is waited out."""
        log.info("effects_started", owner=self._owner, kinds=self._families)
        for family, variable in (("payment", "ORDERS_PAYMENTS_URL"), ("email", "ORDERS_EMAILS_URL")):
            if family not in self._families:
                log.warning("provider_not_configured", kinds=f"{family}.*", variable=variable, effects="stay pending")
        delay = 1.0
        while not stop.is_set():
            try:
                done = await self.work_once()
                delay = 1.0
            except InfrastructureUnavailable:
                log.warning("database_unavailable", retry_in_seconds=delay)
                await sleep_unless_stopped(stop, delay)
                delay = min(delay * 2, 30.0)
                continue
            except ConcurrentWrite:
                continue  # a deadlock rolled the batch back: claimed effects come back when their lease ends
            if done == 0:
                await sleep_unless_stopped(stop, _IDLE_POLL_SECONDS)

    async def work_once(self) -> int:
        """Claim one batch, execute it, record the outcomes; return how many effects were attempted."""
        async with UnitOfWork(self._engine) as uow:
            claimed = await effects.claim(
                uow.connection, self._owner, self._settings.effect_lease, _CLAIM, self._families
            )
            await uow.commit()
        if not claimed:
            return 0
        # The lease is only as good as the clock: no call may start unless it can end before the lease does.
        lease_ends = time.monotonic() + self._settings.effect_lease.total_seconds()
        outcomes = await asyncio.gather(*(self._execute(effect, lease_ends) for effect in claimed))
        async with UnitOfWork(self._engine) as uow:
            for effect, outcome in zip(claimed, outcomes, strict=True):
                if outcome is None:
                    # Not attempted: its lease would have run out mid-call. Hand it back untouched.
                    decision = EffectDecision("pending", retry_in=timedelta(0), unmade=True)
                else:
                    decision = after_call(outcome, effect.attempts, self._policy, self._rng)
                kept = await record_outcome(
                    uow.connection, self._settings.topics, effect, decision, from_state="in_flight", owner=self._owner
                )
                self._report(effect, decision, kept)
            await uow.commit()
        return len(claimed)

    async def _execute(self, effect: EffectRow, lease_ends: float) -> CallOutcome | None:
        async with self._limit:
            budget = self._settings.http_timeout.total_seconds()
            if time.monotonic() + budget * 2 > lease_ends:
                return None
            try:
                # httpx applies its timeout per phase; this bounds the whole exchange (look-up and send).
                async with asyncio.timeout(budget * 2):
                    return await self._call(effect)
            except TimeoutError:
                return Unknown(ErrorCode.DOWNSTREAM_TIMEOUT)

    async def _call(self, effect: EffectRow) -> CallOutcome:
        if effect.kind.startswith("payment."):
            if not self._payments.enabled:
                return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
            if effect.kind == "payment.refund" and effect.capture_state == "failed":
                # A capture that failed on our side (refused, exhausted, never found) may still have happened at
                # the provider: ask before deciding that there is nothing to refund.
                captured = await self._payments.find(f"{effect.order_id}/payment.capture")
                if isinstance(captured, Missing):
                    return Refused(ErrorCode.CAPTURE_FAILED)
                if isinstance(captured, LookupFailed):
                    return NotSent(captured.code)
            return await self._payments.pay(effect.idempotency_key, effect.payload)
        if not self._emails.enabled:
            return NotSent(ErrorCode.DOWNSTREAM_UNREACHABLE)
        if effect.attempts > 1 or effect.reconcile_count > 0:
            # An earlier attempt may have sent it: never send a second email for one ref.
            found = await self._emails.find(effect.payload["ref"])
            if isinstance(found, Found):
                return Sent(found.reference)
            if isinstance(found, LookupFailed):
                return NotSent(found.code)  # cannot tell whether it was sent: ask again later, do not send
        return await self._emails.send(effect.payload)

    def _report(self, effect: EffectRow, decision: EffectDecision, kept: bool) -> None:
        self._metrics.effect(decision.state, decision.code.value if decision.code else None)
        log.info(
            "effect_" + (decision.state if kept else "lease_lost"),
            effect=effect.idempotency_key,
            kind=effect.kind,
            attempt=effect.attempts,
            error_code=decision.code.value if decision.code else None,
            retry_in_seconds=decision.retry_in.total_seconds() if decision.retry_in else None,
        )

"""The inventory domain's effects: the hold at the warehouse when stock is reserved, and its release.

Both calls are idempotent on the effect's key. The release waits for the hold (`waits_for`): the core claims it
only once the hold is resolved, so the warehouse never sees a release before its hold. Each outcome sets the
reservation's `hold_status`, raises its version, and publishes one event on `<source>.events`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from inventory import store as reservations
from inventory.model import HOLD, UNHOLD
from inventory.providers import WarehouseClient
from service.ports import (
    CallOutcome,
    EffectKind,
    EffectRegistry,
    EffectRow,
    EffectSpec,
    LookupOutcome,
    OutboxMessage,
    Settled,
    Topics,
    add_to_outbox,
    event_headers,
)

# `provider_setting` names the variable that enables the calls (INVENTORY_WAREHOUSE_URL): this domain's own
# settings read it (`inventory/settings.py`), the core only names it when the calls are disabled.
HOLD_SPEC = EffectSpec(HOLD, idempotent=True, provider_setting="warehouse_url")
UNHOLD_SPEC = EffectSpec(UNHOLD, idempotent=True, provider_setting="warehouse_url", waits_for=HOLD)
SPECS = (HOLD_SPEC, UNHOLD_SPEC)

# Per kind and settled state: the reservation's hold status and the event that announces it.
_OUTCOMES = {
    (HOLD, "sent"): ("held", "reservation.held"),
    (HOLD, "failed"): ("hold_failed", "reservation.hold_failed"),
    (UNHOLD, "sent"): ("unheld", "reservation.unheld"),
    (UNHOLD, "failed"): ("unhold_failed", "reservation.unhold_failed"),
}


class _WarehouseEffect:
    """A call to the warehouse, keyed by the effect's idempotency key."""

    def __init__(self, spec: EffectSpec, warehouse: WarehouseClient) -> None:
        self.spec = spec
        self._warehouse = warehouse

    @property
    def enabled(self) -> bool:
        """False when INVENTORY_WAREHOUSE_URL is unset: the effects wait, pending."""
        return self._warehouse.enabled

    async def call(self, effect: EffectRow) -> CallOutcome:
        """Hold, or release the hold."""
        if self.spec is HOLD_SPEC:
            return await self._warehouse.hold(effect.idempotency_key, effect.payload)
        return await self._warehouse.release(effect.idempotency_key, effect.payload)

    async def look_up(self, effect: EffectRow) -> LookupOutcome:
        """The hold (or release) the warehouse made under the effect's key, if any."""
        if self.spec is HOLD_SPEC:
            return await self._warehouse.find_hold(effect.idempotency_key)
        return await self._warehouse.find_release(effect.idempotency_key)

    async def on_outcomes(self, connection: AsyncConnection, topics: Topics, settled: Sequence[Settled]) -> None:
        """Each sent or failed call: the reservation's hold status, its version, and one `reservation.*` event."""
        messages: list[OutboxMessage] = []
        for effect, decision in settled:
            outcome = _OUTCOMES.get((effect.kind, decision.state))
            if outcome is None:
                continue  # not settled yet (pending, uncertain): nothing follows
            status, event_type = outcome
            # The reservation's row lock first (in aggregate order), then the outbox rows: one reservation's
            # events publish in order.
            version = await reservations.set_hold_status(connection, effect.aggregate_id, status)
            document = {
                "type": event_type,
                "reservationId": effect.aggregate_id,
                "reservationVersion": version,
                "effect": effect.idempotency_key,
                "reference": decision.reference,
                "errorCode": decision.code.value if decision.code else None,
            }
            headers = event_headers(effect.idempotency_key, event_type, None)
            messages.append(OutboxMessage.json(topics.events, effect.aggregate_id, headers, document))
        await add_to_outbox(connection, messages)


def inventory_effects(warehouse: WarehouseClient) -> EffectRegistry:
    """The inventory domain's effect kinds, with their client."""
    kinds: list[EffectKind] = [_WarehouseEffect(HOLD_SPEC, warehouse), _WarehouseEffect(UNHOLD_SPEC, warehouse)]
    return EffectRegistry(kinds)

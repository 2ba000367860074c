"""Wiring the inventory domain into the core's container (service/containers.py), in place of the orders.

`INVENTORY` is the domain as the core sees it (service/ports.py `Domain`); `use_inventory(container)` gives it to a
container and overrides the container's domain providers (`handler`, `effect_kinds`, `effect_specs`,
`failing_field`, `decode`) with the inventory domain's. The domain's own
settings extend the core's (`InventorySettings`, read with the core's environment prefix): `ORDERS_STOCK_URL`
and `ORDERS_WAREHOUSE_URL`; unset, the stock is not checked before a reserve, or the warehouse calls wait,
pending.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from dependency_injector import providers

from examples.inventory.codes import InventoryCode
from examples.inventory.effects import SPECS, inventory_effects
from examples.inventory.handler import InventoryHandler
from examples.inventory.messages import decode, invalid_field
from examples.inventory.migrations import LOCATION
from examples.inventory.providers import StockClient, WarehouseClient
from service.config import BaseUrl, Settings
from service.containers import Container
from service.ports import Domain, EffectRegistry, Handler, Owners, Plumbing, Reader, read_by

# The domain's migrations, for the core's schema functions (service/store/schema.py `extra_locations`).
MIGRATIONS = (LOCATION,)


class InventorySettings(Settings):
    """The core's settings and the inventory domain's, each read from `ORDERS_<FIELD>`."""

    program: ClassVar[str] = "inventory-service"

    stock_url: Annotated[BaseUrl, read_by(Reader.CONSUMER)] = None  # the handler's look-ups
    warehouse_url: Annotated[BaseUrl, read_by(Reader.EFFECT_PROVIDERS)] = None  # the reservation effects' provider


def inventory_handler(stock: StockClient) -> Handler[Any, Any, Any]:
    """The domain's handler (typed as the core's protocol, so the type checker holds it to the seam)."""
    return InventoryHandler(stock)


def _handler(parts: Plumbing) -> Handler[Any, Any, Any]:
    return inventory_handler(StockClient(parts.http, parts.settings.stock_url, parts.breakers))


def _effects(parts: Plumbing) -> EffectRegistry:
    return inventory_effects(WarehouseClient(parts.http, parts.settings.warehouse_url, parts.breakers))


INVENTORY = Domain(
    program=InventorySettings.program,
    summary="Apply inventory messages from Kafka to PostgreSQL; every record reaches a known terminal state.",
    env_prefix=InventorySettings.variable(""),
    metrics_prefix="inventory",
    alerts_prefix="Inventory",
    logger_root="inventory_service",
    settings=InventorySettings,
    decode=decode,
    failing_field=invalid_field,
    handler=_handler,
    effects=_effects,
    effect_specs=SPECS,
    codes=(InventoryCode,),
    owners=Owners(producers="inventory-producers", oncall="inventory-service-oncall"),
    migrations=MIGRATIONS,
    fakes="examples.inventory.fakes",
)


def use_inventory(container: Container) -> Container:
    """Rewire `container`, whose settings are `InventorySettings`, for the inventory domain (before its resources
    start); returns it."""
    container.domain.override(providers.Object(INVENTORY))
    settings = container.settings
    breakers = container.breakers
    stock = providers.Factory(StockClient, http=container.http, base_url=settings.provided.stock_url, breakers=breakers)
    warehouse = providers.Factory(
        WarehouseClient, http=container.http, base_url=settings.provided.warehouse_url, breakers=breakers
    )
    container.handler.override(providers.Factory(inventory_handler, stock=stock))
    container.effect_kinds.override(providers.Factory(inventory_effects, warehouse=warehouse))
    container.effect_specs.override(providers.Object(SPECS))
    container.failing_field.override(providers.Object(invalid_field))
    container.decode.override(providers.Object(decode))
    return container

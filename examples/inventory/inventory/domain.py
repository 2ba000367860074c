"""The inventory domain as the core sees it: the one value (`DOMAIN`) the `inventory-service` console script builds
the core from (`inventory/__main__.py`)."""

from __future__ import annotations

from inventory.codes import InventoryCode
from inventory.effects import SPECS, inventory_effects
from inventory.handler import InventoryHandler
from inventory.messages import InventoryMessage, decode, invalid_field
from inventory.migrations import LOCATION
from inventory.model import Reservation, Stock
from inventory.providers import StockClient, WarehouseClient
from inventory.settings import ENV_PREFIX, PROGRAM, InventorySettings
from service.ports import Domain, EffectRegistry, Handler, Owners, Plumbing


def inventory_handler(parts: Plumbing) -> Handler[InventoryMessage, Reservation, Stock]:
    """The handler of one process: the stock API's client on the process's HTTP client and breakers."""
    settings: InventorySettings = parts.settings
    return InventoryHandler(StockClient(parts.http, settings.stock_url, parts.breakers, parts.credentials("stock")))


def effect_kinds(parts: Plumbing) -> EffectRegistry:
    """The effect kinds of one process, with the warehouse's client."""
    settings: InventorySettings = parts.settings
    warehouse = WarehouseClient(parts.http, settings.warehouse_url, parts.breakers, parts.credentials("warehouse"))
    return inventory_effects(warehouse)


DOMAIN = Domain(
    program=PROGRAM,
    summary="Apply inventory reservations from Kafka to PostgreSQL; every record reaches a known terminal state.",
    env_prefix=ENV_PREFIX,
    metrics_prefix="inventory",
    alerts_prefix="Inventory",
    logger_root="inventory_service",
    settings=InventorySettings,
    decode=decode,
    failing_field=invalid_field,
    handler=inventory_handler,
    effects=effect_kinds,
    effect_specs=SPECS,
    codes=(InventoryCode,),
    owners=Owners(producers="inventory-producers", oncall="inventory-service-oncall"),
    migrations=(LOCATION,),
    fakes="inventory.fakes",
)

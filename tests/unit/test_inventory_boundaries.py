"""The second domain (examples/inventory, a project of its own) proves the seam: its rules do no I/O, no core module
knows it exists, and the core's container and command line built from its `DOMAIN` serve it with its own names.
(That it imports only the seam module: tests/unit/test_core_and_domain.py.)"""

from __future__ import annotations

import pytest

from inventory.domain import DOMAIN, effect_kinds, inventory_handler
from inventory.effects import SPECS
from inventory.handler import InventoryHandler
from inventory.messages import decode, invalid_field
from inventory.settings import InventorySettings
from service.cli.environment import reads
from service.containers import Container
from tests.unit.test_architecture import IO, REPO_ROOT, imports_of, names_any, relative, sources

EXAMPLE = REPO_ROOT / "examples" / "inventory" / "inventory"
PURE = ("codes.py", "messages.py", "model.py")


def test_the_examples_rules_messages_and_codes_do_no_io() -> None:
    violations = [
        f"{module}:{line} imports {name}"
        for module in PURE
        for line, name in imports_of(EXAMPLE / module)
        if names_any(name, IO)
    ]

    assert not violations, "\n".join(violations)


def test_no_core_module_and_no_core_migration_imports_an_example() -> None:
    core = [*sources(REPO_ROOT / "service"), *sources(REPO_ROOT / "migrations")]
    importing = [
        f"{relative(path)}:{line} imports {name}"
        for path in core
        for line, name in imports_of(path)
        if names_any(name, ("examples", "inventory"))
    ]

    assert len(core) > 50
    assert importing == []


def test_its_settings_are_read_with_its_own_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the inventory's variables, and the order service's for the same settings
    monkeypatch.setenv("INVENTORY_STOCK_URL", "http://stock.test")
    monkeypatch.setenv("INVENTORY_SOURCE_TOPIC", "stock")
    monkeypatch.setenv("ORDERS_SOURCE_TOPIC", "orders")

    settings = InventorySettings()

    # Then only the inventory's are read, and the defaults name the inventory service
    assert (settings.stock_url, settings.source_topic) == ("http://stock.test", "stock")
    assert (settings.consumer_name, settings.warehouse_url) == ("inventory-service", None)
    assert DOMAIN.variable("stock_url") == "INVENTORY_STOCK_URL"


def test_each_commands_help_names_the_inventorys_variables() -> None:
    consume = reads("consume", DOMAIN.settings)

    assert {"INVENTORY_DATABASE_URL", "INVENTORY_SOURCE_TOPIC", "INVENTORY_STOCK_URL"} <= set(consume)
    assert [variable for variable in consume if not variable.startswith("INVENTORY_")] == []
    assert "INVENTORY_WAREHOUSE_URL" in reads("effects", DOMAIN.settings)


def test_the_container_built_from_its_domain_serves_the_inventory() -> None:
    settings = InventorySettings(stock_url="http://stock.test/", warehouse_url="http://warehouse.test")

    container = Container(domain=DOMAIN, settings=settings)

    # (The handler and the effect kinds take the container's HTTP client, a resource: only named here.)
    assert DOMAIN.handler is inventory_handler
    assert DOMAIN.effects is effect_kinds
    assert container.effect_specs() == SPECS
    assert container.failing_field() is invalid_field
    assert container.decode() is decode
    assert DOMAIN.program == "inventory-service"
    assert InventoryHandler.rows.raced_key == "pk_reservations"

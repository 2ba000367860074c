"""The second domain (examples/inventory) proves the seam: it is built only on the core's public modules, never on
the order domain, its rules do no I/O, and no core module knows it exists."""

from __future__ import annotations

from pathlib import Path

from examples.inventory.composition import InventorySettings, inventory_handler, use_inventory
from examples.inventory.effects import SPECS, inventory_effects
from examples.inventory.messages import decode, invalid_field
from service.containers import Container
from tests.unit.test_architecture import IO, REPO_ROOT, imports_of, names_any, relative, sources

EXAMPLE = REPO_ROOT / "examples" / "inventory"
# The core's public API for a domain: the seams the template guide names, the values they exchange, and the
# composition root a domain rewires.
CORE_API = frozenset(
    {
        "service.adapters.http",
        "service.config",
        "service.containers",
        "service.domain.codes",
        "service.domain.fields",
        "service.errors",
        "service.policy.effects",
        "service.policy.envelope",
        "service.policy.handling",
        "service.policy.records",
        "service.readers",
        "service.store.batch",
        "service.store.effects",
        "service.store.outbox",
        "service.store.recordset",
        "service.store.schema",
        "service.testing.faults",
        "service.ports",
    }
)
PURE = ("codes.py", "messages.py", "model.py")


def _public(name: str) -> bool:
    """A core API module, a name in one (`service.policy.effects.Sent`), or a package above one."""
    parent = name.rpartition(".")[0]
    return name in CORE_API or parent in CORE_API or any(module.startswith(f"{name}.") for module in CORE_API)


def example_sources() -> list[Path]:
    """Every module of the example, its migrations included."""
    return sources(EXAMPLE)


def test_the_example_imports_only_the_cores_public_modules_and_never_the_order_domain() -> None:
    core_imports = [
        (relative(path), line, name)
        for path in example_sources()
        for line, name in imports_of(path)
        if names_any(name, ("service",))
    ]

    assert core_imports, "the scan found no core imports: it would check nothing"
    assert [found for found in core_imports if names_any(found[2], ("service.orders",))] == []
    assert [found for found in core_imports if not _public(found[2])] == []


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
        if names_any(name, ("examples",))
    ]

    assert len(core) > 50
    assert importing == []


def test_the_public_module_rule_tells_a_seam_from_an_internal() -> None:
    assert [_public(name) for name in ("service.store", "service.policy.effects.Sent")] == [True, True]
    assert [_public(name) for name in ("service.store.uow", "service.worker.processor")] == [False, False]


def test_the_composition_rewires_every_domain_provider_of_the_core() -> None:
    settings = InventorySettings(stock_url="http://stock.test/", warehouse_url="http://warehouse.test")

    container = use_inventory(Container(settings=settings))

    # (The handler and the effect kinds take the container's HTTP client, a resource: only named here.)
    assert container.handler.last_overriding.provides is inventory_handler
    assert container.effect_kinds.last_overriding.provides is inventory_effects
    assert container.effect_specs() == SPECS
    assert container.failing_field() is invalid_field
    assert container.decode() is decode

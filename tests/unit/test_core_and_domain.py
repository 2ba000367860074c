"""The reusable core and the order domain (contract §12): imports point from the domain to the core's one seam
module (`service.ports`), never back; only the entry point picks the domain.

The count of order-domain names per core module (identifiers and strings; tests/unit/test_core_names.py reads
every file whole) is a ratchet: it may only go down. Each entry of NAMES_AT_MOST is listed so that it is seen.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.test_architecture import IO, PACKAGE, REPO_ROOT, imports_of, module_name, names_any, relative, sources

DOMAIN = "service.orders"
SEAM = "service.ports"  # the one module of the core a domain imports
LAUNCH = "service.launch"  # what a domain's console script (its `__main__`, the composition root) starts it with
ENTRY_POINT = {"service.__main__"}  # the console script: the one place that picks the domain
PURE_DOMAIN = ("service/orders/model.py", "service/orders/messages.py")

# Core modules that still import the domain: none (the container and the command line are built from the
# domain's `Domain` value); keep it so.
STILL_IMPORT_THE_DOMAIN: set[str] = set()
# Order-domain names (identifiers and strings that are not docstrings: order, payment, customer, email) per
# core module, at most.
NAMES_AT_MOST = {
    # Held at 0: failure ids in help texts are `<topic>/<partition>/<offset>`.
    "service/cli/quarantine.py": 0,
    # Held at 0: the core settings' defaults are generic (the domain's settings class names its database and topic).
    "service/config.py": 0,
    "service/names.py": 0,
    # Held at 0, not debt: the generic fault-injection server; the orders' fakes on it are service/orders/fakes.py.
    "service/testing/__init__.py": 0,
    "service/testing/faults.py": 0,
    "service/testing/process.py": 0,
    "service/testing/routes.py": 0,
    "service/testing/scripted.py": 0,
    "service/testing/serving.py": 0,
}
# SQL's ORDER BY (`order_by`) and English "in order" / "in the order" are not the order domain.
_DOMAIN_WORD = re.compile(
    r"(?i)(?<![a-z])(?<!in )(?<!the )(orders?(?![ _]by(?![a-z]))|payments?|customers?|emails?)(?![a-z])"
)


def core_sources() -> list[Path]:
    """Every module outside the domain package (the fault-injection server in `service/testing/` is core)."""
    return [path for path in sources() if path.relative_to(PACKAGE).parts[0] != "orders"]


def domain_words(path: Path) -> list[str]:
    """The order-domain words in a module's identifiers and in its strings that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    texts: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
        elif isinstance(node, ast.arg):
            texts.append(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            texts.append(node.name)
        elif isinstance(node, ast.alias):
            texts += [node.name, node.asname or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts.append(node.value)
    return [word for text in texts for word in _DOMAIN_WORD.findall(text)]


def test_the_core_does_not_import_the_domain_beyond_the_listed_debt() -> None:
    importing = {
        module_name(path)
        for path in core_sources()
        if module_name(path) not in ENTRY_POINT
        if any(names_any(name, (DOMAIN,)) for _, name in imports_of(path))
    }

    assert importing - STILL_IMPORT_THE_DOMAIN == set(), "the core must not import the domain"
    assert STILL_IMPORT_THE_DOMAIN - importing == set(), "no longer imports the domain: strike it from the list"


def test_the_core_names_the_order_domain_no_more_than_before() -> None:
    counts = {
        relative(path): len(domain_words(path)) for path in core_sources() if module_name(path) not in ENTRY_POINT
    }
    grown = {path: count for path, count in counts.items() if count > NAMES_AT_MOST.get(path, 0)}
    shrunk = {path: count for path, count in counts.items() if count < NAMES_AT_MOST.get(path, 0)}

    assert not grown, f"the core names the order domain more: {grown}"
    assert not shrunk, f"fewer order-domain names now: lower NAMES_AT_MOST to {shrunk}"


# Each domain's package and its own modules' import name: the order domain in this distribution, the inventory
# example in a project of its own (examples/inventory).
DOMAINS = {
    "orders": (PACKAGE / "orders", DOMAIN),
    "inventory": (REPO_ROOT / "examples" / "inventory" / "inventory", "inventory"),
}


@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_a_domain_imports_from_the_core_only_the_seam_module(domain: str) -> None:
    package, itself = DOMAINS[domain]
    beyond_the_seam = [
        f"{relative(path)}:{line} imports {name}"
        for path in sources(package)
        for line, name in imports_of(path)
        if names_any(name, ("service",))
        and not names_any(name, (itself, SEAM))
        and not (path.name == "__main__.py" and names_any(name, (LAUNCH,)))
    ]
    seam = [name for path in sources(package) for _, name in imports_of(path) if names_any(name, (SEAM,))]

    assert seam, "the scan found no import of the seam: it would check nothing"
    assert beyond_the_seam == []


def test_only_the_entry_point_imports_the_domain() -> None:
    importing = {
        module_name(path) for path in core_sources() if any(names_any(name, (DOMAIN,)) for _, name in imports_of(path))
    }

    assert importing == ENTRY_POINT


def test_the_effect_machinery_names_no_kind_of_effect() -> None:
    # The effect registry seam: kinds, calls, look-ups and dependencies come from the domain's registry.
    machinery = ("worker/effect_kinds.py", "worker/effects.py", "worker/reconciler.py", "store/effects.py")
    for module in machinery:
        words = {word.lower().rstrip("s") for word in domain_words(PACKAGE / module)}
        assert words & {"payment", "email"} == set(), module


def test_the_domain_rules_and_schemas_do_no_io() -> None:
    violations = [
        f"{module}:{line} imports {name}"
        for module in PURE_DOMAIN
        for line, name in imports_of(REPO_ROOT / module)
        if names_any(name, IO)
    ]

    assert not violations, "\n".join(violations)


def test_the_word_scanner_sees_identifiers_and_sql_but_not_docstrings(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""About orders."""\ndef pay(order_id):\n    """Emails."""\n    return "SELECT payment"\n')

    assert domain_words(module) == ["order", "payment"]


def test_the_domain_registers_its_own_codes_and_none_is_a_core_code() -> None:
    from service.codes import DomainCode, ErrorCode, FailureKind, registered
    from service.orders.codes import OrderCode

    codes = registered(OrderCode)
    assert {code.value for code in ErrorCode} < set(codes)
    assert all(codes[code.value] is FailureKind.REJECTED for code in OrderCode)
    assert not {code.value for code in OrderCode} & {code.value for code in ErrorCode}

    class Clashing(DomainCode):
        UNEXPECTED_ERROR = "UNEXPECTED_ERROR"

    with pytest.raises(ValueError, match="defined twice"):
        registered(OrderCode, Clashing)

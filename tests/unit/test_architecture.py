"""The layers' imports point inward, and every module follows the house rules (STYLE.md §1, §8, §9).

The sources are parsed with `ast`, never imported, so a forbidden import is found even where it would not run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "service"
DRIVERS = ("sqlalchemy", "aiokafka", "aiohttp", "httptools", "httpx", "asyncpg")
ENTRYPOINTS = ("service.worker", "service.cli", "service.containers", "service.__main__")
# What a domain's pure modules (its rules and message schemas) may not import: drivers, logging, the core's I/O.
IO = (*DRIVERS, "structlog", "service.store", "service.adapters", "service.worker")
LAYER_RULES = {
    "policy": (*DRIVERS, "service.store", "service.adapters", *ENTRYPOINTS),
    "store": ENTRYPOINTS,
    "adapters": ENTRYPOINTS,
    # The console is a shell beside the CLI: it reads through the store and acts through service.operations;
    # the composition root hands it what it needs (service/cli/console.py builds its Wiring).
    "console": (
        "aiokafka",
        "aiohttp",
        "httptools",
        "httpx",
        "asyncpg",
        "service.cli",
        "service.containers",
        "service.adapters",
    ),
}
MAY_IMPORT_CONTAINERS = {"service.containers", "service.cli"}


def module_name(path: Path) -> str:
    """`service/orders/model.py` → `service.orders.model`; a package's `__init__.py` is the package."""
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(under: Path = PACKAGE) -> list[Path]:
    """Every Python file of the package below `under`, in a stable order."""
    return sorted(under.rglob("*.py"))


def imported_modules(tree: ast.Module, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """Every module an import statement names, absolute, with its line; `from a import b` names `a` and `a.b`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*")
    return found


def names_any(name: str, prefixes: tuple[str, ...]) -> str | None:
    """The forbidden prefix that `name` is, or is inside of."""
    return next((prefix for prefix in prefixes if name == prefix or name.startswith(f"{prefix}.")), None)


def parse(path: Path) -> ast.Module:
    """The syntax tree of one source file."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def imports_of(path: Path) -> list[tuple[int, str]]:
    """The absolute module names one source file imports."""
    return imported_modules(parse(path), module_name(path), is_package=path.name == "__init__.py")


def is_package_marker(path: Path) -> bool:
    """An `__init__.py` holding nothing but, at most, a docstring."""
    tree = parse(path)
    return path.name == "__init__.py" and len(tree.body) == (1 if ast.get_docstring(tree) is not None else 0)


def relative(path: Path) -> str:
    """A path as the report shows it."""
    return path.relative_to(REPO_ROOT).as_posix()


def test_the_import_scanner_sees_plain_from_and_relative_imports() -> None:
    tree = ast.parse(
        "import sqlalchemy.orm\n"
        "from service import containers\n"
        "from ..store import outbox\n"
        "from . import codes\n"
        "def later():\n"
        "    import httpx\n"
    )

    names = {name for _, name in imported_modules(tree, "service.orders.model")}

    assert {"sqlalchemy.orm", "service.containers", "service.store.outbox", "service.orders.codes", "httpx"} <= names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sqlalchemy", "sqlalchemy"),
        ("sqlalchemy.ext.asyncio", "sqlalchemy"),
        ("service.store.tables", "service.store"),
        ("service.storefront", None),
        ("httpx_mock", None),
    ],
)
def test_a_forbidden_prefix_matches_the_module_and_its_submodules_only(name: str, expected: str | None) -> None:
    assert names_any(name, ("sqlalchemy", "service.store")) == expected


@pytest.mark.parametrize("layer", sorted(LAYER_RULES))
def test_a_layer_imports_nothing_from_the_layers_outside_it(layer: str) -> None:
    files = sources(PACKAGE / layer)
    assert files, f"service/{layer}/ has no modules: the rule would check nothing"

    violations = [
        f"{relative(path)}:{line} imports {name}"
        for path in files
        for line, name in imports_of(path)
        if names_any(name, LAYER_RULES[layer])
    ]

    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("module", ["codes.py", "fields.py"])
def test_the_vocabulary_every_domain_shares_is_pure(module: str) -> None:
    # (the core's error codes and the field types of message schemas: imported by domains through service.ports)
    path = PACKAGE / module
    forbidden = (*DRIVERS, "structlog", "service.policy", "service.store", "service.adapters", *ENTRYPOINTS)

    violations = [
        f"{relative(path)}:{line} imports {name}" for line, name in imports_of(path) if names_any(name, forbidden)
    ]

    assert not violations, "\n".join(violations)


def test_only_the_container_and_the_cli_import_the_container() -> None:
    violations = [
        f"{relative(path)}:{line} imports {name}"
        for path in sources()
        if module_name(path) not in MAY_IMPORT_CONTAINERS and not module_name(path).startswith("service.cli.")
        for line, name in imports_of(path)
        if names_any(name, ("service.containers",))
    ]

    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("path", [path for path in sources() if not is_package_marker(path)], ids=relative)
def test_every_module_opens_with_its_docstring_then_the_future_import(path: Path) -> None:
    tree = parse(path)
    has_docstring = ast.get_docstring(tree, clean=False) is not None
    after_docstring = tree.body[1:] if has_docstring else tree.body

    assert has_docstring, "the module has no docstring"
    assert after_docstring, "the module has nothing after its docstring, not even the future import"
    first = after_docstring[0]
    assert isinstance(first, ast.ImportFrom), f"line {first.lineno} comes before `from __future__ import annotations`"
    assert first.module == "__future__"
    assert "annotations" in {alias.name for alias in first.names}


@pytest.mark.parametrize("path", sources(), ids=relative)
def test_every_public_function_and_class_of_a_module_has_a_docstring(path: Path) -> None:
    missing = [
        f"{relative(path)}:{node.lineno} {node.name}"
        for node in parse(path).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and not node.name.startswith("_")
        and ast.get_docstring(node) is None
    ]

    assert not missing, "\n".join(missing)

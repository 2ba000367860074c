"""All SQL lives in the store layer, written one way (issue 15, deliverable 6).

The store layer is `service/store/` and a domain's own store and schema modules (`store.py`, `tables.py` of
`service/orders/` or of an example under `examples/`). Outside it no module writes SQL: no `text()`, no query
builder, no statement in a string, no table objects; workers, the container and a domain's effects call store
functions. Inside it, one style: statements written out in SQL, as module-level `text()` constants with bound
parameters, never SQLAlchemy's Core query builders, because the hot path's statements (service/store/batch.py,
lookups.py, the recordset fragments) must stay hand-written SQL. Like test_architecture.py, this reads the
sources with `ast` and imports nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.unit.test_architecture import REPO_ROOT, imports_of, parse, relative

DOMAINS = (
    REPO_ROOT / "service/orders",  # one path, so that a copy's rename reaches it
    # each example project's domain package (examples/inventory/inventory/)
    *sorted(p.parent for p in (REPO_ROOT / "examples").glob("*/*/__init__.py")),
)
STORE_MODULES = ("store.py", "tables.py")
# SQLAlchemy's Core query builders: the second style of SQL, which the store layer does not use.
QUERY_BUILDERS = frozenset({"select", "insert", "update", "delete", "exists", "union", "union_all", "and_", "or_"})
# What writes a statement out in SQL: the store layer's own tool.
SQL_TEXT = frozenset({"text", "literal_column", "TextClause"})
TABLES = ("service.store.tables", "service.orders.tables")
# A statement in a string, pragmatically: the keywords as this code base writes them (upper case).
STATEMENT = re.compile(r"\bSELECT\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+(\s+\w+)?\s+SET\b|\bDELETE\s+FROM\b|\bpg_\w+\(")

# Modules that still write SQL outside the store layer: debt, listed so that it is seen; it may only shrink.
STILL_WRITE_SQL: dict[str, str] = {
    # Not debt: the seam re-exports the core's table metadata for a domain's own tables module; it writes no SQL.
    "service/ports.py": "re-exports service.store.tables.metadata",
}


def python_sources() -> list[Path]:
    """Every module of the service and of the examples, migrations (schema history, not queries) and the examples'
    tests aside."""
    found = [*(REPO_ROOT / "service").rglob("*.py"), *(REPO_ROOT / "examples").rglob("*.py")]
    return sorted(path for path in found if not {"migrations", "tests"} & set(path.relative_to(REPO_ROOT).parts))


def in_store_layer(path: Path) -> bool:
    """`service/store/`, or a domain's `store.py` or `tables.py`."""
    return path.is_relative_to(REPO_ROOT / "service" / "store") or (
        path.parent in DOMAINS and path.name in STORE_MODULES
    )


def sqlalchemy_names(tree: ast.Module) -> list[tuple[int, str]]:
    """The names imported from SQLAlchemy (any of its modules), with their lines."""
    return [
        (node.lineno, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy"
        for alias in node.names
    ]


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and its functions."""
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def statements_in_strings(tree: ast.Module) -> list[tuple[int, str]]:
    """Strings (f-string parts included, docstrings not) that hold a SQL statement, with their lines."""
    skipped = docstrings(tree)
    return sorted(
        (node.lineno, " ".join(node.value.split())[:60])
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skipped
        and STATEMENT.search(node.value)
    )


def tables_imported(path: Path) -> list[tuple[int, str]]:
    """The table modules (SQLAlchemy `Table` objects, what Core queries are built from) a module imports."""
    return [
        (line, name)
        for line, name in imports_of(path)
        if any(name == tables or name.startswith(f"{tables}.") for tables in TABLES)
    ]


def sql_written(path: Path) -> list[str]:
    """Every way a module writes SQL: SQL text or a query builder imported, a tables module imported, a statement."""
    tree = parse(path)
    found = [
        f"{line}: imports {name} from sqlalchemy"
        for line, name in sqlalchemy_names(tree)
        if name in SQL_TEXT | QUERY_BUILDERS
    ]
    found += [f"{line}: imports {name}" for line, name in tables_imported(path)]
    found += [f"{line}: SQL in a string: {excerpt!r}" for line, excerpt in statements_in_strings(tree)]
    return found


def test_the_scanner_sees_sql_text_query_builders_tables_and_statements_in_strings() -> None:
    tree = ast.parse(
        '"""A docstring may say SELECT * FROM inbox."""\n'
        "from sqlalchemy import text\n"
        "from sqlalchemy.dialects.postgresql import insert\n"
        'QUERY = f"SELECT id FROM {TABLE} WHERE id = :id"\n'
        'LOCK = "SELECT pg_try_advisory_lock(hashtext(:key))"\n'
        'MOVE = "UPDATE effects e SET state = :state"\n'
        'METHODS = ("GET", "DELETE")\n'
    )

    assert sqlalchemy_names(tree) == [(2, "text"), (3, "insert")]
    assert [line for line, _ in statements_in_strings(tree)] == [4, 5, 6]


def test_the_store_layer_is_the_store_package_and_each_domains_store_and_tables() -> None:
    assert in_store_layer(REPO_ROOT / "service" / "store" / "outbox.py")
    assert in_store_layer(REPO_ROOT / "service/orders" / "store.py")
    assert in_store_layer(REPO_ROOT / "service/orders" / "tables.py")
    assert not in_store_layer(REPO_ROOT / "service/orders" / "effects.py")
    assert not in_store_layer(REPO_ROOT / "service" / "worker" / "gauges.py")


@pytest.mark.parametrize("path", [path for path in python_sources() if not in_store_layer(path)], ids=relative)
def test_no_module_outside_the_store_layer_writes_sql(path: Path) -> None:
    found = sql_written(path)

    if relative(path) in STILL_WRITE_SQL:
        assert found, "no longer writes SQL: strike it from STILL_WRITE_SQL"
    else:
        assert not found, "SQL belongs in a store module; call a store function instead:\n" + "\n".join(found)


@pytest.mark.parametrize("path", [path for path in python_sources() if in_store_layer(path)], ids=relative)
def test_the_store_layer_writes_sql_out_never_through_query_builders(path: Path) -> None:
    tree = parse(path)
    builders = [f"{line}: {name}" for line, name in sqlalchemy_names(tree) if name in QUERY_BUILDERS]
    # Only a schema description names the table objects (a domain's tables join the core's metadata).
    tables = [f"{line}: {name}" for line, name in tables_imported(path) if path.name != "tables.py"]

    assert not builders, "one style: SQL written out in a text() constant, not a Core builder:\n" + "\n".join(builders)
    assert not tables, "a query module names no table objects (tables.py is the schema only):\n" + "\n".join(tables)


def test_the_listed_debt_names_existing_modules() -> None:
    assert all((REPO_ROOT / path).is_file() for path in STILL_WRITE_SQL)

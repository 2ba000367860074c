"""No import cycles: not between modules, not between the service's parts, not between the scripts.

Every import counts, at the top of a module, inside a function or under `TYPE_CHECKING`: an import moved into a
function still ties the two modules together, it only hides the cycle from the interpreter. The parts are the
service's packages and top-level modules (`service.store`, `service.config`, …): a cycle between two of them means
neither is the lower layer, even where no two modules import each other.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest

from tests.unit.test_architecture import PACKAGE, REPO_ROOT, module_name, parse, relative, sources

SCRIPTS = REPO_ROOT / "scripts"

# An edge of the graph: the importing module, the imported one, and where (file:line) the import is written.
Edges = dict[str, dict[str, str]]


def imported(tree: ast.Module, module: str, *, is_package: bool, known: Iterable[str]) -> list[tuple[int, str]]:
    """The known modules one module's import statements name, with their lines: `from a import b` names `a.b` when
    that is a module, else `a`; `import a.b.c` names the longest known module it starts with."""
    modules = set(known)

    def longest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    found: list[tuple[int, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, longest(alias.name)) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                found.append(
                    (node.lineno, f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else longest(base))
                )
    return [(line, name) for line, name in found if name is not None and name != module]


def module_graph(files: Mapping[str, Path]) -> Edges:
    """Which module imports which, among `files` ({module name: its source})."""
    edges: Edges = {module: {} for module in files}
    for module, path in files.items():
        tree = parse(path)
        for line, target in imported(tree, module, is_package=path.name == "__init__.py", known=files):
            edges[module].setdefault(target, f"{relative(path)}:{line}")
    return edges


def collapsed(edges: Edges, part: Callable[[str], str]) -> Edges:
    """The graph between parts: an edge wherever a module of one part imports a module of another."""
    parts: Edges = {part(module): {} for module in edges}
    for module, targets in edges.items():
        for target, where in targets.items():
            if part(module) != part(target):
                parts[part(module)].setdefault(part(target), where)
    return parts


def service_part(module: str) -> str:
    """`service.store.uow` → `service.store`; `service.config` → itself."""
    return ".".join(module.split(".")[:2])


def cycles(edges: Edges) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one node (Tarjan's algorithm, then the
    shortest way back to the component's first node), as the nodes in import order, the first repeated last."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return [_shortest_cycle(edges, component) for component in components]


def _shortest_cycle(edges: Edges, component: set[str]) -> list[str]:
    start = min(component)
    came_from: dict[str, str] = {}
    pending = deque([start])
    while pending:
        node = pending.popleft()
        for target in sorted(edges[node]):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target in component and target not in came_from:
                came_from[target] = node
                pending.append(target)
    raise AssertionError(f"{sorted(component)} is strongly connected but has no cycle through {start}")


def shown(edges: Edges, cycle: list[str]) -> str:
    """A cycle as the failure prints it: each import and where it is written."""
    steps = [f"  {a} -> {b}  ({edges[a][b]})" for a, b in itertools.pairwise(cycle)]
    return "\n".join([" -> ".join(cycle), *steps])


def service_modules() -> dict[str, Path]:
    """Every module of the service package."""
    return {module_name(path): path for path in sources(PACKAGE)}


def script_modules() -> dict[str, Path]:
    """The scripts' Python modules: each imports the others by its bare name (scripts/ is on the path)."""
    return {path.stem: path for path in sorted(SCRIPTS.glob("*.py"))}


def test_the_cycle_finder_finds_a_cycle_and_says_where_each_import_is() -> None:
    edges: Edges = {
        "a": {"b": "a.py:3"},
        "b": {"c": "b.py:5", "d": "b.py:6"},
        "c": {"a": "c.py:9"},  # inside a function, say: it counts all the same
        "d": {},
    }

    found = cycles(edges)

    assert found == [["a", "b", "c", "a"]]
    assert shown(edges, found[0]).splitlines()[1:] == ["  a -> b  (a.py:3)", "  b -> c  (b.py:5)", "  c -> a  (c.py:9)"]


def test_the_scanner_counts_imports_inside_functions_and_resolves_from_imports_to_modules() -> None:
    tree = ast.parse(
        "from service.store import uow, connect\n"
        "from service.config import Settings\n"
        "def later():\n"
        "    from service.explain import explain\n"
    )
    known = {"service.store", "service.store.uow", "service.store.connect", "service.config", "service.explain"}

    names = {name for _, name in imported(tree, "service.adapters.kafka", is_package=False, known=known)}

    assert names == {"service.store.uow", "service.store.connect", "service.config", "service.explain"}


def test_parts_connected_through_different_modules_form_a_cycle() -> None:
    edges: Edges = {
        "service.config": {"service.console.tokens": "service/config.py:26"},
        "service.console.tokens": {},
        "service.console.app": {"service.config": "service/console/app.py:29"},
    }

    assert cycles(edges) == []
    assert cycles(collapsed(edges, service_part)) == [["service.config", "service.console", "service.config"]]


@pytest.mark.parametrize(
    ("graph", "build"),
    [
        ("the service's modules", lambda: module_graph(service_modules())),
        ("the service's parts", lambda: collapsed(module_graph(service_modules()), service_part)),
        ("the scripts", lambda: module_graph(script_modules())),
    ],
    ids=["service-modules", "service-parts", "scripts"],
)
def test_nothing_imports_itself_through_others(graph: str, build: Callable[[], Edges]) -> None:
    edges = build()
    assert len(edges) > 1, f"{graph}: the graph has no modules: the check would check nothing"

    found = cycles(edges)

    assert not found, f"import cycles in {graph}:\n" + "\n".join(shown(edges, cycle) for cycle in found)


def test_the_program_s_names_import_nothing_of_the_service() -> None:
    names = PACKAGE / "names.py"

    imports = [name for _, name in imported(parse(names), "service.names", is_package=False, known=service_modules())]

    assert imports == [], f"service/names.py, below every layer, imports {imports}"

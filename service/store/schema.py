"""The database schema: Alembic's `upgrade heads`, run from the migrations that travel inside the package.

The revisions live in the checkout's top-level `migrations/` and are installed as `service.migrations`, so an
installed wheel migrates from any directory without an `alembic.ini`; `alembic` in the checkout still works.

The core's history is for the core's tables (its revision 0016 handed the order domain's table over to that
domain). A domain keeps its revisions in a version location of its own, on a branch of its own (`branch_labels`,
`depends_on` a core revision: `service/orders/migrations/`, `examples/inventory/inventory/migrations/`). Every
function here takes those locations in `extra_locations`: the history has several heads, `upgrade heads` brings
each to its head, and the schema is current when every head is applied. Without extra locations it is the core's
history alone.

Every long-running command checks the schema as it starts, and importing Alembic is a large part of a start (its
package imports every dialect's DDL, and Mako's syntax highlighters with it). So the check first reads each
revision file's `revision`, `down_revision` and `depends_on` without importing it, and asks Alembic only when those
do not simply match the version table (docs/performance.md).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.resources import as_file, files
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from service.errors import SchemaNewer, SchemaNotCurrent
from service.names import PROGRAM
from service.store import connect
from service.store.connect import Database
from service.store.uow import create_engine

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS = "service.migrations"

Locations = Sequence[str | os.PathLike[str]]


@contextmanager
def alembic_config(database: Database | str, extra_locations: Locations = ()) -> Iterator[Config]:
    """Alembic's configuration for `database`, with the packaged revisions (and `extra_locations`), for the block.
    The migrations' environment (migrations/env.py) connects to it as the service does (`Database`: its TLS, its
    password), never through a URL in the configuration, where a password would be written out."""
    with _script_config(extra_locations) as config:
        config.attributes["database"] = connect.database(database) if isinstance(database, str) else database
        yield config


def upgrade_to_head(database: Database | str, extra_locations: Locations = ()) -> str:
    """Apply every migration not yet applied; returns the head revision the schema is now at (the heads, comma
    separated, when extra locations add branches)."""
    from alembic import command
    from alembic.script import ScriptDirectory

    with alembic_config(database, extra_locations) as config:
        command.upgrade(config, "heads" if extra_locations else "head")
        heads = ScriptDirectory.from_config(config).get_heads()
    return _listed(heads) or "base"


def head_revision(extra_locations: Locations = ()) -> str:
    """The revision this version of the service needs (the newest migration it carries; with extra locations,
    the head of every branch, comma separated)."""
    from alembic.script import ScriptDirectory

    with _script_config(extra_locations) as config:
        return _listed(ScriptDirectory.from_config(config).get_heads()) or "base"


async def require_head(database: Database | str, extra_locations: Locations = (), program: str = PROGRAM) -> None:
    """Raise SchemaNotCurrent unless the database is at `head_revision()` (long-running commands check first); its
    message names `program`'s migrate command. A revision this version does not know raises SchemaNewer."""
    check_heads(await current_heads(database), extra_locations, program)


async def require_head_on(connection: AsyncConnection, extra_locations: Locations = (), program: str = PROGRAM) -> None:
    """`require_head` on an open connection: every command checks so before it reads or writes anything else."""
    check_heads(await _heads_on(connection), extra_locations, program)


def check_heads(current: Sequence[str], extra_locations: Locations = (), program: str = PROGRAM) -> None:
    """Whether a version table holding `current` is this version's schema: return when it is; SchemaNewer when it
    names a revision this version does not know (a newer release migrated the database), SchemaNotCurrent when it
    is behind (never migrated, or older)."""
    if not current:
        raise SchemaNotCurrent(f"the database is not migrated: run `{program} migrate`")
    if frozenset(current) == _recorded_heads(extra_locations):
        return
    from alembic.script import ScriptDirectory

    with _script_config(extra_locations) as config:
        script = ScriptDirectory.from_config(config)
        heads = script.get_heads()
        _refuse_unknown(script, current, heads, program)
        if not _applied(script, current, heads):
            raise SchemaNotCurrent(
                f"the database schema is at {_listed(current)}, this version needs {_listed(heads)}: "
                f"run `{program} migrate`"
            )


def refuse_unknown(current: Sequence[str], extra_locations: Locations = (), program: str = PROGRAM) -> None:
    """SchemaNewer when the version table holding `current` names a revision this version does not know (`migrate`
    checks so before it upgrades: Alembic would only fail to find it)."""
    if not current or frozenset(current) == _recorded_heads(extra_locations):
        return
    from alembic.script import ScriptDirectory

    with _script_config(extra_locations) as config:
        script = ScriptDirectory.from_config(config)
        _refuse_unknown(script, current, script.get_heads(), program)


def _refuse_unknown(script: ScriptDirectory, current: Sequence[str], heads: Sequence[str], program: str) -> None:
    known = {revision.revision for revision in script.walk_revisions()}
    unknown = [revision for revision in current if revision not in known]
    if unknown:
        # Worded as the behind case is ("is at …, this version needs …: run …"), with what to run instead.
        raise SchemaNewer(
            f"the database schema is at {_listed(current)}, this version needs {_listed(heads)}: run a newer "
            f"release of {program} ({_listed(unknown)} is newer than this release knows; `{program} migrate` "
            "cannot go back)"
        )


async def current_revision(database: Database | str) -> str | None:
    """The revision the database is at (its heads, comma separated, when it has several), or None when it was
    never migrated."""
    return _listed(await current_heads(database)) or None


async def current_heads(database: Database | str) -> tuple[str, ...]:
    """The revisions in the database's version table: one per branch not implied by another; () when never
    migrated."""
    engine = create_engine(database, pool_size=1)
    try:
        async with engine.connect() as connection:
            return await _heads_on(connection)
    finally:
        await engine.dispose()


async def _heads_on(connection: AsyncConnection) -> tuple[str, ...]:
    """The revisions in the version table, read on `connection`."""
    # Alembic's version table, found as Alembic finds it (unqualified: on the search path).
    if await connection.scalar(text("SELECT to_regclass('alembic_version')")) is None:
        return ()
    return tuple((await connection.scalars(text("SELECT version_num FROM alembic_version"))).all())


# The revision files Alembic loads from a version location (`alembic.script.base._only_source_rev_file`).
_REVISION_FILE = re.compile(r"(?!\.#|__init__)(.*\.py)$")
# What an id may hold for Alembic to accept it (`alembic.script.revision._revision_illegal_chars`, and `:` is
# its range separator); anything else, and Alembic decides.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.]+")
_NAMES = ("revision", "down_revision", "depends_on")
# Each revision's `down_revision` names and `depends_on` names.
_History = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def _declared_heads(extra_locations: Locations) -> frozenset[str] | None:
    """The heads the revision files declare, read as text: the revisions no other names as its `down_revision`.

    None whenever Alembic could see the history otherwise (`_declared_history`). A file that would fail when it runs
    is found by `migrate`, which runs it, not here.
    """
    history = _declared_history(extra_locations)
    return None if history is None else _heads(history)


def _recorded_heads(extra_locations: Locations) -> frozenset[str] | None:
    """The version table Alembic leaves once every head is applied, read as text: the heads, less each one that
    another head needs (by its `down_revision` or `depends_on`, at any depth), which that head stands for (a
    domain's branch that depends on the core's head: service/orders/migrations/). None as for `_declared_heads`."""
    history = _declared_history(extra_locations)
    if history is None:
        return None
    heads = _heads(history)
    needed: set[str] = set()
    for head in heads:
        stack = [*history[head][0], *history[head][1]]
        while stack:
            name = stack.pop()
            if name not in needed:
                needed.add(name)
                stack.extend((*history[name][0], *history[name][1]))
    return frozenset(heads - needed)


def _heads(history: _History) -> frozenset[str]:
    """The revisions of a checked history that no other names as its `down_revision`."""
    return frozenset(history.keys() - {name for below, _ in history.values() for name in below})


def _declared_history(extra_locations: Locations) -> _History | None:
    """Each revision's `down_revision` and `depends_on` names, read from the files as text.

    None whenever Alembic could see the history otherwise: a file that does not set `revision` and
    `down_revision` once (and `depends_on` at most once), at its top level, to literals; a link; an id declared
    twice, or that Alembic refuses; a `down_revision` or `depends_on` naming no declared revision (a branch label,
    say); a revision no head leads to (a cycle). Alembic then decides.
    """
    with as_file(files(MIGRATIONS)) as location:
        directories = [Path(location) / "versions", *map(Path, extra_locations)]
        history: _History = {}
        for directory in directories:
            if not directory.is_dir():
                continue  # as Alembic: a version location that does not exist holds no revisions
            for path in directory.iterdir():
                if path.is_symlink():
                    return None  # Alembic resolves links and matches the target's name
                if not _REVISION_FILE.match(path.name) or not path.is_file():
                    continue
                declared = _declared(path)
                if declared is None or declared[0] in history:
                    return None
                history[declared[0]] = declared[1:]
    if not all(_PLAIN_ID.fullmatch(name) for name in history):
        return None
    if not all(name in history for below, needs in history.values() for name in (*below, *needs)):
        return None
    reached: set[str] = set()
    stack = list(_heads(history))
    while stack:
        name = stack.pop()
        if name not in reached:
            reached.add(name)
            stack.extend(history[name][0])
    return history if len(reached) == len(history) else None


def _declared(path: Path) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    """A revision file's `revision`, `down_revision` and `depends_on` (none, one or several each), when each is set
    at most once (the first two exactly once), at the file's top level, to a literal."""
    try:
        module = ast.parse(path.read_bytes(), str(path))
    except (SyntaxError, ValueError):  # Alembic reports it when it runs the file
        return None
    values: dict[str, object] = {}
    for statement in module.body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in _NAMES:
            try:
                values[target.id] = ast.literal_eval(value)
            except ValueError:
                return None
    if _bindings(module) != len(values):
        return None  # set twice, inside a block, by an import, an augmented or a chained assignment …
    revision, down, needs = values.get("revision"), values.get("down_revision", ...), values.get("depends_on")
    if not isinstance(revision, str) or down is ...:
        return None
    below, needed = _names(down), _names(needs)
    return None if below is None or needed is None else (revision, below, needed)


def _names(value: object) -> tuple[str, ...] | None:
    """A `down_revision` or `depends_on` as the revision ids it names (None: not a literal Alembic reads so)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, tuple | list) and all(isinstance(name, str) for name in value):
        return tuple(value)
    return None


def _bindings(module: ast.Module) -> int:
    """How many times anything in the file binds `revision`, `down_revision` or `depends_on`, anywhere in it (-1:
    a star import, which may bind any)."""
    count = 0
    for node in ast.walk(module):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound = [node.id]
        elif isinstance(node, ast.alias):
            bound = [node.asname or node.name]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound = [node.name]
        else:
            continue
        if "*" in bound:
            return -1
        count += sum(name in _NAMES for name in bound)
    return count


@contextmanager
def _script_config(extra_locations: Locations) -> Iterator[Config]:
    """A configuration that knows the revisions (no database yet), for the block."""
    from alembic.config import Config

    with as_file(files(MIGRATIONS)) as location:
        config = Config()
        config.set_main_option("script_location", str(location))
        if extra_locations:
            # Alembic reads only `version_locations` once it is set: the core's own comes first.
            locations = [Path(location) / "versions", *map(Path, extra_locations)]
            config.set_main_option("path_separator", "os")
            config.set_main_option(
                "version_locations", os.pathsep.join(str(path).replace("%", "%%") for path in locations)
            )
        yield config


def _applied(script: ScriptDirectory, current: Sequence[str], heads: Sequence[str]) -> bool:
    """Whether every head is applied: in the version table, or implied by what is there.

    The version table leaves out a revision that another one in it depends on (`depends_on`): a domain's branch
    that depends on the core's head stands for both. A revision this version does not know is not current.
    """
    if set(current) == set(heads):
        return True
    from alembic.script.revision import RevisionError

    try:
        applied = {revision.revision for revision in script.iterate_revisions(tuple(current), "base")}
    except RevisionError:  # a revision it does not know: from a newer version, or another branch
        return False
    return set(heads) <= applied


def _listed(revisions: Sequence[str]) -> str:
    """Revisions as a message shows them: one as itself, several comma separated."""
    return ", ".join(revisions)

"""The database schema: Alembic's `upgrade head`, run from the migrations that travel inside the package.

The revisions live in the checkout's top-level `migrations/` and are installed as `service.migrations`, so an
installed wheel migrates from any directory without an `alembic.ini`; `alembic` in the checkout still works.

A domain whose tables are not the core's may keep its revisions in a version location of its own, on a branch
of its own (`branch_labels`, `depends_on` a core revision; the example's: `examples/inventory/inventory/migrations/`).
Every function here then takes that location in `extra_locations`: the history has several heads, `upgrade heads`
brings each to its head, and the schema is current when every head is applied. Without extra locations all of
this is the core's one linear history, exactly as before.

Every long-running command checks the schema as it starts, and importing Alembic is a large part of a start (its
package imports every dialect's DDL, and Mako's syntax highlighters with it). So the check first
reads each revision file's `revision` and `down_revision` without importing it, and asks Alembic only when
those do not simply match the version table (docs/performance.md).
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

from service.config import PROGRAM
from service.errors import SchemaNotCurrent
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
    message names `program`'s migrate command."""
    current = await current_heads(database)
    if not current:
        raise SchemaNotCurrent(f"the database is not migrated: run `{program} migrate`")
    if frozenset(current) == _declared_heads(extra_locations):
        return
    from alembic.script import ScriptDirectory

    with _script_config(extra_locations) as config:
        script = ScriptDirectory.from_config(config)
        heads = script.get_heads()
        if not _applied(script, current, heads):
            raise SchemaNotCurrent(
                f"the database schema is at {_listed(current)}, this version needs {_listed(heads)}: "
                f"run `{program} migrate`"
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
            # Alembic's version table, found as Alembic finds it (unqualified: on the search path).
            if await connection.scalar(text("SELECT to_regclass('alembic_version')")) is None:
                return ()
            return tuple((await connection.scalars(text("SELECT version_num FROM alembic_version"))).all())
    finally:
        await engine.dispose()


# The revision files Alembic loads from a version location (`alembic.script.base._only_source_rev_file`).
_REVISION_FILE = re.compile(r"(?!\.#|__init__)(.*\.py)$")
# What an id may hold for Alembic to accept it (`alembic.script.revision._revision_illegal_chars`, and `:` is
# its range separator); anything else, and Alembic decides.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.]+")
_NAMES = ("revision", "down_revision")


def _declared_heads(extra_locations: Locations) -> frozenset[str] | None:
    """The heads the revision files declare, read as text: the revisions no other names as its `down_revision`.

    None whenever Alembic could see the history otherwise: a file that does not set both names once, at its top
    level, to literals; a link; an id declared twice, or that Alembic refuses; a `down_revision` naming no
    declared revision (a branch label, say); a revision no head leads to (a cycle). Alembic then decides. A file
    that would fail when it runs is found by `migrate`, which runs it, not here.
    """
    with as_file(files(MIGRATIONS)) as location:
        directories = [Path(location) / "versions", *map(Path, extra_locations)]
        history: dict[str, tuple[str, ...]] = {}
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
                history[declared[0]] = declared[1]
    if not all(_PLAIN_ID.fullmatch(name) for name in history):
        return None
    if not all(name in history for below in history.values() for name in below):
        return None
    heads = history.keys() - {name for below in history.values() for name in below}
    reached: set[str] = set()
    stack = list(heads)
    while stack:
        name = stack.pop()
        if name not in reached:
            reached.add(name)
            stack.extend(history[name])
    return frozenset(heads) if len(reached) == len(history) else None


def _declared(path: Path) -> tuple[str, tuple[str, ...]] | None:
    """A revision file's `revision` and `down_revision` (none, one or several), when each is set once, at the
    file's top level, to a literal."""
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
    revision, down = values.get("revision"), values.get("down_revision", ...)
    if not isinstance(revision, str) or down is ...:
        return None
    if down is None:
        return revision, ()
    if isinstance(down, str):
        return revision, (down,)
    if isinstance(down, tuple | list) and all(isinstance(name, str) for name in down):
        return revision, tuple(down)
    return None


def _bindings(module: ast.Module) -> int:
    """How many times anything in the file binds `revision` or `down_revision`, anywhere in it (-1: a star
    import, which may bind either)."""
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

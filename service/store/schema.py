"""The database schema: Alembic's `upgrade head`, run from the migrations that travel inside the package.

The revisions live in the checkout's top-level `migrations/` and are installed as `service.migrations`, so an
installed wheel migrates from any directory without an `alembic.ini`; `alembic` in the checkout still works.

A domain whose tables are not the core's may keep its revisions in a version location of its own, on a branch
of its own (`branch_labels`, `depends_on` a core revision; the example: `examples/inventory/migrations/`). Every
function here then takes that location in `extra_locations`: the history has several heads, `upgrade heads`
brings each to its head, and the schema is current when every head is applied. Without extra locations all of
this is the core's one linear history, exactly as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.resources import as_file, files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.script.revision import RevisionError
from sqlalchemy.ext.asyncio import create_async_engine

from service.config import PROGRAM
from service.errors import SchemaNotCurrent

MIGRATIONS = "service.migrations"

Locations = Sequence[str | os.PathLike[str]]


@contextmanager
def alembic_config(database_url: str, extra_locations: Locations = ()) -> Iterator[Config]:
    """Alembic's configuration for `database_url`, with the packaged revisions (and `extra_locations`), for the
    block."""
    with _script_config(extra_locations) as config:
        # Config values are interpolated: a literal % in a password must be doubled.
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
        yield config


def upgrade_to_head(database_url: str, extra_locations: Locations = ()) -> str:
    """Apply every migration not yet applied; returns the head revision the schema is now at (the heads, comma
    separated, when extra locations add branches)."""
    with alembic_config(database_url, extra_locations) as config:
        command.upgrade(config, "heads" if extra_locations else "head")
        heads = ScriptDirectory.from_config(config).get_heads()
    return _listed(heads) or "base"


def head_revision(extra_locations: Locations = ()) -> str:
    """The revision this version of the service needs (the newest migration it carries; with extra locations,
    the head of every branch, comma separated)."""
    with _script_config(extra_locations) as config:
        return _listed(ScriptDirectory.from_config(config).get_heads()) or "base"


async def require_head(database_url: str, extra_locations: Locations = ()) -> None:
    """Raise SchemaNotCurrent unless the database is at `head_revision()` (long-running commands check first)."""
    current = await current_heads(database_url)
    if not current:
        raise SchemaNotCurrent(f"the database is not migrated: run `{PROGRAM} migrate`")
    with _script_config(extra_locations) as config:
        script = ScriptDirectory.from_config(config)
        heads = script.get_heads()
        if not _applied(script, current, heads):
            raise SchemaNotCurrent(
                f"the database schema is at {_listed(current)}, this version needs {_listed(heads)}: "
                f"run `{PROGRAM} migrate`"
            )


async def current_revision(database_url: str) -> str | None:
    """The revision the database is at (its heads, comma separated, when it has several), or None when it was
    never migrated."""
    return _listed(await current_heads(database_url)) or None


async def current_heads(database_url: str) -> tuple[str, ...]:
    """The revisions in the database's version table: one per branch not implied by another; () when never
    migrated."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_heads())
    finally:
        await engine.dispose()


@contextmanager
def _script_config(extra_locations: Locations) -> Iterator[Config]:
    """A configuration that knows the revisions (no database yet), for the block."""
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
    try:
        applied = {revision.revision for revision in script.iterate_revisions(tuple(current), "base")}
    except RevisionError:  # a revision it does not know: from a newer version, or another branch
        return False
    return set(heads) <= applied


def _listed(revisions: Sequence[str]) -> str:
    """Revisions as a message shows them: one as itself, several comma separated."""
    return ", ".join(revisions)

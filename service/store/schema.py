"""The database schema: Alembic's `upgrade head`, run from the migrations that travel inside the package.

The revisions live in the checkout's top-level `migrations/` and are installed as `service.migrations`, so an
installed wheel migrates from any directory without an `alembic.ini`; `alembic` in the checkout still works.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import as_file, files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.ext.asyncio import create_async_engine

from service.errors import SchemaNotCurrent

MIGRATIONS = "service.migrations"


@contextmanager
def alembic_config(database_url: str) -> Iterator[Config]:
    """Alembic's configuration for `database_url`, with the packaged revisions, for the block."""
    with as_file(files(MIGRATIONS)) as location:
        config = Config()
        config.set_main_option("script_location", str(location))
        # Config values are interpolated: a literal % in a password must be doubled.
        config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
        yield config


def upgrade_to_head(database_url: str) -> str:
    """Apply every migration not yet applied; returns the head revision the schema is now at."""
    with alembic_config(database_url) as config:
        command.upgrade(config, "head")
        head = ScriptDirectory.from_config(config).get_current_head()
    return head or "base"


def head_revision() -> str:
    """The revision this version of the service needs (the newest migration it carries)."""
    with as_file(files(MIGRATIONS)) as location:
        config = Config()
        config.set_main_option("script_location", str(location))
        return ScriptDirectory.from_config(config).get_current_head() or "base"


async def require_head(database_url: str) -> None:
    """Raise SchemaNotCurrent unless the database is at `head_revision()` (long-running commands check first)."""
    current = await current_revision(database_url)
    head = head_revision()
    if current is None:
        raise SchemaNotCurrent("the database is not migrated: run `order-service migrate`")
    if current != head:
        raise SchemaNotCurrent(
            f"the database schema is at {current}, this version needs {head}: run `order-service migrate`"
        )


async def current_revision(database_url: str) -> str | None:
    """The revision the database is at, or None when it was never migrated."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(lambda sync: MigrationContext.configure(sync).get_current_revision())
    finally:
        await engine.dispose()

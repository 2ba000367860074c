"""Alembic environment: runs migrations through the async engine (asyncpg), as the service does."""

from __future__ import annotations

import asyncio
import importlib
from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from service.config import load_settings
from service.store.connect import Database
from service.store.tables import metadata
from service.store.uow import create_engine

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)
# What autogenerate and `alembic check` compare with: the core's tables, and those of every module `table_modules`
# names (alembic.ini: the order domain's), which join the core's metadata when imported. The core names no domain.
for module in (config.get_main_option("table_modules") or "").split():
    importlib.import_module(module)


def _database() -> Database:
    """What `order-service migrate` connects to (service/store/schema.py), else the settings' (a bare `alembic`)."""
    given = config.attributes.get("database")
    return given if isinstance(given, Database) else load_settings().database


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(_database(), pool_size=1)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=_database().url, target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())

"""Alembic migrations; installed as `service.migrations`, found by `service.store.schema`."""

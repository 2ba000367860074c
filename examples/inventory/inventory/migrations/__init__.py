"""The inventory domain's Alembic revisions: a branch of its own (`inventory`) beside the core's history, in the
version location its `Domain` names (`migrations`): `inventory-service migrate` upgrades every head."""

from __future__ import annotations

from pathlib import Path

LOCATION = Path(__file__).resolve().parent / "versions"

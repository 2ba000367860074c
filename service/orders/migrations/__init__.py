"""The order domain's Alembic revisions: a branch of its own (`orders`) beside the core's history, in a version
location the core's schema functions are given (service/store/schema.py, `extra_locations`; service/containers.py
passes `LOCATION` on)."""

from __future__ import annotations

from pathlib import Path

LOCATION = Path(__file__).resolve().parent / "versions"

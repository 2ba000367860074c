"""The inventory domain's Alembic revisions: a branch of its own (`inventory`) beside the core's history, in a
version location the core's schema module is given (`service/store/schema.py`, `extra_locations`)."""

from __future__ import annotations

from pathlib import Path

LOCATION = Path(__file__).resolve().parent / "versions"

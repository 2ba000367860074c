"""The order domain's Alembic revision scripts (branch `orders`)."""

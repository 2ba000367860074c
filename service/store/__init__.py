"""PostgreSQL: the tables (Alembic owns their history) and the unit of work that writes them."""

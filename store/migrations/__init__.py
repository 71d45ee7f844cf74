"""Alembic migrations of the ftui schema (run through :mod:`store.migrate`, never by hand-edited SQL)."""

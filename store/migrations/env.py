"""Alembic environment: always handed a connection by :mod:`store.migrate` (which holds the lock)."""

from __future__ import annotations

from alembic import context

from store.migrate import VERSION_TABLE
from store.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table=VERSION_TABLE,
    # SQLite cannot ALTER most things: Alembic's batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()

"""Runs get a globally unique ``uid``, ``resumed_from``, the watcher's pid and host, and a stop request;
byte and token counts become 64-bit on PostgreSQL.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.ids import new_uid

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (table, column) holding bytes or tokens: PostgreSQL's INTEGER overflows at 2 GiB.
BIG_COLUMNS = (
    ("runs", "peak_mem_bytes"),
    ("metrics", "tokens"),
    ("device_samples", "mem_used"),
    ("device_samples", "mem_total"),
    ("process_samples", "used_bytes"),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("uid", sa.String(32), nullable=True))
        batch.add_column(sa.Column("resumed_from", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("watcher_pid", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("watcher_host", sa.String(255), nullable=True))
        batch.add_column(sa.Column("stop_requested_at", sa.DateTime(), nullable=True))

    # Backfill: each existing run gets its own uid, in id order (uids sort by creation time).
    bind = op.get_bind()
    runs = sa.table("runs", sa.column("id", sa.Integer()), sa.column("uid", sa.String(32)))
    for (run_id,) in bind.execute(sa.select(runs.c.id).order_by(runs.c.id)).all():
        bind.execute(sa.update(runs).where(runs.c.id == run_id).values(uid=new_uid()))

    with op.batch_alter_table("runs") as batch:
        batch.alter_column("uid", existing_type=sa.String(32), nullable=False)
        batch.create_unique_constraint("uq_runs_uid", ["uid"])
        batch.create_foreign_key("fk_runs_resumed_from", "runs", ["resumed_from"], ["id"], ondelete="SET NULL")

    if bind.dialect.name != "sqlite":  # SQLite's INTEGER is 64-bit already
        for table, column in BIG_COLUMNS:
            op.alter_column(table, column, existing_type=sa.Integer(), type_=sa.BigInteger())


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        for table, column in BIG_COLUMNS:
            op.alter_column(table, column, existing_type=sa.BigInteger(), type_=sa.Integer())
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("fk_runs_resumed_from", type_="foreignkey")
        batch.drop_constraint("uq_runs_uid", type_="unique")
        for column in ("stop_requested_at", "watcher_host", "watcher_pid", "resumed_from", "uid"):
            batch.drop_column(column)

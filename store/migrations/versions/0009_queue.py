"""The run queue (``ftui queue``): one row per entry, waiting for its host's devices, started as a run
(``run_id``), done, or not started (``error``).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_entries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("recipe_text", sa.Text(), nullable=False),
        sa.Column("recipe_source", sa.String(1000), nullable=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("workdir", sa.String(1000), nullable=False),
        sa.Column("visible_devices", sa.String(1000), nullable=True),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL", name="fk_queue_entries_run"),
                  nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
    )
    op.create_index("ix_queue_entries_host_status", "queue_entries", ["host", "status"])


def downgrade() -> None:
    op.drop_index("ix_queue_entries_host_status", table_name="queue_entries")
    op.drop_table("queue_entries")

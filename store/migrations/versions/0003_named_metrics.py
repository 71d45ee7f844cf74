"""Named per-step metrics: any ``name -> value`` a run reports (``train/*``, ``eval/*``, user metrics),
in a table of their own beside ``metrics``'s fixed columns.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "named_metrics",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("time", sa.Float(), nullable=False),
        sa.UniqueConstraint("run_id", "name", "step", name="uq_named_metrics_run_name_step"),
    )
    op.create_index("ix_named_metrics_run_step", "named_metrics", ["run_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_named_metrics_run_step", table_name="named_metrics")
    op.drop_table("named_metrics")

"""Per-block summaries of the named metrics (``named_metric_rollups``), as ``metric_rollups`` are for the
per-step columns: compare and the monitor read a few hundred rows per run and name instead of every
``eval/*`` or ``train/*`` value; the named metrics already stored are summarised here. And an index of
events by run and type, so that a long run's last eval samples are found without reading its step events.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.rollup import BLOCK_COLUMNS, rollup_named

revision = "0007"
down_revision = "0006"  # written against "0005"; rechained after merging main (0006)
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "named_metric_rollups",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("span", sa.Integer(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.Integer(), nullable=False),
        sa.Column("first_value", sa.Float(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("last_value", sa.Float(), nullable=False),
        sa.Column("min_step", sa.Integer(), nullable=False),
        sa.Column("min_value", sa.Float(), nullable=False),
        sa.Column("max_step", sa.Integer(), nullable=False),
        sa.Column("max_value", sa.Float(), nullable=False),
        sa.UniqueConstraint("run_id", "name", "span", "block", name="uq_named_metric_rollups_key"),
    )
    op.create_index("ix_events_run_type", "events", ["run_id", "type"])
    _backfill()


def _backfill() -> None:
    """Summarise the named metrics already stored, one run at a time (the rows themselves are untouched)."""
    bind = op.get_bind()
    meta = sa.MetaData()
    named = sa.Table("named_metrics", meta, autoload_with=bind)
    rollups = sa.Table("named_metric_rollups", meta, autoload_with=bind)
    run_ids = [r[0] for r in bind.execute(sa.select(named.c.run_id).distinct())]
    for run_id in run_ids:
        rows = bind.execute(sa.select(named.c.step, named.c.name, named.c.value)
                            .where(named.c.run_id == run_id).order_by(named.c.step))
        blocks = rollup_named((int(step), str(name), value) for step, name, value in rows)
        if blocks:
            bind.execute(rollups.insert(), [
                {"run_id": run_id, "name": name, "span": span, "block": block,
                 **{c: getattr(b, c) for c in BLOCK_COLUMNS}}
                for (name, span, block), b in blocks.items()
            ])


def downgrade() -> None:
    op.drop_index("ix_events_run_type", table_name="events")
    op.drop_table("named_metric_rollups")

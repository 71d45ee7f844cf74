"""Per-block summaries of the metric curves (``metric_rollups``), so that compare and the monitor read
a few hundred rows per run instead of its whole time series; existing runs' metrics are summarised here.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from store.rollup import BLOCK_COLUMNS, ROLLUP_METRICS, rollup_rows

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
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
        sa.UniqueConstraint("run_id", "name", "span", "block", name="uq_metric_rollups_key"),
    )
    _backfill()


def _backfill() -> None:
    """Summarise the metrics already stored, one run at a time (the rows themselves are untouched)."""
    bind = op.get_bind()
    meta = sa.MetaData()
    metrics = sa.Table("metrics", meta, autoload_with=bind)
    rollups = sa.Table("metric_rollups", meta, autoload_with=bind)
    run_ids = [r[0] for r in bind.execute(sa.select(metrics.c.run_id).distinct())]
    columns = [metrics.c.step, *(metrics.c[name] for name in ROLLUP_METRICS)]
    for run_id in run_ids:
        rows = bind.execute(sa.select(*columns).where(metrics.c.run_id == run_id)).mappings()
        blocks = rollup_rows(dict(r) for r in rows)
        if blocks:
            bind.execute(rollups.insert(), [
                {"run_id": run_id, "name": name, "span": span, "block": block,
                 **{c: getattr(b, c) for c in BLOCK_COLUMNS}}
                for (name, span, block), b in blocks.items()
            ])


def downgrade() -> None:
    op.drop_table("metric_rollups")

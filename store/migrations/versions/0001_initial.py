"""The schema as it was before migrations existed (ftui 0.1.0's ``create_all``), exactly.

A database made by that code has these tables and no version table; the store stamps it at this
revision and upgrades it from here.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("sweep_id", sa.String(64), nullable=True),
        sa.Column("recipe_text", sa.Text(), nullable=False),
        sa.Column("recipe_hash", sa.String(64), nullable=False),
        sa.Column("recipe_source", sa.String(1000), nullable=True),
        sa.Column("strategy", sa.String(32), nullable=False),
        sa.Column("nproc", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("model", sa.String(500), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("distributed_type", sa.String(32), nullable=True),
        sa.Column("device_type", sa.String(16), nullable=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("run_dir", sa.String(1000), nullable=False),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("steps_done", sa.Integer(), nullable=True),
        sa.Column("train_seconds", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("final_loss", sa.Float(), nullable=True),
        sa.Column("peak_mem_bytes", sa.Integer(), nullable=True),
        sa.Column("mean_util", sa.Float(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
    )
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_index("ix_runs_sweep", "runs", ["sweep_id"])

    op.create_table(
        "metrics",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Integer(), nullable=True),
        sa.Column("step_time", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "step", name="uq_metrics_run_step"),
    )

    op.create_table(
        "device_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("util_pct", sa.Float(), nullable=True),
        sa.Column("mem_used", sa.Integer(), nullable=True),
        sa.Column("mem_total", sa.Integer(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("temp_c", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
    )
    op.create_index("ix_device_samples_run_time", "device_samples", ["run_id", "time"])

    op.create_table(
        "process_samples",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("used_bytes", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
    )
    op.create_index("ix_process_samples_run_time", "process_samples", ["run_id", "time"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("time", sa.Float(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.UniqueConstraint("run_id", "source", "seq", name="uq_events_run_source_seq"),
    )
    op.create_index("ix_events_run", "events", ["run_id"])


def downgrade() -> None:
    for table in ("events", "process_samples", "device_samples", "metrics", "runs"):
        op.drop_table(table)

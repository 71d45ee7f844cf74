"""Multi-node runs: the run's join key, node count and SLURM job; one row per node (``run_nodes``); stop
requests any host can write (``stop_requests``); which node read each telemetry sample.

Revision ID: 0004
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("run_key", sa.String(255), nullable=True))
        batch.add_column(sa.Column("nnodes", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("slurm_job_id", sa.String(32), nullable=True))
        batch.create_unique_constraint("uq_runs_run_key", ["run_key"])
    for table in ("device_samples", "process_samples"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("node", sa.Integer(), nullable=True))
    op.create_table(
        "run_nodes",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=True),
        sa.Column("ranks", sa.JSON(), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("run_dir", sa.String(1000), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("joined_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("fault_at", sa.Float(), nullable=True),
        sa.UniqueConstraint("run_id", "slot", name="uq_run_nodes_run_slot"),
    )
    op.create_table(
        "stop_requests",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("requested_at", sa.DateTime(), nullable=False),
        sa.Column("kill", sa.Boolean(), nullable=False),
        sa.Column("by", sa.String(255), nullable=False),
    )
    op.create_index("ix_stop_requests_run", "stop_requests", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_stop_requests_run", table_name="stop_requests")
    op.drop_table("stop_requests")
    op.drop_table("run_nodes")
    for table in ("process_samples", "device_samples"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("node")
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint("uq_runs_run_key", type_="unique")
        for column in ("slurm_job_id", "nnodes", "run_key"):
            batch.drop_column(column)

"""Which checkpoint steps each node of a multi-node run holds complete (``run_nodes.checkpoints``), so that
``ftui resume`` on every node can agree on one step without a shared filesystem.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_nodes") as batch:
        batch.add_column(sa.Column("checkpoints", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_nodes") as batch:
        batch.drop_column("checkpoints")

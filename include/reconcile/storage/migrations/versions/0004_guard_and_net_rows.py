"""The correction guard and the shard's size per batch.

``rows_net`` is the sum of a staged correction's diffs (how much the batch grows or shrinks the
shard); ``approved`` records who let a batch past the sink's correction guard, and when.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.add_column(sa.Column("rows_net", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("approved", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.drop_column("approved")
        batch.drop_column("rows_net")

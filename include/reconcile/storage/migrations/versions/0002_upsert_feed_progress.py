"""Upsert sinks: how far each batch read the command feed, and how many commands were late.

``source_offset`` is the highest offset in the feed when the batch read it (the next batch
applies commands with a time below its lower only if their offset is above it: late arrivals);
``late_commands`` counts the late commands a batch applied at its lower.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.add_column(sa.Column("source_offset", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("late_commands", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.drop_column("late_commands")
        batch.drop_column("source_offset")

"""Shards (frontiers, read-only flag) and the batch ledger.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "reconcile_shards",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("upper", sa.BigInteger(), nullable=False),
        sa.Column("since", sa.BigInteger(), nullable=False),
        sa.Column("as_of", sa.BigInteger(), nullable=False),
        sa.Column("last_minted_lower", sa.BigInteger(), nullable=True),
        sa.Column("read_only", sa.Boolean(), nullable=False),
        sa.Column("delta_version", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_reconcile_shards"),
    )
    op.create_table(
        "reconcile_batches",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("shard", sa.String(63), nullable=False),
        sa.Column("lower", sa.BigInteger(), nullable=False),
        sa.Column("upper", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("delta_version", sa.BigInteger(), nullable=True),
        sa.Column("read_version", sa.BigInteger(), nullable=True),
        sa.Column("rows_ok", sa.BigInteger(), nullable=True),
        sa.Column("rows_err", sa.BigInteger(), nullable=True),
        sa.Column("drift_rows", sa.BigInteger(), nullable=True),
        sa.Column("manifest", sa.Text(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name="pk_reconcile_batches"),
    )
    op.create_index("ix_reconcile_batches_shard", "reconcile_batches", ["shard"])
    op.create_index("ix_reconcile_batches_run", "reconcile_batches", ["shard", "run_id"])
    op.create_index(
        "uq_reconcile_batches_committed_lower",
        "reconcile_batches",
        ["shard", "lower"],
        unique=True,
        sqlite_where=sa.text("state = 'committed'"),
        postgresql_where=sa.text("state = 'committed'"),
    )


def downgrade() -> None:
    op.drop_index("uq_reconcile_batches_committed_lower", table_name="reconcile_batches")
    op.drop_index("ix_reconcile_batches_run", table_name="reconcile_batches")
    op.drop_index("ix_reconcile_batches_shard", table_name="reconcile_batches")
    op.drop_table("reconcile_batches")
    op.drop_table("reconcile_shards")

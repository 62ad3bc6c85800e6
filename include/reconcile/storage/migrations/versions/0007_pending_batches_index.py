"""The batches not committed, by shard and upper: a fleet's views at any ledger length.

``status`` without a sink and the shard pages' overview ask every shard at once for its batches
not committed that end past its upper (:meth:`reconcile.storage.ledger.Ledger.pending_batches`:
the only ones that can be an unresolved failure or leave the shard behind). A partial index on
``(shard, upper)`` over the rows not committed answers that with a range per shard, instead of a
scan of every batch of every shard.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"  # no branch labels, no other dependency


def upgrade() -> None:
    op.create_index(
        "ix_reconcile_batches_pending",
        "reconcile_batches",
        ["shard", "upper"],
        sqlite_where=sa.text("state <> 'committed'"),
        postgresql_where=sa.text("state <> 'committed'"),
    )


def downgrade() -> None:
    op.drop_index("ix_reconcile_batches_pending", table_name="reconcile_batches")

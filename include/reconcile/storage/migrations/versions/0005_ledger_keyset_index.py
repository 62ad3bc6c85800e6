"""The ledger pages newest first at any depth.

The shard pages (``/reconcile/sinks/<name>``) list a shard's batches by ``(lower, batch_id)``
descending, a page after a key at a time: with an index on ``(shard, lower, batch_id)`` a page
reads its rows and nothing else, instead of sorting every batch of the shard per request.

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_reconcile_batches_keyset", "reconcile_batches", ["shard", "lower", "batch_id"])


def downgrade() -> None:
    op.drop_index("ix_reconcile_batches_keyset", table_name="reconcile_batches")

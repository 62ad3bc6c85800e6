"""Each write attempt stages its own files: the ledger names the attempt whose files are the batch.

``stage_id`` is the staging attempt recorded by the batch's manifest (its files live under
``_staging/<sink>/<batch_id>/<stage_id>/``); recording it is a compare-and-set, so of two
attempts of the same batch writing at once exactly one becomes the batch and the other deletes
its own files. ``failure_kind`` (``final`` or ``retryable``) says whether the batch's last
failure can be fixed by retrying; before it, a ``final: `` prefix of ``message`` said so.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.add_column(sa.Column("stage_id", sa.String(length=40), nullable=True))
        batch.add_column(sa.Column("failure_kind", sa.String(length=16), nullable=True))
    op.execute(
        "UPDATE reconcile_batches SET failure_kind = 'final', message = substr(message, 8) "
        "WHERE message LIKE 'final: %'"
    )
    op.execute(
        "UPDATE reconcile_batches SET failure_kind = 'retryable' "
        "WHERE failure_kind IS NULL AND message IS NOT NULL AND state IN ('minted', 'staged')"
    )


def downgrade() -> None:
    op.execute("UPDATE reconcile_batches SET message = 'final: ' || message WHERE failure_kind = 'final'")
    with op.batch_alter_table("reconcile_batches") as batch:
        batch.drop_column("failure_kind")
        batch.drop_column("stage_id")

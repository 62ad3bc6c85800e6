"""The shard's commit lease: the ledger serializes the sink's own Delta commits.

``commit_epoch`` is a fencing token that only ever increases (each taking of the lease adds
one); ``commit_holder`` names the writer holding the lease (NULL: free); ``commit_until`` is
when the lease lapses, in milliseconds since the Unix epoch by the database's clock (NULL:
free). See :meth:`reconcile.storage.lease.CommitLeases.commit_lease`.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"  # no branch labels, no other dependency


def upgrade() -> None:
    with op.batch_alter_table("reconcile_shards") as batch:
        batch.add_column(sa.Column("commit_epoch", sa.BigInteger(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("commit_holder", sa.String(length=250), nullable=True))
        batch.add_column(sa.Column("commit_until", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reconcile_shards") as batch:
        batch.drop_column("commit_until")
        batch.drop_column("commit_holder")
        batch.drop_column("commit_epoch")

"""Typed models of the ledger: one row per shard, one ledger row per batch description.

The Alembic migrations under ``migrations/versions`` own the schema; these models mirror it
(and a test checks that they agree).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Index, Integer, MetaData, String, Text, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Shard(Base):
    __tablename__ = "reconcile_shards"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    upper: Mapped[int] = mapped_column(BigInteger)
    since: Mapped[int] = mapped_column(BigInteger)
    as_of: Mapped[int] = mapped_column(BigInteger)
    last_minted_lower: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    read_only: Mapped[bool] = mapped_column(Boolean, default=False)
    # Last Delta version whose batch commit the metadata has absorbed (-1: none yet).
    delta_version: Mapped[int] = mapped_column(BigInteger, default=-1)
    # The commit lease (Ledger.commit_lease): a fencing token that only ever increases,
    # who holds the lease and until when (ms since the Unix epoch, by the database's clock);
    # holder and until are NULL while it is free.
    commit_epoch: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    commit_holder: Mapped[str | None] = mapped_column(String(250), nullable=True)
    commit_until: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    @staticmethod
    def initial(name: str, as_of: int, *, read_only: bool = False, at: datetime) -> dict:
        """The row of a new shard: nothing written yet (upper 0), no Delta version absorbed."""
        fresh = dict(upper=0, since=0, last_minted_lower=None, delta_version=-1, created_at=at, updated_at=at)
        return dict(name=name, as_of=as_of, read_only=read_only, **fresh)


class Batch(Base):
    __tablename__ = "reconcile_batches"

    batch_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    shard: Mapped[str] = mapped_column(String(63), index=True)
    lower: Mapped[int] = mapped_column(BigInteger)
    upper: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16))
    run_id: Mapped[str | None] = mapped_column(String(250), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    delta_version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    read_version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rows_ok: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rows_err: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    drift_rows: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # upsert feed read up to
    late_commands: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    manifest: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The write attempt whose files are the batch (``<table>/batches/<batch_id>/<stage_id>/``).
    stage_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    failure_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)  # model.FailureKind
    rows_net: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # sum of the correction's diffs
    approved: Mapped[str | None] = mapped_column(Text, nullable=True)  # who let it past the correction guard
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (
        # At most one committed batch per (shard, lower), enforced by the database.
        Index(
            "uq_reconcile_batches_committed_lower",
            "shard",
            "lower",
            unique=True,
            sqlite_where=text("state = 'committed'"),
            postgresql_where=text("state = 'committed'"),
        ),
        Index("ix_reconcile_batches_run", "shard", "run_id"),
        # The ledger newest first, a page at a time at any depth (keyset on lower, batch id).
        Index("ix_reconcile_batches_keyset", "shard", "lower", "batch_id"),
        # Every shard's batches not committed past its upper, a range per shard (the fleet's views).
        Index(
            "ix_reconcile_batches_pending",
            "shard",
            "upper",
            sqlite_where=text("state <> 'committed'"),
            postgresql_where=text("state <> 'committed'"),
        ),
    )


# -- a batch's failure, kept as history ----------------------------------------------------------

EARLIER = "earlier failure: "


def cause_of(message: str | None) -> str:
    """A recorded message without its remedy (once settled, the remedy is no longer the thing to do)."""
    return (message or "").partition(" Remedy: ")[0].strip()


def failure_history(b: Batch) -> str | None:
    """The failure recorded on ``b`` as history (``final: cause``, without its remedy), or None:
    its last failure (``failure_kind`` set), or the one kept when a later write attempt staged it
    or a newer description superseded it (``earlier failure: ...`` in its message)."""
    if b.failure_kind and b.message:
        return f"{b.failure_kind}: {cause_of(b.message)}"
    _, found, rest = (b.message or "").partition(EARLIER)
    return (rest or None) if found else None


def with_history(b: Batch, why: str | None) -> str | None:
    """``why`` (what settled or superseded ``b``), followed by its failure as history, if any."""
    history = failure_history(b)
    if history is None:
        return why
    return f"{why}; {EARLIER}{history}" if why else f"{EARLIER}{history}"

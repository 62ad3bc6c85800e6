"""The shard's commit lease: the sink's own writers take it around each Delta commit, so they never
race each other on the log, and a fencing epoch that only increases keeps a writer whose lease
lapsed from committing afterwards. It lives in the shard's ledger row (:class:`CommitLeases`,
which :class:`reconcile.storage.ledger.Ledger` is): all coordination is in the ledger's
database, none in the object store (as Materialize's persist keeps it in consensus, never in blob).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from sqlalchemy import BigInteger, ColumnElement, literal, literal_column, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from reconcile import settings
from reconcile.errors import Retryable, ShardNotFound, SinkError
from reconcile.log import event as log_event
from reconcile.storage.ledger_rows import Shard

log = logging.getLogger(__name__)


class CommitLeaseBusy(Retryable):
    """Another writer of the sink held the shard's commit lease for as long as this one waited."""

    remedy = (
        "the task retries by itself; a holder that crashed lets go when its lease lapses "
        "(RECONCILE_COMMIT_LEASE_SECONDS); nothing was committed by this attempt."
    )


class CommitLeaseLost(Retryable):
    """A writer's commit lease lapsed, or another writer took it, before its commit: the fence
    refused the commit, so a writer that paused cannot overwrite a newer writer's commit."""

    remedy = (
        "the task retries by itself (and finds what the other writer committed); if it recurs, a "
        "commit stalls longer than RECONCILE_COMMIT_LEASE_SECONDS: raise it."
    )


class CommitLeases:
    """The commit lease's statements, on the shard's ledger row (:class:`reconcile.storage.ledger.Ledger`
    is one: it brings the engine and the transactions)."""

    engine: Engine

    def tx(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def _clock_ms(self) -> ColumnElement[int]:
        """The database's clock in ms since the Unix epoch, as SQL evaluated by the statement
        that uses it (the caller's clock only on a database other than these two)."""
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            return literal_column("CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)", BigInteger)
        if dialect == "sqlite":
            return literal_column("CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)", BigInteger)
        return literal(int(time.time() * 1000), BigInteger)

    @contextmanager
    def commit_lease(
        self, name: str, holder: str, *, ttl: float | None = None, wait: float | None = None
    ) -> Iterator[CommitLease]:
        """Hold the shard's commit lease for the block: the sink's own Delta commits of one shard
        happen one at a time. ``with ledger.commit_lease(sink, "append of batch X") as lease:``
        then ``table.commit_files(..., fence=lease.fence)`` with ``lease.epoch`` in the commit's
        metadata. The snapshot a commit builds on is read inside the block (a version read
        before the lease was taken may have been followed by another writer's commit since).

        - **Taking it** (:meth:`take_commit_lease`) is a compare-and-set under the shard's row
          lock: a free or lapsed lease becomes this writer's with ``commit_epoch + 1``; while
          another writer holds it, this one polls until ``wait`` seconds passed (default twice
          the TTL, so a crashed holder's lease lapses meanwhile), then :class:`CommitLeaseBusy`.
        - **The fence** (:meth:`CommitLease.fence`), called right before each put of a commit
          file, is one ``UPDATE``: it renews the lease for another ``ttl`` only if this writer's
          epoch still holds it and it has not lapsed; otherwise :class:`CommitLeaseLost` and
          nothing is committed. A writer paused past its TTL (whose lease another may have
          taken, with a higher epoch) cannot commit when it resumes.
        - **Letting go** on leaving the block (whatever happened in it); a crashed holder never
          does, and its lease lapses after ``ttl`` (``RECONCILE_COMMIT_LEASE_SECONDS``, 30 s).

        Time is the database's clock, read inside the statement that sets or checks the lease:
        expiry is set and compared by one clock, so the workers' clocks (which drift apart) play
        no part (on SQLite the clock of the machine the database file is on, which every writer
        of it shares; on PostgreSQL ``clock_timestamp()``).

        **What the lease cannot do.** The fence and the put of the commit file are two steps. On
        a store whose put-if-absent is atomic (a local disk, S3, GCS and Azure with a
        conditional put) the put itself refuses a version another writer wrote, and the lease
        only spares writers the lost races. Where put-if-absent is weak (a server whose
        ``If-None-Match`` check is not atomic, or ignored) the lease is the guard, and it holds
        only if the put lands within ``ttl`` of its fence: a writer paused between the fence and
        the put (a stalled process, the network, the object-store client's own retries of the
        PUT) for longer than ``ttl`` may overwrite the commit of a writer that took the lapsed
        lease. The TTL bounds that window, so set it above the longest stall a put can see, at
        the price that a crashed holder blocks the next commit for up to ``ttl``. And it orders
        only writers that take it: a foreign writer (a user's own Spark job) never asks.
        """
        lease = self.take_commit_lease(name, holder, ttl=ttl, wait=wait)
        try:
            yield lease
        finally:
            try:
                self.release_commit_lease(lease)
            except SinkError as exc:  # the lease lapses by itself; the block's outcome stands
                log_event(log, f"could not let go of the commit lease: {exc}", level=logging.WARNING, **lease.state)

    def take_commit_lease(
        self, name: str, holder: str, *, ttl: float | None = None, wait: float | None = None
    ) -> CommitLease:
        """Take the shard's commit lease (see :meth:`commit_lease`), waiting up to ``wait`` s."""
        ttl = settings.commit_lease_seconds() if ttl is None else ttl
        wait = 2 * ttl if wait is None else wait
        assert ttl > 0 and wait >= 0, (ttl, wait)
        holder = f"{holder[:230]} #{uuid.uuid4().hex[:8]}"  # this taking alone: fences a rebuilt ledger too
        start = time.monotonic()
        pause = 0.02
        while True:
            epoch, before, until, clock = self._try_commit_lease(name, holder, int(ttl * 1000))
            if epoch is not None:
                lease = CommitLease(self, name, holder, epoch, ttl)
                if before is not None:  # lapsed, never let go: its writer crashed or stalled
                    lapsed = f"{(clock - (until or clock)) / 1000:.1f} s ago"
                    log_event(
                        log,
                        f"took over a commit lease that lapsed {lapsed} (held by {before})",
                        level=logging.WARNING,
                        **lease.state,
                    )
                return lease
            waited = time.monotonic() - start
            if waited >= wait:
                left = (until or clock) - clock
                raise CommitLeaseBusy(
                    f"another writer ({before}) holds the shard's commit lease for {left / 1000:.1f} s more; "
                    f"waited {waited:.1f} s for it",
                    sink=name,
                )
            time.sleep(min(pause, wait - waited))
            pause = min(pause * 1.5, 0.25)

    def _try_commit_lease(self, name: str, holder: str, ttl_ms: int) -> tuple[int | None, str | None, int | None, int]:
        """One compare-and-set under the shard's row lock: (the epoch taken, or None while
        another holds it; the holder before; its lease's end; the database's clock)."""
        clock = self._clock_ms()
        with self.tx() as s:
            q = select(Shard.commit_epoch, Shard.commit_holder, Shard.commit_until, clock).where(Shard.name == name)
            row = s.execute(q.with_for_update()).one_or_none()
            if row is None:
                raise ShardNotFound("no shard row in the ledger", sink=name)
            epoch, before, until, now_ms = row
            if before is not None and until is not None and until > now_ms:
                return None, before, until, now_ms
            values = dict(commit_epoch=epoch + 1, commit_holder=holder, commit_until=clock + ttl_ms)
            s.execute(update(Shard).where(Shard.name == name).values(**values))
            return epoch + 1, before, until, now_ms

    def fence_commit(self, lease: CommitLease) -> None:
        """Renew ``lease`` for another TTL if it still holds (one statement), else raise
        :class:`CommitLeaseLost`: called right before each put of a commit file."""
        clock = self._clock_ms()
        with self.tx() as s:
            res = s.execute(
                update(Shard)
                .where(
                    Shard.name == lease.name,
                    Shard.commit_epoch == lease.epoch,
                    Shard.commit_holder == lease.holder,
                    Shard.commit_until > clock,
                )
                .values(commit_until=clock + int(lease.ttl * 1000))
            )
            if res.rowcount == 1:  # type: ignore[attr-defined]  # a CursorResult
                return
            row = s.execute(
                select(Shard.commit_epoch, Shard.commit_holder).where(Shard.name == lease.name)
            ).one_or_none()
        if row is None:
            why = "the shard's row is gone from the ledger"
        elif tuple(row) == (lease.epoch, lease.holder):
            why = f"it lapsed (no fence within its {lease.ttl:g} s TTL)"
        elif row.commit_holder is not None:
            why = f"{row.commit_holder} holds it now (epoch {row.commit_epoch})"
        else:
            why = f"it lapsed and another writer took it since (now at epoch {row.commit_epoch})"
        log_event(log, f"lost the commit lease: {why}", level=logging.WARNING, **lease.state)
        raise CommitLeaseLost(
            f"lost the shard's commit lease (epoch {lease.epoch}, {lease.holder}) before its commit: {why}; "
            "nothing was committed",
            sink=lease.name,
        )

    def release_commit_lease(self, lease: CommitLease) -> bool:
        """Let go of ``lease`` if it still holds (a lapsed one may be another's now): True if it did."""
        with self.tx() as s:
            res = s.execute(
                update(Shard)
                .where(Shard.name == lease.name, Shard.commit_epoch == lease.epoch, Shard.commit_holder == lease.holder)
                .values(commit_holder=None, commit_until=None)
            )
            return res.rowcount == 1  # type: ignore[attr-defined]  # a CursorResult


@dataclass(frozen=True)
class CommitLease:
    """A writer's hold on a shard's commit lease (:meth:`CommitLeases.commit_lease`)."""

    ledger: CommitLeases = field(repr=False)
    name: str
    holder: str  # who, and this taking's own token
    epoch: int  # the fencing token: recorded in the commit's metadata as ``commit_epoch``
    ttl: float  # seconds the lease lasts past its taking or its last fence

    def fence(self) -> None:
        """Raise :class:`CommitLeaseLost` unless this lease still holds (renewing it)."""
        self.ledger.fence_commit(self)

    @property
    def state(self) -> dict:
        return dict(sink=self.name, commit_epoch=self.epoch, holder=self.holder, ttl=self.ttl)

"""The ledger: shard frontiers and the batch ledger (the :class:`Ledger` and its queries).

Every state change is one short transaction that first locks the shard's row
(``SELECT ... FOR UPDATE`` on PostgreSQL; ``BEGIN IMMEDIATE`` on SQLite, which locks the whole
database for writing), so writers of one shard are linearized. Frontier moves are
compare-and-sets on ``upper``. The database also enforces that at most one batch per
``(shard, lower)`` is ever in state ``committed`` (a partial unique index). The database's
engine and migrations are :mod:`reconcile.storage.engine`'s; the shard's row also holds its
commit lease (:meth:`Ledger.commit_lease`, :mod:`reconcile.storage.lease`).

The Delta log is the source of truth for which batches were committed (see ``append``); this
ledger follows it. :meth:`Ledger.absorb_commit` rolls the metadata forward to a batch
commit found in Delta, which is how a crash between the Delta commit and the metadata update is
repaired by whichever writer comes next.

A command feed's progress (:class:`~reconcile.model.FeedProgress`) is two columns of a batch's
row, ``late_commands`` and ``source_offset`` (not ``commands``): :func:`feed_of` and
:func:`late_commands_and_offset` map between them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import wraps
from typing import ParamSpec, Protocol, TypeVar

from sqlalchemy import or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session

from reconcile.errors import (
    BatchNotFound,
    InconsistentState,
    MetadataUnavailable,
    SchemaRecreated,
    ShardNotFound,
    SinkError,
    UpperMismatch,
)
from reconcile.failpoints import failpoint
from reconcile.log import iso
from reconcile.model import (
    COMMITTED,
    MINTED,
    OPEN_STATES,
    STAGED,
    SUPERSEDED,
    BatchDescription,
    CommitRecord,
    FeedProgress,
    Staged,
)
from reconcile.storage.engine import current_revision, current_revision_safe, head, make_engine, upgrade
from reconcile.storage.lease import CommitLeases
from reconcile.storage.ledger_rows import Batch, Shard, with_history

log = logging.getLogger(__name__)
_CHECKED: set[str] = set()  # database URLs whose schema this process found at head
# A batch's columns as the fleet's views list them: all but its manifest (kilobytes a batch).
_LISTED = [c.name for c in Batch.__table__.columns if c.name != "manifest"]


def now() -> datetime:
    return datetime.now(UTC)


def feed_of(b: Batch) -> FeedProgress | None:
    """A batch row's record of its feed's progress (no ``commands``); None when it has none."""
    return FeedProgress.recorded(b.late_commands, b.source_offset)


def late_commands_and_offset(feed: FeedProgress | None) -> tuple[int | None, int | None]:
    """The ledger's two columns of a feed's progress, ``(late_commands, source_offset)``."""
    return (None, None) if feed is None else (feed.late_commands, feed.source_offset)


P = ParamSpec("P")
R = TypeVar("R")


class MintDecision(Protocol):
    """What :meth:`Ledger.mint` writes (decided by :func:`reconcile.sink.mint.decide`)."""

    @property
    def new(self) -> BatchDescription | None: ...  # the description to add, state minted

    @property
    def supersede(self) -> Collection[str]: ...  # the open descriptions (ids) it supersedes

    @property
    def superseded_why(self) -> str: ...  # their message


D = TypeVar("D", bound=MintDecision)


def _retried_once_if_schema_recreated(fn: Callable[P, R]) -> Callable[P, R]:
    """The ledger's entry points (the first call of every stage) go on once the lost tables
    were created again: the caller then finds no shard row, or rebuilds it from the Delta log."""

    @wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except SchemaRecreated as exc:
            log.warning(str(exc))
            return fn(*args, **kwargs)

    return call


class Ledger(CommitLeases):
    def __init__(self, url: str, *, auto_migrate: bool = True):
        self.url = url
        self.engine = make_engine(url)
        if auto_migrate:
            self._ensure_schema()

    def _ensure_schema(self) -> None:
        """Migrate to head if needed; once per process and database (not per ledger: the UI
        and every task open ledgers often)."""
        if self.url in _CHECKED:
            return
        try:
            if current_revision(self.engine) != head():
                upgrade(self.engine)
        except (OperationalError, InterfaceError) as exc:
            if current_revision_safe(self.engine) != head():  # else a concurrent process migrated it
                raise self._unavailable(exc) from exc
        except IntegrityError:
            if current_revision_safe(self.engine) != head():
                raise
        _CHECKED.add(self.url)

    @property
    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def dispose(self) -> None:
        self.engine.dispose()

    def _unavailable(self, exc: Exception) -> MetadataUnavailable:
        cause = " ".join(str(getattr(exc, "orig", exc)).split())
        return MetadataUnavailable(f"ledger database {self.safe_url} unreachable or locked: {cause}.")

    def _failed(self, exc: Exception) -> Exception:
        """What a failed statement becomes: if the ledger's tables are gone (a dropped schema,
        a replaced database file) they are created again (:class:`SchemaRecreated`, which the
        ledger's entry points retry once: the shard is then rebuilt from the Delta log);
        otherwise an unreachable database is :class:`MetadataUnavailable` (retryable)."""
        missing = isinstance(exc, ProgrammingError) or "no such table" in str(getattr(exc, "orig", exc))
        if missing and current_revision_safe(self.engine) != head():
            _CHECKED.discard(self.url)
            try:
                self._ensure_schema()
            except SinkError as again:
                return again
            return SchemaRecreated(
                f"ledger database {self.safe_url} had lost its tables (dropped or replaced): created them "
                "again; the next attempt rebuilds each shard from its Delta log."
            )
        if isinstance(exc, ProgrammingError):
            return exc
        return self._unavailable(exc)

    @contextmanager
    def tx(self) -> Iterator[Session]:
        try:
            with Session(self.engine, expire_on_commit=False) as session, session.begin():
                yield session
        except (OperationalError, InterfaceError, ProgrammingError) as exc:
            raise self._failed(exc) from exc

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session; a lost database becomes MetadataUnavailable (retryable)."""
        try:
            with Session(self.engine, expire_on_commit=False) as session:
                yield session
        except (OperationalError, InterfaceError, ProgrammingError) as exc:
            raise self._failed(exc) from exc

    # -- shards -------------------------------------------------------------------------------

    @staticmethod
    def _lock(session: Session, name: str) -> Shard | None:
        return session.scalars(select(Shard).where(Shard.name == name).with_for_update()).one_or_none()

    def _locked(self, session: Session, name: str) -> Shard:
        shard = self._lock(session, name)
        if shard is None:
            raise ShardNotFound("no shard row in the ledger", sink=name)
        return shard

    @_retried_once_if_schema_recreated
    def ensure_shard(self, name: str, as_of: int, *, read_only: bool = False) -> Shard:
        """Create the shard's row if missing (``INSERT ... ON CONFLICT DO NOTHING``: concurrent
        first mints of a new shard both succeed and share one row)."""
        return self._ensure_shard(name, as_of, read_only=read_only)[0]

    @_retried_once_if_schema_recreated
    def create_shard(self, name: str, as_of: int, *, read_only: bool = False) -> bool:
        """:meth:`ensure_shard`; True if this call created the row (a new shard, or a shard
        whose row was lost with the ledger database: its Delta log says what it held)."""
        return self._ensure_shard(name, as_of, read_only=read_only)[1]

    def _ensure_shard(self, name: str, as_of: int, *, read_only: bool) -> tuple[Shard, bool]:
        with self.tx() as s:
            t = now()
            values = Shard.initial(name, as_of, read_only=read_only, at=t)
            dialect = self.engine.dialect.name
            created = False
            if dialect in ("postgresql", "sqlite"):
                insert = pg_insert if dialect == "postgresql" else sqlite_insert
                stmt = insert(Shard).values(**values).on_conflict_do_nothing(index_elements=["name"])
                created = s.execute(stmt.returning(Shard.name)).scalar() is not None  # no row: it existed
            elif self._lock(s, name) is None:
                s.add(Shard(**values))
                created = True
            if created:
                log.info("created shard row", extra={"sink": name, "as_of": as_of})
            return self._locked(s, name), created

    @_retried_once_if_schema_recreated
    def has_shard(self, name: str) -> bool:
        with self.read() as s:
            return s.get(Shard, name) is not None

    @_retried_once_if_schema_recreated
    def get_shard(self, name: str) -> Shard:
        with self.read() as s:
            shard = s.get(Shard, name)
        if shard is None:
            raise ShardNotFound("no shard row in the ledger", sink=name)
        return shard

    def set_read_only(self, name: str, read_only: bool) -> None:
        with self.tx() as s:
            shard = self._locked(s, name)
            shard.read_only = read_only
            shard.updated_at = now()

    def compare_and_set_upper(self, name: str, expected: int, new: int) -> None:
        """``UPDATE ... SET upper = new WHERE upper = expected``; raises UpperMismatch."""
        assert new >= expected
        with self.tx() as s:
            res = s.execute(
                update(Shard).where(Shard.name == name, Shard.upper == expected).values(upper=new, updated_at=now())
            )
            if res.rowcount != 1:  # type: ignore[attr-defined]  # a CursorResult
                current = s.scalar(select(Shard.upper).where(Shard.name == name))
                raise UpperMismatch(name, expected, current)

    def advance_to_as_of(self, name: str, as_of: int) -> int:
        """A new shard's upper (behind the sink's ``as_of``) moves up to ``as_of`` (seed 002,
        ``advance_shard_upper``); idempotent, so attempts of the same first batch racing here
        all go on. Returns the upper before the call."""
        with self.tx() as s:
            shard = self._locked(s, name)
            before = shard.upper
            if shard.upper < as_of:
                shard.upper = as_of
                shard.updated_at = now()
            return before

    def advance_since(self, name: str, since: int) -> int:
        """Raise the shard's ``since`` to ``since`` (never lower it; below ``upper``: the shard
        stays readable as of ``upper - 1``).

        Returns the shard's since afterwards. Raising since only narrows what the shard promises
        (exact reads at times >= since), so it is done before compaction rewrites anything.
        """
        with self.tx() as s:
            shard = self._locked(s, name)
            if since >= shard.upper:
                raise ValueError(
                    f"since {iso(since)} would pass the shard's latest readable time {iso(shard.upper - 1)}"
                )
            if since > shard.since:
                shard.since = since
                shard.updated_at = now()
            return shard.since

    # -- mint ---------------------------------------------------------------------------------

    def mint(self, name: str, decide: Callable[[Shard, list[Batch]], D]) -> D:
        """A mint, in one transaction holding the shard's row: ``decide(shard, its open
        descriptions)`` (the rules are :mod:`reconcile.sink.mint`'s) says what to write; the
        open descriptions it names in ``supersede`` are marked superseded with its
        ``superseded_why`` and its ``new`` description is added (state minted). A decision
        without ``new`` writes nothing. Returns the decision."""
        with self.tx() as s:
            shard = self._locked(s, name)
            q = select(Batch).where(Batch.shard == name, Batch.state.in_(OPEN_STATES))
            open_batches = list(s.scalars(q.order_by(Batch.lower, Batch.created_at)))
            decision = decide(shard, open_batches)
            new = decision.new
            if new is None:
                return decision
            t = now()
            for b in open_batches:
                if b.batch_id in decision.supersede:
                    _supersede(b, decision.superseded_why, t)
            s.add(
                Batch(
                    batch_id=new.batch_id,
                    shard=name,
                    lower=new.lower,
                    upper=new.upper,
                    state=MINTED,
                    run_id=new.run_id,
                    attempt=new.attempt,
                    created_at=t,
                    updated_at=t,
                )
            )
            shard.last_minted_lower = new.lower
            shard.updated_at = t
            return decision

    # -- ledger -------------------------------------------------------------------------------

    @_retried_once_if_schema_recreated
    def get_batch(self, batch_id: str, sink: str | None = None) -> Batch:
        with self.read() as s:
            b = s.get(Batch, batch_id)
        if b is None:
            raise BatchNotFound(f"no batch {batch_id!r} in the ledger.", sink=sink)
        return b

    def batch_of_run(self, name: str, run_id: str) -> Batch | None:
        """The newest description minted by a run (whatever its state)."""
        with self.read() as s:
            return s.scalars(
                select(Batch)
                .where(Batch.shard == name, Batch.run_id == run_id)
                .order_by(Batch.created_at.desc(), Batch.lower.desc())
            ).first()

    @_retried_once_if_schema_recreated
    def batches(self, name: str, states: tuple[str, ...] | None = None) -> list[Batch]:
        with self.read() as s:
            q = select(Batch).where(Batch.shard == name)
            if states:
                q = q.where(Batch.state.in_(states))
            return list(s.scalars(q.order_by(Batch.lower, Batch.created_at)))

    def watermark(self, name: str) -> int | None:
        """A command feed's watermark: the highest offset any committed batch of the shard has
        read (None: nothing read yet)."""
        seen = [b.source_offset for b in self.batches(name, (COMMITTED,)) if b.source_offset is not None]
        return max(seen) if seen else None

    @_retried_once_if_schema_recreated
    def committed_ending_at(self, name: str, upper: int) -> list[Batch]:
        """The shard's committed batches whose upper is ``upper`` (one, unless the ledger is damaged)."""
        with self.read() as s:
            q = select(Batch).where(Batch.shard == name, Batch.state == COMMITTED, Batch.upper == upper)
            return list(s.scalars(q))

    def batch_page(self, name: str, *, before: tuple[int, str] | None = None, limit: int = 50) -> list[Batch]:
        """The shard's batches newest first (by lower, then batch id), ``limit`` of them older
        than the (lower, batch id) key ``before``: keyset paging on the index
        ``ix_reconcile_batches_keyset``, so a page costs the same at any depth."""
        from sqlalchemy import literal, tuple_

        with self.read() as s:
            q = select(Batch).where(Batch.shard == name)
            if before is not None:
                lower, batch_id = before
                q = q.where(tuple_(Batch.lower, Batch.batch_id) < tuple_(literal(lower), literal(batch_id)))
            return list(s.scalars(q.order_by(Batch.lower.desc(), Batch.batch_id.desc()).limit(limit)))

    # -- every shard at once (the fleet's views: one query each, not one per shard) -------------

    @_retried_once_if_schema_recreated
    def shards(self) -> list[Shard]:
        """Every shard's row, by name."""
        with self.read() as s:
            return list(s.scalars(select(Shard).order_by(Shard.name)))

    @_retried_once_if_schema_recreated
    def newest_batches(self, per_shard: int = 11) -> dict[str, list[Batch]]:
        """{shard: its newest ``per_shard`` batches, newest first (by lower, then batch id)} of
        every shard, in one query, without their manifests: per shard, a walk down the keyset
        index that stops after ``per_shard`` rows (PostgreSQL: a lateral subquery; SQLite: the
        ``per_shard``-th newest lower, then the index's range from it), so the query reads about
        ``per_shard`` rows a shard however long its ledger."""
        cols = ", ".join(f"b.{c}" for c in _LISTED)
        if self.engine.dialect.name == "postgresql":
            sql = (
                f"SELECT {cols} FROM reconcile_shards s CROSS JOIN LATERAL (SELECT * FROM reconcile_batches x "
                "WHERE x.shard = s.name ORDER BY x.lower DESC, x.batch_id DESC LIMIT :n) b"
            )
        else:  # CROSS JOIN: SQLite keeps the shards the outer loop
            sql = (
                f"SELECT {cols} FROM reconcile_shards s CROSS JOIN reconcile_batches b WHERE b.shard = s.name "
                "AND b.lower >= coalesce((SELECT x.lower FROM reconcile_batches x WHERE x.shard = s.name "
                "ORDER BY x.lower DESC, x.batch_id DESC LIMIT 1 OFFSET :n - 1), -9223372036854775808)"
            )
        out = self._listed(sql, n=per_shard)
        for rows in out.values():
            rows.sort(key=lambda b: (b.lower, b.batch_id), reverse=True)
            del rows[per_shard:]
        return out

    @_retried_once_if_schema_recreated
    def pending_batches(self) -> dict[str, list[Batch]]:
        """{shard: its batches not committed that end past its upper} of every shard, oldest
        first, in one query without their manifests (a range per shard of the index
        ``ix_reconcile_batches_pending``): the only batches that can be an unresolved failure or
        leave the shard behind (:func:`reconcile.standing.standing`, :func:`reconcile.standing.behind`);
        every other batch is committed, or settled by the shard's upper."""
        cols = ", ".join(f"b.{c}" for c in _LISTED)
        sql = (
            f"SELECT {cols} FROM reconcile_shards s CROSS JOIN reconcile_batches b WHERE b.shard = s.name "
            "AND b.state <> 'committed' AND b.upper > s.upper"  # the index's own condition, as written there
        )
        out = self._listed(sql)
        for rows in out.values():
            rows.sort(key=lambda b: (b.lower, b.created_at))
        return out

    def _listed(self, sql: str, **params) -> dict[str, list[Batch]]:
        """{shard: its batches} of a query selecting :data:`_LISTED` (``b.``) of the batches."""
        from sqlalchemy import text

        stmt = text(sql).bindparams(**params).columns(*(Batch.__table__.c[c] for c in _LISTED))
        out: dict[str, list[Batch]] = {}
        with self.read() as s:
            for b in s.scalars(select(Batch).from_statement(stmt)):
                out.setdefault(b.shard, []).append(b)
        return out

    def previous_committed(self, name: str, lower: int) -> Batch | None:
        """The committed batch of the shard just below ``lower`` (one index lookup)."""
        with self.read() as s:
            q = select(Batch).where(Batch.shard == name, Batch.state == COMMITTED, Batch.lower < lower)
            return s.scalars(q.order_by(Batch.lower.desc()).limit(1)).first()

    def last_batch(self, name: str) -> Batch | None:
        page = self.batch_page(name, limit=1)
        return page[0] if page else None

    def superseder(self, b: Batch) -> Batch | None:
        """The newest description of the same lower minted after ``b`` (whatever its state)."""
        with self.read() as s:
            return s.scalars(
                select(Batch)
                .where(
                    Batch.shard == b.shard,
                    Batch.lower == b.lower,
                    Batch.batch_id != b.batch_id,
                    Batch.created_at >= b.created_at,
                )
                .order_by(Batch.created_at.desc())
            ).first()

    def committed_batch(self, name: str, lower: int) -> Batch | None:
        with self.read() as s:
            return s.scalars(
                select(Batch).where(Batch.shard == name, Batch.lower == lower, Batch.state == COMMITTED)
            ).first()

    def mark_staged(self, batch_id: str, staged: Staged, *, replaces: str | None) -> tuple[bool, Batch]:
        """Record write attempt ``staged.stage_id``'s files as the batch: a compare-and-set that
        holds only while the batch is open and its recorded attempt is still ``replaces`` (None:
        no attempt recorded yet). Of several attempts of one batch writing at once, exactly one
        wins; the others get (False, the batch as it is now) and must delete their own files."""
        with self.tx() as s:
            b = s.get(Batch, batch_id)
            if b is None:
                raise BatchNotFound(f"no batch {batch_id!r} in the ledger")
            self._locked(s, b.shard)
            s.refresh(b)
            if b.state not in OPEN_STATES or b.stage_id != replaces:
                return False, b
            b.state = STAGED
            b.stage_id = staged.stage_id
            b.manifest = staged.manifest
            b.rows_ok, b.rows_err = staged.rows_ok, staged.rows_err
            b.read_version, b.drift_rows = staged.read_version, staged.drift_rows
            b.late_commands, b.source_offset = late_commands_and_offset(staged.feed)
            b.rows_net = staged.rows_net
            b.message = with_history(b, None)  # an earlier attempt's failure, resolved: history
            b.failure_kind = None
            b.updated_at = now()
            return True, b

    def note_failure(self, batch_id: str, message: str, kind: str) -> None:
        """Record a batch's last failure and whether retrying can help (``FINAL``/``RETRYABLE``)."""
        with self.tx() as s:
            s.execute(
                update(Batch)
                .where(Batch.batch_id == batch_id)
                .values(message=message[:4000], failure_kind=kind, updated_at=now())
            )

    def approve(self, name: str, batch_id: str, by: str) -> Batch:
        """Let an open batch past the sink's correction guard (``by``: who, and how)."""
        with self.tx() as s:
            b = s.get(Batch, batch_id)
            if b is None or b.shard != name:
                raise BatchNotFound(f"no batch {batch_id!r} of sink {name!r} in the ledger", sink=name)
            self._locked(s, name)
            s.refresh(b)
            if b.state not in OPEN_STATES:
                raise SinkError(
                    f"batch {batch_id} is {b.state}: only a minted or staged batch can be approved",
                    sink=name,
                    remedy="approve the batch of the run that is waiting (`python -m reconcile status "
                    f"{name}` shows it).",
                )
            b.approved = f"{by} at {now().isoformat(timespec='seconds')}"
            b.updated_at = now()
            return b

    def mark_superseded(self, batch_id: str, message: str) -> None:
        with self.tx() as s:
            b = s.get(Batch, batch_id)
            if b is not None and b.state in OPEN_STATES:
                _supersede(b, message, now())

    def absorb_commit(self, name: str, rec: CommitRecord) -> bool:
        """Roll the metadata forward to a batch commit found in the Delta log.

        Returns True if the shard's upper moved. Idempotent: absorbing a commit twice, or one
        the metadata already reflects, changes nothing.
        """
        with self.tx() as s:
            shard = self._locked(s, name)
            if rec.version <= shard.delta_version:
                return False
            moved = self._absorb(s, shard, rec)
            failpoint("metadata.inside_absorb")
            return moved

    def _absorb(self, s: Session, shard: Shard, rec: CommitRecord) -> bool:
        """:meth:`absorb_commit` inside a transaction that holds the shard's row."""
        name = shard.name
        t = now()
        moved = False
        # The first commit a shard row absorbs starts its history: a new shard's first batch
        # (at as_of), or, for a row rebuilt after the ledger database was lost, the first
        # batch the Delta log still holds (its log may have been cleaned up before it).
        first = shard.delta_version < 0 and shard.upper <= rec.lower
        if shard.upper == rec.lower or (shard.upper < rec.lower == shard.as_of) or first:
            shard.upper = rec.upper
            moved = True
        elif rec.upper > shard.upper:
            raise InconsistentState(
                f"Delta version {rec.version} holds batch {rec.batch_id} "
                f"[{iso(rec.lower)}, {iso(rec.upper)}) but the shard's upper is {iso(shard.upper)}",
                sink=name,
            )
        shard.delta_version = rec.version
        shard.updated_at = t
        b = s.get(Batch, rec.batch_id)
        if b is None:  # the ledger row was lost; the Delta log is the truth
            b = Batch(
                batch_id=rec.batch_id,
                shard=name,
                lower=rec.lower,
                upper=rec.upper,
                run_id=rec.run_id,
                attempt=1,
                created_at=t,
                state=COMMITTED,
            )
            s.add(b)
        b.state = COMMITTED
        b.delta_version = rec.version
        if rec.stage_id:
            b.stage_id = rec.stage_id
        if rec.rows_ok is not None:
            b.rows_ok, b.rows_err = rec.rows_ok, rec.rows_err
        late_commands, source_offset = late_commands_and_offset(rec.feed)
        if source_offset is not None:
            b.source_offset = source_offset
        if late_commands is not None:
            b.late_commands = late_commands
        b.updated_at = t
        try:
            s.flush()
        except IntegrityError as exc:
            raise InconsistentState(
                f"a second batch for lower {iso(rec.lower)} would be committed ({rec.batch_id})",
                sink=name,
            ) from exc
        for other in s.scalars(
            select(Batch).where(
                Batch.shard == name,
                Batch.state.in_(OPEN_STATES),
                Batch.lower < shard.upper,
                Batch.batch_id != rec.batch_id,
            )
        ):
            _supersede(other, f"outdated: batch {rec.batch_id} committed [{iso(rec.lower)}, {iso(rec.upper)})", t)
        s.flush()
        return moved

    def absorb_since(self, name: str, since: int) -> bool:
        """Raise the shard's ``since`` to a compaction's, as the Delta log records it (a ledger
        rebuilt or restored from an older copy); never lower, only below ``upper``. True if it moved."""
        with self.tx() as s:
            shard = self._locked(s, name)
            if shard.since < since < shard.upper:
                shard.since = since
                shard.updated_at = now()
                return True
            return False

    def reset_to_log(
        self, name: str, commits: list[CommitRecord], since: int, latest: int, lost: dict[str, str]
    ) -> Shard:
        """Make the shard's ledger what its Delta log says, in one transaction: every batch in
        ``lost`` (id: why) is marked superseded with the reason, and so is every open batch;
        then upper, since and the absorbed version are rebuilt from ``commits`` (the log's batch
        commits, ascending), ``since`` (its last compaction's) and ``latest`` (its last version),
        starting after the last committed batch kept that is older than them (a log whose first
        commit files were cleaned up no longer holds it)."""
        with self.tx() as s:
            shard = self._locked(s, name)
            t = now()
            q = select(Batch).where(
                Batch.shard == name, or_(Batch.batch_id.in_(list(lost)), Batch.state.in_(OPEN_STATES))
            )
            for b in s.scalars(q):
                _supersede(b, lost.get(b.batch_id) or "superseded: the metadata was reset to the Delta log", t)
            s.flush()
            shard.upper, shard.since, shard.delta_version = 0, 0, -1
            shard.last_minted_lower = None
            first = commits[0].version if commits else latest + 1
            q = select(Batch).where(Batch.shard == name, Batch.state == COMMITTED, Batch.delta_version < first)
            kept = s.scalars(q.order_by(Batch.lower.desc()).limit(1)).first()
            if kept is not None and kept.delta_version is not None:
                shard.upper, shard.delta_version = kept.upper, kept.delta_version
            for rec in commits:
                self._absorb(s, shard, rec)
            if 0 < since < shard.upper:
                shard.since = since
            shard.delta_version = max(shard.delta_version, latest)
            shard.updated_at = t
            return shard

    def note_delta_version(self, name: str, version: int) -> None:
        """Remember that Delta versions up to ``version`` hold no unabsorbed batch commit."""
        with self.tx() as s:
            shard = self._locked(s, name)
            if version > shard.delta_version:
                shard.delta_version = version
                shard.updated_at = now()


def _supersede(b: Batch, why: str, t: datetime) -> None:
    """Mark ``b`` superseded with ``why``; a failure recorded on it stays in its message as history
    (:func:`~reconcile.storage.ledger_rows.with_history`: its cause, not its remedy)."""
    b.state = SUPERSEDED
    b.message = with_history(b, why)
    b.failure_kind = None
    b.updated_at = t

"""The protocol every sink kind implements (:class:`Kind`), what a correction is asked for
(:class:`Bounds`), and what a kind hands the stages: its :class:`Correction`, a feed's
:class:`FeedProgress` (defined in :mod:`reconcile.model`, re-exported here), the
:class:`HistoryKeys` its history is grouped by (and ``dry-run`` its correction in DuckDB,
:class:`~reconcile.kinds.preview.Updates`). :class:`OwnCollection` is what
the kinds with a desired collection of their own share. :mod:`reconcile.kinds` says what
differs per kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

from reconcile.model import FeedProgress  # re-exported: kinds.FeedProgress, kinds.protocol.FeedProgress

if TYPE_CHECKING:
    from duckdb import DuckDBPyConnection
    from pyspark.sql import DataFrame, SparkSession

    from reconcile.checksums import BatchChecks
    from reconcile.config import SinkConfig, Source
    from reconcile.kinds.preview import Desired, Updates


@dataclass(frozen=True)
class HistoryKeys:
    """How the type-2 history (:mod:`reconcile.sink.history`) groups a shard's versions: per key
    (``keys``: the key columns; ``ties``: the columns that order a key's versions starting at one
    time), or, without keys, per distinct row."""

    keys: tuple[str, ...] = ()
    ties: tuple[str, ...] = ()

    @property
    def per(self) -> str:
        """What one version's row stands for: ``key`` or ``distinct row``."""
        return "key" if self.keys else "distinct row"

    @property
    def bare_key(self) -> str | None:
        """The column a bare ``--key VALUE`` names (a single key column), else None."""
        return self.keys[0] if len(self.keys) == 1 else None

    def order(self, columns: list[str], valid_from: str) -> list[str]:
        """The columns versions are listed by: each key's versions in time order, or each row's."""
        if not self.keys:
            return [*columns, valid_from]
        return [*self.keys, valid_from, *[c for c in columns if c not in self.keys]]


# What each kind's messages call its source (a column missing or of a type the sink cannot take)
QUERY_SOURCE = "the result of query.sql"
CHANGELOG_SOURCE = "changelog.source"
UPSERT_SOURCE = "upsert.source"


@dataclass(frozen=True)
class Bounds:
    """What a batch's correction is asked for: the batch's ``[lower, upper)``; ``watermark``, a
    feed's (for a kind that reads one); ``checks``, the checksums to observe while the correction
    is computed (:mod:`reconcile.checksums`)."""

    lower: int
    upper: int
    watermark: int | None = None
    checks: BatchChecks | None = None
    # The shard holds no update at the version read (its first batch): a kind may write its
    # desired collection as it comes, without consolidating it against nothing.
    empty_shard: bool = False
    # Foreign writes to repair that the kind's own correction does not see (an upsert batch
    # touches only its commands' keys): what a foreign writer changed since a batch last
    # repaired the shard (:class:`DriftRepair`), or None.
    repair: DriftRepair | None = None
    # Compare every row in full (no hash-first pass): a batch computed again after it did not add up.
    exact: bool = False
    # How many update rows the shard as read holds (its files' statistics; None: not known): how
    # a kind that compares row keys first picks its way (:func:`reconcile.differential_cells.wanted`).
    shard_rows: int | None = None
    # The Delta source versions the previous batch read, when the shard holds exactly what it
    # committed (its checksums are carried): a query over Delta sources may then compute the
    # correction from their change feeds (:mod:`reconcile.kinds.incremental`).
    previous_sources: dict[str, int] | None = None
    previous_digest: str | None = None  # and the query it computed (Correction.query_digest)
    previous_refresh: Any = None  # and the way it took (kinds.refresh.Refresh; None: not recorded)
    # Why the write already knows the batch compares in full (without previous_sources: the first
    # batch, drift, ...), and whether ``refresh: incremental`` allows it (a first batch, a batch
    # computed again after it did not add up)
    full_why: str | None = None
    full_allowed: bool = False
    # The shard as read restricted to the files whose statistics bound ``column`` to a range that
    # meets one of ``ranges`` (``(lo, hi)``, disjoint, ascending): ``(column, ranges) -> (frame,
    # files read, files in all)``, or
    # None where files cannot be told apart (:func:`reconcile.storage.frames.read_files_holding`).
    files_holding: Callable[[str, list], tuple[DataFrame, int, int] | None] | None = None
    # ``(feed, key, time, offset) -> the ranges of key`` that hold every key the batch's feed can
    # touch, from its statistics, or None where not known (:mod:`reconcile.storage.feed_stats`).
    feed_key_ranges: Callable[[Source, str, str, str], list | None] | None = None


@dataclass(frozen=True)
class DriftRepair:
    """What a keyed kind must repair beyond its batch's own keys: the keys whose rows foreign
    Delta versions changed (``keys``: a frame of the key columns; None: every key, when the
    versions cannot be compared), the keys among them that held a value before those versions
    (``held``; None: unknown), and the committed batches ``(lower, upper, source_offset)`` in
    order, which say when each command of the feed was applied."""

    keys: DataFrame | None
    held: DataFrame | None
    batches: tuple[tuple[int, int, int | None], ...]


@dataclass
class Correction:
    """A batch's correction: the update frame plus ``_part``, and, for a kind that reads a feed,
    how to read the feed's progress (observed by the Spark action that reads ``updates``: read it
    only after that action)."""

    updates: DataFrame
    read_progress: Callable[[], FeedProgress] | None = None
    # what the batch repaired of foreign writes beyond its own keys (keyed kinds): ``keys``
    # repaired, ``unrepairable`` (a sample of keys the feed holds no command for) and its count
    repaired: dict[str, Any] | None = None
    # the version of each Delta source the batch read, by the source's name (a query's)
    sources: dict[str, int] | None = None
    # what the sink file said the batch computes (a query's SQL, sources and columns), as a digest:
    # a later batch takes the sources' changes only while it is the same
    query_digest: str | None = None
    # the way a query batch took (kinds.refresh.Refresh): from its sources' changes or in full, and why
    refresh: Any = None
    # (files read, files in the shard) where the kind read only the files its keys need
    files_read: tuple[int, int] | None = None
    # known to hold no update without running it (a query whose sources did not change): nothing
    # is staged and no Spark job runs
    nothing: bool = False

    @cached_property
    def progress(self) -> FeedProgress | None:
        """The feed's progress (None: a kind that reads no feed)."""
        return None if self.read_progress is None else self.read_progress()


class Kind(Protocol):
    """What every kind of sink says about itself (see the table in the module doc)."""

    @property
    def cfg(self) -> SinkConfig: ...

    @property
    def reads_feed(self) -> bool:
        """Whether the kind reads a command feed: its correction needs the watermark (the highest
        offset a committed batch read) and reports :class:`FeedProgress`."""
        ...

    @property
    def repairs_by_key(self) -> bool:
        """Whether the kind's batches touch only their commands' keys, so that a foreign write to
        other keys is repaired by key (:mod:`reconcile.kinds.upsert_drift`), not by the
        comparison of the whole collection every batch makes."""
        ...

    @property
    def plans_sql(self) -> bool:
        """Whether ``validate`` plans the sink's SQL against its sources (:mod:`reconcile.preflight`)."""
        ...

    @property
    def hashes_first(self) -> bool:
        """Whether the correction compares 128-bit row keys before rows (``Bounds.exact``: not)."""
        ...

    @property
    def persist_sides(self) -> Mapping[str, int]:
        """How many times the shard as read counts into each side of the batch's checksums."""
        ...

    @property
    def history_keys(self) -> HistoryKeys: ...

    @property
    def source_label(self) -> str:
        """Where the sink's rows come from, as its messages name it."""
        ...

    def desired(self, spark: SparkSession, versions: dict[str, int] | None = None) -> DataFrame:
        """The desired collection as an update frame (a :class:`~reconcile.errors.SourceError`
        for a kind whose desired collection depends on the shard). ``versions``: where a kind
        that reads Delta sources records the version it read of each (by the source's name)."""
        ...

    def correction(self, spark: SparkSession, persist: DataFrame, bounds: Bounds) -> Correction:
        """The correction of ``(bounds.lower, bounds.upper)`` against ``persist`` (the shard's
        update log). ``bounds.watermark``: a feed's, for a kind that reads one. ``bounds.checks``:
        observe the checksums of the desired collection as of ``upper - 1`` and of the shard as
        read below ``upper`` (or carry the latter from the previous batch,
        :mod:`reconcile.checksums`) while the correction is computed."""
        ...

    def preview(self, con: DuckDBPyConnection, shard: str, bounds: Bounds) -> Updates:
        """:meth:`correction` in DuckDB, without a JVM (``dry-run``): the updates of
        ``(bounds.lower, bounds.upper)`` over ``con``, whose table ``shard`` holds the shard's
        update log; the sources registered as views of ``con``. Raises
        :class:`~reconcile.kinds.preview.NotExact` where they might not be exactly Spark's."""
        ...

    def invariants(self, updates: DataFrame, t: int, keys: DataFrame | None = None) -> list[str]:
        """The kind's own invariants of the shard as of ``t``, optionally only for ``keys``; one
        line per violation."""
        ...

    def plan(self, spark: SparkSession) -> None:
        """Analyse the sink's SQL against its sources' schemas without running it (``validate``;
        nothing for a kind without SQL): raises the problem Spark or the kind finds."""
        ...


class OwnCollection:
    """What the kinds whose desired collection is a frame of their own (query, changelog) share:
    the correction is that frame's difference with the shard; no feed; the shard as read counts
    into the shard's checksum side only; the history is per distinct row; any multiset of rows
    is a valid collection. A kind says how its module computes the difference
    (:meth:`difference`) and how DuckDB reads its desired collection (:meth:`relation`)."""

    cfg: Any
    # Whether a first batch (``Bounds.empty_shard``) writes the desired frame as it comes:
    # ``difference(..., bulk=True)`` (a kind whose desired updates are each +1).
    bulk_first = False
    # Whether ``difference`` compares keys first (``exact=True``: every row in full instead).
    hashes_first = False
    reads_feed = False
    repairs_by_key = False
    persist_sides = {"shard": 1}  # the desired side is the kind's own frame
    history_keys = HistoryKeys()

    def desired(self, spark: SparkSession, versions: dict[str, int] | None = None) -> DataFrame:
        raise NotImplementedError

    def difference(
        self, desired: DataFrame, persist: DataFrame, lower: int, upper: int, checks: BatchChecks | None, **how: Any
    ) -> DataFrame:
        """The correction of ``(lower, upper)``: ``desired`` against ``persist`` (an update frame
        plus ``_part``; ``how``: ``bulk``, or ``exact`` and ``shard_rows`` for a kind that hashes first)."""
        raise NotImplementedError

    def relation(self, con: DuckDBPyConnection, lower: int, upper: int) -> Desired:
        """The desired collection as DuckDB reads it (:mod:`reconcile.kinds.preview`)."""
        raise NotImplementedError

    def correction(self, spark: SparkSession, persist: DataFrame, bounds: Bounds) -> Correction:
        versions: dict[str, int] = {}
        desired = self.desired(spark, versions)
        how: dict[str, Any] = {"bulk": True} if bounds.empty_shard and self.bulk_first else {}
        if self.hashes_first:
            how.update(exact=bounds.exact, shard_rows=bounds.shard_rows)
        updates = self.difference(desired, persist, bounds.lower, bounds.upper, bounds.checks, **how)
        return Correction(updates, sources=versions or None)

    def preview(self, con: DuckDBPyConnection, shard: str, bounds: Bounds) -> Updates:
        from reconcile.kinds.preview import own_updates

        want = self.relation(con, bounds.lower, bounds.upper)
        return own_updates(con, self.cfg, want, bounds.upper, shard)

    def invariants(self, updates: DataFrame, t: int, keys: DataFrame | None = None) -> list[str]:
        return []  # any multiset of rows is a query's result or a change log's collection

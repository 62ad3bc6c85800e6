"""Sink kinds behind one seam: one class per kind, one protocol (:class:`Kind`), chosen once.

``kinds.of(cfg)`` picks the sink's kind from its config; the stages, the history and the CLI
ask the kind and never which kind it is. Every kind turns ``(desired, persist, lower, upper)``
into a correction (an update frame with ``_part``) with pure transforms; I/O happens only
where sources are read. Each kind's class is here; its Spark transforms are in its own module
and its DuckDB correction (``dry-run``) in :mod:`.preview`, each imported only when the kind is
asked to compute, so that asking a kind what it is imports neither pyspark nor DuckDB (``status``
and ``dry-run`` run without pyspark). A fourth kind is one class here, its modules, one config
model in :mod:`reconcile.config` and one line in :func:`of`.

- ``query`` (:class:`QueryKind`, :mod:`.query`): a snapshot, refreshed at ``upper - 1``;
- ``changelog`` (:class:`ChangelogKind`, :mod:`.changelog`): updates with known times, advanced
  to ``lower``;
- ``upsert`` (:class:`UpsertKind`, :mod:`.upsert`, :mod:`.upsert_preview`): keyed commands; each
  key's previous value comes from the shard.

What differs per kind (each row a member of :class:`Kind`):

=================  ======================  ======================  ===========================
                   query                   changelog               upsert
=================  ======================  ======================  ===========================
desired            the query's result      the change log          a command feed (no desired
                                                                   collection of its own)
correction         snapshot - persist,     log - persist below     commands, and each touched
                   at ``upper - 1``        upper, advanced to      key's value retracted at its
                                           ``lower``               first command
invariants         none                    none                    one value per key, count 1
history_keys       per distinct row        per distinct row        per key (key columns)
reads_feed         no                      no                      yes: the write passes the
                                                                   watermark, the batch records
                                                                   :class:`FeedProgress`
repairs_by_key     no                      no                      yes: a foreign write to keys
                                                                   without commands is repaired
                                                                   by key (:mod:`.upsert_drift`)
persist_sides      shard                   shard                   desired and shard
plans_sql          yes (``validate``)      no                      no
source_label       the result of           changelog.source        upsert.source
                   query.sql
preview            the correction in       the correction in       the correction in DuckDB
                   DuckDB                  DuckDB                  (:mod:`.upsert_preview`)
                   (:mod:`.preview`)       (:mod:`.preview`)
=================  ======================  ======================  ===========================

``persist_sides``: both checksums of a batch (:mod:`reconcile.checksums`) are the same for every
kind (what the kind desires as of ``upper - 1``, and the shard after the correction) and are
compared the same way; a kind differs only in how the shard as read counts into them. A query's
or change log's desired side is its own frame; an upsert sink desires the shard as read with
the touched keys' values replaced, so the shard as read counts into both sides.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reconcile.errors import SourceError
from reconcile.kinds.protocol import (
    CHANGELOG_SOURCE,
    QUERY_SOURCE,
    UPSERT_SOURCE,
    Bounds,
    Correction,
    DriftRepair,
    FeedProgress,
    HistoryKeys,
    Kind,
    OwnCollection,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from duckdb import DuckDBPyConnection
    from pyspark.sql import DataFrame, SparkSession

    from reconcile.checksums import BatchChecks
    from reconcile.config import ChangelogSink, QuerySink, SinkConfig, UpsertSink
    from reconcile.kinds.preview import Desired, Updates

__all__ = [
    "Bounds",
    "ChangelogKind",
    "Correction",
    "DriftRepair",
    "FeedProgress",
    "HistoryKeys",
    "Kind",
    "QueryKind",
    "UpsertKind",
    "desired",
    "of",
    "repairs_by_key",
]


def of(cfg: SinkConfig) -> Kind:
    """The sink's kind (the only place that asks which model a config is)."""
    from reconcile.config import ChangelogSink, QuerySink, UpsertSink

    if isinstance(cfg, QuerySink):
        return QueryKind(cfg)
    if isinstance(cfg, ChangelogSink):
        return ChangelogKind(cfg)
    assert isinstance(cfg, UpsertSink), f"unknown kind {cfg.kind!r}"
    return UpsertKind(cfg)


def repairs_by_key(cfg: SinkConfig) -> bool:
    """:attr:`Kind.repairs_by_key` of the sink's kind."""
    return of(cfg).repairs_by_key


def desired(spark: SparkSession, cfg: SinkConfig) -> DataFrame:
    """:meth:`Kind.desired` of the sink's kind."""
    return of(cfg).desired(spark)


@dataclass(frozen=True)
class QueryKind(OwnCollection):
    """The query kind: its desired collection is the query's result."""

    cfg: QuerySink
    plans_sql = True
    bulk_first = True
    hashes_first = True
    source_label = QUERY_SOURCE

    def desired(self, spark: SparkSession, versions: dict[str, int] | None = None) -> DataFrame:
        from reconcile.kinds import query

        return query.desired(spark, self.cfg, versions)

    def correction(self, spark: SparkSession, persist: DataFrame, bounds: Bounds) -> Correction:
        """From the sources' change feeds where it applies (:mod:`reconcile.kinds.incremental`)
        and the sink's ``query.refresh`` allows it, else the full comparison
        (:meth:`OwnCollection.correction`); the way taken and why on the batch's log and in its
        :class:`Correction` (:mod:`reconcile.kinds.refresh`)."""
        from reconcile.kinds import incremental, query, refresh

        cfg, digest = self.cfg, query.query_digest(self.cfg)
        previous = bounds.previous_refresh
        why, allowed = self._full_before_trying(bounds, digest)
        if why is None:
            versions: dict[str, int] = {}
            try:
                assert bounds.previous_sources is not None
                updates = query.incremental_correction(
                    spark, cfg, bounds.previous_sources, bounds.upper, bounds.checks, versions, persist
                )
            except incremental.NotIncremental as exc:
                why = str(exc)
            else:
                moved = ", ".join(f"{n} {bounds.previous_sources[n]} -> {v}" for n, v in sorted(versions.items()))
                log.info("incremental: the correction from the sources' change feeds (%s)", moved)
                read = sum(max(0, v - bounds.previous_sources.get(n, v)) for n, v in versions.items())
                way = refresh.incremental(previous, read)
                if updates is None:  # no source changed: nothing to stage
                    updates = spark.createDataFrame([], f"{cfg.ddl}, `_part` INT")
                    return Correction(updates, sources=versions, query_digest=digest, refresh=way, nothing=True)
                return Correction(updates, sources=versions, query_digest=digest, refresh=way)
        if cfg.query.refresh == "incremental" and not allowed:
            raise refresh.refused(cfg, why)
        log.info("incremental: %s; comparing in full", why)
        full = super().correction(spark, persist, bounds)
        full.query_digest = digest
        full.refresh = refresh.full(bounds.upper, why)
        return full

    def _full_before_trying(self, bounds: Bounds, digest: str) -> tuple[str | None, bool]:
        """(why the batch compares in full without trying the changes, or None; whether
        ``refresh: incremental`` allows it)."""
        from reconcile.kinds import refresh

        cfg = self.cfg
        if bounds.empty_shard:
            return "the shard holds nothing yet", True
        if cfg.query.refresh == "full":
            return "refresh: full", True
        other = [s.name for s in cfg.sources if s.format != "delta"]
        if other:
            return f"source {other[0]} is not a Delta table", False
        if bounds.full_why is not None:
            return bounds.full_why, bounds.full_allowed
        if not bounds.previous_sources:  # not a write that knows the previous batch (dry-run --spark)
            return "asked for the full comparison", True
        if bounds.previous_digest != digest:
            return "the sink file's query, sources or columns changed since the previous batch", True
        due = refresh.due(cfg, bounds.previous_refresh, bounds.upper)
        if due is not None:
            return due, True
        return None, False

    def difference(
        self, desired: DataFrame, persist: DataFrame, lower: int, upper: int, checks: BatchChecks | None, **how: Any
    ) -> DataFrame:
        from reconcile.kinds import query

        return query.correction(self.cfg, desired, persist, lower, upper, checks, **how)

    def relation(self, con: DuckDBPyConnection, lower: int, upper: int) -> Desired:
        from reconcile.kinds.preview import query_desired

        return query_desired(con, self.cfg, lower, upper)

    def plan(self, spark: SparkSession) -> None:
        from reconcile.kinds import query

        query.plan(spark, self.cfg)


@dataclass(frozen=True)
class ChangelogKind(OwnCollection):
    """The change-log kind: its desired collection is the change log below upper."""

    cfg: ChangelogSink
    plans_sql = False
    source_label = CHANGELOG_SOURCE

    def desired(self, spark: SparkSession, versions: dict[str, int] | None = None) -> DataFrame:
        from reconcile.kinds import changelog

        return changelog.desired(spark, self.cfg)

    def difference(
        self, desired: DataFrame, persist: DataFrame, lower: int, upper: int, checks: BatchChecks | None, **how: Any
    ) -> DataFrame:
        from reconcile.kinds import changelog

        return changelog.correction(self.cfg, desired, persist, lower, upper, checks, **how)

    def relation(self, con: DuckDBPyConnection, lower: int, upper: int) -> Desired:
        from reconcile.kinds.preview import changelog_desired

        return changelog_desired(con, self.cfg, lower, upper)

    def plan(self, spark: SparkSession) -> None:
        return None  # no SQL: its source's columns are checked when a batch reads it


@dataclass(frozen=True)
class UpsertKind:
    """The upsert kind: a command feed, applied per key to the shard."""

    cfg: UpsertSink
    reads_feed = True
    repairs_by_key = True
    plans_sql = False
    hashes_first = False
    source_label = UPSERT_SOURCE

    @property
    def persist_sides(self) -> Mapping[str, int]:
        from reconcile.kinds.upsert import PERSIST_SIDES

        return PERSIST_SIDES

    @property
    def history_keys(self) -> HistoryKeys:
        return HistoryKeys(tuple(self.cfg.key_columns), tuple(self.cfg.value_columns))

    def desired(self, spark: SparkSession, versions: dict[str, int] | None = None) -> DataFrame:
        raise SourceError(f"kind {self.cfg.kind!r} is a command feed, not a desired collection", sink=self.cfg.name)

    def correction(self, spark: SparkSession, persist: DataFrame, bounds: Bounds) -> Correction:
        from reconcile.kinds import upsert

        return upsert.correction(spark, self.cfg, persist, bounds)

    def preview(self, con: DuckDBPyConnection, shard: str, bounds: Bounds) -> Updates:
        from reconcile.kinds import upsert_preview

        return upsert_preview.updates(con, self.cfg, bounds.lower, bounds.upper, bounds.watermark, shard)

    def invariants(self, updates: DataFrame, t: int, keys: DataFrame | None = None) -> list[str]:
        from reconcile.kinds import upsert

        return upsert.violations(self.cfg, updates, t, keys=keys)

    def plan(self, spark: SparkSession) -> None:
        return None  # no SQL: its source's columns are checked when a batch reads it

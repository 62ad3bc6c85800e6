"""Sink kinds behind one seam: one class per kind, one protocol (:class:`Kind`), chosen once.

``kinds.of(cfg)`` picks the sink's kind from its config; the stages, the history and the CLI
ask the kind and never which kind it is. Every kind turns ``(desired, persist, lower, upper)``
into a correction (an update frame with ``_part``) with pure transforms; I/O happens only
where sources are read. A fourth kind is one module here, one config model in
:mod:`reconcile.config` and one line in :func:`of`.

- ``query`` (:class:`.query.QueryKind`): a snapshot, refreshed at ``upper - 1``;
- ``changelog`` (:class:`.changelog.ChangelogKind`): updates with known times, advanced to ``lower``;
- ``upsert`` (:class:`.upsert.UpsertKind`): keyed commands; each key's previous value comes from
  the shard.

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
persist_sides      shard                   shard                   desired and shard
plans_sql          yes (``validate``)      no                      no
=================  ======================  ======================  ===========================

``persist_sides``: both checksums of a batch (:mod:`reconcile.checksums`) are the same for every
kind (what the kind desires as of ``upper - 1``, and the shard after the correction) and are
compared the same way; a kind differs only in how the shard as read counts into them. A query's
or change log's desired side is its own frame; an upsert sink desires the shard as read with
the touched keys' values replaced, so the shard as read counts into both sides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconcile.kinds.protocol import Bounds, Correction, DriftRepair, FeedProgress, HistoryKeys, Kind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from reconcile.config import SinkConfig

__all__ = [
    "Bounds",
    "Correction",
    "DriftRepair",
    "FeedProgress",
    "HistoryKeys",
    "Kind",
    "desired",
    "of",
    "repairs_by_key",
]


def of(cfg: SinkConfig) -> Kind:
    """The sink's kind (the only place that asks which model a config is)."""
    from reconcile.config import ChangelogSink, QuerySink, UpsertSink

    if isinstance(cfg, QuerySink):
        from reconcile.kinds.query import QueryKind

        return QueryKind(cfg)
    if isinstance(cfg, ChangelogSink):
        from reconcile.kinds.changelog import ChangelogKind

        return ChangelogKind(cfg)
    assert isinstance(cfg, UpsertSink), f"unknown kind {cfg.kind!r}"
    from reconcile.kinds.upsert import UpsertKind

    return UpsertKind(cfg)


def repairs_by_key(cfg: SinkConfig) -> bool:
    """Whether the sink's batches touch only their commands' keys, so that a foreign write to
    other keys is repaired by key (:mod:`reconcile.kinds.upsert_drift`), not by the comparison of
    the whole collection every batch makes (no pyspark import: the reports ask it)."""
    from reconcile.config import UpsertSink

    return isinstance(cfg, UpsertSink)


def desired(spark: SparkSession, cfg: SinkConfig) -> DataFrame:
    """:meth:`Kind.desired` of the sink's kind."""
    return of(cfg).desired(spark)

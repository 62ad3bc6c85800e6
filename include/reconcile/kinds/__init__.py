"""Sink kinds behind one seam: what a sink desires, and its correction against the shard.

Every kind turns ``(desired, persist, lower, upper)`` into a correction (an update frame with
``_part``) with pure transforms; I/O happens only where sources are read. A fourth kind is one
module here and one config model in :mod:`reconcile.config`.

- ``query`` (:mod:`.query`): a snapshot, refreshed at ``upper - 1``;
- ``changelog`` (:mod:`.changelog`): updates with known times, advanced to ``lower``;
- ``upsert`` (:mod:`.upsert`): keyed commands; each key's previous value comes from the shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from reconcile.checksums import BatchChecks
from reconcile.config import ChangelogSink, QuerySink, SinkConfig, UpsertSink


@dataclass
class Correction:
    updates: DataFrame  # update frame plus _part
    # upsert: the feed's progress, observed by the Spark action that reads the correction
    # (:func:`reconcile.kinds.upsert.unapplied`), and the watermark the batch started from
    progress: Any = None
    watermark: int | None = None

    @cached_property
    def feed(self) -> dict:
        """A command feed's progress, for the manifest and the log (empty for other kinds): eligible
        commands, late ones, the feed's highest offset (the next watermark). Read it only after
        an action has read ``updates``."""
        if self.progress is None:
            return {}
        got = self.progress.get
        offsets = [x for x in (self.watermark, got.get("max_offset")) if x is not None]
        return {
            "commands": int(got.get("commands") or 0),
            "late_commands": int(got.get("late") or 0),
            "source_offset": max(offsets) if offsets else None,
        }

    @property
    def commands(self) -> int | None:
        return self.feed.get("commands")

    @property
    def late_commands(self) -> int | None:
        return self.feed.get("late_commands")

    @property
    def source_offset(self) -> int | None:
        return self.feed.get("source_offset")


def correction(
    spark: SparkSession,
    cfg: SinkConfig,
    persist: DataFrame,
    lower: int,
    upper: int,
    watermark: int | None = None,
    checks: BatchChecks | None = None,
) -> Correction:
    """The correction of ``(lower, upper)`` against ``persist`` (the shard's update log).
    ``checks``: observe the checksums of the desired collection as of ``upper - 1`` and of the
    shard as read below ``upper`` (or carry the latter from the previous batch,
    :mod:`reconcile.checksums`) while the correction is computed."""
    from reconcile.kinds import changelog, query, upsert

    if isinstance(cfg, QuerySink):
        snapshot = query.desired(spark, cfg)
        return Correction(query.correction(cfg, snapshot, persist, lower, upper, checks))
    if isinstance(cfg, ChangelogSink):
        log = changelog.desired(spark, cfg)
        return Correction(changelog.correction(cfg, log, persist, lower, upper, checks))
    assert isinstance(cfg, UpsertSink), f"unknown kind {cfg.kind!r}"
    feed, progress = upsert.unapplied(cfg, upsert.read_feed(spark, cfg), lower, upper, watermark)
    cmds = upsert.commands(cfg, feed, lower, upper, watermark)
    return Correction(upsert.upsert_correction(cfg, cmds, persist, lower, checks), progress, watermark)


def desired(spark: SparkSession, cfg: SinkConfig) -> DataFrame:
    """The desired update frame of a query or change-log sink (an upsert sink has a command
    feed instead: its desired collection depends on the shard)."""
    from reconcile.errors import SourceError
    from reconcile.kinds import changelog, query

    if isinstance(cfg, QuerySink):
        return query.desired(spark, cfg)
    if isinstance(cfg, ChangelogSink):
        return changelog.desired(spark, cfg)
    raise SourceError(f"kind {cfg.kind!r} is a command feed, not a desired collection", sink=cfg.name)


def invariants(cfg: SinkConfig, updates: DataFrame, t: int, keys: DataFrame | None = None) -> list[str]:
    """The kind's own invariants of the shard as of ``t`` (upsert: one value per key, count 1),
    optionally only for ``keys``; one line per violation."""
    if not isinstance(cfg, UpsertSink):
        return []
    from reconcile.kinds import upsert

    return upsert.violations(cfg, updates, t, keys=keys)

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

from pyspark.sql import DataFrame, SparkSession

from reconcile.checksums import BatchChecks
from reconcile.config import ChangelogSink, QuerySink, SinkConfig, UpsertSink
from reconcile.differential import one_row


@dataclass
class Correction:
    updates: DataFrame  # update frame plus _part
    source_offset: int | None = None  # upsert: the feed's highest offset (the next watermark)
    late_commands: int | None = None  # upsert: commands applied late, at lower
    commands: int | None = None  # upsert: eligible commands

    @property
    def feed(self) -> dict:
        """A command feed's progress, for the manifest and the log (empty for other kinds)."""
        if self.commands is None:
            return {}
        return {"commands": self.commands, "late_commands": self.late_commands, "source_offset": self.source_offset}


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
    feed = upsert.read_feed(spark, cfg)
    progress = one_row(upsert.feed_progress(cfg, feed, lower, upper, watermark))
    offsets = [x for x in (watermark, progress["max_offset"]) if x is not None]
    cmds = upsert.commands(cfg, feed, lower, upper, watermark)
    return Correction(
        upsert.upsert_correction(cfg, cmds, persist, lower, checks),
        max(offsets) if offsets else None,
        int(progress["late"] or 0),
        int(progress["commands"] or 0),
    )


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

"""Compaction: advance the shard's ``since`` and consolidate the history before it.

The shard is an update log; read as of ``t`` it is the sum of the updates at times ``<= t``.
Every batch adds updates, so without compaction reading the shard (which every batch does)
costs more with every batch. Compaction keeps that cost flat (the shard's ``since``
frontier, as in Materialize's persist):

1. **since**: the new since is ``upper - retention.history_hours`` (or one given by hand), at
   most ``upper - 1`` (the latest readable time), never below the current since. It is raised in the metadata table *first*:
   raising it only narrows the promise (exact reads at times ``>= since``), so a crash after it
   loses nothing.
2. **rewrite**: every update at a time before since is advanced to since, then updates of the
   same row and time are summed and zero sums dropped: one update per distinct row at since,
   none for rows that no longer exist. Reads as of any ``t >= since`` are unchanged (the sum of
   the updates at times ``<= t`` is the same). Reads below since are refused.
3. **guard**: the rewrite is one Delta overwrite of the version it read, committed under the
   sink's own commit guard (``txnAppId = reconcile-sink:<sink>``) with
   ``txnVersion = last recorded + 1``. A batch that commits after compaction read the table
   records a higher ``txnVersion`` (its ``lower``, which is above that) so Delta skips the
   stale rewrite; a batch racing the commit itself finds the commit file of its version taken
   (put-if-absent) and checks again on the newer snapshot. Either way nothing is lost:
   compaction leaves the sum of updates at times ``>= since`` as it was, so a correction
   staged before compaction is still exact after it. The guard needs an unused version below
   the shard's upper (the next batch's lower), so compaction waits while the last batch is
   1 ms wide.
4. **vacuum**: Delta files no longer referenced, older than ``retention.vacuum_hours``, are
   deleted. Time travel below that is gone, so keep it longer than the longest batch.

Runs as the sink DAG's ``compact`` task when ``compaction.every_batches`` batches have been
committed since the last compaction, or by hand: ``python -m reconcile compact SINK``.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from reconcile.config import SinkConfig
from reconcile.differential import consolidate
from reconcile.errors import SinkError
from reconcile.failpoints import failpoint
from reconcile.log import event, iso
from reconcile.model import COMMITTED
from reconcile.sink.sync import sync
from reconcile.storage import frames
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import MetadataStore

log = logging.getLogger("reconcile.compact")
HOUR_MS = 3_600_000


@dataclass
class CompactResult:
    outcome: str  # compacted | nothing | raced
    message: str
    since: int
    delta_version: int | None = None
    rows_after: int | None = None
    files_removed: int | None = None


def target_since(cfg: SinkConfig, upper: int, since: int) -> int:
    """Where compaction moves since: ``upper - retention.history_hours``, at most ``upper - 1``
    (the latest readable time: the shard's current contents), never backwards."""
    return max(since, min(upper - 1, upper - cfg.history_retention_hours * HOUR_MS))


def batches_to_fold(store: MetadataStore, cfg: SinkConfig) -> int:
    """How many committed batches the next compaction would fold into since (metadata only)."""
    shard = store.get_shard(cfg.name)
    target = target_since(cfg, shard.upper, shard.since)
    # a batch's updates lie in [lower, upper): it is folded in once since reaches upper - 1
    return sum(1 for b in store.batches(cfg.name, (COMMITTED,)) if b.upper - 1 > shard.since and b.lower < target)


def due(store: MetadataStore, cfg: SinkConfig) -> tuple[bool, str]:
    """(compact now?, why) after a run: ``compaction.every_batches`` batches are waiting."""
    if cfg.compact_every_batches == 0:
        return False, "automatic compaction is off (compaction.every_batches: 0)"
    n = batches_to_fold(store, cfg)
    if n < cfg.compact_every_batches:
        return False, f"{n} of {cfg.compact_every_batches} batches to fold in since the last compaction"
    return True, f"{n} batches to fold in (compaction.every_batches: {cfg.compact_every_batches})"


def compacted(cfg: SinkConfig, updates, since: int):
    """The update log with every time before ``since`` advanced to it, consolidated (pure)."""
    advanced = updates.withColumn("_time", F.greatest(F.col("_time"), F.lit(since)).cast("bigint"))
    return consolidate(cfg, advanced, partitioned=False)


def _uncompacted(spark: SparkSession, table: ShardTable, since: int) -> bool:
    """Are there updates at times before ``since``? (Delta's file statistics skip the rest.)"""
    return bool(frames.read_updates(spark, table).where(F.col("_time") < since).limit(1).count())


def vacuum(spark: SparkSession, table: ShardTable) -> None:
    """Delta's VACUUM of the shard (SQL: the same on a classic and a Spark Connect session)."""
    cfg = table.cfg
    conf = {
        # Vacuum lists the table with this many tasks (default 10,000: ~40 s of empty tasks on
        # a small local table); the shard is not partitioned, a few suffice.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(max(cfg.partitions, 4)),
    }
    if cfg.vacuum_retention_hours < 168:  # Delta refuses below 7 days unless told
        conf["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
    saved: dict[str, str | None] = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        path = table.path.replace("`", "``")
        spark.sql(f"VACUUM delta.`{path}` RETAIN {int(cfg.vacuum_retention_hours)} HOURS").collect()
    finally:
        for k, old in saved.items():
            spark.conf.unset(k) if old is None else spark.conf.set(k, old)


def run_compact(
    spark: SparkSession,
    store: MetadataStore,
    cfg: SinkConfig,
    *,
    since: int | None = None,
    vacuum_files: bool = True,
) -> CompactResult:
    table = ShardTable(cfg)
    if not table.exists():  # never run (maybe not even minted): nothing to fold
        return CompactResult(
            "nothing", event(log, "nothing to compact: the shard has no Delta table yet", sink=cfg.name), 0
        )
    shard = sync(store, table)
    target = target_since(cfg, shard.upper, shard.since) if since is None else since
    state = dict(sink=cfg.name, upper=shard.upper, since=shard.since, new_since=target)
    if target >= shard.upper:
        raise SinkError(
            f"cannot compact to since {target}: it would pass the shard's latest readable time "
            f"{iso(shard.upper - 1)} (upper - 1)",
            sink=cfg.name,
            remedy=f"give a since below {iso(shard.upper)}.",
        )
    if target <= shard.since:
        if not _uncompacted(spark, table, shard.since):
            return CompactResult(
                "nothing", event(log, "nothing to compact: since is already there", **state), shard.since
            )
        # An earlier compaction raised since and stopped before its rewrite: finish it.
        target = state["new_since"] = shard.since

    read_version = table.latest_version()
    recorded = table.last_txn_version(read_version)
    if recorded is None:
        return CompactResult("nothing", event(log, "nothing to compact: no batch committed yet", **state), shard.since)
    if recorded + 1 >= shard.upper:
        return CompactResult(
            "nothing",
            event(
                log,
                "compaction waits for the next batch: the commit guard needs a version below upper",
                recorded_txn_version=recorded,
                **state,
            ),
            shard.since,
        )

    store.advance_since(cfg.name, target)
    failpoint("compact.after_since")
    token = uuid.uuid4().hex
    meta = {"op": "compact", "sink": cfg.name, "since": target, "read_version": read_version, "token": token}
    out = compacted(cfg, frames.read_updates(spark, table, read_version), target)
    cols = [f"`{c}`" for c in cfg.column_names] + ["_error", "_time", "_diff"]
    try:
        (
            frames.writer(out.select(*cols), meta, "overwrite")
            .option("txnAppId", table.app_id)
            .option("txnVersion", recorded + 1)
            .save(table.path)
        )
    except Exception as exc:  # a concurrent commit won (ConcurrentTransaction/Append exception)
        if "Concurrent" not in type(exc).__name__ and "Concurrent" not in str(exc)[:500]:
            raise
        msg = event(
            log,
            f"compaction lost a race to a concurrent commit; nothing changed ({type(exc).__name__})",
            level=logging.WARNING,
            **state,
        )
        return CompactResult("raced", msg, target)
    failpoint("compact.after_commit")

    _, entries = table.history_since(read_version)
    mine = [v for v, m in entries if m and m.get("op") == "compact" and m.get("token") == token]
    if not mine:
        msg = event(
            log,
            "compaction skipped by the commit guard: a batch committed after it read the "
            "table; nothing changed, the next compaction folds it in",
            level=logging.WARNING,
            **state,
        )
        return CompactResult("raced", msg, target)
    version = mine[0]
    info = table.commit_info(version)
    metrics = info.get("operationMetrics") or {}
    if int(info.get("readVersion", read_version)) != read_version:
        event(
            log,
            f"foreign Delta versions {read_version + 1}..{info['readVersion']} landed while compacting; "
            "their updates were replaced (the next batch repairs any drift)",
            level=logging.WARNING,
            **state,
        )
    if vacuum_files:
        vacuum(spark, table)
    rows = int(metrics["numOutputRows"]) if "numOutputRows" in metrics else None
    removed = int(metrics["numRemovedFiles"]) if "numRemovedFiles" in metrics else None
    msg = event(
        log,
        "compacted the shard's history",
        delta_version=version,
        rows_after=rows,
        files_removed=removed,
        vacuum_hours=cfg.vacuum_retention_hours if vacuum_files else None,
        **state,
    )
    return CompactResult("compacted", msg, target, version, rows, removed)

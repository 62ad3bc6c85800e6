"""Compaction: advance the shard's ``since`` and consolidate the history before it.

The shard is an update log; read as of ``t`` it is the sum of the updates at times ``<= t``.
Every batch adds updates, so without compaction reading the shard (which every batch does)
costs more with every batch. Compaction keeps that cost flat (the shard's ``since``
frontier, as in Materialize's persist):

1. **since**: the new since is ``upper - retention.history_hours`` (or one given by hand), at
   most ``upper - 1`` (the latest readable time), never below the current since. It is raised in the ledger *first*:
   raising it only narrows the promise (exact reads at times ``>= since``), so a crash after it
   loses nothing.
2. **rewrite**: every update at a time before since is advanced to since, then updates of the
   same row and time are summed and zero sums dropped: one update per distinct row at since,
   none for rows that no longer exist. Reads as of any ``t >= since`` are unchanged (the sum of
   the updates at times ``<= t`` is the same). Reads below since are refused.
3. **commit**: Spark writes the rewrite as plain Parquet files into a directory of the
   compaction's own inside the table (``compactions/<read version>-<token>/``); then one
   delta-rs commit removes every data file of the version it read and adds those files (with
   their footers' statistics), as the version right after the one it read and no other
   (put-if-absent, no retry; :meth:`ShardTable.commit_rewrite`). It records the sink's commit
   guard (``txnAppId = reconcile-sink:<sink>``) with ``txnVersion = last recorded + 1``, and
   ``since`` in its commit metadata. A batch that commits after compaction read the table takes
   that version first, so the stale rewrite is never committed: the compaction ends as
   ``raced`` and deletes its files (whoever finds them left behind by a crash deletes them too:
   :func:`reconcile.sink.sync.gc_compactions`). Nothing is lost either way: compaction leaves the
   sum of updates at times ``>= since`` as it was, so a correction staged before compaction is
   still exact after it. The guard needs an unused version below the shard's upper (the next
   batch's lower), so compaction waits while the last batch is 1 ms wide.
4. **vacuum** (:func:`vacuum`, no JVM): files the log removed more than
   ``retention.vacuum_hours`` ago are deleted (delta-rs's vacuum lists them; nothing is
   committed); files the log never named (orphans: a dead
   writer's) older than that are deleted too, except those a commit may still add (a staged
   batch not yet committed, a compaction that may still commit). Time travel below the
   retention is gone, so keep it longer than the longest batch.

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
from reconcile.differential import consolidate, key_order, partition_of
from reconcile.errors import SinkError
from reconcile.failpoints import failpoint
from reconcile.log import event, iso
from reconcile.model import COMMITTED, ROW_KEYS, Outcome
from reconcile.sink.sync import gc_compactions, sync
from reconcile.sql_names import spark_name
from reconcile.storage import files, footers, frames, layout
from reconcile.storage.current import CurrentTable
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger

log = logging.getLogger(__name__)
HOUR_MS = 3_600_000


@dataclass
class CompactResult:
    outcome: Outcome  # COMPACTED | NOTHING | RACED
    message: str
    since: int
    delta_version: int | None = None
    rows_after: int | None = None
    files_removed: int | None = None


def target_since(cfg: SinkConfig, upper: int, since: int) -> int:
    """Where compaction moves since: ``upper - retention.history_hours``, at most ``upper - 1``
    (the latest readable time: the shard's current contents), never backwards."""
    return max(since, min(upper - 1, upper - cfg.history_retention_hours * HOUR_MS))


def batches_to_fold(ledger: Ledger, cfg: SinkConfig) -> int:
    """How many committed batches the next compaction would fold into since (metadata only)."""
    shard = ledger.get_shard(cfg.name)
    target = target_since(cfg, shard.upper, shard.since)
    # a batch's updates lie in [lower, upper): it is folded in once since reaches upper - 1
    return sum(1 for b in ledger.batches(cfg.name, (COMMITTED,)) if b.upper - 1 > shard.since and b.lower < target)


def due(ledger: Ledger, cfg: SinkConfig) -> tuple[bool, str]:
    """(compact now?, why) after a run: ``compaction.every_batches`` batches are waiting."""
    if cfg.compact_every_batches == 0:
        return False, "automatic compaction is off (compaction.every_batches: 0)"
    n = batches_to_fold(ledger, cfg)
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


def vacuum(ledger: Ledger, table: ShardTable) -> list[str]:
    """Delete the files no retained version of the table names and no commit can add, last
    changed more than ``retention.vacuum_hours`` ago (what Delta's VACUUM deletes), without a
    JVM. delta-rs deletes the files the log removed (:meth:`ShardTable.vacuum_removed`) and lists
    the orphans at a snapshot of version ``s`` (:meth:`ShardTable.unreferenced_files`); of those,
    the sink's own directories lose only files no commit after ``s`` can add: a batch's when the
    ledger has it committed at a version ``<= s`` (Spark's VACUUM deleted any staged file past the
    retention, even one an append was about to commit), a compaction's when it read a version
    below ``s``. Directories left without a data file go too. Returns the deleted paths,
    relative to the table. The sink's current-state table, if it keeps one, is vacuumed alike
    (its files no snapshot names, older than the retention)."""
    hours = table.cfg.vacuum_retention_hours
    if table.cfg.current is not None:
        CurrentTable(table.cfg).vacuum(hours)
    removed = table.vacuum_removed(hours)
    version, listed = table.unreferenced_files(hours)
    committed = {b.batch_id: b.delta_version for b in ledger.batches(table.name, (COMMITTED,))}
    orphans = [p for p in listed if p not in set(removed) and _never_added_after(p, version, committed)]
    for p in orphans:
        files.delete_path(f"{table.path}/{p}")
    deleted = removed + orphans
    for d in sorted({d for d in map(_owner_dir, deleted) if d is not None}):
        if not files.list_files(f"{table.path}/{d}"):
            files.delete_path(f"{table.path}/{d}")
            parent = d.rsplit("/", 1)[0]  # a batch's directory once its last attempt is gone
            if parent.startswith(f"{layout.BATCHES_DIR}/") and not files.list_names(f"{table.path}/{parent}"):
                files.delete_path(f"{table.path}/{parent}")
    return deleted


def _never_added_after(path: str, version: int, committed: dict[str, int | None]) -> bool:
    """Can no commit after Delta version ``version`` add this file (relative to the table)?"""
    top, _, rest = path.partition("/")
    name = rest.split("/", 1)[0]
    if top == layout.BATCHES_DIR:  # every attempt of a batch committed by then: never again
        at = committed.get(name)
        return at is not None and at <= version
    if top == layout.COMPACTIONS_DIR:  # committed as the version after the one it read, or never
        parsed = layout.parse_compaction_dir(name)
        return parsed is not None and parsed[0] < version
    return True  # not the sink's: a foreign writer's leftover


def _owner_dir(path: str) -> str | None:
    """The write attempt's or compaction's directory a file of the sink's lies in."""
    parts = path.split("/")
    depth = {layout.BATCHES_DIR: 3, layout.COMPACTIONS_DIR: 2}.get(parts[0])
    return "/".join(parts[:depth]) if depth and len(parts) > depth else None


def _write_rewrite(table: ShardTable, rewrite, name: str) -> None:
    """Spark writes the rewrite as plain Parquet files into the compaction's directory ``name``."""
    cfg = table.cfg
    cols = [spark_name(c) for c in cfg.column_names] + ["_error", "_time", "_diff", *ROW_KEYS]
    out, writer = rewrite.select(*cols), None
    if key_order(cfg):  # an upsert shard's layout (a shard of a release before it is relaid here)
        out = (
            out.withColumn("_part", partition_of(cfg))
            .repartitionById(cfg.partitions, "_part")
            .sortWithinPartitions("_part", *[spark_name(k) for k in key_order(cfg)])
            .drop("_part")
        )
        writer = out.write.option("maxRecordsPerFile", layout.ROWS_PER_FILE)
    (writer or out.write).mode("error").parquet(table.compaction_path(name))


def _written_files(table: ShardTable, name: str) -> list[tuple[str, int, dict]]:
    """The rewrite's files as the commit adds them: (path relative to the table, size, the
    statistics of its Parquet footer)."""
    path, rel = table.compaction_path(name), f"{layout.COMPACTIONS_DIR}/{name}"
    written = sorted(files.list_files(path).items())
    return [(f"{rel}/{f}", size, footers.file_stats(f"{path}/{f}")) for f, size in written if f.endswith(".parquet")]


def run_compact(
    spark: SparkSession,
    ledger: Ledger,
    cfg: SinkConfig,
    *,
    since: int | None = None,
    vacuum_files: bool = True,
) -> CompactResult:
    table = ShardTable(cfg)
    if not table.exists():  # never run (maybe not even minted): nothing to fold
        return CompactResult(
            Outcome.NOTHING, event(log, "nothing to compact: the shard has no Delta table yet", sink=cfg.name), 0
        )
    shard = sync(ledger, table)
    target = target_since(cfg, shard.upper, shard.since) if since is None else since
    state = dict(sink=cfg.name, upper=shard.upper, since=shard.since, new_since=target)
    pending = table.check_schema()  # a rewrite reads and writes the sink file's columns: the table's first
    if pending:
        msg = f"nothing compacted: the sink file's schema change ({pending.describe()}) waits for the next batch"
        return CompactResult(Outcome.NOTHING, event(log, msg, **state), shard.since)
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
                Outcome.NOTHING, event(log, "nothing to compact: since is already there", **state), shard.since
            )
        # An earlier compaction raised since and stopped before its rewrite: finish it.
        target = state["new_since"] = shard.since

    if not table.keyed:  # a shard created before the row key was stored: its rewrite stores it
        with ledger.commit_lease(cfg.name, "adding the row key columns before a compaction") as lease:
            table.add_row_keys(fence=lease.fence)
    read_version = table.latest_version()
    recorded = table.last_txn_version(read_version)
    if recorded is None:
        return CompactResult(
            Outcome.NOTHING, event(log, "nothing to compact: no batch committed yet", **state), shard.since
        )
    if recorded + 1 >= shard.upper:
        return CompactResult(
            Outcome.NOTHING,
            event(
                log,
                "compaction waits for the next batch: the commit guard needs a version below upper",
                recorded_txn_version=recorded,
                **state,
            ),
            shard.since,
        )

    ledger.advance_since(cfg.name, target)
    failpoint("compact.after_since")
    token = uuid.uuid4().hex
    name = layout.compaction_dir(read_version, token)
    meta = {"op": "compact", "since": target, "read_version": read_version, "token": token}
    rewrite = compacted(cfg, frames.read_keyed(spark, table, read_version)[0], target)
    written: list[tuple[str, int, dict]] = []
    committed: tuple[int, int] | None = None
    error: Exception | None = None
    try:
        _write_rewrite(table, rewrite, name)
        if table.latest_version() == read_version:  # else lost already: no footer to read
            written = _written_files(table, name)
            # the shard's commit lease around the commit only (not the Spark job): the sink's own
            # writers take turns on the log even where the store's put-if-absent is weak
            with ledger.commit_lease(cfg.name, f"compaction from Delta version {read_version} ({token})") as lease:
                if table.latest_version() == read_version:  # checked again inside the lease
                    committed = table.commit_rewrite(
                        written, {**meta, "commit_epoch": lease.epoch}, read_version, recorded + 1, fence=lease.fence
                    )
    except Exception as exc:  # noqa: BLE001 - what it means is read from the log below
        error = exc
    if committed is None:
        # Whose is version read + 1? Ours despite an error (a commit whose answer was lost)
        # keeps its files; else they can never be committed: delete them.
        found, at_next = table.version_description(read_version + 1)
        if (at_next or {}).get("op") == "compact" and (at_next or {}).get("token") == token:
            committed = (read_version + 1, table.snapshot(read_version).get_add_actions(flatten=True).num_rows)
        else:
            files.delete_path(table.compaction_path(name))
            if error is not None and not found:  # not the race: the write or the commit failed
                raise error
            msg = event(
                log,
                f"compaction skipped by the commit guard: a commit took Delta version {read_version + 1} after it "
                "read the table; nothing changed, the next compaction folds it in",
                level=logging.WARNING,
                **state,
            )
            return CompactResult(Outcome.RACED, msg, target)
    failpoint("compact.after_commit")

    version, removed = committed
    rows = sum(int(stats["numRecords"]) for _, _, stats in written)
    gc_compactions(table)  # those that lost to this one or died before
    vacuumed = vacuum(ledger, table) if vacuum_files else None
    msg = event(
        log,
        "compacted the shard's history",
        delta_version=version,
        rows_after=rows,
        files_removed=removed,
        files_added=len(written),
        vacuum_hours=cfg.vacuum_retention_hours if vacuum_files else None,
        files_vacuumed=None if vacuumed is None else len(vacuumed),
        **state,
    )
    return CompactResult(Outcome.COMPACTED, msg, target, version, rows, removed)

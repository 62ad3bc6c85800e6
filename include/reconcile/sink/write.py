"""The ``write`` stage: compute a batch's correction and stage it, without appending it.

### Protocol

1. Load the description from the ledger; a description that is no longer open (superseded by
   a newer mint, or already committed) is skipped, and says so.
2. Roll the metadata forward to the Delta log (:func:`reconcile.sink.sync.sync`): if the shard's
   upper has passed the description's ``lower``, the description is outdated and is marked so;
   the write ends there (only mint mints: the next run, or a rerun of this one, mints anew).
3. Pin the Delta version to read (``read_version``), read persist as of it and the desired
   collection, compute ``correction(desired, persist, lower, upper)`` (a pure function) hash-
   partitioned into P partitions, and stage it as Parquet under a directory of this attempt's
   own inside the table, ``<table>/batches/<batch_id>/<stage_id>/reconcile_part=<p>/``: the
   append adopts these files into the Delta log as they are.
4. Check that the batch adds up (:mod:`reconcile.checksums`, observed in the same Spark action):
   per partition, the checksum of what the kind says the shard must hold as of ``upper - 1``
   equals that of persist as read plus the correction as staged; else the batch fails
   (:class:`~reconcile.checksums.SelfCheckFailed`, nothing staged). Persist's checksum is the
   one the previous batch recorded when only the sink's own commits changed the table since
   (:func:`carried_checksums`); if the batch does not add up with it, the batch is computed again
   with persist observed in full, and a warning says the table changed behind the sink's back.
   Then record the manifest (rows, error rows and checksums per partition, observed while
   writing; the files with their sizes and content digests) in the ledger with state ``staged``:
   a compare-and-set on the attempt the batch names. Attempts of one batch running at once (a
   zombie task and its retry, a command started twice) each stage their own files; the first to
   record its manifest is the batch, the others delete their own files and say so. A write of
   a batch already staged with intact files does nothing; one whose staged files are damaged
   restages and replaces them (the replaced attempt's files are left to the garbage collection,
   which deletes them once no append can commit them: :func:`reconcile.sink.sync.gc_staged`).

### Drift

Whatever was written behind the sink's back since the previous batch read the shard is repaired
by this batch's correction; the batch records how much (``drift_rows``: the sum of absolute
diffs that the foreign Delta versions changed below ``upper``, computed by Delta time travel).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile import checksums, kinds
from reconcile.checksums import BatchChecks, SelfCheckFailed
from reconcile.config import SinkConfig
from reconcile.differential import consolidate, one_row
from reconcile.errors import StagedBatchInvalid, brief
from reconcile.failpoints import failpoint
from reconcile.log import event, iso
from reconcile.model import COMMITTED, OPEN_STATES, STAGED, BatchDescription, Staged
from reconcile.sink.sync import sync
from reconcile.sink.verify import parse_manifest, staged_files
from reconcile.storage import files, frames, layout
from reconcile.storage.commits import MAINTENANCE, runs_of
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import MetadataStore

log = logging.getLogger("reconcile.write")


@dataclass
class WriteResult:
    # staged (this attempt's files are the batch) | already_staged (another attempt's are) |
    # skipped (committed, or not open) | outdated (superseded: nothing to append)
    outcome: str
    message: str
    rows_ok: int = 0
    rows_err: int = 0
    drift_rows: int | None = 0  # None: not measurable (the foreign versions were vacuumed)
    partitions: dict | None = None
    batch_id: str | None = None


def drift_rows(
    spark: SparkSession, store: MetadataStore, table: ShardTable, read_version: int, upper: int
) -> int | None:
    """Sum of |diff| written behind the sink's back (below ``upper``) that this batch repairs:
    the foreign Delta versions after the version the previous committed batch read, up to
    ``read_version``. Each contiguous run of foreign versions costs two time-travel reads."""
    cfg = table.cfg
    seen = [b.read_version for b in store.batches(cfg.name, (COMMITTED,)) if b.read_version is not None]
    base = max(seen) if seen else -1
    total = 0
    for first, last in runs_of([c.version for c in table.foreign_commits(base, read_version)]):
        try:
            after = frames.read_updates(spark, table, last).where(F.col("_time") < upper)
            before = frames.read_updates(spark, table, first - 1).where(F.col("_time") < upper)
            changed = consolidate(
                cfg, after.unionByName(before.withColumn("_diff", -F.col("_diff"))), partitioned=False
            )
            total += int(one_row(changed.agg(F.sum(F.abs("_diff"))))[0] or 0)
        except Exception as exc:  # those versions were vacuumed: the drift is repaired, not measured
            event(
                log,
                f"cannot measure the drift of foreign Delta versions {first}..{last} (vacuumed?): {brief(exc, 200)}",
                level=logging.WARNING,
                sink=cfg.name,
            )
            return None
    return total


def carried_checksums(store: MetadataStore, table: ShardTable, lower: int, read_version: int) -> dict[int, int] | None:
    """The shard's checksums as of ``lower - 1``, per partition, as the committed batch ending at
    ``lower`` recorded them, if nothing but that batch's own commit, the sink's compactions (which
    keep every checksum as of a time at or after ``since``) and commits that change no data
    touched the table between the Delta version it read and ``read_version``; else None (the
    write then observes the shard as read)."""
    cfg = table.cfg
    prev = store.committed_ending_at(cfg.name, lower)
    b = prev[0] if len(prev) == 1 else None
    if b is None or b.read_version is None or not b.manifest:
        return None
    try:
        manifest = parse_manifest(cfg, b.batch_id, b.manifest)
        if int(manifest.get("partitions", -1)) != cfg.partitions:
            return None
        sums = {p: int(manifest["parts"][str(p)]["shard_checksum"], 16) for p in range(cfg.partitions)}
    except (StagedBatchInvalid, KeyError, ValueError, TypeError):
        return None
    _, entries = table.history_since(b.read_version)
    for v, meta in entries:
        if v > read_version:
            break
        meta = meta or {}
        if not (
            meta.get("op") in ("compact", MAINTENANCE)
            or (meta.get("op") == "batch" and meta.get("batch_id") == b.batch_id)
        ):
            return None  # a foreign data change (drift), or a commit the record does not cover
    return sums


def watermark(store: MetadataStore, cfg: SinkConfig) -> int | None:
    """A command feed's watermark: the highest offset any committed batch has read (None:
    nothing read yet)."""
    seen = [b.source_offset for b in store.batches(cfg.name, (COMMITTED,)) if b.source_offset is not None]
    return max(seen) if seen else None


def batch_correction(
    spark: SparkSession,
    store: MetadataStore,
    cfg: SinkConfig,
    persist: DataFrame,
    lower: int,
    upper: int,
    checks: BatchChecks | None = None,
) -> kinds.Correction:
    """The correction of ``(lower, upper)`` against ``persist``, for any kind of sink (``checks``:
    observe its checksums while it is computed)."""
    wm = watermark(store, cfg) if cfg.reads_feed else None
    return kinds.correction(spark, cfg, persist, lower, upper, wm, checks)


def self_check(cfg: SinkConfig, batch_id: str, lower: int, upper: int, sums: dict[str, dict[int, int | None]]) -> None:
    """Fail the batch (:class:`SelfCheckFailed`) unless, in every hash partition, the checksum of
    what the kind says the shard must hold as of ``upper - 1`` equals the shard's after the
    correction (persist as read plus the correction as staged). A partition too large to sum
    exactly (:mod:`reconcile.checksums`) is not checked, and its checksums are not recorded."""
    unsure = [p for p in range(cfg.partitions) if sums["desired"][p] is None or sums["shard"][p] is None]
    if unsure:
        event(
            log,
            f"batch {batch_id}: the checksums of hash partition(s) {', '.join(map(str, unsure))} cannot be summed "
            "exactly (a diff of 2^31 or more, or more than 2^31 units of |diff| in one partition of a batch): they are "
            "not recorded (not verifiable); more partitions keep large batches verifiable",
            level=logging.WARNING,
            sink=cfg.name,
        )
    wrong = [p for p in range(cfg.partitions) if p not in unsure and sums["desired"][p] != sums["shard"][p]]
    if wrong:
        p = wrong[0]
        more = f" (and {len(wrong) - 1} more partition(s))" if len(wrong) > 1 else ""
        desired, shard = (checksums.text(sums[side][p] or 0) for side in ("desired", "shard"))
        raise SelfCheckFailed(
            f"batch {batch_id} [{iso(lower)}, {iso(upper)}) does not add up: in hash partition {p} the desired "
            f"collection's checksum is {desired}, the shard's after the correction {shard}{more}",
            sink=cfg.name,
        )


def _stage_state(table: ShardTable, b) -> str | None:
    """Why the batch's recorded attempt cannot be appended as it is (None: exactly the files its
    manifest names are there, with their sizes)."""
    try:
        staged_files(table, b.batch_id, parse_manifest(table.cfg, b.batch_id, b.manifest))
    except StagedBatchInvalid as exc:
        return str(exc)
    return None


def _lost(b, stage_id: str) -> tuple[str, str]:
    """(outcome, message) for a write attempt whose manifest lost to the batch's state ``b``."""
    if b.state == STAGED:
        return "already_staged", (
            f"another attempt ({b.stage_id}) of this batch recorded its staged files first; deleted "
            f"this attempt's ({stage_id}); the append commits {b.stage_id}'s"
        )
    if b.state == COMMITTED:
        return "skipped", (
            f"another attempt of this batch committed it meanwhile (Delta version {b.delta_version}); "
            f"deleted this attempt's ({stage_id}) staged files"
        )
    return (
        "outdated",
        f"the batch was {b.state} meanwhile ({b.message or 'no message'}); deleted this attempt's staged files",
    )


def run_write(spark: SparkSession, store: MetadataStore, cfg: SinkConfig, batch_id: str) -> WriteResult:
    table = ShardTable(cfg)
    b = store.get_batch(batch_id, cfg.name)
    desc = BatchDescription.of(b)
    state = dict(sink=cfg.name, batch=batch_id, lower=desc.lower, upper=desc.upper, run=desc.run_id)
    if b.state == COMMITTED:
        msg = event(
            log,
            f"skipping write: an attempt of this batch already committed it (Delta version {b.delta_version})",
            **state,
        )
        return WriteResult("skipped", msg, batch_id=batch_id)
    if b.state not in OPEN_STATES:
        msg = event(log, f"skipping write: batch is {b.state} ({b.message or 'no message'})", **state)
        return WriteResult("skipped", msg)

    table.ensure()
    shard = sync(store, table)
    if shard.upper > desc.lower:
        b = store.get_batch(batch_id, cfg.name)
        if b.state == COMMITTED:
            msg = event(
                log,
                "skipping write: an earlier attempt already committed this batch (metadata rolled forward)",
                **state,
            )
            return WriteResult("skipped", msg, batch_id=batch_id)
        store.mark_superseded(
            batch_id, f"outdated before write: another writer moved the shard's upper to {iso(shard.upper)}"
        )
        rest = (
            "the shard already covers this batch's interval"
            if desc.upper <= shard.upper
            else f"[{iso(shard.upper)}, {iso(desc.upper)}) is appended by the next run, or by clearing this whole run "
            f"(its mint starts from {iso(shard.upper)})"
        )
        msg = event(
            log,
            f"not writing: the batch is outdated, another writer moved the shard's upper to {iso(shard.upper)}; {rest}",
            shard_upper=shard.upper,
            **state,
        )
        return WriteResult("outdated", msg)

    # Each attempt stages under a directory of its own; recording the manifest is a compare-
    # and-set on the attempt the batch names now (None, or a damaged attempt this one replaces).
    b = store.get_batch(batch_id, cfg.name)
    replaces = None
    if b.state == STAGED:
        damage = _stage_state(table, b)
        if damage is None:
            msg = event(
                log,
                f"skipping write: attempt {b.stage_id} already staged this batch "
                f"({b.rows_ok} ok, {b.rows_err} error rows); the append commits it",
                **state,
            )
            return WriteResult("already_staged", msg, b.rows_ok or 0, b.rows_err or 0, b.drift_rows, batch_id=batch_id)
        replaces = b.stage_id
        event(
            log,
            f"restaging: the staged attempt {b.stage_id} cannot be appended: {damage}",
            level=logging.WARNING,
            **state,
        )
    stage_id = layout.new_stage_id()
    others = sorted(set(table.staged_attempts(batch_id)) - {replaces})
    if others:
        event(
            log,
            f"other attempt(s) of this batch are writing or died writing ({', '.join(others)}); "
            "the first to record its manifest is the batch, the others delete their files",
            **state,
        )
    path = table.staging_path(batch_id, stage_id)

    def stage(carried: dict[int, int] | None) -> tuple[kinds.Correction, dict, dict | None]:
        try:
            return stage_once(carried, guarded=False)
        except Exception as exc:
            if not (checksums.ENABLED and checksums.overflowed(exc)):
                raise
            # A checksum's plain sum overflowed (or the kind's own arithmetic did: it fails again).
            files.delete_path(path)
            return stage_once(carried, guarded=True)

    def stage_once(carried: dict[int, int] | None, guarded: bool) -> tuple[kinds.Correction, dict, dict | None]:
        checks = BatchChecks(cfg, desc.lower, desc.upper, stage_id, carried, guarded) if checksums.ENABLED else None
        corr = batch_correction(spark, store, cfg, persist, desc.lower, desc.upper, checks)
        with checksums.observable(spark):  # the checksums and an upsert feed's progress
            _, stats = frames.write_staged(spark, table, batch_id, stage_id, corr.updates, checks)
        if checks is None:
            return corr, stats, None
        sums = checks.totals()
        self_check(cfg, batch_id, desc.lower, desc.upper, sums)
        return corr, stats, sums

    try:
        read_version = table.latest_version()
        persist = frames.read_updates(spark, table, read_version)
        carried = carried_checksums(store, table, desc.lower, read_version) if checksums.ENABLED else None
        try:
            corr, stats, sums = stage(carried)
        except SelfCheckFailed:
            if carried is None:
                raise
            # A bug fails this attempt too; otherwise the shard as read is not what the previous
            # batch recorded.
            files.delete_path(path)
            corr, stats, sums = stage(None)
            event(
                log,
                "the shard as read does not have the checksums the previous batch recorded: the table changed "
                "behind the sink's back, or it or the record is damaged; this batch was computed again with the "
                "shard observed in full and adds up (`python -m reconcile check SINK --verify` names the partitions)",
                level=logging.WARNING,
                **state,
            )
        failpoint("write.after_partition_staged")
        staged_sizes = files.list_files(path)
        digests = {rel: files.digest(f"{path}/{rel}") for rel in staged_sizes}
    except Exception:
        now_b = store.get_batch(batch_id, cfg.name)
        files.delete_path(path)  # this attempt's files: never recorded, so never committed
        if now_b.state in OPEN_STATES and now_b.stage_id == replaces:
            raise  # nobody else finished: this attempt's own failure
        outcome, msg = _lost(now_b, stage_id)
        return WriteResult(outcome, event(log, msg, **state), batch_id=batch_id)
    parts = {}
    for p in range(cfg.partitions):
        mine = sorted(k for k in staged_sizes if layout.part_of(k) == p)
        parts[str(p)] = {
            **stats.get(p, {"rows": 0, "err": 0, "weight": 0, "checksum": "0", "net": 0}),
            "files": {k: staged_sizes[k] for k in mine},
            "digests": {k: digests[k] for k in mine},
        }
        desired, shard_sum = (None, None) if sums is None else (sums["desired"][p], sums["shard"][p])
        if desired is not None and shard_sum is not None:  # check --verify recomputes shard_checksum
            parts[str(p)]["desired_checksum"] = checksums.text(desired)
            parts[str(p)]["shard_checksum"] = checksums.text(shard_sum)
    rows_err = sum(s["err"] for s in stats.values())
    rows_ok = sum(s["rows"] for s in stats.values()) - rows_err
    drift = drift_rows(spark, store, table, read_version, desc.upper)
    manifest = {
        "batch_id": batch_id,
        "stage_id": stage_id,
        "layout": layout.BATCHES_DIR,
        "lower": desc.lower,
        "upper": desc.upper,
        "partitions": cfg.partitions,
        "read_version": read_version,
        "parts": parts,
    }
    feed = corr.feed
    if feed:
        manifest.update(feed)
        if corr.late_commands:
            event(
                log,
                f"{corr.late_commands} late command(s) (time below lower {iso(desc.lower)}, arrived after "
                "their time's batch) are applied at lower",
                level=logging.WARNING,
                **state,
            )
    staged = Staged(
        stage_id,
        manifest,
        rows_ok,
        rows_err,
        read_version,
        drift,
        corr.source_offset,
        corr.late_commands,
        rows_net=sum(s["net"] for s in stats.values()),
    )
    won, now_b = store.mark_staged(batch_id, staged, replaces=replaces)
    if not won:
        files.delete_path(path)  # never recorded: no append can commit it
        outcome, msg = _lost(now_b, stage_id)
        return WriteResult(outcome, event(log, msg, **state), batch_id=batch_id)
    failpoint("write.after_staged")
    msg = event(log, "staged batch", **staged.summary(), partitions=cfg.partitions, **feed, **state)
    return WriteResult("staged", msg, rows_ok, rows_err, drift, parts, batch_id)

"""The ``append`` stage: the guarded, transactional commit of a staged batch.

### Protocol

The Delta log is the linearization point and the source of truth; the metadata row follows it.

1. **Sync** (:func:`sync`): read the Delta versions after the last one the metadata absorbed;
   for each batch commit found (commit metadata ``{"reconcile": {"op": "batch", ...}}``), roll
   the metadata forward: compare-and-set ``upper`` from the batch's ``lower`` to its ``upper``,
   mark the batch ``committed`` in the ledger. This repairs a crash between the Delta commit and
   the metadata update, whoever comes next.
2. **Check**: a batch already committed is done (a rerun is a no-op). If the shard's ``upper``
   passed ``lower``, the batch is outdated: its staged files are deleted, and the append
   succeeds as a no-op when the winner covered ``[lower, upper)``, else fails harmlessly
   (:class:`~reconcile.errors.LostRace`). If the shard is new (upper behind the sink's
   ``as_of`` == ``lower``), its upper is first advanced to ``lower`` (seed 002,
   ``advance_shard_upper``).
3. **Verify** the staged parts against the manifest (files, sizes, rows, checksums): exactly
   the files of the write attempt the manifest names are read, no other.
4. **Commit** all parts as one Delta version with ``txnAppId = reconcile-sink:<sink>``,
   ``txnVersion = lower`` and the batch in the commit metadata (with its rows and checksum
   per partition, and this append attempt's ``commit_id``). Delta refuses (skips) a
   ``txnVersion`` that is not above the last one: at most one commit per ``lower``, ever, and
   committed ``lower``s strictly increase.
5. **Sync** again: absorbs our commit (or the commit of whoever won the same ``lower``: another
   attempt of the same batch says so), then deletes the staged files of this batch and of every
   outdated batch.
6. **Check the commit against its description**: the rows the Delta version added, per hash
   partition, have the manifest's counts and checksums (else :class:`InconsistentState`).

### Invariants

1. At most one batch per ``(shard, lower)`` is committed (Delta's txn guard; the ledger's
   partial unique index).
2. Committed ``lower``s strictly increase and each equals the previous batch's ``upper`` (the
   compare-and-set in :meth:`MetadataStore.absorb_commit` refuses anything else).
3. Every step is idempotent: a crash at any point is repaired by rerunning ``append`` (or by the
   next run's ``write``/``append``, which sync first).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from pyspark.sql import SparkSession

from reconcile import kinds
from reconcile.config import SinkConfig
from reconcile.errors import DescriptionOutdated, InconsistentState, LostRace, Retryable, StagedBatchInvalid, brief
from reconcile.failpoints import failpoint
from reconcile.log import event
from reconcile.model import COMMITTED, MINTED, SUPERSEDED, BatchDescription
from reconcile.sink.sync import gc_staged, sync
from reconcile.sink.verify import commit_differences, differences, parse_manifest, staged_files
from reconcile.storage import delta as storage
from reconcile.storage.ledger import MetadataStore
from reconcile.storage.tables import Shard

log = logging.getLogger("reconcile.append")


@dataclass
class AppendResult:
    outcome: str  # committed | recovered | already_committed | covered
    message: str
    delta_version: int | None = None


def verify_staged(spark: SparkSession, cfg: SinkConfig, batch_id: str, manifest: dict):
    """The staged DataFrame of exactly the files the manifest names, after checking them
    against it (present with their sizes, no stranger in the attempt's directory, rows and
    checksum per partition)."""
    path, expected_files = staged_files(spark, cfg, batch_id, manifest)
    try:
        staged = storage.read_staged(spark, cfg, path, list(expected_files))
        stats = storage.partition_stats(cfg, staged)
    except Exception as exc:  # unreadable (corrupted) parquet
        raise StagedBatchInvalid(f"staged batch {batch_id} is unreadable: {brief(exc, 300)}", sink=cfg.name) from None
    wrong = differences(manifest, stats, f"staged partition {{p}} of batch {batch_id}")
    if wrong:
        raise StagedBatchInvalid(wrong[0], sink=cfg.name)
    return staged


def _nothing_to_append(outcome: str, why: str, shard: Shard, state: dict) -> AppendResult:
    msg = event(log, f"nothing to append: {why}; deleted this batch's staged files", shard_upper=shard.upper, **state)
    return AppendResult(outcome, msg)


def _outdated(
    spark: SparkSession, store: MetadataStore, cfg: SinkConfig, desc: BatchDescription, shard: Shard, state: dict
) -> AppendResult:
    winner = store.committed_batch(cfg.name, desc.lower)
    if winner is None and shard.upper <= desc.lower:
        # Nothing committed this lower yet: a newer description of it superseded this one.
        b = store.get_batch(desc.batch_id, cfg.name)
        why = b.message or "superseded by a newer description"
        storage.delete_path(spark, storage.staging_path(cfg, desc.batch_id))
        newer = store.superseder(b)
        if newer is not None and newer.upper >= desc.upper:
            why = f"batch {newer.batch_id} of run {newer.run_id} superseded this one and covers [{desc.lower}, {desc.upper}) (up to {newer.upper})"
            return _nothing_to_append("superseded", why, shard, state)
        event(log, f"not appending: {why}", level=logging.WARNING, shard_upper=shard.upper, **state)
        raise DescriptionOutdated(
            f"batch {desc.batch_id} [{desc.lower}, {desc.upper}) was {why}; its staged files were "
            "deleted, nothing was written",
            sink=cfg.name,
            remedy="none needed: the superseding run appends this interval; check that run if it failed.",
        )
    who = f"batch {winner.batch_id} of run {winner.run_id}" if winner else "another writer"
    store.mark_superseded(desc.batch_id, f"outdated: {who} committed lower {desc.lower}; shard upper {shard.upper}")
    storage.delete_path(spark, storage.staging_path(cfg, desc.batch_id))
    gc_staged(spark, store, cfg)
    if shard.upper >= desc.upper:
        return _nothing_to_append("covered", f"{who} already covered [{desc.lower}, {desc.upper})", shard, state)
    event(log, f"append lost the race to {who}", level=logging.WARNING, shard_upper=shard.upper, **state)
    raise LostRace(
        f"batch {desc.batch_id} [{desc.lower}, {desc.upper}) is outdated: {who} moved the shard's "
        f"upper to {shard.upper}; its staged files were deleted, nothing was written",
        sink=cfg.name,
        remedy=(
            f"none needed: the next scheduled run, or clearing this whole DAG run (run "
            f"{desc.run_id}), appends the rest from {shard.upper} to {desc.upper}."
        ),
    )


def _kind_check(spark: SparkSession, cfg: SinkConfig, staged, desc: BatchDescription, state: dict) -> list[str]:
    """After a commit: the kind's invariants for the rows the batch touched (upsert: each touched
    key has at most one value, count 1)."""
    broken = kinds.invariants(cfg, storage.read_updates(spark, cfg), desc.upper - 1, keys=staged)
    for v in broken:
        event(log, f"{cfg.kind} invariant violated after commit: {v}", level=logging.ERROR, **state)
    return broken


def run_append(spark: SparkSession, store: MetadataStore, cfg: SinkConfig, batch_id: str) -> AppendResult:
    b = store.get_batch(batch_id, cfg.name)
    desc = BatchDescription.of(b)
    state = dict(sink=cfg.name, batch=batch_id, lower=desc.lower, upper=desc.upper, run=desc.run_id)
    if b.state == COMMITTED:
        gc_staged(spark, store, cfg)
        msg = event(log, f"already committed in Delta version {b.delta_version}; nothing to do", **state)
        return AppendResult("already_committed", msg, b.delta_version)

    storage.ensure_table(spark, cfg)
    shard = sync(spark, store, cfg)
    b = store.get_batch(batch_id, cfg.name)
    if b.state == COMMITTED:  # an earlier attempt committed to Delta and died before the metadata
        gc_staged(spark, store, cfg)
        msg = event(
            log,
            "recovered: an earlier attempt had committed this batch to Delta; rolled the metadata forward",
            delta_version=b.delta_version,
            **state,
        )
        return AppendResult("recovered", msg, b.delta_version)
    if b.state == SUPERSEDED or shard.upper > desc.lower:
        return _outdated(spark, store, cfg, desc, shard, state)
    if b.state == MINTED:
        raise StagedBatchInvalid(
            f"batch {batch_id} was minted but never staged",
            sink=cfg.name,
            remedy="clear the run's 'write' task (and 'append' after it).",
        )
    try:
        staged = verify_staged(spark, cfg, batch_id, parse_manifest(cfg, batch_id, b.manifest))
    except StagedBatchInvalid:
        sync(spark, store, cfg)  # another attempt may have committed it and cleaned up meanwhile
        now_b = store.get_batch(batch_id, cfg.name)
        if now_b.state == COMMITTED:
            msg = event(
                log,
                f"another attempt of this batch committed it (Delta version {now_b.delta_version}) while this "
                "one verified its staged files; nothing more to do",
                **state,
            )
            return AppendResult("already_committed", msg, now_b.delta_version)
        if now_b.state == b.state and now_b.stage_id == b.stage_id:
            raise
        raise Retryable(  # not damage: another attempt of the batch moved on meanwhile
            f"batch {batch_id} changed while this append verified it (now {now_b.state}, staged by "
            f"{now_b.stage_id}, was {b.stage_id}): another attempt of it is writing or appending",
            sink=cfg.name,
            remedy="the task retries by itself and appends (or finds appended) what is staged now.",
        ) from None
    if shard.upper < desc.lower:
        if desc.lower != shard.as_of:
            raise InconsistentState(
                f"shard upper {shard.upper} is behind lower {desc.lower}, which is not the sink's as_of {shard.as_of}",
                sink=cfg.name,
            )
        before = store.advance_to_as_of(cfg.name, desc.lower)
        if before < desc.lower:
            event(log, "advanced a new shard's upper to the sink's as_of", old_upper=before, **state)
        failpoint("append.after_advance_as_of")

    failpoint("append.before_delta_commit")
    manifest = parse_manifest(cfg, batch_id, b.manifest)
    commit_id = uuid.uuid4().hex[:16]  # this append attempt: tells our commit from another's
    meta = {
        "batch_id": batch_id,
        "lower": desc.lower,
        "upper": desc.upper,
        "run_id": desc.run_id,
        "rows_ok": b.rows_ok,
        "rows_err": b.rows_err,
        "stage_id": manifest.get("stage_id"),
        "commit_id": commit_id,
        "partitions": manifest["partitions"],
        # the description the commit must match: `check` verifies the version against it
        "parts": {p: {"rows": part["rows"], "checksum": part["checksum"]} for p, part in manifest["parts"].items()},
    }
    if b.source_offset is not None or b.late_commands is not None:  # upsert: the feed's progress
        meta.update(source_offset=b.source_offset, late_commands=b.late_commands)
    commit_error: Exception | None = None
    try:
        failpoint("append.inside_delta_commit")
        storage.commit_batch(spark, cfg, staged, meta)
    except Retryable:
        raise
    except Exception as exc:  # a concurrent Delta commit; decided by the sync below
        commit_error = exc
    failpoint("append.after_delta_commit")

    shard = sync(spark, store, cfg)
    b = store.get_batch(batch_id, cfg.name)
    if b.state == COMMITTED and b.delta_version is not None:
        info = storage.commit_info(spark, cfg, b.delta_version)
        ours = (storage.reconcile_meta(info) or {}).get("commit_id") == commit_id
        if not ours:
            storage.delete_path(spark, storage.staging_path(cfg, batch_id))
            gc_staged(spark, store, cfg)
            msg = event(
                log,
                f"another attempt of this batch committed it in Delta version {b.delta_version} while this "
                "one was appending; nothing more to do",
                delta_version=b.delta_version,
                **state,
            )
            return AppendResult("already_committed", msg, b.delta_version)
        wrong, _ = commit_differences(spark, cfg, {b.delta_version: meta})
        broken = _kind_check(spark, cfg, staged, desc, state)  # reads the staged keys: before the cleanup
        storage.delete_path(spark, storage.staging_path(cfg, batch_id))
        gc_staged(spark, store, cfg)
        extra = {"late_commands": b.late_commands, "invariant_violations": len(broken)} if kinds.reads_feed(cfg) else {}
        if wrong:
            event(log, f"the committed batch does not match its manifest: {wrong[0]}", level=logging.ERROR, **state)
            raise InconsistentState(
                f"Delta version {b.delta_version} of batch {batch_id} does not match the batch's manifest: "
                f"{'; '.join(wrong)}",
                sink=cfg.name,
                remedy=f"the next batch repairs the shard's contents; run `python -m reconcile check {cfg.name}` "
                "and report this (a bug, or a foreign process writing into the staged files).",
            )
        msg = event(
            log,
            "appended batch",
            delta_version=b.delta_version,
            rows_ok=b.rows_ok,
            rows_err=b.rows_err,
            drift_rows=b.drift_rows,
            shard_upper=shard.upper,
            **extra,
            **state,
        )
        return AppendResult("committed", msg, b.delta_version)
    if shard.upper > desc.lower:
        return _outdated(spark, store, cfg, desc, shard, state)
    if commit_error is not None:
        raise Retryable(
            f"Delta commit of batch {batch_id} failed: {brief(commit_error, 300)}",
            sink=cfg.name,
            remedy="the task retries by itself; nothing was committed.",
        )
    raise InconsistentState(
        f"Delta skipped the commit of batch {batch_id} (lower {desc.lower}): a Delta version under "
        f"the sink's commit guard ({storage.app_id(cfg)}) already recorded a txnVersion at or above "
        "it, but no batch for it is in the log",
        sink=cfg.name,
        remedy=(
            f"find that version with `python -m reconcile check {cfg.name}`, restore the Delta table "
            "to the version before it (RESTORE TABLE ... TO VERSION AS OF), then clear this run."
        ),
    )

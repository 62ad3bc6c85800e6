"""The ``append`` stage: the guarded, transactional commit of a staged batch, in plain Python.

The staged files become table files as they are: the commit adds them to the Delta log with
their statistics (read from their Parquet footers); no row is read or rewritten, and no JVM is
started.

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
   ``as_of`` == ``lower``), its upper is first advanced to ``lower`` (as Materialize's persist sink
   advances a new shard's upper).
3. **Verify** the staged files against the manifest: exactly the files of the write attempt
   the manifest names, with their sizes and content digests, and per partition the rows the
   manifest records (from the files' Parquet footers).
4. **Commit** the files as one Delta version (``add`` actions) with the application transaction
   ``(reconcile-sink:<sink>, lower)`` and the batch in the commit metadata (its rows, checksum
   and files per partition, and this append attempt's ``commit_id``): only if the snapshot's
   recorded transaction is below ``lower``, at exactly the version after that snapshot
   (:meth:`reconcile.storage.delta.ShardTable.commit_files`). At most one commit per ``lower``, ever, and
   committed ``lower``s strictly increase. The commit is made holding the shard's commit lease
   (:meth:`Ledger.commit_lease`): the sink's own writers commit one at a time, and the
   lease's fence, checked right before the commit file is put, stops a writer whose lease lapsed
   while it was paused (``CommitLeaseLost``, retryable: nothing committed). The lease's epoch is
   in the commit metadata (``commit_epoch``).
5. **Sync** again: absorbs our commit (or the commit of whoever won the same ``lower``: another
   attempt of the same batch says so), then deletes the staged files that can never be
   committed (other attempts of this batch, outdated batches).
6. **Check the commit against its description**: the Delta version added exactly the
   manifest's files, with its rows per hash partition (else :class:`InconsistentState`).

### Invariants

1. At most one batch per ``(shard, lower)`` is committed (Delta's txn guard; the ledger's
   partial unique index).
2. Committed ``lower``s strictly increase and each equals the previous batch's ``upper`` (the
   compare-and-set in :meth:`Ledger.absorb_commit` refuses anything else).
3. Every step is idempotent: a crash at any point is repaired by rerunning ``append`` (or by the
   next run's ``write``/``append``, which sync first).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import dataclass

from reconcile import remedy
from reconcile.config import SinkConfig
from reconcile.errors import DescriptionOutdated, InconsistentState, LostRace, Retryable, StagedBatchInvalid, brief
from reconcile.failpoints import failpoint
from reconcile.log import event, iso
from reconcile.manifest import Manifest
from reconcile.model import COMMITTED, MINTED, SUPERSEDED, BatchDescription
from reconcile.sink import guard
from reconcile.sink.sync import gc_staged, sync
from reconcile.sink.verify import log_differences, parse_manifest, staged_files
from reconcile.storage import commits, footers, layout
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.tables import Shard

log = logging.getLogger("reconcile.append")


@dataclass
class AppendResult:
    outcome: str  # committed | recovered | already_committed | covered
    message: str
    delta_version: int | None = None


def inspect_staged(table: ShardTable, batch_id: str, manifest: Manifest) -> list[tuple[str, int, dict]]:
    """The files the manifest names as the Delta commit adds them (path relative to the table,
    size, statistics), after checking them against it: present with their sizes and content
    digests, no stranger in the attempt's directory, per partition the manifest's rows."""
    cfg = table.cfg
    path, expected = staged_files(table, batch_id, manifest)
    out = []
    rows: Counter[int | None] = Counter()
    for rel, size in sorted(expected.items()):
        try:
            stats = footers.file_stats(f"{path}/{rel}")
        except Exception as exc:  # noqa: BLE001 - an unreadable (corrupted) Parquet footer
            raise StagedBatchInvalid(
                f"staged batch {batch_id}: file {rel} is unreadable: {brief(exc, 200)}", sink=cfg.name
            ) from None
        rows[layout.part_of(rel)] += stats["numRecords"]
        out.append((layout.staged_relative(batch_id, manifest.stage_id or "", rel), size, stats))
    for p, want in manifest.parts.items():
        if rows[p] != want.rows:
            raise StagedBatchInvalid(
                f"staged partition {p} of batch {batch_id} has {rows[p]} rows, the manifest says {want.rows}",
                sink=cfg.name,
            )
    return out


def _nothing_to_append(outcome: str, why: str, shard: Shard, state: dict) -> AppendResult:
    msg = event(log, f"nothing to append: {why}", shard_upper=shard.upper, **state)
    return AppendResult(outcome, msg)


def _outdated(store: Ledger, table: ShardTable, desc: BatchDescription, shard: Shard, state: dict) -> AppendResult:
    cfg = table.cfg
    winner = store.committed_batch(cfg.name, desc.lower)
    if winner is None and shard.upper <= desc.lower:
        # Nothing committed this lower yet: a newer description of it superseded this one. Its
        # staged files stay until the shard's upper passes its lower (an append of it already
        # in flight may still commit them); the garbage collection deletes them then.
        b = store.get_batch(desc.batch_id, cfg.name)  # its message says what superseded it
        why = b.message or "superseded by a newer description"
        newer = store.superseder(b)
        if newer is not None and newer.upper >= desc.upper:
            why = (
                f"batch {newer.batch_id} of run {newer.run_id} superseded this one and covers "
                f"[{iso(desc.lower)}, {iso(desc.upper)}) (up to {iso(newer.upper)})"
            )
            return _nothing_to_append("superseded", why, shard, state)
        if newer is not None:  # a narrower description won: it covers only part of this interval
            why = (
                f"superseded by batch {newer.batch_id} of run {newer.run_id}, which covers only "
                f"[{iso(newer.lower)}, {iso(newer.upper)})"
            )
            rest_from = newer.upper
        else:
            rest_from = desc.lower
        event(log, f"not appending: {why}", level=logging.WARNING, shard_upper=shard.upper, **state)
        raise DescriptionOutdated(
            f"batch {desc.batch_id} [{iso(desc.lower)}, {iso(desc.upper)}) was {why}; nothing was written",
            sink=cfg.name,
            remedy=_rest_remedy(cfg, desc, rest_from),
        )
    who = f"batch {winner.batch_id} of run {winner.run_id}" if winner else "another writer"
    store.mark_superseded(
        desc.batch_id, f"outdated: {who} committed lower {iso(desc.lower)}; shard upper {iso(shard.upper)}"
    )
    gc_staged(store, table)
    if shard.upper >= desc.upper:
        return _nothing_to_append(
            "covered",
            f"{who} already covered [{iso(desc.lower)}, {iso(desc.upper)}); deleted its staged files",
            shard,
            state,
        )
    event(log, f"append lost the race to {who}", level=logging.WARNING, shard_upper=shard.upper, **state)
    raise LostRace(
        f"batch {desc.batch_id} [{iso(desc.lower)}, {iso(desc.upper)}) is outdated: {who} moved the shard's "
        f"upper to {iso(shard.upper)}; its staged files were deleted, nothing was written",
        sink=cfg.name,
        remedy=_rest_remedy(cfg, desc, shard.upper),
    )


def _rest_remedy(cfg: SinkConfig, desc: BatchDescription, rest_from: int) -> str:
    """Who appends what an outdated description still covers beyond what won."""
    rest = f"[{iso(rest_from)}, {iso(desc.upper)})"
    now = f"`{remedy.trigger(cfg.name)}` (a new run: its mint starts at the shard's upper)"
    if cfg.schedule is None:  # no next run comes by itself
        return f"a new run appends {rest}: {now}."
    return f"none needed: the next scheduled run appends {rest} (its mint starts at the shard's upper); {now} appends it now."


def _committed_meanwhile(store: Ledger, table: ShardTable, b, state: dict, when: str) -> AppendResult:
    gc_staged(store, table)
    msg = event(
        log,
        f"another attempt of this batch committed it (Delta version {b.delta_version}) while this one {when}; "
        "nothing more to do",
        delta_version=b.delta_version,
        **state,
    )
    return AppendResult("already_committed", msg, b.delta_version)


def run_append(store: Ledger, cfg: SinkConfig, batch_id: str, *, approve: str | None = None) -> AppendResult:
    """Commit the staged batch (``approve``: who lets it past the correction guard, if anyone)."""
    table = ShardTable(cfg)
    b = store.get_batch(batch_id, cfg.name)
    desc = BatchDescription.of(b)
    state = dict(sink=cfg.name, batch=batch_id, lower=desc.lower, upper=desc.upper, run=desc.run_id)
    if b.state == COMMITTED:
        gc_staged(store, table)
        msg = event(log, f"already committed in Delta version {b.delta_version}; nothing to do", **state)
        return AppendResult("already_committed", msg, b.delta_version)
    if not table.exists():  # no write created it yet: nothing can be committed
        if b.state == SUPERSEDED:
            return _outdated(store, table, desc, store.get_shard(cfg.name), state)
        raise StagedBatchInvalid(
            f"batch {batch_id}: the shard's Delta table at {table.path} does not exist",
            sink=cfg.name,
            remedy="its write creates the table and stages the batch.",
        )
    shard = sync(store, table)
    b = store.get_batch(batch_id, cfg.name)  # re-read: the sync may have absorbed this batch's commit
    if b.state == COMMITTED:  # an earlier attempt committed to Delta and died before the metadata
        gc_staged(store, table)
        msg = event(
            log,
            "recovered: an earlier attempt had committed this batch to Delta; rolled the metadata forward",
            delta_version=b.delta_version,
            **state,
        )
        return AppendResult("recovered", msg, b.delta_version)
    if b.state == SUPERSEDED or shard.upper > desc.lower:
        return _outdated(store, table, desc, shard, state)
    if b.state == MINTED:
        raise StagedBatchInvalid(
            f"batch {batch_id} was minted but never staged",
            sink=cfg.name,
            remedy="its write stages the batch.",
        )
    table.check_schema()
    manifest = parse_manifest(cfg, batch_id, b.manifest)
    try:
        files = inspect_staged(table, batch_id, manifest)
    except StagedBatchInvalid:
        sync(store, table)  # another attempt may have committed it and cleaned up meanwhile
        now_b = store.get_batch(batch_id, cfg.name)
        if now_b.state == COMMITTED:
            return _committed_meanwhile(store, table, now_b, state, "verified its staged files")
        if now_b.state == b.state and now_b.stage_id == b.stage_id:
            raise
        raise Retryable(  # not damage: another attempt of the batch moved on meanwhile
            f"batch {batch_id} changed while this append verified it (now {now_b.state}, staged by "
            f"{now_b.stage_id}, was {b.stage_id}): another attempt of it is writing or appending",
            sink=cfg.name,
            remedy="the task retries by itself and appends (or finds appended) what is staged now.",
        ) from None
    if approve:
        b = store.approve(cfg.name, batch_id, approve)
    change = guard.check(table, batch_id, desc.lower, desc.upper, manifest, b.approved)
    if change is not None and b.approved and change.share > (cfg.correction_guard.max_share or 1):
        event(log, f"correction guard: {change.share:.1%} of the shard changes, approved by {b.approved}", **state)
    if shard.upper < desc.lower:
        if desc.lower != shard.as_of:
            raise InconsistentState(
                f"shard upper {iso(shard.upper)} is behind lower {iso(desc.lower)}, which is not the sink's as_of {iso(shard.as_of)}",
                sink=cfg.name,
            )
        before = store.advance_to_as_of(cfg.name, desc.lower)
        if before < desc.lower:
            event(log, "advanced a new shard's upper to the sink's as_of", old_upper=before, **state)
        failpoint("append.after_advance_as_of")

    failpoint("append.before_delta_commit")
    commit_id = uuid.uuid4().hex[:16]  # this append attempt: tells our commit from another's
    meta = {
        "batch_id": batch_id,
        "lower": desc.lower,
        "upper": desc.upper,
        "run_id": desc.run_id,
        "rows_ok": b.rows_ok,
        "rows_err": b.rows_err,
        "commit_id": commit_id,
        # the description the commit must match: `check` verifies the version against it and
        # its checksums as of upper - 1 (`check --verify`)
        **manifest.commit_meta(),
    }
    if b.source_offset is not None or b.late_commands is not None:  # a feed's progress (the ledger's record)
        meta.update(source_offset=b.source_offset, late_commands=b.late_commands)
    failpoint("append.inside_delta_commit")
    with store.commit_lease(cfg.name, f"append of batch {batch_id} ({commit_id})") as lease:
        failpoint("append.inside_lease")
        meta["commit_epoch"] = lease.epoch
        table.commit_files(files, meta, desc.lower, fence=lease.fence)
    failpoint("append.after_delta_commit")

    shard = sync(store, table)
    b = store.get_batch(batch_id, cfg.name)  # re-read: the sync absorbed whichever commit took this lower
    if b.state == COMMITTED and b.delta_version is not None:
        info = table.commit_info(b.delta_version)
        if (commits.reconcile_meta(info) or {}).get("commit_id") != commit_id:
            return _committed_meanwhile(store, table, b, state, "was appending")
        wrong = log_differences(table, b.delta_version, manifest)
        gc_staged(store, table)
        if wrong:
            event(log, f"the committed batch does not match its manifest: {wrong[0]}", level=logging.ERROR, **state)
            raise InconsistentState(
                f"Delta version {b.delta_version} of batch {batch_id} does not match the batch's manifest: "
                f"{'; '.join(wrong)}",
                sink=cfg.name,
                remedy=f"the next batch repairs the shard's contents; run `python -m reconcile check {cfg.name}` "
                "and report this (a bug, or a foreign process writing into the Delta log).",
            )
        extra = {"late_commands": b.late_commands} if b.late_commands is not None else {}
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
        return _outdated(store, table, desc, shard, state)
    raise InconsistentState(
        f"Delta skipped the commit of batch {batch_id} (lower {iso(desc.lower)}): a Delta version under the "
        f"sink's commit guard ({table.app_id}) already recorded a transaction at or above it, but "
        "no batch for it is in the log",
        sink=cfg.name,
        remedy=(
            f"find that version with `python -m reconcile check {cfg.name}` and restore the Delta table "
            "to the version before it (RESTORE TABLE ... TO VERSION AS OF); then "
            + (f"`{remedy.append_run(cfg.name, desc.run_id)}`." if desc.run_id else "rerun the batch's append.")
        ),
    )

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
from dataclasses import dataclass, field
from typing import Any

from reconcile import remedy
from reconcile.config import SinkConfig
from reconcile.errors import DescriptionOutdated, InconsistentState, LostRace, Retryable, StagedBatchInvalid, brief
from reconcile.failpoints import failpoint
from reconcile.log import event, iso
from reconcile.manifest import Manifest
from reconcile.model import COMMITTED, MINTED, SUPERSEDED, BatchDescription, Outcome
from reconcile.sink import guard
from reconcile.sink.current import CurrentResult, maintain
from reconcile.sink.sync import gc_staged, sync
from reconcile.sink.verify import log_differences, missing_columns, parse_manifest, staged_files
from reconcile.storage import commits, footers, layout
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger, feed_of
from reconcile.storage.ledger_rows import Batch, Shard

log = logging.getLogger(__name__)


@dataclass
class AppendResult:
    outcome: Outcome  # COMMITTED | RECOVERED | ALREADY_COMMITTED | COVERED | SUPERSEDED
    message: str
    delta_version: int | None = None
    current: CurrentResult | None = None  # the current-state table brought up to the shard


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
    rewritten = manifest.rewrite.rows if manifest.rewrite is not None else 0
    if rows[None] != rewritten:  # the files outside a partition: the shard rewritten into a new schema
        raise StagedBatchInvalid(
            f"staged batch {batch_id}: the shard's rewrite into the sink file's schema has {rows[None]} rows, "
            f"the manifest says {rewritten}",
            sink=cfg.name,
        )
    return out


def _nothing_to_append(outcome: Outcome, why: str, shard: Shard, state: dict) -> AppendResult:
    msg = event(log, f"nothing to append: {why}", shard_upper=shard.upper, **state)
    return AppendResult(outcome, msg)


def _outdated(ledger: Ledger, table: ShardTable, desc: BatchDescription, shard: Shard, state: dict) -> AppendResult:
    cfg = table.cfg
    winner = ledger.committed_batch(cfg.name, desc.lower)
    if winner is None and shard.upper <= desc.lower:
        # Nothing committed this lower yet: a newer description of it superseded this one. Its
        # staged files stay until the shard's upper passes its lower (an append of it already
        # in flight may still commit them); the garbage collection deletes them then.
        b = ledger.get_batch(desc.batch_id, cfg.name)  # its message says what superseded it
        why = b.message or "superseded by a newer description"
        newer = ledger.superseder(b)
        if newer is not None and newer.upper >= desc.upper:
            why = (
                f"batch {newer.batch_id} of run {newer.run_id} superseded this one and covers "
                f"[{iso(desc.lower)}, {iso(desc.upper)}) (up to {iso(newer.upper)})"
            )
            return _nothing_to_append(Outcome.SUPERSEDED, why, shard, state)
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
    ledger.mark_superseded(
        desc.batch_id, f"outdated: {who} committed lower {iso(desc.lower)}; shard upper {iso(shard.upper)}"
    )
    gc_staged(ledger, table)
    if shard.upper >= desc.upper:
        return _nothing_to_append(
            Outcome.COVERED,
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


def _committed_meanwhile(ledger: Ledger, table: ShardTable, b, state: dict, when: str) -> AppendResult:
    gc_staged(ledger, table)
    msg = event(
        log,
        f"another attempt of this batch committed it (Delta version {b.delta_version}) while this one {when}; "
        "nothing more to do",
        delta_version=b.delta_version,
        **state,
    )
    return AppendResult(Outcome.ALREADY_COMMITTED, msg, b.delta_version)


@dataclass
class Appending:
    """One append attempt of a batch: what every step reads and moves forward. ``b`` and
    ``shard`` are re-read by :meth:`reread` after each sync (a sync may absorb this batch)."""

    ledger: Ledger
    cfg: SinkConfig
    batch_id: str
    approve: str | None = None
    table: ShardTable = field(init=False)
    b: Batch = field(init=False)
    desc: BatchDescription = field(init=False)
    state: dict = field(init=False)
    shard: Shard | None = None
    manifest: Manifest | None = None
    files: list[tuple[str, int, dict]] = field(default_factory=list)
    schema_plan: Any = None  # the sink file's schema change this batch's commit applies (falsy: none)
    commit_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])  # tells our commit from another's

    def __post_init__(self) -> None:
        self.table = ShardTable(self.cfg)
        self.b = self.ledger.get_batch(self.batch_id, self.cfg.name)
        self.desc = BatchDescription.of(self.b)
        d = self.desc
        self.state = dict(sink=self.cfg.name, batch=self.batch_id, lower=d.lower, upper=d.upper, run=d.run_id)

    def reread(self) -> Batch:
        """The batch as the ledger has it now (after a sync, which may have absorbed its commit)."""
        self.b = self.ledger.get_batch(self.batch_id, self.cfg.name)
        return self.b


def run_append(ledger: Ledger, cfg: SinkConfig, batch_id: str, *, approve: str | None = None) -> AppendResult:
    """Commit the staged batch (``approve``: who lets it past the correction guard, if anyone):
    settle what is known, verify the staged files, pass the guard, advance a new shard, commit,
    confirm (the module doc's protocol, one step each); then bring the sink's current-state
    table, if it keeps one, up to the shard (whatever committed it: this attempt, an earlier
    one that died before, or another run)."""
    a = Appending(ledger, cfg, batch_id, approve)
    result = _append(a)
    result.current = maintain(ledger, cfg, a.table)
    if result.current is not None and result.current.message:
        result.message = f"{result.message}\n{result.current.message}"
    return result


def _append(a: Appending) -> AppendResult:
    for step in (settle, verify_staged, pass_guard, advance_new_shard):
        done = step(a)
        if done is not None:
            return done
    commit(a)
    return confirm(a)


def settle(a: Appending) -> AppendResult | None:
    """Steps 1-2: a batch committed already (before or by the sync) or outdated has nothing to
    append; a batch minted but never staged, or a table no write created, cannot be appended."""
    if a.b.state == COMMITTED:
        gc_staged(a.ledger, a.table)
        msg = event(log, f"already committed in Delta version {a.b.delta_version}; nothing to do", **a.state)
        return AppendResult(Outcome.ALREADY_COMMITTED, msg, a.b.delta_version)
    if not a.table.exists():  # no write created it yet: nothing can be committed
        if a.b.state == SUPERSEDED:
            return _outdated(a.ledger, a.table, a.desc, a.ledger.get_shard(a.cfg.name), a.state)
        raise StagedBatchInvalid(
            f"batch {a.batch_id}: the shard's Delta table at {a.table.path} does not exist",
            sink=a.cfg.name,
            remedy="its write creates the table and stages the batch.",
        )
    a.shard = sync(a.ledger, a.table)
    if a.reread().state == COMMITTED:  # an earlier attempt committed to Delta and died before the metadata
        gc_staged(a.ledger, a.table)
        msg = event(
            log,
            "recovered: an earlier attempt had committed this batch to Delta; rolled the metadata forward",
            delta_version=a.b.delta_version,
            **a.state,
        )
        return AppendResult(Outcome.RECOVERED, msg, a.b.delta_version)
    if a.b.state == SUPERSEDED or a.shard.upper > a.desc.lower:
        return _outdated(a.ledger, a.table, a.desc, a.shard, a.state)
    if a.b.state == MINTED:
        raise StagedBatchInvalid(
            f"batch {a.batch_id} was minted but never staged",
            sink=a.cfg.name,
            remedy="its write stages the batch.",
        )
    return None


def verify_staged(a: Appending) -> AppendResult | None:
    """Step 3: the table's schema, and exactly the staged files the manifest names (sizes,
    digests, rows per partition). Damage while another attempt moved on is not damage."""
    a.schema_plan = a.table.check_schema()
    a.manifest = parse_manifest(a.cfg, a.batch_id, a.b.manifest)
    try:
        a.files = inspect_staged(a.table, a.batch_id, a.manifest)
    except StagedBatchInvalid:
        sync(a.ledger, a.table)  # another attempt may have committed it and cleaned up meanwhile
        was = a.b
        now_b = a.reread()
        if now_b.state == COMMITTED:
            return _committed_meanwhile(a.ledger, a.table, now_b, a.state, "verified its staged files")
        if now_b.state == was.state and now_b.stage_id == was.stage_id:
            raise
        raise Retryable(  # not damage: another attempt of the batch moved on meanwhile
            f"batch {a.batch_id} changed while this append verified it (now {now_b.state}, staged by "
            f"{now_b.stage_id}, was {was.stage_id}): another attempt of it is writing or appending",
            sink=a.cfg.name,
            remedy="the task retries by itself and appends (or finds appended) what is staged now.",
        ) from None
    try:
        _rewrite_matches(a)
    except StagedBatchInvalid:
        sync(a.ledger, a.table)  # another attempt may have committed it (and the table's schema) meanwhile
        if (now_b := a.reread()).state == COMMITTED:
            return _committed_meanwhile(a.ledger, a.table, now_b, a.state, "verified its staged files")
        raise
    if a.schema_plan and a.files:
        _staged_with_new_columns(a)
    return None


def _rewrite_matches(a: Appending) -> None:
    """A sink file's schema change that rewrites the shard is committed by the batch that staged
    the rewrite of the table as it is now (:mod:`reconcile.sink.evolve`), and only by it: else the
    batch is staged again by its write (the file or the table changed since)."""
    assert a.manifest is not None
    staged, needs = a.manifest.rewrite, bool(a.schema_plan and a.schema_plan.rewrites)
    why = None
    if needs and staged is None:
        why = f"was written before the sink file's schema change ({a.schema_plan.describe()}), which rewrites the shard"
    elif staged is not None and not needs:
        why = f"rewrites the shard ({staged.change}) into a schema the table has, or the sink file no longer asks for"
    elif staged is not None and staged.read_version != (latest := a.table.latest_version()):
        why = f"rewrites the shard as of Delta version {staged.read_version}, and the table is at {latest} now"
    if why is not None:
        raise StagedBatchInvalid(
            f"batch {a.batch_id} {why}",
            sink=a.cfg.name,
            remedy="rerun its write: it stages the batch again against the table and the sink file as they are.",
        )


def _staged_with_new_columns(a: Appending) -> None:
    """A batch committing the sink file's schema change must have been written under it (the file
    may have changed between the write and this append): one staged file's columns read."""
    missing = missing_columns(a.table, a.files[0][0])
    if missing:
        raise StagedBatchInvalid(
            f"batch {a.batch_id} was written before the sink file's schema change ({a.schema_plan.describe()}): "
            f"its staged files have no column {', '.join(missing)}",
            sink=a.cfg.name,
            remedy="rerun its write, which stages it under the sink file's schema.",
        )


def pass_guard(a: Appending) -> AppendResult | None:
    """The correction guard (:mod:`reconcile.sink.guard`), after recording who approved it."""
    if a.approve:
        a.b = a.ledger.approve(a.cfg.name, a.batch_id, a.approve)
    assert a.manifest is not None
    change = guard.check(a.table, a.batch_id, a.desc.lower, a.desc.upper, a.manifest, a.b.approved)
    if change is not None and a.b.approved and change.share > (a.cfg.correction_guard.max_share or 1):
        event(log, f"correction guard: {change.share:.1%} of the shard changes, approved by {a.b.approved}", **a.state)
    return None


def advance_new_shard(a: Appending) -> AppendResult | None:
    """A new shard's upper is first advanced to the sink's ``as_of`` (idempotent: attempts racing
    there all go on)."""
    assert a.shard is not None
    if a.shard.upper >= a.desc.lower:
        return None
    if a.desc.lower != a.shard.as_of:
        raise InconsistentState(
            f"shard upper {iso(a.shard.upper)} is behind lower {iso(a.desc.lower)}, which is not the sink's as_of "
            f"{iso(a.shard.as_of)}",
            sink=a.cfg.name,
        )
    before = a.ledger.advance_to_as_of(a.cfg.name, a.desc.lower)
    if before < a.desc.lower:
        event(log, "advanced a new shard's upper to the sink's as_of", old_upper=before, **a.state)
    failpoint("append.after_advance_as_of")
    return None


def commit(a: Appending) -> None:
    """Step 4: the staged files as one Delta version, under the commit guard and the shard's
    commit lease, with the batch's description in the commit metadata."""
    failpoint("append.before_delta_commit")
    assert a.manifest is not None
    meta = {
        "batch_id": a.batch_id,
        "lower": a.desc.lower,
        "upper": a.desc.upper,
        "run_id": a.desc.run_id,
        "rows_ok": a.b.rows_ok,
        "rows_err": a.b.rows_err,
        "commit_id": a.commit_id,
        # the description the commit must match: `check` verifies the version against it and
        # its checksums as of upper - 1 (`check --verify`)
        **a.manifest.commit_meta(),
    }
    feed = feed_of(a.b)  # a feed's progress (the ledger's record)
    if feed is not None:
        meta.update(source_offset=feed.source_offset, late_commands=feed.late_commands)
    failpoint("append.inside_delta_commit")
    with a.ledger.commit_lease(a.cfg.name, f"append of batch {a.batch_id} ({a.commit_id})") as lease:
        failpoint("append.inside_lease")
        meta["commit_epoch"] = lease.epoch
        schema, rewrite_of = None, None
        if a.schema_plan:  # the sink file's new columns, in this batch's commit (they bring the row key)
            schema = a.table.schema_for_commit()
            meta["schema_change"] = a.schema_plan.describe()
        elif a.table.records_no_key():  # an upsert shard of an earlier release: its key recorded by this commit
            schema = a.table.schema_for_commit()
            meta["key_recorded"] = list(getattr(a.cfg, "key_columns", ()))
        else:
            a.table.add_row_keys(fence=lease.fence)  # a shard created before the row key was stored
        if a.manifest.rewrite is not None:  # the shard rewritten with fresh keys: every file of the version read
            rewrite_of = a.manifest.rewrite.read_version
            meta.update(rekeyed=True, rows_rewritten=a.manifest.rewrite.rows)
        a.table.commit_files(a.files, meta, a.desc.lower, fence=lease.fence, schema=schema, rewrite_of=rewrite_of)
    failpoint("append.after_delta_commit")


def confirm(a: Appending) -> AppendResult:
    """Steps 5-6: sync; the commit that took this lower is ours (else another attempt's), and
    its Delta version added exactly the manifest's files and rows; or the batch is outdated."""
    a.shard = sync(a.ledger, a.table)
    b = a.reread()  # the sync absorbed whichever commit took this lower
    if b.state == COMMITTED and b.delta_version is not None:
        info = a.table.commit_info(b.delta_version)
        if (commits.reconcile_meta(info) or {}).get("commit_id") != a.commit_id:
            return _committed_meanwhile(a.ledger, a.table, b, a.state, "was appending")
        assert a.manifest is not None
        wrong = log_differences(a.table, b.delta_version, a.manifest)
        gc_staged(a.ledger, a.table)
        if wrong:
            event(log, f"the committed batch does not match its manifest: {wrong[0]}", level=logging.ERROR, **a.state)
            raise InconsistentState(
                f"Delta version {b.delta_version} of batch {a.batch_id} does not match the batch's manifest: "
                f"{'; '.join(wrong)}",
                sink=a.cfg.name,
                remedy=f"the next batch repairs the shard's contents; run `python -m reconcile check {a.cfg.name}` "
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
            shard_upper=a.shard.upper,
            **extra,
            **a.state,
        )
        return AppendResult(Outcome.COMMITTED, msg, b.delta_version)
    if a.shard.upper > a.desc.lower:
        return _outdated(a.ledger, a.table, a.desc, a.shard, a.state)
    raise InconsistentState(
        f"Delta skipped the commit of batch {a.batch_id} (lower {iso(a.desc.lower)}): a Delta version under the "
        f"sink's commit guard ({a.table.app_id}) already recorded a transaction at or above it, but "
        "no batch for it is in the log",
        sink=a.cfg.name,
        remedy=(
            f"find that version with `python -m reconcile check {a.cfg.name}` and restore the Delta table "
            "to the version before it (RESTORE TABLE ... TO VERSION AS OF); then "
            + (f"`{remedy.append_run(a.cfg.name, a.desc.run_id)}`." if a.desc.run_id else "rerun the batch's append.")
        ),
    )

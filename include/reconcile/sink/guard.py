"""The correction guard: a batch that would change too much of the shard stops before append.

An empty or truncated upstream makes the correction retract the whole shard, and the sink would
faithfully commit it. A sink with ``correction_guard.max_share`` (say 0.2) refuses to append a
batch that inserts or retracts more than that share of the shard's rows, once the shard holds
``min_rows``: nothing is committed, the append fails with the numbers and the two ways on.

- Approve the batch (``python -m reconcile approve SINK BATCH``, or the run's
  ``approve_correction`` param), then append it (the failed task's remedy ends with the
  commands that rerun the run's ``append``). With ``correction_guard.approve_in_airflow`` the
  run does not fail: it waits in its ``approve_correction`` task for an operator's answer in
  Airflow's UI (:func:`measure` and :func:`stops` decide before the append, committing nothing).
- Or fix the source: the next run's mint supersedes the blocked batch and computes it anew.

The batch's inserted and retracted rows come from its manifest (per partition: the sum of
``|diff|`` and of ``diff``); the shard's rows are the sum of ``_diff`` over the Delta table's
current files, read with delta-rs (one column, no JVM). A batch that applies a sink file's
schema change by rewriting the shard (:mod:`reconcile.sink.evolve`) changes the rows it rewrites
too (its manifest's ``rewrite``): a guard holds it until approved. Checked only when the guard is
set.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconcile.errors import CorrectionBlocked
from reconcile.log import iso
from reconcile.manifest import Manifest
from reconcile.storage.delta import ShardTable


@dataclass(frozen=True)
class Change:
    inserted: int
    retracted: int
    shard_rows: int
    rewritten: int = 0  # update rows rewritten into the sink file's new schema

    @property
    def share(self) -> float:
        return max(self.inserted, self.retracted, self.rewritten) / max(self.shard_rows, 1)


def shard_rows(table: ShardTable) -> int:
    """The shard's rows now (error rows included): the sum of ``_diff`` over its current files."""
    import pyarrow.compute as pc

    if not table.exists():
        return 0
    return int(pc.sum(table.row_diffs()).as_py() or 0)


def measure(table: ShardTable, manifest: Manifest) -> Change | None:
    """What the staged batch would change of the shard now (None when the guard is off or the
    manifest does not record its change). Reads only; commits nothing."""
    if table.cfg.correction_guard.max_share is None:
        return None
    change = manifest.change()
    if change is None:
        return None
    rewritten = manifest.rewrite.rows if manifest.rewrite is not None else 0
    return Change(*change, shard_rows(table), rewritten)


def stops(cfg, change: Change | None) -> bool:
    """Does the guard stop a batch that changes ``change`` (unless someone approves it)?"""
    guard = cfg.correction_guard
    if change is None or guard.max_share is None:
        return False
    return change.shard_rows >= guard.min_rows and change.share > guard.max_share


def describe(cfg, batch_id: str, lower: int, upper: int, change: Change) -> str:
    """The numbers of a stopped batch, in one line."""
    rewrites = (
        f", and rewrite all {change.rewritten:,} update rows into the sink file's new schema"
        if change.rewritten
        else ""
    )
    return (
        f"correction guard: batch {batch_id} [{iso(lower)}, {iso(upper)}) would insert {change.inserted:,} and retract "
        f"{change.retracted:,} of the shard's {change.shard_rows:,} rows{rewrites} ({change.share:.1%}, more than "
        f"correction_guard.max_share {cfg.correction_guard.max_share:.1%})"
    )


def preview(table: ShardTable, inserted: int, retracted: int) -> str | None:
    """What the guard would do with a batch that inserts and retracts these rows (``dry-run``'s
    line; None when the sink sets no guard)."""
    cfg = table.cfg
    guard = cfg.correction_guard
    if guard.max_share is None:
        return None
    change = Change(inserted, retracted, shard_rows(table), _rewritten(table))
    rewrites = (
        f" and rewrites all {change.rewritten:,} update rows into the sink file's schema" if change.rewritten else ""
    )
    numbers = (
        f"it inserts {inserted:,} and retracts {retracted:,} of the shard's {change.shard_rows:,} rows{rewrites} "
        f"({change.share:.1%}; correction_guard.max_share {guard.max_share:.1%}, min_rows {guard.min_rows:,})"
    )
    if stops(cfg, change):
        return (
            f"the correction guard would STOP this batch before its append: {numbers}; if intended, approve the "
            f"run's batch (`python -m reconcile approve {cfg.name} BATCH`), else fix the source"
        )
    return f"the correction guard would let this batch through: {numbers}"


def _rewritten(table: ShardTable) -> int:
    """The update rows the next batch rewrites into the sink file's new schema (0: none)."""
    if not table.exists():
        return 0
    plan = table.schema_plan()
    applies = plan.rewrites and plan.supported and "foreign" not in plan.notes
    return (plan.rows or 0) if applies else 0


def check(
    table: ShardTable, batch_id: str, lower: int, upper: int, manifest: Manifest, approved: str | None
) -> Change | None:
    """Raise :class:`CorrectionBlocked` when the staged batch changes more than the guard
    allows and nobody approved it; returns what was measured (None when the guard is off)."""
    cfg = table.cfg
    measured = measure(table, manifest)
    if measured is None or approved or not stops(cfg, measured):
        return measured
    raise CorrectionBlocked(
        f"{describe(cfg, batch_id, lower, upper, measured)}; nothing was committed",
        sink=cfg.name,
        remedy=f"if the change is intended, approve it: `python -m reconcile approve {cfg.name} {batch_id}`; "
        "if the source is wrong, fix it: the next run recomputes the batch.",
    )

"""The correction guard: a batch that would change too much of the shard stops before append.

An empty or truncated upstream makes the correction retract the whole shard, and the sink would
faithfully commit it. A sink with ``correction_guard.max_share`` (say 0.2) refuses to append a
batch that inserts or retracts more than that share of the shard's rows, once the shard holds
``min_rows``: nothing is committed, the append fails with the numbers and the two ways on.

- Approve the batch (``python -m reconcile approve SINK BATCH``, or the run's
  ``approve_correction`` param), then append it (the failed task's remedy ends with the
  commands that rerun the run's ``append``).
- Or fix the source: the next run's mint supersedes the blocked batch and computes it anew.

The batch's inserted and retracted rows come from its manifest (per partition: the sum of
``|diff|`` and of ``diff``); the shard's rows are the sum of ``_diff`` over the Delta table's
current files, read with delta-rs (one column, no JVM). Checked only when the guard is set.
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

    @property
    def share(self) -> float:
        return max(self.inserted, self.retracted) / max(self.shard_rows, 1)


def shard_rows(table: ShardTable) -> int:
    """The shard's rows now (error rows included): the sum of ``_diff`` over its current files."""
    import pyarrow.compute as pc

    if not table.exists():
        return 0
    return int(pc.sum(table.row_diffs()).as_py() or 0)


def check(
    table: ShardTable, batch_id: str, lower: int, upper: int, manifest: Manifest, approved: str | None
) -> Change | None:
    """Raise :class:`CorrectionBlocked` when the staged batch changes more than the guard
    allows and nobody approved it; returns what was measured (None when the guard is off)."""
    cfg = table.cfg
    guard = cfg.correction_guard
    if guard.max_share is None:
        return None
    change = manifest.change()
    if change is None:
        return None
    measured = Change(*change, shard_rows(table))
    if approved or measured.shard_rows < guard.min_rows or measured.share <= guard.max_share:
        return measured
    raise CorrectionBlocked(
        f"correction guard: batch {batch_id} [{iso(lower)}, {iso(upper)}) would insert {measured.inserted:,} and retract "
        f"{measured.retracted:,} of the shard's {measured.shard_rows:,} rows ({measured.share:.1%}, more than "
        f"correction_guard.max_share {guard.max_share:.1%}); nothing was committed",
        sink=cfg.name,
        remedy=f"if the change is intended, approve it: `python -m reconcile approve {cfg.name} {batch_id}`; "
        "if the source is wrong, fix it: the next run recomputes the batch.",
    )

"""The ``mint`` stage: one batch description ``(lower, upper)`` per DAG run.

### Rules (after Materialize's ``maybe_mint_batch_description``)

- ``lower = max(shard upper, sink as_of)`` (:func:`next_lower`): a new shard starts at the
  sink's ``as_of``.
- ``upper`` = the desired frontier: the run's data-interval end, or, for a run without an
  interval, its start time (milliseconds since the epoch; :mod:`reconcile.schedule`).
- Nothing is minted when the shard or the run is read-only, or when the desired frontier is not
  ahead of ``lower`` (the interval is already covered): the run succeeds and says why.
- A retried mint of the same run returns the run's existing description while the shard's upper
  has not moved. Any other open description with a ``lower`` at or below the new one is
  superseded (its staged files are deleted by the next append's garbage collection).

### Concurrent mints

:func:`decide` applies the rules; :meth:`Ledger.mint` runs it and writes its decision in
one transaction that first locks the shard's row (``SELECT ... FOR UPDATE`` on PostgreSQL,
``BEGIN IMMEDIATE`` on SQLite, which takes the database's write lock before the first read).
So mints of one shard decide one after another: each reads the shard's row and its open
descriptions only once the previous mint committed (PostgreSQL's READ COMMITTED gives every
statement after the lock a fresh snapshot; SQLite has one writer at a time), and sees that
mint's description among the open ones, re-uses it (the same run) or supersedes it. Of any
number of concurrent mints exactly one description per ``lower`` is left open. The row is
created before, by an ``INSERT ... ON CONFLICT DO NOTHING`` (concurrent first mints share it).

Minting only touches the ledger: no Spark, no Delta; except that a mint that finds no shard row
while the shard's Delta table has commits (the ledger was lost) first rebuilds it from the Delta
log (:func:`reconcile.sink.sync.rebuild_lost_ledger`: the log's commit files, no JVM), so its
batch starts where the table ends.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from reconcile.config import SinkConfig
from reconcile.log import event, iso
from reconcile.model import BatchDescription
from reconcile.sink.sync import rebuild_lost_ledger
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch, Shard

log = logging.getLogger(__name__)


@dataclass
class MintResult:
    description: BatchDescription | None
    message: str


@dataclass(frozen=True)
class Decision:
    """What one mint does, decided from the shard's row and its open descriptions: add ``new``
    (superseding the open descriptions ``supersede``, with the message ``superseded_why``),
    re-use the run's description ``reused``, or mint nothing; ``why`` says which."""

    why: str
    new: BatchDescription | None = None
    reused: BatchDescription | None = None
    supersede: tuple[str, ...] = ()
    superseded_why: str = ""

    @property
    def description(self) -> BatchDescription | None:
        return self.new or self.reused


def next_lower(shard: Shard) -> int:
    """The ``lower`` of the shard's next batch: where the shard ends, or, for a new shard, the
    sink's ``as_of``."""
    return max(shard.upper, shard.as_of)


def decide(
    shard: Shard, open_batches: list[Batch], run_id: str, attempt: int, frontier: int, read_only: bool
) -> Decision:
    """The rules (see the module's docstring), applied to the shard's row and its open (minted
    or staged) descriptions as the ledger holds them under the shard's lock."""
    lower = next_lower(shard)
    if read_only or shard.read_only:
        return Decision(
            f"read-only: minted nothing (shard upper={iso(shard.upper)}, desired "
            f"frontier={iso(frontier)}); turn read-only off to resume writing"
        )
    if frontier <= lower:
        return Decision(
            f"nothing to do: desired frontier {iso(frontier)} is not ahead of lower "
            f"{iso(lower)} (shard upper={iso(shard.upper)}); this interval is already covered"
        )
    mine = next((b for b in open_batches if b.run_id == run_id and b.lower == lower), None)
    if mine is not None and mine.upper == frontier:
        return Decision(
            f"re-using this run's batch {mine.batch_id} [{iso(mine.lower)}, {iso(mine.upper)}): "
            "the shard's upper has not moved",
            reused=BatchDescription.of(mine),
        )
    batch_id = f"{lower}-{uuid.uuid4().hex[:16]}"
    older = tuple(b.batch_id for b in open_batches if b.lower <= lower)
    return Decision(
        f"minted batch {batch_id} [{iso(lower)}, {iso(frontier)})"
        + (f", superseding {len(older)} older description(s)" if older else ""),
        new=BatchDescription(shard.name, batch_id, lower, frontier, run_id, attempt),
        supersede=older,
        superseded_why=f"superseded by batch {batch_id} of run {run_id}",
    )


def maybe_mint(
    ledger: Ledger,
    name: str,
    as_of: int,
    run_id: str,
    attempt: int,
    frontier: int,
    *,
    read_only: bool = False,
) -> tuple[BatchDescription | None, str]:
    """Mint ``(lower, upper)`` for a run, or return (None, why nothing was minted); the shard's
    row is created first if it has none (a new shard starts at ``as_of``)."""
    ledger.ensure_shard(name, as_of)
    decision = ledger.mint(name, lambda shard, open_: decide(shard, open_, run_id, attempt, frontier, read_only))
    return decision.description, decision.why


def run_mint(
    ledger: Ledger,
    cfg: SinkConfig,
    run_id: str,
    attempt: int,
    frontier: int,
    *,
    read_only: bool = False,
) -> MintResult:
    rebuild_lost_ledger(ledger, ShardTable(cfg), cfg.as_of)
    desc, why = maybe_mint(ledger, cfg.name, cfg.as_of, run_id, attempt, frontier, read_only=read_only or cfg.read_only)
    shard = ledger.get_shard(cfg.name)
    line = event(
        log,
        why,
        sink=cfg.name,
        run=run_id,
        attempt=attempt,
        desired_frontier=frontier,
        shard_upper=shard.upper,
        since=shard.since,
        as_of=cfg.as_of,
        lower=desc.lower if desc else None,
        upper=desc.upper if desc else None,
        batch=desc.batch_id if desc else None,
    )
    return MintResult(desc, line)

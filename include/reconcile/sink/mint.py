"""The ``mint`` stage: one batch description ``(lower, upper)`` per DAG run.

### Rules (DESIGN section 3; seed 002 ``maybe_mint_batch_description``)

- ``lower = max(shard upper, sink as_of)``: a new shard starts at the sink's ``as_of``.
- ``upper`` = the desired frontier: the run's data-interval end, or, for a run without an
  interval, its start time (milliseconds since the epoch; :mod:`reconcile.schedule`).
- Nothing is minted when the shard or the run is read-only, or when the desired frontier is not
  ahead of ``lower`` (the interval is already covered): the run succeeds and says why.
- A retried mint of the same run returns the run's existing description while the shard's upper
  has not moved. Any other open description with a ``lower`` at or below the new one is
  superseded (its staged files are deleted by the next append's garbage collection).

Minting only touches the metadata table: no Spark, no Delta; except that a mint that finds no
shard row while the shard's Delta table has commits (the metadata database was lost) first
rebuilds the row from the Delta log (``sync``: the log's commit files, no JVM), so its batch
starts where the table ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from reconcile.config import SinkConfig
from reconcile.log import event
from reconcile.model import BatchDescription
from reconcile.sink.sync import sync
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import MetadataStore

log = logging.getLogger("reconcile.mint")


@dataclass
class MintResult:
    description: BatchDescription | None
    message: str


def run_mint(
    store: MetadataStore,
    cfg: SinkConfig,
    run_id: str,
    attempt: int,
    frontier: int,
    *,
    read_only: bool = False,
) -> MintResult:
    table = ShardTable(cfg)
    if not store.has_shard(cfg.name) and table.exists():  # a lost metadata database: rebuild the row
        if store.create_shard(cfg.name, cfg.as_of):
            shard = sync(store, table)
            event(log, "rebuilt the shard's metadata from the Delta log", sink=cfg.name, upper=shard.upper)
    desc, why = store.mint(cfg.name, cfg.as_of, run_id, attempt, frontier, read_only=read_only or cfg.read_only)
    shard = store.get_shard(cfg.name)
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

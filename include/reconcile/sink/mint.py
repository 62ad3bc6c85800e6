"""The ``mint`` stage: one batch description ``(lower, upper)`` per DAG run.

### Rules (DESIGN section 3; seed 002 ``maybe_mint_batch_description``)

- ``lower = max(shard upper, sink as_of)``: a new shard starts at the sink's ``as_of``.
- ``upper`` = the desired frontier: the run's data-interval end, or, for a run without an
  interval, its start time (milliseconds since the epoch).
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
from datetime import UTC, datetime

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


def to_millis(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def desired_frontier(data_interval_end: datetime | None, start: datetime | None) -> int:
    """The run's desired frontier: its data-interval end, else its start time."""
    moment = data_interval_end or start
    if moment is None:
        raise ValueError("a run needs a data interval end or a start time to mint a batch")
    return to_millis(moment)


CRON_OF_PRESET = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
}


def next_scheduled_frontier(schedule: str | None, catchup: bool, lower: int, now: int) -> int | None:
    """The upper the sink's next scheduled run would mint (its data-interval end: Airflow 3
    triggers a cron schedule at each tick, UTC), or None without a recurring schedule. With
    catchup the next run is the first tick after ``lower``; without it, the latest tick that
    has passed (if the shard is behind it), else the next tick to come."""
    from croniter import croniter

    cron = CRON_OF_PRESET.get(schedule or "", schedule)
    if not cron or cron.startswith("@"):
        return None
    after = datetime.fromtimestamp(lower / 1000, UTC)
    first = to_millis(croniter(cron, after).get_next(datetime))
    if catchup or first > now:
        return first
    latest = to_millis(croniter(cron, datetime.fromtimestamp(now / 1000, UTC)).get_prev(datetime))
    return latest if latest > lower else first


def schedule_period_ms(schedule: str | None) -> int | None:
    """The time between two runs of a recurring schedule (its first two ticks after the epoch
    year 2026), or None."""
    from croniter import croniter

    cron = CRON_OF_PRESET.get(schedule or "", schedule)
    if not cron or cron.startswith("@"):
        return None
    it = croniter(cron, datetime(2026, 1, 1, tzinfo=UTC))
    first = it.get_next(datetime)
    return to_millis(it.get_next(datetime)) - to_millis(first)


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

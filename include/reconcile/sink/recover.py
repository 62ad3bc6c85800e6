"""Rebuild a shard's metadata from its Delta log (``python -m reconcile recover SINK``).

The Delta log is the source of truth and the ledger follows it: every batch commit carries its
description (``userMetadata``: batch id, lower, upper, run, rows, the upsert feed's offset) and
every compaction its ``since``. So the ledger can always be rebuilt from the log:

- **lost** (no shard row: the database file was deleted, the schema dropped): the row is
  created from the sink's config and every batch commit in the log is absorbed, as the next
  run's mint would do by itself; ``since`` comes from the log's last compaction.
- **behind** (restored from an older backup): rolled forward like any sync; open descriptions
  that were committed meanwhile become committed, the others superseded.
- **ahead** (the Delta table was restored from an older copy: the ledger records batch commits
  the log no longer holds): every stage refuses to write (:func:`reconcile.sink.sync.sync`
  raises :class:`~reconcile.errors.MetadataAheadOfLog`); ``recover --force`` resets the ledger
  to the log, marking the batches the log lost as superseded (their reason kept), and the next
  run recomputes the shard from the log's upper on. Without ``--force`` it refuses, naming the
  batches it would drop.

``read_only`` set with ``python -m reconcile read-only`` lives only in the ledger: a rebuilt row
takes the sink config's ``read_only``. Stop the sink's runs while recovering.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from reconcile.config import SinkConfig
from reconcile.errors import SinkError
from reconcile.log import event, iso
from reconcile.model import COMMITTED, CommitRecord, Outcome
from reconcile.sink.current import maintain
from reconcile.sink.mint import next_lower
from reconcile.sink.sync import compacted_since, rebuild_lost_ledger, sync
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Shard

log = logging.getLogger(__name__)


@dataclass
class RecoverResult:
    outcome: Outcome  # REBUILT | ROLLED_FORWARD | IN_SYNC | RESET
    message: str
    shard: Shard
    lost: dict[str, str] = field(default_factory=dict)  # batch id: why, of the batches a reset dropped


@dataclass
class LogState:
    """What the Delta log says the ledger should hold."""

    first: int  # the first version whose commit file is still there (-1: no table)
    latest: int  # the last version (-1: no table)
    commits: list[CommitRecord]
    since: int


def read_log(table: ShardTable) -> LogState:
    versions = table.log_versions()
    if not versions:
        return LogState(-1, -1, [], 0)
    latest, entries = table.history_since(-1)
    since = compacted_since(entries, truncated=versions[0] > 0) or 0
    return LogState(versions[0], latest, batch_commits(entries), since)


def lost_batches(ledger: Ledger, cfg: SinkConfig, state: LogState) -> dict[str, str]:
    """The ledger's committed batches that the log does not hold at the version the ledger
    recorded (id: why). A version below the log's first commit file was removed by Delta's
    log cleanup (it is older than a checkpoint), not lost."""
    in_log = {c.batch_id: c.version for c in state.commits}
    out = {}
    for b in ledger.batches(cfg.name, (COMMITTED,)):
        v = b.delta_version
        if v is None or in_log.get(b.batch_id) == v or (b.batch_id not in in_log and 0 <= v < state.first):
            continue
        out[b.batch_id] = (
            f"lost: committed [{iso(b.lower)}, {iso(b.upper)}) at Delta version {v}, which the Delta log no "
            "longer holds (the table was restored from an older copy); `recover --force` reset the metadata to the log"
        )
    return out


def run_recover(ledger: Ledger, cfg: SinkConfig, *, force: bool = False) -> RecoverResult:
    """Make the shard's metadata agree with its Delta log (see the module's docstring)."""
    table = ShardTable(cfg)
    if not ledger.has_shard(cfg.name) and not table.exists():
        raise SinkError(
            f"nothing to recover: no shard row in the metadata and no Delta table at {table.path}",
            sink=cfg.name,
            remedy="check the sink's name and RECONCILE_WAREHOUSE; a sink that never ran needs no recovery.",
        )
    committed_before = len(ledger.batches(cfg.name, (COMMITTED,)))
    created = rebuild_lost_ledger(ledger, table, cfg.as_of, read_only=cfg.read_only) is not None
    before = ledger.get_shard(cfg.name)
    state = read_log(table)
    lost = lost_batches(ledger, cfg, state)
    if lost and not force:
        lowers = sorted(ledger.get_batch(b, cfg.name).lower for b in lost)
        commits = state.commits
        ends = f"upper={iso(commits[-1].upper)} at version {state.latest}" if commits else "no batch committed"
        raise SinkError(
            f"the metadata records {len(lost)} committed batch(es) (lowers {iso(lowers[0])} .. {iso(lowers[-1])}, "
            f"upper={iso(before.upper)}) that the Delta log no longer holds (it ends with {ends}): resetting the "
            "metadata to the log drops them from the ledger; nothing was changed",
            sink=cfg.name,
            remedy=f"put the newer Delta table back if it still exists; otherwise stop the sink's runs and run "
            f"`python -m reconcile recover {cfg.name} --force` (the next run recomputes what they held).",
        )
    if lost or state.latest < before.delta_version:
        shard = ledger.reset_to_log(cfg.name, state.commits, state.since, state.latest, lost)
        outcome = Outcome.RESET
    else:
        shard = sync(ledger, table) if state.latest >= 0 else before
        outcome = (
            Outcome.REBUILT
            if created
            else Outcome.ROLLED_FORWARD
            if shard.delta_version != before.delta_version
            else Outcome.IN_SYNC
        )
    absorbed = len(ledger.batches(cfg.name, (COMMITTED,))) - committed_before + len(lost)
    what = {
        "rebuilt": "rebuilt the lost shard row from the Delta log",
        "rolled_forward": "rolled the metadata forward to the Delta log",
        "in_sync": "the metadata already agrees with the Delta log",
        "reset": "reset the metadata to the Delta log",
    }[outcome]
    notes = []
    if outcome == Outcome.RESET and lost:
        notes.append(
            f"marked {len(lost)} batch(es) the log no longer holds as superseded; the next run recomputes the shard "
            f"from {iso(next_lower(shard))} on"
        )
    if created:
        notes.append(
            f"read_only={shard.read_only} (the sink config's: a switch set with `read-only on` lived only in the lost "
            f"database; set it again if the sink was read-only)"
        )
    current = maintain(ledger, cfg, table) if state.latest >= 0 else None
    if current is not None and current.outcome != Outcome.UP_TO_DATE:
        notes.append(f"the current-state table {current.outcome} to shard version {current.shard_version}")
    line = event(
        log,
        f"{what}: {len(state.commits)} batch commit(s) in the log, {max(absorbed, 0)} absorbed now"
        + "".join(f"; {n}" for n in notes),
        sink=cfg.name,
        upper=shard.upper,
        since=shard.since,
        delta_version=shard.delta_version,
        read_only=shard.read_only,
    )
    return RecoverResult(outcome, line, shard, lost)

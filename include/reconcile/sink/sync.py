"""Roll the ledger forward to the Delta log, and delete staged files that can never be appended.

Every stage syncs first: the Delta log is the linearization point and the source of truth; the
ledger follows it. For each batch commit found after the last version the ledger absorbed
(commit metadata ``{"reconcile": {"op": "batch", ...}}``), :meth:`Ledger.absorb_commit`
compare-and-sets ``upper`` from the batch's ``lower`` to its ``upper`` and marks the batch
committed. This repairs a crash between the Delta commit and the ledger update, whoever comes
next; it also rebuilds a lost ledger (:func:`rebuild_lost_ledger` creates its row first), or
rolls one restored from an older backup forward (and raises ``since`` to the log's compactions).

The log must hold what the ledger absorbed: the ledger's last committed batch must still be the
commit at its Delta version (one index lookup and one small file read per sync). A ledger ahead
of the log (the Delta table restored from an older copy) is refused with
:class:`~reconcile.errors.MetadataAheadOfLog` before anything is written: the next batch's
``lower`` would not be where the table ends. ``python -m reconcile recover`` resets it.

Files that can never become table files are deleted here, as Materialize's persist sink deletes
a batch's blobs once it can never be appended: staged batch attempts (:func:`stale_staged`) and
compactions' rewrites (:func:`stale_compactions`). A compaction's directory is named after the
Delta version ``r`` it read and is committed as version ``r + 1`` or never: while the log ends at
``r`` it may still commit (a compaction in flight, here or in another process, is never touched);
once version ``r + 1`` is another commit, it never will.
"""

from __future__ import annotations

import logging

from reconcile.errors import MetadataAheadOfLog, SinkError
from reconcile.log import event, iso
from reconcile.model import COMMITTED
from reconcile.storage import files
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.layout import COMPACTIONS_DIR, parse_compaction_dir
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch, Shard

log = logging.getLogger(__name__)


def sync(ledger: Ledger, table: ShardTable) -> Shard:
    """Roll the metadata forward to every batch commit in the Delta log it has not absorbed."""
    name = table.name
    shard = ledger.get_shard(name)
    last = ledger.previous_committed(name, shard.upper)  # read before the log is listed
    if not table.exists():
        check_log_holds_ledger(table, shard, last, None)
        return shard
    latest, entries = table.history_since(shard.delta_version)
    check_log_holds_ledger(table, shard, last, latest)
    commits = batch_commits(entries)
    # A new row (the ledger database was lost) for a log whose first commit files Delta's
    # log cleanup removed: the history starts at the first batch still there.
    truncated = shard.delta_version < 0 and bool(entries) and entries[0][0] > 0
    if truncated and not commits:
        refuse_truncated(table, entries[0][0])
    for rec in commits:
        if ledger.absorb_commit(name, rec):
            event(log, "rolled metadata forward to a Delta batch commit", sink=name, **rec.summary())
    since = compacted_since(entries, truncated)
    if since is not None and ledger.absorb_since(name, since):
        event(log, "raised since to the Delta log's last compaction", sink=name, since=since)
    if entries:
        ledger.note_delta_version(name, latest)
    return ledger.get_shard(name)


def rebuild_lost_ledger(ledger: Ledger, table: ShardTable, as_of: int, *, read_only: bool = False) -> Shard | None:
    """The one place a lost ledger is rebuilt (by mint, ``check`` and ``recover``): a shard with
    a Delta table but no ledger row (its database was lost, or its tables dropped) gets its row
    again (``as_of``: the sink config's; ``read_only``: the row's switch) and is rolled forward
    to every batch commit of the log (:func:`sync`). Returns the rebuilt shard; None if it has a row, no
    table yet (a new sink), or a concurrent stage created the row first (that stage rebuilds it)."""
    if ledger.has_shard(table.name) or not table.exists():
        return None
    if not ledger.create_shard(table.name, as_of, read_only=read_only):
        return None
    shard = sync(ledger, table)
    event(log, "rebuilt the shard's metadata from the Delta log", sink=table.name, upper=shard.upper)
    return shard


def compacted_since(entries: list[tuple[int, dict | None]], truncated: bool = False) -> int | None:
    """The highest ``since`` the log's compaction commits record (None without one). Of a log
    whose first commit files were cleaned up (``truncated``) a compaction may be gone: reads
    are then promised exact only from the first batch still there on (a narrower promise)."""
    found = [int(m["since"]) for _, m in entries if m and m.get("op") == "compact" and m.get("since") is not None]
    if truncated:
        found += [c.lower for c in batch_commits(entries)[:1]]
    return max(found, default=None)


def refuse_truncated(table: ShardTable, first: int) -> None:
    """A lost ledger cannot be rebuilt from a log that no longer says where the shard ends."""
    txn = table.last_txn_version()
    if txn is None:  # the sink never committed a batch to this table
        return
    raise SinkError(
        f"cannot rebuild the shard's metadata from the Delta log: its commit files before version {first} were "
        f"cleaned up (delta.logRetentionDuration) and none of those left holds a batch of the sink, so where the "
        f"shard ends is unknown (its last committed lower is {iso(txn)})",
        sink=table.name,
        remedy=f"restore the ledger database from a backup, then run `python -m reconcile recover {table.name}` "
        "(it rolls the backup forward to the log).",
    )


def check_log_holds_ledger(table: ShardTable, shard: Shard, last: Batch | None, latest: int | None) -> None:
    """Refuse a ledger ahead of the Delta log (``latest``: the log's last version, None without
    a table): the log must reach every version the ledger absorbed, and the version of the
    ledger's last committed batch (``last``) must still be that batch's commit (a commit file
    Delta's log cleanup removed is older than the log's checkpoint: the log is past it)."""
    if latest is None:
        ahead = last is not None or shard.delta_version >= 0
    else:
        ahead = latest < shard.delta_version
    held = None
    if not ahead and latest is not None and last is not None and last.delta_version is not None:
        if last.delta_version > latest:
            ahead = True
        else:
            found, meta = table.version_description(last.delta_version)
            m = meta or {}
            held = f"batch {m.get('batch_id')}" if m.get("op") == "batch" else m.get("op") or "a foreign commit"
            ahead = found and held != f"batch {last.batch_id}"
    if ahead:
        raise ahead_of_log(table, shard, last, latest, held)


def ahead_of_log(
    table: ShardTable, shard: Shard, last: Batch | None, latest: int | None, held: str | None = None
) -> MetadataAheadOfLog:
    """The one-line error for a ledger ahead of its Delta log, with the log's actual end."""
    if latest is None:
        end = f"the Delta table at {table.path} has no commits"
        log_upper = None
    else:
        commits = batch_commits(table.history_since(-1)[1])
        log_upper = commits[-1].upper if commits else None
        end = f"the Delta log ends at version {latest} with " + (
            f"upper={iso(log_upper)} (batch {commits[-1].batch_id})" if commits else "no batch committed"
        )
    said = f"upper={iso(shard.upper)}"
    if last is not None:
        said += f" (batch {last.batch_id} committed at Delta version {last.delta_version})"
    else:
        said += f" (Delta versions absorbed up to {shard.delta_version})"
    if held is not None and last is not None:
        end += f"; its version {last.delta_version} is {held}"
    redo = f"from {iso(log_upper)} on" if log_upper is not None else "from the sink's as_of on"
    return MetadataAheadOfLog(
        f"the metadata says {said} but {end}: the Delta table was restored from an older copy or replaced; "
        "nothing was written",
        sink=table.name,
        remedy=f"put the newer Delta table back if it still exists; otherwise stop the sink's runs and run "
        f"`python -m reconcile recover {table.name} --force`: it resets the metadata to the Delta log, and the next "
        f"run recomputes the shard {redo}.",
    )


def stale_staged(ledger: Ledger, table: ShardTable) -> list[str]:
    """Staged directories that can never become part of the table (``<batch>`` or
    ``<batch>/<stage>``), as of the synced ledger.

    Staged files are table files once committed, and an append in flight commits the attempt
    the ledger named when it looked: so only a batch whose ``lower`` the shard's upper has
    passed loses files (no batch with that lower can ever be committed again: Delta's guard
    records a version at or above it), and of a committed batch only the attempts other than
    the committed one. A directory of a batch the ledger does not know is left alone."""
    shard = ledger.get_shard(table.name)
    known = {b.batch_id: b for b in ledger.batches(table.name)}
    out = []
    for batch_id, stages in table.staged_dirs().items():  # one listing of the staging area
        b = known.get(batch_id)
        if b is None or b.lower >= shard.upper:
            continue
        if b.state != COMMITTED:
            out.append(batch_id)
        elif b.stage_id:  # a committed batch without its attempt recorded keeps every directory
            out += [f"{batch_id}/{s}" for s in stages if s != b.stage_id]
    return out


def stale_compactions(table: ShardTable) -> list[str]:
    """Compactions' directories whose files are no table files and never will be: a compaction
    that lost its race or died before its commit (version ``r + 1`` is another commit), and a
    committed one whose files later compactions removed and vacuum deleted (nothing left). A
    committed compaction's files stay until vacuum deletes them (readers of older versions may
    still need them); a directory of any other name is left alone."""
    dirs = table.compaction_dirs()  # listed before the log: a commit after this is seen below
    if not dirs:
        return []
    latest = table.latest_version()
    prefix = f"{COMPACTIONS_DIR}/"
    referenced = {f[len(prefix) :].split("/", 1)[0] for f in table.snapshot_files() if f.startswith(prefix)}
    out = []
    for name in dirs:
        parsed = parse_compaction_dir(name)
        if parsed is None or name in referenced or parsed[0] >= latest:  # in the table, or may still commit
            continue
        read_version, token = parsed
        found, meta = table.version_description(read_version + 1)
        m = meta or {}
        committed = not found or (m.get("op") == "compact" and m.get("token") == token)  # not found: too old to tell
        if not committed or not files.list_files(table.compaction_path(name)):
            out.append(name)
    return out


def gc_staged(ledger: Ledger, table: ShardTable) -> list[str]:
    """Delete staged files that can never be appended (as persist's sink deletes a batch's blobs
    once it can never be appended), and compactions' files that can never be committed."""
    gc_compactions(table)
    deleted = stale_staged(ledger, table)
    for rel in deleted:
        files.delete_path(f"{table.staging_root}/{rel}")
    if deleted:
        shard = ledger.get_shard(table.name)
        event(
            log,
            "deleted staged files that can never be appended",
            sink=table.name,
            dirs=",".join(deleted),
            upper=shard.upper,
        )
    return deleted


def gc_compactions(table: ShardTable) -> list[str]:
    """Delete the compactions' directories that hold no table file and never will
    (:func:`stale_compactions`)."""
    deleted = [name for name in stale_compactions(table) if files.delete_path(table.compaction_path(name))]
    if deleted:
        event(log, "deleted compactions' files that can never be committed", sink=table.name, dirs=",".join(deleted))
    return deleted

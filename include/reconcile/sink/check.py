"""Invariant checks of a shard: the ledger agrees with the Delta log, and nothing is left over.

Used by the crash, race and randomized-schedule tests, and by on-call
(``python -m reconcile check SINK``). Each violation is one readable line.

1. Every lower was committed at most once in the Delta log, and committed lowers strictly
   increase, each equal to the previous batch's upper (the first one is at or after as_of).
2. The ledger's committed batches are exactly the Delta log's batch commits (same ids, lowers,
   uppers, versions) once the metadata is synced.
3. The shard's upper equals the last committed batch's upper (or is at most as_of when none).
4. No staged files remain that can never be committed (:func:`reconcile.sink.sync.stale_staged`),
   and every file a batch commit added is on storage (until a compaction removes it).
5. Upsert sinks: as of the last committed ``upper - 1`` each key has at most one value and
   every consolidated count is 1.
6. Every committed batch matches its description: its Delta version added exactly the files of
   the committed write attempt, with the manifest's rows per hash partition (from the log; no
   data read). With a SparkSession (``check --deep``), also the rows themselves: per hash
   partition the manifest's row count and checksum (versions whose files were vacuumed after a
   compaction cannot be read), and the kind's invariants (5).
7. Every Delta version carrying the sink's commit guard (``txnAppId``) is the sink's own batch
   (with ``txnVersion`` = its lower) or compaction: a guarded commit without the batch's
   metadata could never be absorbed, and the shard would stall behind it.
"""

from __future__ import annotations

from reconcile.config import SinkConfig
from reconcile.log import iso
from reconcile.manifest import Manifest
from reconcile.model import COMMITTED
from reconcile.sink.sync import stale_staged
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import MetadataStore


def violations(store: MetadataStore, cfg: SinkConfig, *, synced: bool = True, spark=None) -> list[str]:
    """Every broken invariant, one line each, from the ledger and the Delta log (no JVM); with
    ``spark``, also from the committed rows (checksums, the kind's invariants)."""
    table = ShardTable(cfg)
    out: list[str] = []
    shard = store.get_shard(cfg.name)
    exists = table.exists()
    entries = table.log_entries(-1)[1] if exists else []
    commits = batch_commits([(v, meta) for v, meta, _ in entries])
    lowers = [c.lower for c in commits]
    if len(set(lowers)) != len(lowers):
        out.append(f"a lower was committed twice in the Delta log: {sorted(lowers)}")
    for prev, cur in zip(commits, commits[1:]):
        if cur.lower != prev.upper:
            out.append(f"batch {cur.batch_id} starts at {iso(cur.lower)}, the previous ended at {iso(prev.upper)}")
    if commits and commits[0].lower < shard.as_of:
        out.append(f"first batch lower {commits[0].lower} is before as_of {iso(shard.as_of)}")
    if synced:
        ledger = sorted(
            ((b.batch_id, b.lower, b.upper, b.delta_version) for b in store.batches(cfg.name, (COMMITTED,))),
            key=lambda x: x[1],
        )
        log = [(c.batch_id, c.lower, c.upper, c.version) for c in commits]
        if ledger != log:
            out.append(f"ledger committed batches {ledger} differ from the Delta log's {log}")
        expected_upper = commits[-1].upper if commits else None
        if expected_upper is not None and shard.upper != expected_upper:
            out.append(f"shard upper {iso(shard.upper)} is not the last committed upper {iso(expected_upper)}")
        if expected_upper is None and shard.upper > shard.as_of:
            out.append(f"shard upper {iso(shard.upper)} moved past as_of {iso(shard.as_of)} without a batch")
    for version, meta, txn in entries:
        if txn is None:
            continue
        meta = meta or {}
        op = meta.get("op")
        if op == "batch" and int(meta["lower"]) != txn:
            out.append(
                f"Delta version {version}: batch {meta.get('batch_id')} has txnVersion {txn}, not its lower {meta['lower']}"
            )
        elif op not in ("batch", "compact"):
            out.append(
                f"Delta version {version} carries the sink's commit guard (txnVersion {txn}) but is not "
                f"one of its batches or compactions ({meta}): the metadata can never absorb it"
            )
    out += batch_differences(store, table, entries, spark)
    if commits and spark is not None:
        from reconcile import kinds
        from reconcile.storage import frames

        out += kinds.of(cfg).invariants(frames.read_updates(spark, table), commits[-1].upper - 1)
    if synced:
        stale = stale_staged(store, table)
        if stale:
            out.append(f"staged files remain that can never be committed: {stale[:5]}")
    if exists:
        out += missing_files(table)
    return out


def missing_files(table: ShardTable) -> list[str]:
    """Files the table's current snapshot names that are not on storage."""
    present = set(table.files())
    gone = sorted(p for p in table.snapshot_files() if p not in present)
    return [f"the Delta table names {len(gone)} file(s) that are not on storage: {gone[:3]}"] if gone else []


def described_batches(store: MetadataStore, sink: str, entries: list) -> dict[int, Manifest]:
    """{Delta version: the batch's manifest} of the batch commits among ``entries``: what the
    commit records of it, completed by the ledger's manifest where the commit carries no parts."""
    ledger = {b.batch_id: b.manifest for b in store.batches(sink, (COMMITTED,)) if b.manifest}
    out = {}
    for version, meta, _ in entries:
        if meta and meta.get("op") == "batch":
            found = Manifest.described(meta, ledger.get(meta["batch_id"]))
            if found is not None:
                out[version] = found
    return out


def batch_differences(store: MetadataStore, table: ShardTable, entries: list, spark=None) -> list[str]:
    """Invariant 6: each batch's Delta version against its description (the commit's own
    per-partition counts, files and checksums, else the ledger's manifest)."""
    from reconcile.sink.verify import commit_differences, log_differences

    described = described_batches(store, table.name, entries)
    if not described:
        return []
    out = [line for v, m in sorted(described.items()) for line in log_differences(table, v, m)[:3]]
    if spark is not None:
        out += commit_differences(spark, table, described)[0]
    return out


def verify_checksums(store: MetadataStore, cfg: SinkConfig, spark) -> tuple[list[str], dict[str, int]]:
    """``check --verify``: every committed batch whose ``upper - 1`` is at or after the shard's
    since, against the checksums of the shard as of ``upper - 1`` it recorded when it was
    written (its commit's metadata, else the ledger's manifest), recomputed from the Delta table
    in one Spark job (:func:`reconcile.sink.verify.checksum_differences`). -> (one line per
    partition that differs, counts; ``version``: the Delta version read)."""
    from reconcile.sink.verify import checksum_differences

    table = ShardTable(cfg)
    if not table.exists():
        return [], {"verified": 0, "partitions": 0, "not_verifiable": 0, "before_since": 0, "version": -1}
    latest, entries = table.log_entries(-1)
    described = described_batches(store, cfg.name, entries)
    lines, counts = checksum_differences(spark, table, described, store.get_shard(cfg.name).since, latest)
    return lines, {**counts, "version": latest}

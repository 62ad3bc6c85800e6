"""A batch against its manifest (:class:`reconcile.manifest.Manifest`): the staged files before
the append, the committed Delta version after it (from the log alone, or by reading its rows),
and the checksums of the shard as of each batch's ``upper - 1`` (``check --verify``)."""

from __future__ import annotations

import json

from reconcile.config import SinkConfig
from reconcile.errors import StagedBatchInvalid
from reconcile.manifest import Manifest, ManifestUnreadable
from reconcile.storage import commits, files, layout
from reconcile.storage.delta import ShardTable


def parse_manifest(cfg: SinkConfig, batch_id: str, text: str | None) -> Manifest:
    """The ledger's manifest of a batch (:class:`StagedBatchInvalid` if unreadable)."""
    try:
        return Manifest.from_json(text)
    except ManifestUnreadable:
        raise StagedBatchInvalid(f"batch {batch_id} has no readable manifest in the ledger.", sink=cfg.name) from None


def staged_files(table: ShardTable, batch_id: str, manifest: Manifest) -> tuple[str, dict[str, int]]:
    """(the write attempt's directory, {file: size} the manifest names), after checking that
    exactly those files are there with their sizes and content digests; else
    :class:`StagedBatchInvalid`."""
    sink = table.name
    path = table.staging_path(batch_id, manifest.stage_id)
    if not files.path_exists(path):
        raise StagedBatchInvalid(f"staged batch {batch_id} misses its folder {path}", sink=sink)
    found = files.list_files(path)
    expected = manifest.staged_files()
    missing = sorted(set(expected) - set(found))
    if missing:
        raise StagedBatchInvalid(f"staged batch {batch_id} misses file(s) {missing[:3]} under {path}", sink=sink)
    changed = sorted(k for k, size in expected.items() if found[k] != size)
    unknown = sorted(set(found) - set(expected))
    if changed or unknown:
        raise StagedBatchInvalid(
            f"staged batch {batch_id} does not match its manifest: changed {changed[:3]}, unexpected {unknown[:3]}",
            sink=sink,
        )
    digests = [part.digests or {} for part in manifest.parts.values()]
    if manifest.rewrite is not None:  # the shard rewritten into the sink file's schema (sink/evolve.py)
        digests.append(manifest.rewrite.digests or {})
    for named in digests:
        for rel, want in named.items():
            try:
                got = files.digest(f"{path}/{rel}")
            except FileNotFoundError:
                raise StagedBatchInvalid(f"staged batch {batch_id} misses file {rel} under {path}", sink=sink) from None
            if got != want:
                raise StagedBatchInvalid(
                    f"staged batch {batch_id}: file {rel} under {path} changed after it was staged (content digest)",
                    sink=sink,
                )
    return path, expected


def missing_columns(table: ShardTable, rel: str) -> list[str]:
    """The sink file's columns that one staged file (``rel``: its path relative to the table)
    lacks, from its footer: a batch written before the sink file's schema change."""
    import pyarrow.parquet as pq

    from reconcile.storage import footers

    fs, p = footers.fs_of(f"{table.path}/{rel}")
    with fs.open(p, "rb") as f:
        names = {n.lower() for n in pq.ParquetFile(f).schema_arrow.names}
    return [c.name for c in table.cfg.columns if c.name.lower() not in names]


def differences(
    manifest: Manifest, stats: dict[int, dict], what: str, keys: tuple[str, ...] = ("rows", "checksum")
) -> list[str]:
    """Partitions whose ``keys`` (rows, checksum) differ from the manifest's; ``what`` names one
    (``{p}``: the partition)."""
    out = []
    for p, part in sorted(manifest.parts.items()):
        got = stats.get(p, {"rows": 0, "checksum": "0"})
        want = {k: getattr(part, k) for k in keys}
        if any(got[k] != want[k] for k in keys):
            have, says = ("/".join(str(side[k]) for k in keys) for side in (got, want))
            out.append(f"{what.format(p=p)} has {have} {'/'.join(keys)}, the manifest says {says}")
    for p in sorted(set(stats) - set(manifest.parts))[:3]:
        out.append(f"{what.format(p=p)} has {stats[p]['rows']} rows, the manifest has no such partition")
    return out


def added_by_part(table: ShardTable, version: int) -> tuple[dict[int, dict], list[str]]:
    """Per hash partition, what one Delta version added according to its ``add`` actions (rows
    from their statistics, files by path and size), and the added files outside any partition
    directory; no data file is read."""
    parts: dict[int, dict] = {}
    loose: list[str] = []
    for add in commits.added_files(table.commit_actions(version)):
        p = layout.part_of(add["path"])
        if p is None:
            loose.append(add["path"])
            continue
        got = parts.setdefault(p, {"rows": 0, "files": {}})
        got["rows"] += int(json.loads(add.get("stats") or "{}").get("numRecords", -1))
        got["files"][add["path"]] = int(add["size"])
    return parts, loose


def log_differences(table: ShardTable, version: int, manifest: Manifest) -> list[str]:
    """A batch's Delta version against its description, from the log alone: the version added
    exactly the files of the committed attempt (``files`` per partition, when the description
    names them) with the rows the description records per partition."""
    m = manifest
    what = f"batch {m.batch_id} [{m.lower}, {m.upper}): Delta version {version}"
    parts, loose = added_by_part(table, version)
    rewritten = m.rewrite.files if m.rewrite is not None and m.stage_id is not None else {}
    named_loose = {layout.staged_relative(m.batch_id, m.stage_id or "", rel) for rel in rewritten}
    if set(loose) - named_loose:  # only the shard rewritten into a new schema is outside a partition
        return [f"{what} added file(s) outside the batch's attempt: {sorted(set(loose) - named_loose)[:3]}"]
    if named_loose - set(loose):
        return [f"{what} lacks file(s) of the shard's rewrite: {sorted(named_loose - set(loose))[:3]}"]
    out = differences(m, parts, f"{what}'s partition {{p}}", keys=("rows",))
    for p, want in sorted(m.parts.items()):
        if want.files is None or m.stage_id is None:
            continue
        named = {layout.staged_relative(m.batch_id, m.stage_id, rel): size for rel, size in want.files.items()}
        got = parts.get(p, {}).get("files", {})
        if named != got:
            out.append(
                f"{what}'s partition {p} added {len(got)} file(s) {sorted(got)[:3]}, "
                f"the manifest says {len(named)}: {sorted(named)[:3]}"
            )
    return out


def commit_differences(spark, table: ShardTable, batches: dict[int, Manifest]) -> tuple[list[str], int]:
    """Committed batches checked against their descriptions by reading their rows (Spark):
    ``{Delta version: manifest}`` -> (one line per batch whose Delta version's rows differ from
    its manifest's rows and checksums, versions checked). Versions whose files were vacuumed
    after a compaction cannot be checked."""
    from reconcile.storage import frames

    rekeyed = table.rekeyed_at()  # batches before a schema rewrite hashed the old columns: not checkable
    batches = {v: m for v, m in batches.items() if rekeyed is None or v >= rekeyed}
    stats = frames.committed_stats(spark, table, {v: m.partitioning for v, m in batches.items()})
    out = []
    for v, got in sorted(stats.items()):
        m = batches[v]
        what = f"batch {m.batch_id} [{m.lower}, {m.upper}): Delta version {v}'s partition {{p}}"
        out += differences(m, got, what)[:3]
    return out, len(stats)


def checksum_differences(
    spark, table: ShardTable, batches: dict[int, Manifest], since: int, version: int
) -> tuple[list[str], dict[str, int]]:
    """Each batch's recorded checksums of the shard as of its ``upper - 1`` against the Delta
    table as of ``version`` (``batches``: ``{Delta version: its description}``, up to
    ``version``), in one Spark job (:func:`reconcile.storage.frames.checksums_by_time`), then
    prefix sums per batch upper. -> (one line per partition whose checksum differs, counts:
    ``verified``, ``partitions`` (those with checksums: a partition too large to sum exactly has none),
    ``not_verifiable`` (no checksums recorded, or recorded before a schema rewrite), ``before_since``).
    A difference is a change at or below the batch's ``upper - 1`` that is not the sink's: a
    foreign write, corruption, a bug. Batches with ``upper - 1 < since`` are not readable exactly
    any more (compacted) and are left out."""
    from reconcile.checksums import MOD
    from reconcile.log import iso
    from reconcile.storage import frames

    counts = {"verified": 0, "partitions": 0, "not_verifiable": 0, "before_since": 0}
    todo: list[tuple[int, Manifest]] = []
    rekeyed = table.rekeyed_at()  # a schema rewrite: the batches before it recorded the old columns' hashes
    for v, m in sorted(batches.items()):
        if not any(part.has_checksums for part in m.parts.values()) or (rekeyed is not None and v < rekeyed):
            counts["not_verifiable"] += 1
        elif m.upper - 1 < since:
            counts["before_since"] += 1
        else:
            todo.append((v, m))
    if not todo:
        return [], counts
    sums = frames.checksums_by_time(spark, table, [m.partitioning for _, m in todo], version)
    out: list[str] = []
    for n, times in sums.items():
        running: dict[int, int] = {}
        i = 0
        for v, m in sorted((x for x in todo if x[1].partitioning == n), key=lambda x: x[1].upper):
            upper = m.upper
            while i < len(times) and times[i][0] <= upper - 1:
                for p, value in times[i][1].items():
                    running[p] = (running.get(p, 0) + value) % MOD
                i += 1
            what = f"batch {m.batch_id} [{iso(m.lower)}, {iso(upper)}): Delta version {v}'s partition"
            checked = {p: part for p, part in m.parts.items() if part.has_checksums}
            for p, part in sorted(checked.items()):
                got, recorded = running.get(p, 0), int(part.shard_checksum or "0", 16)
                if got != recorded:
                    out.append(
                        f"{what} {p}: the shard as of {iso(upper - 1)} has checksum {got:016x}, "
                        f"the batch recorded {recorded:016x}"
                    )
                if part.desired_checksum != part.shard_checksum:
                    out.append(
                        f"{what} {p} recorded the desired checksum {part.desired_checksum} but the shard's "
                        f"{part.shard_checksum}"
                    )
            counts["verified"] += 1
            counts["partitions"] += len(checked)
    return out, counts

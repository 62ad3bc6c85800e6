"""A batch against its description: staged or committed rows, per hash partition, against the
manifest's row counts and checksums."""

from __future__ import annotations

from pyspark.sql import SparkSession

from reconcile.config import SinkConfig
from reconcile.storage import delta as storage


def differences(manifest: dict, stats: dict[int, dict], what: str) -> list[str]:
    """Partitions whose rows or checksum differ from the manifest's; ``what`` names one
    (``{p}``: the partition)."""
    out = []
    for p, want in sorted(manifest["parts"].items(), key=lambda kv: int(kv[0])):
        got = stats.get(int(p), {"rows": 0, "checksum": "0"})
        if got["rows"] != want["rows"] or got["checksum"] != want["checksum"]:
            out.append(
                f"{what.format(p=p)} has {got['rows']} rows/checksum {got['checksum']}, "
                f"the manifest says {want['rows']}/{want['checksum']}"
            )
    for p in sorted(set(stats) - {int(p) for p in manifest["parts"]})[:3]:
        out.append(f"{what.format(p=p)} has {stats[p]['rows']} rows, the manifest has no such partition")
    return out


def commit_differences(spark: SparkSession, cfg: SinkConfig, batches: dict[int, dict]) -> tuple[list[str], int]:
    """Committed batches checked against their descriptions: ``{Delta version: manifest}`` ->
    (one line per batch whose Delta version's rows differ from its manifest, versions
    checked). Versions whose files were vacuumed after a compaction cannot be checked."""
    stats = storage.committed_stats(spark, cfg, {v: int(m["partitions"]) for v, m in batches.items()})
    out = []
    for v, got in sorted(stats.items()):
        m = batches[v]
        what = f"batch {m['batch_id']} [{m['lower']}, {m['upper']}): Delta version {v}'s partition {{p}}"
        out += differences(m, got, what)[:3]
    return out, len(stats)

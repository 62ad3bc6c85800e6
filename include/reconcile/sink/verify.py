"""A batch against its description: staged or committed rows, per hash partition, against the
manifest's row counts and checksums."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from reconcile.config import SinkConfig
from reconcile.errors import StagedBatchInvalid
from reconcile.storage import delta as storage


def parse_manifest(cfg: SinkConfig, batch_id: str, text: str | None) -> dict:
    try:
        manifest = json.loads(text or "")
        manifest["parts"].items()
        return manifest
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StagedBatchInvalid(f"batch {batch_id} has no readable manifest in the ledger.", sink=cfg.name) from None


def staged_files(spark: SparkSession, cfg: SinkConfig, batch_id: str, manifest: dict) -> tuple[str, dict[str, int]]:
    """(the write attempt's directory, {file: size} the manifest names), after checking that
    exactly those files are there with their sizes; else :class:`StagedBatchInvalid`."""
    path = storage.staging_path(cfg, batch_id, manifest.get("stage_id"))
    if not storage.path_exists(spark, path):
        raise StagedBatchInvalid(f"staged batch {batch_id} misses its folder {path}", sink=cfg.name)
    files = storage.list_files(spark, path)
    expected: dict[str, int] = {}
    for part in manifest["parts"].values():
        expected.update(part["files"])
    missing = sorted(set(expected) - set(files))
    if missing:
        raise StagedBatchInvalid(f"staged batch {batch_id} misses file(s) {missing[:3]} under {path}", sink=cfg.name)
    changed = sorted(k for k, size in expected.items() if files[k] != size)
    unknown = sorted(set(files) - set(expected))
    if changed or unknown:
        raise StagedBatchInvalid(
            f"staged batch {batch_id} does not match its manifest: changed {changed[:3]}, unexpected {unknown[:3]}",
            sink=cfg.name,
        )
    return path, expected


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

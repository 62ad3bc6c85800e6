"""The control plane runs without a JVM, and the append adopts the staged files as they are.

A batch is staged by the write (Spark, in-process); its append runs in a separate Python
process that must never import pyspark or py4j. The committed Delta version adds exactly the
staged files (nothing is rewritten), and the table reads the same with Spark and with delta-rs,
including timestamps far from the epoch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from helpers import make_sink, model_query, shard_as_of, write_json_rows
from reconcile.sink import mint, write
from reconcile.storage import commits, files, layout
from reconcile.storage.delta import ShardTable

ROOT = Path(__file__).resolve().parents[1]

NO_JVM = """
import sys
from reconcile.cli import main
rc = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "delta"))
if loaded:
    print("JVM modules loaded:", loaded[:5])
    sys.exit(99)
sys.exit(rc)
"""


def cli_without_jvm(sinks: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m reconcile <args>`` in a fresh process that must not load pyspark/py4j."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env["RECONCILE_SINKS_DIR"] = str(sinks)
    proc = subprocess.run([sys.executable, "-c", NO_JVM, *args], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 99, proc.stdout
    return proc


def test_append_commits_the_staged_files_as_they_are_without_a_jvm(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "adopt", partitions=4)
    rows = [{"k": i, "v": f"v{i}"} for i in range(40)]
    write_json_rows(tmp_path / "src", rows)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    b = ledger.get_batch(desc.batch_id)
    before = files.list_files(ShardTable(cfg).path)
    staged = {
        layout.staged_relative(b.batch_id, b.stage_id, rel): size
        for part in json.loads(b.manifest)["parts"].values()
        for rel, size in part["files"].items()
    }
    assert staged and set(staged) <= set(before)

    proc = cli_without_jvm(tmp_path, "append", cfg.name, "--run-id", "run-1")
    assert proc.returncode == 0, proc.stderr
    assert "appended batch" in proc.stdout

    version = ledger.get_batch(desc.batch_id).delta_version
    adds = commits.added_files(ShardTable(cfg).commit_actions(version))
    assert {a["path"]: a["size"] for a in adds} == staged  # exactly the staged files, as they are
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == len(rows)
    after = {f: s for f, s in files.list_files(ShardTable(cfg).path).items() if not f.startswith("_delta_log")}
    assert after == {f: s for f, s in before.items() if not f.startswith("_delta_log")}  # no data file written
    assert ShardTable(cfg).last_txn_version() == desc.lower

    want = model_query(rows, cfg)
    assert shard_as_of(cfg, 199) == want
    assert shard_as_of(cfg, 199) == want

    for command in (["status", cfg.name], ["check", cfg.name]):
        proc = cli_without_jvm(tmp_path, *command)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    assert "0 invariant violation(s)" in proc.stdout


def test_a_second_append_of_a_committed_lower_is_refused_by_the_log(spark, warehouse, tmp_path, sqlite_ledger):
    """The guard lives in the Delta log: committing the same lower again, or an older one, is
    skipped whatever the ledger says."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "guarded")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    write.run_write(spark, ledger, cfg, desc.batch_id)
    assert cli_without_jvm(tmp_path, "append", cfg.name, "--run-id", "run-1").returncode == 0
    b = ledger.get_batch(desc.batch_id)
    files = [
        (a["path"], a["size"], json.loads(a["stats"]))
        for a in commits.added_files(ShardTable(cfg).commit_actions(b.delta_version))
    ]
    latest = ShardTable(cfg).latest_version()
    for lower in (desc.lower, desc.lower - 1):
        assert ShardTable(cfg).commit_files(files, {"batch_id": "again", "lower": lower, "upper": 300}, lower) is None
    assert ShardTable(cfg).latest_version() == latest


def test_timestamps_far_from_the_epoch_read_the_same_everywhere(spark, warehouse, tmp_path, sqlite_ledger):
    """Staged files become table files: their timestamps are the Delta protocol's microseconds
    (not Parquet's INT96), so delta-rs reads what Spark reads, as do the file statistics."""
    ledger = sqlite_ledger
    schema = [
        {"name": "k", "type": "bigint", "nullable": False},
        {"name": "at", "type": "timestamp"},
        {"name": "day", "type": "date"},
        {"name": "amount", "type": "decimal(38,9)"},
    ]
    query = {
        "sources": {"src": {"format": "json", "path": "src"}},
        "sql": "SELECT k, CAST(at AS TIMESTAMP) AS at, CAST(day AS DATE) AS day, CAST(amount AS DECIMAL(38,9)) AS amount FROM src",
    }
    cfg = make_sink(tmp_path, "farts", schema=schema, query=query)
    rows = [
        {
            "k": 1,
            "at": "1600-01-01T00:00:00.000001Z",
            "day": "0001-01-01",
            "amount": "-99999999999999999999999999999.999999999",
        },
        {"k": 2, "at": "9999-12-31T23:59:59.999999Z", "day": "9999-12-31", "amount": "12345678901234567890.123456789"},
        {"k": 3, "at": None, "day": None, "amount": None},
    ]
    write_json_rows(tmp_path / "src", rows)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    write.run_write(spark, ledger, cfg, desc.batch_id)
    assert cli_without_jvm(tmp_path, "append", cfg.name, "--run-id", "run-1").returncode == 0

    def parse(r):
        at = datetime.fromisoformat(r["at"].replace("Z", "+00:00")) if r["at"] else None
        day = datetime.fromisoformat(r["day"]).date() if r["day"] else None
        return (r["k"], at, day, Decimal(r["amount"]) if r["amount"] else None, None)

    want = Counter(parse(r) for r in rows)
    got_rs = Counter(
        (k, at.astimezone(UTC) if at else None, day, amount, err)
        for (k, at, day, amount, err), n in shard_as_of(cfg, 199).items()
        for _ in range(n)
    )
    assert got_rs == want
    got_spark = Counter(
        (k, at.replace(tzinfo=UTC) if at else None, day, amount, err)
        for (k, at, day, amount, err), n in shard_as_of(cfg, 199).items()
        for _ in range(n)
    )
    assert got_spark == want
    # the commit's statistics bound the values (milliseconds, rounded outwards; a bound that
    # does not exist, past year 9999, is left out: readers then do not skip on it)
    version = ledger.get_batch(desc.batch_id).delta_version
    stats = [json.loads(a["stats"]) for a in commits.added_files(ShardTable(cfg).commit_actions(version))]
    bounds = [(s["minValues"]["at"], s["maxValues"]["at"]) for s in stats if "at" in s.get("minValues", {})]
    assert "1600-01-01T00:00:00.000Z" in [lo for lo, _ in bounds]
    assert all(lo <= hi for lo, hi in bounds)
    days = [(s["minValues"]["day"], s["maxValues"]["day"]) for s in stats if "day" in s.get("minValues", {})]
    assert min(lo for lo, _ in days) == "0001-01-01" and max(hi for _, hi in days) == "9999-12-31"

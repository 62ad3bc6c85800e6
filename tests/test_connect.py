"""Spark jobs as clients of a long-lived Spark Connect server (``python -m reconcile spark-server``).

The server is a real one (its own JVM, local[2], started by the sink's command: the
``connect_url`` fixture). The batches below are run by ``python -m reconcile run`` in processes
of their own that hold no JVM (pyspark is classic or Connect per process), committed by the
metadata-only append, and read back with this process's classic session, an independent
reader, against the plain-Python models of the other test modules. Airflow on a
``spark_connect`` connection (write and compact as Connect clients, nothing spark-submitted) is
tests/test_airflow.py's three-intervals test: its ``dag.test()`` runs in a Connect client child.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import (
    CHANGELOG_NEW,
    append_foreign_row,
    changelog_model,
    leftover_staged,
    make_sink,
    model_kv,
    run_stages,
    shard_as_of,
    until,
    write_json_rows,
)
from reconcile import connect_server
from reconcile.sink import append, check, mint, write
from reconcile.sink.sync import gc_staged
from reconcile.storage.delta import ShardTable

ROOT = Path(__file__).resolve().parents[1]


def run_remote(connect_url: str, sinks: Path, sink: str, run_id: str, frontier: int, **env_extra):
    """``python -m reconcile run`` of one batch as a Spark Connect client (no JVM of its own)."""
    env = {**os.environ, "RECONCILE_SINKS_DIR": str(sinks), "RECONCILE_SPARK_REMOTE": connect_url, **env_extra}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    cmd = [sys.executable, "-m", "reconcile", "run", sink, "--frontier", str(frontier), "--run-id", run_id]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def committed_remote(connect_url, sinks, sink, run_id, frontier) -> str:
    proc = run_remote(connect_url, sinks, sink, run_id, frontier)
    assert proc.returncode == 0 and "appended batch" in proc.stdout, proc.stdout[-1500:] + proc.stderr[-1500:]
    assert "py4j" not in proc.stderr
    return proc.stdout


def test_the_server_command_reuses_a_running_server_warms_it_up_and_reports_it(connect_url):
    port = int(connect_url.rsplit(":", 1)[1])
    # a server already listening on the port is reused, not started twice
    assert connect_server.start(port, warm=False) == connect_url
    # the warm-up runs two batches of a throwaway sink through the server
    assert connect_server.warm_up(connect_url) == 2
    out = subprocess.run(
        [sys.executable, "-m", "reconcile", "spark-server", "status", "--port", str(port)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"listening at {connect_url}" in out


def test_query_sink_with_drift_over_connect(spark, connect_url, warehouse, tmp_path, sqlite_ledger):

    cfg = make_sink(tmp_path, "cq")
    runs = [
        (200, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}]),
        (300, [{"k": 1, "v": "A"}, {"k": 2, "v": "b"}, {"k": 3, "v": None}]),
        (400, [{"k": 3, "v": "c"}, {"k": 4, "v": "d"}]),
    ]
    for i, (frontier, rows) in enumerate(runs):
        write_json_rows(tmp_path / "src", rows)
        if i == 2:
            append_foreign_row(spark, cfg, 250)  # drift, written with classic Spark
        out = committed_remote(connect_url, tmp_path, cfg.name, f"run-{i}", frontier)
        assert f"drift_rows={1 if i == 2 else 0}" in out, out
    drift = Counter({(7, "zz", None): 1})  # history keeps the foreign row from 250 until the repair
    for frontier, rows in runs:
        want = model_kv(rows) + (drift if frontier == 300 else Counter())
        assert shard_as_of(cfg, frontier - 1) == want, frontier
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    # the batches written over Connect recorded their checksums: check --verify finds the foreign
    # row at 250 in the shard as of batch 2's upper - 1 (299), and nothing else
    lines, counts = check.verify_checksums(sqlite_ledger, cfg, spark)
    second = sqlite_ledger.batches(cfg.name, ("committed",))[1].batch_id
    assert counts["verified"] == 3 and len(lines) == 1 and f"batch {second} " in lines[0], lines
    assert leftover_staged(sqlite_ledger, cfg) == []


def test_upsert_random_feed_over_connect(spark, connect_url, warehouse, tmp_path, sqlite_ledger):
    from upsert_model import UpsertModel, check_against, cmd, feed_rows, upsert_sink

    rng = random.Random(7)
    cfg = upsert_sink(tmp_path, partitions=3)
    model = UpsertModel()
    feed: list[dict] = []
    off, lower = 0, cfg.as_of
    for run in range(3):
        upper = lower + 100
        for _ in range(15):
            off += 1
            feed.append(cmd(rng.randint(0, 5), rng.choice(["a", "b", None]), rng.randint(lower - 30, upper + 50), off))
        feed_rows(tmp_path, feed)
        committed_remote(connect_url, tmp_path, cfg.name, f"r{run}", upper)
        model.batch(feed, lower, upper)
        check_against(spark, cfg, model, [lower, (lower + upper) // 2, upper - 1])
        lower = upper
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    lines, counts = check.verify_checksums(sqlite_ledger, cfg, spark)
    assert lines == [] and counts["verified"] == 3, (lines, counts)


def test_changelog_sink_over_connect(spark, connect_url, warehouse, tmp_path, sqlite_ledger):

    cfg = make_sink(tmp_path, "clog", kind="changelog")
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        committed_remote(connect_url, tmp_path, cfg.name, f"run-{i}", frontier)
        for t in (frontier - 1, frontier - 50):
            assert shard_as_of(cfg, t) == changelog_model(CHANGELOG_NEW[: i + 1], t), t
    lines, counts = check.verify_checksums(sqlite_ledger, cfg, spark)
    assert lines == [] and counts["verified"] == 3, (lines, counts)


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE reconcile_probe USING parquet LOCATION '{probe}' AS SELECT 1 AS k, 'x' AS v",
        "INSERT OVERWRITE DIRECTORY '{probe}' USING parquet SELECT 1 AS k",
        "SELECT k, v FROM src; INSERT OVERWRITE DIRECTORY '{probe}' USING parquet SELECT 1 AS k",
        "SELECT k, v FROM src) AS q, (SELECT 1",
    ],
)
def test_a_command_in_query_sql_is_refused_before_it_runs(spark, connect_url, warehouse, tmp_path, sqlite_ledger, sql):
    """Over Connect ``spark.sql`` runs a command at once, and no parser is in this process: the
    text must analyse as a subquery first (text that balances the wrapper's parentheses passes
    that check, and then does not parse alone). A one-line error, nothing written anywhere."""
    probe = tmp_path / "probe"
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql.format(probe=probe)}
    cfg = make_sink(tmp_path, "cmd", query=query)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    proc = run_remote(connect_url, tmp_path, cfg.name, "run-1", 200)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search("query.sql (must be one query|does not run)", lines[0]), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not probe.exists()
    assert [b.state for b in sqlite_ledger.batches(cfg.name)] != ["committed"]
    assert not ShardTable(cfg).exists() or ShardTable(cfg).latest_version() == 0  # at most the empty table


def test_queries_in_every_form_pass_over_connect(spark, connect_url, warehouse, tmp_path, sqlite_ledger):
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    for i, sql in enumerate(
        [
            "WITH s AS (SELECT k, v FROM src) SELECT k, v FROM s;",
            "SELECT k, v FROM src -- a trailing comment",
            "SELECT k, v FROM src UNION ALL SELECT k, v FROM src WHERE false",
        ]
    ):
        query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
        cfg = make_sink(tmp_path, f"forms{i}", query=query)
        committed_remote(connect_url, tmp_path, cfg.name, "run-1", 200)
        assert shard_as_of(cfg, 199) == model_kv(rows), sql


def test_killed_client_then_retry(spark, connect_url, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """A client killed after the server staged its files (the server's query is not the
    client's process: it may even finish after the kill). The retry stages its own attempt, the
    batch commits once, and the killed attempt's files are deleted as uncommittable."""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "killed")
    rows0 = [{"k": 1, "v": "a"}]
    write_json_rows(tmp_path / "src", rows0)
    run_stages(spark, sqlite_ledger, cfg, "run-0", 200)
    rows1 = [{"k": 1, "v": "A"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows1)
    desc = mint.run_mint(sqlite_ledger, cfg, "run-1", 1, 300).description
    env = {
        **os.environ,
        "RECONCILE_FAILPOINTS": "write.after_partition_staged=kill",
        "RECONCILE_SPARK_REMOTE": connect_url,
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    job = [sys.executable, str(ROOT / "jobs" / "write_correction.py"), "--sink", cfg.name, "--run-id", "run-1"]
    proc = subprocess.run(job, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 137, proc.stderr[-2000:]
    assert write.run_write(spark, sqlite_ledger, cfg, desc.batch_id).outcome == "staged"
    assert append.run_append(sqlite_ledger, cfg, desc.batch_id).outcome == "committed"
    gc_staged(sqlite_ledger, ShardTable(cfg))
    assert leftover_staged(sqlite_ledger, cfg) == []
    assert shard_as_of(cfg, 199) == model_kv(rows0)
    assert shard_as_of(cfg, 299) == model_kv(rows1)
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


def test_a_server_this_process_started_counts_as_stopped_once_it_exits():
    """``spark-server stop`` waits for the server to exit; a server started by the same process
    (the tests' fixture, an operator's script) is a zombie after it exits, which ``kill(pid, 0)``
    still reaches: the wait reaps it instead of running to its 30 s timeout."""
    from reconcile import connect_server

    child = subprocess.Popen(["sleep", "0.2"])
    until("the child exits", lambda: open(f"/proc/{child.pid}/stat").read().split(")")[1].split()[0] == "Z", every=0.05)
    assert connect_server._alive(child.pid) is False
    assert child.returncode is None  # reaped by _alive, not by Popen
    assert connect_server._alive(os.getpid()) is True

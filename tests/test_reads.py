"""``show``, ``history``, ``diff`` and ``dry-run`` without a JVM: DuckDB over the update log that delta-rs reads
gives the same reports as Spark (``--spark``) on the same shards, for query, changelog and upsert
sinks (error rows, as-of reads, keys, compaction), and both agree with the plain-Python models
of :mod:`test_history` (``helpers.changelog_model``, ``upsert_model.UpsertModel``). A time
inside a batch stamped at its ``upper - 1`` is explained. The commands run as a user runs them
(a new process): with no Java at all, or, where Spark is needed or asked for, with nothing of
Spark's on stdout or stderr.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import AS_OF, make_sink, run_stages, write_json_rows
from history_model import changelog_shard, model_diff, model_versions, numbered_per_key, query_shard, upsert_shard
from reconcile import cli, report
from reconcile.log import iso
from reconcile.sink import history
from reconcile.sink.compact import run_compact

ROOT = Path(__file__).resolve().parents[1]


def same_reports(
    spark, ledger, cfg, rng: random.Random, ok, since: int, upper: int, key: list[str], *, per_key: bool = False
) -> dict:
    """The versions read by DuckDB equal the model's from ``since`` to ``upper`` (numbered per key
    with ``per_key``), every read by DuckDB equals Spark's, and the ok rows equal the model
    ``ok``. Returns the versions report."""
    rep = history.history_report(ledger, cfg, limit=1000)
    want = model_versions(ok, since, upper)
    if per_key:
        assert _versions(rep, ["k", "v", "version"]) == numbered_per_key(want)
    else:
        assert _versions(rep, ["k", "v"]) == want
    for errors in (False, True):
        by_duckdb = history.history_report(ledger, cfg, errors=errors, limit=1000)
        assert by_duckdb == history.history_report(ledger, cfg, spark=spark, errors=errors, limit=1000)
    for _ in range(2):
        t = rng.randrange(since, upper)
        at = history.history_report(ledger, cfg, as_of=t, limit=1000)
        assert at == history.history_report(ledger, cfg, spark=spark, as_of=t, limit=1000)
        assert Counter({tuple(v[c] for c in cfg.column_names): v["count"] for v in at["versions"]}) == ok(t)
        shown = report.shard_contents(ledger, cfg, t, limit=1000)
        assert shown == report.shard_contents(ledger, cfg, t, limit=1000, spark=spark)
        assert Counter({tuple(r[c] for c in cfg.column_names): r["count"] for r in shown["rows"]}) == ok(t)
        errs = report.shard_contents(ledger, cfg, t, errors=True, limit=1000)
        assert errs == report.shard_contents(ledger, cfg, t, errors=True, limit=1000, spark=spark)
        t1, t2 = sorted(rng.sample(range(since, upper), 2))
        for errors in (False, True):
            d = history.diff_report(ledger, cfg, t1, t2, errors=errors, limit=1000)
            assert d == history.diff_report(ledger, cfg, t1, t2, spark=spark, errors=errors, limit=1000)
        ok_changes = history.diff_report(ledger, cfg, t1, t2, limit=1000)["changes"]
        assert Counter({tuple(c[k] for k in cfg.column_names): c["diff"] for c in ok_changes}) == model_diff(ok, t1, t2)
    keyed = history.history_report(ledger, cfg, keys=key, limit=1000)
    assert keyed == history.history_report(ledger, cfg, spark=spark, keys=key, limit=1000)
    assert keyed["versions"], f"--key {key} matches some versions"
    log = report.shard_contents(ledger, cfg, log=True, limit=3)  # truncated, in the same order
    assert log == report.shard_contents(ledger, cfg, log=True, limit=3, spark=spark) and log["truncated"]
    return rep


def _versions(rep: dict, names: list[str]) -> Counter:
    return Counter(
        (*[v[c] for c in names], v["count"], v["valid_from"]["ms"], (v["valid_to"] or {}).get("ms"))
        for v in rep["versions"]
    )


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_query_sink_reads_without_a_jvm_as_spark_does(spark, warehouse, tmp_path, sqlite_ledger):
    rng = random.Random(11)
    cfg, ok, err = query_shard(spark, sqlite_ledger, tmp_path, rng, batches=3)
    upper = AS_OF + 300
    errors = history.history_report(sqlite_ledger, cfg, errors=True, limit=1000)["versions"]
    assert sum(v["count"] for v in errors if v["valid_to"] is None) == err(upper - 1)[("ERR",)]
    same_reports(spark, sqlite_ledger, cfg, rng, ok, AS_OF, upper, ["k=2"])
    since = AS_OF + 150
    run_compact(spark, sqlite_ledger, cfg, since=since, vacuum_files=False)
    assert same_reports(spark, sqlite_ledger, cfg, rng, ok, since, upper, ["v=a"])["note"]


@pytest.mark.slow  # the quick tier keeps the query sink's reads
def test_changelog_sink_reads_without_a_jvm_as_spark_does(spark, warehouse, tmp_path, sqlite_ledger):
    rng = random.Random(12)
    cfg, ok = changelog_shard(spark, sqlite_ledger, tmp_path, rng, batches=3)
    same_reports(spark, sqlite_ledger, cfg, rng, ok, AS_OF, AS_OF + 300, ["k=1"])


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_upsert_sink_reads_per_key_without_a_jvm_as_spark_does(spark, warehouse, tmp_path, sqlite_ledger):
    rng = random.Random(13)
    cfg, ok = upsert_shard(spark, sqlite_ledger, tmp_path, rng, batches=4)
    same_reports(spark, sqlite_ledger, cfg, rng, ok, AS_OF, AS_OF + 400, ["2"], per_key=True)
    errors = history.history_report(sqlite_ledger, cfg, errors=True, limit=1000)
    assert errors["versions"], "the unkeyed command is an error row"


def test_a_time_inside_a_query_batch_before_its_stamp_is_explained(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    """A query batch [200, 300) stamps its result at 299: ``diff --to 250`` (before the stamp)
    shows nothing of it and says why; ``--to 299`` shows it; ``history``/``show --as-of`` say
    the same; a time outside such a gap gets no note."""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "stamped")
    for i, rows in enumerate(([{"k": 1, "v": "a"}], [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])):
        write_json_rows(tmp_path / "src", rows)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", 200 + 100 * i)
    capsys.readouterr()
    assert cli.main(["diff", cfg.name, "--from", "199", "--to", iso(250).split(" ")[0]]) == 0
    out = capsys.readouterr().out
    assert "0 row(s) added" in out
    assert f"note: --to {iso(250)} is inside batch [{iso(200)}, {iso(300)})" in out, out
    assert f"stamped at its upper - 1, {iso(299)}" in out and "count from 299 on" in out
    assert cli.main(["diff", cfg.name, "--from", "199", "--to", "299", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["notes"] == [] and [(c["k"], c["v"], c["diff"]) for c in rep["changes"]] == [(2, "b", 1)]
    assert cli.main(["history", cfg.name, "--as-of", "250"]) == 0
    assert "note: --as-of" in capsys.readouterr().out
    assert cli.main(["show", cfg.name, "--as-of", "1970-01-01T00:00:00.250Z"]) == 0
    out = capsys.readouterr().out
    assert "note: --as-of" in out and "  1  a  1" in out and "  2  b" not in out, out
    assert cli.main(["show", cfg.name]) == 0  # upper - 1: no note
    out = capsys.readouterr().out
    assert "note:" not in out and "  2  b  1" in out, out


@pytest.mark.slow  # test_deletion_vectors keeps the vector reads in the quick tier
def test_a_deletion_vector_is_read_through_delta_rs(spark, warehouse, tmp_path, sqlite_ledger):
    """A table only Delta's own readers read (a deletion vector written behind the sink's back):
    delta-rs scans it for DuckDB, and the reads still equal Spark's."""
    from reconcile.storage.delta import ShardTable

    cfg = make_sink(tmp_path, "dv")
    write_json_rows(tmp_path / "src", [{"k": k, "v": f"v{k}"} for k in range(6)])
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    path = ShardTable(cfg).path
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 3")
    assert ShardTable(cfg).plain_files() is None
    shown = report.shard_contents(sqlite_ledger, cfg, limit=100)
    assert shown == report.shard_contents(sqlite_ledger, cfg, limit=100, spark=spark)
    assert [r["k"] for r in shown["rows"]] == [0, 1, 2, 4, 5]
    assert history.history_report(sqlite_ledger, cfg) == history.history_report(sqlite_ledger, cfg, spark=spark)


# -- as a user runs them -------------------------------------------------------------------------------


def reconcile(env: dict, *args: str, java: bool) -> subprocess.CompletedProcess:
    """``python -m reconcile ARGS`` in a new process; without ``java`` no JVM can start there."""
    env = {**os.environ, **env, "PYTHONPATH": str(ROOT / "include")}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    if not java:
        env["JAVA_HOME"] = "/nonexistent"
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "java").exists())
    return subprocess.run(
        [sys.executable, "-m", "reconcile", *args], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def cli_env(spark, warehouse, tmp_path, sqlite_ledger, sqlite_url):
    cfg = make_sink(tmp_path, "plain", schedule="@daily")
    for i, rows in enumerate(([{"k": 1, "v": "a"}, {"k": None, "v": "x"}], [{"k": 2, "v": "b"}])):
        write_json_rows(tmp_path / "src", rows)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", 200 + 100 * i)
    env = {
        "RECONCILE_SINKS_DIR": str(tmp_path),
        "RECONCILE_WAREHOUSE": str(warehouse),
        "RECONCILE_METADATA_URL": sqlite_url,
        "RECONCILE_HOME": str(tmp_path / "home"),
    }
    env.pop("RECONCILE_SPARK_REMOTE", None)
    return cfg, env


def test_show_history_diff_status_run_without_java(cli_env):
    cfg, env = cli_env
    commands = {
        ("show", cfg.name): "  2  b  1",
        ("show", cfg.name, "--errors", "--as-of", "199"): "column 'k'",
        ("show", cfg.name, "--log"): "299",
        ("history", cfg.name): "current",
        ("diff", cfg.name, "--from", "199", "--to", "1970-01-01T00:00:00.299Z"): "1 row(s) added",
        ("status", cfg.name): "committed",
        ("dry-run", cfg.name, "--frontier", "400"): "computed by DuckDB without a JVM",
    }
    for args, expected in commands.items():
        p = reconcile(env, *args, java=False)
        assert p.returncode == 0 and p.stderr == "", (args, p.stderr)
        assert expected in p.stdout, (args, p.stdout)


@pytest.mark.slow  # three Spark processes of its own (the quick tier's reads run without a JVM)
def test_spark_reads_and_dry_run_keep_spark_quiet(cli_env):
    """``--spark`` (a read, a dry run) starts a JVM whose banner and warnings go to a log file:
    stdout holds the answer, stderr nothing."""
    cfg, env = cli_env
    p = reconcile(env, "history", cfg.name, "--spark", java=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "current" in p.stdout and "WARN" not in p.stdout
    write_json_rows(Path(env["RECONCILE_SINKS_DIR"]) / "src", [{"k": 2, "v": "b"}, {"k": 3, "v": "c"}])
    p = reconcile(env, "dry-run", cfg.name, "--frontier", "1970-01-01T00:00:00.400Z", "--spark", java=True)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert f"batch [{iso(300)}, {iso(400)}) (upper: the given frontier)" in p.stdout, p.stdout
    assert "WARN" not in p.stdout and "log4j" not in p.stdout

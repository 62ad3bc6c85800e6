"""The warehouse on S3 (``RECONCILE_WAREHOUSE=s3://bucket/prefix``) on a real S3 server
(versitygw on 127.0.0.1, harness/s3_server.py): every kind end to end, drift written by a foreign
delta-rs writer repaired, compaction, the checks, the files the stages list and delete; each
checked against an independent model in plain Python (the shard read back with delta-rs).
"""

from __future__ import annotations

from collections import Counter

from helpers import (
    CHANGELOG_NEW,
    arrow_updates,
    changelog_model,
    committed_run,
    make_sink,
    model_query,
    normalize_errors,
    shard_as_of,
    write_json_rows,
)
from reconcile.sink import check, compact
from reconcile.storage import files
from reconcile.storage.delta import ShardTable
from upsert_model import UpsertModel, check_against, cmd, feed_rows, upsert_sink


def _on_s3(cfg, s3_warehouse: str) -> ShardTable:
    table = ShardTable(cfg)
    assert table.path == f"{s3_warehouse}/{cfg.name}" and table.path.startswith("s3://")
    return table


def test_a_query_sink_on_s3_converges_and_checks_clean(spark, s3_warehouse, tmp_path, sqlite_ledger):
    cfg = make_sink(tmp_path, "q")
    table = _on_s3(cfg, s3_warehouse)
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": None, "v": "bad"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, sqlite_ledger, cfg, "r1", 200)
    assert normalize_errors(shard_as_of(cfg, 199), cfg) == model_query(rows, cfg)

    rows = [{"k": 1, "v": "a2"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows)
    b = committed_run(spark, sqlite_ledger, cfg, "r2", 300)
    assert normalize_errors(shard_as_of(cfg, 299), cfg) == model_query(rows, cfg)
    assert normalize_errors(shard_as_of(cfg, 199), cfg) == model_query(
        [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": None, "v": "bad"}], cfg
    )
    # the batch's files were adopted where they were staged: inside the table on S3
    assert any(p.startswith(f"batches/{b.batch_id}/") for p in table.snapshot_files())
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    lines, counts = check.verify_checksums(sqlite_ledger, cfg, spark)
    assert lines == [] and counts["verified"] == 2


def _changelog_on_s3(spark, ledger, tmp_path, s3_warehouse: str, name: str):
    """A changelog sink on S3 that committed every run of ``CHANGELOG_NEW``."""
    cfg = make_sink(tmp_path, name, kind="changelog")
    _on_s3(cfg, s3_warehouse)
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        committed_run(spark, ledger, cfg, f"r{i}", frontier)
    return cfg


def test_a_changelog_sink_on_s3_matches_the_model_at_every_time(spark, s3_warehouse, tmp_path, sqlite_ledger):
    cfg = _changelog_on_s3(spark, sqlite_ledger, tmp_path, s3_warehouse, "cl")
    for t in range(100, 400, 7):
        assert shard_as_of(cfg, t) == changelog_model(CHANGELOG_NEW, t), f"as of {t}"
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


def test_an_upsert_sink_on_s3_matches_the_model(spark, s3_warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path)
    _on_s3(cfg, s3_warehouse)
    model = UpsertModel()
    feed = [cmd(1, "a", 150, 1), cmd(2, "b", 160, 2), cmd(1, "a2", 170, 3)]
    feed_rows(tmp_path, feed)
    committed_run(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    feed += [cmd(2, None, 210, 4), cmd(1, "a3", 220, 5), cmd(3, "c", 130, 6)]  # the last one late
    feed_rows(tmp_path, feed)
    committed_run(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(feed, 200, 300)
    check_against(spark, cfg, model, [150, 170, 199, 200, 210, 220, 299])
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


def test_drift_from_a_foreign_delta_rs_writer_on_s3_is_repaired_and_compaction_keeps_reads(
    spark, s3_warehouse, tmp_path, sqlite_ledger
):
    from deltalake import write_deltalake

    cfg = make_sink(tmp_path, "drift")
    table = _on_s3(cfg, s3_warehouse)
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, sqlite_ledger, cfg, "r1", 200)
    foreign = arrow_updates([{"k": 9, "v": "rogue", "t": 150}])
    write_deltalake(table.path, foreign, mode="append", schema_mode="merge")  # behind the sink's back, on S3
    assert shard_as_of(cfg, 199)[(9, "rogue", None)] == 1

    b = committed_run(spark, sqlite_ledger, cfg, "r2", 300)
    assert b.drift_rows == 1
    assert normalize_errors(shard_as_of(cfg, 299), cfg) == model_query(rows, cfg)  # repaired
    for i, frontier in enumerate((400, 500), start=3):
        committed_run(spark, sqlite_ledger, cfg, f"r{i}", frontier)
    before = {t: shard_as_of(cfg, t) for t in (300, 399, 499)}
    done = compact.run_compact(spark, sqlite_ledger, cfg, since=300)
    assert done.outcome == "compacted", done.message
    assert {t: shard_as_of(cfg, t) for t in before} == before
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


def test_staged_files_that_can_never_be_appended_are_deleted_from_s3(spark, s3_warehouse, tmp_path, sqlite_ledger):
    from reconcile.sink import mint, write

    cfg = make_sink(tmp_path, "gc")
    table = _on_s3(cfg, s3_warehouse)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    old = mint.run_mint(sqlite_ledger, cfg, "old", 1, 200).description
    assert write.run_write(spark, sqlite_ledger, cfg, old.batch_id).outcome == "staged"
    assert files.list_files(table.staging_path(old.batch_id))  # on S3
    committed_run(spark, sqlite_ledger, cfg, "new", 300)  # supersedes it, commits [100, 300)
    assert table.staged_batches() == [b for b in table.staged_batches() if b != old.batch_id]
    assert not files.list_files(table.staging_path(old.batch_id))
    assert Counter(shard_as_of(cfg, 299)) == Counter({(1, "a", None): 1})


def test_credentials_from_an_airflow_connection_reach_every_stage_and_no_output(
    spark, s3_server_running, tmp_path, sqlite_ledger, monkeypatch
):
    """``RECONCILE_AWS_CONN_ID`` names an Airflow AWS connection: the stages read the warehouse
    with its credentials, and its secret is in no log line, no ledger row, no Delta commit, no
    status output and no page. (Logs and output are captured here, not with capfd/caplog: Airflow,
    imported by the test, binds its log handlers to the streams of the moment, which a per-test
    capture closes under the tests that follow.)"""
    import contextlib
    import io
    import json
    import logging
    import uuid

    from sqlalchemy import text

    from reconcile import report
    from reconcile.airflow import aws, ui

    server = s3_server_running
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    conn = {
        "conn_type": "aws",
        "login": server.access_key,
        "password": server.secret_key,
        "extra": {"region_name": server.region, "endpoint_url": server.endpoint},
    }
    monkeypatch.setenv("AIRFLOW_CONN_RECONCILE_S3", json.dumps(conn))
    monkeypatch.setenv("RECONCILE_AWS_CONN_ID", "reconcile_s3")
    monkeypatch.setenv("RECONCILE_WAREHOUSE", server.url(f"wh-{uuid.uuid4().hex[:8]}"))
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_METADATA_URL", str(sqlite_ledger.engine.url))
    assert aws.export_connection()  # imports Airflow, which configures logging: capture after it
    logs, out = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logs)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    # this process's JVM predates the variables: S3A gets them as the test session's conf
    conf = {k.removeprefix("spark.hadoop."): v for k, v in server.hadoop_conf(per_bucket=True).items()}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        cfg = make_sink(tmp_path, "secret")
        write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
        committed_run(spark, sqlite_ledger, cfg, "r1", 200)
        assert shard_as_of(cfg, 199) == Counter({(1, "a", None): 1})
        with contextlib.redirect_stdout(out):
            report.print_status(report.status_data(sqlite_ledger, cfg.name))
        pages = ui.render_overview() + ui.render_sink(cfg.name)
    finally:
        for k in conf:
            spark.conf.unset(k)
        root.removeHandler(handler)
        root.setLevel(level)
    with sqlite_ledger.engine.connect() as c:
        rows = [
            str(row) for t in ("reconcile_shards", "reconcile_batches") for row in c.execute(text(f"SELECT * FROM {t}"))
        ]
    table = ShardTable(cfg)
    commits = [json.dumps(table.commit_actions(v)) for v in table.log_versions()]
    seen = {
        "logs": logs.getvalue(),
        "status": out.getvalue(),
        "ledger": "\n".join(rows),
        "delta log": "\n".join(commits),
        "pages": pages,
    }
    assert server.secret_key not in "".join(seen.values()), [k for k, v in seen.items() if server.secret_key in v]
    assert (
        cfg.name in out.getvalue() and "appended batch" in logs.getvalue()
    )  # the status and the stages' logs were seen


def test_duckdb_and_delta_rs_read_the_shard_on_s3_as_of_a_time(spark, s3_warehouse, tmp_path, sqlite_ledger):
    """docs/object-stores.md's recipes: DuckDB (delta and httpfs extensions, an S3 secret) and
    delta-rs read the shard on S3 as of any time, equal to the model."""
    import os

    import duckdb
    from deltalake import DeltaTable
    from duckdb_extensions import import_extension

    cfg = make_sink(tmp_path, "readers")
    table = _on_s3(cfg, s3_warehouse)
    first = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", first)
    committed_run(spark, sqlite_ledger, cfg, "r1", 200)
    second = [{"k": 1, "v": "a"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", second)
    committed_run(spark, sqlite_ledger, cfg, "r2", 300)

    con = duckdb.connect()
    for ext in ("httpfs", "delta"):
        import_extension(ext, con=con)
        con.sql(f"LOAD {ext}")
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    con.sql(
        f"CREATE SECRET warehouse (TYPE s3, KEY_ID '{os.environ['AWS_ACCESS_KEY_ID']}', "
        f"SECRET '{os.environ['AWS_SECRET_ACCESS_KEY']}', REGION '{os.environ['AWS_REGION']}', "
        f"ENDPOINT '{endpoint.split('://')[1]}', URL_STYLE 'path', USE_SSL {endpoint.startswith('https')})"
    )

    def duckdb_as_of(t: int) -> Counter:
        rows = con.sql(
            f"SELECT k, v, _error, SUM(_diff) FROM delta_scan('{table.path}') "
            f"WHERE _time <= {t} GROUP BY ALL HAVING SUM(_diff) <> 0"
        ).fetchall()
        return Counter({tuple(r[:-1]): int(r[-1]) for r in rows})

    def delta_rs_as_of(t: int) -> Counter:
        out: Counter = Counter()
        for r in DeltaTable(table.path, storage_options={"AWS_ALLOW_HTTP": "true"}).to_pyarrow_table().to_pylist():
            if r["_time"] <= t:
                out[(r["k"], r["v"], r["_error"])] += r["_diff"]
        return +out

    for t, rows in ((199, first), (299, second)):
        want = Counter((r["k"], r["v"], None) for r in rows)
        assert duckdb_as_of(t) == want == delta_rs_as_of(t), f"as of {t}"
    con.close()


def _reconcile(tmp_path, *args: str, **env: str):
    """``python -m reconcile ARGS`` in a new process, as a user runs it: this test's S3 and
    ledger environment, no Java on its path (the reads need none)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    full = {**os.environ, "RECONCILE_SINKS_DIR": str(tmp_path), "PYTHONPATH": str(root / "include"), **env}
    full.pop("PYSPARK_GATEWAY_PORT", None)
    full["JAVA_HOME"] = "/nonexistent"
    full["PATH"] = os.pathsep.join(p for p in full["PATH"].split(os.pathsep) if not (Path(p) / "java").exists())
    p = subprocess.run(
        [sys.executable, "-m", "reconcile", *args], env=full, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0 and p.stderr == "", (args, p.stdout, p.stderr)
    return p.stdout


def test_show_history_diff_and_recover_read_the_shard_on_s3_as_a_user_runs_them(
    spark, s3_warehouse, tmp_path, sqlite_ledger
):
    """The reads (new processes, no JVM) agree with the model at every time asked; a lost ledger
    is rebuilt by ``recover`` from the Delta log on S3 alone, and the sink goes on from there."""
    import json

    from history_model import model_diff
    from reconcile.storage.ledger import Ledger

    cfg = _changelog_on_s3(spark, sqlite_ledger, tmp_path, s3_warehouse, "reads")
    upper = CHANGELOG_NEW[-1][0]

    def model(t: int) -> Counter:
        return +Counter({(k, v): n for (k, v, _), n in changelog_model(CHANGELOG_NEW, t).items()})

    for t in (150, upper - 1):
        shown = json.loads(_reconcile(tmp_path, "show", cfg.name, "--as-of", str(t), "--json", "--limit", "1000"))
        assert Counter({(r["k"], r["v"]): r["count"] for r in shown["rows"]}) == model(t), t
        versions = json.loads(_reconcile(tmp_path, "history", cfg.name, "--as-of", str(t), "--json"))["versions"]
        assert Counter({(r["k"], r["v"]): r["count"] for r in versions}) == model(t), t
    diff = json.loads(_reconcile(tmp_path, "diff", cfg.name, "--from", "150", "--to", str(upper - 1), "--json"))
    assert Counter({(c["k"], c["v"]): c["diff"] for c in diff["changes"]}) == model_diff(model, 150, upper - 1)

    # the ledger is lost: a new, empty one; recover reads the log on S3 and rebuilds the shard
    lost = f"sqlite:///{tmp_path / 'rebuilt.db'}"
    out = _reconcile(tmp_path, "recover", cfg.name, RECONCILE_METADATA_URL=lost)
    assert "recover:" in out, out
    rebuilt = Ledger(lost)
    assert rebuilt.get_shard(cfg.name).upper == upper
    b = committed_run(spark, rebuilt, cfg, "after-recovery", upper + 100)
    assert (b.lower, b.upper) == (upper, upper + 100)
    assert shard_as_of(cfg, upper + 99) == changelog_model(CHANGELOG_NEW, upper + 99)
    assert check.violations(rebuilt, cfg, spark=spark) == []

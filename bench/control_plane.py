"""What a run costs besides its data: the append, a whole Airflow run, a run with
nothing to do. Run it alone on a quiet machine:

    python bench/control_plane.py [--rows 1000000] [--change 0.01] [--out bench/results/control_plane.json]
    python bench/control_plane.py --scheduler-only     # 3. alone: bench/results/control_plane_scheduler.json

1. **append of the rows x change batch**: a query sink holding ``rows`` rows gets a batch that
   changes ``change`` of them; its staged files are committed (a) by the metadata-only append
   (plain Python) and, side by side on a copy of the same staged batch, (b) by the previous
   path: read the staged rows with Spark and write them into the Delta table (the commit
   releases up to session 8 made), in a warm SparkSession, so (b) is its best case; and (c) a
   third batch appended by ``python -m reconcile append`` in a new process, as Airflow's task
   does (interpreter start and imports included).
2. **``airflow dags test`` of the demo sink**: day 1 writes 3 rows into a new shard, day 2
   changes it, day 2 again has nothing to do; with the ``spark_default`` connection on local[2]
   (spark-submit per run) and on a Spark Connect server the script starts (``spark_connect``:
   write runs in the task process as its client). Wall time of each command, and the DagRun's own
   duration (created -> finished), beside what ``airflow version`` costs on this machine.
3. **runs in a long-lived scheduler** (:func:`bench_scheduler`; needs PostgreSQL for Airflow's
   database, ``RECONCILE_TEST_POSTGRES_URL``): the scheduled run that writes 3 rows, runs of a new
   interval with the source unchanged, and a backfill of covered days (nothing to do).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # harness/


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def write_kv_sources(spark, src: Path, rows: int, changed) -> None:
    """Parquet folders ``src/v1``, rows ``(k, "v<k>")`` for k in [0, rows), and ``src/v2``, the
    same but ``"w<k>"`` where ``changed`` (a condition on column ``id``) holds."""
    from pyspark.sql import functions as F

    v = F.concat(F.lit("v"), F.col("id"))
    spark.range(rows).select(F.col("id").alias("k"), v.alias("v")).write.parquet(str(src / "v1"))
    w = F.when(changed, F.concat(F.lit("w"), F.col("id"))).otherwise(v)
    spark.range(rows).select(F.col("id").alias("k"), w.alias("v")).write.parquet(str(src / "v2"))


def kv_query_spec(name: str, path: Path, **fields) -> dict:
    """A query sink ``name`` (k bigint, v string; 8 partitions; as_of 100) selecting everything
    from the Parquet folder ``path``; ``fields``: any field to add or override."""
    return {
        "name": name,
        "kind": "query",
        "schema": [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}],
        "partitions": 8,
        "as_of": 100,
        "start_date": "1970-01-01",
        "query": {"sources": {"src": {"format": "parquet", "path": str(path)}}, "sql": "SELECT k, v FROM src"},
        **fields,
    }


def bench_append(work: Path, rows: int, change: float) -> dict:
    import yaml
    from pyspark.sql import functions as F

    from reconcile.config_loading import load_file
    from reconcile.sink import append, mint, write
    from reconcile.spark import get_session
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    os.environ["RECONCILE_WAREHOUSE"] = str(work / "wh")
    spark = get_session("bench-control-plane")
    src = work / "src"
    write_kv_sources(spark, src, rows, F.col("id") < int(rows * change))
    spec = kv_query_spec("cp_bench", src / "v1")
    (work / "cp_bench.yaml").write_text(yaml.safe_dump(spec))
    cfg = load_file(work / "cp_bench.yaml")
    ledger = Ledger(f"sqlite:///{work / 'meta.db'}")
    first = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    write.run_write(spark, ledger, cfg, first.batch_id)
    append.run_append(ledger, cfg, first.batch_id)
    spec["query"]["sources"]["src"]["path"] = str(src / "v2")
    (work / "cp_bench.yaml").write_text(yaml.safe_dump(spec))
    cfg = load_file(work / "cp_bench.yaml")
    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    w = write.run_write(spark, ledger, cfg, desc.batch_id)
    b = ledger.get_batch(desc.batch_id)
    staged = ShardTable(cfg).staging_path(desc.batch_id, b.stage_id)
    copy = work / "copy_of_staged"
    shutil.copytree(staged, copy)

    # (b) the previous path first, on a copy of the table, so (a) commits to the original
    table_copy = work / "table_copy"
    shutil.copytree(ShardTable(cfg).path, table_copy, ignore=shutil.ignore_patterns("batches"))

    def copy_rows():
        staged_rows = frames.read_staged(spark, cfg, str(copy)).drop("_part")
        (
            staged_rows.write.format("delta")
            .mode("append")
            .option("txnAppId", "bench")
            .option("txnVersion", desc.lower)
            .save(str(table_copy))
        )

    copy_rows_s, _ = timed(copy_rows)
    append_s, result = timed(append.run_append, ledger, cfg, desc.batch_id)
    assert result.outcome == "committed", result.message

    # a third batch (the first 1% changed back), appended as Airflow's task does: a new process
    spec["query"]["sources"]["src"]["path"] = str(src / "v1")
    (work / "cp_bench.yaml").write_text(yaml.safe_dump(spec))
    cfg = load_file(work / "cp_bench.yaml")
    third = mint.run_mint(ledger, cfg, "run-3", 1, 400).description
    write.run_write(spark, ledger, cfg, third.batch_id)
    env = {**os.environ, "RECONCILE_SINKS_DIR": str(work), "RECONCILE_METADATA_URL": f"sqlite:///{work / 'meta.db'}"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    cli = [sys.executable, "-m", "reconcile", "append", cfg.name, "--run-id", "run-3"]
    cold_s, proc = timed(lambda: subprocess.run(cli, env=env, capture_output=True, text=True))
    assert proc.returncode == 0 and "appended batch" in proc.stdout, proc.stderr[-2000:]
    n = frames.read_updates(spark, ShardTable(cfg)).count()
    ledger.dispose()
    return {
        "rows": rows,
        "change": change,
        "batch_rows": (w.rows_ok or 0) + (w.rows_err or 0),
        "metadata_only_append_s": round(append_s, 3),
        "copy_rows_append_s": round(copy_rows_s, 3),
        "ratio": round(append_s / copy_rows_s, 3),
        "append_cli_new_process_s": round(cold_s, 3),
        "table_rows_after": n,
    }


LOG_TIME = re.compile(r"^(\S+Z) .*?(Created dag run|DagRun Finished)")


def run_seconds(output: str) -> float | None:
    """The DagRun's own duration in an ``airflow dags test`` log: created -> finished (the
    command's start-up, Airflow's in-process execution API start and its exit excluded)."""
    marks = {}
    for line in output.splitlines():
        m = LOG_TIME.match(line)
        if m:
            marks[m.group(2)] = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    if len(marks) < 2:
        return None
    return round((marks["DagRun Finished"] - marks["Created dag run"]).total_seconds(), 1)


def bench_dags_test(work: Path, connect: str | None) -> dict:
    """The demo sink's runs by ``airflow dags test`` (wall time of the command, Airflow's database
    migrated beforehand): day 1 writes 3 rows into a new shard, day 2 changes it, day 2 again has
    nothing to do. ``connect``: the ``spark_default`` connection is that Spark Connect server's
    (write runs in the task process as its client); else spark-submit on local[2]."""
    from reconcile.demo import embedded_env, write_orders

    env = embedded_env()
    env["RECONCILE_HOME"] = str(work / "home")
    env["AIRFLOW_HOME"] = str(work / "home" / "airflow")
    env["RECONCILE_WAREHOUSE"] = str(work / "home" / "warehouse")
    env.pop("RECONCILE_METADATA_URL", None)
    if connect:
        host, port = connect.removeprefix("sc://").split(":")
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)})
    os.environ.update({k: env[k] for k in ("RECONCILE_HOME",)})
    subprocess.run(["airflow", "db", "migrate"], env=env, check=True, capture_output=True)

    def dags_test(day: int) -> tuple[float, float | None]:
        t = time.perf_counter()
        proc = subprocess.run(
            ["airflow", "dags", "test", "demo_orders", f"2026-01-0{day + 1}"], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t
        assert proc.returncode == 0 and "state=success" in proc.stdout, proc.stdout[-3000:]
        return round(wall, 1), run_seconds(proc.stdout)

    write_orders(0)
    first = dags_test(1)
    write_orders(1)
    second = dags_test(2)
    again = dags_test(2)
    return {
        "first_run_3_rows_s": first[0],
        "first_run_3_rows_dagrun_s": first[1],
        "next_run_s": second[0],
        "next_run_dagrun_s": second[1],
        "nothing_to_do_s": again[0],
        "nothing_to_do_dagrun_s": again[1],
    }


def bench_scheduler(work: Path, postgres_url: str, connect: str | None) -> dict:
    """Runs in a long-lived Airflow (:class:`harness.airflow_stack.AirflowStack`: api-server, scheduler
    with the LocalExecutor, dag-processor; Airflow's database on PostgreSQL), as production runs
    them. The demo sink (daily, no catch-up) gets its scheduled run as soon as the scheduler
    starts: it writes 3 rows into a new shard up to today. Then runs of intervals the shard
    already covers (a rerun or backfill: nothing to do) are triggered by ``airflow dags trigger``,
    one after the other. Times from Airflow's database: queued -> finished, started -> finished
    (the DagRun's own duration), and each task's queued/started/ended seconds after the run's start."""
    import yaml

    from harness.airflow_stack import AirflowStack
    from reconcile.demo import embedded_env, write_orders

    home = work / "home"
    sinks = work / "sinks"
    sinks.mkdir(parents=True)
    sink = yaml.safe_load((ROOT / "include" / "sinks" / "demo_orders.yaml").read_text())
    sink.update(name="bench_orders", retries=0)
    sink["query"]["sources"]["orders"]["path"] = str(home / "demo" / "orders")
    (sinks / "bench_orders.yaml").write_text(yaml.safe_dump(sink))
    env = embedded_env()
    extra = {k: env[k] for k in ("AIRFLOW__CORE__DAGS_FOLDER", "AIRFLOW__CORE__PLUGINS_FOLDER", "PYTHONPATH", "PATH")}
    extra.update(
        {
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "RECONCILE_HOME": str(home),
            "RECONCILE_SINKS_DIR": str(sinks),
            "RECONCILE_WAREHOUSE": str(home / "warehouse"),
            "RECONCILE_METADATA_URL": f"sqlite:///{home / 'meta.db'}",
            "AIRFLOW_CONN_SPARK_DEFAULT": env["AIRFLOW_CONN_SPARK_DEFAULT"],
        }
    )
    if connect:
        host, port = connect.removeprefix("sc://").split(":")
        extra["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(
            {"conn_type": "spark_connect", "host": host, "port": int(port)}
        )
    home.mkdir(parents=True)
    os.environ["RECONCILE_HOME"] = str(home)
    write_orders(0)
    stack = AirflowStack(work, postgres_url, extra)
    try:
        stack.start()
        deadline = time.time() + 120
        while "bench_orders" not in stack.airflow("dags", "list", "-o", "plain").stdout:
            assert time.time() < deadline, "the dag-processor did not parse the bench sink's DAG in 120 s"
            time.sleep(1)

        def run(trigger: bool, run_id: str) -> dict:
            """Wait for the run ``run_id`` (a LIKE pattern unless ``trigger``: triggered now)."""
            if trigger:
                out = stack.airflow("dags", "trigger", "bench_orders", "--run-id", run_id)
                assert out.returncode == 0, out.stderr[-2000:]
            else:
                deadline = time.time() + 120
                while not (found := [x for x in stack.runs("bench_orders", run_id) if x["run_id"] not in done]):
                    assert time.time() < deadline, f"no run {run_id} in 120 s"
                    time.sleep(0.5)
                run_id = found[0]["run_id"]
            done.add(run_id)
            deadline = time.time() + 600
            while True:
                r = stack.dag_run("bench_orders", run_id)
                if r and r["state"] in ("success", "failed"):
                    break
                assert time.time() < deadline, f"run {run_id} did not finish in 600 s: {r}"
                time.sleep(0.2)
            assert r["state"] == "success", (run_id, r, (work / "scheduler.log").read_text()[-3000:])
            res: dict = {
                "queued_to_end_s": round((r["end_date"] - r["queued_at"]).total_seconds(), 2),
                "start_to_end_s": round((r["end_date"] - r["start_date"]).total_seconds(), 2),
            }
            start = r["start_date"]
            for ti in stack.task_instances("bench_orders", run_id):  # where the run's time goes
                if ti["start_date"] and ti["end_date"]:
                    res[ti["task_id"]] = {
                        k: round((ti[col] - start).total_seconds(), 2) if ti[col] else None
                        for k, col in (
                            ("queued_s", "queued_dttm"),
                            ("started_s", "start_date"),
                            ("ended_s", "end_date"),
                        )
                    }
            return res

        done: set[str] = set()
        first = run(False, "scheduled__%")  # the scheduler's own run: 3 rows into a new shard
        # a new interval, the source unchanged: a batch whose correction is empty
        unchanged = [run(True, f"bench_unchanged_{i}") for i in range(3)]
        # a backfill of days the shard covers: each run has nothing to do
        args = ("--dag-id", "bench_orders", "--from-date", "2026-01-02", "--to-date", "2026-01-04")
        out = stack.airflow("backfill", "create", *args, "--max-active-runs", "1")
        assert out.returncode == 0, out.stderr[-2000:]
        noop = [run(False, "backfill__%") for _ in range(3)]
    finally:
        stack.close()
    return {
        "first_run_3_rows": first,
        "nothing_changed": unchanged,
        "nothing_to_do": noop,
        **{
            f"{name}_median_{k}": statistics.median(r[k] for r in runs)
            for name, runs in (("nothing_changed", unchanged), ("nothing_to_do", noop))
            for k in ("queued_to_end_s", "start_to_end_s")
        },
    }


def bench_startup(work: Path) -> dict:
    """What every Airflow command and task process pays before the sink's code runs."""
    env = {**os.environ, "AIRFLOW_HOME": str(work / "airflow")}

    def wall(cmd: list[str]) -> float:
        t = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True, env=env)
        return round(time.perf_counter() - t, 2)

    return {
        "airflow_version_s": wall(["airflow", "version"]),
        "import_airflow_sdk_s": wall([sys.executable, "-c", "import airflow.sdk"]),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--change", type=float, default=0.01)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "control_plane.json"))
    p.add_argument("--skip-airflow", action="store_true")
    p.add_argument("--scheduler-only", action="store_true", help="only the runs in a long-lived scheduler")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cp-bench-"))
    try:
        out = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "cores": os.cpu_count()}
        if args.scheduler_only:
            from reconcile import connect_server

            port = free_port()
            url = connect_server.start(port, "local[2]", home=work)
            try:
                out["scheduler_connect"] = bench_scheduler(
                    work / "scheduler", os.environ["RECONCILE_TEST_POSTGRES_URL"], url
                )
            finally:
                connect_server.stop(port, home=work)
            print(json.dumps(out, indent=1))
            target = Path(args.out)
            if target.name == "control_plane.json":  # the default: keep the main results
                target = target.with_name("control_plane_scheduler.json")
            target.write_text(json.dumps(out, indent=1) + "\n")
            return 0
        if not args.skip_airflow:
            from reconcile import connect_server

            out.update(bench_startup(work / "startup"))
            out["spark_submit"] = bench_dags_test(work / "submit", None)
            print(json.dumps(out), flush=True)
            port = free_port()
            t = time.perf_counter()
            url = connect_server.start(port, "local[2]", home=work)
            out["connect_server_start_s"] = round(time.perf_counter() - t, 1)
            try:
                out["spark_connect"] = bench_dags_test(work / "connect", url)
                pg = os.environ.get("RECONCILE_TEST_POSTGRES_URL")
                if pg:
                    out["scheduler_connect"] = bench_scheduler(work / "scheduler", pg, url)
                else:
                    print("RECONCILE_TEST_POSTGRES_URL is not set: no runs in a long-lived scheduler", flush=True)
            finally:
                connect_server.stop(port, home=work)
            print(json.dumps(out), flush=True)
        out.update(bench_append(work / "append", args.rows, args.change))
        print(json.dumps(out, indent=1))
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the sink costs with its warehouse on S3, on the local S3 server the
tests use (versitygw on 127.0.0.1, harness/s3_server.py). One command, run alone on a quiet machine:

    python bench/s3_costs.py [--rows 1000000] [--change 0.01] [--batches 200] [--out bench/results/s3_costs.json]

1. **append of the rows x change batch** (target <= 0.5 s): a query sink holding ``rows`` rows on
   S3 gets a batch that changes ``change`` of them; its staged files are committed by the
   metadata-only append, in this process (warm) and by ``python -m reconcile append`` in a new
   process (as Airflow's task runs it). Each must leave every object under the table as it was
   (same key, ETag and Last-Modified: nothing copied or rewritten) and add objects only under
   ``_delta_log/``: asserted from the bucket's listing before and after.
2. **status and check of a ``batches``-batch shard** (target <= 2 s each): a query sink that
   committed ``batches`` small batches; ``python -m reconcile status SINK`` and
   ``python -m reconcile check SINK`` in new processes, each timed ``repeat`` times (median), with
   the S3 requests each made (the server's access log: where the time goes).
3. **the tiny ``airflow dags test`` run on Spark Connect** (target <= 15 s): the demo sink's
   runs (day 1: 3 rows into a new shard, day 2 changes it, day 2 again: nothing to do) with the
   warehouse on S3, the ``spark_default`` connection naming a Spark Connect server started with
   the AWS environment (its JVM's S3A reads the credentials from it), as in bench/control_plane.py.

Every figure is printed with the load average when it was taken: on a shared machine the wall
times also measure the others' load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # harness/
sys.path.insert(0, str(ROOT / "bench"))

APPEND_TARGET_S, READ_TARGET_S, DAGS_TEST_TARGET_S = 0.5, 2.0, 15.0


def load() -> float:
    return round(os.getloadavg()[0], 1)


class Requests:
    """The S3 requests the server answered since the last :meth:`take` (its access log), by
    operation: ``{"s3_GetObject": 201, ...}``."""

    def __init__(self, log: Path):
        self.log, self.offset = log, 0

    def take(self) -> dict[str, int]:
        time.sleep(0.2)  # the server writes a request's line once it answered
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        ops: Counter = Counter()
        for line in data.decode(errors="replace").splitlines():
            words = line.split()
            i = next((i for i, w in enumerate(words) if w.startswith("s3_")), None)
            if i is not None:  # the operation, then the key ("-" for a bucket's)
                ops[words[i] + (" _delta_log" if "/_delta_log/" in f"/{words[i + 1]}" else "")] += 1
        return dict(sorted(ops.items()))


def objects(client, prefix: str) -> dict[str, tuple[str, str, int]]:
    """{key: (ETag, Last-Modified, size)} of every object under ``prefix`` (ListObjectsV2)."""
    out: dict[str, tuple[str, str, int]] = {}
    token = None
    while True:
        query = {"list-type": "2", "prefix": prefix}
        if token:
            query["continuation-token"] = token
        status, _, data = client.request("GET", query=query)
        assert status == 200, data[:300]
        root = ET.fromstring(data)
        ns = root.tag.split("}")[0] + "}" if root.tag.startswith("{") else ""
        for c in root.iter(f"{ns}Contents"):
            out[c.findtext(f"{ns}Key") or ""] = (
                c.findtext(f"{ns}ETag") or "",
                c.findtext(f"{ns}LastModified") or "",
                int(c.findtext(f"{ns}Size") or 0),
            )
        token = root.findtext(f"{ns}NextContinuationToken")
        if not token:
            return out


def metadata_only(before: dict, after: dict, prefix: str) -> list[str]:
    """The new objects of an append; raises unless every object before is unchanged and every
    new one is a Delta log file."""
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"the append copied, rewrote or deleted objects: {changed[:5]}"
    new = sorted(k[len(prefix) :] for k in after.keys() - before.keys())
    assert all(k.startswith("_delta_log/") for k in new), f"the append wrote data objects: {new}"
    return new


def cli(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "reconcile", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - t, proc


def sink_spec(name: str, src: str, fmt: str, partitions: int) -> dict:
    return {
        "name": name,
        "kind": "query",
        "schema": [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}],
        "partitions": partitions,
        "as_of": 100,
        "start_date": "1970-01-01",
        "query": {"sources": {"src": {"format": fmt, "path": src}}, "sql": "SELECT k, v FROM src"},
    }


def write_sink(spec: dict):
    import yaml

    from reconcile.config_loading import load_file

    path = Path(os.environ["RECONCILE_SINKS_DIR"]) / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return load_file(path)


def bench_append(spark, ledger, server, work: Path, rows: int, change: float) -> dict:
    """1. in the module's doc (the server's access log: ``work / 's3-access.log'``)."""
    from pyspark.sql import functions as F

    from reconcile.sink import append, mint, write
    from reconcile.storage.delta import ShardTable

    src = work / "src"
    spark.range(rows).select(F.col("id").alias("k"), F.concat(F.lit("v"), F.col("id")).alias("v")).write.parquet(
        str(src / "v1")
    )
    changed = int(rows * change)
    spark.range(rows).select(
        F.col("id").alias("k"),
        F.when(F.col("id") < changed, F.concat(F.lit("w"), F.col("id")))
        .otherwise(F.concat(F.lit("v"), F.col("id")))
        .alias("v"),
    ).write.parquet(str(src / "v2"))
    spec = sink_spec("s3_append", str(src / "v1"), "parquet", 8)
    cfg = write_sink(spec)
    table = ShardTable(cfg)
    prefix = table.path.split("/", 3)[3] + "/"  # s3://bucket/<prefix>
    client = server.client()
    requests = Requests(work / "s3-access.log")

    t = time.perf_counter()
    first = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    write.run_write(spark, ledger, cfg, first.batch_id)
    assert append.run_append(ledger, cfg, first.batch_id).outcome == "committed"
    first_s = time.perf_counter() - t

    def staged(run_id: str, source: str, frontier: int):
        spec["query"]["sources"]["src"]["path"] = str(src / source)
        c = write_sink(spec)
        desc = mint.run_mint(ledger, c, run_id, 1, frontier).description
        w = write.run_write(spark, ledger, c, desc.batch_id)
        return c, desc, w

    cfg, desc, w = staged("run-2", "v2", 300)
    before = objects(client, prefix)
    requests.take()
    la = load()
    append_s = time.perf_counter()
    result = append.run_append(ledger, cfg, desc.batch_id)
    append_s = time.perf_counter() - append_s
    append_requests = requests.take()
    assert result.outcome == "committed", result.message
    new = metadata_only(before, objects(client, prefix), prefix)

    # a third batch (the changed rows changed back), appended as Airflow's task does: a new process
    cfg, third, _ = staged("run-3", "v1", 400)
    before = objects(client, prefix)
    requests.take()
    la_cli = load()
    cli_s, proc = cli(["append", cfg.name, "--run-id", "run-3"], dict(os.environ))
    cli_requests = requests.take()
    assert proc.returncode == 0 and "appended batch" in proc.stdout, proc.stderr[-2000:]
    new_cli = metadata_only(before, objects(client, prefix), prefix)
    return {
        "rows": rows,
        "change": change,
        "batch_rows": (w.rows_ok or 0) + (w.rows_err or 0),
        "objects_under_table": len(before),
        "first_batch_write_and_append_s": round(first_s, 1),
        "append_s": round(append_s, 3),
        "append_load": la,
        "append_requests": append_requests,
        "append_new_objects": new,
        "append_cli_new_process_s": round(cli_s, 3),
        "append_cli_load": la_cli,
        "append_cli_requests": cli_requests,
        "append_cli_new_objects": new_cli,
        "metadata_only": True,  # asserted above: no object under the table copied or rewritten
        "target_s": APPEND_TARGET_S,
    }


def build_shard(spark, ledger, work: Path, name: str, batches: int) -> dict:
    """A query sink that committed ``batches`` batches: a 6-row source, one row changed per batch
    (each batch: 2 updates, one Delta version)."""
    from reconcile.sink.run import run_batch

    src = work / f"src-{name}"
    src.mkdir(parents=True, exist_ok=True)
    cfg = write_sink(sink_spec(name, str(src), "json", 2))
    t = time.perf_counter()
    appends = []
    for i in range(batches):
        rows = [{"k": k, "v": f"v{k}-{i if k == i % 6 else 0}"} for k in range(6)]
        (src / "part-0.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
        run = run_batch(spark, ledger, cfg, f"b-{i}", 200 + 100 * i)
        assert run.append is not None and run.append.outcome == "committed", run
        appends.append(run.seconds["append"])
    return {
        "batches": batches,
        "build_s": round(time.perf_counter() - t, 1),
        # each batch's append (in this warm process): does it grow with the log?
        "append_first_10_median_s": round(statistics.median(appends[:10]), 3),
        "append_last_10_median_s": round(statistics.median(appends[-10:]), 3),
        "build_load": load(),
    }


def bench_reads(access_log: Path, name: str, repeat: int) -> dict:
    """``status`` and ``check`` of the shard ``name``, each in a new process, ``repeat`` times."""
    requests = Requests(access_log)
    env = dict(os.environ)
    out: dict = {}
    for command in ("status", "check"):
        walls, loads, reqs = [], [], []
        for _ in range(repeat):
            requests.take()
            loads.append(load())
            wall, proc = cli([command, name], env)
            reqs.append(requests.take())
            assert proc.returncode == 0, (command, proc.stdout[-2000:], proc.stderr[-2000:])
            walls.append(wall)
        out[command] = {
            "median_s": round(statistics.median(walls), 2),
            "runs_s": [round(w, 2) for w in walls],
            "load": loads,
            "requests": reqs[-1],
            "target_s": READ_TARGET_S,
        }
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import reconcile.cli"], env=env, check=True)
    out["import_reconcile_cli_s"] = round(time.perf_counter() - t, 2)
    return out


TASK_MARK = re.compile(r"^(\S+Z) .*\[DAG TEST\] (starting|end task) task_id=(\w+)")


def task_seconds(output: str) -> dict[str, float]:
    """{task: seconds from its start to its end} in an ``airflow dags test`` log (the first task's
    include Airflow's in-process execution API start-up)."""
    marks: dict[str, dict[str, datetime]] = {}
    for line in output.splitlines():
        m = TASK_MARK.match(line)
        if m:
            marks.setdefault(m.group(3), {})[m.group(2)] = datetime.fromisoformat(m.group(1).replace("Z", "+00:00"))
    return {t: round((m["end task"] - m["starting"]).total_seconds(), 1) for t, m in marks.items() if len(m) == 2}


def bench_dags_test(work: Path, connect: str, warehouse: str, access_log: Path) -> dict:
    """The demo sink's ``airflow dags test`` runs with the warehouse at ``warehouse`` (on S3, or a
    local folder to compare under the same load; bench/control_plane.py's runs, on Spark
    Connect), each with the S3 requests it made; their output in ``bench/out/s3_costs/``."""
    from control_plane import run_seconds
    from reconcile.demo import embedded_env, write_orders

    home = work / "home"
    env = embedded_env()
    env.update(
        RECONCILE_HOME=str(home),
        AIRFLOW_HOME=str(home / "airflow"),
        RECONCILE_WAREHOUSE=warehouse,
        RECONCILE_METADATA_URL=f"sqlite:///{home / 'meta.db'}",
        RECONCILE_SINKS_DIR=str(ROOT / "include" / "sinks"),
    )
    host, port = connect.removeprefix("sc://").split(":")
    env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)})
    Path(env["AIRFLOW_HOME"]).mkdir(parents=True, exist_ok=True)
    os.environ["RECONCILE_HOME"] = str(home)
    subprocess.run(["airflow", "db", "migrate"], env=env, check=True, capture_output=True)

    logs = ROOT / "bench" / "out" / "s3_costs"
    logs.mkdir(parents=True, exist_ok=True)
    requests = Requests(access_log)

    def dags_test(day: int, label: str) -> dict:
        requests.take()
        la = load()
        t = time.perf_counter()
        proc = subprocess.run(
            ["airflow", "dags", "test", "demo_orders", f"2026-01-0{day + 1}"], env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - t
        (logs / f"{work.name}-{label}.log").write_text(proc.stdout + proc.stderr)
        assert proc.returncode == 0 and "state=success" in proc.stdout, proc.stdout[-3000:]
        return {
            "wall_s": round(wall, 1),
            "dagrun_s": run_seconds(proc.stdout),
            "tasks_s": task_seconds(proc.stdout),
            "load": la,
            "requests": requests.take(),
        }

    write_orders(0)
    first = dags_test(1, "first")
    write_orders(1)
    second = dags_test(2, "next")
    again = dags_test(2, "nothing")
    return {"first_run_3_rows": first, "next_run": second, "nothing_to_do": again, "target_s": DAGS_TEST_TARGET_S}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--change", type=float, default=0.01)
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "s3_costs.json"))
    p.add_argument("--only", choices=["append", "reads", "airflow"], action="append", help="default: all three")
    args = p.parse_args()
    parts = args.only or ["append", "reads", "airflow"]

    from harness import s3_server

    work = Path(tempfile.mkdtemp(prefix="s3-costs-"))
    access = work / "s3-access.log"
    server = s3_server.start(work / "s3", access_log=access)
    # the standard AWS variables, before any JVM starts: S3A, delta-rs and Arrow read them
    os.environ.update(server.storage_options())
    os.environ.update(
        RECONCILE_HOME=str(work / "home"),
        RECONCILE_WAREHOUSE=server.url("wh"),
        RECONCILE_METADATA_URL=f"sqlite:///{work / 'meta.db'}",
        RECONCILE_SINKS_DIR=str(work / "sinks"),
        RECONCILE_SPARK_LOG_LEVEL="error",
    )
    (work / "sinks").mkdir()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    out: dict = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit.stdout.strip(),
        "cores": os.cpu_count(),
        "load_at_start": load(),
        "store": "versitygw 1.8.0 on 127.0.0.1 (harness/s3_server.py)",
        "parts": parts,
    }
    try:
        if "append" in parts or "reads" in parts:
            from reconcile.spark import get_session
            from reconcile.storage.ledger import Ledger

            spark = get_session("bench-s3-costs")
            ledger = Ledger(os.environ["RECONCILE_METADATA_URL"])
            if "append" in parts:
                out["append"] = bench_append(spark, ledger, server, work, args.rows, args.change)
                print(json.dumps(out), flush=True)
            if "reads" in parts:
                out["reads"] = build_shard(spark, ledger, work, "s3_reads", args.batches)
                print(json.dumps(out), flush=True)
                out["reads"].update(bench_reads(work / "s3-access.log", "s3_reads", args.repeat))
                print(json.dumps(out), flush=True)
            ledger.dispose()
            spark.stop()
        if "airflow" in parts:
            from control_plane import free_port
            from reconcile import connect_server

            port = free_port()
            t = time.perf_counter()
            url = connect_server.start(port, "local[2]", home=work, env=dict(os.environ))
            out["connect_server_start_s"] = round(time.perf_counter() - t, 1)
            try:
                wh = os.environ["RECONCILE_WAREHOUSE"]
                out["airflow_dags_test_connect"] = bench_dags_test(work / "airflow", url, wh + "-airflow", access)
                # the same runs on a local folder, on the same server under the same load: what S3 adds
                local = str(work / "airflow-local" / "warehouse")
                out["airflow_dags_test_connect_local"] = bench_dags_test(work / "airflow-local", url, local, access)
            finally:
                connect_server.stop(port, home=work)
        out["load_at_end"] = load()
        print(json.dumps(out, indent=1))
        target = Path(args.out)
        if args.only and target.exists():  # a part measured again: the others' figures stay
            run = {k: out.pop(k) for k in ("when", "commit", "load_at_start", "load_at_end", "parts")}
            old = json.loads(target.read_text())
            out = {**old, **out, "remeasured": [*old.get("remeasured", []), run]}
        target.write_text(json.dumps(out, indent=1) + "\n")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

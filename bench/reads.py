"""What reading a shard costs on the command line: ``show``, ``history``, ``diff``,
``status`` and ``dry-run`` timed as a user runs them, each in a new process (interpreter start
and imports included), on the demo shard and on a 1M-row shard. Run it alone on a quiet machine:

    python bench/reads.py [--rows 1000000] [--repeat 3] [--out bench/results/reads.json]

1. **the demo shard**: the demo sink (``include/sinks/demo_orders.yaml``) over its three days of
   raw orders (``reconcile.demo.DAYS``: 5 customers, an error row), one batch a day.
2. **the 1M-row shard**: a query sink ``(k bigint, v string)`` over ``rows`` Parquet rows, then
   a second batch in which 1% of them changed (``rows * 1.02`` updates in the Delta table).

Both are built once (one SparkSession, :func:`reconcile.sink.run.run_batch`; ``--work DIR``
reuses a folder a previous ``--keep`` run built). Each command then runs ``repeat`` times; the
median wall time is reported with the CPU time the process used (user + system: on a shared
machine the wall time also measures the others' load, printed beside it), beside the same read
with ``--spark`` (the JVM a read cost before). ``dry-run`` computes both query sinks' next correction
without a JVM (:mod:`reconcile.kinds.preview`), held to the same targets (<= 1 s for the demo shard,
<= 5 s for 1M rows); ``dry-run --spark`` is timed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

DEMO_TARGET_S, MILLION_TARGET_S = 1.0, 5.0


def environment(work: Path) -> dict[str, str]:
    return {
        "RECONCILE_HOME": str(work / "home"),
        "RECONCILE_WAREHOUSE": str(work / "warehouse"),
        "RECONCILE_METADATA_URL": f"sqlite:///{work / 'metadata.db'}",
        "RECONCILE_SINKS_DIR": str(work / "sinks"),
    }


def build(work: Path, rows: int) -> dict[str, str]:
    """The demo shard and the 1M-row shard under ``work``; the environment that reads them."""
    import yaml

    env = environment(work)
    os.environ.update(env)
    (work / "sinks").mkdir(parents=True)
    (work / "warehouse").mkdir()
    shutil.copy(ROOT / "include" / "sinks" / "demo_orders.yaml", work / "sinks")

    from pyspark.sql import functions as F

    from control_plane import kv_query_spec, write_kv_sources
    from reconcile import demo
    from reconcile.config_loading import load_sink
    from reconcile.schedule import to_millis
    from reconcile.sink.run import run_batch
    from reconcile.spark import get_session
    from reconcile.storage.ledger import Ledger

    spark = get_session("bench-reads")
    ledger = Ledger(env["RECONCILE_METADATA_URL"])
    cfg = load_sink("demo_orders")
    for day in range(3):
        demo.write_orders(day)
        end = to_millis(datetime(2026, 1, 2 + day, tzinfo=UTC))
        run_batch(spark, ledger, cfg, f"demo-{day}", end)

    src = work / "src"
    write_kv_sources(spark, src, rows, F.col("id") % 100 == 0)
    spec = kv_query_spec("million", src / "v1", schedule="@daily")
    for i, (version, frontier) in enumerate((("v1", 200), ("v2", 300))):
        spec["query"]["sources"]["src"]["path"] = str(src / version)
        (work / "sinks" / "million.yaml").write_text(yaml.safe_dump(spec))
        run_batch(spark, ledger, load_sink("million"), f"million-{i}", frontier)
    ledger.dispose()
    spark.stop()
    return env


def timed_cli(env: dict[str, str], args: list[str], repeat: int) -> dict:
    """Median wall time of ``python -m reconcile ARGS`` in a new process, and what it printed."""
    full = {**os.environ, **env, "PYTHONPATH": str(ROOT / "include")}
    full.pop("PYSPARK_GATEWAY_PORT", None)
    times, cpu, proc = [], [], None
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, *args], env=full, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    assert proc is not None
    return {
        "command": "python " + " ".join(args),
        "median_s": round(statistics.median(times), 3),
        "runs_s": [round(t, 3) for t in times],
        "cpu_s": round(statistics.median(cpu), 3),
        "load_average": round(os.getloadavg()[0], 1),
        "stderr_lines": len(proc.stderr.splitlines()),
        "stdout_head": proc.stdout.splitlines()[:2],
    }


def commands(sink: str, t1: str, t2: str, as_of: str) -> list[tuple[str, list[str]]]:
    cli = ["-m", "reconcile"]
    return [
        ("show", [*cli, "show", sink]),
        ("show --log", [*cli, "show", sink, "--log"]),
        ("show --errors", [*cli, "show", sink, "--errors"]),
        ("history", [*cli, "history", sink]),
        ("history --as-of", [*cli, "history", sink, "--as-of", as_of]),
        ("diff", [*cli, "diff", sink, "--from", t1, "--to", t2]),
        ("status", [*cli, "status", sink]),
        ("dry-run", [*cli, "dry-run", sink]),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--spark-repeat", type=int, default=1, help="runs of each --spark command")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "reads.json"))
    p.add_argument("--keep", action="store_true", help="keep the work folder (printed)")
    p.add_argument("--work", default=None, help="time the shards a previous --keep run built there")
    args = p.parse_args()
    if args.work:
        work = Path(args.work)
        env = environment(work)
    else:
        work = Path(tempfile.mkdtemp(prefix="bench-reads-"))
        started = time.perf_counter()
        env = build(work, args.rows)
        print(f"built both shards in {time.perf_counter() - started:.0f} s under {work}", flush=True)
    base = timed_cli(env, ["-c", "pass"], args.repeat)
    print(f"{'':>14} {'python -c pass':<18} {base['median_s']:7.3f} s, cpu {base['cpu_s']:.3f} s", flush=True)
    results: dict = {"interpreter": base, "shards": {}}
    shards = {
        "demo": ("demo_orders", "2026-01-01T23:59:59.999Z", "2026-01-03T23:59:59.999Z", "2026-01-02T12:00:00Z", 1.0),
        f"{args.rows}_rows": ("million", "199", "299", "250", MILLION_TARGET_S),
    }
    for label, (sink, t1, t2, as_of, target) in shards.items():
        rows = []
        for name, cli in commands(sink, t1, t2, as_of):
            r = timed_cli(env, cli, args.repeat)
            r["name"], r["target_s"] = name, target
            # wall time on a quiet machine; CPU time (the process's own work) on a loaded one
            r["met_wall"] = r["median_s"] <= target and r["stderr_lines"] == 0
            r["met_cpu"] = r["cpu_s"] <= target and r["stderr_lines"] == 0
            rows.append(r)
            print(
                f"{label:>14} {name:<18} {r['median_s']:7.3f} s, cpu {r['cpu_s']:.3f} s (target {target} s; "
                f"load {r['load_average']})",
                flush=True,
            )
        spark = [("history --spark", ["-m", "reconcile", "history", sink, "--spark"])]
        spark.append(("dry-run --spark", ["-m", "reconcile", "dry-run", sink, "--spark"]))
        for name, cli in spark:
            r = timed_cli(env, cli, args.spark_repeat)
            r["name"] = name
            r["cpu_note"] = "the Python process only: the JVM it starts is not counted"
            rows.append(r)
            print(
                f"{label:>14} {name:<18} {r['median_s']:7.3f} s, cpu {r['cpu_s']:.3f} s (Spark; stderr lines: "
                f"{r['stderr_lines']})",
                flush=True,
            )
        results["shards"][label] = rows
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    results.update(
        {
            "bench": "reads",
            "rows": args.rows,
            "repeat": args.repeat,
            "commit": commit.stdout.strip(),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        }
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    if not args.keep and not args.work:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

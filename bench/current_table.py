"""What keeping a current-state table (``current: true``) adds to a batch, side by side.

    python bench/current_table.py [--rows 10000000] [--keys 1000000] [--commands 10000] [--trials 2]
                                  [--upsert-trials 6] [--cells query,upsert]

One Spark session (sized for the machine, as every benchmark here). Two cells, each with a sink
without and a sink with a current table, alternating which goes first from trial to trial:

- **query**: ``--rows`` rows of :mod:`workload`'s table, then the same with 0.1% changed; the
  first batch (untimed) loads it, the second (timed: mint + write + append, the append including
  the current table's maintenance) writes the change.
- **upsert**: ``--keys`` keys loaded by the first batch (untimed), then one batch of
  ``--commands`` commands (10% deletes) over all keys (timed).

Reports per cell the median batch seconds of each sink, their ratio (target: <= 1.25), the
seconds the maintenance itself took and its rows; and reading the current state: the current
table read whole vs the GROUP BY over the shard (DuckDB, Spark; target >= 10x). Writes
``<out>/current_table.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as W  # noqa: E402


def _with_current(cfg, root: Path):
    import yaml

    path = Path(cfg.path)
    data = yaml.safe_load(path.read_text())
    data["current"] = {"deletion_vectors": True}  # what BENCHMARKS.md measures (copy-on-write: the default)
    data["name"] = cfg.name + "_cur"
    out = root / f"{data['name']}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    from reconcile.config_loading import load_file

    return load_file(out)


def _timed_batch(spark, ledger, cfg, batch: int) -> tuple[float, float | None]:
    from reconcile.sink.run import run_batch

    t0 = time.perf_counter()
    r = run_batch(spark, ledger, cfg, f"b{batch}", W.upper_of(batch))
    total = time.perf_counter() - t0
    if r.append is None or r.append.outcome != "committed":
        raise RuntimeError(f"{cfg.name}: {r.message}")
    cur = r.append.current
    return round(total, 2), (round(cur.seconds, 2) if cur is not None else None)


def _reads(spark, cfg_cur, scratch: Path) -> dict:
    """The current state read: the current table whole vs the GROUP BY over the shard."""
    import duckdb
    from duckdb_extensions import import_extension

    from reconcile.storage.current import CurrentTable
    from reconcile.storage.delta import ShardTable

    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    cols = ", ".join(f'"{c}"' for c in cfg_cur.column_names)
    shard, current = ShardTable(cfg_cur).path, CurrentTable(cfg_cur).path
    out: dict = {}
    group_by = f"SELECT {cols} FROM delta_scan('{shard}') WHERE _error IS NULL GROUP BY ALL HAVING sum(_diff) > 0"
    shard_rows = spark.read.format("delta").load(shard).where("_error IS NULL")
    state = shard_rows.groupBy(*cfg_cur.column_names).agg({"_diff": "sum"}).where("`sum(_diff)` > 0")
    current_df = lambda: spark.read.format("delta").load(current)  # noqa: E731
    # three reads of the state, each from the current table and by the GROUP BY over the shard:
    # a checksum of every row, every row materialized, and a consumer's aggregate over two columns
    reads = {
        "checksum": (
            lambda: con.sql(f"SELECT count(*), sum(hash({cols})) FROM delta_scan('{current}')").fetchall(),
            lambda: con.sql(f"SELECT count(*), sum(hash({cols})) FROM ({group_by})").fetchall(),
            lambda: current_df().selectExpr("count(*)", f"sum(hash({cols}))").collect(),
            lambda: state.selectExpr("count(*)", f"sum(hash({cols}))").collect(),
        ),
        "rows": (
            lambda: con.sql(f"SELECT {cols} FROM delta_scan('{current}')").to_arrow_table(),
            lambda: con.sql(group_by).to_arrow_table(),
            # Parquet, not Spark's noop sink: Delta 4.4 refuses noop writes of a table with
            # deletion vectors ("non-pinned table snapshot"); files written, as a model's are
            lambda: current_df().write.mode("overwrite").parquet(str(scratch / "current")),
            lambda: state.write.mode("overwrite").parquet(str(scratch / "group_by")),
        ),
        "aggregate": (
            lambda: con.sql(f"SELECT status, sum(qty) FROM delta_scan('{current}') GROUP BY status").fetchall(),
            lambda: con.sql(f"SELECT status, sum(qty) FROM ({group_by}) GROUP BY status").fetchall(),
            lambda: current_df().groupBy("status").agg({"qty": "sum"}).collect(),
            lambda: state.groupBy("status").agg({"qty": "sum"}).collect(),
        ),
    }
    for shape, runs in reads.items():
        for engine, run in zip(
            ("duckdb_current", "duckdb_group_by", "spark_current", "spark_group_by"), runs, strict=True
        ):
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                times.append(time.perf_counter() - t0)
            out[f"{shape}_{engine}"] = round(min(times), 3)
        for engine in ("duckdb", "spark"):
            out[f"{shape}_{engine}_speedup"] = round(
                out[f"{shape}_{engine}_group_by"] / out[f"{shape}_{engine}_current"], 1
            )
    return out


def main(
    rows: int, keys: int, commands: int, trials: int, out: Path, upsert_trials: int = 6, cells: str = "query,upsert"
) -> dict:
    logging.basicConfig(level=logging.WARNING)
    root, spark, ledger, started = W.start("bench-current-", "bench-current")
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    result: dict = {"rows": rows, "keys": keys, "commands": commands, "trials": trials, "upsert_trials": upsert_trials}

    if "query" in cells:
        W.generate(spark.range(rows), 1).write.parquet(str(root / "before"))
        before = spark.read.parquet(str(root / "before"))
        W.change(spark, before, 1, "x", rows // 1000, rows).write.parquet(str(root / "after"))
        q: dict = {"plain": [], "current": [], "maintain": []}
        for trial in range(trials):
            order = ["plain", "current"] if trial % 2 == 0 else ["current", "plain"]
            for which in order:
                desired = root / f"desired_{which}_{trial}"
                shutil.copytree(root / "before", desired)
                cfg = W.query_sink(root, f"q_{trial}", str(desired), partitions)
                if which == "current":
                    cfg = _with_current(cfg, root)
                _timed_batch(spark, ledger, cfg, 1)
                shutil.rmtree(desired)
                shutil.copytree(root / "after", desired)
                s, m = _timed_batch(spark, ledger, cfg, 2)
                q[which].append(s)
                if m is not None:
                    q["maintain"].append(m)
                print(f"query trial {trial} {which}: {s} s (maintenance {m})", flush=True)
                if which == "current" and trial == trials - 1:
                    result["query_reads"] = _reads(spark, cfg, root / "reads")
        result["query"] = {**q, "ratio": round(statistics.median(q["current"]) / statistics.median(q["plain"]), 3)}

    if "upsert" in cells:
        u: dict = {"plain": [], "current": [], "maintain": []}
        for trial in range(upsert_trials):
            order = ["plain", "current"] if trial % 2 == 0 else ["current", "plain"]
            for which in order:
                feed = str(root / f"feed_{which}_{trial}")
                W.commands(spark, keys, 0, keys, 7).write.parquet(feed)
                cfg = W.upsert_sink(root, f"u_{trial}", feed, partitions)
                if which == "current":
                    cfg = _with_current(cfg, root)
                _timed_batch(spark, ledger, cfg, 0)
                W.commands(spark, keys, 1, commands, 7).write.mode("append").parquet(feed)
                s, m = _timed_batch(spark, ledger, cfg, 1)
                u[which].append(s)
                if m is not None:
                    u["maintain"].append(m)
                print(f"upsert trial {trial} {which}: {s} s (maintenance {m})", flush=True)
        result["upsert"] = {**u, "ratio": round(statistics.median(u["current"]) / statistics.median(u["plain"]), 3)}
    result["session_start_s"] = round(started, 1)
    result["machine"] = W.machine(spark)
    out.mkdir(parents=True, exist_ok=True)
    (out / "current_table.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--commands", type=int, default=10_000)
    ap.add_argument("--trials", type=int, default=2, help="trials of the query cell")
    ap.add_argument("--upsert-trials", type=int, default=6, help="trials of the upsert cell (a 1-2 s batch: more)")
    ap.add_argument("--cells", default="query,upsert")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    main(a.rows, a.keys, a.commands, a.trials, a.out, a.upsert_trials, a.cells)

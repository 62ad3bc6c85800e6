"""A query sink's batch with the hash-first correction against the full-row comparison, side by side.

    python bench/hash_first.py [--rows 1000000] [--trials 3] [--out bench/results]

One Spark session (sized for the machine, as every benchmark here). The "before" snapshot is
``--rows`` rows of :mod:`workload`'s table, "after" the same with 1% changed (updates, inserts,
deletes). Per trial and per method, a fresh query sink (``SELECT * FROM desired`` over Parquet)
takes "before" in its first batch (untimed), then "after" in its second batch (timed: mint +
write + append); the methods alternate first from trial to trial. ``hash_first`` is the sink as
it is; ``exact`` computes the same batch comparing every row in full
(:func:`reconcile.differential.difference`, what a batch falls back to when it does not add up).
Both batches are checked to hold the same correction size. Writes ``<out>/hash_first.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload as W  # noqa: E402


def main(rows: int, trials: int, out: Path) -> dict:
    from reconcile.differential import difference
    from reconcile.kinds import query as Q
    from reconcile.sink.run import run_batch

    logging.basicConfig(level=logging.WARNING)
    os.environ["RECONCILE_HASH_FIRST_MIN_ROWS"] = "1"  # hash first at every size: the method under test
    root, spark, ledger, started = W.start("bench-hash-first-", "bench-hash-first")
    W.generate(spark.range(rows), 1).write.parquet(str(root / "before"))
    before = spark.read.parquet(str(root / "before"))
    W.change(spark, before, 1, "x", rows // 100, rows).write.parquet(str(root / "after"))
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    hash_first = Q.hash_first

    def exact(cfg, snapshot, below, stamp, checks):
        return difference(cfg, snapshot, below, stamp, checks)

    seconds: dict[str, list[float]] = {"hash_first": [], "exact": []}
    updates: dict[str, set[int]] = {"hash_first": set(), "exact": set()}
    for trial in range(trials):
        order = ["hash_first", "exact"] if trial % 2 == 0 else ["exact", "hash_first"]
        for method in order:
            name = f"s_{method}_{trial}"
            desired = root / f"desired_{name}"
            shutil.copytree(root / "before", desired)
            cfg = W.query_sink(root, name, str(desired), partitions)
            Q.hash_first = hash_first
            run_batch(spark, ledger, cfg, "b1", W.upper_of(1))
            shutil.rmtree(desired)
            shutil.copytree(root / "after", desired)
            Q.hash_first = hash_first if method == "hash_first" else exact
            t0 = time.perf_counter()
            r = run_batch(spark, ledger, cfg, "b2", W.upper_of(2))
            seconds[method].append(round(time.perf_counter() - t0, 2))
            updates[method].add(r.write.rows_ok + r.write.rows_err)
            print(f"trial {trial} {method}: {seconds[method][-1]:.2f} s", flush=True)
    Q.hash_first = hash_first
    assert updates["hash_first"] == updates["exact"] == {W.correction_size(rows // 100)}, updates
    result = {
        "rows": rows,
        "changed": "1%",
        "trials": trials,
        "seconds": seconds,
        "median_s": {m: statistics.median(v) for m, v in seconds.items()},
        "hash_first_over_exact": round(
            statistics.median(seconds["hash_first"]) / statistics.median(seconds["exact"]), 3
        ),
        "session_start_s": round(started, 1),
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hash_first.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[str(rows)] = result
    path.write_text(json.dumps(runs, indent=2) + "\n")
    print(json.dumps(result))
    shutil.rmtree(root, ignore_errors=True)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args()
    main(a.rows, a.trials, a.out)

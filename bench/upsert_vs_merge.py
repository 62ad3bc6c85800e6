"""Upsert sink vs Delta MERGE on the same command stream, side by side in one run.

    python bench/upsert_vs_merge.py [--keys 1000000,10000000] [--commands 10000,100000] [--batches 3]

A seeded command feed (key ``id``; values ``name``, ``amount``, ``qty``; ``ts``, ``off``, and
``op`` = 'd' for a delete) is applied two ways, batch after batch:

(a) the upsert sink: one batch per interval through the library (mint + write + append, SQLite
    metadata), given the whole feed (it selects the interval's commands itself);
(b) Delta MERGE keeping the latest command per key: the interval's commands, deduplicated to
    the highest (ts, off) per key, merged with DELETE / UPDATE / INSERT clauses; twice, into a
    table without deletion vectors (b) and into one with them (b', ``delta.enableDeletionVectors``:
    MERGE marks changed rows instead of rewriting their files). The faster of the two in a cell
    is MERGE at its best, the anchor of the ratio.

Per table size (``--keys``): batch 0 loads every key (timed apart), then ``--batches`` batches of
each ``--commands`` size update, insert (10%) and delete (10%); a cell is one (keys, commands)
pair. After each size's batches the three tables must hold the same rows (both ways, exceptAll).
Prints commands per second per cell and the ratio sink / best MERGE; writes
bench/out/upsert_vs_merge.json and bench/out/upsert_vs_merge.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

import yaml  # noqa: E402

WIDTH = 1000  # ms per batch interval
AS_OF = 1_000_000


def commands(spark, keys: int, batch: int, count: int, seed: int):
    """The batch's commands, generated in Spark from hashes (deterministic for a seed)."""
    from pyspark.sql import functions as F

    h = lambda salt: F.abs(F.xxhash64(F.lit(seed), F.lit(batch), F.lit(salt), F.col("id")))  # noqa: E731
    lower = AS_OF + batch * WIDTH
    if batch == 0:
        df = spark.range(keys).select(F.col("id").alias("k"), F.col("id"))
        op = F.lit("u")
    else:  # 10% of commands touch new keys; 10% are deletes
        df = spark.range(count).select((h("key") % int(keys * 1.1)).alias("k"), F.col("id"))
        op = F.when(h("op") % 10 == 0, F.lit("d")).otherwise(F.lit("u"))
    return df.select(
        F.col("k").alias("id"),
        F.concat(F.lit("name-"), (h("name") % 100000).cast("string")).alias("name"),
        ((h("amount") % 1000000) / 100).cast("decimal(12,2)").alias("amount"),
        (h("qty") % 1000).cast("int").alias("qty"),
        (F.lit(lower) + h("ts") % WIDTH).alias("ts"),
        (F.lit(batch * 10_000_000) + F.col("id")).alias("off"),
        op.alias("op"),
    )


def merge_batch(spark, target: str, feed: str, lower: int, upper: int) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    cmds = spark.read.parquet(feed).where((F.col("ts") >= lower) & (F.col("ts") < upper))
    latest = (
        cmds.withColumn("_rn", F.row_number().over(Window.partitionBy("id").orderBy(F.desc("ts"), F.desc("off"))))
        .where("_rn = 1")
        .drop("_rn")
    )
    values = {c: f"s.{c}" for c in ("name", "amount", "qty")}
    (
        DeltaTable.forPath(spark, target)
        .alias("t")
        .merge(latest.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s.op = 'd'")
        .whenMatchedUpdate(set=values)
        .whenNotMatchedInsert(condition="s.op <> 'd'", values={"id": "s.id", **values})
        .execute()
    )


def sink_config(root: Path, feed: str, partitions: int) -> Path:
    path = root / "bench_upsert.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bench_upsert",
                "kind": "upsert",
                "partitions": partitions,
                "start_date": "1970-01-01",
                "as_of": AS_OF,
                "schedule": "none",
                "schema": [
                    {"name": "id", "type": "bigint", "nullable": False},
                    {"name": "name", "type": "string"},
                    {"name": "amount", "type": "decimal(12,2)"},
                    {"name": "qty", "type": "int"},
                ],
                "upsert": {
                    "source": {"format": "parquet", "path": feed},
                    "key": ["id"],
                    "time_column": "ts",
                    "offset_column": "off",
                    "delete": {"column": "op", "values": ["d"]},
                },
            }
        )
    )
    return path


def run_keys(spark, keys: int, command_sizes: list[int], args) -> tuple[list[dict], dict]:
    """One table size: load ``keys`` keys (batch 0, timed apart), then ``args.batches`` batches of
    each command count, through the sink and both MERGEs; then the three tables must agree."""
    import os

    root = Path(tempfile.mkdtemp(prefix="bench-upsert-"))
    os.environ["RECONCILE_WAREHOUSE"] = str(root / "warehouse")
    from reconcile.config import load_file
    from reconcile.sink.run import run_batch
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    feed = str(root / "feed")
    cfg = load_file(sink_config(root, feed, args.partitions))
    store = Ledger(f"sqlite:///{root / 'metadata.db'}")
    targets = {"merge": str(root / "merge_target"), "merge_dv": str(root / "merge_dv_target")}
    for name, target in targets.items():
        empty = spark.createDataFrame([], "id BIGINT, name STRING, amount DECIMAL(12,2), qty INT")
        empty.write.format("delta").save(target)
        if name == "merge_dv":
            spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")

    rows: list[dict] = []
    plan = [(0, keys)] + [(size, size) for size in command_sizes for _ in range(args.batches)]
    try:
        for b, (cell, n) in enumerate(plan):
            commands(spark, keys, b, n, args.seed).write.mode("append").parquet(feed)
            lower, upper = AS_OF + b * WIDTH, AS_OF + (b + 1) * WIDTH
            t = time.perf_counter()
            w = run_batch(spark, store, cfg, f"b{b}", upper).write
            assert w is not None
            sink_s = time.perf_counter() - t
            merged_s = {}
            for name, target in targets.items():
                t = time.perf_counter()
                merge_batch(spark, target, feed, lower, upper)
                merged_s[f"{name}_s"] = round(time.perf_counter() - t, 2)
            row = {"keys": keys, "cell": cell, "batch": b, "commands": n, "sink_s": round(sink_s, 2), **merged_s}
            rows.append({**row, "updates_written": w.rows_ok + w.rows_err})
            print(
                f"{keys:>9} keys, batch {b}: {n} commands  sink {sink_s:6.2f}s  MERGE {merged_s['merge_s']:6.2f}s  "
                f"MERGE+DV {merged_s['merge_dv_s']:6.2f}s  (sink wrote {w.rows_ok + w.rows_err} updates)",
                flush=True,
            )

        # The three tables must hold the same rows.
        ok, _ = frames.read_as_of(spark, ShardTable(cfg), AS_OF + len(plan) * WIDTH - 1)
        bad_counts = ok.where("_count != 1").count()
        sink_rows = ok.drop("_count")
        only_sink = only_merge = 0
        for target in targets.values():
            merged = spark.read.format("delta").load(target)
            only_sink += sink_rows.exceptAll(merged).count()
            only_merge += merged.exceptAll(sink_rows).count()
        check = {
            "keys": keys,
            "same_contents": bad_counts == 0 and only_sink == 0 and only_merge == 0,
            "table_rows": merged.count(),
            "only_in_sink": only_sink,
            "only_in_merge": only_merge,
            "counts_not_1": bad_counts,
        }
    finally:
        store.dispose()
        shutil.rmtree(root, ignore_errors=True)
    return rows, check


def cell_result(keys: int, size: int, rows: list[dict]) -> dict:
    """Commands per second of one (keys, commands per batch) cell over its batches."""
    mine = [r for r in rows if r["keys"] == keys and r["cell"] == size]
    cmds = sum(r["commands"] for r in mine)
    rates = {m: round(cmds / sum(r[f"{m}_s"] for r in mine)) for m in ("sink", "merge", "merge_dv")}
    best = max(rates["merge"], rates["merge_dv"])
    return {
        "keys": keys,
        "commands_per_batch": size,
        "batches": len(mine),
        **{f"{m}_commands_per_s": v for m, v in rates.items()},
        "best_merge_commands_per_s": best,
        "ratio_sink_over_best_merge": round(rates["sink"] / best, 2),
    }


def chart(path: Path, cells: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c['keys'] / 1e6:g}M keys\n{c['commands_per_batch'] / 1e3:g}k cmds" for c in cells]
    fig, ax = plt.subplots(figsize=(1.8 * len(cells) + 2, 4))
    width = 0.27
    for i, (key, label) in enumerate(
        [
            ("sink_commands_per_s", "upsert sink"),
            ("merge_commands_per_s", "MERGE"),
            ("merge_dv_commands_per_s", "MERGE + DV"),
        ]
    ):
        ax.bar([x + (i - 1) * width for x in range(len(cells))], [c[key] for c in cells], width, label=label)
    ax.set_xticks(range(len(cells)), labels)
    ax.set_ylabel("commands / s (incremental batches)")
    ax.legend()
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", default="1000000", help="table sizes, comma-separated (e.g. 1000000,10000000)")
    ap.add_argument("--commands", default="100000", help="commands per batch, comma-separated (e.g. 10000,100000)")
    ap.add_argument("--batches", type=int, default=3, help="incremental batches per cell")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    key_sizes = [int(x) for x in args.keys.split(",")]
    command_sizes = [int(x) for x in args.commands.split(",")]

    from reconcile.spark import get_session

    t0 = time.perf_counter()
    spark = get_session("bench-upsert", {"spark.sql.shuffle.partitions": str(args.partitions)})
    session_start = time.perf_counter() - t0
    rows: list[dict] = []
    checks = []
    for keys in key_sizes:
        got, check = run_keys(spark, keys, command_sizes, args)
        rows += got
        checks.append(check)
    cells = [cell_result(k, c, rows) for k in key_sizes for c in command_sizes]
    same = all(c["same_contents"] for c in checks)
    result = {
        "partitions": args.partitions,
        "session_start_s": round(session_start, 2),
        "wall_s": round(time.perf_counter() - t0, 1),
        "cells": cells,
        "checks": checks,
        "same_contents": same,
        "initial_loads": [
            {k: r[k] for k in ("keys", "sink_s", "merge_s", "merge_dv_s")} for r in rows if r["cell"] == 0
        ],
        "rows": rows,
    }
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "upsert_vs_merge.json").write_text(json.dumps(result, indent=2))
    chart(out / "upsert_vs_merge.png", cells)
    print(f"Spark session start {session_start:.1f}s (not counted); whole run {result['wall_s']:.0f}s")
    for c in checks:
        print(
            f"{c['keys']} keys: same contents {c['same_contents']} ({c['table_rows']} rows; only in sink "
            f"{c['only_in_sink']}, only in MERGE {c['only_in_merge']}, counts != 1: {c['counts_not_1']}; both MERGE tables)"
        )
    for c in cells:
        print(
            f"{c['keys']:>9} keys, {c['commands_per_batch']:>6} commands/batch: sink {c['sink_commands_per_s']:>7,} "
            f"commands/s, MERGE {c['merge_commands_per_s']:>7,}, MERGE+DV {c['merge_dv_commands_per_s']:>7,}; "
            f"sink / best MERGE = {c['ratio_sink_over_best_merge']:.2f}"
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

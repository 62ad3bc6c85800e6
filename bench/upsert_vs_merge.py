"""Upsert sink vs Delta MERGE on the same command stream, side by side in one run.

    python bench/upsert_vs_merge.py [--keys 1000000] [--batches 3] [--commands 100000] [--seed 1]

A seeded command feed (key ``id``; values ``name``, ``amount``, ``qty``; ``ts``, ``off``, and
``op`` = 'd' for a delete) is applied two ways, batch after batch:

(a) the upsert sink: one batch per interval through the library (mint + write + append, SQLite
    metadata), reading the whole feed (it selects the interval's commands itself);
(b) Delta MERGE keeping the latest command per key: the interval's commands, deduplicated to
    the highest (ts, off) per key, merged with DELETE / UPDATE / INSERT clauses; twice, into a
    table without deletion vectors (b) and into one with them (b', ``delta.enableDeletionVectors``:
    MERGE marks changed rows instead of rewriting their files). The faster of the two over the
    incremental batches is MERGE at its best, the anchor of the ratio.

Batch 0 loads every key (timed apart); batches 1..B update, insert and delete. After the last
batch the three tables must hold the same rows (checked both ways with exceptAll). Prints seconds
per batch and the throughput ratio (commands per second, sink / the best MERGE), and writes
bench/out/upsert_vs_merge.json.
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--commands", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bench-upsert-"))
    import os

    os.environ["RECONCILE_WAREHOUSE"] = str(root / "warehouse")
    from reconcile.config import load_file
    from reconcile.sink.run import run_batch
    from reconcile.spark import get_session
    from reconcile.storage import frames
    from reconcile.storage.ledger import MetadataStore

    t0 = time.perf_counter()
    spark = get_session("bench-upsert", {"spark.sql.shuffle.partitions": str(args.partitions)})
    session_start = time.perf_counter() - t0
    feed = str(root / "feed")
    cfg_path = root / "bench_upsert.yaml"
    cfg_path.write_text(
        yaml.safe_dump(
            {
                "name": "bench_upsert",
                "kind": "upsert",
                "partitions": args.partitions,
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
    cfg = load_file(cfg_path)
    store = MetadataStore(f"sqlite:///{root / 'metadata.db'}")
    targets = {"merge": str(root / "merge_target"), "merge_dv": str(root / "merge_dv_target")}
    for name, target in targets.items():
        empty = spark.createDataFrame([], "id BIGINT, name STRING, amount DECIMAL(12,2), qty INT")
        empty.write.format("delta").save(target)
        if name == "merge_dv":
            spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")

    rows = []
    try:
        for b in range(args.batches + 1):
            n = args.keys if b == 0 else args.commands
            commands(spark, args.keys, b, n, args.seed).write.mode("append").parquet(feed)
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
            rows.append(
                {
                    "batch": b,
                    "commands": n,
                    "sink_s": round(sink_s, 2),
                    **merged_s,
                    "updates_written": w.rows_ok + w.rows_err,
                }
            )
            print(
                f"batch {b}: {n} commands  sink {sink_s:6.2f}s  MERGE {merged_s['merge_s']:6.2f}s  "
                f"MERGE+DV {merged_s['merge_dv_s']:6.2f}s  (sink wrote {w.rows_ok + w.rows_err} updates)",
                flush=True,
            )

        # Both tables must hold the same rows.
        ok, _ = frames.read_as_of(spark, cfg, AS_OF + (args.batches + 1) * WIDTH - 1)
        bad_counts = ok.where("_count != 1").count()
        sink_rows = ok.drop("_count")
        only_sink = only_merge = 0
        for target in targets.values():
            merged = spark.read.format("delta").load(target)
            only_sink += sink_rows.exceptAll(merged).count()
            only_merge += merged.exceptAll(sink_rows).count()
        same = bad_counts == 0 and only_sink == 0 and only_merge == 0
        total_rows = merged.count()
    finally:
        store.dispose()
    inc = rows[1:]
    cmds = sum(r["commands"] for r in inc)
    sink_rate = cmds / sum(r["sink_s"] for r in inc)
    rates = {name: cmds / sum(r[f"{name}_s"] for r in inc) for name in targets}
    merge_rate = max(rates.values())
    result = {
        "keys": args.keys,
        "batches": args.batches,
        "commands_per_batch": args.commands,
        "partitions": args.partitions,
        "session_start_s": round(session_start, 2),
        "rows": rows,
        "same_contents": same,
        "table_rows": total_rows,
        "sink_commands_per_s": round(sink_rate),
        "merge_commands_per_s": round(rates["merge"]),
        "merge_dv_commands_per_s": round(rates["merge_dv"]),
        "best_merge_commands_per_s": round(merge_rate),
        "throughput_ratio_sink_over_merge": round(sink_rate / merge_rate, 2),
        "initial_load": {k: rows[0][k] for k in ("sink_s", "merge_s", "merge_dv_s")},
    }
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "upsert_vs_merge.json").write_text(json.dumps(result, indent=2))
    print(f"Spark session start {session_start:.1f}s (not counted)")
    print(
        f"same contents: {same} ({total_rows} rows; only in sink {only_sink}, only in MERGE {only_merge}, "
        f"counts != 1: {bad_counts}; both MERGE tables)"
    )
    print(
        f"incremental batches: sink {sink_rate:,.0f} commands/s, MERGE {rates['merge']:,.0f}, "
        f"MERGE+DV {rates['merge_dv']:,.0f}; ratio sink/best MERGE = {sink_rate / merge_rate:.2f}"
    )
    shutil.rmtree(root, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

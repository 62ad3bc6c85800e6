"""What one checksum observation costs per row, and which part of it.

    python bench/checksum_observation.py [--rows 2000000] [--partitions 4] [--repeat 7]

2M rows ``(k, v, _error, _diff)`` with their row hash and hash partition, written to Spark's
``noop`` sink with no observation and with one observation per variant (the sums the write's
self-checks make, and cheaper or partial forms of them), variants interleaved round by round.
Reports the medians of the local Spark JVM's CPU seconds (read from /proc: less disturbed by
other processes than wall time) and of wall seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]

    def cpu() -> float:
        fields = open(f"/proc/{jvm_pid}/stat").read().split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    path = tempfile.mkdtemp(prefix="bench-checksum-") + "/rows"
    spark.range(args.rows).select(
        (F.col("id") * 7).alias("k"),
        F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"),
        F.lit(None).cast("string").alias("_error"),
        F.lit(1).cast("bigint").alias("_diff"),
    ).write.parquet(path)
    h = F.xxhash64("k", "v", "_error")
    df = spark.read.parquet(path).select("*", h.alias("_h"), F.pmod(h, F.lit(args.partitions)).cast("int").alias("_p"))
    H, D, part = F.col("_h"), F.col("_diff"), F.col("_p")
    three = [
        H.bitwiseAND(F.lit((1 << 22) - 1)),
        F.shiftright(H, 22).bitwiseAND(F.lit((1 << 22) - 1)),
        F.shiftright(H, 44),
    ]
    two = [H.bitwiseAND(F.lit((1 << 32) - 1)), F.shiftright(H, 32)]
    parts = range(args.partitions)
    variants = {
        "no observation": None,
        "count only": [F.count(F.lit(1))],
        "3 limbs x P, null outside (until aa529f0)": [
            F.sum(F.when(part == p, limb * D)) for p in parts for limb in three
        ],
        "2 limbs x P, 0 outside, try_* (guarded retry)": [F.max((D >= 2**31) | (D <= -(2**31)))]
        + [F.try_sum(F.when(part == p, F.try_multiply(limb, D)).otherwise(0)) for p in parts for limb in two],
        "2 limbs x P, 0 outside, plain (the write's)": [
            F.sum(F.when(part == p, limb * D).otherwise(0)) for p in parts for limb in two
        ],
        "one DECIMAL sum x P": [F.sum(F.when(part == p, H.cast("decimal(20,0)") * D)) for p in parts],
        "2 limbs, not split by partition": [F.sum(limb * D) for limb in two],
    }
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for r in range(args.repeat):
        for name, aggs in variants.items():
            q = df if aggs is None else df.observe(Observation(f"o{r}-{len(seen[name])}-{hash(name)}"), *aggs)
            c0, t0 = cpu(), time.time()
            q.write.format("noop").mode("overwrite").save()
            seen[name].append((cpu() - c0, time.time() - t0))
    base = statistics.median(x[0] for x in seen["no observation"])
    print(
        f"{args.rows:,} rows, {args.partitions} partitions, medians of {args.repeat}: JVM CPU s (+ over none), wall s"
    )
    for name, xs in seen.items():
        c = statistics.median(x[0] for x in xs)
        print(f"  {name:45s} {c:6.2f} ({c - base:+.2f})  {statistics.median(x[1] for x in xs):6.2f}")


if __name__ == "__main__":
    main()

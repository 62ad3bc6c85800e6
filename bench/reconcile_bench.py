"""Query sink vs Delta MERGE vs overwrite vs bare Spark, side by side in one run.

    python bench/reconcile_bench.py [--sizes 100000,1000000,4000000] [--fractions 0.001,0.01,0.1]
                                    [--partitions 4] [--seed 1] [--repeat 1] [--out bench/out]
    python bench/reconcile_bench.py --flat [--size 1000000] [--batches 200] [--batch-changes 1000]
                                    [--compact-every 10]
    python bench/reconcile_bench.py --checksum-cost [--size 1000000] [--fraction 0.01] [--repeat 5]

Everything runs on one SparkSession (its start is reported apart, not counted).

Data. Rows of an orders-like schema (key ``id BIGINT NOT NULL`` and 14 typed columns: bigints,
ints, doubles, a decimal(12,2), a date, timestamps, a boolean, strings of 3 to 200 characters,
some nullable columns holding nulls) are generated in Spark from hashes of (seed, id, column).
The "before" snapshot holds N rows. For each change fraction f the "after" (desired) snapshot
is before with round(f * N) changes split evenly among updates (four columns of an existing id
change), inserts (new ids) and deletes; the ids to update or delete are the first ones in a
seeded hash order. Both are written as Parquet (not timed).

Main mode: for each (N, f), each method starts from a fresh table holding "before" (not timed)
and is timed bringing it to "after":

(a) the sink: a ``query`` sink (``SELECT * FROM desired`` over the after Parquet, P partitions,
    SQLite metadata) whose shard was loaded with "before" by a first batch; ONE batch (mint +
    write + append through the library) is timed, and each stage apart;
(b) Delta MERGE of the full snapshot: update the ids whose columns differ (null-safe), insert
    the new ids, delete the ids missing from the snapshot (WHEN NOT MATCHED BY SOURCE); twice:
    on a table without deletion vectors (b) and on one with them (b', ``delta.enableDeletion
    Vectors``: MERGE marks changed rows instead of rewriting their files). The faster of the two
    is MERGE at its best, the anchor of the ratio ``sink/merge``;
(c) a full overwrite of a Delta table with the snapshot;
(d) the bare-Spark floor: read "after" (Parquet) and "before" (a plain Delta table), compute the
    multiset difference (+1 / -1, grouped by all columns, non-zero sums) and write it as Parquet.
    No Delta log work, no metadata.

With --repeat R every method runs R times on fresh tables and the medians are reported. A
warm-up round of all four methods on a small table comes first and is not reported.

Checks (any failure exits non-zero at once): the sink's content as of its upper - 1 (as of its
since if compaction moved since up to the upper) has every count 1 and no error rows, and equals
the MERGE table and the overwritten table (exceptAll both ways); the sink's correction and the
floor's difference both hold 2 * updates + inserts + deletes rows.

Outputs: a table of seconds per method, mint/write/append, the ratios sink/MERGE,
sink/overwrite, sink/floor and (mint + append)/sink; ``<out>/reconcile_bench.json`` (every
number and the machine), ``<out>/reconcile_bench.png`` (seconds against size, one panel per
fraction) and ``<out>/BENCHMARKS.table.md`` (a Markdown table and a machine line).

Flat mode (--flat): two sinks, compaction off and on (``retention: {history_hours: 0}``, and
``reconcile.compact.run_compact`` after every --compact-every-th batch, timed apart), are loaded
with ``size`` rows by a first batch and then run the same ``batches`` small batches, each
changing ``batch-changes`` rows of the desired snapshot (rewritten as Parquet before each batch,
not timed). The two sinks alternate batch by batch on the same snapshots. A batch's cost is mint
+ write + append. Prints and saves (``<out>/reconcile_flat.json``, ``<out>/reconcile_flat.png``)
the cost of batches 1, 50, 100, 200 (or the nearest), last/first for each sink and the
compaction times; both shards must end equal to the last snapshot.

Checksum-cost mode (--checksum-cost): what batches that verify themselves cost
(:mod:`reconcile.checksums`: the observations of the desired frame and of the correction inside
the write's Spark action, of persist too when the previous batch's record cannot be carried
(the load batch), and the comparison). Each of --repeat rounds runs the query
sink of the main mode twice on fresh tables, with the observations off and on (the order
alternates round by round): a first batch loading ``size`` rows (the correction is the whole
snapshot), then the timed batch bringing it to the ``fraction`` change. Reports the medians of
both batches' write and whole-batch seconds and CPU seconds (this process and the local Spark
JVM: less disturbed than wall time when other processes share the cores), on/off, and what
``check --verify`` takes on the "on" shard (which must report nothing);
``<out>/reconcile_checksum_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

import yaml  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

WIDTH = 1000  # ms per batch interval
AS_OF = 1_000_000
EPOCH_2020 = 1_577_836_800  # seconds
WARMUP_ROWS = 2000

SCHEMA = [  # (name, type, nullable)
    ("id", "bigint", False),
    ("customer_id", "bigint", True),
    ("ext_ref", "bigint", True),
    ("qty", "int", False),
    ("region", "int", True),
    ("price", "double", True),
    ("discount", "double", True),
    ("amount", "decimal(12,2)", True),
    ("order_date", "date", True),
    ("created_at", "timestamp", True),
    ("updated_at", "timestamp", False),
    ("is_gift", "boolean", True),
    ("status", "string", False),
    ("customer", "string", True),
    ("note", "string", True),
]
COLUMNS = [c[0] for c in SCHEMA]
STATUSES = ["new", "paid", "packed", "shipped", "delivered", "returned", "cancelled"]
FIRST = [
    "Ada",
    "Alan",
    "Barbara",
    "Claude",
    "Donald",
    "Edsger",
    "Frances",
    "Grace",
    "John",
    "Ken",
    "Leslie",
    "Margaret",
    "Niklaus",
    "Radia",
    "Shafi",
    "Tony",
]
LAST = [
    "Hopper",
    "Lovelace",
    "Turing",
    "Liskov",
    "Shannon",
    "Knuth",
    "Dijkstra",
    "Allen",
    "Backus",
    "Thompson",
    "Lamport",
    "Hamilton",
    "Wirth",
    "Perlman",
    "Goldwasser",
    "Hoare-Smith",
]
LOREM = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt "
METHODS = [
    ("sink_s", "sink (a)"),
    ("merge_s", "MERGE (b)"),
    ("merge_dv_s", "MERGE+DV (b')"),
    ("overwrite_s", "overwrite (c)"),
    ("floor_s", "floor (d)"),
]
STAGES = ("mint_s", "write_s", "append_s")


class Mismatch(Exception):
    """A method did not end with the desired contents."""


# -- data -----------------------------------------------------------------------------------------


def hashed(seed: int, column: str, modulus: int, salt: str = "") -> F.Column:
    """A value in [0, modulus) from the hash of (seed, salt, column, id): deterministic per seed."""
    return F.pmod(F.xxhash64(F.lit(seed), F.lit(salt), F.lit(column), F.col("id")), F.lit(modulus))


def pick(values: list[str], index: F.Column) -> F.Column:
    return F.element_at(F.array(*[F.lit(v) for v in values]), (index + 1).cast("int"))


def generate(ids: DataFrame, seed: int) -> DataFrame:
    """Rows for the ids of ``ids`` (column ``id``), every value from a hash of (seed, id, column)."""
    h = lambda column, modulus: hashed(seed, column, modulus)  # noqa: E731
    created = F.lit(EPOCH_2020) + h("created_at", 5 * 365 * 86400)
    note_len = (h("note_len", 191) + 10).cast("int")
    note = F.concat(F.sha2(F.concat_ws(":", F.lit(seed), F.col("id")), 256), F.lit(" "), F.lit(LOREM * 2))
    return ids.select(
        F.col("id"),
        h("customer_id", 5_000_000).alias("customer_id"),
        h("ext_ref", 10**15).alias("ext_ref"),
        h("qty", 1000).cast("int").alias("qty"),
        F.when(h("region_null", 20) != 0, h("region", 50)).cast("int").alias("region"),
        (h("price", 10**7) / 100.0).alias("price"),
        F.when(h("discount_null", 10) != 0, h("discount", 1000) / 1000.0).alias("discount"),
        (h("amount", 10**8).cast("decimal(12,0)") / 100).cast("decimal(12,2)").alias("amount"),
        F.date_add(F.lit(date(2020, 1, 1)), h("order_date", 2000).cast("int")).alias("order_date"),
        F.when(h("created_null", 50) != 0, F.timestamp_seconds(created)).alias("created_at"),
        F.timestamp_seconds(created + h("updated_at", 30 * 86400)).alias("updated_at"),
        F.when(h("gift_null", 10) != 0, h("is_gift", 4) == 0).alias("is_gift"),
        pick(STATUSES, h("status", len(STATUSES))).alias("status"),
        F.concat_ws(" ", pick(FIRST, h("first", len(FIRST))), pick(LAST, h("last", len(LAST)))).alias("customer"),
        F.when(h("note_null", 5) != 0, note.substr(F.lit(1), note_len)).alias("note"),
    )


def update(rows: DataFrame, seed: int, salt: str) -> DataFrame:
    """The rows with qty, amount, status and updated_at changed (each is sure to differ)."""
    h = lambda column, modulus: hashed(seed, column, modulus, salt)  # noqa: E731
    status_index = F.array_position(F.array(*[F.lit(s) for s in STATUSES]), F.col("status")) - 1
    changed = {
        "qty": (F.col("qty") + 1 + h("qty", 9)).cast("int"),
        "amount": (F.col("amount") + (h("amount", 10_000) + 1).cast("decimal(12,0)") / 100).cast("decimal(12,2)"),
        "status": pick(STATUSES, F.pmod(status_index + 1 + h("status", len(STATUSES) - 1), F.lit(len(STATUSES)))),
        "updated_at": F.timestamp_seconds(F.unix_seconds("updated_at") + 1 + h("updated_at", 86400)),
    }
    return rows.select(*[changed.get(c, F.col(c)).alias(c) for c in COLUMNS])


def split(changes: int) -> tuple[int, int, int]:
    """(updates, inserts, deletes): ``changes`` split evenly, the remainder to updates, inserts."""
    base, rest = divmod(changes, 3)
    return base + (rest > 0), base + (rest > 1), base


def change(spark: SparkSession, current: DataFrame, seed: int, salt: str, changes: int, next_id: int) -> DataFrame:
    """``current`` with ``changes`` changes: updates and deletes of the first ids in the hash order
    of (seed, salt, id), inserts of new ids from ``next_id`` on."""
    updates, inserts, deletes = split(changes)
    ranked = current.select("id", F.xxhash64(F.lit(seed), F.lit(salt), F.col("id")).alias("_h")).orderBy("_h", "id")
    touched, updated_ids = ranked.limit(updates + deletes).select("id"), ranked.limit(updates).select("id")
    updated = current.join(updated_ids, "id", "left_semi")
    return (
        current.join(touched, "id", "left_anti")
        .unionByName(update(updated, seed, salt))
        .unionByName(generate(spark.range(next_id, next_id + inserts), seed))
    )


# -- the four methods -----------------------------------------------------------------------------


def sink_config(root: Path, name: str, desired: str, partitions: int, retention: dict | None = None):
    """(Re)write the query sink's YAML reading ``desired`` and load it."""
    from reconcile.config import load_file

    data = {
        "name": name,
        "kind": "query",
        "partitions": partitions,
        "start_date": "1970-01-01",
        "as_of": AS_OF,
        "schedule": "none",
        "schema": [{"name": n, "type": t, "nullable": nullable} for n, t, nullable in SCHEMA],
        "query": {"sql": "SELECT * FROM desired", "sources": {"desired": {"format": "parquet", "path": desired}}},
    }
    if retention is not None:
        data["retention"] = retention
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_file(path)


def upper_of(batch: int) -> int:
    return AS_OF + (batch + 1) * WIDTH


def sink_batch(spark: SparkSession, store, cfg, batch: int) -> dict:
    """One batch of the sink (interval ``batch``): mint, write, append, each timed."""
    from reconcile.sink.run import run_batch

    r = run_batch(spark, store, cfg, f"b{batch}", upper_of(batch))
    w, a = r.write, r.append
    if w is None:
        raise RuntimeError(f"{cfg.name}: nothing minted: {r.mint.message}")
    if w.outcome != "staged" or a is None or a.outcome != "committed":
        raise RuntimeError(f"{cfg.name}: {r.message}")
    return {
        "mint_s": r.seconds["mint"],
        "write_s": r.seconds["write"],
        "append_s": r.seconds["append"],
        "sink_s": sum(r.seconds.values()),
        "updates": w.rows_ok + w.rows_err,
    }


def merge(spark: SparkSession, table: str, after: str) -> None:
    from delta.tables import DeltaTable

    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in COLUMNS if c != "id")
    (
        DeltaTable.forPath(spark, table)
        .alias("t")
        .merge(spark.read.parquet(after).alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll(condition=differs)
        .whenNotMatchedInsertAll()
        .whenNotMatchedBySourceDelete()
        .execute()
    )


def overwrite(spark: SparkSession, table: str, after: str) -> None:
    spark.read.parquet(after).write.format("delta").mode("overwrite").save(table)


def floor(spark: SparkSession, table: str, after: str, out: str) -> None:
    desired = spark.read.parquet(after).withColumn("_diff", F.lit(1))
    persist = spark.read.format("delta").load(table).withColumn("_diff", F.lit(-1))
    (
        desired.unionByName(persist)
        .groupBy(*COLUMNS)
        .agg(F.sum("_diff").alias("_diff"))
        .where(F.col("_diff") != 0)
        .write.mode("overwrite")
        .parquet(out)
    )


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def sink_problems(spark: SparkSession, store, cfg, batch: int, references: dict[str, DataFrame]) -> list[str]:
    """What is wrong with the sink's content after ``batch`` (empty: nothing). It is read as of
    the batch's upper - 1, or as of since if compaction moved since there (history_hours: 0)."""
    from reconcile.storage import frames as shard

    t = max(upper_of(batch) - 1, store.get_shard(cfg.name).since)
    ok, errors = shard.read_as_of(spark, cfg, t)
    problems = []
    bad_counts, error_rows = ok.where(F.col("_count") != 1).count(), errors.count()
    if bad_counts:
        problems.append(f"{bad_counts} rows of {cfg.name} have a count other than 1")
    if error_rows:
        problems.append(f"{cfg.name} holds {error_rows} error rows")
    rows = ok.select(*COLUMNS)
    for name, ref in references.items():
        ref = ref.select(*COLUMNS)
        only_sink, only_ref = rows.exceptAll(ref).count(), ref.exceptAll(rows).count()
        if only_sink or only_ref:
            problems.append(f"{cfg.name} vs {name}: {only_sink} rows only in the sink, {only_ref} only in {name}")
    return problems


def run_once(
    spark: SparkSession, store, work: Path, name: str, before: str, after: str, changes: int, partitions: int
) -> dict:
    """Set up fresh tables holding "before" (not timed), time a, b, c, d, check the contents."""
    from reconcile.storage.delta import ShardTable

    def delta_copy(label: str, deletion_vectors: bool = False) -> str:
        path = str(work / label)
        spark.read.parquet(before).write.format("delta").save(path)
        if deletion_vectors:
            spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        return path

    cfg = sink_config(work, name, before, partitions)
    sink_batch(spark, store, cfg, 0)
    merge_t, overwrite_t, floor_t = delta_copy("merge"), delta_copy("overwrite"), delta_copy("floor")
    merge_dv_t = delta_copy("merge_dv", deletion_vectors=True)

    cfg = sink_config(work, name, after, partitions)
    r = sink_batch(spark, store, cfg, 1)
    r["merge_s"] = timed(merge, spark, merge_t, after)
    r["merge_dv_s"] = timed(merge, spark, merge_dv_t, after)
    r["overwrite_s"] = timed(overwrite, spark, overwrite_t, after)
    r["floor_s"] = timed(floor, spark, floor_t, after, str(work / "floor_diff"))

    updates, inserts, deletes = split(changes)
    expected = 2 * updates + inserts + deletes
    read = spark.read.format("delta").load
    references = {"MERGE": read(merge_t), "MERGE+DV": read(merge_dv_t), "overwrite": read(overwrite_t)}
    problems = sink_problems(spark, store, cfg, 1, references)
    floor_rows = spark.read.parquet(str(work / "floor_diff")).count()
    for label, got in (("the sink's correction", r["updates"]), ("the floor's difference", floor_rows)):
        if got != expected:
            problems.append(f"{label} has {got} rows, expected {expected}")
    if problems:
        raise Mismatch(f"{name}: " + "; ".join(problems))
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(ShardTable(cfg).path, ignore_errors=True)
    return r


# -- reporting ------------------------------------------------------------------------------------


def machine(spark: SparkSession) -> dict:
    from importlib.metadata import version

    mem_kb = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:")
    )
    return {
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kb / 2**20, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "spark": spark.version,
        "delta": version("delta-spark"),
        "master": spark.sparkContext.master,
        "date": time.strftime("%Y-%m-%d"),
    }


def machine_line(m: dict) -> str:
    return (
        f"Machine: {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['platform']}; Python {m['python']}, "
        f"Spark {m['spark']} ({m['master']}), Delta {m['delta']}; {m['date']}."
    )


def table(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = [
        "size",
        "fraction",
        "changed",
        *[label for _, label in METHODS],
        "mint",
        "write",
        "append",
        "a/min(b,b')",
        "a/c",
        "a/d",
        "(mint+append)/a",
    ]
    rows = []
    for r in results:
        rows.append(
            [
                f"{r['size']:,}",
                f"{r['fraction']:g}",
                f"{r['changed']:,}",
                *[f"{r[key]:.2f}" for key, _ in METHODS],
                *[f"{r[key]:.2f}" for key in STAGES],
                *[f"{r['ratios'][k]:.2f}" for k in ("sink/merge", "sink/overwrite", "sink/floor", "mint+append/sink")],
            ]
        )
    return header, rows


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(x) for x in col) for col in zip(header, *rows)]
    for line in [header, *rows]:
        print("  ".join(x.rjust(w) for x, w in zip(line, widths)))


def markdown(header: list[str], rows: list[list[str]], machine_info: dict, args) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return (
        f"Seconds per method (median of {args.repeat} run(s)); a = sink batch (mint + write + append), b = Delta MERGE, "
        "b' = MERGE on a table with deletion vectors, "
        f"c = overwrite, d = bare-Spark difference; {args.partitions} partitions, seed {args.seed}.\n\n"
        + "\n".join(lines)
        + "\n\n"
        + machine_line(machine_info)
        + "\n"
    )


def chart(path: Path, results: list[dict], fractions: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fractions), figsize=(5 * len(fractions), 4), sharey=True, squeeze=False)
    for ax, f in zip(axes[0], fractions):
        rs = sorted((r for r in results if r["fraction"] == f), key=lambda r: r["size"])
        for key, label in METHODS:
            ax.plot([r["size"] for r in rs], [r[key] for r in rs], marker="o", label=label)
        ax.set_xscale("log")
        ax.set_title(f"{f:g} of the rows change")
        ax.set_xlabel("rows (before)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("seconds")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the two modes --------------------------------------------------------------------------------


def run_size(
    spark: SparkSession, store, root: Path, label: str, n: int, fractions: list[float], repeat: int, args
) -> list[dict]:
    """Every fraction of one size: the snapshots, then ``repeat`` runs of a, b, c, d; medians."""
    data = root / label
    before = str(data / "before")
    generate(spark.range(n), args.seed).write.parquet(before)
    results = []
    for fi, f in enumerate(fractions):
        changes = round(f * n)
        after = str(data / f"after_{fi}")
        change(spark, spark.read.parquet(before), args.seed, f"f{f}", changes, n).write.parquet(after)
        runs = []
        for rep in range(repeat):
            name = f"{label}_f{fi}_r{rep}"
            (root / name).mkdir()
            r = run_once(spark, store, root / name, name, before, after, changes, args.partitions)
            r = {k: round(v, 3) for k, v in r.items()}
            runs.append(r)
            print(
                f"{label} N={n:,} f={f:g} run {rep + 1}: sink {r['sink_s']:.2f}s (mint {r['mint_s']:.2f}, "
                f"write {r['write_s']:.2f}, append {r['append_s']:.2f})  MERGE {r['merge_s']:.2f}s  "
                f"MERGE+DV {r['merge_dv_s']:.2f}s  "
                f"overwrite {r['overwrite_s']:.2f}s  floor {r['floor_s']:.2f}s  [same contents]",
                flush=True,
            )
        med = {k: round(statistics.median(run[k] for run in runs), 3) for k in (*[k for k, _ in METHODS], *STAGES)}
        results.append(
            {
                "size": n,
                "fraction": f,
                "changed": changes,
                "sink_updates": runs[0]["updates"],
                **med,
                "ratios": {
                    "sink/merge": round(med["sink_s"] / min(med["merge_s"], med["merge_dv_s"]), 3),
                    "sink/overwrite": round(med["sink_s"] / med["overwrite_s"], 3),
                    "sink/floor": round(med["sink_s"] / med["floor_s"], 3),
                    "mint+append/sink": round((med["mint_s"] + med["append_s"]) / med["sink_s"], 3),
                },
                "runs": runs,
            }
        )
        shutil.rmtree(after, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    return results


def run_main(spark: SparkSession, store, root: Path, args) -> list[dict]:
    fractions = [float(x) for x in args.fractions.split(",")]
    # Untimed warm-up on a small table, so that the first timed run of each method does not
    # pay for loading and compiling its code paths in the JVM.
    run_size(spark, store, root, "warmup", WARMUP_ROWS, fractions[-1:], 1, args)
    results = []
    for n in [int(x) for x in args.sizes.split(",")]:
        results += run_size(spark, store, root, f"bench_n{n}", n, fractions, args.repeat, args)
    return results


def nearest(batches: int, targets=(1, 50, 100, 200)) -> list[int]:
    picked = [min(range(1, batches + 1), key=lambda b: abs(b - t)) for t in targets]
    return sorted(set(picked))


def run_flat(spark: SparkSession, store, root: Path, args) -> dict:
    from reconcile.sink.compact import run_compact

    modes = {"off": None, "on": {"history_hours": 0}}
    current = str(root / "desired_0")
    generate(spark.range(args.size), args.seed).write.parquet(current)
    cfgs = {m: sink_config(root, f"flat_{m}", current, args.partitions, ret) for m, ret in modes.items()}
    load = {m: round(sink_batch(spark, store, cfg, 0)["sink_s"], 3) for m, cfg in cfgs.items()}
    print(
        f"loaded {args.size:,} rows: "
        + ", ".join(f"compaction {m} {s:.2f}s" for m, s in load.items())
        + f"; then {args.batches} batches of {args.batch_changes} changes (seconds per batch, compaction off / on)",
        flush=True,
    )

    inserts = split(args.batch_changes)[1]
    costs: dict[str, list[dict]] = {m: [] for m in modes}
    compactions = []
    for b in range(1, args.batches + 1):
        desired = str(root / f"desired_{b}")
        nxt = change(
            spark,
            spark.read.parquet(current),
            args.seed,
            f"batch{b}",
            args.batch_changes,
            args.size + (b - 1) * inserts,
        )
        nxt.write.parquet(desired)
        shutil.rmtree(current, ignore_errors=True)
        current = desired
        line = f"batch {b}:"
        for m, ret in modes.items():
            cfgs[m] = sink_config(root, f"flat_{m}", current, args.partitions, ret)
            r = {k: round(v, 3) for k, v in sink_batch(spark, store, cfgs[m], b).items()}
            costs[m].append({"batch": b, **r})
            line += f"  {m} {r['sink_s']:.2f}s"
            if ret is not None and b % args.compact_every == 0:
                t = time.perf_counter()
                c = run_compact(spark, store, cfgs[m])
                seconds = time.perf_counter() - t
                compactions.append(
                    {"after_batch": b, "seconds": round(seconds, 3), "outcome": c.outcome, "message": c.message}
                )
                line += f" (+ compaction {seconds:.2f}s: {c.outcome})"
        print(line, flush=True)

    final = spark.read.parquet(current)
    problems = [p for cfg in cfgs.values() for p in sink_problems(spark, store, cfg, args.batches, {"desired": final})]
    if problems:
        raise Mismatch("; ".join(problems))
    print(f"both shards hold the last snapshot ({final.count():,} rows, every count 1)")

    def batch_cost(m: str, b: int) -> float:
        return costs[m][b - 1]["sink_s"]

    window = min(5, args.batches)
    summary = {}
    for m in modes:
        totals = [c["sink_s"] for c in costs[m]]
        summary[m] = {
            "batch_cost_s": {str(b): batch_cost(m, b) for b in nearest(args.batches)},
            "last_over_first": round(batch_cost(m, args.batches) / batch_cost(m, 1), 3),
            "last_over_first_median5": round(
                statistics.median(totals[-window:]) / statistics.median(totals[:window]), 3
            ),
            "mean_s": round(statistics.mean(totals), 3),
        }
    return {"load_s": load, "summary": summary, "compactions": compactions, "batches": costs}


def flat_chart(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for m, costs in result["batches"].items():
        ax.plot([c["batch"] for c in costs], [c["sink_s"] for c in costs], label=f"compaction {m}")
    for c in result["compactions"]:
        ax.axvline(c["after_batch"], color="grey", alpha=0.2, linewidth=0.8)
    ax.set_xlabel("batch (grey: compaction after it)")
    ax.set_ylabel("seconds (mint + write + append)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report_flat(result: dict, args) -> None:
    print("batch cost (s):")
    for m, s in result["summary"].items():
        costs = "  ".join(f"#{b} {v:.2f}" for b, v in s["batch_cost_s"].items())
        print(
            f"  compaction {m:3}: {costs}  last/first {s['last_over_first']:.2f} "
            f"(median of last/first {min(5, args.batches)}: {s['last_over_first_median5']:.2f})"
        )
    if result["compactions"]:
        secs = [c["seconds"] for c in result["compactions"]]
        print(
            f"compactions: {len(secs)}, {statistics.median(secs):.2f}s median, {max(secs):.2f}s max, "
            f"outcomes {sorted({c['outcome'] for c in result['compactions']})}"
        )


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and the local Spark JVM (with its children): a
    batch's work, much less disturbed than wall time by other processes sharing the cores."""
    import psutil

    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run_checksum_cost(spark: SparkSession, store, root: Path, args) -> dict:
    """The query sink's load and change batches with the self-checks off and on, alternating."""
    from reconcile import checksums
    from reconcile.sink.check import verify_checksums
    from reconcile.storage.delta import ShardTable

    n, changes = args.size, round(args.fraction * args.size)
    before, after = str(root / "before"), str(root / "after")
    generate(spark.range(n), args.seed).write.parquet(before)
    change(spark, spark.read.parquet(before), args.seed, "ck", changes, n).write.parquet(after)
    expected = 2 * split(changes)[0] + sum(split(changes)[1:])
    runs: list[dict] = []
    verify_s = []
    for rnd in range(args.repeat + 1):  # round 0 warms the JVM up, not reported
        for mode in ("off", "on") if rnd % 2 else ("on", "off"):
            checksums.ENABLED = mode == "on"
            name = f"ck_{mode}_{rnd}"
            c0 = cpu_seconds()
            load = sink_batch(spark, store, sink_config(root, name, before, args.partitions), 0)
            c1 = cpu_seconds()
            cfg = sink_config(root, name, after, args.partitions)
            batch = sink_batch(spark, store, cfg, 1)
            load["cpu_s"], batch["cpu_s"] = c1 - c0, cpu_seconds() - c1
            if batch["updates"] != expected:
                raise Mismatch(f"{name}: the correction has {batch['updates']} rows, expected {expected}")
            if mode == "on":
                t = time.perf_counter()
                lines, counts = verify_checksums(store, cfg, spark)
                if lines or counts["verified"] != 2:
                    raise Mismatch(f"{name}: check --verify found {lines[:3]} ({counts})")
                if rnd:
                    verify_s.append(round(time.perf_counter() - t, 3))
            checksums.ENABLED = True
            shutil.rmtree(ShardTable(cfg).path, ignore_errors=True)
            if rnd:
                runs.append(
                    {
                        "round": rnd,
                        "mode": mode,
                        **{f"load_{k}": round(v, 3) for k, v in load.items() if k.endswith("_s")},
                        **{k: round(v, 3) for k, v in batch.items() if k.endswith("_s")},
                    }
                )
                r = runs[-1]
                print(
                    f"round {rnd} checksums {mode:3}: load {r['load_sink_s']:.2f}s (write {r['load_write_s']:.2f}, "
                    f"CPU {r['load_cpu_s']:.2f}), {args.fraction:g} change {r['sink_s']:.2f}s (write "
                    f"{r['write_s']:.2f}, CPU {r['cpu_s']:.2f})",
                    flush=True,
                )
    med = {
        mode: {
            k: round(statistics.median(r[k] for r in runs if r["mode"] == mode), 3)
            for k in ("load_sink_s", "load_write_s", "load_cpu_s", "sink_s", "write_s", "cpu_s")
        }
        for mode in ("off", "on")
    }
    ratios = {k: round(med["on"][k] / med["off"][k], 3) for k in med["on"]}
    return {
        "size": n,
        "fraction": args.fraction,
        "changed": changes,
        "repeat": args.repeat,
        "median": med,
        "on_over_off": ratios,
        "verify_s": verify_s,
        "runs": runs,
    }


def report_checksum_cost(cost: dict) -> None:
    med, ratio = cost["median"], cost["on_over_off"]
    print(f"medians of {cost['repeat']} round(s), seconds (checksums off / on, on/off):")
    for k, label in (
        ("load_sink_s", "load batch"),
        ("load_write_s", "  its write"),
        ("load_cpu_s", "  its CPU seconds"),
        ("sink_s", f"{cost['fraction']:g} change batch"),
        ("write_s", "  its write"),
        ("cpu_s", "  its CPU seconds"),
    ):
        print(f"  {label:20} {med['off'][k]:7.2f} {med['on'][k]:7.2f}  {ratio[k]:.3f}")
    if cost["verify_s"]:
        print(f"check --verify of the 2-batch shard: {statistics.median(cost['verify_s']):.2f}s median")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000,4000000")
    ap.add_argument("--fractions", default="0.001,0.01,0.1")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "out"))
    ap.add_argument("--flat", action="store_true", help="many small batches, compaction off and on")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--batch-changes", type=int, default=1000)
    ap.add_argument("--compact-every", type=int, default=10)
    ap.add_argument("--checksum-cost", action="store_true", help="a batch with and without its self-checks")
    ap.add_argument("--fraction", type=float, default=0.01, help="--checksum-cost: the timed batch's change")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="bench-reconcile-"))
    os.environ["RECONCILE_WAREHOUSE"] = str(root / "warehouse")
    from reconcile.spark import get_session
    from reconcile.storage.ledger import Ledger

    t0 = time.perf_counter()
    spark = get_session("bench-reconcile", {"spark.sql.shuffle.partitions": str(args.partitions)})
    session_start = time.perf_counter() - t0
    store = Ledger(f"sqlite:///{root / 'metadata.db'}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine(spark)
    try:
        if args.checksum_cost:
            cost = run_checksum_cost(spark, store, root, args)
        elif args.flat:
            result = run_flat(spark, store, root, args)
        else:
            results = run_main(spark, store, root, args)
    except Mismatch as exc:
        print(f"CONTENTS DIFFER: {exc}\n(temporary files kept in {root})", file=sys.stderr)
        return 1
    except BaseException:
        print(f"(temporary files kept in {root})", file=sys.stderr)
        raise
    finally:
        store.dispose()

    common = {
        "session_start_s": round(session_start, 3),
        "partitions": args.partitions,
        "seed": args.seed,
        "machine": info,
    }
    print(f"Spark session start {session_start:.1f}s (not counted)")
    if args.checksum_cost:
        report_checksum_cost(cost)
        (out / "reconcile_checksum_cost.json").write_text(json.dumps({**common, **cost}, indent=2))
    elif args.flat:
        report_flat(result, args)
        (out / "reconcile_flat.json").write_text(
            json.dumps(
                {
                    "size": args.size,
                    "batches": args.batches,
                    "batch_changes": args.batch_changes,
                    "compact_every": args.compact_every,
                    **common,
                    **result,
                },
                indent=2,
            )
        )
        flat_chart(out / "reconcile_flat.png", result)
    else:
        header, rows = table(results)
        print_table(header, rows)
        (out / "reconcile_bench.json").write_text(
            json.dumps({"repeat": args.repeat, **common, "results": results}, indent=2)
        )
        chart(out / "reconcile_bench.png", results, [float(x) for x in args.fractions.split(",")])
        (out / "BENCHMARKS.table.md").write_text(markdown(header, rows, info, args))
    print(machine_line(info))
    print(f"results in {out}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Query and upsert sinks against what a user would do instead: one command, one JSON, one chart.

    python bench/alternatives.py [--cells all] [--repeat 3] [--budget-min 60] [--out bench/results]
                                 [--scale 1] [--seed 1] [--partitions P]

One SparkSession sized for the machine (:mod:`reconcile.spark`: the driver's heap from the
memory, shuffle tasks from the cores), the same for every method; the sinks get as many hash
partitions as the session has shuffle tasks. An untimed warm-up runs every method on tiny data
first. Data and checks: :mod:`workload`.

Query cells (``query-1m-1%``, ``query-10m-0.1%``, ``query-10m-1%``): a Delta table holds the
"before" snapshot; each method brings it to the "after" snapshot (Parquet, immutable):

- ``sink``: one batch of a ``query`` sink (``SELECT * FROM desired``): mint + write + append;
- ``overwrite``: a full overwrite of the table with the snapshot (what a dbt user does);
- ``merge`` / ``merge_dv``: Delta MERGE of the full snapshot (update the ids whose columns differ,
  insert the new ids, ``WHEN NOT MATCHED BY SOURCE THEN DELETE``), into a table without and with
  deletion vectors;
- ``expert``: the change set first (the snapshot's and the table's ``(id, row hash)`` joined on
  the key, the ids whose hash differs or is missing on one side; then the snapshot's rows of
  those ids, deletes as bare ids), materialized once, then MERGEd into a table with deletion
  vectors without a NOT MATCHED BY SOURCE clause, ``merge.materializeSource=none`` (the change set
  is already materialized: Delta need not copy it again);
- ``floor``: a physical floor by its parts, a reference line and not a target: the scan and
  hash of the snapshot into Spark's ``noop`` sink, the narrow read of a stored ``(id, hash)``
  per table row (a Parquet file prepared beforehand), and the write of as many rows of the
  table's schema as the change's correction holds (from memory, as Parquet).

Every table starts as a copy of one plain Delta write of "before" (the same files for every
MERGE; with deletion vectors switched on for ``merge_dv`` and ``expert``), set up untimed.

Upsert cells (``upsert-<keys>-<commands>[-local]``): per table size, batch 0 loads every key;
then each cell's batches (``--batches``, default 3) of ``commands`` commands, spread over every key
or (``-local``) on the most recent 5%; every method applies each batch:

- ``sink``: one batch of an ``upsert`` sink over the whole feed (it selects the interval itself);
- ``merge`` / ``merge_dv``: the interval's commands, the latest per key by a window
  (``row_number`` over ts, off), MERGEd with DELETE / UPDATE / INSERT clauses, into a table
  without and with deletion vectors;
- ``expert``: the latest command per key by an aggregate (``max`` of a struct led by ts, off;
  a sort aggregate with a partial aggregate before the shuffle: Spark hash-aggregates no struct),
  MERGEd into a table with deletion vectors, ``merge.materializeSource=none`` (the feed is
  immutable Parquet).

Incremental cells (``incremental-filter-10m-0.1%``, ``incremental-group-10m-0.1%``; ``--rows``
sets their source's rows): one run each of bench/incremental.py's :func:`incremental.measure`,
projection + filter and GROUP BY (10k groups): a query sink over a Delta source with its change
feed, its batch after an UPDATE of 0.1% of the rows against a plain overwrite, the incremental
MERGE a dbt user writes by hand over the change feed and (GROUP BY) the same sink comparing in
full; a batch with no change. A warm-up of each shape (on 2,000 rows) first; not in the chart.

Initial loads, per kind and size: the sink's first batch (every query repeat has one), a plain
Delta write, and ``merge_dv`` into an empty table with deletion vectors.

Order: within a cell's repeat (a query) or batch (an upsert), the methods run in an order
rotated from repeat to repeat and cell to cell; each run records its order. Budget: every cell
runs once; further query repeats (up to ``--repeat``) run round by round while the time left
(``--budget-min`` from the start, 0: none) holds another repeat of that cell as long as its
longest one so far; the JSON says how many ran.

Checks (any failure exits non-zero): after every query repeat, every method's table and the
sink's content (read as of its upper - 1, each row with its count) equal the "after" snapshot
(:func:`workload.compare`: exceptAll both ways and the counts, in one pass), the sink's log
holds no error, and its correction holds 2 x updates + inserts + deletes rows; after each upsert
table size, every table and the sink's content equal the feed's last state (each key's latest
command unless a delete, computed from the whole feed). The floor's change file holds as many
rows as the correction.

Report: medians; for the query cells the sink's seconds over the fastest of overwrite and every
MERGE, for the upsert cells the sink's commands per second over the best MERGE's, the initial
loads, key locality (the sink's 10k-command batch at 10M keys over the same at 1M), each
against the targets (met / not met). Writes ``<out>/alternatives.json``,
``<out>/alternatives.png`` and ``<out>/alternatives.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from workload import (
    AS_OF,
    COLUMNS,
    ROOT,
    SCHEMA,
    UPSERT_COLUMNS,
    UPSERT_SCHEMA,
    WIDTH,
    Mismatch,
    change,
    checked,
    commands,
    compare,
    correction_size,
    generate,
    latest_state,
    machine,
    machine_line,
    problems_of,
    query_sink,
    sink_batch,
    sink_contents,
    start,
    timed,
    upsert_sink,
)

QUERY_METHODS = ["sink", "overwrite", "merge", "merge_dv", "expert", "floor"]
UPSERT_METHODS = ["sink", "merge", "merge_dv", "expert"]
LOAD_METHODS = ["sink", "plain_write", "merge_dv"]
ALTERNATIVES = {"query": ["overwrite", "merge", "merge_dv", "expert"], "upsert": ["merge", "merge_dv", "expert"]}
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
LOCAL_SHARE = 0.05  # key locality: commands on the most recent 5% of keys


@dataclass(frozen=True)
class Cell:
    name: str
    kind: str  # query, upsert
    size: int  # rows of "before" / keys
    fraction: float = 0.0  # query: rows changed
    commands: int = 0  # upsert: commands per batch
    local: bool = False  # upsert: on the most recent keys
    shape: str = ""  # incremental: filter, group


CELLS = [
    Cell("query-1m-1%", "query", 1_000_000, fraction=0.01),
    Cell("query-10m-0.1%", "query", 10_000_000, fraction=0.001),
    Cell("query-10m-1%", "query", 10_000_000, fraction=0.01),
    Cell("upsert-1m-10k", "upsert", 1_000_000, commands=10_000),
    Cell("upsert-1m-100k", "upsert", 1_000_000, commands=100_000),
    Cell("upsert-1m-10k-local", "upsert", 1_000_000, commands=10_000, local=True),
    Cell("upsert-10m-10k", "upsert", 10_000_000, commands=10_000),
    Cell("upsert-10m-100k", "upsert", 10_000_000, commands=100_000),
    Cell("upsert-10m-10k-local", "upsert", 10_000_000, commands=10_000, local=True),
    Cell("incremental-filter-10m-0.1%", "incremental", 10_000_000, fraction=0.001, shape="filter"),
    Cell("incremental-group-10m-0.1%", "incremental", 10_000_000, fraction=0.001, shape="group"),
]

# the targets: query sink / fastest alternative at most this much, per cell
QUERY_TARGETS = {"query-10m-0.1%": 0.6, "query-10m-1%": 0.8, "query-1m-1%": 1.0}  # issue 47
UPSERT_TARGET = 1.5  # sink commands/s over the best MERGE's, at least
LOAD_TARGET = 1.3  # sink's initial load over a plain Delta write, at most (issues 47, 49)
LOCALITY_TARGET = 1.5  # sink's local 10k batch at 10M keys over the same at 1M keys, at most
# issue 48: an incremental cell's batch over a plain overwrite / the hand MERGE, at most; a batch
# whose source did not change: its write (the Spark part beyond mint and append), seconds
INCREMENTAL_TARGETS = {"filter": {"overwrite": 0.1, "hand_merge": 1.0}, "group": {"overwrite": 0.2}}
NO_CHANGE_TARGET = 2.0
INCREMENTAL_GROUPS = 10_000


def rotated(methods: list[str], shift: int) -> list[str]:
    shift %= len(methods)
    return methods[shift:] + methods[:shift]


def median(xs) -> float:
    return round(statistics.median(xs), 3)


@contextlib.contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str]):
    """``conf`` set on the session for the block, then as it was."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def copy_table(src: str, dst: str) -> str:
    """A Delta table's files and log copied as they are (log paths are relative): the same layout."""
    shutil.copytree(src, dst)
    return dst


def enable_deletion_vectors(spark: SparkSession, path: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")


def empty_dv_table(spark: SparkSession, path: str, schema) -> str:
    ddl = ", ".join(f"`{n}` {t}" for n, t, _ in schema)
    spark.createDataFrame([], ddl).write.format("delta").save(path)
    enable_deletion_vectors(spark, path)
    return path


def row_hash(columns: list[str]) -> F.Column:
    """A 64-bit hash of a row's values and of which of them are null (Spark's hashes skip nulls)."""
    return F.xxhash64(*[F.col(c) for c in columns], *[F.isnull(c) for c in columns])


def values_of(columns: list[str]) -> dict[str, str]:
    return {c: f"s.`{c}`" for c in columns}


# -- query methods --------------------------------------------------------------------------------


def overwrite(spark: SparkSession, table: str, after: str) -> None:
    spark.read.parquet(after).write.format("delta").mode("overwrite").save(table)


def merge_snapshot(spark: SparkSession, table: str, after: str) -> None:
    """MERGE of the full snapshot, the ids whose columns differ updated (null-safe)."""
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


def query_change_set(spark: SparkSession, table: str, after: str) -> DataFrame:
    """The change from the table to the snapshot, materialized: the snapshot's rows of the ids
    whose row hash differs or that the table lacks (``_op`` 'u'), and the ids only the table
    holds (``_op`` 'd'). Only ``(id, hash)`` pairs are shuffled."""
    values = [c for c in COLUMNS if c != "id"]
    desired = spark.read.parquet(after)
    wanted = desired.select("id", row_hash(values).alias("_hd"))
    held = spark.read.format("delta").load(table).select("id", row_hash(values).alias("_hc"))
    changed = (
        wanted.join(held, "id", "full_outer")
        .where(~F.col("_hd").eqNullSafe(F.col("_hc")))
        .select("id", F.when(F.col("_hd").isNull(), F.lit("d")).otherwise(F.lit("u")).alias("_op"))
        .localCheckpoint()
    )
    upserts = desired.join(F.broadcast(changed.where("_op = 'u'")), "id")
    deletes = changed.where("_op = 'd'")
    return upserts.unionByName(deletes, allowMissingColumns=True).localCheckpoint()


def expert_query(spark: SparkSession, table: str, after: str) -> None:
    from delta.tables import DeltaTable

    source = query_change_set(spark, table, after)
    with session_conf(spark, {MATERIALIZE_SOURCE: "none"}):
        (
            DeltaTable.forPath(spark, table)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedDelete(condition="s._op = 'd'")
            .whenMatchedUpdate(set=values_of([c for c in COLUMNS if c != "id"]))
            .whenNotMatchedInsert(condition="s._op = 'u'", values=values_of(COLUMNS))
            .execute()
        )


def floor_parts(spark: SparkSession, after: str, stored: str, change_rows: DataFrame, out: str) -> dict:
    """The physical floor's parts, each timed: scan + hash of the snapshot, the narrow read of the
    stored hashes, the write of the change."""
    parts = {}
    t = time.perf_counter()
    desired = spark.read.parquet(after)
    desired.select("id", row_hash([c for c in COLUMNS if c != "id"])).write.format("noop").mode("overwrite").save()
    parts["scan_hash_s"] = time.perf_counter() - t
    t = time.perf_counter()
    spark.read.parquet(stored).select("id", "_h").write.format("noop").mode("overwrite").save()
    parts["stored_hash_s"] = time.perf_counter() - t
    t = time.perf_counter()
    change_rows.write.mode("overwrite").parquet(out)
    parts["write_change_s"] = time.perf_counter() - t
    return parts


QUERY_TABLE_METHODS = {
    "overwrite": overwrite,
    "merge": merge_snapshot,
    "merge_dv": merge_snapshot,
    "expert": expert_query,
}


# -- upsert methods -------------------------------------------------------------------------------


def interval(spark: SparkSession, feed: str, batch: int) -> DataFrame:
    lower = AS_OF + batch * WIDTH
    return spark.read.parquet(feed).where((F.col("ts") >= lower) & (F.col("ts") < lower + WIDTH))


def latest_by_window(cmds: DataFrame) -> DataFrame:
    last = Window.partitionBy("id").orderBy(F.desc("ts"), F.desc("off"))
    return cmds.withColumn("_rn", F.row_number().over(last)).where("_rn = 1").drop("_rn")


def latest_by_aggregate(cmds: DataFrame) -> DataFrame:
    """Each key's latest command by a hash aggregate: the max of a struct led by (ts, off)."""
    fields = ["ts", "off", "op", *[c for c in UPSERT_COLUMNS if c != "id"]]
    return cmds.groupBy("id").agg(F.max(F.struct(*fields)).alias("_l")).select("id", "_l.*")


def merge_commands(spark: SparkSession, table: str, latest: DataFrame) -> None:
    from delta.tables import DeltaTable

    values = values_of([c for c in UPSERT_COLUMNS if c != "id"])
    (
        DeltaTable.forPath(spark, table)
        .alias("t")
        .merge(latest.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s.op = 'd'")
        .whenMatchedUpdate(set=values)
        .whenNotMatchedInsert(condition="s.op <> 'd'", values=values_of(UPSERT_COLUMNS))
        .execute()
    )


def merge_upsert(spark: SparkSession, table: str, feed: str, batch: int) -> None:
    merge_commands(spark, table, latest_by_window(interval(spark, feed, batch)))


def expert_upsert(spark: SparkSession, table: str, feed: str, batch: int) -> None:
    with session_conf(spark, {MATERIALIZE_SOURCE: "none"}):
        merge_commands(spark, table, latest_by_aggregate(interval(spark, feed, batch)))


def plain_load(spark: SparkSession, table: str, feed: str, batch: int) -> None:
    state = latest_by_aggregate(interval(spark, feed, batch)).where("op <> 'd'").select(*UPSERT_COLUMNS)
    state.write.format("delta").save(table)


UPSERT_TABLE_METHODS = {"merge": merge_upsert, "merge_dv": merge_upsert, "expert": expert_upsert}


# -- the run --------------------------------------------------------------------------------------


class Bench:
    def __init__(self, spark: SparkSession, ledger, root: Path, args):
        self.spark, self.ledger, self.root, self.args = spark, ledger, root, args
        self.partitions = args.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        self.sizes: dict[int, dict] = {}  # query: per size, the prepared "before" and base tables
        self.loads: list[dict] = []
        self.t0 = time.perf_counter()

    def say(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {text}", flush=True)

    # -- query --------------------------------------------------------------------------------

    def prepare_size(self, n: int, label: str = "") -> dict:
        """The snapshot "before" of ``n`` rows (Parquet), its stored hashes and the base tables; the
        plain write and MERGE+DV into an empty table are timed as this size's initial loads."""
        if n in self.sizes:
            return self.sizes[n]
        spark, data = self.spark, self.root / f"query_{n}"
        before = str(data / "before")
        generate(spark.range(n), self.args.seed).write.parquet(before)
        values = [c for c in COLUMNS if c != "id"]
        stored = str(data / "stored_hashes")
        spark.read.parquet(before).select("id", row_hash(values).alias("_h")).write.parquet(stored)
        base, loads = str(data / "base"), {}
        for m in rotated(["plain_write", "merge_dv"], len(self.sizes)):
            if m == "plain_write":
                loads[m] = timed(lambda: spark.read.parquet(before).write.format("delta").save(base))
            else:
                scratch = empty_dv_table(spark, str(data / "merge_dv_load"), SCHEMA)
                loads[m] = timed(merge_snapshot, spark, scratch, before)
                shutil.rmtree(scratch)
        base_dv = copy_table(base, str(data / "base_dv"))
        enable_deletion_vectors(spark, base_dv)
        prepared = {"before": before, "stored": stored, "base": base, "base_dv": base_dv, "loads": loads}
        if label != "warmup":
            self.sizes[n] = prepared
            self.loads.append({"kind": "query", "size": n, **{f"{k}_s": round(v, 3) for k, v in loads.items()}})
        return prepared

    def prepare_cell(self, cell: Cell, n: int, label: str) -> dict:
        spark = self.spark
        size = self.prepare_size(n, label)
        changes = round(cell.fraction * n)
        after = str(self.root / f"{label}_after")
        change(spark, spark.read.parquet(size["before"]), self.args.seed, label, changes, n).write.parquet(after)
        rows = correction_size(changes)
        change_rows = generate(spark.range(rows), self.args.seed + 1).cache()
        change_rows.count()
        return {**size, "size": n, "after": after, "changes": changes, "correction": rows, "change_rows": change_rows}

    def query_repeat(self, cell: Cell, prep: dict, label: str, rep: int, shift: int) -> dict:
        """One repeat of a query cell: fresh tables (untimed, but the sink's first batch is an
        initial load), every method timed in a rotated order, then the check."""
        spark, work = self.spark, self.root / f"{label}_r{rep}"
        work.mkdir(parents=True)
        t_repeat = time.perf_counter()
        tables = {
            m: copy_table(prep["base_dv" if m in ("merge_dv", "expert") else "base"], str(work / m))
            for m in QUERY_TABLE_METHODS
        }
        name = f"{label.replace('-', '_').replace('%', 'pct').replace('.', '_')}_r{rep}"
        load = sink_batch(spark, self.ledger, query_sink(work, name, prep["before"], self.partitions), 0)
        cfg = query_sink(work, name, prep["after"], self.partitions)
        order = rotated(QUERY_METHODS, shift)
        run: dict = {"repeat": rep, "order": order, "sink_load_s": round(load["sink_s"], 3)}
        for m in order:
            if m == "sink":
                b = sink_batch(spark, self.ledger, cfg, 1)
                run.update({k: round(v, 3) for k, v in b.items() if k.endswith("_s")}, sink_updates=b["updates"])
            elif m == "floor":
                parts = floor_parts(spark, prep["after"], prep["stored"], prep["change_rows"], str(work / "floor"))
                run.update({f"floor_{k}": round(v, 3) for k, v in parts.items()})
                run["floor_s"] = round(sum(parts.values()), 3)
            else:
                run[f"{m}_s"] = round(timed(QUERY_TABLE_METHODS[m], spark, tables[m], prep["after"]), 3)
        t_check = time.perf_counter()
        sink_rows, errors = sink_contents(spark, self.ledger, cfg, 1)
        read = spark.read.format("delta").load
        result = compare(
            spark.read.parquet(prep["after"]), {"sink": sink_rows, **{m: read(t) for m, t in tables.items()}}, COLUMNS
        )
        problems = problems_of(result)
        if errors:
            problems.append(f"the sink's log holds {errors} error updates")
        floor_rows = spark.read.parquet(str(work / "floor")).count()
        for what, got in (("the sink's correction", run["sink_updates"]), ("the floor's change", floor_rows)):
            if got != prep["correction"]:
                problems.append(f"{what} has {got} rows, expected {prep['correction']}")
        if problems:
            raise Mismatch(f"{label} repeat {rep}: " + "; ".join(problems))
        run["check"] = {"same_contents": True, "seconds": round(time.perf_counter() - t_check, 3), "tables": result}
        run["repeat_s"] = round(time.perf_counter() - t_repeat, 3)
        shutil.rmtree(work, ignore_errors=True)
        from reconcile.storage.delta import ShardTable

        shutil.rmtree(ShardTable(cfg).path, ignore_errors=True)
        times = "  ".join(f"{m} {run[m + '_s']:.2f}" for m in order)
        self.say(
            f"{label} repeat {rep + 1}: {times}  (load {run['sink_load_s']:.2f}; check {run['check']['seconds']:.1f}s: same contents)"
        )
        return run

    # -- upsert -------------------------------------------------------------------------------

    def upsert_size(
        self, keys: int, cells: list[Cell], label: str, first_shift: int, batches: int
    ) -> tuple[list[dict], dict]:
        """One table size: the initial loads (timed), then every cell's batches through every
        method, then the check of every table against the feed's last state."""
        spark, args = self.spark, self.args
        work = self.root / f"{label}_{keys}"
        work.mkdir(parents=True)
        feed = str(work / "feed")
        commands(spark, keys, 0, keys, args.seed).write.parquet(feed)
        cfg = upsert_sink(work, f"{label.replace('-', '_')}_{keys}", feed, self.partitions)
        tables = {m: str(work / m) for m in UPSERT_TABLE_METHODS}
        base = str(work / "base")
        loads: dict = {}
        for m in rotated(LOAD_METHODS, first_shift):
            if m == "sink":
                loads["sink_s"] = round(sink_batch(spark, self.ledger, cfg, 0)["sink_s"], 3)
            elif m == "plain_write":
                loads["plain_write_s"] = round(timed(plain_load, spark, base, feed, 0), 3)
            else:
                scratch = empty_dv_table(spark, str(work / "merge_dv_load"), UPSERT_SCHEMA)
                loads["merge_dv_s"] = round(timed(merge_upsert, spark, scratch, feed, 0), 3)
                shutil.rmtree(scratch)
        for m, path in tables.items():
            copy_table(base, path)
            if m != "merge":
                enable_deletion_vectors(spark, path)
        self.say(f"{label} {keys:,} keys: initial loads " + ", ".join(f"{k[:-2]} {v:.2f}s" for k, v in loads.items()))

        done, b = [], 1
        for cell in cells:
            count = cell.commands
            lo = int(keys * (1 - LOCAL_SHARE)) if cell.local else 0
            for i in range(batches):
                commands(spark, keys, b, count, args.seed, lo).write.mode("append").parquet(feed)
                order = rotated(UPSERT_METHODS, first_shift + b)
                row: dict = {"cell": cell.name, "batch": b, "commands": count, "order": order}
                for m in order:
                    if m == "sink":
                        r = sink_batch(spark, self.ledger, cfg, b)
                        row.update(sink_s=round(r["sink_s"], 3), sink_updates=r["updates"])
                    else:
                        row[f"{m}_s"] = round(timed(UPSERT_TABLE_METHODS[m], spark, tables[m], feed, b), 3)
                done.append(row)
                self.say(
                    f"{cell.name} batch {i + 1} ({count:,} commands): "
                    + "  ".join(f"{m} {row[m + '_s']:.2f}" for m in order)
                )
                b += 1

        t_check = time.perf_counter()
        sink_rows, errors = sink_contents(spark, self.ledger, cfg, b - 1)
        read = spark.read.format("delta").load
        expected = latest_state(spark.read.parquet(feed))
        result = compare(expected, {"sink": sink_rows, **{m: read(t) for m, t in tables.items()}}, UPSERT_COLUMNS)
        problems = problems_of(result) + ([f"the sink's log holds {errors} error updates"] if errors else [])
        if problems:
            raise Mismatch(f"upsert {keys:,} keys: " + "; ".join(problems))
        check = {"same_contents": True, "seconds": round(time.perf_counter() - t_check, 3), "tables": result}
        self.say(f"upsert {keys:,} keys: every table holds the feed's last state ({result['sink']['rows']:,} rows)")
        shutil.rmtree(work, ignore_errors=True)
        if label != "warmup":
            self.loads.append({"kind": "upsert", "size": keys, **loads})
        return done, check

    # -- plan ---------------------------------------------------------------------------------

    def warm_up(self) -> float:
        """Every method once on tiny data (not reported): the JVM loads and compiles their code."""
        t = time.perf_counter()
        cell = Cell("warmup", "query", 2000, fraction=0.05)
        prep = self.prepare_cell(cell, 2000, "warmup")
        self.query_repeat(cell, prep, "warmup", 0, 0)
        prep["change_rows"].unpersist()
        self.upsert_size(1000, [Cell("warmup", "upsert", 1000, commands=100)], "warmup", 0, 1)
        shutil.rmtree(self.root / "query_2000", ignore_errors=True)
        return round(time.perf_counter() - t, 3)

    def run(self, cells: list[Cell]) -> dict:
        args = self.args
        warmup_s = self.warm_up()
        self.say(f"warm-up done ({warmup_s:.1f}s, not reported)")
        query = [c for c in cells if c.kind == "query"]
        upsert = [c for c in cells if c.kind == "upsert"]
        incremental = [c for c in cells if c.kind == "incremental"]
        preps = {}
        runs: dict[str, list[dict]] = {c.name: [] for c in query}
        skipped: dict[str, int] = {}
        budget = args.budget_min * 60

        def query_round(rep: int) -> None:
            for i, cell in enumerate(query):
                if rep and budget:
                    left = budget - (time.perf_counter() - self.t0)
                    if max(r["repeat_s"] for r in runs[cell.name]) > left:
                        skipped[cell.name] = skipped.get(cell.name, 0) + 1
                        self.say(f"{cell.name}: repeat {rep + 1} skipped ({left:.0f}s of the budget left)")
                        continue
                if cell.name not in preps:
                    preps[cell.name] = self.prepare_cell(cell, cell.size, cell.name)
                runs[cell.name].append(self.query_repeat(cell, preps[cell.name], cell.name, rep, rep + i))

        query_round(0)
        upsert_rows, upsert_checks = [], []
        for i, keys in enumerate(sorted({c.size for c in upsert})):
            mine = [c for c in upsert if c.size == keys]
            rows, check = self.upsert_size(keys, mine, "upsert", i, args.batches)
            upsert_rows += rows
            upsert_checks.append({"keys": keys, **check})
        incremental_rows = self.incremental_cells(incremental)
        for rep in range(1, args.repeat):
            query_round(rep)
        for p in preps.values():
            p["change_rows"].unpersist()
        for load in self.loads:  # a query sink's first batch: one per repeat of each cell of that size
            if load["kind"] == "query":
                samples = [r["sink_load_s"] for c in query if c.size == load["size"] for r in runs[c.name]]
                load["sink_s"] = median(samples)
        return {
            "warmup_s": warmup_s,
            "query": [query_result(c, preps[c.name], runs[c.name], skipped.get(c.name, 0)) for c in query],
            "upsert": [upsert_result(c, [r for r in upsert_rows if r["cell"] == c.name]) for c in upsert],
            "upsert_checks": upsert_checks,
            "incremental": incremental_rows,
            "loads": self.loads,
        }

    def incremental_cells(self, cells: list[Cell]) -> list[dict]:
        """bench/incremental.py's runs, one a cell, after a warm-up of each shape (not reported)."""
        from incremental import WARMUP_ROWS, failures, line, measure

        t = time.perf_counter()
        for shape in dict.fromkeys(c.shape for c in cells):
            measure(self.spark, self.ledger, self.root / f"incr_warmup_{shape}", shape, WARMUP_ROWS, 0.01, 100)
        if cells:
            self.say(f"incremental warm-up done ({time.perf_counter() - t:.1f}s, not reported)")
        out = []
        for i, cell in enumerate(cells):
            rows = self.args.rows or cell.size
            work = self.root / f"incr_{i}"
            run = measure(self.spark, self.ledger, work, cell.shape, rows, cell.fraction, INCREMENTAL_GROUPS)
            failed = failures(run)
            if failed:
                raise Mismatch(f"{cell.name}: " + "; ".join(failed))
            self.say(f"{cell.name}: " + line(run))
            out.append({"cell": cell.name, **{k: v for k, v in run.items() if k != "machine"}})
            shutil.rmtree(work, ignore_errors=True)
        return out


# -- results --------------------------------------------------------------------------------------


def query_result(cell: Cell, prep: dict, runs: list[dict], skipped: int) -> dict:
    keys = [f"{m}_s" for m in QUERY_METHODS] + ["mint_s", "write_s", "append_s", "sink_load_s"]
    keys += [k for k in runs[0] if k.startswith("floor_") and k != "floor_s"]
    med = {k: median(r[k] for r in runs) for k in keys}
    best = min(ALTERNATIVES["query"], key=lambda m: med[f"{m}_s"])
    return {
        "cell": cell.name,
        "size": prep["size"],
        "fraction": cell.fraction,
        "changed": prep["changes"],
        "correction": prep["correction"],
        "repeats": len(runs),
        "repeats_skipped_for_budget": skipped,
        "median": med,
        "best_alternative": best,
        "sink_over_best": round(med["sink_s"] / med[f"{best}_s"], 3),
        "sink_over_floor": round(med["sink_s"] / med["floor_s"], 3),
        "runs": runs,
    }


def upsert_result(cell: Cell, rows: list[dict]) -> dict:
    med = {f"{m}_s": median(r[f"{m}_s"] for r in rows) for m in UPSERT_METHODS}
    count = rows[0]["commands"]
    rate = {m: round(count / med[f"{m}_s"]) for m in UPSERT_METHODS}
    best = max(ALTERNATIVES["upsert"], key=lambda m: rate[m])
    return {
        "cell": cell.name,
        "keys": cell.size,
        "commands_per_batch": count,
        "local": cell.local,
        "batches": len(rows),
        "median": med,
        "commands_per_s": rate,
        "best_merge": best,
        "sink_over_best": round(rate["sink"] / rate[best], 3),
        "runs": rows,
    }


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


def targets(result: dict) -> list[dict]:
    """The targets against this run (a target whose cells did not run is left out)."""
    out = []
    for c in result["query"]:
        if c["cell"] in QUERY_TARGETS:
            limit = QUERY_TARGETS[c["cell"]]
            out.append(
                {
                    "target": f"query sink <= {limit}x the fastest of overwrite and every MERGE at {c['cell'][6:]}",
                    "value": c["sink_over_best"],
                    "detail": f"sink {c['median']['sink_s']:.2f} s, {c['best_alternative']} {c['median'][c['best_alternative'] + '_s']:.2f} s",
                    "met": c["sink_over_best"] <= limit,
                }
            )
    if result["upsert"]:
        worst = min(result["upsert"], key=lambda c: c["sink_over_best"])
        out.append(
            {
                "target": f"upsert >= {UPSERT_TARGET}x the best MERGE's throughput in every cell",
                "value": worst["sink_over_best"],
                "detail": f"lowest at {worst['cell']}: "
                + ", ".join(f"{c['cell'][7:]} {c['sink_over_best']:.2f}" for c in result["upsert"]),
                "met": worst["sink_over_best"] >= UPSERT_TARGET,
            }
        )
    if result["loads"]:
        ratios = []
        for load in result["loads"]:
            ratios.append((load["kind"], load["size"], round(load["sink_s"] / load["plain_write_s"], 3)))
        worst_load = max(ratios, key=lambda r: r[2])
        out.append(
            {
                "target": f"initial load <= {LOAD_TARGET}x a plain Delta write, both kinds",
                "value": worst_load[2],
                "detail": ", ".join(f"{k} {n:,}: {r:.2f}" for k, n, r in ratios),
                "met": worst_load[2] <= LOAD_TARGET,
            }
        )
    for c in result["incremental"]:
        for other, limit in INCREMENTAL_TARGETS[c["shape"]].items():
            ratio = round(c["batch"]["sink_s"] / c[f"{other}_s"], 3)
            name = {"overwrite": "plain overwrite", "hand_merge": "hand-written incremental MERGE"}[other]
            out.append(
                {
                    "target": f"{c['cell']}: sink <= {limit}x the {name}",
                    "value": ratio,
                    "detail": f"sink {c['batch']['sink_s']:.2f} s, {name} {c[f'{other}_s']:.2f} s",
                    "met": ratio <= limit,
                }
            )
    if result["incremental"]:
        idle = max(result["incremental"], key=lambda c: c["no_change_batch"]["write_s"])
        out.append(
            {
                "target": f"a batch whose source did not change: <= {NO_CHANGE_TARGET:.0f} s beyond mint and append",
                "value": idle["no_change_batch"]["write_s"],
                "detail": f"highest at {idle['cell']}: batch {idle['no_change_batch']['sink_s']:.2f} s",
                "met": idle["no_change_batch"]["write_s"] <= NO_CHANGE_TARGET,
            }
        )
    local = {c["keys"]: c for c in result["upsert"] if c["local"] and c["cell"].endswith("10k-local")}
    if len(local) == 2:
        small, big = (local[k] for k in sorted(local))
        ratio = round(big["median"]["sink_s"] / small["median"]["sink_s"], 3)
        out.append(
            {
                "target": f"key locality: a 10k-command batch at 10M keys <= {LOCALITY_TARGET}x the same at 1M keys",
                "value": ratio,
                "detail": f"sink {big['median']['sink_s']:.2f} s vs {small['median']['sink_s']:.2f} s (medians)",
                "met": ratio <= LOCALITY_TARGET,
            }
        )
    return out


def markdown(result: dict) -> str:
    def section(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
        if not rows:
            return []
        lines = [title, ""] if title else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]

    run = f"whole run {result['wall_s'] / 60:.1f} min"
    lines = [f"`{result['command']}`; commit {result['commit']}, {result['machine']['date']}; {run}.", ""]
    lines += section(
        "Query cells, seconds (medians of the repeats):",
        ["cell", "repeats", *QUERY_METHODS, "sink / fastest alternative", "sink / floor"],
        [
            [
                c["cell"],
                f"{c['repeats']}"
                + (f" ({c['repeats_skipped_for_budget']} skipped)" if c["repeats_skipped_for_budget"] else ""),
                *[f"{c['median'][m + '_s']:.2f}" for m in QUERY_METHODS],
                f"**{c['sink_over_best']:.2f}** ({c['best_alternative']})",
                f"{c['sink_over_floor']:.2f}",
            ]
            for c in result["query"]
        ],
    )
    lines += section(
        "Upsert cells, commands per second (medians of the batches):",
        ["cell", "batches", *UPSERT_METHODS, "sink / best MERGE"],
        [
            [
                c["cell"],
                str(c["batches"]),
                *[f"{c['commands_per_s'][m]:,}" for m in UPSERT_METHODS],
                f"**{c['sink_over_best']:.2f}** ({c['best_merge']})",
            ]
            for c in result["upsert"]
        ],
    )
    lines += section(
        "Incremental cells (a Delta source and its change feed), seconds (one run each):",
        ["cell", "rows", "changed", "sink", "overwrite", "hand MERGE", "compared in full", "no change"]
        + ["sink / overwrite", "sink / hand MERGE"],
        [
            [
                c["cell"],
                f"{c['rows']:,}",
                f"{c['changed_rows']:,}",
                f"{c['batch']['sink_s']:.2f}",
                f"{c['overwrite_s']:.2f}",
                f"{c['hand_merge_s']:.2f}",
                f"{c['full_comparison_batch']['sink_s']:.2f}" if c["full_comparison_batch"] else "",
                f"{c['no_change_batch']['sink_s']:.2f}",
                f"**{c['batch_over_overwrite']:.2f}**",
                f"**{c['batch_over_hand_merge']:.2f}**",
            ]
            for c in result["incremental"]
        ],
    )
    lines += section(
        "Initial loads, seconds:",
        ["kind", "rows / keys", *LOAD_METHODS],
        [[ld["kind"], f"{ld['size']:,}", *[f"{ld[m + '_s']:.2f}" for m in LOAD_METHODS]] for ld in result["loads"]],
    )
    lines += section(
        "",
        ["target", "this run", "", "detail"],
        [[t["target"], f"{t['value']:.2f}", verdict(t["met"]), t["detail"]] for t in result["targets"]],
    )
    return "\n".join([*lines, machine_line(result["machine"]), ""])


def bars(ax, groups: list[dict], methods: list[str], value, ticks: list[str], title: str, ylabel: str) -> None:
    """One bar per method in each group (``value(group, method)``), groups side by side."""
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, [value(g, m) for g in groups], width, label=m)
    ax.set_xticks(range(len(groups)), ticks, fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, axis="y", alpha=0.3)


def chart(path: Path, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5), gridspec_kw={"width_ratios": [3, 4, 2]})
    query, upsert, loads = result["query"], result["upsert"], result["loads"]
    bars(
        axes[0],
        query,
        [m for m in QUERY_METHODS if m != "floor"],
        lambda c, m: c["median"][m + "_s"],
        [c["cell"][6:] for c in query],
        "query: bring the table to the snapshot",
        "seconds (median)",
    )
    for i, c in enumerate(query):
        label = "floor (reference)" if i == 0 else None
        axes[0].hlines(c["median"]["floor_s"], i - 0.45, i + 0.45, colors="black", linestyles="dashed", label=label)
    bars(
        axes[1],
        upsert,
        UPSERT_METHODS,
        lambda c, m: c["commands_per_s"][m],
        [c["cell"][7:].replace("-local", "\nlocal") for c in upsert],
        "upsert: apply a batch of commands",
        "commands / s (median batch)",
    )
    bars(
        axes[2],
        loads,
        LOAD_METHODS,
        lambda ld, m: ld.get(m + "_s") or 0,
        [f"{ld['kind']}\n{ld['size']:,}" for ld in loads],
        "initial loads",
        "seconds",
    )
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_commit() -> str:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (
        "+dirty" if git("status", "--porcelain", "--", "bench", "include") else ""
    )


def select_cells(spec: str, scale: float) -> list[Cell]:
    """The cells named (or all), their sizes and command counts multiplied by ``scale``."""
    wanted = spec.split(",")
    unknown = set(wanted) - {c.name for c in CELLS} - {"all", "query", "upsert", "incremental"}
    if unknown:
        known = ", ".join(c.name for c in CELLS)
        raise SystemExit(f"unknown cells {sorted(unknown)}; known: all, query, upsert, incremental, {known}")
    return [
        replace(c, size=round(c.size * scale), commands=max(1, round(c.commands * scale)) if c.commands else 0)
        for c in CELLS
        if "all" in wanted or c.name in wanted or c.kind in wanted
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cells", default="all", help="comma-separated cell names, 'query', 'upsert', 'incremental' or 'all'"
    )
    ap.add_argument("--repeat", type=int, default=3, help="query repeats per cell at most (the budget may run fewer)")
    ap.add_argument("--batches", type=int, default=3, help="upsert batches per cell")
    ap.add_argument("--budget-min", type=float, default=60, help="no further query repeat past this (0: none)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every size (a smoke run: 0.01)")
    ap.add_argument("--partitions", type=int, default=0, help="the sinks' hash partitions (default: shuffle tasks)")
    ap.add_argument("--rows", type=int, default=0, help="the incremental cells' source rows (default: 10M x scale)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    cells = select_cells(args.cells, args.scale)

    root, spark, ledger, session_start = start("bench-alternatives-", "bench-alternatives")
    bench = Bench(spark, ledger, root, args)
    info = machine(spark)
    bench.say(
        f"Spark session started in {session_start:.1f}s (driver {info['driver_memory']}, "
        f"{info['shuffle_partitions']} shuffle tasks, sinks {bench.partitions} partitions)"
    )
    result = checked(lambda: bench.run(cells), root, ledger)
    if result is None:
        return 1
    result = {
        "command": "python bench/alternatives.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "commit": git_commit(),
        "machine": info,
        "session_start_s": round(session_start, 3),
        "sink_partitions": bench.partitions,
        "args": vars(args),
        "wall_s": round(time.perf_counter() - bench.t0 + session_start, 1),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        **result,
    }
    result["targets"] = targets(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "alternatives.json").write_text(json.dumps(result, indent=2))
    chart(out / "alternatives.png", result)
    text = markdown(result)
    (out / "alternatives.md").write_text(text)
    print(text)
    print(f"results in {out}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A query sink over a Delta source with a change data feed: a batch from the source's changes
against a plain overwrite and the incremental MERGE a dbt user writes by hand, in one session
(issue 48).

    python bench/incremental.py [--rows 10000000] [--change 0.001] [--query filter|group]
                                [--groups 10000] [--out bench/results]

The source: ``--rows`` rows of bench/workload.py's schema in a Delta table with
``delta.enableChangeDataFeed``; the sink: ``SELECT * FROM src WHERE qty >= 0`` (a projection and a
filter), or with ``--query group`` a GROUP BY of a column ``grp`` added to the source (``--groups``
values, hashed from the id: the changed rows touch groups at random) with count, sum, min and max,
also computed by a second sink that compares in full (``refresh: full``), timed on the same change.
Untimed: a warm-up (all of the below on 2,000 rows, not reported), the source, the sink's first
batch, and the hand MERGE's target: a Delta table (with deletion vectors for the filter's rows)
holding the query's result at the source version that batch read. Then ``--change`` of the rows
are updated in the source (one UPDATE: qty + 1) and timed side by side: the sink's batch (mint +
write + append; its log must say it took the change feed), a plain overwrite of a Delta table with
the query's result, the incremental MERGE a dbt user writes by hand (:func:`hand_merge`) and a
sink batch with no source change. Checks: the sink's content and the hand MERGE's table equal the
query's result after the change (workload.compare). Writes ``<out>/incremental.json``
(``incremental_group.json``). bench/alternatives.py's ``incremental`` cells run :func:`measure`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import (  # noqa: E402
    COLUMNS,
    ROOT,
    compare,
    generate,
    machine,
    machine_line,
    problems_of,
    sink_batch,
    sink_contents,
    start,
)

PREDICATE = "qty >= 0"
SQL = f"SELECT * FROM src WHERE {PREDICATE}"
AGGREGATES = "count(*) AS n, sum(qty) AS qty, min(amount) AS lo, max(amount) AS hi"
GROUP_SQL = f"SELECT grp, {AGGREGATES} FROM src GROUP BY grp"
GROUP_SCHEMA = [("grp", "bigint", True), ("n", "bigint", True), ("qty", "bigint", True)]
GROUP_SCHEMA += [("lo", "decimal(12,2)", True), ("hi", "decimal(12,2)", True)]
GROUP_COLUMNS = [c[0] for c in GROUP_SCHEMA]
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"
WARMUP_ROWS = 2000


class Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--change", type=float, default=0.001)
    ap.add_argument("--query", choices=["filter", "group"], default="filter")
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    root, spark, ledger, _ = start("bench-incremental-", "bench-incremental")
    t0 = time.perf_counter()
    warm = measure(spark, ledger, root / "warmup", args.query, WARMUP_ROWS, args.change, min(args.groups, 100))
    print(f"warm-up on {WARMUP_ROWS:,} rows: {time.perf_counter() - t0:.1f} s (not reported)", flush=True)
    result = measure(spark, ledger, root / "run", args.query, args.rows, args.change, args.groups)
    print(machine_line(result["machine"]))
    print(line(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    group = args.query == "group"
    (out / ("incremental.json" if not group else "incremental_group.json")).write_text(
        json.dumps(result, indent=2, default=str)
    )
    ledger.dispose()
    failed = failures(warm) + failures(result)
    if failed:
        print("CHECK FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def failures(result: dict) -> list[str]:
    """What went wrong in a run: a table unlike the query's result, a batch not from the feed."""
    return result["problems"] + ([] if result["batch_from_the_feed"] else ["the batch did not take the change feed"])


def line(r: dict) -> str:
    """One run in one line."""
    batch, idle, first, compared = r["batch"], r["no_change_batch"], r["first_batch"], r["full_comparison_batch"]
    return (
        f"{r['shape']}: {r['rows']:,} rows, {r['changed_rows']:,} updated: sink batch {batch['sink_s']:.2f} s "
        f"(write {batch['write_s']:.2f}, from the feed: {r['batch_from_the_feed']}), overwrite {r['overwrite_s']:.2f} s: "
        f"{r['batch_over_overwrite']:.3f}x; hand MERGE {r['hand_merge_s']:.2f} s: {r['batch_over_hand_merge']:.3f}x; "
        f"a batch with no change {idle['sink_s']:.2f} s (write {idle['write_s']:.2f}); first batch {first['sink_s']:.2f} s"
        + (
            f"; the same batch compared in full {compared['sink_s']:.2f} s (write {compared['write_s']:.2f})"
            if compared
            else ""
        )
    )


def measure(spark, ledger, root: Path, shape: str, rows: int, change: float, groups: int) -> dict:
    """One run in ``root`` (its own source, sinks and tables): ``shape`` is ``filter`` or ``group``."""
    from pyspark.sql import functions as F

    group = shape == "group"
    sql = GROUP_SQL if group else SQL
    root.mkdir(parents=True, exist_ok=True)
    prefix = "".join(c if c.isalnum() else "_" for c in root.name.lower())
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    src = str(root / "src")
    every = max(1, round(1 / change))
    data = generate(spark.range(rows), 1)
    if group:
        data = data.withColumn("grp", F.pmod(F.xxhash64("id"), F.lit(groups)))
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in data.schema.fields)
    spark.sql(f"CREATE TABLE delta.`{src}` ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    data.write.format("delta").mode("append").save(src)
    incr = yaml_query(root, f"{prefix}_incr", src, parts, sql)
    full = yaml_query(root, f"{prefix}_full", src, parts, sql, refresh="full") if group else None
    said = Said()
    logging.getLogger("reconcile").addHandler(said)
    logging.getLogger("reconcile").setLevel(logging.INFO)
    try:
        first = sink_batch(spark, ledger, incr, 0)
        if full is not None:
            sink_batch(spark, ledger, full, 0)
        read = source_version(spark, src)  # what the first batch read: nothing committed since
        target = str(root / "hand")
        hand_target(spark, src, read, sql, target, vectors=not group)
        spark.sql(f"UPDATE delta.`{src}` SET qty = qty + 1 WHERE pmod(id, {every}) = 7")
        said.lines.clear()
        batch = sink_batch(spark, ledger, incr, 1)
        took_feed = any(line.startswith("incremental: the correction") for line in said.lines)
        compared = sink_batch(spark, ledger, full, 1) if full is not None else None
        spark.read.format("delta").load(src).createOrReplaceTempView("src")
        t0 = time.perf_counter()
        spark.sql(sql).write.format("delta").mode("overwrite").save(str(root / "plain"))
        overwrite = time.perf_counter() - t0
        t0 = time.perf_counter()
        processed = hand_merge(spark, src, target, read, group)
        hand = time.perf_counter() - t0
        said.lines.clear()
        idle = sink_batch(spark, ledger, incr, 2)
        idle_feed = any(line.startswith("incremental: the correction") for line in said.lines)
    finally:
        logging.getLogger("reconcile").removeHandler(said)
    got, _ = sink_contents(spark, ledger, incr, 2)
    spark.read.format("delta").load(src).createOrReplaceTempView("src")
    hand_rows = spark.read.format("delta").load(target)
    checked = compare(spark.sql(sql), {"sink": got, "hand_merge": hand_rows}, GROUP_COLUMNS if group else COLUMNS)
    problems = problems_of(checked)
    if processed != read + 1:
        problems.append(f"hand MERGE: processed up to version {processed}, the change is version {read + 1}")
    return {
        "machine": machine(spark),
        "shape": shape,
        "query": sql,
        "rows": rows,
        "groups": groups if group else None,
        "changed_rows": rows // every,
        "first_batch": first,
        "batch": batch,
        "batch_from_the_feed": took_feed,
        "overwrite_s": overwrite,
        "batch_over_overwrite": batch["sink_s"] / overwrite,
        "hand_merge_s": hand,
        "batch_over_hand_merge": batch["sink_s"] / hand,
        "full_comparison_batch": compared,
        "no_change_batch": idle,
        "no_change_from_the_feed": idle_feed,
        "problems": problems,
    }


def source_version(spark, path: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").first()["version"])


def hand_target(spark, src: str, version: int, sql: str, path: str, vectors: bool) -> None:
    """The hand MERGE's table (untimed): the query's result at the source's ``version``, in a Delta
    table, with deletion vectors if ``vectors`` (a MERGE of a few scattered rows of a large table
    then marks them instead of rewriting every file it touches; a table of a few thousand groups
    is one small file, cheaper rewritten: 19 Spark jobs a MERGE instead of 26 at 100 groups)."""
    spark.read.format("delta").option("versionAsOf", version).load(src).createOrReplaceTempView("src")
    spark.sql(sql).write.format("delta").save(path)
    if vectors:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")


def hand_merge(spark, src: str, target: str, last: int, group: bool) -> int:
    """The incremental model a dbt user writes by hand over a Delta source (``is_incremental()``:
    the change feed since the last version processed), at its best: the source's latest version
    pinned (the feed and, for a GROUP BY, the source read as of it), the change side computed once
    (``localCheckpoint``), broadcast, and MERGEd with ``merge.materializeSource=none`` (Delta need
    not copy it again) into the table (:func:`hand_target`: deletion vectors for the filter's rows).

    - filter: each id's latest change (by ``_commit_version``, an insert or postimage over a delete;
      preimages dropped), flagged whether the row is still there and passes the predicate; one
      MERGE on ``id``: DELETE matched rows no longer kept, UPDATE the other matched ones, INSERT the
      kept unmatched ones;
    - group: the groups the changes touch (pre- and postimages, deletes, inserts), the aggregate
      recomputed from the source filtered to them (a broadcast semi-join), left-joined to them so a
      group left with no rows comes with ``n`` null; one MERGE on ``grp``: DELETE those, UPDATE
      the other matched groups, INSERT the new ones.

    Returns the source version processed (the next run starts after it)."""
    from pyspark.sql import functions as F

    now = source_version(spark, src)
    feed = f"table_changes_by_path('{src}', {last + 1}, {now})"
    if group:
        touched = spark.sql(f"SELECT DISTINCT grp FROM {feed}").localCheckpoint()
        F.broadcast(touched).createOrReplaceTempView("hand_touched")
        changes = spark.sql(
            f"SELECT k.grp, a.n, a.qty, a.lo, a.hi FROM hand_touched k LEFT JOIN ("
            f"SELECT grp, {AGGREGATES} FROM delta.`{src}` VERSION AS OF {now} "
            f"WHERE grp IN (SELECT grp FROM hand_touched) GROUP BY grp) a ON k.grp = a.grp"
        )
        key, columns, gone = "grp", GROUP_COLUMNS, "c.n IS NULL"
    else:
        changes = spark.sql(
            f"SELECT {', '.join(COLUMNS)}, coalesce(_added AND ({PREDICATE}), false) AS _keep FROM ("
            f"SELECT *, row_number() OVER (PARTITION BY id ORDER BY _commit_version DESC, _added DESC) AS _rn "
            f"FROM (SELECT *, _change_type IN ('insert', 'update_postimage') AS _added FROM {feed} "
            f"WHERE _change_type <> 'update_preimage')) WHERE _rn = 1"
        )
        key, columns, gone = "id", COLUMNS, "NOT c._keep"
    F.broadcast(changes.localCheckpoint()).createOrReplaceTempView("hand_changes")
    values = [c for c in columns if c != key]
    kept = "c.n IS NOT NULL" if group else "c._keep"
    previous = spark.conf.get(MATERIALIZE_SOURCE, None)
    spark.conf.set(MATERIALIZE_SOURCE, "none")
    try:
        spark.sql(
            f"MERGE INTO delta.`{target}` t USING hand_changes c ON t.{key} = c.{key} "
            f"WHEN MATCHED AND {gone} THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {', '.join(f't.{c} = c.{c}' for c in values)} "
            f"WHEN NOT MATCHED AND {kept} THEN INSERT ({', '.join(columns)}) "
            f"VALUES ({', '.join(f'c.{c}' for c in columns)})"
        )
    finally:
        if previous is None:
            spark.conf.unset(MATERIALIZE_SOURCE)
        else:
            spark.conf.set(MATERIALIZE_SOURCE, previous)
    return now


def yaml_query(root: Path, name: str, src: str, parts: int, sql: str = SQL, refresh: str = "auto"):
    """The sink: ``sql`` over the Delta source ``src``."""
    from workload import SCHEMA, schema_yaml, write_sink

    query = {"sql": sql, "sources": {"src": {"format": "delta", "path": src}}, "refresh": refresh}
    schema = schema_yaml(GROUP_SCHEMA if sql == GROUP_SQL else SCHEMA)
    return write_sink(root, {"name": name, "kind": "query", "schema": schema, "query": query}, parts)


if __name__ == "__main__":
    sys.exit(main())

"""A query sink over a Delta source with a change data feed: a batch from the source's changes
against a plain overwrite, in one session (issue 48).

    python bench/incremental.py [--rows 10000000] [--change 0.001] [--query filter|group]
                                [--groups 10000] [--out bench/results]

The source: ``--rows`` rows of bench/workload.py's schema in a Delta table with
``delta.enableChangeDataFeed``; the sink: ``SELECT * FROM src WHERE qty >= 0`` (a projection and a
filter), or with ``--query group`` a GROUP BY of a column ``grp`` added to the source (``--groups``
values, hashed from the id: the changed rows touch groups at random) with count, sum, min and max,
also computed by a second sink that compares in full (``refresh: full``), timed on the same change.
Untimed: the source, the sink's first batch. Then ``--change`` of the rows are updated in the
source (one UPDATE: qty + 1) and timed side by side: the sink's batch (mint + write + append; its
log must say it took the change feed), a plain overwrite of a Delta table with the query's result,
and a sink batch with no source change. Checks: the sink's content equals the query's result after
the change (workload.compare). Writes ``<out>/incremental.json`` (``incremental_group.json``).
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

SQL = "SELECT * FROM src WHERE qty >= 0"
GROUP_SQL = "SELECT grp, count(*) AS n, sum(qty) AS qty, min(amount) AS lo, max(amount) AS hi FROM src GROUP BY grp"
GROUP_SCHEMA = [("grp", "bigint", True), ("n", "bigint", True), ("qty", "bigint", True)]
GROUP_SCHEMA += [("lo", "decimal(12,2)", True), ("hi", "decimal(12,2)", True)]


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
    from pyspark.sql import functions as F

    group = args.query == "group"
    sql = GROUP_SQL if group else SQL
    root, spark, ledger, _ = start("bench-incremental-", "bench-incremental")
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    src = str(root / "src")
    every = max(1, round(1 / args.change))
    rows = generate(spark.range(args.rows), 1)
    if group:
        rows = rows.withColumn("grp", F.pmod(F.xxhash64("id"), F.lit(args.groups)))
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in rows.schema.fields)
    spark.sql(f"CREATE TABLE delta.`{src}` ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    rows.write.format("delta").mode("append").save(src)
    data = yaml_query(root, "incr", src, parts, sql)
    full = yaml_query(root, "full", src, parts, sql, refresh="full") if group else None
    said = Said()
    logging.getLogger("reconcile").addHandler(said)
    logging.getLogger("reconcile").setLevel(logging.INFO)
    first = sink_batch(spark, ledger, data, 0)
    if full is not None:
        sink_batch(spark, ledger, full, 0)
    spark.sql(f"UPDATE delta.`{src}` SET qty = qty + 1 WHERE pmod(id, {every}) = 7")
    said.lines.clear()
    batch = sink_batch(spark, ledger, data, 1)
    took_feed = any(line.startswith("incremental: the correction") for line in said.lines)
    compared = sink_batch(spark, ledger, full, 1) if full is not None else None
    spark.read.format("delta").load(src).createOrReplaceTempView("src")
    t0 = time.perf_counter()
    spark.sql(sql).write.format("delta").mode("overwrite").save(str(root / "plain"))
    overwrite = time.perf_counter() - t0
    said.lines.clear()
    idle = sink_batch(spark, ledger, data, 2)
    idle_feed = any(line.startswith("incremental: the correction") for line in said.lines)
    got, _ = sink_contents(spark, ledger, data, 2)
    spark.read.format("delta").load(src).createOrReplaceTempView("src")
    columns = [c[0] for c in GROUP_SCHEMA] if group else COLUMNS
    problems = problems_of(compare(spark.sql(sql), {"sink": got}, columns))
    result = {
        "machine": machine(spark),
        "query": sql,
        "rows": args.rows,
        "changed_rows": args.rows // every,
        "first_batch": first,
        "batch": batch,
        "batch_from_the_feed": took_feed,
        "overwrite_s": overwrite,
        "batch_over_overwrite": batch["sink_s"] / overwrite,
        "full_comparison_batch": compared,
        "no_change_batch": idle,
        "no_change_from_the_feed": idle_feed,
        "problems": problems,
    }
    print(machine_line(result["machine"]))
    print(
        f"{args.query}: {args.rows:,} rows, {result['changed_rows']:,} updated: sink batch {batch['sink_s']:.2f} s "
        f"(write {batch['write_s']:.2f}, from the feed: {took_feed}), overwrite {overwrite:.2f} s: "
        f"{result['batch_over_overwrite']:.3f}x; a batch with no change {idle['sink_s']:.2f} s (write "
        f"{idle['write_s']:.2f}); first batch {first['sink_s']:.2f} s"
        + (
            f"; the same batch compared in full {compared['sink_s']:.2f} s (write {compared['write_s']:.2f})"
            if compared
            else ""
        )
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ("incremental.json" if not group else "incremental_group.json")).write_text(
        json.dumps(result, indent=2, default=str)
    )
    ledger.dispose()
    if problems or not took_feed:
        print("CHECK FAILED: " + ("; ".join(problems) or "the batch did not take the change feed"), file=sys.stderr)
        return 1
    return 0


def yaml_query(root: Path, name: str, src: str, parts: int, sql: str = SQL, refresh: str = "auto"):
    """The sink: ``sql`` over the Delta source ``src``."""
    from workload import SCHEMA, schema_yaml, write_sink

    query = {"sql": sql, "sources": {"src": {"format": "delta", "path": src}}, "refresh": refresh}
    schema = schema_yaml(GROUP_SCHEMA if sql == GROUP_SQL else SCHEMA)
    return write_sink(root, {"name": name, "kind": "query", "schema": schema, "query": query}, parts)


if __name__ == "__main__":
    sys.exit(main())

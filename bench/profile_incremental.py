"""A stage profile of a query sink's batches from its Delta source's change feed: the batch after
``--change`` of the rows were updated, and a batch whose source did not change.

    python bench/profile_incremental.py [--rows 1000000] [--change 0.001] [--query filter|group]
                                        [--driver] [--out bench/results]

The source and the sink are bench/incremental.py's. Per batch: mint, write and append seconds;
per Spark stage (bench/profile_query.py's ``Stages``) seconds, bytes read and shuffled, and the
call site; the write's seconds outside Spark's stages (the driver: planning, the ledger, Delta's
log). ``--driver``: the write's driver calls under cProfile too (the 25 costliest by cumulative
time). Writes ``<out>/profile_incremental[_group].json`` and prints a table.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from incremental import GROUP_SQL, SQL, yaml_query  # noqa: E402
from profile_query import Stages, _print, save  # noqa: E402
from workload import ROOT, generate, machine, machine_line, start, upper_of  # noqa: E402

SEEN: set[int] = set()


def executions(spark, seen: set[int]) -> list[dict]:
    """The SQL executions not in ``seen`` (added to it): per execution, its seconds, and the seconds
    before its first job started (planning) and after its last job ended (the write's commit)."""
    from profile_query import _get, _ms

    base = spark.sparkContext.uiWebUrl.rstrip("/") + "/api/v1/applications/" + spark.sparkContext.applicationId
    jobs = {j["jobId"]: j for j in _get(f"{base}/jobs")}
    out = []
    for ex in _get(f"{base}/sql?details=false&length=100000"):
        if ex["id"] in seen:
            continue
        seen.add(ex["id"])
        start, ids = _ms(ex["submissionTime"]), ex.get("successJobIds", []) + ex.get("failedJobIds", [])
        ran = [jobs[i] for i in ids if i in jobs and jobs[i].get("completionTime")]
        first = min((_ms(j["submissionTime"]) for j in ran), default=None)
        last = max((_ms(j["completionTime"]) for j in ran), default=None)
        out.append(
            {
                "execution": ex["id"],
                "what": (ex.get("description") or "")[:70],
                "seconds": ex["duration"] / 1000,
                "jobs": len(ran),
                "before_jobs_s": None if first is None else (first - start) / 1000,
                "after_jobs_s": None if last is None else (start + ex["duration"] - last) / 1000,
            }
        )
    return out


def profiled_batch(spark, ledger, cfg, batch: int, stages: Stages, driver: bool) -> dict:
    """One batch (mint, write, append) with its stages and, with ``driver``, the write's driver calls."""
    from reconcile.sink.run import run_batch

    executions(spark, SEEN)
    stages.mark()
    prof = cProfile.Profile() if driver else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    r = run_batch(spark, ledger, cfg, f"b{batch}", upper_of(batch))
    if prof is not None:
        prof.disable()
    wall = time.perf_counter() - t0
    if r.append is None or r.append.outcome != "committed":
        raise RuntimeError(f"{cfg.name}: {r.message}")
    got = stages.since_mark()
    spark_s = sum(s["seconds"] or 0 for s in got)
    out = {"wall_s": wall, **{f"{k}_s": v for k, v in r.seconds.items()}, "spark_stages_s": spark_s, "stages": got}
    out["outside_stages_s"] = wall - spark_s
    out["executions"] = executions(spark, SEEN)
    if prof is not None:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(
            "reconcile|pyspark/sql/(readwriter|observation|classic/dataframe)", 45
        )
        out["driver"] = text.getvalue()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--change", type=float, default=0.001)
    ap.add_argument("--query", choices=["filter", "group"], default="filter")
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    from pyspark.sql import functions as F

    group = args.query == "group"
    root, spark, ledger, _ = start("profile-incremental-", "profile-incremental", {"spark.ui.enabled": "true"})
    parts = int(spark.conf.get("spark.sql.shuffle.partitions"))
    stages = Stages(spark)
    src = str(root / "src")
    rows = generate(spark.range(args.rows), 1)
    if group:
        rows = rows.withColumn("grp", F.pmod(F.xxhash64("id"), F.lit(args.groups)))
    columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in rows.schema.fields)
    spark.sql(f"CREATE TABLE delta.`{src}` ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    rows.write.format("delta").mode("append").save(src)
    cfg = yaml_query(root, "profiled", src, parts, GROUP_SQL if group else SQL)
    result: dict = {"machine": machine(spark), "rows": args.rows, "query": args.query, "batches": []}
    print(machine_line(result["machine"]))
    first = profiled_batch(spark, ledger, cfg, 0, stages, False)
    _print("first batch (the full comparison)", first["wall_s"], first["stages"])
    every = max(1, round(1 / args.change))
    spark.sql(f"UPDATE delta.`{src}` SET qty = qty + 1 WHERE pmod(id, {every}) = 7")
    for batch, title in ((1, f"{args.rows // every:,} rows updated"), (2, "no source change")):
        got = profiled_batch(spark, ledger, cfg, batch, stages, args.driver)
        got["title"] = title
        result["batches"].append(got)
        _print(
            f"{title} (mint {got['mint_s']:.2f}, write {got['write_s']:.2f}, append {got['append_s']:.2f})",
            got["wall_s"],
            got["stages"],
        )
        print(f"  Spark stages {got['spark_stages_s']:.2f} s; outside them {got['outside_stages_s']:.2f} s")
        for ex in got["executions"]:
            print(
                f"  SQL execution {ex['execution']}: {ex['seconds']:.2f} s, {ex['jobs']} job(s), "
                f"{ex['before_jobs_s'] or 0:.2f} s before its first, {ex['after_jobs_s'] or 0:.2f} s after its last: "
                f"{ex['what']}"
            )
        if "driver" in got:
            print(got["driver"])
    save(args.out, "profile_incremental" + ("_group" if group else ""), result)
    ledger.dispose()
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

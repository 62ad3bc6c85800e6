"""A stage profile of one upsert sink: its first batch (every key loaded) and batches of commands,
beside a plain Delta write of the same state and the expert's MERGE of the same commands, in one
session.

    python bench/profile_upsert.py [--keys 1000000] [--commands 10000,100000] [--local] [--out bench/results]

Per Spark stage of each batch (bench/profile_query.py's ``Stages``): seconds, bytes read, shuffled
and written, and the call site. Per batch: mint, write and append seconds, and the files the batch
read of the shard's (its log line). Writes ``<out>/profile_upsert.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternatives import enable_deletion_vectors, expert_upsert, plain_load  # noqa: E402
from profile_query import Stages, _get, _print, save  # noqa: E402
from workload import (  # noqa: E402
    ROOT,
    UPSERT_SCHEMA,
    commands,
    latest_state,
    machine,
    machine_line,
    sink_batch,
    sink_contents,
    start,
    upsert_sink,
)


def scans(spark, seen: set[int]) -> list[dict]:
    """The file scans of the SQL executions not in ``seen`` (added to it): per scan node, its
    files and rows read, from the session's REST API."""
    base = spark.sparkContext.uiWebUrl.rstrip("/") + "/api/v1/applications/" + spark.sparkContext.applicationId
    out = []
    for ex in _get(f"{base}/sql?details=true&planDescription=false&length=100000"):
        if ex["id"] in seen:
            continue
        seen.add(ex["id"])
        for node in ex.get("nodes", []):
            if not node["nodeName"].startswith("Scan"):
                continue
            m = {x["name"]: x["value"] for x in node.get("metrics", [])}
            out.append(
                {
                    "execution": ex["id"],
                    "node": node["nodeName"][:60],
                    "files": m.get("number of files read"),
                    "size": m.get("size of files read"),
                    "rows": m.get("number of output rows"),
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--commands", default="10000,100000", help="commands per batch, one batch each")
    ap.add_argument("--local", action="store_true", help="commands on the most recent 5%% of keys")
    ap.add_argument("--partitions", type=int, default=0, help="the sink's hash partitions (default: shuffle tasks)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    root, spark, ledger, _ = start("profile-upsert-", "profile-upsert", {"spark.ui.enabled": "true"})
    parts = args.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    stages = Stages(spark)
    feed = str(root / "feed")
    commands(spark, args.keys, 0, args.keys, args.seed).write.parquet(feed)
    cfg = upsert_sink(root, "profiled", feed, parts)
    result: dict = {"machine": machine(spark), "keys": args.keys, "partitions": parts, "batches": []}
    print(machine_line(result["machine"]))

    def timed(fn) -> tuple[float, list[dict]]:
        stages.mark()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, stages.since_mark()

    plain, _ = timed(lambda: plain_load(spark, str(root / "plain"), feed, 0))
    expert_table = str(root / "plain")
    enable_deletion_vectors(spark, expert_table)
    result["plain_write_s"] = plain
    print(f"plain Delta write of {args.keys} keys: {plain:.2f} s")
    lo = int(args.keys * 0.95) if args.local else 0
    seen = {
        ex["id"]
        for ex in _get(
            spark.sparkContext.uiWebUrl.rstrip("/")
            + "/api/v1/applications/"
            + spark.sparkContext.applicationId
            + "/sql?length=100000"
        )
    }
    sizes = [int(x) for x in args.commands.split(",") if x]
    for batch, count in enumerate([0, *sizes]):
        if batch:
            commands(spark, args.keys, batch, count, args.seed, lo).write.mode("append").parquet(feed)
            merge, _ = timed(lambda batch=batch: expert_upsert(spark, expert_table, feed, batch))
        got: dict = {}
        seconds, st = timed(lambda batch=batch, got=got: got.update(sink_batch(spark, ledger, cfg, batch)))
        name = "initial load" if batch == 0 else f"batch of {count} commands (expert MERGE {merge:.2f} s)"
        entry = {"commands": count, **got, "seconds": seconds, "stages": st}
        if batch:
            entry["expert_merge_s"] = merge
        result["batches"].append(entry)
        for sc in scans(spark, seen):
            print(f"  scan (sql {sc['execution']}): {sc['node']}: files {sc['files']}, {sc['size']}, rows {sc['rows']}")
        _print(
            f"{name} (mint {got['mint_s']:.2f} write {got['write_s']:.2f} append {got['append_s']:.3f})", seconds, st
        )
    rows, _ = sink_contents(spark, ledger, cfg, len(sizes))
    expected = latest_state(spark.read.parquet(feed))
    cols = [c[0] for c in UPSERT_SCHEMA]
    differs = rows.select(*cols).exceptAll(expected).count() + expected.exceptAll(rows.select(*cols)).count()
    if differs:
        raise SystemExit(f"the sink differs from the feed's last state in {differs} rows")
    l0 = result["batches"][0]["seconds"]
    print(f"\ninitial load / plain write: {l0 / plain:.2f}")
    for b in result["batches"][1:]:
        print(f"{b['commands']} commands: sink {b['seconds']:.2f} s, expert MERGE {b['expert_merge_s']:.2f} s")
    save(args.out, "profile_upsert", result)
    ledger.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

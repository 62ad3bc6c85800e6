"""A stage profile of one query sink: its first batch (an initial load) and one batch of a change,
beside a plain Delta write and a plain overwrite of the same data, in one session.

    python bench/profile_query.py [--rows 10000000] [--change 0.001] [--partitions 0] [--out bench/results]

Per Spark stage of each batch (from the session's own monitoring REST API): seconds (submission
to completion), bytes read from files, shuffled (written) and written to files, and the call site
that started it (the sink's source line). Per batch: mint, write and append seconds. Writes
``<out>/profile_query.json`` and prints a table; the floor's parts are bench/alternatives.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workload import ROOT, change, generate, machine, machine_line, query_sink, sink_batch, start  # noqa: E402


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


class Stages:
    """The session's completed stages, read from its UI's REST API, since a mark."""

    def __init__(self, spark):
        self.base = spark.sparkContext.uiWebUrl.rstrip("/") + "/api/v1/applications"
        self.app = spark.sparkContext.applicationId
        self.seen: set[int] = set()

    def mark(self) -> None:
        self.seen = {s["stageId"] for s in self._all()}

    def _all(self) -> list[dict]:
        return _get(f"{self.base}/{self.app}/stages?status=complete")

    def since_mark(self) -> list[dict]:
        out = []
        for s in sorted(self._all(), key=lambda s: s["stageId"]):
            if s["stageId"] in self.seen:
                continue
            seconds = None
            if s.get("submissionTime") and s.get("completionTime"):
                seconds = (_ms(s["completionTime"]) - _ms(s["submissionTime"])) / 1000
            out.append(
                {
                    "stage": s["stageId"],
                    "name": s["name"],
                    "description": s.get("description"),
                    "seconds": seconds,
                    "tasks": s["numTasks"],
                    "read_mb": round(s["inputBytes"] / 1e6, 1),
                    "shuffle_write_mb": round(s["shuffleWriteBytes"] / 1e6, 1),
                    "shuffle_read_mb": round(s["shuffleReadBytes"] / 1e6, 1),
                    "written_mb": round(s["outputBytes"] / 1e6, 1),
                    "rows_read": s["inputRecords"],
                }
            )
        return out


def _ms(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


def _print(title: str, seconds: float, stages: list[dict]) -> None:
    print(f"\n{title}: {seconds:.2f} s")
    print(f"  {'stage':>5} {'s':>6} {'tasks':>5} {'read MB':>8} {'shuf w':>7} {'shuf r':>7} {'written':>8}  call site")
    for s in stages:
        print(
            f"  {s['stage']:>5} {s['seconds'] or 0:>6.2f} {s['tasks']:>5} {s['read_mb']:>8} {s['shuffle_write_mb']:>7} "
            f"{s['shuffle_read_mb']:>7} {s['written_mb']:>8}  {(s['description'] or s['name'])[:90]}"
        )


def save(out: str, name: str, result: dict) -> None:
    """The profile as ``<out>/<name>.json``."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    (path / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--change", type=float, default=0.001, help="share of rows changed by the second batch")
    ap.add_argument("--partitions", type=int, default=0, help="the sink's hash partitions (default: shuffle tasks)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()

    root, spark, ledger, _ = start("profile-query-", "profile-query", {"spark.ui.enabled": "true"})
    parts = args.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
    stages = Stages(spark)
    before, after = str(root / "before"), str(root / "after")
    generate(spark.range(args.rows), 1).write.parquet(before)
    changes = max(1, int(args.rows * args.change))
    change(spark, spark.read.parquet(before), 1, "p", changes, args.rows).write.parquet(after)
    result: dict = {"machine": machine(spark), "rows": args.rows, "changes": changes, "partitions": parts}

    def timed(fn) -> tuple[float, list[dict]]:
        stages.mark()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0, stages.since_mark()

    plain, _ = timed(lambda: spark.read.parquet(before).write.format("delta").save(str(root / "plain")))
    overwrite, _ = timed(
        lambda: spark.read.parquet(after).write.format("delta").mode("overwrite").save(str(root / "plain"))
    )
    result.update(plain_write_s=plain, overwrite_s=overwrite)
    print(machine_line(result["machine"]))
    print(f"plain Delta write of {args.rows} rows: {plain:.2f} s; overwrite with the change: {overwrite:.2f} s")
    for batch, source in ((0, before), (1, after)):
        cfg = query_sink(root, "profiled", source, parts)
        got: dict = {}
        seconds, st = timed(lambda cfg=cfg, batch=batch, got=got: got.update(sink_batch(spark, ledger, cfg, batch)))
        name = "initial load" if batch == 0 else f"batch of {changes} changes"
        result[f"batch{batch}"] = {**got, "seconds": seconds, "stages": st}
        _print(
            f"{name} (mint {got['mint_s']:.2f} write {got['write_s']:.2f} append {got['append_s']:.3f})", seconds, st
        )
    l0, b1 = result["batch0"]["seconds"], result["batch1"]["seconds"]
    print(f"\ninitial load / plain write: {l0 / plain:.2f}; batch / overwrite: {b1 / overwrite:.2f}")
    save(args.out, "profile_query", result)
    ledger.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A query sink's batches over time and with their self-checks: two modes in one SparkSession.

    python bench/reconcile_bench.py --flat [--size 1000000] [--batches 200] [--batch-changes 1000]
                                    [--compact-every 10]
    python bench/reconcile_bench.py --checksum-cost [--size 1000000] [--fraction 0.01] [--repeat 5]

The data and the sink are :mod:`workload`'s (a key and 14 typed columns; a query sink
``SELECT * FROM desired`` over a Parquet snapshot, with as many hash partitions as the session
has shuffle tasks: the machine's, or --partitions). The sink against the alternatives (MERGE,
overwrite, a physical floor) is ``bench/alternatives.py``. The session's start is reported apart,
not counted.

Flat mode (--flat): two sinks, compaction off and on (``retention: {history_hours: 0}``, and
``reconcile.compact.run_compact`` after every --compact-every-th batch, timed apart), are loaded
with ``size`` rows by a first batch and then run the same ``batches`` small batches, each
changing ``batch-changes`` rows of the desired snapshot (rewritten as Parquet before each batch,
not timed). The two sinks alternate batch by batch on the same snapshots. A batch's cost is mint
+ write + append. Prints and saves (``<out>/reconcile_flat.json``, ``<out>/reconcile_flat.png``)
the cost of batches 1, 50, 100, 200 (or the nearest), last/first for each sink and the
compaction times; both shards must end equal to the last snapshot (:func:`workload.compare`).

Checksum-cost mode (--checksum-cost): what batches that verify themselves cost
(:mod:`reconcile.checksums`: the observations of the desired frame and of the correction inside
the write's Spark action, of persist too when the previous batch's record cannot be carried
(the load batch), and the comparison). Each of --repeat rounds runs the query
sink twice on fresh tables, with the observations off and on (the order
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
import shutil
import statistics
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from workload import (
    ROOT,
    Mismatch,
    change,
    checked,
    compare,
    correction_size,
    generate,
    machine,
    machine_line,
    problems_of,
    query_sink,
    sink_batch,
    sink_contents,
    split,
    start,
)


def nearest(batches: int, targets=(1, 50, 100, 200)) -> list[int]:
    picked = [min(range(1, batches + 1), key=lambda b: abs(b - t)) for t in targets]
    return sorted(set(picked))


def run_flat(spark: SparkSession, ledger, root: Path, args) -> dict:
    from reconcile.sink.compact import run_compact

    modes = {"off": None, "on": {"history_hours": 0}}
    current = str(root / "desired_0")
    generate(spark.range(args.size), args.seed).write.parquet(current)
    cfgs = {m: query_sink(root, f"flat_{m}", current, args.partitions, ret) for m, ret in modes.items()}
    load = {m: round(sink_batch(spark, ledger, cfg, 0)["sink_s"], 3) for m, cfg in cfgs.items()}
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
            cfgs[m] = query_sink(root, f"flat_{m}", current, args.partitions, ret)
            r = {k: round(v, 3) for k, v in sink_batch(spark, ledger, cfgs[m], b).items()}
            costs[m].append({"batch": b, **r})
            line += f"  {m} {r['sink_s']:.2f}s"
            if ret is not None and b % args.compact_every == 0:
                t = time.perf_counter()
                c = run_compact(spark, ledger, cfgs[m])
                seconds = time.perf_counter() - t
                compactions.append(
                    {"after_batch": b, "seconds": round(seconds, 3), "outcome": c.outcome, "message": c.message}
                )
                line += f" (+ compaction {seconds:.2f}s: {c.outcome})"
        print(line, flush=True)

    final = spark.read.parquet(current)
    problems = []
    for m, cfg in cfgs.items():
        rows, errors = sink_contents(spark, ledger, cfg, args.batches)
        problems += problems_of(compare(final, {f"compaction {m}": rows}, cfg.column_names))
        problems += [f"compaction {m}: {errors} error updates"] if errors else []
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


def run_checksum_cost(spark: SparkSession, ledger, root: Path, args) -> dict:
    """The query sink's load and change batches with the self-checks off and on, alternating."""
    from reconcile import checksums
    from reconcile.sink.check import verify_checksums
    from reconcile.storage.delta import ShardTable

    n, changes = args.size, round(args.fraction * args.size)
    before, after = str(root / "before"), str(root / "after")
    generate(spark.range(n), args.seed).write.parquet(before)
    change(spark, spark.read.parquet(before), args.seed, "ck", changes, n).write.parquet(after)
    expected = correction_size(changes)
    runs: list[dict] = []
    verify_s = []
    for rnd in range(args.repeat + 1):  # round 0 warms the JVM up, not reported
        for mode in ("off", "on") if rnd % 2 else ("on", "off"):
            checksums.ENABLED = mode == "on"
            name = f"ck_{mode}_{rnd}"
            c0 = cpu_seconds()
            load = sink_batch(spark, ledger, query_sink(root, name, before, args.partitions), 0)
            c1 = cpu_seconds()
            cfg = query_sink(root, name, after, args.partitions)
            batch = sink_batch(spark, ledger, cfg, 1)
            load["cpu_s"], batch["cpu_s"] = c1 - c0, cpu_seconds() - c1
            if batch["updates"] != expected:
                raise Mismatch(f"{name}: the correction has {batch['updates']} rows, expected {expected}")
            if mode == "on":
                t = time.perf_counter()
                lines, counts = verify_checksums(ledger, cfg, spark)
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
    ap.add_argument(
        "--partitions", type=int, default=0, help="shuffle tasks and sink partitions (default: the machine's)"
    )
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
    if args.flat == args.checksum_cost:
        ap.error("one mode: --flat or --checksum-cost (the sink against MERGE and overwrite: bench/alternatives.py)")

    told = {"spark.sql.shuffle.partitions": str(args.partitions)} if args.partitions else None
    root, spark, ledger, session_start = start("bench-reconcile-", "bench-reconcile", told)
    args.partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = machine(spark)
    mode = run_checksum_cost if args.checksum_cost else run_flat
    result = checked(lambda: mode(spark, ledger, root, args), root, ledger)
    if result is None:
        return 1

    common = {
        "session_start_s": round(session_start, 3),
        "partitions": args.partitions,
        "seed": args.seed,
        "machine": info,
    }
    print(f"Spark session start {session_start:.1f}s (not counted)")
    if args.checksum_cost:
        report_checksum_cost(result)
        (out / "reconcile_checksum_cost.json").write_text(json.dumps({**common, **result}, indent=2))
    else:
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
    print(machine_line(info))
    print(f"results in {out}")
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

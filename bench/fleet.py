"""A thousand sinks in one Airflow (issue 50): what the DAG file's parse, a task's parse, the
fleet-wide pages and commands cost with ``sinks`` sink files and ``batches`` batches each.

    python bench/fleet.py [--sinks 1000] [--batches 1000] [--postgres URL] [--out bench/results/fleet.json]

1. **the fleet**: ``sinks`` sink files (:func:`write_sinks`: query, upsert and change-log sinks in
   turn, hourly, some with a lag alert, a correction guard or a current-state table), and
   ``batches`` batches of each written straight into the ledger through its own API
   (:func:`fill_ledger`: ``Ledger.mint`` -> ``mark_staged`` -> ``absorb_commit``, as the stages
   do; no Spark, no Delta table), a few sinks left needing action (a final failure, a shard
   behind its deadline). On SQLite and (``--postgres``) on PostgreSQL.
2. **timed**, each in a new process as Airflow and a user run them (interpreter start and
   imports included; the median of ``--repeat``): the DAG file as the dag-processor parses it
   (Airflow's ``DagBag`` of ``dags/``, every sink), as a task's parse does (Airflow's parsing
   context naming one sink's DAG and task), the import of Airflow alone beside them; the
   plugin's index page (``ui.render_overview``), ``status`` of every sink (text and ``--json``),
   ``check --all`` and ``validate --no-spark``.
3. **BENCHMARKS.md**: ``--write-benchmarks`` puts the table into its section "A thousand sinks".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

KINDS = ("query", "upsert", "changelog")
START = "2026-01-01T00:00:00Z"


def sink_text(name: str, kind: str, i: int, data: str = "${RECONCILE_HOME}/fleet-data", start: str = START) -> str:
    """One sink file as a team writes it (comments, a description, a schema of six columns):
    an hourly ``kind`` sink reading ``data``/``name``; every fifth with a lag alert, every
    seventh with a current-state table, every eleventh with a correction guard."""
    extra = ""
    if i % 5 == 0:
        extra += "alert:\n  lag_minutes: 180\n"
    if i % 7 == 0:
        extra += "current: true\n"
    if i % 11 == 0:
        extra += "correction_guard:\n  max_share: 0.2\n  min_rows: 1000\n"
    head = (
        f"# {name}: owned by team {i % 40}; generated for the fleet benchmark (bench/fleet.py)\n"
        f"name: {name}\nkind: {kind}\n"
        f"description: Sink {i} of the fleet, a {kind} sink kept hourly for team {i % 40}.\n"
        "schema:\n"
        "  - {name: id, type: bigint, nullable: false}\n"
        "  - {name: customer, type: string}\n"
        "  - {name: amount, type: 'decimal(12,2)'}\n"
        "  - {name: status, type: string}\n"
        "  - {name: created, type: timestamp}\n"
        "  - {name: region, type: string}\n"
        f"partitions: {partitions_of(i)}\nschedule: '@hourly'\nstart_date: {start}\ncatchup: false\nretries: 2\n"
        f"compaction:\n  every_batches: 50\nretention:\n  vacuum_hours: 168\n  history_hours: 336\n"
    )
    src = f"{data}/{name}"
    if kind == "query":
        body = (
            "query:\n  sources:\n"
            f"    orders: {{format: parquet, path: '{src}/orders'}}\n"
            f"    customers: {{format: parquet, path: '{src}/customers'}}\n"
            "  sql: |\n"
            "    SELECT o.id, c.name AS customer, o.amount, o.status, o.created, c.region\n"
            "    FROM orders o JOIN customers c ON o.customer_id = c.id\n"
            "    WHERE o.status <> 'void'\n"
        )
    elif kind == "upsert":
        body = (
            f"upsert:\n  source: {{format: parquet, path: '{src}/commands'}}\n"
            "  key: id\n  time_column: at\n  offset_column: offset\n"
            "  delete: {column: op, values: [delete, purge]}\n"
        )
    else:
        body = (
            f"changelog:\n  source: {{format: parquet, path: '{src}/changes'}}\n"
            "  time_column: changed_at\n  diff_column: diff\n"
        )
    return head + extra + body


def partitions_of(i: int) -> int:
    """Sink ``i``'s hash partitions."""
    return 4 + i % 4


def write_sinks(directory: Path, count: int, prefix: str = "fleet", start: str = START) -> list[str]:
    """``count`` sink files ``<prefix>_<i>.yaml`` in ``directory`` (:func:`sink_text`, the kinds
    in turn, from ``start``): their names."""
    directory.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(count):
        name = f"{prefix}_{i:04d}"
        (directory / f"{name}.yaml").write_text(sink_text(name, KINDS[i % 3], i, start=start))
        names.append(name)
    return names


HOUR = 3_600_000
TAIL = 5  # each sink's newest batches written through the ledger's API (the rest in bulk)
LATE_HOURS = 30  # a late sink's upper lags now by this much


def scenario(i: int) -> str:
    """What sink ``i`` of the fleet is left as: ``failed`` (its newest batch's write failed for
    good), ``late`` (its upper :data:`LATE_HOURS` behind now), ``behind`` (a superseded run's
    wider batch left it behind), else ``ok``."""
    return "failed" if i % 97 == 3 else "late" if i % 89 == 5 else "behind" if i % 83 == 7 else "ok"


def manifest_text(batch_id: str, lower: int, partitions: int, stage_id: str, rows: int) -> str:
    """A manifest as a write records it (:class:`reconcile.manifest.Manifest`: a file with its
    size and digest, rows and checksums per hash partition)."""
    from reconcile.manifest import Manifest, Part

    parts = {
        p: Part(
            rows=rows // partitions,
            checksum=f"{(lower * 31 + p) % 2**61:x}",
            err=0,
            weight=rows // partitions,
            net=0,
            files={f"part-{p:05d}-{stage_id}.parquet": 4096 + p},
            digests={f"part-{p:05d}-{stage_id}.parquet": f"{(lower * 7 + p) % 2**64:016x}"},
            desired_checksum=f"{(lower * 13 + p) % 2**61:x}",
            shard_checksum=f"{(lower * 17 + p) % 2**61:x}",
        )
        for p in range(partitions)
    }
    return Manifest(batch_id, lower, lower + HOUR, partitions, parts, stage_id=stage_id).to_json()


def fill_ledger(url: str, names: list[str], batches: int, as_of: int) -> dict[str, str]:
    """``batches`` hourly batches of each sink from ``as_of``, as its runs leave them: all but the
    newest :data:`TAIL` inserted in bulk as the rows the ledger's API leaves (committed, each at
    the Delta version after the one it read: at 12-18 ms a batch the API would take hours for a
    million), the newest through the API itself (``Ledger.mint`` with the mint's rules,
    ``mark_staged``, ``absorb_commit``); then each sink's :func:`scenario` (a failed, late or
    behind sink has its last batches left out, its upper before ``as_of + batches`` hours).
    Returns {sink: its scenario}."""
    import uuid
    from datetime import UTC, datetime

    from sqlalchemy import insert, update

    from reconcile.model import FINAL, CommitRecord, Staged
    from reconcile.sink.mint import decide
    from reconcile.storage.ledger import Ledger
    from reconcile.storage.ledger_rows import Batch, Shard

    ledger = Ledger(url)
    fate = {}
    try:
        for i, name in enumerate(names):
            fate[name] = scenario(i)
            n = batches - {"late": LATE_HOURS, "behind": 2, "failed": 1}.get(fate[name], 0)
            bulk = max(0, n - TAIL)
            parts = partitions_of(i)
            ledger.ensure_shard(name, as_of)
            t = datetime.now(UTC)
            rows = []
            for j in range(bulk):
                lower = as_of + j * HOUR
                batch_id, stage = f"{lower}-{uuid.uuid4().hex[:16]}", uuid.uuid4().hex[:12]
                rows.append(
                    dict(
                        batch_id=batch_id, shard=name, lower=lower, upper=lower + HOUR, state="committed",
                        run_id=f"scheduled__{lower}", attempt=1, delta_version=j + 1, read_version=j,
                        rows_ok=1000 + j % 50, rows_err=0, drift_rows=0, stage_id=stage, rows_net=j % 7,
                        manifest=manifest_text(batch_id, lower, parts, stage, 1000 + j % 50),
                        created_at=t, updated_at=t,
                    )
                )  # fmt: skip
            with ledger.tx() as s:
                if rows:
                    s.execute(insert(Batch), rows)
                s.execute(
                    update(Shard)
                    .where(Shard.name == name)
                    .values(upper=as_of + bulk * HOUR, delta_version=bulk, updated_at=t)
                )
            for j in range(bulk, n):
                _api_batch(ledger, name, as_of + j * HOUR, j, parts, decide, Staged, CommitRecord)
            lower = as_of + n * HOUR
            if fate[name] == "failed":  # its next run's write fails for good
                d = ledger.mint(name, lambda sh, op, lo=lower: decide(sh, op, f"scheduled__{lo}", 1, lo + HOUR, False))
                ledger.note_failure(
                    d.new.batch_id,
                    f"source path {name}/orders does not exist. Remedy: restore the source, then clear the run.",
                    FINAL,
                )
            elif fate[name] == "behind":  # a wide run superseded by a narrower one that committed
                ledger.mint(name, lambda sh, op, lo=lower: decide(sh, op, f"manual__{lo}", 1, lo + 2 * HOUR, False))
                _api_batch(ledger, name, lower, n, parts, decide, Staged, CommitRecord, run=f"backfill__{lower}")
    finally:
        ledger.dispose()
    return fate


def _api_batch(ledger, name, lower, j, parts, decide, Staged, CommitRecord, run=None) -> None:
    """One batch through the ledger's API, as mint, write and append record it."""
    run = run or f"scheduled__{lower}"
    d = ledger.mint(name, lambda shard, open_: decide(shard, open_, run, 1, lower + HOUR, False))
    b = d.new
    stage = f"s{j:010d}"
    text = manifest_text(b.batch_id, lower, parts, stage, 1000)
    ledger.mark_staged(b.batch_id, Staged(stage, text, 1000, 0, j, 0, rows_net=0), replaces=None)
    ledger.absorb_commit(name, CommitRecord(j + 1, b.batch_id, b.lower, b.upper, run, 1000, 0, None, stage))


# -- timing ---------------------------------------------------------------------------------------

TARGETS = {  # seconds (issue 50, a quiet 2-core machine)
    "dag_processor_parse": 10.0,
    "task_parse_beyond_airflow": 1.0,
    "index_page": 2.0,
    "status_all": 2.0,
    "validate": 10.0,
}
UNREACHABLE = {  # a ledger and a warehouse nobody answers for (a blackhole address)
    "RECONCILE_METADATA_URL": "postgresql+psycopg://nobody:x@10.255.255.1:5432/ledger?connect_timeout=30",
    "RECONCILE_WAREHOUSE": "s3://unreachable-bucket/warehouse",
    "AWS_ENDPOINT_URL": "http://10.255.255.1:9000",
    "AWS_ACCESS_KEY_ID": "x",
    "AWS_SECRET_ACCESS_KEY": "x",
}

# The DAG file as the dag-processor handles it (its own functions: parse, then serialize each
# DAG), and as a task's parse does (Airflow's parsing context naming one DAG); seconds as JSON.
PROCESSOR = """
import json, sys, time
t0 = time.perf_counter()
from pathlib import Path
import structlog
from airflow.dag_processing.dagbag import BundleDagBag
from airflow.dag_processing.processor import _serialize_dags
t1 = time.perf_counter()
dags = Path(sys.argv[1])
bag = BundleDagBag(dag_folder=str(dags / "reconcile_sinks.py"), bundle_path=dags, bundle_name="dags-folder", load_op_links=False)
t2 = time.perf_counter()
serialized, errors = _serialize_dags(bag, structlog.get_logger())
t3 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "parse": t2 - t1, "serialize": t3 - t2, "dags": len(bag.dags),
                  "import_errors": len(bag.import_errors) + len(errors)}))
"""
TASK = """
import json, os, sys, time
t0 = time.perf_counter()
from pathlib import Path
from airflow.dag_processing.dagbag import BundleDagBag
import airflow.providers.apache.spark.operators.spark_submit, airflow.providers.standard.operators.hitl
t1 = time.perf_counter()
if sys.argv[2] != "-":
    os.environ["_AIRFLOW_PARSING_CONTEXT_DAG_ID"], os.environ["_AIRFLOW_PARSING_CONTEXT_TASK_ID"] = sys.argv[2], "mint"
    dags = Path(sys.argv[1])
    bag = BundleDagBag(dag_folder=str(dags / "reconcile_sinks.py"), bundle_path=dags, bundle_name="dags-folder", load_op_links=False)
    assert list(bag.dags) == [sys.argv[2]], list(bag.dags)
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "parse": t2 - t1}))
"""
# The plugin's index page as the api-server computes it (the plugin imported already): the
# first request of the process (sink files not yet validated by it), then the next.
PAGE = """
import json, time
from reconcile.airflow.ui import render_overview
t0 = time.perf_counter(); first = render_overview(); t1 = time.perf_counter(); render_overview(); t2 = time.perf_counter()
print(json.dumps({"first": t1 - t0, "next": t2 - t1, "rows": first.count("<tr>") - 1, "bytes": len(first)}))
"""


def run(env: dict[str, str], args: list[str], timeout: float = 3600) -> tuple[float, float, str, int]:
    """``python args`` in a new process: (wall s, CPU s of the process, stdout, exit code)."""
    import resource
    import subprocess
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if proc.returncode not in (0, 1, 4):
        raise SystemExit(f"python {' '.join(args)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return wall, cpu, proc.stdout, proc.returncode


def median_of(repeat: int, env: dict[str, str], args: list[str]) -> dict:
    """:func:`run` ``repeat`` times: the median wall and CPU seconds, each run's output."""
    import statistics

    runs = [run(env, args) for _ in range(repeat)]
    return {
        "wall_s": round(statistics.median(r[0] for r in runs), 2),
        "cpu_s": round(statistics.median(r[1] for r in runs), 2),
        "runs_s": [round(r[0], 2) for r in runs],
        "exit_code": runs[-1][3],
        "stdout": [r[2] for r in runs],
        "load_average": round(os.getloadavg()[0], 1),
    }


def json_of(result: dict) -> dict:
    """The medians of what a timing child printed (its last line, JSON) over the runs, with the
    runs' wall and CPU seconds."""
    import json
    import statistics

    printed = [json.loads(out.strip().splitlines()[-1]) for out in result.pop("stdout")]
    got = {
        k: round(statistics.median(p[k] for p in printed), 3) if isinstance(v, float) else v
        for k, v in printed[-1].items()
    }
    return {**got, **result}


def time_parsing(env: dict[str, str], names: list[str], repeat: int) -> dict:
    """The DAG file's parse in the dag-processor (all sinks), with the ledger and the warehouse
    unreachable too, and a task's parse (one sink) beside the import of Airflow alone."""
    dags = str(ROOT / "dags")
    out = {"dag_processor": json_of(median_of(repeat, env, ["-c", PROCESSOR, dags]))}
    out["dag_processor_unreachable"] = json_of(median_of(repeat, {**env, **UNREACHABLE}, ["-c", PROCESSOR, dags]))
    target = names[len(names) // 2]
    out["airflow_import"] = json_of(median_of(repeat, env, ["-c", TASK, dags, "-"]))
    out["task_parse"] = json_of(median_of(repeat, env, ["-c", TASK, dags, target]))
    return out


def time_views(env: dict[str, str], repeat: int) -> dict:
    """The index page, ``status`` of every sink (text, ``--json``) and ``check --all``."""
    cli = ["-m", "reconcile"]
    status = median_of(repeat, env, [*cli, "status"])
    head = status["stdout"][-1].splitlines()[0]
    status_json = median_of(repeat, env, [*cli, "status", "--json"])
    status_json.pop("stdout")
    check = median_of(1, env, [*cli, "check", "--all"])
    check_tail = check.pop("stdout")[-1].splitlines()[-1]
    return {
        "index_page": json_of(median_of(repeat, env, ["-c", PAGE])),
        "status_all": {**{k: v for k, v in status.items() if k != "stdout"}, "first_line": head},
        "status_json": status_json,
        "check_all": {**check, "last_line": check_tail},
    }


def postgres_schema(base: str, work: Path) -> tuple[str, object]:
    """A fresh schema on the PostgreSQL server of ``base``: (its URL, a function dropping it)."""
    import uuid

    from sqlalchemy import create_engine, text

    schema = f"fleet_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base)
    with admin.begin() as c:
        c.execute(text(f"CREATE SCHEMA {schema}"))

    def drop() -> None:
        with admin.begin() as c:
            c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()

    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}", drop


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import platform
    import shutil
    import subprocess
    import tempfile
    import time
    from datetime import UTC, datetime

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sinks", type=int, default=1000)
    p.add_argument("--batches", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--postgres", default=os.environ.get("RECONCILE_TEST_POSTGRES_URL"), help="a PostgreSQL URL")
    p.add_argument("--work", type=Path, default=None, help="a folder to build the fleet in (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work folder and the PostgreSQL schema")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fleet.json")
    p.add_argument("--write-benchmarks", action="store_true", help="put the table into BENCHMARKS.md")
    args = p.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="reconcile-fleet-"))
    hour = int(time.time() * 1000) // HOUR * HOUR
    as_of = hour - args.batches * HOUR
    start = datetime.fromtimestamp(as_of / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sinks = work / "sinks"
    names = write_sinks(sinks, args.sinks, start=start)
    for i in range(3):  # sinks never run yet
        (sinks / f"zz_new_{i}.yaml").write_text(sink_text(f"zz_new_{i}", KINDS[i], i, start=start))
    (sinks / "broken_schema.yaml").write_text("kind: query\nschema: []\nstart_date: 2026-01-01\n")
    (sinks / "broken_yaml.yaml").write_text("name: broken_yaml\nkind: [query\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RECONCILE_", "_AIRFLOW_PARSING"))},
        "RECONCILE_HOME": str(work / "home"),
        "RECONCILE_SINKS_DIR": str(sinks),
        "RECONCILE_WAREHOUSE": str(work / "warehouse"),
        "AIRFLOW_HOME": str(work / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "PYTHONPATH": f"{ROOT / 'include'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    airflow = Path(sys.executable).parent / "airflow"
    subprocess.run([str(airflow), "db", "migrate"], env=env, check=True, capture_output=True)
    result: dict = {
        "sinks": args.sinks,
        "batches": args.batches,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result["commit"] = commit.stdout.strip()
    print(f"fleet of {args.sinks} sinks in {work}", flush=True)
    result["parsing"] = time_parsing(env, names, args.repeat)
    print(json.dumps(result["parsing"], indent=1), flush=True)
    validate = median_of(args.repeat, env, ["-m", "reconcile", "validate", "--no-spark"])
    out = validate.pop("stdout")[-1].splitlines()
    validate["files"], validate["invalid_lines"] = len(out), sum(line.startswith("INVALID") for line in out)
    result["validate"] = validate
    print(json.dumps(validate), flush=True)

    ledgers = {"sqlite": f"sqlite:///{work / 'ledger.db'}"}
    drops = []
    if args.postgres:
        url, drop = postgres_schema(args.postgres, work)
        ledgers["postgresql"] = url
        drops.append(drop)
    try:
        for kind, url in ledgers.items():
            t = time.perf_counter()
            fate = fill_ledger(url, names, args.batches, as_of)
            filled = round(time.perf_counter() - t, 1)
            print(f"{kind}: ledger filled in {filled} s", flush=True)
            views = time_views({**env, "RECONCILE_METADATA_URL": url}, args.repeat)
            views["fill_s"] = filled
            views["scenarios"] = {f: sum(1 for v in fate.values() if v == f) for f in sorted(set(fate.values()))}
            result[kind] = views
            print(json.dumps(views, indent=1), flush=True)
    finally:
        if not args.keep:
            for drop in drops:
                drop()
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    if args.write_benchmarks:
        write_benchmarks(result)
    return 0


def table(r: dict) -> str:
    """The BENCHMARKS.md table of a run's figures."""
    parse = r["parsing"]
    proc, task, base = parse["dag_processor"], parse["task_parse"], parse["airflow_import"]
    beyond = task["wall_s"] - base["wall_s"]
    rows = [
        ("the DAG file's parse in the dag-processor, every sink", proc["parse"], TARGETS["dag_processor_parse"],
         f"+ {proc['serialize']:.2f} s serializing the {proc['dags']} DAGs; {proc['import']:.2f} s importing Airflow"),
        ("the same, ledger and warehouse unreachable", parse["dag_processor_unreachable"]["parse"],
         TARGETS["dag_processor_parse"], "nothing at parse time reads them"),
        ("a task's parse, beyond importing Airflow (wall)", beyond, TARGETS["task_parse_beyond_airflow"],
         f"{task['wall_s']:.2f} s vs {base['wall_s']:.2f} s; the DAG file itself {task['parse']:.3f} s"),
        ("`validate --no-spark`, every sink file (wall)", r["validate"]["wall_s"], TARGETS["validate"],
         f"{r['validate']['cpu_s']:.2f} s CPU"),
    ]  # fmt: skip
    for kind in ("sqlite", "postgresql"):
        if kind not in r:
            continue
        v = r[kind]
        rows += [
            (f"index page, {kind} (first request / next)", v["index_page"]["first"], TARGETS["index_page"],
             f"next {v['index_page']['next']:.2f} s; {v['index_page']['rows']} rows"),
            (f"`status`, every sink, {kind} (wall)", v["status_all"]["wall_s"], TARGETS["status_all"],
             f"`--json` {v['status_json']['wall_s']:.2f} s; {v['status_all']['cpu_s']:.2f} s CPU"),
            (f"`check --all`, {kind} (wall)", v["check_all"]["wall_s"], None,
             "no target; each sink's check stops at its Delta table, which this fleet has not"),
        ]  # fmt: skip
    lines = ["| measure | seconds | target | met | notes |", "|---|---|---|---|---|"]
    for what, got, target, note in rows:
        met = "" if target is None else ("met" if got <= target else "**not met**")
        lines.append(f"| {what} | {got:.2f} | {'' if target is None else f'<= {target:g}'} | {met} | {note} |")
    return "\n".join(lines)


def write_benchmarks(r: dict) -> None:
    """Put the run's section into BENCHMARKS.md (replacing the previous run's)."""
    import textwrap

    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    head = "## A thousand sinks in one Airflow"
    section = (
        f"{head}\n\n`python bench/fleet.py --write-benchmarks`; commit {r['commit']}, {r['started'][:10]}; raw: "
        "`bench/results/fleet.json`. "
        f"{r['sinks']} sink files (query, upsert and change-log sinks in turn, hourly; plus 3 never run and 2 "
        f"invalid), {r['batches']} hourly batches each in the ledger up to the last full hour (the newest "
        f"{TAIL} of each through the ledger's API, the rest in bulk as the API leaves them; a few sinks left failed, "
        "late or behind; no Delta tables: every sink's log probe finds nothing past the ledger). Each figure is "
        f"the median of {len(r['parsing']['dag_processor']['runs_s'])} runs, each in a new process (wall seconds; "
        "the index page's as the api-server computes it, in its process, the plugin imported: its first request "
        "and the next); the machine's other load is in the raw file."
        + (f" SQLite's views: {r['sqlite']['retimed']}." if r.get("sqlite", {}).get("retimed") else "")
        + f"\n\n{table(r)}\n"
    )
    intro, rest = section.split("\n\n", 2)[1], section.split("\n\n", 2)[2]
    section = f"{head}\n\n" + "\n".join(textwrap.wrap(intro, 100, break_on_hyphens=False)) + f"\n\n{rest}"
    if head in text:
        start = text.index(head)
        end = text.find("\n## ", start + len(head))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())

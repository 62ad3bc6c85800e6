"""Test helpers: sink configs, source files, running batches, reading the shard back, and the
independent models of query and changelog sinks (the upsert model is in ``upsert_model.py``).

The models compute what a shard must hold with plain Python (Counters), never with the code
under test.
"""

from __future__ import annotations

import ast
import gc
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

from reconcile.config import SinkConfig
from reconcile.config_loading import load_file
from reconcile.errors import ShardNotFound
from reconcile.model import COMMITTED
from reconcile.sink import run as pipeline

AS_OF = 100  # make_sink's default as_of: the first batch's lower


def make_sink(directory: Path, name: str, kind: str = "query", **fields) -> SinkConfig:
    data = {
        "name": name,
        "kind": kind,
        "schema": fields.pop(
            "schema",
            [
                {"name": "k", "type": "bigint", "nullable": False},
                {"name": "v", "type": "string"},
            ],
        ),
        "partitions": fields.pop("partitions", 3),
        "start_date": fields.pop("start_date", "1970-01-01"),
        "as_of": fields.pop("as_of", AS_OF),
    }
    if kind == "query":
        data["query"] = fields.pop(
            "query", {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src"}
        )
    elif kind == "changelog":
        data["changelog"] = fields.pop(
            "changelog", {"source": {"format": "json", "path": "log"}, "time_column": "ts", "diff_column": "diff"}
        )
    data.update(fields)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_file(path)


def write_json_rows(directory: Path, rows: Iterable[dict], schema_hint: dict | None = None) -> None:
    """Replace a JSON-lines source folder's contents. An empty source still carries a schema."""
    directory.mkdir(parents=True, exist_ok=True)
    for f in directory.glob("*.json"):
        f.unlink()
    rows = list(rows)
    if not rows and schema_hint:
        rows = []
        (directory / "_schema.json").write_text(json.dumps(schema_hint) + "\n")
    with open(directory / "part-0.json", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def run_stages(spark, ledger, cfg: SinkConfig, run_id: str, frontier: int, *, attempt: int = 1):
    """:func:`reconcile.sink.run.run_batch` for one run; returns its (mint, write, append) results."""
    r = pipeline.run_batch(spark, ledger, cfg, run_id, frontier, attempt=attempt)
    return r.mint, r.write, r.append


def _log_rows(cfg: SinkConfig) -> list[dict]:
    """Every update the Delta table holds, read with delta-rs (no Spark: independent of the
    sink's own read path, and a tiny table reads in milliseconds instead of a Spark job)."""
    from deltalake import DeltaTable

    from reconcile import settings
    from reconcile.storage.delta import ShardTable

    path = ShardTable(cfg).path
    import pyarrow as pa

    scan = DeltaTable(path, storage_options=settings.delta_storage_options()).scan()  # deletion vectors applied
    return pa.RecordBatchReader.from_stream(scan).read_all().to_pylist()


def as_of(log: list[dict], cfg: SinkConfig, t: int) -> Counter:
    """The collection as of t: per (row..., error), the sum of diffs with time <= t; zeros dropped."""
    out: Counter = Counter()
    for u in log:
        if u["_time"] <= t:
            out[tuple(u[c] for c in cfg.column_names) + (u["_error"],)] += u["_diff"]
    return Counter({k: n for k, n in out.items() if n != 0})


def shard_as_of(cfg: SinkConfig, t: int) -> Counter:
    """The shard as of t as a multiset of (row..., error) tuples (negative counts dropped)."""
    return +as_of(_log_rows(cfg), cfg, t)


def update_log(cfg: SinkConfig) -> list[dict]:
    """Every update the Delta table holds, as dicts."""
    return _log_rows(cfg)


def model_kv(rows: Iterable[dict]) -> Counter:
    """What a sink of columns (k, v) holds when every source row is valid: (k, v, None) counted."""
    return +Counter((r["k"], r["v"], None) for r in rows)


def model_query(rows: Iterable[dict], cfg: SinkConfig) -> Counter:
    """What a query sink `SELECT <cols> FROM src` must hold: valid rows counted, others as errors."""
    out: Counter = Counter()
    for r in rows:
        key = tuple(r.get(c) for c in cfg.column_names)
        bad = [c.name for c in cfg.columns if not c.nullable and r.get(c.name) is None]
        bad += [
            c.name
            for c in cfg.columns
            if c.type == "bigint" and r.get(c.name) is not None and not isinstance(r.get(c.name), int)
        ]
        if bad:
            out[("ERROR",) + tuple(sorted(set(bad)))] += 1
        else:
            out[key + (None,)] += 1
    return out


def normalize_errors(counter: Counter, cfg: SinkConfig) -> Counter:
    """Map shard error rows onto ('ERROR', columns named in the message...) for comparison."""
    out: Counter = Counter()
    for key, n in counter.items():
        err = key[-1]
        if err is None:
            out[key] += n
        else:
            cols = sorted({c.name for c in cfg.columns if f"column '{c.name}'" in err})
            out[("ERROR",) + tuple(cols)] += n
    return out


def change(k, v, ts, diff) -> dict:
    """One update of a changelog source."""
    return {"k": k, "v": v, "ts": ts, "diff": diff}


CHANGELOG_NEW = [  # (frontier, updates first added to the source log before this run)
    (
        200,
        [
            change(1, "a", 50, 1),  # before as_of: lands at the first lower
            change(2, "b", 10, 3),
            change(2, "b", 90, -1),  # multiplicity, negative diff, before as_of
            change(3, "c", 120, 1),
            change(3, "c", 150, -1),  # inserted, then deleted
            change(4, "d", 180, 2),
            change(5, "e", 150, 1),
            change(5, "e", 150, 1),  # the same update twice
            change(6, "f", 250, 1),  # beyond the frontier: waits for the next run
        ],
    ),
    (
        300,
        [
            change(1, "a", 210, -1),
            change(1, "a2", 210, 1),  # an update at its own time
            change(2, "b", 260, -2),
            change(7, "g", 299, 1),  # just below the frontier
            change(8, "h", 350, 1),
        ],
    ),
    (
        400,
        [
            change(4, "d", 320, -2),
            change(2, "b", 330, 1),
            change(9, "i", 150, 1),  # arrives late, below lower: lands at 300
            change(7, "g", 399, -1),
        ],
    ),
]


def changelog_model(runs, t) -> Counter:
    """Per (k, v, None): the sum of diffs of the updates these runs wrote, as of t.

    An update is written by the first run whose source holds it and whose frontier is above its
    time; it lands at ``max(time, that run's lower)``.
    """
    source: list[dict] = []
    lands_at: dict[int, int] = {}  # index in source -> time in the shard
    lower = AS_OF
    for frontier, new in runs:
        source += new
        for i, upd in enumerate(source):
            if i not in lands_at and upd["ts"] < frontier:
                lands_at[i] = max(upd["ts"], lower)
        lower = frontier
    out: Counter = Counter()
    for i, time in lands_at.items():
        if time <= t:
            out[(source[i]["k"], source[i]["v"], None)] += source[i]["diff"]
    return Counter({k: n for k, n in out.items() if n != 0})


def committed_run(spark, ledger, cfg: SinkConfig, run_id: str, frontier: int):
    """One run that must mint, stage and commit its batch; returns the committed batch."""
    m, w, a = run_stages(spark, ledger, cfg, run_id, frontier)
    assert m.description is not None, m.message
    assert w.outcome == "staged", w.message
    assert a.outcome == "committed", a.message
    return ledger.get_batch(m.description.batch_id)


def append_foreign_row(spark, cfg: SinkConfig, time: int, diff: int = 1) -> None:
    """A write behind the sink's back: a plain Delta append without the sink's commit metadata."""
    from reconcile.storage import frames
    from reconcile.storage.delta import ShardTable

    row = {"k": 7, "v": "zz", "_error": None, "_time": time, "_diff": diff}
    spark.createDataFrame([row], frames.schema(cfg)).write.format("delta").mode("append").save(ShardTable(cfg).path)


def arrow_updates(rows: list[dict]):
    """``rows`` (``k``, ``v`` at time ``t``) as a (k, v) shard's update rows (diff 1, no error) in
    an Arrow table: what a foreign delta-rs writer appends, or a batch staged without Spark."""
    import pyarrow as pa

    return pa.table(
        {
            "k": pa.array([r["k"] for r in rows], pa.int64()),
            "v": pa.array([r["v"] for r in rows], pa.string()),
            "_time": pa.array([r["t"] for r in rows], pa.int64()),
            "_diff": pa.array([1] * len(rows), pa.int64()),
            "_error": pa.array([None] * len(rows), pa.string()),
        }
    )


def assert_one_line(exc: BaseException, sink: str) -> str:
    """``sink '<sink>': <cause> Remedy: <remedy>`` on one line."""
    text = str(exc)
    assert "\n" not in text and "\r" not in text, f"message is not one line: {text!r}"
    assert text.startswith(f"sink {sink!r}: "), text
    cause, sep, remedy = text.partition(" Remedy: ")
    assert sep and cause.strip() and remedy.strip(), f"no cause/remedy: {text!r}"
    return text


@dataclass(frozen=True)
class Snapshot:
    upper: int | None  # the shard's upper in the metadata (None: no shard row)
    version: int | None  # the Delta table's latest version (None: no table)
    commits: tuple  # (lower, upper, batch_id) of every batch commit in the Delta log
    committed: tuple  # batch ids in state committed in the ledger


def snapshot(spark, ledger, cfg) -> Snapshot:
    """What a failed stage must leave as it was (compare a snapshot before with one after)."""
    from reconcile.storage.commits import batch_commits
    from reconcile.storage.delta import ShardTable

    try:
        upper = ledger.get_shard(cfg.name).upper
    except ShardNotFound:
        upper = None
    version, commits = None, ()
    if ShardTable(cfg).exists():
        version, entries = ShardTable(cfg).history_since(-1)
        commits = tuple((c.lower, c.upper, c.batch_id) for c in batch_commits(entries))
    committed = tuple(b.batch_id for b in ledger.batches(cfg.name, (COMMITTED,)))
    return Snapshot(upper, version, commits, committed)


def leftover_staged(ledger, cfg: SinkConfig) -> list[str]:
    """Staged directories that should be gone: every directory under the table's ``batches/``
    must be the committed attempt of a committed batch, or belong to a batch that can still be
    committed (open, lower at or after the shard's upper)."""
    from reconcile.model import OPEN_STATES
    from reconcile.storage import files
    from reconcile.storage.delta import ShardTable

    upper = ledger.get_shard(cfg.name).upper
    out = []
    for batch_id in files.list_dirs(ShardTable(cfg).staging_root):
        b = ledger.get_batch(batch_id, cfg.name)
        stages = files.list_dirs(ShardTable(cfg).staging_path(batch_id))
        if b.state == COMMITTED:
            out += [f"{batch_id}/{s}" for s in stages if s != b.stage_id]
        elif not (b.state in OPEN_STATES and b.lower >= upper):
            out.append(batch_id)
    return out


def cli_json(text: str):
    """The JSON document an Airflow CLI command printed with ``-o json``, after any log lines
    (which may hold brackets of their own): the first line that starts with ``[`` or ``{``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("[", "{"))), None)
    return [] if start is None else json.loads("\n".join(lines[start:]))


@contextmanager
def api_server(tmp: Path, password: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """A real ``airflow api-server`` on a free port (the simple auth manager with one user,
    ``admin``, whose password is ``password``; its log in ``tmp/api-server.log``); yields its
    base URL and a JWT from ``POST /auth/token``. ``env``: extra environment of the server."""
    import os
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from harness.emulator_server import free_port, terminate, wait_until_up

    port = free_port()
    (tmp / "passwords.json").write_text(json.dumps({"admin": password}))
    full = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    full.update(
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=str(tmp / "passwords.json"),
        AIRFLOW__API_AUTH__JWT_SECRET="reconcile-pages-test",
        AIRFLOW__API__SECRET_KEY="reconcile-pages-test",
        **(env or {}),
    )
    log_path = tmp / "api-server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [str(Path(sys.executable).parent / "airflow"), "api-server", "--port", str(port)],
            env=full,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    try:
        wait_until_up(server, healthy, 120, lambda: "the api-server did not come up: " + log_path.read_text()[-3000:])
        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": "admin", "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            token = json.load(r)["access_token"]
        yield base, token
    finally:
        terminate(server)


def airflow_task_test(dag_id: str, task: str, logical: datetime, **env: str) -> str:
    """``airflow tasks test DAG_ID TASK LOGICAL`` through Airflow's CLI, in a process of its own
    (this environment without ``PYSPARK_GATEWAY_PORT``, plus ``env``); asserts that it succeeded
    and returns its output (stdout, then stderr)."""
    import os
    import subprocess
    import sys

    full = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    full.update(env)
    out = subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "tasks", "test", dag_id, task, logical.isoformat()],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    return text


KV_SCHEMA = [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}]


def json_query(path: Path | str) -> dict:
    """A query section reading the JSON-lines folder ``path`` as view ``src``: ``SELECT k, v``."""
    return {"sources": {"src": {"format": "json", "path": str(path)}}, "sql": "SELECT k, v FROM src"}


def daily_sink(sinks: Path, name: str, kind: str = "query", *, retries: int = 1, **fields) -> Path:
    """A daily sink file of columns (k, v) from 2026-01-01, as the Airflow tests schedule them;
    ``fields``: the kind's section and any field to set or override."""
    sinks.mkdir(parents=True, exist_ok=True)
    data = {
        "name": name,
        "kind": kind,
        "schema": KV_SCHEMA,
        "partitions": 2,
        "schedule": "@daily",
        "start_date": "2026-01-01",
        "as_of": "2026-01-01T00:00:00Z",
        "retries": retries,
        **fields,
    }
    path = sinks / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def orders_config(tmp_path: Path, **changes) -> Path:
    """The query sink ``orders`` with ``changes`` applied: a key ``a__0__b`` sets ``data["a"][0]["b"]``."""
    data = {
        "name": "orders",
        "kind": "query",
        "start_date": "2024-01-01",
        "schema": KV_SCHEMA,
        "query": {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src"},
    }
    data = json.loads(json.dumps(data))  # a copy: the schema list is shared
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[int(last) if isinstance(node, list) else last] = value
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def until(what: str, probe, timeout: float = 900, every: float = 1.0):
    """``probe()``'s first truthy answer, polled every ``every`` s; the test fails after ``timeout``."""
    import time

    import pytest

    deadline = time.time() + timeout
    while time.time() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(every)
    pytest.fail(f"timed out waiting for {what}")


def parse_source(path: Path) -> ast.Module:
    """The syntax tree of the Python file ``path``, parsed with the cyclic garbage collector
    paused. On Python 3.11 the AST builder's recursion count is shared by every parse in the
    interpreter: a collection inside the parse can run py4j's finalizers, whose log line for a
    stale gateway connection formats a traceback, which parses its source line for the caret
    marks; the outer parse then fails with "AST constructor recursion depth mismatch"."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(path.read_text(), filename=str(path))
    finally:
        if enabled:
            gc.enable()


# -- crashes: a stage killed at a fail point -----------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def run_job_killed_at(stage: str, cfg, run_id: str, point: str, remote: str | None) -> subprocess.CompletedProcess:
    """The stage's job killed at ``point``; a write is a client of the Spark Connect server at
    ``remote`` (every fail point is in the driver's Python, between Spark actions), or with
    ``remote`` None its own local Spark JVM."""
    if stage == "write":
        cmd = [sys.executable, str(ROOT / "jobs" / "write_correction.py"), "--sink", cfg.name, "--run-id", run_id]
    else:  # the append runs without a JVM: the CLI's append is the DAG's task
        cmd = [sys.executable, "-m", "reconcile", "append", cfg.name, "--run-id", run_id]
    env = {**os.environ, "RECONCILE_FAILPOINTS": f"{point}=kill"}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    if remote:
        env["RECONCILE_SPARK_REMOTE"] = remote
    proc = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 137, f"expected a kill at {point}, got {proc.returncode}: {proc.stderr[-2000:]}"
    return proc


def previous_release(tmp_path: Path, commit: str) -> Path:
    """The package of an earlier release (a commit of this repository), as ``git archive`` gives it."""
    import subprocess
    import tarfile
    from io import BytesIO

    import pytest

    root = Path(__file__).resolve().parents[1]
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit, "include"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.fail(f"cannot read release {commit} from git: {archive.stderr.decode()[:300]}")
    out = tmp_path / f"release-{commit}"
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out / "include"


def run_previous(package: Path, sink: str, frontiers: list[int], env_extra: dict) -> None:
    """Batches of ``sink`` up to each frontier, by an earlier release's code in a process of its own."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **env_extra, "PYTHONPATH": str(package)}
    script = (
        "import sys\n"
        "from reconcile import cli\n"
        f"for f in {frontiers!r}:\n"
        f"    rc = cli.main(['run', {sink!r}, '--frontier', str(f), '--run-id', f'old-{{f}}'])\n"
        "    if rc: sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

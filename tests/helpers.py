"""Test helpers: sink configs, source files, running batches, and the independent model.

The model computes what a shard must hold with plain Python (Counters), never with the code
under test.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from reconcile.config import SinkConfig, load_file
from reconcile.sink import run as pipeline


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
        "as_of": fields.pop("as_of", 100),
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


def run_batch(spark, store, cfg: SinkConfig, run_id: str, frontier: int, *, attempt: int = 1):
    """:func:`reconcile.pipeline.run_batch` for one run; returns its (mint, write, append) results."""
    r = pipeline.run_batch(spark, store, cfg, run_id, frontier, attempt=attempt)
    return r.mint, r.write, r.append


def _log_rows(cfg: SinkConfig) -> list[dict]:
    """Every update the Delta table holds, read with delta-rs (no Spark: independent of the
    sink's own read path, and a tiny table reads in milliseconds instead of a Spark job)."""
    from deltalake import DeltaTable

    from reconcile.storage import delta as storage

    return DeltaTable(storage.table_path(cfg)).to_pyarrow_table().to_pylist()


def shard_as_of(cfg: SinkConfig, t: int) -> Counter:
    """The shard as of t as a multiset of (row..., error) tuples."""
    out: Counter = Counter()
    for r in _log_rows(cfg):
        if r["_time"] <= t:
            out[tuple(r[c] for c in cfg.column_names) + (r["_error"],)] += r["_diff"]
    return +out


def update_log(cfg: SinkConfig) -> list[dict]:
    """Every update the Delta table holds, as dicts."""
    return _log_rows(cfg)


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


def leftover_staged(store, cfg: SinkConfig) -> list[str]:
    """Staged directories that should be gone: every directory under the table's ``batches/``
    must be the committed attempt of a committed batch, or belong to a batch that can still be
    committed (open, lower at or after the shard's upper)."""
    from reconcile.model import COMMITTED, OPEN_STATES
    from reconcile.storage import delta as storage

    upper = store.get_shard(cfg.name).upper
    out = []
    for batch_id in storage.list_dirs(storage.staging_root(cfg)):
        b = store.get_batch(batch_id, cfg.name)
        stages = storage.list_dirs(storage.staging_path(cfg, batch_id))
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
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError("the api-server did not come up: " + log_path.read_text()[-3000:])
            time.sleep(0.5)
        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": "admin", "password": password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            token = json.load(r)["access_token"]
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

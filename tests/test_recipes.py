"""The operating recipes of docs/operating.md run verbatim: Airflow started locally on the embedded
default (api-server, scheduler, dag-processor; SQLite), a backfill beside the schedule, and clearing
a run's append without a prompt (that run's append runs again, and only it, finding its batch
committed). The demo sink's shard is checked against a plain-Python model of its source after each,
and the ledger against the Delta log.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import time
import urllib.request
from collections import Counter, defaultdict
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import shard_as_of

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "docs" / "operating.md"


def recipe(name: str) -> str:
    """The bash block that follows ``<!-- recipe: name -->`` in docs/operating.md."""
    text = RECIPES.read_text()
    found = re.search(rf"<!-- recipe: {name} -->\s*```bash\n(.*?)```", text, re.S)
    assert found, f"{RECIPES.relative_to(ROOT)} has no recipe {name!r}"
    return found.group(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bash(script: str, env: dict, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f"set -e\n. scripts/env.sh\n{script}"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,  # a prompt would fail: recipes must not ask
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def _airflow_db(env: dict, sql: str) -> list[dict]:
    """Rows of the local Airflow's SQLite database, read directly: polling with the CLI would
    start a whole Airflow (~3 s of CPU) every few seconds."""
    path = Path(env["RECONCILE_HOME"]) / "airflow" / "airflow.db"
    if not path.exists():
        return []
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)) as db:
        db.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in db.execute(sql)]
        except sqlite3.OperationalError:  # not migrated yet, or locked past the timeout
            return []


def _runs(env) -> list[dict]:
    return _airflow_db(env, "SELECT run_id, state FROM dag_run WHERE dag_id = 'demo_orders' ORDER BY run_id")


def _wait(env, predicate, what: str, timeout: int = 600) -> list[dict]:
    deadline = time.time() + timeout
    runs: list[dict] = []
    while time.time() < deadline:
        runs = _runs(env)
        if any(r["state"] == "failed" for r in runs):
            pytest.fail(f"a run failed: {runs}")
        if predicate(runs):
            return runs
        time.sleep(3)
    pytest.fail(f"timed out waiting for {what}: {runs}")


def _model(orders: list[dict]) -> Counter:
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal("0")])
    for o in orders:
        totals[o["customer"]][0] += 1
        totals[o["customer"]][1] += Decimal(str(o["amount"]))
    return Counter({(c, n, t.quantize(Decimal("0.01")), None): 1 for c, (n, t) in totals.items()})


@pytest.fixture
def local_airflow(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYSPARK_GATEWAY", "RECONCILE_"))}
    env.update(RECONCILE_HOME=str(tmp_path / "home"), AIRFLOW_PORT=str(port))
    started = subprocess.Popen(
        ["bash", "-c", recipe("ui") + "\nwait"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(tmp_path / "airflow.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=5)
                break
            except OSError:
                assert started.poll() is None, (tmp_path / "airflow.log").read_text()[-3000:]
                time.sleep(2)
        else:
            pytest.fail("the api-server did not come up: " + (tmp_path / "airflow.log").read_text()[-3000:])
        yield env, tmp_path / "home"
    finally:
        os.killpg(started.pid, signal.SIGTERM)
        try:
            started.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(started.pid, signal.SIGKILL)


def test_operating_recipes_run_verbatim(local_airflow, spark, monkeypatch):
    from reconcile.config_loading import load_file
    from reconcile.sink import check
    from reconcile.storage.ledger import Ledger

    env, home = local_airflow
    orders = [{"customer": c, "amount": a} for c, a in [("ann", 10.5), ("bob", 3), ("ann", 1.25), ("cy", 7)]]
    (home / "demo" / "orders").mkdir(parents=True)
    (home / "demo" / "orders" / "part-0.json").write_text("".join(json.dumps(o) + "\n" for o in orders))
    deadline = time.time() + 120
    while not _airflow_db(env, "SELECT 1 FROM serialized_dag WHERE dag_id = 'demo_orders'"):
        assert time.time() < deadline, "the dag-processor did not parse demo_orders"
        time.sleep(3)

    done = _bash(recipe("backfill"), env)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = _wait(
        env,
        lambda rs: (
            len([r for r in rs if r["run_id"].startswith("backfill__")]) == 3
            and len([r for r in rs if r["run_id"].startswith("scheduled__")]) >= 1
            and all(r["state"] == "success" for r in rs)
        ),
        "three backfill runs and the scheduled run",
    )
    # the run notes: the ui recipe's user and connection (the default auth manager's) set them
    deadline = time.time() + 120
    while True:
        notes = _airflow_db(
            env,
            "SELECT r.run_id, n.content FROM dag_run r JOIN dag_run_note n ON n.dag_run_id = r.id "
            "WHERE r.dag_id = 'demo_orders' AND n.content IS NOT NULL AND n.content != ''",
        )
        if {n["run_id"] for n in notes} >= {r["run_id"] for r in runs}:
            break
        assert time.time() < deadline, (notes, runs, (home.parent / "airflow.log").read_text()[-3000:])
        time.sleep(3)
    assert any("committed" in n["content"] for n in notes), notes
    monkeypatch.setenv("RECONCILE_HOME", str(home))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(home / "warehouse"))
    cfg = load_file(ROOT / "include" / "sinks" / "demo_orders.yaml")
    ledger = Ledger(f"sqlite:///{home / 'metadata.db'}")
    shard = ledger.get_shard("demo_orders")
    assert shard_as_of(cfg, shard.upper - 1) == _model(orders)
    assert check.violations(ledger, cfg) == []
    version = shard.delta_version

    before = {r["run_id"]: len(_append_attempts(home, r["run_id"])) for r in runs}
    target = "backfill__2026-01-03T00:00:00+00:00"
    if _task_state(env, target, "append") == "skipped":
        # the scheduled run committed past 2026-01-03 before that backfill run minted (Airflow 3
        # limits backfill runs apart from scheduled ones; the docs say either may commit first):
        # its mint found the interval covered and skipped the rest, so a clear runs no append
        _clear_of_a_covered_run(env, target, runs, before)
        assert ledger.get_shard("demo_orders").delta_version == version
        assert shard_as_of(cfg, shard.upper - 1) == _model(orders)
        ledger.dispose()
        return
    cleared = _bash(recipe("clear"), env)  # the run of 2026-01-03: its append and what follows
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    deadline = time.time() + 180
    while len(_append_attempts(home, target)) <= before[target]:  # the cleared append ran again
        assert time.time() < deadline, (
            f"the recipe cleared nothing: {cleared.stdout[-1000:]} {cleared.stderr[-1000:]}; "
            f"the runs: {_runs(env)}; the target's task instances: "
            + str(
                _airflow_db(
                    env,
                    "SELECT r.logical_date, r.state AS run_state, r.clear_number, t.task_id, t.state, t.try_number "
                    f"FROM dag_run r JOIN task_instance t ON t.run_id = r.run_id AND t.dag_id = r.dag_id "
                    f"WHERE r.dag_id = 'demo_orders' AND r.run_id = '{target}'",
                )
            )
            + "; "
            f"Airflow's log: {(home.parent / 'airflow.log').read_text()[-3000:]}"
        )
        time.sleep(3)
    _wait(env, lambda rs: all(r["state"] == "success" for r in rs) and len(rs) == len(runs), "the cleared run")
    rerun = _append_attempts(home, target)[-1].read_text()
    assert "already committed in Delta version" in rerun or "nothing to" in rerun, rerun[-2000:]
    after = {r["run_id"]: len(_append_attempts(home, r["run_id"])) for r in runs}
    assert after == {r: n + (r == target) for r, n in before.items()}  # that run's append only
    assert ledger.get_shard("demo_orders").delta_version == version
    assert shard_as_of(cfg, shard.upper - 1) == _model(orders)
    ledger.dispose()


def _task_state(env: dict, run_id: str, task_id: str) -> str | None:
    rows = _airflow_db(
        env,
        f"SELECT state FROM task_instance WHERE dag_id = 'demo_orders' AND run_id = '{run_id}' "
        f"AND task_id = '{task_id}'",
    )
    return rows[0]["state"] if rows else None


def _clear_of_a_covered_run(env: dict, target: str, runs: list[dict], before: dict) -> None:
    """The clear recipe on a run whose mint found nothing to do: Airflow clears the append and
    skips it again (its write was skipped); the run succeeds and no append runs anywhere."""
    query = f"SELECT clear_number FROM dag_run WHERE dag_id = 'demo_orders' AND run_id = '{target}'"
    cleared_before = _airflow_db(env, query)[0]["clear_number"]
    cleared = _bash(recipe("clear"), env)
    assert cleared.returncode == 0, cleared.stderr[-2000:]
    deadline = time.time() + 180
    while not (
        _airflow_db(env, query)[0]["clear_number"] > cleared_before
        and _task_state(env, target, "append") == "skipped"
        and all(r["state"] == "success" for r in _runs(env))
    ):
        assert time.time() < deadline, (_runs(env), _task_state(env, target, "append"))
        time.sleep(3)
    home = Path(env["RECONCILE_HOME"])
    assert {r["run_id"]: len(_append_attempts(home, r["run_id"])) for r in runs} == before


def _append_attempts(home: Path, run_id: str) -> list[Path]:
    """The attempts of a run's append, as Airflow's task log files."""
    folder = home / "airflow" / "logs" / "dag_id=demo_orders" / f"run_id={run_id}" / "task_id=append"
    return sorted(folder.glob("attempt=*.log"))

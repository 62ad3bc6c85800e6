"""Airflow's real scheduler (LocalExecutor, api-server, dag-processor; Airflow's DB on
PostgreSQL), one stack for the module, running sinks:

- `airflow backfill create` over intervals a shard already covers: every backfill run is a no-op
  (mint finds nothing to do and skips the rest, no new Delta version); over new intervals, the
  backfill catches the shard up one batch per run, in order;
- a write task killed outright (SIGKILL, as the OOM killer does) leaves a line of the sink's in
  its log: the attempt, what was staged and committed, what happens next;
- an append that fails for real (the table's ``_delta_log`` made immutable), in a run with a
  logical date (a backfill's) and in a manual run without one: each remedy its task log prints
  is run exactly as printed once the cause is fixed, on a paused DAG and on an unpaused one, and
  the task ends green with the batch committed (ledger and Delta log) and the shard equal to a
  plain-Python model of the source;
- a write that no retry fixes (its Spark connection is not defined; its source path does not
  exist) fails at once, final in the ledger with its cause and remedy, NEEDS ACTION in
  ``status`` (exit 1) and in the run's note (set through Airflow's REST API), until the cause is
  fixed and the printed remedy, run as printed, commits the batch: then resolved history.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.airflow_stack import AIRFLOW, AirflowStack, sink_env
from helpers import daily_sink, json_query, model_kv, shard_as_of, until, write_json_rows

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]
DAY = 86_400_000
AS_OF = 1767225600000  # 2026-01-01T00:00:00Z
ROWS = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
READ_ONLY_AT_START = ("sched_catchup",)  # its scheduled run mints nothing
FAILING_APPENDS = ("rem_dated", "rem_manual")  # their Delta log immutable from the start
MISSING_CONN = "spark_missing"  # fail_conn's write runs on it: not defined until the test defines it
SERVICE = {"service": "service-password"}  # the tasks' Airflow user, for the runs' notes
SLEEP_SQL = "reflect('java.lang.Thread', 'sleep', CAST(20000 AS BIGINT)) IS NULL"  # 20 s a row, in Spark


def _sink(sinks: Path, src: Path, name: str, schedule: str | None = "@daily", **extra) -> None:
    daily_sink(sinks, name, schedule=schedule or "none", as_of=AS_OF, catchup=False, query=json_query(src), **extra)


@dataclass
class Services:
    stack: AirflowStack
    env: dict
    home: Path
    sinks: Path
    src: Path


@pytest.fixture(scope="module")
def airflow_services(tmp_path_factory, connect_url):
    """Airflow's services for the module, with the write tasks on the session's Spark Connect
    server (a ``spark_connect`` connection: the production shape of many small sinks;
    spark-submit under Airflow is covered by tests/test_airflow.py and tests/test_cluster.py).
    Every sink of the module is in place before the services start."""
    from reconcile.storage.ledger import Ledger

    postgres = os.environ.get("RECONCILE_TEST_POSTGRES_URL")
    if not postgres:
        pytest.skip("RECONCILE_TEST_POSTGRES_URL not set")
    home = tmp_path_factory.mktemp("scheduler")
    sinks, src = home / "sinks", home / "src"
    sinks.mkdir()
    write_json_rows(src, ROWS)
    for name in ("sched_covered", "sched_catchup", "rem_dated"):
        _sink(sinks, src, name)
    _sink(sinks, src, "rem_manual", schedule=None)
    slow = {**json_query(src), "sql": f"SELECT k, v FROM src WHERE {SLEEP_SQL}"}  # the write waits there
    daily_sink(sinks, "killed_write", schedule="none", as_of=AS_OF, catchup=False, query=slow, retries=0)
    # writes no retry fixes (retries to spare: they must not be used)
    _sink(sinks, src, "fail_conn", spark_conn_id=MISSING_CONN, retries=2)
    _sink(sinks, home / "src_missing", "fail_source", schedule=None, retries=2)
    (home / "passwords.json").write_text(json.dumps(SERVICE))
    users = {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "service:op",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
    }
    stack = AirflowStack(home, postgres, sink_env(home, sinks, connect_url, **users))
    # the tasks' own login to Airflow's REST API, for the runs' notes (docs/operating.md)
    stack.env["AIRFLOW_CONN_RECONCILE_AIRFLOW_API"] = json.dumps(
        {
            "conn_type": "http",
            "host": f"http://127.0.0.1:{stack.port}",
            "login": "service",
            "password": SERVICE["service"],
        }
    )
    ledger = Ledger(stack.env["RECONCILE_METADATA_URL"])
    for name in READ_ONLY_AT_START:
        ledger.ensure_shard(name, AS_OF)
        ledger.set_read_only(name, True)
    ledger.dispose()
    logs = [_immutable_log(sinks, name, stack.env["RECONCILE_WAREHOUSE"]) for name in FAILING_APPENDS]
    try:
        stack.start()
        yield Services(stack, stack.env, home, sinks, src)
    finally:
        stack.close()
        for log_dir in logs:
            subprocess.run(["chattr", "-i", str(log_dir)], check=False)


def _immutable_log(sinks: Path, name: str, warehouse: str) -> Path:
    """Make the sink's appends fail for real: its table exists (its first write would create
    it) with an immutable Delta log (chattr +i, as root), so the OS refuses each commit."""
    from reconcile.config_loading import load_file
    from reconcile.storage.delta import ShardTable

    os.environ["RECONCILE_WAREHOUSE"], before = warehouse, os.environ.get("RECONCILE_WAREHOUSE")
    try:
        table = ShardTable(load_file(sinks / f"{name}.yaml"))
        table.ensure()
    finally:
        if before is None:
            del os.environ["RECONCILE_WAREHOUSE"]
        else:
            os.environ["RECONCILE_WAREHOUSE"] = before
    log_dir = Path(table.path) / "_delta_log"
    subprocess.run(["chattr", "+i", str(log_dir)], check=True)
    return log_dir


@pytest.fixture
def services(airflow_services, monkeypatch):
    """The module's services, this test process reading the same warehouse and ledger."""
    monkeypatch.setenv("RECONCILE_WAREHOUSE", airflow_services.env["RECONCILE_WAREHOUSE"])
    monkeypatch.setenv("RECONCILE_METADATA_URL", airflow_services.env["RECONCILE_METADATA_URL"])
    monkeypatch.setenv("RECONCILE_SINKS_DIR", airflow_services.env["RECONCILE_SINKS_DIR"])
    return airflow_services


def _runs(stack: AirflowStack, dag_id: str) -> list[dict]:
    """The DAG's runs, straight from Airflow's database: polling with the CLI would start a whole
    Airflow (~3 s of CPU) every few seconds, beside the scheduler it waits on."""
    return stack._rows("SELECT run_id, state FROM dag_run WHERE dag_id = :d ORDER BY run_id", d=dag_id)


def _wait(stack: AirflowStack, dag_id, predicate, what: str, timeout: int = 900) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = _runs(stack, dag_id)
        if any(r["state"] == "failed" for r in runs):
            pytest.fail(f"{dag_id}: a run failed: {runs}")
        if predicate(runs):
            return runs
        time.sleep(2)
    pytest.fail(f"{dag_id}: timed out waiting for {what}: {_runs(stack, dag_id)}")


def _backfill(env, dag_id, start: str = "2026-01-02", end: str = "2026-01-04") -> None:
    subprocess.run(
        [
            AIRFLOW,
            "backfill",
            "create",
            "--dag-id",
            dag_id,
            "--from-date",
            start,
            "--to-date",
            end,
            "--max-active-runs",
            "1",
        ],
        env=env,
        check=True,
        capture_output=True,
    )


def _done(runs, prefix: str, n: int) -> bool:
    mine = [r for r in runs if r["run_id"].startswith(prefix)]
    return len(mine) == n and all(r["state"] == "success" for r in mine)


def test_scheduler_runs_and_backfills_in_order(services):
    from reconcile.config_loading import load_file
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    env, sinks = services.env, services.sinks
    ledger = Ledger(env["RECONCILE_METADATA_URL"])
    for dag_id in ("sched_covered", "sched_catchup"):
        _wait(services.stack, dag_id, lambda runs: _done(runs, "scheduled__", 1), "the scheduled run")
    ledger.set_read_only("sched_catchup", False)
    covered = load_file(sinks / "sched_covered.yaml")
    version = ShardTable(covered).latest_version()
    upper = ledger.get_shard("sched_covered").upper
    assert upper > AS_OF + 300 * DAY  # the scheduled run reached today

    for dag_id in ("sched_covered", "sched_catchup"):
        _backfill(env, dag_id)
    for dag_id in ("sched_covered", "sched_catchup"):
        _wait(services.stack, dag_id, lambda runs: _done(runs, "backfill__", 3), "three backfill runs")

    # Covered intervals: no-op runs, nothing written.
    assert ShardTable(covered).latest_version() == version
    assert ledger.get_shard("sched_covered").upper == upper
    # New intervals: one batch per run, in order, each equal to the source.
    catchup = load_file(sinks / "sched_catchup.yaml")
    batches = [b for b in ledger.batches("sched_catchup") if b.state == "committed"]
    assert [(b.lower, b.upper) for b in sorted(batches, key=lambda b: b.created_at)] == [
        (AS_OF, AS_OF + DAY),
        (AS_OF + DAY, AS_OF + 2 * DAY),
        (AS_OF + 2 * DAY, AS_OF + 3 * DAY),
    ]
    for b in batches:
        assert shard_as_of(catchup, b.upper - 1) == model_kv(ROWS)
    ledger.dispose()


# --- every printed remedy, run as printed ----------------------------------------------------

COMMAND = re.compile(r"`((?:airflow|python -m reconcile) [^`]+)`")


_until = until  # the module polls Airflow once a second


def _append_log(services, dag_id: str, run_id: str) -> str:
    """The append task's log, every attempt (Airflow's own files, JSON lines)."""
    folder = services.home / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=append"
    return "\n".join(f.read_text() for f in sorted(folder.glob("attempt=*.log")))


def _remedies(text: str) -> list[str]:
    """The commands of the last failure line that names any (JSON-escaped quotes undone)."""
    lines = [ln for ln in text.splitlines() if COMMAND.search(ln) and "failed" in ln]
    assert lines, f"no remedy with a command in the log: {text[-3000:]}"
    return list(dict.fromkeys(c.replace('\\"', '"') for c in COMMAND.findall(lines[-1])))


def _as_printed(services, command: str) -> subprocess.CompletedProcess:
    """A printed command in the project's environment (docs/operating.md: `. scripts/env.sh`)."""
    done = subprocess.run(
        ["bash", "-c", f". scripts/env.sh && {command}"],
        cwd=ROOT,
        env=services.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # `status` exits 1 while the failure it shows needs action (docs/operating.md), and says so
    needs_action = command.split()[3:4] == ["status"] and "NEEDS ACTION:" in done.stdout
    assert done.returncode == (1 if needs_action else 0), f"{command}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    return done


def _state(services, dag_id: str, run_id: str, task: str) -> str | None:
    tis = {t["task_id"]: t["state"] for t in services.stack.task_instances(dag_id, run_id)}
    return tis.get(task)


def _committed_in_delta_log(cfg, batch_id: str) -> int:
    """The Delta version whose commit carries the batch (read with delta-rs, not the sink)."""
    from deltalake import DeltaTable

    from reconcile.storage.delta import ShardTable

    versions = [
        h["version"]
        for h in DeltaTable(ShardTable(cfg).path).history()
        if json.loads(h.get("userMetadata") or "{}").get("reconcile", {}).get("batch_id") == batch_id
    ]
    assert len(versions) == 1, versions
    return versions[0]


def _failed_append(services, name: str, prefix: str) -> tuple[str, list[str], object]:
    """The run of ``name`` whose append failed for real (its Delta log immutable), once Airflow
    gave up on it; then the cause is fixed. Returns (run id, the remedies it printed, cfg)."""
    from reconcile.config_loading import load_file
    from reconcile.storage.delta import ShardTable

    cfg = load_file(services.sinks / f"{name}.yaml")
    run_id = _until(f"{name}'s run", lambda: [r["run_id"] for r in services.stack.runs(name, f"{prefix}%")])[0]

    def append_failed() -> bool:
        tis = {t["task_id"]: t["state"] for t in services.stack.task_instances(name, run_id)}
        ended = (services.stack.dag_run(name, run_id) or {}).get("state") in ("failed", "success")
        assert tis.get("append") == "failed" or not ended, f"{name}'s run ended otherwise: {tis}"
        return tis.get("append") == "failed"

    _until(f"{name}'s append to fail", append_failed)
    subprocess.run(["chattr", "-i", str(Path(ShardTable(cfg).path) / "_delta_log")], check=True)  # fixed
    return run_id, _remedies(_append_log(services, name, run_id)), cfg


def _paused(stack: AirflowStack, dag_id: str) -> bool:
    return bool(stack._rows("SELECT is_paused FROM dag WHERE dag_id = :d", d=dag_id)[0]["is_paused"])


@contextmanager
def _api(stack: AirflowStack):
    """Airflow's REST API as the tasks' user (what the UI calls; no CLI start per call)."""
    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as client:
        token = client.post("/auth/token", json={"username": "service", "password": SERVICE["service"]})
        token.raise_for_status()
        client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        yield client


def _pause(stack: AirflowStack, dag_id: str) -> None:
    """Pause the DAG, as an operator would in the UI: a clear alone then leaves its run queued."""
    with _api(stack) as api:
        done = api.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": True})
    assert done.status_code == 200 and _paused(stack, dag_id), done.text


def _note(stack: AirflowStack, dag_id: str, run_id: str) -> str:
    """The run's note (Airflow's dag_run_note), as the UI shows it; "" without one."""
    rows = stack._rows(
        "SELECT n.content FROM dag_run r JOIN dag_run_note n ON n.dag_run_id = r.id "
        "WHERE r.dag_id = :d AND r.run_id = :r",
        d=dag_id,
        r=run_id,
    )
    return (rows[0]["content"] or "") if rows else ""


def test_every_remedy_printed_for_a_failed_append_works_as_printed(services):
    """The scheduled run names exactly its run (its logical date); a manual run, which has none,
    is cleared by its failed state or appended by run id without Airflow. Each command runs as
    printed once the cause is fixed, the DAG paused (an Airflow command printed unpauses it
    first: a paused DAG's cleared task never starts) or not (test below); the task ends green,
    its batch committed once, the shard equal to the model of the source."""
    from reconcile.storage.ledger import Ledger

    env, stack = services.env, services.stack
    ledger = Ledger(env["RECONCILE_METADATA_URL"])
    # a manual run fails beside the scheduled run of rem_dated (once the DAG is parsed)
    _until("a manual run of rem_manual", lambda: stack.airflow("dags", "trigger", "rem_manual").returncode == 0)
    dated, printed, cfg = _failed_append(services, "rem_dated", "scheduled__")
    day = stack.dag_run("rem_dated", dated)["logical_date"].isoformat()
    assert printed == [
        f"airflow dags unpause rem_dated && airflow tasks clear rem_dated -t append -d -y -s {day} -e {day}",
        f"python -m reconcile append rem_dated --run-id {dated}",
    ], printed
    status = _as_printed(services, "python -m reconcile status rem_dated").stdout
    assert printed[0] in status, status  # status names the same command
    assert ledger.batch_of_run("rem_dated", dated).state != "committed"
    _pause(stack, "rem_dated")
    _as_printed(services, printed[0])  # on the paused DAG
    assert not _paused(stack, "rem_dated")
    _until("the cleared append", lambda: _state(services, "rem_dated", dated, "append") == "success")
    batch = ledger.batch_of_run("rem_dated", dated)
    assert (batch.state, batch.lower) == ("committed", AS_OF)
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(ROWS)
    _until("the run's end", lambda: (stack.dag_run("rem_dated", dated) or {}).get("state") == "success")

    manual, printed, cfg = _failed_append(services, "rem_manual", "manual__")
    assert stack.dag_run("rem_manual", manual)["logical_date"] is None
    assert printed == [
        "airflow dags unpause rem_manual && airflow tasks clear rem_manual -t append -d -f -y",
        f"python -m reconcile append rem_manual --run-id {manual}",
    ], printed
    _pause(stack, "rem_manual")
    _as_printed(services, printed[1])  # exactly this run, without Airflow (the DAG paused)
    batch = ledger.batch_of_run("rem_manual", manual)
    assert batch.state == "committed" and _state(services, "rem_manual", manual, "append") == "failed"
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(ROWS)
    _as_printed(services, printed[0])  # and Airflow's task, by its failed state (the DAG still paused)
    assert not _paused(stack, "rem_manual")
    _until("the cleared append", lambda: _state(services, "rem_manual", manual, "append") == "success")
    assert ledger.batch_of_run("rem_manual", manual).delta_version == batch.delta_version  # committed once
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    _until("the run's end", lambda: (stack.dag_run("rem_manual", manual) or {}).get("state") == "success")
    ledger.dispose()


def _write_try(stack: AirflowStack, dag_id: str, run_id: str) -> dict:
    rows = stack._rows(
        "SELECT state, try_number, max_tries FROM task_instance WHERE dag_id = :d AND run_id = :r AND task_id = 'write'",
        d=dag_id,
        r=run_id,
    )
    return rows[0] if rows else {}


def _status(services, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", f". scripts/env.sh && python -m reconcile status {name}"],
        cwd=ROOT,
        env=services.env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_write_no_retry_fixes_needs_action_everywhere_until_its_printed_remedy_commits_it(services, connect_url):
    """A write whose Spark connection is not defined (the scheduled run: a logical date) and one
    whose source path does not exist (a manual run): each fails at once though retries are
    left, final on the run's batch with its cause and remedy; ``status`` says NEEDS ACTION and
    exits 1; the run's note holds the cause and the remedy. Once the cause is fixed (the
    connection defined, the source written), the rerun the remedy prints, run as printed on an
    unpaused DAG (the connection) and on a paused one (the source), commits the batch: the
    Delta log has its commit, the shard equals the model, ``status`` exits 0 and shows the
    failure as resolved history."""
    stack = services.stack
    with _api(stack) as api:  # a manual run: no logical date
        _until(
            "a manual run of fail_source",
            lambda: api.post("/api/v2/dags/fail_source/dagRuns", json={"logical_date": None}).status_code == 200,
        )
    host, port = connect_url.removeprefix("sc://").split(":")

    def define_connection() -> None:  # as the remedy spells it for a Spark Connect server
        added = stack.airflow(
            *("connections", "add", MISSING_CONN, "--conn-type", "spark_connect", "--conn-host", host),
            *("--conn-port", port),
        )
        assert added.returncode == 0, added.stdout + added.stderr

    def write_source() -> None:
        write_json_rows(services.home / "src_missing", ROWS)
        _pause(stack, "fail_source")  # and the DAG paused: the printed rerun unpauses it

    cases = {  # sink: (its run's prefix, the cause, its fix)
        "fail_conn": (
            "scheduled__",
            f"the Airflow connection '{MISSING_CONN}' the sink's write runs on isn't defined",
            define_connection,
        ),
        "fail_source": (
            "manual__",
            f"cannot read source query.sources.src (json at {services.home / 'src_missing'})",
            write_source,
        ),
    }
    failed = {name: _failed_write(services, name, prefix, cause) for name, (prefix, cause, _) in cases.items()}
    for name, (_, _, fix) in cases.items():  # both reruns at once: the scheduler runs them side by side
        fix()
        _as_printed(services, failed[name][1])
        assert not _paused(stack, name)
    for name, (_, cause, _) in cases.items():
        _committed_with_the_failure_as_history(services, name, failed[name][0], cause)


def _failed_write(services, name: str, prefix: str, cause: str) -> tuple[str, str]:
    """The run of ``name`` whose write failed for ``cause``, shown as needing action in the
    task, the ledger, ``status``, the sink's page and the run's note: (its run id, the rerun
    printed)."""
    from html import unescape

    from reconcile.airflow import ui
    from reconcile.storage.ledger import Ledger

    stack = services.stack
    ledger = Ledger(services.env["RECONCILE_METADATA_URL"])
    run_id = _until(f"{name}'s run", lambda: [r["run_id"] for r in stack.runs(name, f"{prefix}%")])[0]
    _until(f"{name}'s run to fail", lambda: (stack.dag_run(name, run_id) or {}).get("state") == "failed")
    tried = _write_try(stack, name, run_id)
    assert (tried["state"], tried["try_number"], tried["max_tries"]) == ("failed", 1, 2), tried  # not retried
    batch = ledger.batch_of_run(name, run_id)
    assert (batch.state, batch.failure_kind) == ("minted", "final"), (batch.state, batch.message)
    assert batch.message.startswith(f"sink '{name}': {cause}") and " Remedy: " in batch.message, batch.message

    # status: FAILED, NEEDS ACTION, exit 1, with the cause and the remedy's commands
    shown = _status(services, name)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    line = next((ln for ln in shown.stdout.splitlines() if ln.startswith("  NEEDS ACTION: ")), "")
    assert f"batch {batch.batch_id}" in line and f"final: sink '{name}': {cause}" in line, shown.stdout
    assert "FAILED, needs action: final: " in shown.stdout, shown.stdout
    printed = list(dict.fromkeys(COMMAND.findall(line)))
    day = stack.dag_run(name, run_id)["logical_date"]
    if day is None:  # a manual run: selected by its failed state
        rerun = f"airflow dags unpause {name} && airflow tasks clear {name} -t write -d -f -y"
        assert printed == [rerun], printed
    else:
        rerun = f"airflow dags unpause {name} && airflow tasks clear {name} -t write -d -y -s {day.isoformat()} -e {day.isoformat()}"
        add = f"airflow connections add {MISSING_CONN} --conn-type spark --conn-host 'local[*]'"
        assert printed == [add, rerun], printed
    # the run's note: the cause and the remedy
    note = _until(f"{name}'s note", lambda: _note(stack, name, run_id), timeout=120)
    assert note.startswith(f"write failed (not retried): sink '{name}': {cause}"), note
    assert " Remedy: " in note and f"`{rerun}`" in note, note
    # the sink's page (Reconcile shards): the batch red, with the cause and the remedy
    page = unescape(ui.render_sink(name))
    assert "class=bad" in page and f"final: sink '{name}': {cause}" in page and rerun in page, page
    ledger.dispose()
    return run_id, rerun


def _committed_with_the_failure_as_history(services, name: str, run_id: str, cause: str) -> None:
    """The rerun run: the batch committed (ledger, Delta log, the model), ``status`` exits 0 and
    shows the failure as resolved history, so do the sink's page (grey) and the run's note."""
    from html import unescape

    from reconcile.airflow import ui
    from reconcile.config_loading import load_file
    from reconcile.storage.ledger import Ledger

    stack = services.stack
    ledger = Ledger(services.env["RECONCILE_METADATA_URL"])
    _until(f"{name}'s cleared run", lambda: (stack.dag_run(name, run_id) or {}).get("state") == "success")
    assert _write_try(stack, name, run_id)["try_number"] == 2
    batch = ledger.batch_of_run(name, run_id)
    cfg = load_file(services.sinks / f"{name}.yaml")
    assert (batch.state, batch.lower) == ("committed", AS_OF)
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(ROWS)
    shown = _status(services, name)
    assert shown.returncode == 0 and "NEEDS ACTION" not in shown.stdout, shown.stdout + shown.stderr
    history = f"earlier failure: final: sink '{name}': {cause}"
    resolved = f"resolved (a later attempt committed it at Delta version {batch.delta_version}); {history}"
    assert resolved in shown.stdout and "Remedy" not in shown.stdout, shown.stdout  # history: the cause only
    page = unescape(ui.render_sink(name))
    assert "class=bad" not in page and "class=done" in page and resolved in page, page
    note = _until(
        f"{name}'s note after the fix",
        lambda: "is committed" in _note(stack, name, run_id) and _note(stack, name, run_id),
    )
    assert f"is committed delta_version={batch.delta_version}" in note and history in note, note
    ledger.dispose()


def test_a_killed_write_task_s_log_says_what_the_sink_knows(services):
    """Airflow's own line for a SIGKILLed task is "Likely out of memory error (OOM)"; the sink's
    watchdog adds what it knows: the run's batch, nothing staged or committed, what comes next."""
    import signal

    from reconcile.storage.ledger import Ledger

    stack, name = services.stack, "killed_write"
    _until(f"a manual run of {name}", lambda: stack.airflow("dags", "trigger", name).returncode == 0)
    run_id = _until(f"{name}'s run", lambda: [r["run_id"] for r in stack.runs(name, "manual__%")])[0]
    pid = _until(
        "the write task's process",
        lambda: next(
            (
                r["pid"]
                for r in stack._rows(
                    "SELECT pid, state FROM task_instance WHERE dag_id = :d AND run_id = :r AND task_id = 'write'",
                    d=name,
                    r=run_id,
                )
                if r["state"] == "running" and r["pid"]
            ),
            None,
        ),
    )
    time.sleep(1.5)  # inside the stage: its query sleeps in Spark
    os.kill(pid, signal.SIGKILL)
    _until("the killed write's end", lambda: _state(services, name, run_id, "write") == "failed")
    folder = services.home / "airflow" / "logs" / f"dag_id={name}" / f"run_id={run_id}" / "task_id=write"
    marker = "reconcile: the write task of sink killed_write"

    def written() -> str | None:
        text = "\n".join(f.read_text() for f in folder.glob("attempt=1.log"))
        return text if marker in text else None

    log = _until("the sink's line in the killed write's log", written, timeout=120)
    ledger = Ledger(services.env["RECONCILE_METADATA_URL"])
    batch = ledger.batch_of_run(name, run_id)
    ledger.dispose()
    assert "Likely out of memory error (OOM)" in log  # Airflow's line
    ours = [line for line in log.splitlines() if marker in line]
    assert len(ours) == 1, log
    assert f"(run {run_id}, try 1) was killed before it finished" in ours[0]
    # What the warehouse held when the line was written: nothing, or the dead attempt's directory
    # once its Spark job (on the Connect server, which goes on after the client dies) began
    # writing files; an attempt the line names is there.
    from reconcile.config_loading import load_file
    from reconcile.storage.delta import ShardTable

    assert f"batch {batch.batch_id}" in ours[0] and "nothing committed" in ours[0], ours[0]
    named = re.search(r"(\d+) write attempt\(s\) staged under ", ours[0])
    assert named or "nothing staged" in ours[0], ours[0]
    if named:
        attempts = ShardTable(load_file(services.sinks / f"{name}.yaml")).staged_attempts(batch.batch_id)
        assert len(attempts) >= int(named.group(1)), (attempts, ours[0])
    assert batch.state != "committed"

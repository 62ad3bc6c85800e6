"""Airflow's real scheduler (LocalExecutor, api-server, dag-processor; Airflow's DB on
PostgreSQL), one stack for the module, running sinks:

- `airflow backfill create` over intervals a shard already covers: every backfill run is a no-op
  (mint finds nothing to do and skips the rest, no new Delta version); over new intervals, the
  backfill catches the shard up one batch per run, in order;
- a write task killed outright (SIGKILL, as the OOM killer does) leaves a line of the sink's in
  its log: the attempt, what was staged and committed, what happens next;
- an append that fails for real (the table's ``_delta_log`` made immutable), in a run with a
  logical date (a backfill's) and in a manual run without one: each remedy its task log prints
  is run exactly as printed once the cause is fixed, and the task ends green with the batch
  committed (ledger and Delta log) and the shard equal to a plain-Python model of the source.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
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
SLEEP_SQL = "reflect('java.lang.Thread', 'sleep', CAST(20000 AS BIGINT)) IS NULL"  # 20 s a row, in Spark


def _sink(sinks: Path, src: Path, name: str, schedule: str | None = "@daily") -> None:
    daily_sink(sinks, name, schedule=schedule or "none", as_of=AS_OF, catchup=False, query=json_query(src))


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
    stack = AirflowStack(home, postgres, sink_env(home, sinks, connect_url))
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


def test_every_remedy_printed_for_a_failed_append_works_as_printed(services):
    """The scheduled run names exactly its run (its logical date); a manual run, which has none,
    is cleared by its failed state or appended by run id without Airflow. Each command runs as
    printed once the cause is fixed; the task ends green, its batch committed once, the shard
    equal to the model of the source."""
    from reconcile.storage.ledger import Ledger

    env, stack = services.env, services.stack
    ledger = Ledger(env["RECONCILE_METADATA_URL"])
    # a manual run fails beside the scheduled run of rem_dated (once the DAG is parsed)
    _until("a manual run of rem_manual", lambda: stack.airflow("dags", "trigger", "rem_manual").returncode == 0)
    dated, printed, cfg = _failed_append(services, "rem_dated", "scheduled__")
    day = stack.dag_run("rem_dated", dated)["logical_date"].isoformat()
    assert printed == [
        f"airflow tasks clear rem_dated -t append -d -y -s {day} -e {day}",
        f"python -m reconcile append rem_dated --run-id {dated}",
    ], printed
    status = _as_printed(services, "python -m reconcile status rem_dated").stdout
    assert printed[0] in status, status  # status names the same command
    assert ledger.batch_of_run("rem_dated", dated).state != "committed"
    _as_printed(services, printed[0])
    _until("the cleared append", lambda: _state(services, "rem_dated", dated, "append") == "success")
    batch = ledger.batch_of_run("rem_dated", dated)
    assert (batch.state, batch.lower) == ("committed", AS_OF)
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(ROWS)
    _until("the run's end", lambda: (stack.dag_run("rem_dated", dated) or {}).get("state") == "success")

    manual, printed, cfg = _failed_append(services, "rem_manual", "manual__")
    assert stack.dag_run("rem_manual", manual)["logical_date"] is None
    assert printed == [
        "airflow tasks clear rem_manual -t append -d -f -y",
        f"python -m reconcile append rem_manual --run-id {manual}",
    ], printed
    _as_printed(services, printed[1])  # exactly this run, without Airflow
    batch = ledger.batch_of_run("rem_manual", manual)
    assert batch.state == "committed" and _state(services, "rem_manual", manual, "append") == "failed"
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(ROWS)
    _as_printed(services, printed[0])  # and Airflow's task, by its failed state
    _until("the cleared append", lambda: _state(services, "rem_manual", manual, "append") == "success")
    assert ledger.batch_of_run("rem_manual", manual).delta_version == batch.delta_version  # committed once
    assert _committed_in_delta_log(cfg, batch.batch_id) == batch.delta_version
    _until("the run's end", lambda: (stack.dag_run("rem_manual", manual) or {}).get("state") == "success")
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

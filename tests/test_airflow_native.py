"""Airflow-native operation: the correction guard's approval as Airflow's human-in-the-loop step,
the lag alert as an Airflow deadline, and each run's outcome as its DAG run's note.

What runs where:

- the DAG-shape tests parse the sinks' DAGs in this process (no Spark, no database);
- the end-to-end test runs Airflow's real services (harness/airflow_stack.py: api-server,
  scheduler with the LocalExecutor, dag-processor; Airflow's database on PostgreSQL) with the
  writes on the session's Spark Connect server, and acts as the operator does: it triggers runs
  and answers the approval through Airflow's REST API (what the UI's Required actions page
  calls), logged in as an Airflow user; the tasks set the runs' notes through the same API with a
  connection of their own. The shard is read with delta-rs and the ledger directly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import daily_sink, json_query, model_kv, shard_as_of, until, write_json_rows

pytestmark = pytest.mark.airflow
ROOT = Path(__file__).resolve().parents[1]
FULL = [{"k": i, "v": "x"} for i in range(10)]
GUARD = {"max_share": 0.5, "min_rows": 1, "approve_in_airflow": True}
PASSWORDS = {"service": "service-pw", "oncall": "oncall-pw"}


def record_alert(message: str, context: dict, path: str) -> None:
    """A team's alert callback (``alert.callback`` of the deadline sink): appends the alert it
    was handed to ``path``, one JSON line each."""
    with open(path, "a") as f:
        f.write(json.dumps({"message": message, "run_id": context["dag_run"]["dag_run_id"]}) + "\n")


def _sink(sinks: Path, src: Path, name: str, **fields) -> None:
    daily_sink(sinks, name, query=json_query(src), **fields)


# --- the DAG ------------------------------------------------------------------------------------


def test_the_dags_shape_deadline_and_approval_step(tmp_path):
    from airflow.providers.standard.operators.hitl import ApprovalOperator

    from reconcile.airflow.dags import build_dags

    sinks = tmp_path / "sinks"
    _sink(sinks, tmp_path / "src", "plain")
    _sink(
        sinks,
        tmp_path / "src",
        "asks",
        schedule="@hourly",
        correction_guard=GUARD,
        alert={"lag_minutes": 30, "callback": "logging.warning", "callback_kwargs": {"channel": "#data"}},
    )
    _sink(sinks, tmp_path / "src", "manual", schedule="none", correction_guard={**GUARD, "approval_timeout_minutes": 5})
    _sink(sinks, tmp_path / "src", "badcb", alert={"callback": "no_such_module.notify"})
    dags = build_dags(sinks)

    plain = dags["plain"]  # no approval in Airflow: the DAG is as it was
    assert {t.task_id for t in plain.tasks} == {"mint", "write", "append", "compaction_due", "compact"}
    assert plain.get_task("append").upstream_task_ids == {"write"}
    assert plain.deadline is None  # no alert.lag_minutes: no deadline (dag.test() stays usable)

    asks = dags["asks"]
    assert asks.get_task("correction_guard").upstream_task_ids == {"write"}
    approve = asks.get_task("approve_correction")
    assert isinstance(approve, ApprovalOperator)
    assert approve.upstream_task_ids == {"correction_guard"}
    assert approve.defaults == ["Reject"] and approve.response_timeout.total_seconds() == 3600  # @hourly
    # an answer is final: a retry would ask again, and a rejected run would wait instead of failing
    assert approve.retries == 0 and asks.get_task("write").retries == 1
    assert asks.get_task("append").upstream_task_ids == {"correction_guard", "approve_correction"}
    assert asks.get_task("append").trigger_rule == "none_failed_min_one_success"
    assert asks.get_task("compaction_due").upstream_task_ids == {"append"}
    (deadline,) = asks.deadline
    assert type(deadline.reference).__name__ == "DagRunQueuedAtDeadline"
    assert deadline.interval.total_seconds() == 30 * 60
    assert deadline.callback.path == "reconcile.airflow.callbacks.lag_deadline_missed"
    assert deadline.callback.kwargs == {
        "sink": "asks",
        "lag_minutes": 30,
        "notify": "logging.warning",
        "notify_kwargs": {"channel": "#data"},
    }

    manual = dags["manual"]
    assert manual.get_task("approve_correction").response_timeout.total_seconds() == 300

    bad = dags["invalid_sink_config__badcb"]  # an alert callback Airflow could not import
    assert "badcb" not in dags
    line = bad.doc_md.splitlines()[-1]
    assert "field 'alert.callback'" in line and "cannot import 'no_such_module.notify'" in line


def test_a_missed_deadline_logs_and_hands_the_line_to_the_teams_notifier(tmp_path, monkeypatch):
    """The deadline callback as Airflow calls it (a simple context of the run): it logs one line
    and calls the sink's callback: a notifier class sees the line as {{ message }}."""
    from airflow.sdk.bases.notifier import BaseNotifier

    from reconcile.airflow import callbacks
    from reconcile.storage.ledger import Ledger

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path / "sinks"))
    monkeypatch.setenv("RECONCILE_METADATA_URL", f"sqlite:///{tmp_path / 'meta.db'}")
    _sink(tmp_path / "sinks", tmp_path / "src", "late")
    ledger = Ledger(os.environ["RECONCILE_METADATA_URL"])
    ledger.ensure_shard("late", 1767225600000)
    ledger.dispose()
    context = {"dag_run": {"dag_run_id": "scheduled__x", "state": "running"}, "deadline": {"deadline_time": "T"}}

    line = callbacks.lag_deadline_missed(
        context, "late", 90, notify=f"{__name__}.record_alert", notify_kwargs={"path": str(tmp_path / "a.jsonl")}
    )
    assert line.startswith("sink late: run scheduled__x (running) has not finished 90 min after it was queued")
    assert "; the shard's upper is 1970-01-01T00:00:00.000Z (0), " in line  # a new shard: no batch yet
    assert " min behind now. Look at the run in Airflow and at `python -m reconcile status late`." in line
    assert json.loads((tmp_path / "a.jsonl").read_text()) == {"message": line, "run_id": "scheduled__x"}

    sent = []

    class Pager(BaseNotifier):
        template_fields = ("text",)

        def __init__(self, text: str):
            super().__init__()
            self.text = text

        def notify(self, context):
            sent.append(self.text)

    monkeypatch.setattr(callbacks, "_test_pager", Pager, raising=False)
    callbacks.lag_deadline_missed(
        context,
        "late",
        90,
        notify="reconcile.airflow.callbacks._test_pager",
        notify_kwargs={"text": "ALERT {{ message }}"},
    )
    assert sent == [f"ALERT {line}"]


# --- a real Airflow -----------------------------------------------------------------------------


class Api:
    """Airflow's REST API as a logged-in user."""

    def __init__(self, base: str, user: str):
        import httpx

        self.client = httpx.Client(base_url=base, timeout=30)
        token = self.client.post("/auth/token", json={"username": user, "password": PASSWORDS[user]})
        token.raise_for_status()
        self.client.headers["Authorization"] = f"Bearer {token.json()['access_token']}"

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        r = self.client.post(f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf or {}})
        assert r.status_code == 200, r.text
        return r.json()["dag_run_id"]

    def run(self, dag_id: str, run_id: str) -> dict:
        r = self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")
        r.raise_for_status()
        return r.json()

    def tis(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        r = self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        r.raise_for_status()
        return {t["task_id"]: t["state"] for t in r.json()["task_instances"]}

    def hitl(self, dag_id: str, run_id: str) -> dict:
        r = self.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve_correction/-1/hitlDetails")
        r.raise_for_status()
        return r.json()

    def answer(self, dag_id: str, run_id: str, option: str) -> dict:
        r = self.client.patch(
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve_correction/-1/hitlDetails",
            json={"chosen_options": [option], "params_input": {}},
        )
        assert r.status_code == 200, r.text
        return r.json()


def _wait(what: str, probe, timeout: float = 240):
    """``probe()``'s first truthy answer, polled every half second."""
    return until(what, probe, timeout, every=0.5)


def _finished(api: Api, dag_id: str, run_id: str) -> dict:
    """The run once it ended, with its final note. A task process that died unseen is failed by
    Airflow only after its heartbeat timeout (300 s): wait past that; a timeout names each task's
    state. A failed task writes the run's note from its failure callback, which may land a moment
    after the scheduler marked the run failed: the note of a run still waiting for an answer is
    not final."""

    def ended() -> dict | bool:
        r = api.run(dag_id, run_id)
        waiting = (r.get("note") or "").startswith("waiting for an approval")
        return r["state"] in ("success", "failed") and not waiting and r

    try:
        return _wait(f"run {run_id} of {dag_id} to finish", ended, timeout=420)
    except pytest.fail.Exception as exc:
        ask = api.client.get(f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approve_correction/-1/hitlDetails")
        raise AssertionError(
            f"{exc}; the run: {api.run(dag_id, run_id)}; its tasks: {api.tis(dag_id, run_id)}; "
            f"the approval: {ask.status_code} {ask.text[:1500]}"
        ) from None


def _awaiting(api: Api, dag_id: str, run_id: str, scheduler_log: Path) -> None:
    """Wait until the run's approve_correction waits for an answer (fail at once if the run ends),
    and until the scheduler has taken the executor's word that the process that parked it ended.

    Airflow 3.3.2 fails a HITL task answered before that: the parked process's "success" reaches
    the scheduler after the answer has queued the task again, and the scheduler marks the queued
    task failed ("finished with state success, but the task instance's state attribute is
    queued"). The run's note then says nothing was committed and how to go on; an operator answers
    seconds later, so the test waits for that line of the scheduler's log."""

    def parked() -> bool:
        state = api.tis(dag_id, run_id).get("approve_correction")
        if state != "awaiting_input" and api.run(dag_id, run_id)["state"] not in ("queued", "running"):
            pytest.fail(f"{dag_id}: the run ended without asking: {api.tis(dag_id, run_id)}")
        return state == "awaiting_input"

    _wait(f"{dag_id}'s approve_correction to wait for an answer", parked)
    seen = (
        "Received executor event with state success for task instance TaskInstanceKey("
        f"dag_id='{dag_id}', task_id='approve_correction', run_id='{run_id}'"
    )
    _wait(f"the scheduler to see {dag_id}'s parked approval end", lambda: seen in scheduler_log.read_text())


@pytest.fixture(scope="module")
def airflow_up(tmp_path_factory, connect_url):
    """Airflow's services with four sinks (schedule none: runs only when triggered): three ask
    for the guard's approval in Airflow (approved, rejected, unanswered within 0.25 min); one has
    a deadline of 0 minutes after queueing (every run misses it) and the test's alert callback."""
    from harness.airflow_stack import AirflowStack, sink_env

    postgres = os.environ.get("RECONCILE_TEST_POSTGRES_URL")
    if not postgres:
        pytest.skip("RECONCILE_TEST_POSTGRES_URL not set")
    home = tmp_path_factory.mktemp("native")
    sinks = home / "sinks"
    alerts = {name: home / f"{name}-alerts.jsonl" for name in ("na_ok", "na_late")}

    def alert(name: str, minutes: int) -> dict:
        return {
            "lag_minutes": minutes,
            "callback": f"{__name__}.record_alert",
            "callback_kwargs": {"path": str(alerts[name])},
        }

    _sink(sinks, home / "src_ok", "na_ok", schedule="none", correction_guard=GUARD, alert=alert("na_ok", 60))
    _sink(sinks, home / "src_no", "na_no", schedule="none", correction_guard=GUARD)
    _sink(
        sinks,
        home / "src_wait",
        "na_wait",
        schedule="none",
        correction_guard={**GUARD, "approval_timeout_minutes": 0.25},
    )
    _sink(sinks, home / "src_late", "na_late", schedule="none", alert=alert("na_late", 0))
    for name in ("ok", "no", "wait", "late"):
        write_json_rows(home / f"src_{name}", FULL)
    (home / "passwords.json").write_text(json.dumps(PASSWORDS))
    extra = {
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "service:op,oncall:op",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "1",  # the approval's timeout sweep
        # the deadline's callback imports this module in the executor's callback process
        "PYTHONPATH": f"{ROOT / 'include'}{os.pathsep}{ROOT / 'tests'}",
    }
    stack = AirflowStack(home, postgres, sink_env(home, sinks, connect_url, **extra))
    base = f"http://127.0.0.1:{stack.port}"
    # the tasks' own login to Airflow's REST API, for the runs' notes
    stack.env["AIRFLOW_CONN_RECONCILE_AIRFLOW_API"] = json.dumps(
        {"conn_type": "http", "host": base, "login": "service", "password": PASSWORDS["service"]}
    )
    try:
        stack.start()
        api = Api(base, "oncall")
        names = ("na_ok", "na_no", "na_wait", "na_late")
        _wait("the sinks' DAGs", lambda: all(api.client.get(f"/api/v2/dags/{d}").status_code == 200 for d in names))
        yield stack, api, home, alerts
    finally:
        stack.close()


@pytest.mark.slow
def test_approval_rejection_timeout_deadline_and_notes_in_a_running_airflow(airflow_up, monkeypatch):
    from reconcile.config_loading import load_file
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    stack, api, home, alerts = airflow_up
    for key in ("RECONCILE_WAREHOUSE", "RECONCILE_METADATA_URL", "RECONCILE_SINKS_DIR"):
        monkeypatch.setenv(key, stack.env[key])
    ledger = Ledger(stack.env["RECONCILE_METADATA_URL"])
    cfg = {n: load_file(home / "sinks" / f"{n}.yaml") for n in ("na_ok", "na_no", "na_wait", "na_late")}

    # 1. The first run of each sink fills its shard (a new shard: no guard) and its note says so;
    # the deadline sink's run is still running at its deadline: the team's callback gets the line.
    first = {n: api.trigger(n) for n in cfg}
    for name, run_id in first.items():
        run = _finished(api, name, run_id)
        assert run["state"] == "success", (name, api.tis(name, run_id))
        batch = ledger.batch_of_run(name, run_id)
        assert batch.state == "committed"
        assert run["note"].startswith(
            f"sink {name}: batch {batch.batch_id} [{_iso(batch.lower)}, {_iso(batch.upper)}) is committed "
            f"delta_version={batch.delta_version} rows_ok=10 rows_err=0"
        ), run["note"]
        assert shard_as_of(cfg[name], batch.upper - 1) == model_kv(FULL)
    for name in ("na_ok", "na_no", "na_wait"):  # no approval was needed
        assert api.tis(name, first[name])["approve_correction"] == "skipped"
        assert api.tis(name, first[name])["correction_guard"] == "success"
    sent = _wait("the deadline's callback", lambda: alerts["na_late"].exists() and alerts["na_late"].read_text())
    alert = json.loads(sent.splitlines()[0])
    assert alert["run_id"] == first["na_late"]
    # The deadline is 0 min after the run was queued: the callback may see the run still queued.
    assert re.match(
        rf"sink na_late: run {re.escape(first['na_late'])} \((queued|running)\) has not finished 0 min after",
        alert["message"],
    ), alert["message"]
    assert not alerts["na_ok"].exists()  # finished well within its 60 minutes: no alert
    rows = stack._rows(
        "SELECT d.missed, c.state FROM deadline d JOIN dag_run r ON r.id = d.dagrun_id "
        "JOIN callback c ON c.id = d.callback_id WHERE r.run_id = :r",
        r=first["na_late"],
    )
    assert [(r["missed"], r["state"]) for r in rows] == [(True, "success")], rows

    # 2. Each upstream loses 9 of its 10 rows: the guard stops each batch before its append, and
    # each run waits in approve_correction with the numbers in Airflow's Required actions.
    versions = {n: ShardTable(cfg[n]).latest_version() for n in ("na_ok", "na_no", "na_wait")}
    for name in versions:
        write_json_rows(home / f"src_{name.removeprefix('na_')}", FULL[:1])
    second = {n: api.trigger(n) for n in versions}
    for name, run_id in second.items():
        _awaiting(api, name, run_id, home / "scheduler.log")
        batch = ledger.batch_of_run(name, run_id)
        ask = api.hitl(name, run_id)
        assert ask["subject"] == f"Sink {name}: commit a correction of 90.0% of the shard?"
        assert f"batch `{batch.batch_id}` of run `{run_id}`" in ask["body"]
        assert "| rows retracted | 9 |" in ask["body"] and "| shard rows now | 10 |" in ask["body"]
        assert ask["options"] == ["Approve", "Reject"] and ask["response_received"] is False
        assert api.run(name, run_id)["note"].startswith("waiting for an approval in Airflow (Required actions): ")
        assert ShardTable(cfg[name]).latest_version() == versions[name]  # nothing committed while it waits

    api.answer("na_ok", second["na_ok"], "Approve")
    api.answer("na_no", second["na_no"], "Reject")
    # na_wait: nobody answers

    # Approved: the approval is in the ledger under the user who answered; the batch committed.
    run = _finished(api, "na_ok", second["na_ok"])
    assert run["state"] == "success", api.tis("na_ok", second["na_ok"])
    batch = ledger.batch_of_run("na_ok", second["na_ok"])
    assert batch.state == "committed" and batch.approved.startswith(f"oncall in Airflow (run {second['na_ok']}) at ")
    assert shard_as_of(cfg["na_ok"], batch.upper - 1) == model_kv(FULL[:1])
    assert run["note"].startswith(f"sink na_ok: batch {batch.batch_id} [") and " is committed " in run["note"]
    assert run["note"].endswith(f"; approved by {batch.approved}")

    # Rejected: the run fails, nothing committed; the note and the ledger say why and what next.
    run = _finished(api, "na_no", second["na_no"])
    assert run["state"] == "failed"
    tis = api.tis("na_no", second["na_no"])
    assert tis["approve_correction"] == "failed" and tis["append"] == "upstream_failed", tis
    assert ShardTable(cfg["na_no"]).latest_version() == versions["na_no"]
    batch = ledger.batch_of_run("na_no", second["na_no"])
    assert batch.state == "staged" and batch.approved is None
    note = run["note"]
    assert note.startswith("approve_correction: rejected by oncall in Airflow: correction guard: batch ")
    assert "retract 9 of the shard's 10 rows (90.0%" in note and "nothing was committed" in note
    assert "the next run recomputes the batch" in note and batch.message == note
    assert "\n" not in note and len(note) <= 1000

    # Unanswered: after 0.25 min the timeout counts as Reject; the note's remedy, run as printed
    # after the CLI's approval, lets the batch through.
    run = _finished(api, "na_wait", second["na_wait"])
    assert run["state"] == "failed"
    note = run["note"]
    assert note.startswith("approve_correction: nobody answered the approval within 0.25 minutes: correction guard")
    assert ShardTable(cfg["na_wait"]).latest_version() == versions["na_wait"]
    batch = ledger.batch_of_run("na_wait", second["na_wait"])
    approve, clear = re.findall(r"`([^`]+)`", note)[:2]
    assert approve == f"python -m reconcile approve na_wait {batch.batch_id}"
    assert clear == "airflow dags unpause na_wait && airflow tasks clear na_wait -t approve_correction -d -f -y", note
    for command in (approve, clear):  # as printed, by a shell
        out = subprocess.run(["bash", "-c", command], env=stack.env, capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stdout + out.stderr
    run = _finished(api, "na_wait", second["na_wait"])
    assert run["state"] == "success", api.tis("na_wait", second["na_wait"])
    batch = ledger.batch_of_run("na_wait", second["na_wait"])
    assert batch.state == "committed" and "(reconcile approve) at " in batch.approved
    assert api.tis("na_wait", second["na_wait"])["approve_correction"] == "success"  # passed without asking
    assert shard_as_of(cfg["na_wait"], batch.upper - 1) == model_kv(FULL[:1])

    # A read-only run has nothing to do: its note says why.
    run_id = api.trigger("na_no", {"read_only": True})
    run = _finished(api, "na_no", run_id)
    assert run["state"] == "success" and run["note"].startswith("nothing to do: "), run["note"]
    ledger.dispose()


def _iso(ms: int) -> str:
    from reconcile.log import iso

    return iso(ms)


def test_an_approval_airflow_ends_without_an_answer_acted_on_says_so_and_how_to_go_on():
    """Airflow 3.3.2 may kill a resumed approval before it acts on the answer (no exception reaches
    the failure callback): the run's note says nothing was committed and how to go on, not "no
    cause recorded"."""
    from reconcile.airflow.callbacks import failure_note

    note = failure_note("approve_correction", None, "na_no")
    assert note.startswith("approve_correction: Airflow ended the approval before it could act on an answer")
    assert "nothing was committed" in note and "`python -m reconcile approve na_no BATCH`" in note
    assert failure_note("write", RuntimeError("boom"), "s") == "write failed: boom"
    assert failure_note("append", RuntimeError("append: x"), "s") == "append: x"

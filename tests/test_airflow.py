"""Airflow itself: the DAG file imports cleanly, and dag.test() runs a sink end to end.

What runs where:

- the DagBag tests parse the DAG file in this (pytest's) process;
- the three-intervals, upsert, narrower-winner and correction-guard tests run each ``dag.test()``
  in a child interpreter (tests/dag_child.py: one for the module, started with *spawn*, Airflow
  imported once) whose ``spark_default`` is a ``spark_connect`` connection: ``write`` and
  ``compact`` run there as clients of the test run's Spark Connect server (the ``connect_url``
  fixture), no JVM per task, and the jobs folder it is given does not exist, so nothing can be
  spark-submitted. Their logs come back as text; the ledger, the Delta table (delta-rs), and
  Airflow's database (shared through AIRFLOW_HOME) are read here (and, in the three-intervals
  test, the committed rows' checksums by this process's classic session, ``check.violations``);
- the outdated-batch test runs ``dag.test()`` in this process with the real spark-submit of
  jobs/write_correction.py on local Spark (``spark_default`` is ``local[2]``, tests/conftest.py):
  the file's one spark-submit path;
- the append always runs without a JVM (in the child, or in ``airflow tasks test``).

The shard is checked against the plain-Python model of the source after every run.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import airflow_task_test, daily_sink, json_query, model_kv, shard_as_of, update_log, write_json_rows

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.airflow


def _dagbag(sinks_dir, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(sinks_dir))
    return DagBag(dag_folder=str(ROOT / "dags"))


def test_dagbag_imports_every_sink_with_retries(airflow_db, monkeypatch):
    bag = _dagbag(ROOT / "include" / "sinks", monkeypatch)
    assert bag.import_errors == {}, bag.import_errors
    assert "demo_orders" in bag.dag_ids
    for dag_id in bag.dag_ids:
        dag = bag.get_dag(dag_id)
        assert {t.task_id for t in dag.tasks} == {"mint", "write", "append", "compaction_due", "compact"}, dag_id
        assert dag.get_task("write").upstream_task_ids == {"mint"}
        assert dag.get_task("append").upstream_task_ids == {"write"}
        assert dag.get_task("compaction_due").upstream_task_ids == {"append"}
        assert dag.get_task("compact").upstream_task_ids == {"compaction_due"}
        assert dag.max_active_runs == 1
        assert all(t.retries >= 1 for t in dag.tasks), f"{dag_id}: every task must retry"
        assert dag.doc_md and dag_id in dag.doc_md


def test_invalid_config_is_visible_without_hiding_valid_sinks(airflow_db, tmp_path, monkeypatch):
    (tmp_path / "good.yaml").write_text(
        (ROOT / "include" / "sinks" / "demo_orders.yaml").read_text().replace("demo_orders", "good")
    )
    (tmp_path / "bad.yaml").write_text("name: bad\nkind: query\nschema: []\nstart_date: 2026-01-01\n")
    bag = _dagbag(tmp_path, monkeypatch)
    assert bag.import_errors == {}
    assert "good" in bag.dag_ids
    placeholder = bag.get_dag("invalid_sink_config__bad")
    assert "bad.yaml" in placeholder.doc_md and "schema" in placeholder.doc_md


def _sink(sinks_dir: Path, data_dir: Path, name: str, kind: str = "query", **extra) -> None:
    """A daily sink over ``data_dir``; a query sink unless ``kind`` and its section are given."""
    daily_sink(sinks_dir, name, kind, **({"query": json_query(data_dir)} if kind == "query" else {}), **extra)


def _sink_env(tmp_path: Path, sinks: Path) -> dict[str, str]:
    """The sink's environment: its config folder, warehouse and SQLite ledger under ``tmp_path``."""
    return {
        "RECONCILE_SINKS_DIR": str(sinks),
        "RECONCILE_WAREHOUSE": str(tmp_path / "wh"),
        "RECONCILE_METADATA_URL": f"sqlite:///{tmp_path / 'meta.db'}",
    }


def _use_env(monkeypatch, env: dict[str, str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def _sink_of(tmp_path: Path, monkeypatch, prefix: str, **extra):
    """A daily query sink over ``tmp_path/src`` with its own warehouse and SQLite ledger, made
    this process's environment: (name, that environment, its config, the ledger's URL, the
    source folder)."""
    from reconcile.config_loading import load_sink

    name = f"{prefix}_{tmp_path.name[-8:].replace('-', '_').lower()}"
    sinks, data = tmp_path / "sinks", tmp_path / "src"
    _sink(sinks, data, name, **extra)
    env = _sink_env(tmp_path, sinks)
    _use_env(monkeypatch, env)
    return name, env, load_sink(name), env["RECONCILE_METADATA_URL"], data


def _dag_of(tmp_path: Path, monkeypatch, prefix: str, **extra):
    """:func:`_sink_of` with the sink's DAG parsed in this process instead of its environment."""
    from airflow.dag_processing.dagbag import DagBag

    name, _, cfg, url, data = _sink_of(tmp_path, monkeypatch, prefix, **extra)
    return name, DagBag(dag_folder=str(ROOT / "dags")).get_dag(name), cfg, url, data


@pytest.fixture(scope="module")
def dag_child(request, airflow_db, tmp_path_factory):
    """The module's child interpreter for ``dag.test()`` (tests/dag_child.py): ``spark_default``
    is a ``spark_connect`` connection to the session's server; the jobs folder does not exist.
    The child imports Airflow while the server starts."""
    from dag_child import DagChild, connect_env

    jobs = tmp_path_factory.mktemp("dag-child") / "no-jobs"  # a spark-submit would fail
    child = DagChild({"RECONCILE_JOBS_DIR": str(jobs)})
    warming = child.warm()
    try:
        child.env.update(connect_env(request.getfixturevalue("connect_url"), jobs))
        warming.result(timeout=300)
        yield child
    finally:
        child.close()
    assert not jobs.exists()


def _assert_state(run: dict, state) -> None:
    """A run from the child ended in ``state`` (else the end of its log says why)."""
    assert run["state"] == state, run["log"][-4000:]


@pytest.mark.slow
def test_dag_test_three_intervals_then_rerun_is_noop(airflow_db, dag_child, spark, tmp_path, monkeypatch):
    """Three daily runs and a rerun, in the child on Spark Connect: write and compact (with its
    VACUUM) run there as Connect clients; no job is submitted (the jobs folder does not exist)
    and no JVM starts besides the Connect server's."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from reconcile.config_loading import load_sink
    from reconcile.sink import check
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    name = f"af_{tmp_path.name[-8:].replace('-', '_').lower()}"
    sinks, data = tmp_path / "sinks", tmp_path / "src"
    # compaction keeps 36 h of exact history and runs once 2 batches wait to be folded in
    _sink(sinks, data, name, compaction={"every_batches": 2}, retention={"history_hours": 36, "vacuum_hours": 0})
    env = _sink_env(tmp_path, sinks)
    _use_env(monkeypatch, env)
    dag = DagBag(dag_folder=str(ROOT / "dags")).get_dag(name)  # parsed here for its assets only
    cfg = load_sink(name)

    sources = [
        [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}],
        [{"k": 1, "v": "a"}, {"k": 2, "v": "B"}, {"k": 3, "v": "c"}, {"k": 3, "v": "c"}],
        [{"k": 3, "v": "c"}],
    ]
    days = [datetime(2026, 1, 2 + i, tzinfo=UTC) for i in range(3)]
    for i, (rows, day) in enumerate(zip(sources, days)):
        write_json_rows(data, rows)
        run = dag_child.test(name, day, env)
        _assert_state(run, DagRunState.SUCCESS)
        assert "write on Spark Connect" in run["log"], run["log"][-4000:]
        jobs = Path(dag_child.env["RECONCILE_JOBS_DIR"])  # write and compact could not spark-submit
        assert not jobs.exists() and set(run["applications"]) == {"write", "compact"}, run["applications"]
        assert all(Path(app).parent == jobs for app in run["applications"].values()), run["applications"]
        upper = int(day.timestamp() * 1000)
        assert shard_as_of(cfg, upper - 1) == model_kv(rows)
        tis = run["tis"]
        assert tis["compaction_due"] == "success", tis  # a short circuit: it skips compact directly
        assert tis["compact"] == ("success" if i == 2 else "skipped"), tis
    assert "compact on Spark Connect" in run["log"], run["log"][-4000:]

    ledger = Ledger(f"sqlite:///{tmp_path / 'meta.db'}")
    since = ledger.get_shard(name).since
    assert since == int(days[-1].timestamp() * 1000) - 36 * 3600 * 1000  # upper - 36 h
    for rows, day in zip(sources, days):  # history stays readable as of every upper - 1 >= since
        if int(day.timestamp() * 1000) - 1 >= since:
            assert shard_as_of(cfg, int(day.timestamp() * 1000) - 1) == model_kv(rows)
    times = {r["_time"] for r in update_log(cfg)}
    assert min(times) == since  # the updates before since were folded into it
    # every invariant, the committed rows' checksums read back by this process's classic session
    assert check.violations(ledger, cfg, spark=spark) == []

    assert ledger.get_shard(name).upper == int(days[-1].timestamp() * 1000)
    committed = [b for b in ledger.batches(name) if b.state == "committed"]
    assert [b.lower for b in committed] == [cfg.as_of] + [int(d.timestamp() * 1000) for d in days[:-1]]
    version = ShardTable(cfg).latest_version()

    # Rerunning a covered interval (with a changed source) mints nothing and writes nothing.
    write_json_rows(data, [{"k": 9, "v": "z"}])
    run = dag_child.test(name, days[1] - timedelta(hours=1), env)
    _assert_state(run, DagRunState.SUCCESS)
    tis = run["tis"]
    # mint finds nothing to do and skips the rest of the run at once (a short circuit)
    assert tis == {
        "mint": "success",
        "write": "skipped",
        "append": "skipped",
        **{"compaction_due": "skipped", "compact": "skipped"},
    }, tis
    assert ShardTable(cfg).latest_version() == version
    assert ledger.get_shard(name).upper == int(days[-1].timestamp() * 1000)

    # The shard is an Asset: the append declares it, and each committed batch left one event
    # saying how far the shard is (the no-op rerun none).
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from reconcile.airflow.dags import shard_asset

    asset = shard_asset(cfg)
    assert asset.uri == (tmp_path / "wh" / name).as_uri()
    assert [o.uri for o in dag.get_task("append").outlets] == [asset.uri]
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == asset.uri)
        ).all()
        extras = sorted((e.extra for e in events), key=lambda x: x["upper"])
    assert [(x["lower"], x["upper"]) for x in extras] == [(b.lower, b.upper) for b in committed]
    assert [x["delta_version"] for x in extras] == [b.delta_version for b in committed]
    assert extras[1]["rows_ok"] == committed[1].rows_ok and extras[1]["upper_iso"] == "2026-01-03T00:00:00.000Z"
    ledger.dispose()


@pytest.mark.slow
def test_dag_test_runs_an_upsert_sink(airflow_db, dag_child, tmp_path, monkeypatch):
    from airflow.utils.state import DagRunState

    from reconcile.config_loading import load_sink
    from reconcile.storage.ledger import Ledger
    from upsert_model import UpsertModel, feed_rows, ok_rows

    name = f"afu_{tmp_path.name[-8:].replace('-', '_').lower()}"
    sinks = tmp_path / "sinks"
    feed_source = {"format": "json", "path": str(tmp_path / "feed")}
    upsert = {"source": feed_source, "key": ["k"], "time_column": "ts", "offset_column": "off"}
    _sink(sinks, tmp_path / "feed", name, kind="upsert", upsert=upsert)
    env = _sink_env(tmp_path, sinks)
    _use_env(monkeypatch, env)
    cfg = load_sink(name)
    day = 86_400_000
    d1, d2 = cfg.as_of + day, cfg.as_of + 2 * day
    feed = [
        {"k": 1, "v": "a", "ts": cfg.as_of + 10, "off": 1},
        {"k": 2, "v": "b", "ts": cfg.as_of + 20, "off": 2},
        {"k": 1, "v": "next-day", "ts": d1 + 5, "off": 3},
    ]
    model = UpsertModel()
    feed_rows(tmp_path, feed)
    run = dag_child.test(name, datetime.fromtimestamp(d1 / 1000, UTC), env)
    _assert_state(run, DagRunState.SUCCESS)
    model.batch(feed, cfg.as_of, d1)
    feed += [{"k": 2, "v": None, "ts": d1 + 7, "off": 4}, {"k": 3, "v": "late", "ts": cfg.as_of + 30, "off": 5}]
    feed_rows(tmp_path, feed)
    run = dag_child.test(name, datetime.fromtimestamp(d2 / 1000, UTC), env)
    _assert_state(run, DagRunState.SUCCESS)
    model.batch(feed, d1, d2)
    for t in (d1 - 1, d1, d1 + 5, d2 - 1):
        assert ok_rows(shard_as_of(cfg, t)) == model.as_of(t), t
    ledger = Ledger(f"sqlite:///{tmp_path / 'meta.db'}")
    assert [b.late_commands for b in ledger.batches(name, ("committed",))] == [0, 1]
    ledger.dispose()


def test_a_mint_no_retry_fixes_fails_at_once_with_the_command_that_reruns_it(airflow_db, tmp_path, monkeypatch, capfd):
    """A mint that fails for good (here the warehouse's AWS connection is not defined) does not
    use its retries: it fails at once, saying the cause, how to fix it and the command that
    reruns the run's mint. It minted no batch (nothing for ``status`` to show: its log and the
    run's note say it). No Spark: the run ends before the write."""
    from airflow.utils.state import DagRunState

    from reconcile.storage.ledger import Ledger

    name, dag, _, url, _ = _dag_of(tmp_path, monkeypatch, "amf", retries=2)
    monkeypatch.setenv("RECONCILE_AWS_CONN_ID", "aws_nowhere")
    day = datetime(2026, 1, 2, tzinfo=UTC)
    run = dag.test(logical_date=day)
    logged = capfd.readouterr().out
    assert run.state == DagRunState.FAILED
    tis = {ti.task_id: (ti.state, ti.try_number, ti.max_tries) for ti in run.get_task_instances()}
    assert tis["mint"] == ("failed", 1, 2), tis  # retries left, not used
    assert {state for task, (state, _, _) in tis.items() if task != "mint"} == {"upstream_failed"}, tis
    # the log line itself, not the traceback Airflow may print that quotes the raise statement
    line = next(ln for ln in logged.splitlines() if f"mint failed (not retried): sink '{name}'" in ln)
    assert (
        f"sink '{name}': the Airflow connection 'aws_nowhere' the task reads isn't defined; nothing was written "
        "Remedy: define it (`airflow connections add aws_nowhere --conn-type TYPE ...`, or AIRFLOW_CONN_AWS_NOWHERE "
        "in the environment of Airflow's scheduler and workers). Once the cause is fixed, rerun the run's mint: "
        f"`airflow dags unpause {name} && airflow tasks clear {name} -t mint -d -y -s {day.isoformat()} -e {day.isoformat()}`."
    ) in line, line
    ledger = Ledger(url)
    assert ledger.batches(name) == []
    ledger.dispose()


@pytest.mark.slow
def test_an_outdated_batch_skips_the_rest_of_its_run_with_the_reason(airflow_db, spark, tmp_path, monkeypatch):
    """Only mint mints: the batch id goes to write by XCom. Another writer committed past the
    run's lower (to Delta; it died before the ledger heard of it, so mint could not know): write
    finds the batch outdated, and the run ends green with write, append and compaction skipped,
    the reason in the ledger.

    The file's one spark-submit path: ``dag.test()`` runs in this process and the write task
    really spark-submits jobs/write_correction.py on local Spark (``spark_default`` is
    ``local[2]``); the other dag.test() runs are Spark Connect clients in tests/dag_child.py."""
    from airflow.utils.state import DagRunState

    from helpers import run_stages
    from reconcile import failpoints
    from reconcile.errors import FailPointHit
    from reconcile.storage.ledger import Ledger

    name, dag, cfg, url, data = _dag_of(tmp_path, monkeypatch, "afo")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(data, rows)
    day1, day2 = datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)
    ledger = Ledger(url)
    failpoints.arm("append.after_delta_commit", "raise")
    try:
        with pytest.raises(FailPointHit):
            run_stages(spark, ledger, cfg, "manual__other", int(day2.timestamp() * 1000))
    finally:
        failpoints.disarm_all()
    assert ledger.get_shard(name).upper == cfg.as_of  # the ledger is behind the Delta log

    run = dag.test(logical_date=day1)
    assert run.state == DagRunState.SUCCESS
    tis = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert tis == {
        "mint": "success",
        "write": "skipped",
        "append": "skipped",
        "compaction_due": "skipped",
        "compact": "skipped",
    }, tis
    batch = ledger.batch_of_run(name, run.run_id)
    other = ledger.batch_of_run(name, "manual__other")
    assert batch.state == "superseded" and f"outdated: batch {other.batch_id} committed" in batch.message, batch.message
    assert ledger.get_shard(name).upper == int(day2.timestamp() * 1000)  # write's sync rolled it forward
    assert shard_as_of(cfg, int(day2.timestamp() * 1000) - 1) == model_kv(rows)
    ledger.dispose()


@pytest.mark.slow
def test_a_narrower_winner_leaves_the_wider_run_skipped_with_the_true_reason(
    airflow_db, dag_child, tmp_path, monkeypatch
):
    """The scheduled run's append fails until its retries are used up (its last line names the
    remedy); a backfill's one-day batch then supersedes its two-day batch and commits. The
    scheduled run's append, rerun, is skipped (not red), saying that the next scheduled run
    appends the day the winner did not cover."""

    from airflow.utils.state import DagRunState

    from reconcile.log import iso
    from reconcile.storage.ledger import Ledger

    name, env, cfg, url, data = _sink_of(tmp_path, monkeypatch, "afn")
    rows = [{"k": 1, "v": "a"}]
    write_json_rows(data, rows)
    day2, day3 = datetime(2026, 1, 2, tzinfo=UTC), datetime(2026, 1, 3, tzinfo=UTC)

    wide = dag_child.test(name, day3, env, failpoints={"append.before_delta_commit": "raise"})
    _assert_state(wide, DagRunState.FAILED)
    logged = wide["log"]
    assert (
        f"retries are used up: once the cause is fixed, clear the task (`airflow dags unpause {name} && airflow tasks clear"
        in logged
    )
    # the write's log: Spark's INFO chatter is off; the sink's outcome line is there
    assert "INFO SparkContext" not in logged and "INFO DAGScheduler" not in logged
    assert f"write: sink {name}: batch " in logged and ") is staged rows_ok=1" in logged

    narrow = dag_child.test(name, day2, env)
    _assert_state(narrow, DagRunState.SUCCESS)  # the narrower batch wins
    ledger = Ledger(url)
    assert ledger.get_shard(name).upper == int(day2.timestamp() * 1000)

    # only the append, which runs no Spark stage: the sink's environment is all it needs
    text = airflow_task_test(name, "append", day3)
    assert "nothing left for this run" in text and "moved the shard's upper to" in text, text[-3000:]
    rest = f"[{iso(int(day2.timestamp() * 1000))}, {iso(int(day3.timestamp() * 1000))})"
    assert f"the next scheduled run appends {rest}" in text, text[-3000:]
    assert "the superseding run appends this interval" not in text
    assert ledger.get_shard(name).upper == int(day2.timestamp() * 1000)  # nothing more was committed
    assert shard_as_of(cfg, int(day2.timestamp() * 1000) - 1) == model_kv(rows)
    ledger.dispose()


@pytest.mark.slow
def test_the_correction_guard_stops_a_run_until_a_run_approves_it(airflow_db, dag_child, tmp_path, monkeypatch):
    """A truncated source: the run's append fails (red: someone must act) with the numbers and
    the remedy, nothing committed; a run triggered with {"approve_correction": true} commits it."""
    from airflow.utils.state import DagRunState

    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import Ledger

    guard = {"max_share": 0.5, "min_rows": 1}
    name, env, cfg, url, data = _sink_of(tmp_path, monkeypatch, "afg", retries=0, correction_guard=guard)
    full = [{"k": i, "v": "x"} for i in range(10)]
    write_json_rows(data, full)
    first = dag_child.test(name, datetime(2026, 1, 2, tzinfo=UTC), env)
    _assert_state(first, DagRunState.SUCCESS)
    version = ShardTable(cfg).latest_version()

    write_json_rows(data, full[:1])  # the upstream lost 9 of 10 rows
    blocked = dag_child.test(name, datetime(2026, 1, 3, tzinfo=UTC), env)
    _assert_state(blocked, DagRunState.FAILED)
    assert blocked["tis"]["append"] == "failed"
    logged = blocked["log"]
    assert "correction guard" in logged and "retract 9 of the shard's 10 rows" in logged
    assert f"python -m reconcile approve {name} " in logged
    assert ShardTable(cfg).latest_version() == version  # nothing committed

    approved = dag_child.test(name, datetime(2026, 1, 4, tzinfo=UTC), env, run_conf={"approve_correction": True})
    _assert_state(approved, DagRunState.SUCCESS)
    ledger = Ledger(url)
    batch = ledger.batch_of_run(name, approved["run_id"])
    assert batch.state == "committed" and batch.approved.startswith(f"run {approved['run_id']}")
    assert ledger.batch_of_run(name, blocked["run_id"]).state == "superseded"
    assert shard_as_of(cfg, batch.upper - 1) == model_kv(full[:1])
    ledger.dispose()

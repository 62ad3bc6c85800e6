"""Airflow's real scheduler (LocalExecutor, api-server, dag-processor; Airflow's DB on
PostgreSQL) running sinks, and `airflow backfill create` from the CLI:

- over intervals a shard already covers, every backfill run is a no-op (mint finds nothing to do
  and skips the rest, no new Delta version);
- over new intervals, the backfill catches the shard up one batch per run, in order.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from airflow_stack import AIRFLOW, AirflowStack
from helpers import cli_json, shard_as_of, write_json_rows

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
DAY = 86_400_000
AS_OF = 1767225600000  # 2026-01-01T00:00:00Z


def _sink(sinks: Path, src: Path, name: str) -> None:
    (sinks / f"{name}.yaml").write_text(
        yaml.safe_dump(
            {
                "name": name,
                "kind": "query",
                "partitions": 2,
                "schedule": "@daily",
                "start_date": "2026-01-01",
                "as_of": AS_OF,
                "catchup": False,
                "retries": 1,
                "schema": [{"name": "k", "type": "bigint", "nullable": False}, {"name": "v", "type": "string"}],
                "query": {"sources": {"src": {"format": "json", "path": str(src)}}, "sql": "SELECT k, v FROM src"},
            }
        )
    )


@pytest.fixture
def airflow_services(tmp_path, pg_url, connect_url):
    """Airflow's services with the write tasks on the session's Spark Connect server (a
    ``spark_connect`` connection: the production shape of many small sinks; spark-submit under
    Airflow is covered by tests/test_airflow.py and tests/test_cluster.py)."""
    import json

    sinks = tmp_path / "sinks"
    sinks.mkdir()
    host, port = connect_url.removeprefix("sc://").split(":")
    stack = AirflowStack(
        tmp_path,
        os.environ["RECONCILE_TEST_POSTGRES_URL"],
        {
            "RECONCILE_SINKS_DIR": str(sinks),
            "RECONCILE_METADATA_URL": f"sqlite:///{tmp_path / 'meta.db'}",
            "RECONCILE_WAREHOUSE": str(tmp_path / "warehouse"),
            "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}),
        },
    )
    yield stack.env, sinks, stack.start
    stack.close()


def _runs(env, dag_id) -> list[dict]:
    out = subprocess.run([AIRFLOW, "dags", "list-runs", dag_id, "-o", "json"], env=env, capture_output=True, text=True)
    try:
        return cli_json(out.stdout)
    except ValueError:
        return []


def _wait(env, dag_id, predicate, what: str, timeout: int = 900) -> list[dict]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = _runs(env, dag_id)
        if any(r["state"] == "failed" for r in runs):
            pytest.fail(f"{dag_id}: a run failed: {runs}")
        if predicate(runs):
            return runs
        time.sleep(5)
    pytest.fail(f"{dag_id}: timed out waiting for {what}: {_runs(env, dag_id)}")


def _backfill(env, dag_id) -> None:
    subprocess.run(
        [
            AIRFLOW,
            "backfill",
            "create",
            "--dag-id",
            dag_id,
            "--from-date",
            "2026-01-02",
            "--to-date",
            "2026-01-04",
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


def test_scheduler_runs_and_backfills_in_order(airflow_services, spark, tmp_path, warehouse):
    from reconcile.config import load_file
    from reconcile.storage.delta import ShardTable
    from reconcile.storage.ledger import MetadataStore

    env, sinks, start = airflow_services
    src = tmp_path / "src"
    write_json_rows(src, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    _sink(sinks, src, "sched_covered")  # its scheduled run covers everything up to today
    _sink(sinks, src, "sched_catchup")  # read-only at first: its scheduled run mints nothing
    store = MetadataStore(env["RECONCILE_METADATA_URL"])
    store.ensure_shard("sched_catchup", AS_OF)
    store.set_read_only("sched_catchup", True)
    start()
    for dag_id in ("sched_covered", "sched_catchup"):
        _wait(env, dag_id, lambda runs: _done(runs, "scheduled__", 1), "the scheduled run")
    store.set_read_only("sched_catchup", False)
    covered = load_file(sinks / "sched_covered.yaml")
    version = ShardTable(covered).latest_version()
    upper = store.get_shard("sched_covered").upper
    assert upper > AS_OF + 300 * DAY  # the scheduled run reached today

    for dag_id in ("sched_covered", "sched_catchup"):
        _backfill(env, dag_id)
    for dag_id in ("sched_covered", "sched_catchup"):
        _wait(env, dag_id, lambda runs: _done(runs, "backfill__", 3), "three backfill runs")

    # Covered intervals: no-op runs, nothing written.
    assert ShardTable(covered).latest_version() == version
    assert store.get_shard("sched_covered").upper == upper
    # New intervals: one batch per run, in order, each equal to the source.
    catchup = load_file(sinks / "sched_catchup.yaml")
    batches = [b for b in store.batches("sched_catchup") if b.state == "committed"]
    assert [(b.lower, b.upper) for b in sorted(batches, key=lambda b: b.created_at)] == [
        (AS_OF, AS_OF + DAY),
        (AS_OF + DAY, AS_OF + 2 * DAY),
        (AS_OF + 2 * DAY, AS_OF + 3 * DAY),
    ]
    for b in batches:
        assert shard_as_of(catchup, b.upper - 1) == Counter({(1, "a", None): 1, (2, "b", None): 1})
    store.dispose()

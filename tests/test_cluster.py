"""A real Spark cluster: a standalone master and a worker started from the installed pyspark on
127.0.0.1 (their own JVMs; executors in the worker's JVMs, with their own Python workers), the
write jobs submitted to ``spark://...`` through Airflow's Spark connection, the warehouse
shared by path. A query sink, an upsert sink and a batch whose driver is killed mid-write run
there and match the plain-Python model; the master's record shows the applications ran on it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from helpers import daily_sink, leftover_staged, shard_as_of, write_json_rows

pytestmark = [pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _master_state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory):
    import pyspark

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    logs = tmp_path_factory.mktemp("cluster")
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env.update(SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, SPARK_WORKER_DIR=str(logs / "work"))
    master = f"spark://127.0.0.1:{port}"
    commands = {
        "master": [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port)]
        + ["--webui-port", str(ui)],
        "worker": [spark_class, "org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1"]
        + ["--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui)],
    }
    procs = []
    try:
        for name, cmd in commands.items():
            out = open(logs / f"{name}.log", "w")
            procs.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT))
            deadline = time.time() + 90
            while True:
                try:
                    state = _master_state(ui)
                    if name == "master" or state.get("aliveworkers", 0) >= 1:
                        break
                except OSError:
                    pass
                assert time.time() < deadline, f"the Spark {name} did not start: {(logs / f'{name}.log').read_text()}"
                time.sleep(1)
        yield master, ui
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _apps(ui: int) -> dict[str, int]:
    """Applications the master ran (name -> how many), finished or running."""
    state = _master_state(ui)
    return Counter(a["name"] for a in state.get("completedapps", []) + state.get("activeapps", []))


def _sink(sinks: Path, name: str, kind: str, section: dict) -> None:
    daily_sink(sinks, name, kind, retries=0, **{kind: section})


@pytest.mark.airflow
def test_airflow_submits_query_and_upsert_batches_to_the_cluster(
    spark_cluster, airflow_db, spark, tmp_path, monkeypatch
):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    from reconcile.config_loading import load_sink
    from upsert_model import UpsertModel, feed_rows, ok_rows

    master, ui = spark_cluster
    host, port = master.rsplit(":", 1)
    monkeypatch.setenv(
        "AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host, "port": int(port)})
    )
    sinks = tmp_path / "sinks"
    _sink(
        sinks,
        "cq",
        "query",
        {"sources": {"src": {"format": "json", "path": str(tmp_path / "src")}}, "sql": "SELECT k, v FROM src"},
    )
    upsert = {
        "source": {"format": "json", "path": str(tmp_path / "feed")},
        "key": ["k"],
        "time_column": "ts",
        "offset_column": "off",
    }
    _sink(sinks, "cu", "upsert", upsert)
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(sinks))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.setenv("RECONCILE_METADATA_URL", f"sqlite:///{tmp_path / 'meta.db'}")
    bag = DagBag(dag_folder=str(ROOT / "dags"))
    day2 = datetime(2026, 1, 2, tzinfo=UTC)
    upper = int(day2.timestamp() * 1000)

    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    assert bag.get_dag("cq").test(logical_date=day2).state == DagRunState.SUCCESS
    assert shard_as_of(load_sink("cq"), upper - 1) == Counter((r["k"], r["v"], None) for r in rows)

    cfg = load_sink("cu")
    feed = [
        {"k": 1, "v": "a", "ts": cfg.as_of + 10, "off": 1},
        {"k": 2, "v": "b", "ts": cfg.as_of + 20, "off": 2},
        {"k": 1, "v": None, "ts": cfg.as_of + 30, "off": 3},
    ]
    feed_rows(tmp_path, feed)
    assert bag.get_dag("cu").test(logical_date=day2).state == DagRunState.SUCCESS
    model = UpsertModel()
    model.batch(feed, cfg.as_of, upper)
    assert ok_rows(shard_as_of(cfg, upper - 1)) == model.as_of(upper - 1)

    ran = _apps(ui)
    assert ran["reconcile-cq-write"] == 1 and ran["reconcile-cu-write"] == 1, ran


def test_a_driver_killed_mid_write_on_the_cluster_then_recovered(
    spark_cluster, spark, warehouse, tmp_path, sqlite_ledger
):
    """The driver dies after executors staged files (exit 137, no cleanup); the retry stages
    its own attempt and commits it once; the dead attempt's files are collected."""
    from helpers import make_sink
    from reconcile.sink import check

    master, ui = spark_cluster
    cfg = make_sink(tmp_path, "ck")
    rows = [{"k": i, "v": f"v{i}"} for i in range(50)]
    write_json_rows(tmp_path / "src", rows)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env.update(RECONCILE_SPARK_MASTER=master, RECONCILE_SINKS_DIR=str(tmp_path), SPARK_LOCAL_IP="127.0.0.1")
    run = [sys.executable, "-m", "reconcile", "run", cfg.name, "--frontier", "200", "--run-id", "run-1"]
    killed = subprocess.run(
        run,
        env={**env, "RECONCILE_FAILPOINTS": "write.after_partition_staged=kill"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert sqlite_ledger.get_shard(cfg.name).upper < 200
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "appended batch" in again.stdout, again.stdout
    assert sqlite_ledger.get_shard(cfg.name).upper == 200
    assert shard_as_of(cfg, 199) == Counter((r["k"], r["v"], None) for r in rows)
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    assert leftover_staged(sqlite_ledger, cfg) == []
    assert _apps(ui)["reconcile-run-ck"] == 2

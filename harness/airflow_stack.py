"""A long-lived Airflow for tests and benchmarks: api-server, scheduler (LocalExecutor) and
dag-processor as real processes, Airflow's database a fresh PostgreSQL database of its own.

    stack = AirflowStack(home, postgres_url, {"RECONCILE_SINKS_DIR": ...})
    stack.start()            # after the sinks are in place
    stack.dag_run(dag_id, run_id)
    stack.close()            # stops the processes, drops the database
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

AIRFLOW = str(Path(sys.executable).parent / "airflow")


def sink_env(home: Path, sinks: Path, connect_url: str, **extra: str) -> dict[str, str]:
    """The environment of a stack running sinks: their folder, a SQLite ledger and a warehouse
    under ``home``, retries after 1 s, the write tasks on the Spark Connect server ``connect_url``."""
    import json

    host, port = connect_url.removeprefix("sc://").split(":")
    return {
        "RECONCILE_SINKS_DIR": str(sinks),
        "RECONCILE_METADATA_URL": f"sqlite:///{home / 'meta.db'}",
        "RECONCILE_WAREHOUSE": str(home / "warehouse"),
        "RECONCILE_RETRY_DELAY_SECONDS": "1",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}),
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirflowStack:
    def __init__(self, home: Path, postgres_url: str, extra: dict[str, str]):
        from sqlalchemy import create_engine, text

        self.home = home
        self.db = f"airflow_{uuid.uuid4().hex[:10]}"
        self.admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
        with self.admin.connect() as c:
            c.execute(text(f"CREATE DATABASE {self.db}"))
        self.db_url = postgres_url.rsplit("/", 1)[0] + f"/{self.db}"
        self.port = free_port()
        # not this process's Spark gateway, nor the SQLite-only connect args of scripts/env.sh
        drop = ("PYSPARK_GATEWAY_PORT", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(
            {
                "AIRFLOW_HOME": str(home / "airflow"),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url,
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
                "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
                "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                **extra,
            }
        )
        self.procs: list[subprocess.Popen] = []
        subprocess.run([AIRFLOW, "db", "migrate"], env=self.env, check=True, capture_output=True)

    def start(self, timeout: float = 300) -> None:
        """The api-server first, then the scheduler and dag-processor once it answers: a task
        the scheduler starts earlier cannot reach the execution API and fails while queued."""
        self._spawn(["api-server", "--port", str(self.port)])
        deadline = time.time() + timeout
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=5)
                break
            except OSError:
                if self.procs[0].poll() is not None or time.time() > deadline:
                    raise RuntimeError(
                        "the api-server did not come up: " + (self.home / "api-server.log").read_text()[-3000:]
                    ) from None
                time.sleep(1)
        self._spawn(["scheduler"])
        self._spawn(["dag-processor"])

    def _spawn(self, cmd: list[str]) -> None:
        log = open(self.home / f"{cmd[0]}.log", "w")  # noqa: SIM115 - the process holds it
        self.procs.append(
            subprocess.Popen(
                [AIRFLOW, *cmd], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def airflow(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True)

    def _rows(self, sql: str, **params) -> list[dict]:
        from sqlalchemy import create_engine, text

        engine = create_engine(self.db_url)
        try:
            with engine.connect() as c:
                return [dict(r._mapping) for r in c.execute(text(sql), params)]
        finally:
            engine.dispose()

    def dag_run(self, dag_id: str, run_id: str) -> dict | None:
        """The run's state and times, straight from Airflow's database (no CLI start per poll)."""
        rows = self._rows(
            "SELECT state, logical_date, queued_at, start_date, end_date FROM dag_run WHERE dag_id = :d AND run_id = :r",
            d=dag_id,
            r=run_id,
        )
        return rows[0] if rows else None

    def runs(self, dag_id: str, like: str = "%") -> list[dict]:
        return self._rows(
            "SELECT run_id, state FROM dag_run WHERE dag_id = :d AND run_id LIKE :l ORDER BY run_id", d=dag_id, l=like
        )

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self._rows(
            "SELECT task_id, state, queued_dttm, start_date, end_date FROM task_instance "
            "WHERE dag_id = :d AND run_id = :r ORDER BY start_date",
            d=dag_id,
            r=run_id,
        )

    def close(self) -> None:
        from sqlalchemy import text

        # A stack under test has nothing to finish: SIGTERM, a second, then every process of
        # each service's group (the executor's workers, the api-server's) is killed.
        for p in self.procs:
            p.terminate()
        deadline = time.time() + 1
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        with self.admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)"))
        self.admin.dispose()

"""``dag.test()`` in a child interpreter that is a Spark Connect client (a test harness).

pyspark is classic or Connect per process, and the pytest process usually holds the classic
session (the ``spark`` fixture): it cannot open a Connect session. :class:`DagChild` keeps one
child interpreter (multiprocessing's *spawn*: a fresh interpreter, no state copied from pytest)
for as long as its owner wants it, so Airflow is imported once; each :meth:`DagChild.test` runs
one ``dag.test()`` there with ``spark_default`` a ``spark_connect`` connection, so the DAG's
``write`` and ``compact`` run in the child as clients of the test run's Spark Connect server
instead of spark-submitting a JVM each. ``RECONCILE_JOBS_DIR`` names a folder that does not
exist: a spark-submit would fail.

What the run logged (the child's file descriptors 1 and 2, where Airflow's and the sink's
loggers write) comes back with the run's state, run id and task states as a plain dict.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class DagTestError(RuntimeError):
    """``dag.test()`` raised in the child: the error, its traceback and the end of the run's log."""


def connect_env(connect_url: str, jobs_dir: Path) -> dict[str, str]:
    """``spark_default`` a ``spark_connect`` connection to ``connect_url`` (``sc://host:port``),
    and a jobs folder ``jobs_dir`` that must not exist (no job can be spark-submitted)."""
    host, port = connect_url.removeprefix("sc://").split(":")
    return {
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": host, "port": int(port)}),
        "RECONCILE_JOBS_DIR": str(jobs_dir),
    }


class DagChild:
    """One long-lived child interpreter running ``dag.test()``; ``env`` applies to every run."""

    def __init__(self, env: Mapping[str, str], timeout: float = 900):
        self.env = dict(env)
        self.timeout = timeout
        self._pool: ProcessPoolExecutor | None = None

    def test(
        self,
        dag_id: str,
        logical_date: datetime,
        env: Mapping[str, str],
        run_conf: dict | None = None,
        failpoints: str | Mapping[str, str] | None = None,
    ) -> dict:
        """``dag.test(logical_date=..., run_conf=...)`` of ``dag_id`` in the child, with ``env``
        (and this harness's own) in its environment and ``failpoints`` armed for the run:
        ``{"state", "run_id", "tis": {task_id: state}, "applications": {task_id: the job a
        spark-submit would run}, "log": what the run wrote, "seconds": how long it took}``."""
        if self._pool is None:  # started on first use: Airflow is imported there once
            self.warm()
        assert self._pool is not None
        future = self._pool.submit(run_dag_test, {**self.env, **env}, dag_id, logical_date, run_conf, failpoints)
        try:
            return future.result(timeout=self.timeout)
        except TimeoutError:
            self.close(kill=True)
            raise

    def warm(self) -> Future:
        """Start the child and import there what a run needs (Airflow, its in-process Execution
        API, the DAG module with this harness's environment, pyspark's Connect client) while
        the caller does something else (starts the Spark Connect server): the future of it."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool.submit(warm_up, self.env)

    def close(self, kill: bool = False) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:  # a hung run: end the child (ours) rather than wait for it
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()
        pool.shutdown(wait=True, cancel_futures=True)


# --- in the child ---------------------------------------------------------------------------


def _in_env(env: Mapping[str, str], what: str, fn: Callable[[], dict]) -> tuple[dict, str]:
    """``fn()`` with ``env`` in the environment (restored afterwards) and its output captured:
    (its result, what it wrote). An exception comes back as a :class:`DagTestError` naming
    ``what``, with its traceback and the end of the output."""
    saved = dict(os.environ)
    os.environ.pop("PYSPARK_GATEWAY_PORT", None)  # pyspark must not look for a classic gateway
    os.environ.update(env)
    error: str | None = None
    result: dict = {}
    try:
        with _captured() as log:
            try:
                result = fn()
            except BaseException as exc:  # surfaces in the test with its message
                error = f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if error is not None:
        raise DagTestError(f"{what} raised {error}\n--- log ---\n{log['text'][-6000:]}")
    return result, log["text"]


def _warm_imports() -> dict:
    import pyspark.sql.connect.session  # noqa: F401
    from airflow.dag_processing.dagbag import DagBag  # noqa: F401
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    import reconcile.airflow.dags  # noqa: F401

    in_process_api_server().app  # noqa: B018 (a cached property: built once per process)
    return {}


def warm_up(env: Mapping[str, str]) -> None:
    """Runs in the child: the imports (and the in-process Execution API app) the first run
    would otherwise pay for, with ``env`` in the environment while the DAG module is imported.
    What it logs is dropped unless it fails."""
    _in_env(env, "warming the child up", _warm_imports)


def run_dag_test(
    env: Mapping[str, str],
    dag_id: str,
    logical_date: datetime,
    run_conf: dict | None = None,
    failpoints: str | Mapping[str, str] | None = None,
) -> dict:
    """Runs in the child: see :meth:`DagChild.test`. The environment is restored afterwards."""
    import time

    started = time.monotonic()
    result, log = _in_env(
        env, f"dag.test({dag_id!r}, {logical_date})", lambda: _dag_test(dag_id, logical_date, run_conf, failpoints)
    )
    return {**result, "log": log, "seconds": round(time.monotonic() - started, 1)}


def _dag_test(dag_id: str, logical_date: datetime, run_conf: dict | None, failpoints) -> dict:
    from reconcile import failpoints as fp
    from reconcile import settings
    from reconcile.airflow import operators

    # operators.py reads RECONCILE_JOBS_DIR when first imported: a run with another folder re-reads it
    operators.JOBS = Path(os.environ.get("RECONCILE_JOBS_DIR", settings.PROJECT_ROOT / "jobs"))
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    dag = bag.get_dag(dag_id)
    if dag is None:
        raise LookupError(f"no DAG {dag_id!r} in {ROOT / 'dags'}: {bag.import_errors}")
    applications = {
        t.task_id: t.application for t in dag.tasks if isinstance(t, operators.ReconcileSparkSubmitOperator)
    }
    spec = failpoints if isinstance(failpoints, Mapping) else _parse(failpoints or "")
    try:
        for name, action in spec.items():
            fp.arm(name, action)
        run = dag.test(logical_date=logical_date, run_conf=run_conf)
    finally:
        fp.disarm_all()
    return {
        "state": _plain(run.state),
        "run_id": run.run_id,
        "tis": {ti.task_id: _plain(ti.state) for ti in run.get_task_instances()},
        "applications": applications,
    }


def _parse(spec: str) -> dict[str, str]:
    """``"name=action,..."`` (RECONCILE_FAILPOINTS' form) as a dict; a bare name means ``raise``."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        out[name] = action or "raise"
    return out


def _plain(state) -> str | None:
    return None if state is None else str(getattr(state, "value", state))


def _flush() -> None:
    import logging

    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None:
            stream.flush()
    loggers = [
        logging.getLogger(),
        *(v for v in logging.Logger.manager.loggerDict.values() if isinstance(v, logging.Logger)),
    ]
    for logger in loggers:
        for handler in logger.handlers:
            handler.flush()


@contextmanager
def _captured() -> Iterator[dict[str, str]]:
    """File descriptors 1 and 2 to a temporary file while the block runs; ``["text"]`` holds
    what was written afterwards. Python's streams and the logging handlers (Airflow's and the
    sink's write to sys.stdout and sys.stderr, i.e. to descriptors 1 and 2) are flushed first
    and last, so nothing written during the block is left behind in a buffer."""
    out = {"text": ""}
    with tempfile.TemporaryFile() as f:
        _flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            _flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            f.seek(0)
            out["text"] = f.read().decode(errors="replace")

"""One Airflow DAG per sink config: ``mint >> write >> append >> compaction_due >> compact``.

Built at DAG-parse time from the YAML files only: no Spark, no database, no network here.

- ``mint`` (Python, metadata only) describes the run's batch ``(lower, upper)``; when there is
  nothing to do (interval covered, read-only) it says why (a warning) and skips the rest of the
  run at once (a short circuit): the run succeeds. The batch id goes forward by XCom: ``write``
  and ``append`` work on exactly that batch (only mint mints). A batch outdated by another writer
  before it is written, or covered by a newer description, ends the run's remaining tasks as
  skipped.
- ``write`` is a spark-submit job (jobs/write_correction.py) on the ``spark_default``
  connection (``local[*]`` on the embedded default, a Spark master in production); when that
  connection is a ``spark_connect`` one, the same stage runs in the worker as a client of the
  Spark Connect server: no JVM starts for the run.
- ``append`` (Python, no JVM) commits the staged files to the Delta log as they are.
- ``compaction_due`` (Python, metadata only, a short circuit) skips ``compact`` until ``compaction.every_batches``
  batches wait to be folded into ``since``; ``compact`` (jobs/compact_shard.py) then advances
  since, consolidates the history before it and vacuums (reconcile.compact).
- Retries: transient failures retry; a failure the job recorded as final (an outdated batch,
  bad input) fails at once with its one-line cause and remedy.
- ``max_active_runs=1``: runs of a sink (and backfills) commit in order.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Asset, Param, task
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from reconcile import settings
from reconcile.config import SinkConfig, load_dir
from reconcile.spark import submit_conf

# The batch the run's mint minted, handed forward: the batch written and appended is that one.
BATCH_ID = "{{ (ti.xcom_pull(task_ids='mint') or {}).get('batch_id') }}"
JOBS = Path(os.environ.get("RECONCILE_JOBS_DIR", settings.PROJECT_ROOT / "jobs"))


def spark_connect_url(conn_id: str) -> str | None:
    """The Spark Connect URL of ``conn_id`` if it is a ``spark_connect`` connection, else None."""
    from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook
    from airflow.sdk import BaseHook

    if BaseHook.get_connection(conn_id).conn_type != SparkConnectHook.conn_type:
        return None
    return SparkConnectHook(conn_id).get_connection_url()


def run_on_connect(stage: str, sink: str, run_id: str, batch_id: str | None, remote: str) -> str:
    """One stage as a client of a Spark Connect server, in this process: a failure the stage
    recorded as final fails the task at once; a retryable one lets Airflow retry."""
    from reconcile.airflow.tasks import compact_for_run, stage_for_run
    from reconcile.errors import Retryable, SinkError
    from reconcile.spark import get_session

    fn = {"write": stage_for_run, "compact": compact_for_run}[stage]
    try:
        return fn(sink, run_id, batch_id, get_session(remote=remote))
    except Retryable as exc:
        raise AirflowException(f"{stage} failed: {exc}") from None
    except SinkError as exc:
        raise AirflowFailException(f"{stage} failed (not retried): {exc}") from None


class ReconcileSparkSubmitOperator(SparkSubmitOperator):
    """One stage job on the sink's Spark connection: spark-submit of jobs/<stage>.py, or, on a
    ``spark_connect`` connection, the stage run here as a Connect client. Turns a failure the
    job recorded as final into a non-retried task failure with the job's one-line message."""

    def __init__(self, *, sink: str, stage: str, **kwargs):
        script = {"write": "write_correction.py", "compact": "compact_shard.py"}[stage]
        super().__init__(
            application=str(JOBS / script),
            application_args=["--sink", sink, "--run-id", "{{ run_id }}", "--batch-id", BATCH_ID],
            conf=submit_conf(),
            name=f"reconcile-{sink}-{stage}",
            conn_id=os.environ.get("RECONCILE_SPARK_CONN_ID", "spark_default"),
            **kwargs,
        )
        self.sink = sink
        self.stage = stage

    def execute(self, context):
        from reconcile.airflow.aws import export_connection
        from reconcile.airflow.tasks import batch_line, failure_verdict, nothing_left, out_of_retries

        export_connection()  # the job (spark-submit's child, or this process) reads the environment
        run_id = context["run_id"]
        batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
        if self.stage == "write":
            why = nothing_left(self.sink, run_id, batch_id)
            if why is not None:  # superseded before it was written: no Spark job at all
                self.log.warning("write: nothing to do: %s", why)
                raise AirflowSkipException(f"write: nothing to do: {why}")
            self.log.info("write: %s", batch_line(self.sink, run_id, batch_id)[1])
        remote = spark_connect_url(self._conn_id)
        result: str | None
        try:
            if remote:
                result = run_on_connect(self.stage, self.sink, run_id, batch_id, remote)
                self.log.info("%s on Spark Connect %s: %s", self.stage, remote, result)
            else:
                result = super().execute(context)
        except AirflowFailException as exc:
            self.log.error("%s", exc)
            raise
        except AirflowException as exc:
            final, message = failure_verdict(self.sink, run_id, batch_id)
            if final:
                self.log.error("%s failed (not retried): %s", self.stage, message)
                raise AirflowFailException(f"{self.stage} failed (not retried): {message}") from None
            cause = f"{self.stage} failed: {message or exc}"
            if _last_try(context):
                cause = out_of_retries(self.sink, run_id, self.stage, cause, _day(context))
            self.log.error("%s", cause)
            raise AirflowException(cause) from None
        if self.stage == "compact":
            self.log.info("compact: %s", result or "done")
            return result
        why = nothing_left(self.sink, run_id, batch_id)
        if why is not None:  # outdated or covered: the rest of the run has nothing to do
            self.log.warning("%s: nothing to do: %s", self.stage, why)
            raise AirflowSkipException(f"{self.stage}: nothing to do: {why}")
        level, line = batch_line(self.sink, run_id, batch_id)
        self.log.log(level, "%s: %s", self.stage, line)
        return result


def _last_try(context) -> bool:
    """Will Airflow not retry this task if it fails now?"""
    ti = context["ti"]
    return ti.try_number > (ti.max_tries or 0)


def _day(context):
    """The run's logical date, which ``airflow tasks clear -s/-e`` select it by (None for a
    manual run without one: those select it by its failed state)."""
    return context["dag_run"].logical_date


def _doc(cfg: SinkConfig) -> str:
    cols = "\n".join(f"| `{c.name}` | {c.type} | {'yes' if c.nullable else 'no'} |" for c in cfg.columns)
    return (
        f"# Sink `{cfg.name}` ({cfg.kind})\n\n{cfg.description}\n\n"
        f"Config: `{cfg.path}` · partitions: {cfg.partitions} · as_of: {cfg.as_of}\n\n"
        "Each run mints one batch `(lower, upper)`, stages the correction `desired - persist` "
        "and commits it with a compare-and-append. Clearing any task or the whole run is safe.\n\n"
        f"| column | type | nullable |\n|---|---|---|\n{cols}\n"
    )


def shard_asset(cfg: SinkConfig) -> Asset:
    """The sink's shard as an Airflow Asset: the Delta table's URI (a local path as file://).
    Every committed batch emits an event on it; a downstream DAG scheduled on it reads how far
    the shard is from the event's ``extra`` (lower, upper, Delta version, rows, drift)."""
    from reconcile.storage.delta import ShardTable

    path = ShardTable(cfg).path
    uri = path if "://" in path else Path(path).absolute().as_uri()
    return Asset(uri=uri, name=f"reconcile_shard_{cfg.name}", group="reconcile")


def build_dag(cfg: SinkConfig) -> DAG:
    with DAG(
        dag_id=cfg.name,
        schedule=cfg.schedule,
        start_date=cfg.start_date,
        catchup=cfg.catchup,
        max_active_runs=1,
        doc_md=_doc(cfg),
        tags=["reconcile", cfg.kind],
        default_args={
            "retries": cfg.retries,
            "retry_delay": timedelta(seconds=int(os.environ.get("RECONCILE_RETRY_DELAY_SECONDS", "30"))),
        },
        params={
            "read_only": Param(False, type="boolean", description="mint nothing: a read-only run"),
            "approve_correction": Param(
                False,
                type="boolean",
                description="let this run's batch past the sink's correction guard (correction_guard.max_share)",
            ),
        },
    ) as dag:

        @task.short_circuit(task_id="mint")
        def mint(sink: str = cfg.name, **context) -> dict | bool:
            from reconcile.airflow.tasks import mint_for_run

            dag_run = context["dag_run"]
            result = mint_for_run(
                sink,
                context["run_id"],
                context["ti"].try_number,
                dag_run.data_interval_end,
                dag_run.start_date,
                read_only=bool(context["params"].get("read_only")),
            )
            if result.description is None:  # the rest of the run is skipped at once
                logging.getLogger("reconcile.tasks").warning("mint: %s", result.message)
                return False
            d = result.description
            return {"batch_id": d.batch_id, "lower": d.lower, "upper": d.upper}

        write = ReconcileSparkSubmitOperator(task_id="write", sink=cfg.name, stage="write")

        shard = shard_asset(cfg)

        @task(task_id="append", outlets=[shard])
        def append(sink: str = cfg.name, scheduled: bool = cfg.schedule is not None, **context) -> str:
            from reconcile.airflow.tasks import (
                batch_line,
                commit_for_run,
                committed_extra,
                nothing_left,
                out_of_retries,
            )
            from reconcile.errors import DescriptionOutdated, Retryable, SinkError

            log = logging.getLogger("reconcile.tasks")
            run_id = context["run_id"]
            batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
            approve = (
                f"run {run_id} (param approve_correction)" if context["params"].get("approve_correction") else None
            )
            why = nothing_left(sink, run_id, batch_id, unminted_only=True)
            if why is not None:  # cleared after a mint that minted nothing
                log.warning("append: nothing to do: %s", why)
                raise AirflowSkipException(f"append: nothing to do: {why}")
            log.info("append: %s", batch_line(sink, run_id, batch_id)[1])
            try:
                message = commit_for_run(sink, run_id, batch_id, approve, _day(context))
            except DescriptionOutdated as exc:  # another batch won; the remedy says who appends the rest
                if scheduled:
                    log.warning("append: nothing left for this run: %s", exc)
                    raise AirflowSkipException(f"append: nothing left for this run: {exc}") from None
                log.error("append: %s", exc)
                raise AirflowFailException(f"append: {exc}") from None
            except Retryable as exc:
                cause = f"append failed: {exc}"
                if _last_try(context):
                    cause = out_of_retries(sink, run_id, "append", cause, _day(context))
                log.error("%s", cause)
                raise AirflowException(cause) from None
            except SinkError as exc:
                log.error("append failed (not retried): %s", exc)
                raise AirflowFailException(f"append failed (not retried): {exc}") from None
            why = nothing_left(sink, run_id, batch_id)
            if why is not None:  # outdated or covered: the rest of the run has nothing to do
                log.warning("append: nothing to do: %s", why)
                raise AirflowSkipException(f"append: nothing to do: {why}")
            level, line = batch_line(sink, run_id, batch_id)
            log.log(level, "append: %s", line)
            context["outlet_events"][shard].extra = committed_extra(sink, run_id, batch_id)
            return message

        @task.short_circuit(task_id="compaction_due")
        def compaction_due(sink: str = cfg.name) -> str | bool:
            from reconcile.airflow.tasks import compaction_check

            due, why = compaction_check(sink)
            logging.getLogger("reconcile.tasks").info("compaction %s: %s", "due" if due else "not due", why)
            return why if due else False

        compact = ReconcileSparkSubmitOperator(task_id="compact", sink=cfg.name, stage="compact")
        mint() >> write >> append() >> compaction_due() >> compact
    return dag


def build_invalid_dag(error) -> DAG:
    """A visible placeholder for a config file that does not validate."""
    stem = Path(error.path).stem
    with DAG(
        dag_id=f"invalid_sink_config__{''.join(ch if ch.isalnum() or ch == '_' else '_' for ch in stem)}",
        schedule=None,
        doc_md=f"# Invalid sink config\n\n`{error}`",
        tags=["reconcile", "invalid"],
    ) as dag:

        @task(task_id="explain")
        def explain(message: str = str(error)) -> None:
            raise AirflowFailException(message)

        explain()
    return dag


def build_dags(directory=None) -> dict[str, DAG]:
    configs, errors = load_dir(directory)
    dags = {cfg.name: build_dag(cfg) for cfg in configs}
    for err in errors:
        d = build_invalid_dag(err)
        dags[d.dag_id] = d
    return dags

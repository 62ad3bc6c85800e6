"""One Airflow DAG per sink config: ``mint >> write >> append >> compaction_due >> compact``.

Built at DAG-parse time from the YAML files only: no Spark, no database, no network here. This
module is the DAG factory; the operators and task bodies are :mod:`reconcile.airflow.operators`'s,
the callbacks (the run's note, the lag alert) :mod:`reconcile.airflow.callbacks`'s.

- ``mint`` (Python, metadata only) describes the run's batch ``(lower, upper)``; when there is
  nothing to do (interval covered, read-only) it says why (a warning) and skips the rest of the
  run at once (a short circuit): the run succeeds. The batch id goes forward by XCom: ``write``
  and ``append`` work on exactly that batch (only mint mints). A batch outdated by another writer
  before it is written, or covered by a newer description, ends the run's remaining tasks as
  skipped.
- ``write`` is a spark-submit job (jobs/write_correction.py) on the sink's Spark connection
  (its ``spark_conn_id``, else ``RECONCILE_SPARK_CONN_ID``, else ``spark_default``: ``local[*]``
  on the embedded default, a Spark master in production); when that
  connection is a ``spark_connect`` one, the same stage runs in the worker as a client of the
  Spark Connect server: no JVM starts for the run.
- ``append`` (Python, no JVM) commits the staged files to the Delta log as they are.
- With ``correction_guard.approve_in_airflow``, ``write >> correction_guard`` (a branch, metadata
  only) decides whether the guard stops the staged batch: if not, it goes straight to ``append``
  and ``approve_correction`` is skipped; if so, ``approve_correction`` (Airflow's human-in-the-loop
  ApprovalOperator) shows the numbers in Airflow's UI (Required actions) and waits: Approve
  records the approval in the ledger under the responding user's name and ``append`` commits;
  Reject, or no answer within ``correction_guard.approval_timeout_minutes``, fails the run with
  nothing committed and says how to approve the batch later.
- The run's note (in Airflow's UI) says its outcome in one line: the committed batch (interval,
  Delta version, rows), why there was nothing to do, or the failure's cause and remedy
  (:func:`reconcile.airflow.tasks.set_run_note`, through Airflow's REST API).
- A sink with ``alert.lag_minutes`` has an Airflow deadline: a run not finished that long after
  it was queued calls
  :func:`reconcile.airflow.callbacks.lag_deadline_missed`, which logs the alert and calls ``alert.callback`` (a function or a
  notifier class: the team's notifier).
- ``compaction_due`` (Python, metadata only, a short circuit) skips ``compact`` until ``compaction.every_batches``
  batches wait to be folded into ``since``; ``compact`` (jobs/compact_shard.py) then advances
  since, consolidates the history before it and vacuums (reconcile.compact).
- Retries: transient failures retry; a failure no retry fixes (the job recorded it as final:
  an outdated batch, bad input, a refused warehouse; or a connection that is not defined) fails
  at once with its one-line cause and remedy, recorded on the run's batch as final (``status``:
  NEEDS ACTION; the run's note).
- ``max_active_runs=1``: scheduled runs of a sink commit in order; Airflow 3 limits a backfill's runs
  apart (its own ``--max-active-runs``), so a backfill run and a scheduled one may race: the
  compare-and-append lets one commit, the other finds its batch outdated or its interval covered.
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Asset, Param, TriggerRule, task
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
from airflow.sdk.exceptions import AirflowFailException

from reconcile.airflow.callbacks import lag_deadline_missed, note_run_failure
from reconcile.airflow.operators import (
    CorrectionApproval,
    ReconcileSparkSubmitOperator,
    append_task,
    mint_task,
    spark_conn_id,
)
from reconcile.config import SinkConfig
from reconcile.config_loading import load_dir
from reconcile.errors import ConfigError
from reconcile.schedule import schedule_period_ms

log = logging.getLogger(__name__)


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


def lag_deadline(cfg: SinkConfig) -> DeadlineAlert | None:
    """The DAG's deadline, for a sink with ``alert.lag_minutes``: a run not finished that long
    after it was queued calls :func:`lag_deadline_missed` (on the scheduler's executor).

    Only an explicit ``alert.lag_minutes`` sets one (not the pages' default of twice the
    schedule's interval): Airflow 3.3.2's ``dag.test()`` (``airflow dags test``) fails at the end
    of a run of a DAG with a deadline (it looks the DAG's deadline alerts up by their serialized
    form instead of their database ids), and the plain sinks must stay testable that way."""
    minutes = cfg.alert.lag_minutes
    if minutes is None:
        return None
    kwargs: dict = {"sink": cfg.name, "lag_minutes": minutes}
    if cfg.alert.callback:
        kwargs.update(notify=cfg.alert.callback, notify_kwargs=dict(cfg.alert.callback_kwargs))
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(minutes=minutes),
        callback=SyncCallback(f"{lag_deadline_missed.__module__}.{lag_deadline_missed.__name__}", kwargs=kwargs),
        name=f"reconcile_lag_{cfg.name}",
    )


def callback_problem(cfg: SinkConfig) -> ConfigError | None:
    """``alert.callback`` cannot be imported here (the DAG processor): a one-line config error."""
    if not cfg.alert.callback:
        return None
    from airflow.sdk._shared.module_loading import import_string

    try:
        import_string(cfg.alert.callback)
    except ImportError as exc:
        return ConfigError(
            cfg.path,
            "alert.callback",
            f"cannot import {cfg.alert.callback!r} ({exc}): name a function or notifier class that Airflow's "
            "workers can import (its package installed, its module on the PYTHONPATH)",
            sink=cfg.name,
        )
    return None


def approval_timeout(cfg: SinkConfig) -> timedelta:
    """How long ``approve_correction`` waits: ``correction_guard.approval_timeout_minutes``, else
    the schedule's interval (a day without a recurring schedule)."""
    if cfg.correction_guard.approval_timeout_minutes is not None:
        return timedelta(minutes=cfg.correction_guard.approval_timeout_minutes)
    period = schedule_period_ms(cfg.schedule)
    return timedelta(milliseconds=period) if period else timedelta(days=1)


# The dialect of the DAGs' param schemas (all they use is ``type``): Airflow checks each param's
# schema against its dialect's metaschema whenever it validates or serializes the param (every
# parse, every DAG), and draft 7's check costs a quarter of the default 2020-12's.
DRAFT_7: dict[str, Any] = {"$schema": "http://json-schema.org/draft-07/schema#"}


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
            "on_failure_callback": note_run_failure,
        },
        deadline=lag_deadline(cfg),
        params={
            "read_only": Param(False, type="boolean", description="mint nothing: a read-only run", **DRAFT_7),
            "approve_correction": Param(
                False,
                type="boolean",
                description="let this run's batch past the sink's correction guard (correction_guard.max_share)",
                **DRAFT_7,
            ),
        },
    ) as dag:

        @task.short_circuit(task_id="mint")
        def mint(sink: str = cfg.name, **context) -> dict | bool:
            return mint_task(sink, context)

        spark = spark_conn_id(cfg)
        write = ReconcileSparkSubmitOperator(task_id="write", sink=cfg.name, stage="write", conn_id=spark)

        shard = shard_asset(cfg)

        asks = cfg.correction_guard.approve_in_airflow and cfg.correction_guard.max_share is not None

        @task(
            task_id="append",
            outlets=[shard],
            # after correction_guard: runs unless the approval failed (skipped: none was needed)
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS if asks else TriggerRule.ALL_SUCCESS,
        )
        def append(sink: str = cfg.name, scheduled: bool = cfg.schedule is not None, **context) -> str:
            from reconcile.airflow.watchdog import watched

            with watched(sink, context["run_id"], "append", context["ti"].try_number):
                return append_task(shard, sink, scheduled, context)

        @task.short_circuit(task_id="compaction_due")
        def compaction_due(sink: str = cfg.name) -> str | bool:
            from reconcile.airflow.tasks import compaction_check

            due, why = compaction_check(sink)
            log.info("compaction %s: %s", "due" if due else "not due", why)
            return why if due else False

        compact = ReconcileSparkSubmitOperator(task_id="compact", sink=cfg.name, stage="compact", conn_id=spark)
        committed = append()
        if asks:

            @task.branch(task_id="correction_guard")
            def correction_guard(sink: str = cfg.name, **context) -> list[str]:
                from reconcile.airflow.tasks import guard_stop

                if context["params"].get("approve_correction"):
                    log.info("correction_guard: run approved up front (param approve_correction): on to append")
                    return ["append"]
                batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
                stop = guard_stop(sink, context["run_id"], batch_id)
                if stop is None:
                    log.info("correction_guard: no approval needed: on to append")
                    return ["append"]
                log.warning("%s: asking for an approval in Airflow (task approve_correction)", stop.line)
                return ["approve_correction", "append"]

            approve = CorrectionApproval(task_id="approve_correction", sink=cfg.name, timeout=approval_timeout(cfg))
            guarded = correction_guard()
            mint() >> write >> guarded >> [approve, committed]
            approve >> committed
        else:
            mint() >> write >> committed
        committed >> compaction_due() >> compact
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
    """One DAG per sink file of ``directory`` (default: ``RECONCILE_SINKS_DIR``, else the
    default sinks folder). A folder given here also becomes this process's
    ``RECONCILE_SINKS_DIR``: a task finds its sink by name, in the process that parsed this
    file to run it, and the Spark jobs it starts inherit the variable.

    Parsed to run a task (Airflow's parsing context names the task's DAG), only that sink's DAG
    is built, from the one file named after it (:func:`task_dag`); the dag-processor (no
    context) builds them all."""
    if directory is not None:
        os.environ["RECONCILE_SINKS_DIR"] = str(Path(directory).expanduser().resolve())
    from airflow.sdk import get_parsing_context

    wanted = get_parsing_context().dag_id
    if wanted:
        one = task_dag(wanted, directory)
        if one is not None:
            return one
    configs, errors = load_dir(directory)
    dags = {}
    for cfg in configs:
        dags.update(_dag_or_placeholder(cfg, errors))
    for err in errors:
        d = build_invalid_dag(err)
        dags[d.dag_id] = d
    log.debug("built %d DAG(s) of %d sink file(s)", len(dags), len(configs) + len(errors))
    return dags


def _dag_or_placeholder(cfg: SinkConfig, errors: list) -> dict[str, DAG]:
    """{name: the sink's DAG}, or {} with its problem added to ``errors`` (its placeholder)."""
    problem = callback_problem(cfg)
    if problem is not None:
        errors.append(problem)
        return {}
    return {cfg.name: build_dag(cfg)}


def task_dag(dag_id: str, directory=None) -> dict[str, DAG] | None:
    """The one DAG a task's parse needs: ``{dag_id: its DAG}`` from the sink file named after
    it (:func:`reconcile.config_loading.load_named`: that file defines the sink whatever
    the other files say), or its placeholder if its alert callback cannot be imported. None
    when that file does not define it (a sink named in another file, an invalid file, a
    placeholder's DAG, a DAG of another DAG file): then every sink's DAG is built."""
    from reconcile.config_loading import load_named

    cfg = load_named(dag_id, directory)
    if cfg is None:
        return None
    errors: list = []
    dags = _dag_or_placeholder(cfg, errors)
    for err in errors:
        d = build_invalid_dag(err)
        dags[d.dag_id] = d
    log.info("parsed for a task of DAG %s: built its DAG alone, from %s", dag_id, cfg.path)
    return dags

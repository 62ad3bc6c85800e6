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
  :func:`lag_deadline_missed`, which logs the alert and calls ``alert.callback`` (a function or a
  notifier class: the team's notifier).
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
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk import DAG, Asset, Param, TriggerRule, task
from airflow.sdk.definitions.callback import SyncCallback
from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from reconcile import settings
from reconcile.config import SinkConfig, load_dir
from reconcile.errors import ConfigError
from reconcile.schedule import schedule_period_ms
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
        from reconcile.airflow.watchdog import watched

        with watched(self.sink, context["run_id"], self.stage, context["ti"].try_number):
            return self._execute(context)

    def _execute(self, context):
        from reconcile.airflow.aws import export_connection
        from reconcile.airflow.tasks import batch_line, failure_verdict, nothing_left, out_of_retries

        export_connection()  # the job (spark-submit's child, or this process) reads the environment
        run_id = context["run_id"]
        batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
        if self.stage == "write":
            why = nothing_left(self.sink, run_id, batch_id)
            if why is not None:  # superseded before it was written: no Spark job at all
                self.log.warning("write: nothing to do: %s", why)
                _note(context, f"nothing to do: {why}")
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
            _note(context, f"nothing to do: {why}")
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


def _note(context, text: str) -> None:
    """Set the run's note to ``text`` (best effort: see :func:`reconcile.airflow.tasks.set_run_note`)."""
    from reconcile.airflow.tasks import set_run_note

    set_run_note(context["dag"].dag_id, context["run_id"], text)


def note_run_failure(context) -> None:
    """``on_failure_callback`` of every task: a task that failed for good (no retry left, or a
    final failure) says so in the run's note, with the cause and remedy it raised."""
    _note(context, failure_note(context["ti"].task_id, context.get("exception"), context["dag"].dag_id))


def failure_note(task_id: str, exception: BaseException | None, sink: str) -> str:
    """The run's note for a task that failed for good: its cause (it starts with the task's id)."""
    if exception is None and task_id == "approve_correction":
        # Airflow ended the task without it acting on an answer: Airflow 3.3.2 fails a HITL task
        # answered within seconds of parking (the parked process's end reaches the scheduler after
        # the answer queued the task again; or the resumed process is refused as running
        # elsewhere). The batch still waits.
        return (
            "approve_correction: Airflow ended the approval before it could act on an answer (see the task's "
            f"log); nothing was committed. If the change is intended, approve it (`python -m reconcile approve {sink} "
            f"BATCH`, BATCH in `python -m reconcile status {sink}`) and clear approve_correction; else fix the "
            "source: the next run recomputes the batch."
        )
    cause = str(exception or "no cause recorded")
    return cause if cause.startswith(task_id) else f"{task_id} failed: {cause}"


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
        callback=SyncCallback(f"{__name__}.lag_deadline_missed", kwargs=kwargs),
        name=f"reconcile_lag_{cfg.name}",
    )


def lag_deadline_missed(
    context: dict, sink: str, lag_minutes: float, notify: str | None = None, notify_kwargs: dict | None = None
) -> str:
    """A run of ``sink`` missed its deadline: log one line saying which run and where the shard
    stands, then hand it to the sink's ``alert.callback``: a notifier class is built with
    ``notify_kwargs`` and called with the context (``{{ message }}`` in its templates is the
    line); a function is called with ``message=``, ``context=`` and ``notify_kwargs``."""
    import inspect

    from airflow.sdk._shared.module_loading import import_string

    from reconcile.airflow.tasks import lag_alert_line

    line = lag_alert_line(sink, lag_minutes, context)
    logging.getLogger("reconcile.alert").warning("deadline missed: %s", line)
    if notify:
        target: Any = import_string(notify)
        if inspect.isclass(target):  # a notifier: built, then called with the context
            notifier: Any = target(**(notify_kwargs or {}))
            notifier({**context, "message": line})
        else:
            target(message=line, context=context, **(notify_kwargs or {}))
    return line


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


class CorrectionApproval(ApprovalOperator):
    """The run's batch waits for an operator's answer in Airflow's UI (Required actions), showing
    what it changes. Approve: the approval is recorded in the ledger under the responding
    user's name, and ``append`` commits. Reject, or no answer within the timeout (its default
    answer is Reject): the run fails, nothing committed, saying how to approve it later. A batch
    approved meanwhile (``python -m reconcile approve``) passes without asking."""

    def __init__(self, *, sink: str, timeout: timedelta, **kwargs):
        # An answer is final: a retry would ask again (a new request in Required actions) after
        # the operator already answered, and a rejected run would wait for another answer instead
        # of failing. So the approval never retries; what fails after an answer ends the task.
        kwargs["retries"] = 0
        super().__init__(
            subject=f"Sink {sink}: commit a correction the guard stopped?",
            defaults=ApprovalOperator.REJECT,
            response_timeout=timeout,
            **kwargs,
        )
        self.sink = sink
        self.timeout_minutes = timeout.total_seconds() / 60

    def _stop(self, context):
        from reconcile.airflow.tasks import guard_stop

        batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
        return guard_stop(self.sink, context["run_id"], batch_id)

    def execute(self, context):
        from reconcile.airflow.tasks import approval_request

        stop = self._stop(context)
        if stop is None:  # approved meanwhile (CLI), or no longer staged: append decides
            self.log.info("approve_correction: nothing to approve for run %s: the append decides", context["run_id"])
            return None
        self.subject, self.body = approval_request(stop, self.timeout_minutes)
        self.log.warning("%s; waiting for an answer in Airflow (Required actions)", stop.line)
        _note(context, f"waiting for an approval in Airflow (Required actions): {stop.line}")
        return super().execute(context)

    def execute_complete(self, context, event):
        answer = HITLOperator.execute_complete(self, context, event)  # validated; Reject is ours to handle
        user = answer.get("responded_by_user") or {}
        who = user.get("name") or user.get("id")
        try:
            return self._answered(context, event, answer, who)
        except AirflowFailException:
            raise
        except Exception as exc:  # noqa: BLE001 - the answer stands: end the task, never ask again
            chose = "approved" if answer["chosen_options"] == [ApprovalOperator.APPROVE] else "rejected"
            message = (
                f"approve_correction: {chose} by {who or 'the timeout'}, but the sink could not record it "
                f"({type(exc).__name__}: {str(exc)[:300]}); nothing was committed. If the change is intended, "
                f"`python -m reconcile approve {self.sink} BATCH` and clear approve_correction; else fix the source."
            )
            self.log.error("%s", message)
            raise AirflowFailException(message) from None

    def _answered(self, context, event, answer: dict, who: str | None):
        """Act on an answer: record an approval in the ledger (append commits), or a rejection
        (the run fails with what to do)."""
        from reconcile.airflow.tasks import approve_batch, refusal, reject_batch
        from reconcile.errors import SinkError

        stop = self._stop(context)
        if answer["chosen_options"] == [ApprovalOperator.APPROVE]:
            if stop is None:
                self.log.info("approve_correction: approved by %s; nothing left to approve: the append decides", who)
                return answer
            try:
                line = approve_batch(self.sink, stop.batch_id, f"{who} in Airflow (run {context['run_id']})")
            except SinkError as exc:  # superseded meanwhile: the append says so
                self.log.warning("approve_correction: approved by %s, not recorded: %s", who, exc)
                return answer
            self.log.info("approve_correction: %s", line)
            return answer
        if stop is None:
            message = f"approve_correction: rejected by {who or 'the timeout'}; run {context['run_id']}'s batch is no longer waiting"
            self.log.warning("%s", message)
            raise AirflowFailException(message)
        message = refusal(stop, None if event.get("timedout") else who, self.timeout_minutes, _day(context))
        reject_batch(stop, message)
        self.log.error("%s", message)
        raise AirflowFailException(message)


def _append(shard: Asset, sink: str, scheduled: bool, context) -> str:
    """The append task: commit the run's staged batch (see :func:`build_dag`)."""
    from reconcile.airflow.tasks import (
        batch_line,
        commit_for_run,
        committed_extra,
        nothing_left,
        out_of_retries,
        outcome_note,
    )
    from reconcile.errors import DescriptionOutdated, Retryable, SinkError

    log = logging.getLogger("reconcile.tasks")
    run_id = context["run_id"]
    batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
    approve = f"run {run_id} (param approve_correction)" if context["params"].get("approve_correction") else None
    why = nothing_left(sink, run_id, batch_id, unminted_only=True)
    if why is not None:  # cleared after a mint that minted nothing
        log.warning("append: nothing to do: %s", why)
        _note(context, f"nothing to do: {why}")
        raise AirflowSkipException(f"append: nothing to do: {why}")
    log.info("append: %s", batch_line(sink, run_id, batch_id)[1])
    try:
        message = commit_for_run(sink, run_id, batch_id, approve, _day(context))
    except DescriptionOutdated as exc:  # another batch won; the remedy says who appends the rest
        if scheduled:
            log.warning("append: nothing left for this run: %s", exc)
            _note(context, f"nothing left for this run: {exc}")
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
        _note(context, f"nothing to do: {why}")
        raise AirflowSkipException(f"append: nothing to do: {why}")
    level, line = batch_line(sink, run_id, batch_id)
    log.log(level, "append: %s", line)
    context["outlet_events"][shard].extra = committed_extra(sink, run_id, batch_id)
    _note(context, outcome_note(sink, run_id, batch_id))
    return message


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
                _note(context, f"nothing to do: {result.message}")
                return False
            d = result.description
            return {"batch_id": d.batch_id, "lower": d.lower, "upper": d.upper}

        write = ReconcileSparkSubmitOperator(task_id="write", sink=cfg.name, stage="write")

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
                return _append(shard, sink, scheduled, context)

        @task.short_circuit(task_id="compaction_due")
        def compaction_due(sink: str = cfg.name) -> str | bool:
            from reconcile.airflow.tasks import compaction_check

            due, why = compaction_check(sink)
            logging.getLogger("reconcile.tasks").info("compaction %s: %s", "due" if due else "not due", why)
            return why if due else False

        compact = ReconcileSparkSubmitOperator(task_id="compact", sink=cfg.name, stage="compact")
        committed = append()
        if asks:

            @task.branch(task_id="correction_guard")
            def correction_guard(sink: str = cfg.name, **context) -> list[str]:
                from reconcile.airflow.tasks import guard_stop

                log = logging.getLogger("reconcile.tasks")
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
    file to run it, and the Spark jobs it starts inherit the variable."""
    if directory is not None:
        os.environ["RECONCILE_SINKS_DIR"] = str(Path(directory).expanduser().resolve())
    configs, errors = load_dir(directory)
    dags = {}
    for cfg in configs:
        problem = callback_problem(cfg)
        if problem is not None:
            errors.append(problem)
        else:
            dags[cfg.name] = build_dag(cfg)
    for err in errors:
        d = build_invalid_dag(err)
        dags[d.dag_id] = d
    return dags

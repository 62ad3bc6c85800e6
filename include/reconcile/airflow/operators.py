"""The DAGs' operators and task bodies: a stage's Spark job (spark-submit, or a Spark Connect
client), the correction guard's approval in Airflow, and the append task."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from reconcile import settings
from reconcile.airflow.callbacks import run_note
from reconcile.spark import submit_conf

log = logging.getLogger(__name__)

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


def spark_conn_id(cfg) -> str:
    """The Airflow connection the sink's ``write`` and ``compact`` run on: its ``spark_conn_id``,
    else ``RECONCILE_SPARK_CONN_ID``, else ``spark_default``."""
    return cfg.spark_conn_id or os.environ.get("RECONCILE_SPARK_CONN_ID", "spark_default")


class ReconcileSparkSubmitOperator(SparkSubmitOperator):
    """One stage job on the sink's Spark connection (``conn_id``, default
    ``RECONCILE_SPARK_CONN_ID`` else ``spark_default``): spark-submit of jobs/<stage>.py, or, on
    a ``spark_connect`` connection, the stage run here as a Connect client. A failure no retry
    fixes (one the job recorded as final, a connection that is not defined:
    :func:`reconcile.airflow.tasks.final_failure`) fails the task at once with its one-line
    cause and remedy, recorded on the run's batch."""

    def __init__(self, *, sink: str, stage: str, conn_id: str | None = None, **kwargs):
        script = {"write": "write_correction.py", "compact": "compact_shard.py"}[stage]
        super().__init__(
            application=str(JOBS / script),
            application_args=["--sink", sink, "--run-id", "{{ run_id }}", "--batch-id", BATCH_ID],
            conf=submit_conf(),
            name=f"reconcile-{sink}-{stage}",
            conn_id=conn_id or os.environ.get("RECONCILE_SPARK_CONN_ID", "spark_default"),
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
        from reconcile.airflow.tasks import (
            batch_line,
            failure_verdict,
            final_failure,
            nothing_left,
            out_of_retries,
            record_final,
        )

        run_id = context["run_id"]
        batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
        since = datetime.now(UTC)  # a failure recorded before this attempt is not its verdict
        result: str | None
        try:
            export_connection()  # the job (spark-submit's child, or this process) reads the environment
            if self.stage == "write":
                why = nothing_left(self.sink, run_id, batch_id)
                if why is not None:  # superseded before it was written: no Spark job at all
                    self.log.warning("write: nothing to do: %s", why)
                    run_note(context, f"nothing to do: {why}")
                    raise AirflowSkipException(f"write: nothing to do: {why}")
                self.log.info("write: %s", batch_line(self.sink, run_id, batch_id)[1])
            remote = spark_connect_url(self._conn_id)
            if remote:
                result = run_on_connect(self.stage, self.sink, run_id, batch_id, remote)
                self.log.info("%s on Spark Connect %s: %s", self.stage, remote, result)
            else:
                result = super().execute(context)
        except (AirflowFailException, AirflowSkipException) as exc:
            if isinstance(exc, AirflowFailException):
                self.log.error("%s", exc)
            raise
        except AirflowException as exc:
            message: str | None
            unfixable = final_failure(exc, self.sink, self.stage, self._conn_id)
            if unfixable is not None:  # e.g. the connection is not defined: nothing ran
                final, message = True, record_final(self.sink, run_id, batch_id, self.stage, unfixable, _day(context))
            else:
                final, message = failure_verdict(self.sink, run_id, batch_id, since)
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
            run_note(context, f"nothing to do: {why}")
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
        run_note(context, f"waiting for an approval in Airflow (Required actions): {stop.line}")
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


def mint_task(sink: str, context) -> dict | bool:
    """The mint task: describe the run's batch (see :func:`build_dag`); False when there is
    nothing to do (the rest of the run is skipped). A failure no retry fixes
    (:func:`reconcile.airflow.tasks.final_failure`: the sink's own non-retryable failures, the
    warehouse refusing access, a connection that is not defined) fails the task at once, its
    cause and remedy ending with the command that reruns the run's mint; there is no batch yet
    to record it on, so the task's log and the run's note say it."""
    from reconcile.airflow.tasks import final_failure, mint_for_run, once_fixed

    dag_run = context["dag_run"]
    try:
        result = mint_for_run(
            sink,
            context["run_id"],
            context["ti"].try_number,
            dag_run.data_interval_end,
            dag_run.start_date,
            read_only=bool(context["params"].get("read_only")),
        )
    except (AirflowFailException, AirflowSkipException):
        raise
    except Exception as exc:
        unfixable = final_failure(exc, sink, "mint")
        if unfixable is None:  # a retry may fix it
            raise
        then = once_fixed(sink, context["run_id"], "mint", unfixable, _day(context))
        if then and then not in unfixable.remedy:
            unfixable.add_remedy(then)
        log.error("mint failed (not retried): %s", unfixable)
        raise AirflowFailException(f"mint failed (not retried): {unfixable}") from None
    if result.description is None:  # the rest of the run is skipped at once
        log.warning("mint: %s", result.message)
        run_note(context, f"nothing to do: {result.message}")
        return False
    d = result.description
    return {"batch_id": d.batch_id, "lower": d.lower, "upper": d.upper}


def append_task(shard: Asset, sink: str, scheduled: bool, context) -> str:
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

    run_id = context["run_id"]
    batch_id = (context["ti"].xcom_pull(task_ids="mint") or {}).get("batch_id")
    approve = f"run {run_id} (param approve_correction)" if context["params"].get("approve_correction") else None
    why = nothing_left(sink, run_id, batch_id, unminted_only=True)
    if why is not None:  # cleared after a mint that minted nothing
        log.warning("append: nothing to do: %s", why)
        run_note(context, f"nothing to do: {why}")
        raise AirflowSkipException(f"append: nothing to do: {why}")
    log.info("append: %s", batch_line(sink, run_id, batch_id)[1])
    try:
        message = commit_for_run(sink, run_id, batch_id, approve, _day(context))
    except DescriptionOutdated as exc:  # another batch won; the remedy says who appends the rest
        if scheduled:
            log.warning("append: nothing left for this run: %s", exc)
            run_note(context, f"nothing left for this run: {exc}")
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
        run_note(context, f"nothing to do: {why}")
        raise AirflowSkipException(f"append: nothing to do: {why}")
    level, line = batch_line(sink, run_id, batch_id)
    log.log(level, "append: %s", line)
    context["outlet_events"][shard].extra = committed_extra(sink, run_id, batch_id)
    run_note(context, outcome_note(sink, run_id, batch_id))
    return message

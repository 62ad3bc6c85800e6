"""What each Airflow task does, as plain functions of (sink, run): testable without Airflow.

The DAG's ``mint``, ``append`` and ``compaction_due`` tasks run in the Airflow worker without a
JVM (:func:`mint_for_run`, :func:`commit_for_run`, :func:`compaction_check`); ``write`` and
``compact`` are Spark jobs (jobs/*.py, submitted with spark-submit) that call
:func:`stage_for_run` and :func:`compact_for_run`. A failure is recorded on the run's batch in
the ledger (``message``, and ``failure_kind``: ``final`` when retrying cannot help), so the operator can tell
Airflow whether to retry; :func:`final_failure` is the one place that says which failures no retry
fixes (also those around the job: a connection that is not defined).

With ``correction_guard.approve_in_airflow``, :func:`guard_stop` decides before the append
(committing nothing) whether the run's batch must wait for an approval in Airflow, and
:func:`approve_batch` / :func:`reject_batch` record the operator's answer in the ledger. Each
run's outcome is one line, :func:`set_run_note`, set as the DAG run's note through Airflow's
REST API.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from reconcile import remedy, settings
from reconcile.config import SinkConfig
from reconcile.config_loading import load_sink
from reconcile.errors import Retryable, SinkError, storage_failure
from reconcile.log import iso
from reconcile.model import COMMITTED, FINAL, OPEN_STATES, RETRYABLE, STAGED, SUPERSEDED, Outcome
from reconcile.report import iso_text, refresh_of
from reconcile.schedule import desired_frontier
from reconcile.sink.mint import MintResult, run_mint
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch

log = logging.getLogger(__name__)


def open_ledger() -> Ledger:
    return Ledger(settings.metadata_url())


@contextmanager
def sink_and_ledger(sink: str) -> Iterator[tuple[SinkConfig, Ledger]]:
    """The sink's config and a ledger, disposed of when the task is done; the warehouse's
    credentials from the Airflow connection, if one is configured."""
    from reconcile.airflow.aws import export_connection

    export_connection()
    cfg = load_sink(sink)
    ledger = open_ledger()
    try:
        yield cfg, ledger
    finally:
        ledger.dispose()


def mint_for_run(
    sink: str,
    run_id: str,
    attempt: int,
    data_interval_end: datetime | None,
    start: datetime | None,
    *,
    read_only: bool = False,
) -> MintResult:
    with sink_and_ledger(sink) as (cfg, ledger):
        return run_mint(ledger, cfg, run_id, attempt, desired_frontier(data_interval_end, start), read_only=read_only)


def run_batch_of(ledger: Ledger, sink: str, run_id: str, batch_id: str | None) -> Batch | None:
    """The batch the run's mint minted (``batch_id``, handed forward by the DAG; without it, the
    run's newest batch)."""
    return ledger.get_batch(batch_id, sink) if batch_id else ledger.batch_of_run(sink, run_id)


def _run_stage(
    stage: str,
    sink: str,
    run_id: str,
    batch_id: str | None = None,
    spark=None,
    approve: str | None = None,
    logical_date: datetime | None = None,
) -> str:
    """Run ``stage`` on the batch the run's mint minted (``batch_id``, handed forward by the DAG;
    without it, the run's newest batch). Only ``write`` starts Spark. A final failure's remedy
    ends with the commands that rerun this run (``logical_date``: the run's, if known)."""
    from reconcile.sink import append

    with sink_and_ledger(sink) as (cfg, ledger):
        batch: Batch | None = None
        try:
            batch = run_batch_of(ledger, cfg.name, run_id, batch_id)
            if batch is None:
                return f"run {run_id} minted no batch for sink {sink!r}: nothing to {stage}"
            if stage == "write":
                from reconcile.sink import write
                from reconcile.spark import get_session

                spark = spark or get_session(f"reconcile-{sink}-{stage}")
                return write.run_write(spark, ledger, cfg, batch.batch_id).message
            return append.run_append(ledger, cfg, batch.batch_id, approve=approve).message
        except SinkError as exc:
            if not isinstance(exc, Retryable):  # final: the remedy ends with the commands for this run
                then = once_fixed(cfg.name, run_id, stage, exc, logical_date)
                if then:
                    exc.add_remedy(then)
            if batch is not None:
                note_failure(ledger, batch.batch_id, exc)
            raise
        except Exception as exc:
            refused = storage_failure(exc, cfg.name)  # the warehouse refused: final, in one line
            if refused is None:
                raise
            if batch is not None:
                note_failure(ledger, batch.batch_id, refused)
            raise refused from None


def once_fixed(sink: str, run_id: str, stage: str, exc: SinkError, logical_date: datetime | None = None) -> str:
    """What reruns the run once the cause of ``exc`` is fixed (its ``rerun``), as a sentence."""
    if exc.rerun == "":
        return ""
    if exc.rerun == "write" and stage == "append":
        return f"To stage it anew: {remedy.restage(sink, run_id, logical_date)}."
    return f"Once the cause is fixed, rerun the run's {stage}: {remedy.rerun(sink, run_id, stage, logical_date)}."


def stage_for_run(sink: str, run_id: str, batch_id: str | None = None, spark=None) -> str:
    return _run_stage("write", sink, run_id, batch_id, spark)


def commit_for_run(
    sink: str,
    run_id: str,
    batch_id: str | None = None,
    approve: str | None = None,
    logical_date: datetime | None = None,
) -> str:
    return _run_stage("append", sink, run_id, batch_id, approve=approve, logical_date=logical_date)


def nothing_left(sink: str, run_id: str, batch_id: str | None, *, unminted_only: bool = False) -> str | None:
    """Why the run's remaining tasks have nothing to do (it minted no batch, or its batch was
    superseded: outdated by another writer, or covered by a newer description), or None."""
    with sink_and_ledger(sink) as (cfg, ledger):
        batch = run_batch_of(ledger, cfg.name, run_id, batch_id)
        if batch is None:
            return f"run {run_id} minted no batch"
        if unminted_only or batch.state != SUPERSEDED:
            return None
        return f"batch {batch.batch_id} [{iso(batch.lower)}, {iso(batch.upper)}) is {batch.state}: {batch.message}"


def batch_line(sink: str, run_id: str, batch_id: str | None) -> tuple[int, str]:
    """(log level, one line): where the run's batch stands, for a task's first and last line.
    WARNING when someone may want to look (drift repaired, error rows, a failure not yet
    resolved); a failure a later attempt resolved is said as such, at INFO
    (:func:`reconcile.standing.standing`)."""
    from reconcile.standing import DONE, OK, standing

    with sink_and_ledger(sink) as (cfg, ledger):
        b = run_batch_of(ledger, cfg.name, run_id, batch_id)
        if b is None:
            return logging.INFO, f"sink {sink}: run {run_id} minted no batch"
        how = standing(b, ledger.get_shard(cfg.name).upper)
        counts = "".join(
            f" {name}={value}"
            for name, value in (("rows_ok", b.rows_ok), ("rows_err", b.rows_err), ("drift_rows", b.drift_rows))
            if value is not None
        )
        counts += drift_word(cfg, b)
        way = refresh_of(b.manifest) if b.state in (COMMITTED, STAGED) else None
        version = f" delta_version={b.delta_version}" if b.delta_version is not None else ""
        settled = how.note_tone in (DONE, OK)
        cause = f" ({how.note})" if how.note and settled else f" cause: {how.note}" if how.note else ""
        level = logging.WARNING if ((how.note and not settled) or b.rows_err or b.drift_rows) else logging.INFO
        return level, (
            f"sink {sink}: batch {b.batch_id} [{iso(b.lower)}, {iso(b.upper)}) is {b.state}{version}{counts}{cause}"
            + (f"; {way['text']}" if way else "")
        )


def drift_word(cfg, b) -> str:
    """`` (repaired)`` after a batch's drift when the batch repaired every foreign change it read,
    else why not (an upsert feed that holds no command for keys a foreign writer touched)."""
    from reconcile import kinds
    from reconcile.standing import record_of

    if not b.drift_rows:
        return ""
    rec = record_of(b)
    if not kinds.repairs_by_key(cfg) or (rec is not None and not rec.get("unrepairable_count")):
        return " (repaired)"
    if rec is None:
        return " (not repaired by this batch: written before upsert batches repaired foreign writes)"
    return (
        f" (not yet repaired: {rec['unrepairable_count']} key(s) foreign writes touched have no command in the "
        "feed; `python -m reconcile check SINK` says what to do)".replace("SINK", cfg.name)
    )


def committed_extra(sink: str, run_id: str, batch_id: str | None) -> dict:
    """The asset event's ``extra`` for the run's committed batch: how far the shard is."""
    with sink_and_ledger(sink) as (cfg, ledger):
        b = run_batch_of(ledger, cfg.name, run_id, batch_id)
        if b is None:
            return {"sink": sink}
        return {
            "sink": sink,
            "batch_id": b.batch_id,
            "lower": b.lower,
            "upper": b.upper,
            "lower_iso": iso_text(b.lower),
            "upper_iso": iso_text(b.upper),
            "delta_version": b.delta_version,
            "rows_ok": b.rows_ok,
            "rows_err": b.rows_err,
            "rows_net": b.rows_net,
            "drift_rows": b.drift_rows,
        }


def out_of_retries(sink: str, run_id: str, task: str, cause: str, logical_date: datetime | None) -> str:
    """What to do once Airflow will not retry a retryable failure any more: the cause and the
    commands that rerun the run's task (``logical_date``: the run's, None for a manual run
    without one; see :mod:`reconcile.remedy`), also recorded on the run's batch for ``status``."""
    text = (
        f"{cause} -- retries are used up: once the cause is fixed, clear the task "
        f"({remedy.rerun(sink, run_id, task, logical_date)}); a later run also repairs the shard "
        "(its batch starts at the shard's upper)."
    )
    try:
        with sink_and_ledger(sink) as (cfg, ledger):
            batch = ledger.batch_of_run(cfg.name, run_id)
            if batch is not None and batch.state != COMMITTED:
                ledger.note_failure(batch.batch_id, text, RETRYABLE)
    except SinkError as exc:
        log.warning("could not record the remedy on run %s's batch: %s", run_id, exc)
    return text


def compaction_check(sink: str) -> tuple[bool, str]:
    """(due?, why): the DAG's ``compaction_due`` task (metadata only, no Spark)."""
    from reconcile.sink.compact import due

    with sink_and_ledger(sink) as (cfg, ledger):
        return due(ledger, cfg)


def compact_for_run(sink: str, run_id: str, batch_id: str | None = None, spark=None) -> str:
    """The DAG's ``compact`` job: advance since and consolidate the history before it."""
    from reconcile.sink.compact import run_compact
    from reconcile.spark import get_session

    with sink_and_ledger(sink) as (cfg, ledger):
        spark = spark or get_session(f"reconcile-{sink}-compact")
        result = run_compact(spark, ledger, cfg)
        if result.outcome == Outcome.RACED:
            raise Retryable(result.message, sink=sink, remedy="the task retries by itself.")
        return f"run {run_id}: {result.message}"


def note_failure(ledger: Ledger, batch_id: str, exc: SinkError) -> None:
    kind = RETRYABLE if isinstance(exc, Retryable) else FINAL
    try:
        ledger.note_failure(batch_id, str(exc), kind)
    except SinkError:
        log.warning("could not record the %s failure in the ledger: %s", kind, exc)


def failure_verdict(
    sink: str, run_id: str, batch_id: str | None = None, since: datetime | None = None
) -> tuple[bool, str | None]:
    """(final?, message) of the run's batch after a failed task: the failure its job recorded
    (at or after ``since``, when given: this attempt's, not an earlier one's, nor the history a
    committed batch keeps)."""
    try:
        ledger = open_ledger()
    except SinkError as exc:
        return False, str(exc)
    try:
        batch = run_batch_of(ledger, sink, run_id, batch_id)
        if batch is None or not batch.message or not batch.failure_kind:
            return False, None
        at = batch.updated_at
        if since is not None and at is not None and (at if at.tzinfo else at.replace(tzinfo=UTC)) < since:
            return False, None
        return batch.failure_kind == FINAL, batch.message
    finally:
        ledger.dispose()


# -- failures no retry fixes ---------------------------------------------------------------------


def missing_connection(exc: BaseException) -> str | None:
    """The id of the Airflow connection ``exc`` says is not defined (Airflow's
    ``AirflowNotFoundException``: "The conn_id `X` isn't defined"), else None."""
    found = re.search(r"conn_id `([^`]+)` isn't defined", str(exc))
    if found is None and type(exc).__name__ == "AirflowNotFoundException":
        found = re.search(r"`([^`]+)`", str(exc))
    return found.group(1) if found else None


def connection_missing(sink: str, stage: str, conn_id: str, spark: bool) -> SinkError:
    """The one-line failure of a stage whose Airflow connection ``conn_id`` (``spark``: the one its
    Spark job runs on) is not defined, and how to define it; a value set in the environment that
    Airflow cannot read (the usual cause) is named."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    unread = (
        f" ({var} is set in the worker's environment, but Airflow cannot read it as a connection: "
        "a JSON object or a URI)"
        if os.environ.get(var)
        else ""
    )
    how = (
        remedy.define_spark_connection(conn_id)
        if spark
        else f"define it (`airflow connections add {conn_id} --conn-type TYPE ...`, or {var} in the environment "
        "of Airflow's scheduler and workers)"
    )
    used = f"the sink's {stage} runs on" if spark else "the task reads"
    return SinkError(
        f"the Airflow connection {conn_id!r} {used} isn't defined{unread}; nothing was written",
        sink=sink,
        remedy=f"{how}.",
    )


def final_failure(exc: BaseException, sink: str, stage: str, spark_conn: str | None = None) -> SinkError | None:
    """The one place that says whether a failure of a task's stage is one no retry fixes: the
    failure as a one-line :class:`SinkError` with its cause and remedy, or None (a retry may fix
    it: Airflow retries). Final: the sink's own failures but :class:`Retryable` ones (bad input,
    an outdated batch, ...: each says so itself), an Airflow connection that is not defined
    (Airflow's ``AirflowNotFoundException``), the warehouse refusing access (permissions, a
    read-only or full file system: :func:`~reconcile.errors.storage_failure`). ``spark_conn``: the
    connection the stage's Spark job runs on, if it has one."""
    if isinstance(exc, Retryable):
        return None
    if isinstance(exc, SinkError):
        return exc
    conn_id = missing_connection(exc)
    if conn_id is not None:
        return connection_missing(sink, stage, conn_id, spark=conn_id == spark_conn)
    return storage_failure(exc, sink)


def record_final(
    sink: str,
    run_id: str,
    batch_id: str | None,
    stage: str,
    exc: SinkError,
    logical_date: datetime | None = None,
) -> str:
    """Record a final failure of the run's ``stage`` on its open batch (``FINAL``, its cause and
    remedy, ending with the commands that rerun the run), for ``status`` and the pages; returns
    the recorded line."""
    then = once_fixed(sink, run_id, stage, exc, logical_date)
    if then and then not in exc.remedy:
        exc.add_remedy(then)
    try:
        with sink_and_ledger(sink) as (cfg, ledger):
            batch = run_batch_of(ledger, cfg.name, run_id, batch_id)
            if batch is not None and batch.state in OPEN_STATES:
                note_failure(ledger, batch.batch_id, exc)
    except Exception as err:  # noqa: BLE001 - the task fails with its cause whether or not it is recorded
        log.warning("could not record run %s's %s failure on its batch: %s", run_id, stage, err)
    return str(exc)


# -- the correction guard's approval in Airflow --------------------------------------------------


@dataclass(frozen=True)
class GuardStop:
    """A staged batch the correction guard stops until someone approves it, with its numbers."""

    sink: str
    run_id: str
    batch_id: str
    lower: int
    upper: int
    inserted: int
    retracted: int
    shard_rows: int
    share: float
    max_share: float
    line: str  # the guard's one line: the batch, its interval and the numbers

    @property
    def interval(self) -> str:
        return f"[{iso(self.lower)}, {iso(self.upper)})"


def guard_stop(sink: str, run_id: str, batch_id: str | None) -> GuardStop | None:
    """The run's staged batch if the correction guard stops it and nobody approved it yet, else
    None (nothing to approve: the append decides). Reads the ledger, the manifest and the
    shard's row count (delta-rs); commits nothing."""
    from reconcile.sink import guard
    from reconcile.sink.verify import parse_manifest
    from reconcile.storage.delta import ShardTable

    with sink_and_ledger(sink) as (cfg, ledger):
        b = run_batch_of(ledger, cfg.name, run_id, batch_id)
        if b is None or b.state != STAGED or b.approved:
            return None
        table = ShardTable(cfg)
        if not table.exists():
            return None
        change = guard.measure(table, parse_manifest(cfg, b.batch_id, b.manifest))
        if change is None or not guard.stops(cfg, change):
            return None
        return GuardStop(
            sink=cfg.name,
            run_id=run_id,
            batch_id=b.batch_id,
            lower=b.lower,
            upper=b.upper,
            inserted=change.inserted,
            retracted=change.retracted,
            shard_rows=change.shard_rows,
            share=change.share,
            max_share=float(cfg.correction_guard.max_share or 0),
            line=guard.describe(cfg, b.batch_id, b.lower, b.upper, change),
        )


def approval_request(stop: GuardStop, timeout_minutes: float) -> tuple[str, str]:
    """(subject, body in Markdown) of the approval Airflow asks for."""
    subject = f"Sink {stop.sink}: commit a correction of {stop.share:.1%} of the shard?"
    body = (
        f"The correction guard stopped batch `{stop.batch_id}` of run `{stop.run_id}`: it would change more "
        f"of the shard than `correction_guard.max_share` ({stop.max_share:.1%}) allows. Nothing is committed "
        "until you answer.\n\n"
        "| | |\n|---|---|\n"
        f"| interval | `{stop.interval}` |\n"
        f"| rows inserted | {stop.inserted:,} |\n"
        f"| rows retracted | {stop.retracted:,} |\n"
        f"| shard rows now | {stop.shard_rows:,} |\n"
        f"| share of the shard that changes | **{stop.share:.1%}** |\n\n"
        "**Approve** if the change is intended: the batch is committed and the approval recorded in the "
        "ledger under your name. **Reject** if the source is wrong: nothing is committed, the run fails, and "
        "once the source is fixed the next run recomputes the batch.\n\n"
        f"Without an answer within {_minutes(timeout_minutes)} the batch counts as rejected. The CLI "
        f"approves it too: `python -m reconcile approve {stop.sink} {stop.batch_id}`."
    )
    return subject, body


def _minutes(value: float) -> str:
    return f"{value:g} minute{'' if value == 1 else 's'}"


def approve_batch(sink: str, batch_id: str, by: str) -> str:
    """Record in the ledger that ``by`` let the batch past the correction guard."""
    with sink_and_ledger(sink) as (cfg, ledger):
        b = ledger.approve(cfg.name, batch_id, by)
        return f"sink {cfg.name}: batch {batch_id} approved by {b.approved}"


def refusal(stop: GuardStop, who: str | None, timeout_minutes: float, logical_date: datetime | None) -> str:
    """One line: the batch was rejected (``who``) or nobody answered (None), and what to do."""
    why = f"rejected by {who} in Airflow" if who else f"nobody answered the approval within {_minutes(timeout_minutes)}"
    return (
        f"approve_correction: {why}: {stop.line}; nothing was committed. If the source is wrong, fix it: the next "
        f"run recomputes the batch. If the change is intended after all, approve it "
        f"(`python -m reconcile approve {stop.sink} {stop.batch_id}`) and rerun the approval, which then "
        f"lets it through: {remedy.rerun(stop.sink, stop.run_id, 'approve_correction', logical_date)}."
    )


def reject_batch(stop: GuardStop, message: str) -> None:
    """Record on the batch that it was refused (final: retrying the same batch cannot help)."""
    with sink_and_ledger(stop.sink) as (_, ledger):
        ledger.note_failure(stop.batch_id, message, FINAL)


# -- the DAG run's note ------------------------------------------------------------------------

NOTE_LIMIT = 1000  # Airflow's DAGRunPatchBody.note


def outcome_note(sink: str, run_id: str, batch_id: str | None) -> str:
    """The run's outcome as its note: where its batch stands (:func:`batch_line`), and who
    approved it past the correction guard, if anyone."""
    _, line = batch_line(sink, run_id, batch_id)
    with sink_and_ledger(sink) as (cfg, ledger):
        b = run_batch_of(ledger, cfg.name, run_id, batch_id)
        if b is not None and b.approved:
            line += f"; approved by {b.approved}"
    return line


def api_connection_id() -> str:
    return os.environ.get("RECONCILE_AIRFLOW_API_CONN_ID", "reconcile_airflow_api")


def set_run_note(dag_id: str, run_id: str, note: str) -> bool:
    """Set the DAG run's note (shown on the run in Airflow's UI) to ``note``: Airflow's REST API
    (``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}``), the supported way for a task, which has
    no database access and whose Task SDK cannot change its run. The API's URL and an Airflow
    user's login come from the connection ``RECONCILE_AIRFLOW_API_CONN_ID`` (default
    ``reconcile_airflow_api``; host: the api-server's URL). Never fails the task: without the
    connection, or if the API refuses, the note is logged as not set, with why. True if set."""
    import httpx
    from airflow.sdk import BaseHook

    note = note if len(note) <= NOTE_LIMIT else note[: NOTE_LIMIT - 1] + "\u2026"
    conn_id = api_connection_id()
    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception:  # noqa: BLE001 - no such connection: the deployment does not ask for notes
        log.info("run %s's note (not set: no Airflow connection %r to Airflow's REST API): %s", run_id, conn_id, note)
        return False
    host = conn.host or ""
    base = host if "://" in host else f"{conn.schema or 'http'}://{host}{f':{conn.port}' if conn.port else ''}"
    try:
        with httpx.Client(base_url=base.rstrip("/"), timeout=30) as client:
            token = client.post("/auth/token", json={"username": conn.login, "password": conn.password})
            token.raise_for_status()
            answer = client.patch(
                f"/api/v2/dags/{dag_id}/dagRuns/{run_id}",
                params={"update_mask": "note"},
                json={"note": note},
                headers={"Authorization": f"Bearer {token.json()['access_token']}"},
            )
            answer.raise_for_status()
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        log.warning("run %s's note not set (Airflow's REST API at %s: %s): %s", run_id, base, exc, note)
        return False
    log.info("run %s's note: %s", run_id, note)
    return True


# -- the lag alert (an Airflow deadline) ---------------------------------------------------------


def lag_alert_line(sink: str, lag_minutes: float, context: dict) -> str:
    """One line for a run that missed its deadline: which run, since when, and where the shard
    stands (its upper and lag, if the ledger answers)."""
    from reconcile.errors import ShardNotFound
    from reconcile.schedule import now_ms

    run = context.get("dag_run") or {}  # Airflow's DAGRunResponse as JSON
    deadline = (context.get("deadline") or {}).get("deadline_time")
    line = (
        f"sink {sink}: run {run.get('dag_run_id') or run.get('run_id')} ({run.get('state')}) has not finished "
        f"{lag_minutes:g} min after it was queued (alert.lag_minutes; deadline {deadline})"
    )
    try:
        with sink_and_ledger(sink) as (cfg, ledger):
            upper = ledger.get_shard(cfg.name).upper
        line += f"; the shard's upper is {iso(upper)}, {(now_ms() - upper) / 60_000:,.0f} min behind now"
    except ShardNotFound:
        line += "; the shard has no batch yet (its first run creates it)"
    except Exception as exc:  # noqa: BLE001 - the alert goes out even when the ledger cannot answer
        line += f"; the shard's upper is unknown ({type(exc).__name__}: {exc})"
    return line + f". Look at the run in Airflow and at `python -m reconcile status {sink}`."

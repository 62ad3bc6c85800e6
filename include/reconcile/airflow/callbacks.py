"""The DAGs' callbacks: the run's note (set by every task, and by ``on_failure_callback`` for a
task that failed for good), and the lag deadline's alert (:func:`lag_deadline_missed`)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def run_note(context, text: str) -> None:
    """Set the run's note to ``text`` (best effort: see :func:`reconcile.airflow.tasks.set_run_note`)."""
    from reconcile.airflow.tasks import set_run_note

    set_run_note(context["dag"].dag_id, context["run_id"], text)


def note_run_failure(context) -> None:
    """``on_failure_callback`` of every task: a task that failed for good (no retry left, or a
    final failure) says so in the run's note, with the cause and remedy it raised."""
    run_note(context, failure_note(context["ti"].task_id, context.get("exception"), context["dag"].dag_id))


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
    log.warning("deadline missed: %s", line)
    if notify:
        target: Any = import_string(notify)
        if inspect.isclass(target):  # a notifier: built, then called with the context
            notifier: Any = target(**(notify_kwargs or {}))
            notifier({**context, "message": line})
        else:
            target(message=line, context=context, **(notify_kwargs or {}))
    return line

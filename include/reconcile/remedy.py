"""The commands a remedy prints: complete, as they work on the supported Airflow (3.3), naming the run.

Airflow's ``airflow tasks clear`` selects runs only by logical date (``-s``/``-e``, inclusive)
and by task state (``-f``: failed or upstream-failed), never by run id; its ``-t`` is matched as
a substring of the task ids (the serialized DAG's subset), so ``-t append`` is exactly the
``append`` task and ``-t '^append$'`` matches none. Hence:

- a run with a logical date (scheduled, backfill, a manual run triggered with one):
  ``airflow tasks clear SINK -t TASK -d -y -s L -e L`` clears that run's task and what follows
  it, and only that run (a DAG's logical dates are unique);
- a run without one (a manual run: its logical date is None, which ``-s``/``-e`` never select):
  ``airflow tasks clear SINK -t TASK -d -f -y`` clears the failed TASK of every run of the sink
  (clearing is always safe: a rerun commits, finds committed or says why not); or, exactly that
  run, ``python -m reconcile append SINK --run-id RUN`` commits the run's staged batch without
  Airflow (its task stays failed until cleared, and then finds the batch committed).

A paused DAG runs nothing: ``airflow tasks clear``, ``airflow dags clear`` and ``airflow dags
trigger`` exit 0 on it, print nothing about it, and the run sits ``queued`` until the DAG is
unpaused (a new sink's DAG starts paused, as every new DAG). Whoever prints a remedy (``status``
runs without Airflow) cannot know whether the DAG is paused, so every Airflow command printed
that starts a task is preceded by ``airflow dags unpause SINK &&`` (:func:`unpaused`): on a
paused DAG it unpauses it (the run needs that: a paused DAG's cleared task never starts; its
schedule resumes too), on an unpaused one it is a no-op that prints "No paused DAGs were found"
and exits 0. So a command printed works verbatim in either state. The commands without Airflow
(``python -m reconcile ...``) work on a paused DAG as on any.
"""

from __future__ import annotations

import shlex
from datetime import datetime


def _q(word: str) -> str:
    return shlex.quote(word)


def logical_date_text(logical_date: datetime | str | None) -> str | None:
    """A run's logical date as ``tasks clear -s/-e`` take it (ISO 8601 with its offset)."""
    if logical_date is None:
        return None
    return logical_date if isinstance(logical_date, str) else logical_date.isoformat()


def unpaused(sink: str, command: str) -> str:
    """``command`` (an Airflow command that starts a task of ``sink``) as it works whether the
    DAG is paused or not: ``airflow dags unpause SINK && command``."""
    return f"airflow dags unpause {_q(sink)} && {command}"


def clear_task(sink: str, task: str, logical_date: datetime | str | None = None) -> str:
    """``airflow tasks clear`` of ``task`` and its downstream: in the run of ``logical_date``, or
    without one, wherever ``task`` failed (the DAG unpaused first: :func:`unpaused`)."""
    day = logical_date_text(logical_date)
    if day is None:
        return unpaused(sink, f"airflow tasks clear {_q(sink)} -t {_q(task)} -d -f -y")
    return unpaused(sink, f"airflow tasks clear {_q(sink)} -t {_q(task)} -d -y -s {_q(day)} -e {_q(day)}")


def append_run(sink: str, run_id: str) -> str:
    """Commit the run's staged batch without Airflow (what its ``append`` task does)."""
    return f"python -m reconcile append {_q(sink)} --run-id {_q(run_id)}"


def clear_run(sink: str, run_id: str) -> str:
    """Clear a whole run by its id (scheduled or manual): its mint describes a batch anew."""
    return unpaused(sink, f"airflow dags clear {_q(sink)} --run-id {_q(run_id)} -y")


def catch_up(sink: str, upper: int) -> str:
    """Run the sink up to ``upper`` without Airflow."""
    return f"python -m reconcile run {_q(sink)} --frontier {upper}"


def trigger(sink: str) -> str:
    """A new run: its mint describes a batch from the shard's upper anew."""
    return unpaused(sink, f"airflow dags trigger {_q(sink)}")


def rerun(sink: str, run_id: str, task: str, logical_date: datetime | str | None = None) -> str:
    """How to rerun the run's failed ``task`` (write or append) and what follows it, as a clause."""
    how = f"`{clear_task(sink, task, logical_date)}`"
    if logical_date is None:
        how += f" (the failed {task} of every run of {sink}: Airflow's CLI selects no run id)"
    if task == "append":
        how += f", or commit the run's staged batch without Airflow: `{append_run(sink, run_id)}`"
    return how


def restage(sink: str, run_id: str, logical_date: datetime | str | None = None) -> str:
    """How to stage the run's batch anew (its write, then its append), as a clause."""
    if logical_date is not None:
        return f"`{clear_task(sink, 'write', logical_date)}` (run {run_id}'s write and append)"
    return f"`{trigger(sink)}` (a new run mints and stages the batch anew from the shard's upper)"


def define_spark_connection(conn_id: str) -> str:
    """How to define the Spark connection ``conn_id`` the stage tasks run on, as a clause."""
    var = f"AIRFLOW_CONN_{conn_id.upper()}"
    return (
        f"define it: `airflow connections add {_q(conn_id)} --conn-type spark --conn-host {_q('local[*]')}` "
        "(host: your Spark master; a Spark Connect server: --conn-type spark_connect --conn-host HOST "
        f'--conn-port PORT), or set {var} (JSON: {{"conn_type": "spark", "host": "local[*]"}}) '
        "in the environment of Airflow's scheduler and workers"
    )

"""The commands a remedy prints, checked against the real parsers and the real DAG (no Airflow
services: tests/test_scheduler.py runs them against failed runs of a running scheduler)."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime

import pytest

from helpers import make_sink
from reconcile import remedy

DAY = datetime(2026, 1, 3, tzinfo=UTC)


def _airflow_args(command: str, sink: str = "rem"):
    """The arguments of the command after ``airflow dags unpause SINK &&`` (which every printed
    Airflow command that starts a task begins with: a paused DAG runs nothing)."""
    from airflow.cli import cli_parser

    first, _, rest = command.partition(" && ")
    unpause = cli_parser.get_parser().parse_args(shlex.split(first)[1:])
    assert (unpause.func.__name__, unpause.dag_id, unpause.treat_dag_id_as_regex) == ("dag_unpause", sink, False)
    words = shlex.split(rest)
    assert words[0] == "airflow" and "&&" not in words
    return cli_parser.get_parser().parse_args(words[1:])


def test_a_dated_run_is_selected_by_its_logical_date_and_its_task_by_a_substring(tmp_path, monkeypatch):
    """``-t`` is a substring of the task ids (``^append$`` selects none), ``-s``/``-e`` the
    run's exact logical date: the subset is the task and what follows it in that one run."""
    from reconcile.airflow.dags import build_dag

    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    dag = build_dag(make_sink(tmp_path, "rem", schedule="@daily"))
    args = _airflow_args(remedy.clear_task("rem", "append", DAY))
    assert (args.dag_id, args.downstream, args.yes, args.only_failed) == ("rem", True, True, False)
    assert args.start_date == args.end_date == DAY
    subset = dag.partial_subset(args.task_regex, include_downstream=True, include_upstream=False)
    assert set(subset.task_dict) == {"append", "compaction_due", "compact"}
    assert not dag.partial_subset("^append$", include_downstream=True, include_upstream=False).task_dict
    subset = dag.partial_subset(_airflow_args(remedy.clear_task("rem", "write", DAY)).task_regex, True, False)
    assert set(subset.task_dict) == {"write", "append", "compaction_due", "compact"}


def test_a_run_without_a_logical_date_is_selected_by_its_failed_state():
    args = _airflow_args(remedy.clear_task("rem", "append", None))
    assert (args.only_failed, args.start_date, args.end_date, args.task_regex) == (True, None, None, "append")


def test_the_rerun_without_airflow_names_the_run_and_parses():
    from reconcile.cli import main

    command = remedy.append_run("rem", "manual__2026-01-03T10:00:00.123+00:00")
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "reconcile"] and words[-1] == "manual__2026-01-03T10:00:00.123+00:00"
    with pytest.raises(SystemExit) as done:  # the real parser takes the words (help ends it)
        main([*words[3:], "--help"])
    assert done.value.code == 0
    assert shlex.split(remedy.append_run("rem", "odd id; rm -rf /"))[-1] == "odd id; rm -rf /"


def test_a_final_failure_in_a_run_ends_with_the_commands_for_that_run(tmp_path, sqlite_ledger, monkeypatch):
    """A run's task that fails for good names the complete command (the ledger records it too)."""
    from reconcile.airflow import tasks
    from reconcile.errors import BatchNotFound

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_WAREHOUSE", str(tmp_path / "wh"))
    make_sink(tmp_path, "rem")
    sqlite_ledger.ensure_shard("rem", 100)
    with pytest.raises(BatchNotFound) as info:
        tasks.commit_for_run("rem", "manual__x", "0-gone")
    assert str(info.value).endswith(
        "To stage it anew: `airflow dags unpause rem && airflow dags trigger rem` (a new run mints and stages the "
        "batch anew from the shard's upper)."
    )
    assert "\n" not in str(info.value)


def test_out_of_retries_names_the_exact_run_or_the_failed_state_and_the_rerun_without_airflow(
    tmp_path, sqlite_ledger, monkeypatch
):
    from reconcile.airflow import tasks

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    make_sink(tmp_path, "rem")
    dated = tasks.out_of_retries("rem", "scheduled__x", "append", "append failed: x", DAY)
    assert (
        "`airflow dags unpause rem && airflow tasks clear rem -t append -d -y -s 2026-01-03T00:00:00+00:00 "
        "-e 2026-01-03T00:00:00+00:00`" in dated
    )
    assert "`python -m reconcile append rem --run-id scheduled__x`" in dated
    manual = tasks.out_of_retries("rem", "manual__y", "write", "write failed: x", None)
    assert "`airflow dags unpause rem && airflow tasks clear rem -t write -d -f -y`" in manual
    assert "reconcile append" not in manual


def test_every_airflow_command_that_starts_a_task_unpauses_the_dag_first():
    """A paused DAG runs nothing (a clear or trigger exits 0 and the run sits queued); status,
    which runs without Airflow, cannot know: the printed command unpauses it first."""
    for command, action in (
        (remedy.clear_task("rem", "write", DAY), "task_clear"),
        (remedy.clear_task("rem", "write", None), "task_clear"),
        (remedy.clear_run("rem", "scheduled__x"), "dag_clear"),
        (remedy.trigger("rem"), "dag_trigger"),
    ):
        assert command.startswith("airflow dags unpause rem && airflow "), command
        args = _airflow_args(command)
        assert (args.func.__name__, args.dag_id) == (action, "rem"), command
    for clause in (remedy.rerun("rem", "manual__y", "append"), remedy.restage("rem", "scheduled__x", DAY)):
        assert all(c.startswith("airflow dags unpause rem && ") for c in _commands(clause) if "airflow" in c), clause
    assert "unpause" not in remedy.append_run("rem", "r") + remedy.catch_up("rem", 5)  # no Airflow: works paused


def _commands(text: str) -> list[str]:
    import re

    return re.findall(r"`([^`]+)`", text)


def test_the_missing_spark_connection_remedy_defines_it_with_a_command_that_parses(tmp_path, monkeypatch):
    """A write whose connection is not defined is final (no retry defines it), and says how to
    define it: the `airflow connections add` command parses; an unreadable environment value is named."""
    from airflow.cli import cli_parser
    from airflow.sdk.exceptions import AirflowNotFoundException

    from reconcile.airflow import tasks

    err = tasks.final_failure(
        AirflowNotFoundException("The conn_id `spark_x` isn't defined"), "rem", "write", "spark_x"
    )
    assert err is not None and not isinstance(err, tasks.Retryable)
    text = str(err)
    assert text.startswith("sink 'rem': the Airflow connection 'spark_x' the sink's write runs on isn't defined;"), text
    add = _commands(text)[0]
    args = cli_parser.get_parser().parse_args(shlex.split(add)[1:])
    assert (args.func.__name__, args.conn_id, args.conn_type, args.conn_host) == (
        "connections_add",
        "spark_x",
        "spark",
        "local[*]",
    )
    assert "AIRFLOW_CONN_SPARK_X" in text and "is set" not in text and "\n" not in text
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_X", '{"conn_type": "spark", "host": "local[2]"}}')  # a stray brace
    again = str(
        tasks.final_failure(AirflowNotFoundException("The conn_id `spark_x` isn't defined"), "rem", "write", "spark_x")
    )
    assert "AIRFLOW_CONN_SPARK_X is set in the worker's environment, but Airflow cannot read it" in again
    other = str(tasks.final_failure(AirflowNotFoundException("The conn_id `aws_x` isn't defined"), "rem", "mint"))
    assert "'aws_x' the task reads isn't defined" in other and "airflow connections add aws_x" in other
    from airflow.sdk.exceptions import AirflowException

    assert (
        tasks.final_failure(AirflowException("Cannot execute: spark-submit ... Error code is: 1"), "rem", "write")
        is None
    )

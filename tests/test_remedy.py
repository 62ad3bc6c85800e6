"""The commands a remedy prints, checked against the real parsers and the real DAG (no Airflow
services: tests/test_scheduler.py runs them against failed runs of a running scheduler)."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime

import pytest

from helpers import make_sink
from reconcile import remedy

DAY = datetime(2026, 1, 3, tzinfo=UTC)


def _airflow_args(command: str):
    from airflow.cli import cli_parser

    words = shlex.split(command)
    assert words[0] == "airflow"
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
        "To stage it anew: `airflow dags trigger rem` (a new run mints and stages the batch anew from the shard's upper)."
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
        "`airflow tasks clear rem -t append -d -y -s 2026-01-03T00:00:00+00:00 -e 2026-01-03T00:00:00+00:00`" in dated
    )
    assert "`python -m reconcile append rem --run-id scheduled__x`" in dated
    manual = tasks.out_of_retries("rem", "manual__y", "write", "write failed: x", None)
    assert "`airflow tasks clear rem -t write -d -f -y`" in manual and "reconcile append" not in manual

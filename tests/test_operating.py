"""What an on-call engineer reads: `status` with each batch's cause (and --json), ISO UTC times
with their ms, and a dry run that describes the batch the next scheduled run would mint."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from helpers import make_sink, run_stages, write_json_rows
from reconcile import cli, failpoints
from reconcile.errors import FailPointHit
from reconcile.log import iso
from reconcile.schedule import next_scheduled_frontier


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_iso_shows_utc_and_the_ms_beside_it():
    assert iso(ms("2026-11-24T09:30:00.250")) == f"2026-11-24T09:30:00.250Z ({ms('2026-11-24T09:30:00.250')})"
    assert iso(None) == "-"


@pytest.mark.parametrize(
    "schedule, catchup, lower, now, expected",
    [
        ("@daily", True, "2026-01-01T00:00", "2026-01-05T12:00", "2026-01-02T00:00"),  # catch up one day at a time
        ("@daily", False, "2026-01-01T00:00", "2026-01-05T12:00", "2026-01-05T00:00"),  # the latest interval
        ("@daily", False, "2026-01-05T00:00", "2026-01-05T12:00", "2026-01-06T00:00"),  # up to date: the next tick
        ("0 */6 * * *", False, "2026-01-05T06:00", "2026-01-05T07:00", "2026-01-05T12:00"),
        ("@hourly", True, "2026-01-05T06:30", "2026-01-05T09:00", "2026-01-05T07:00"),
        (None, False, "2026-01-05T06:00", "2026-01-05T07:00", None),
        ("@once", False, "2026-01-05T06:00", "2026-01-05T07:00", None),
    ],
)
def test_next_scheduled_frontier(schedule, catchup, lower, now, expected):
    got = next_scheduled_frontier(schedule, catchup, ms(lower), ms(now))
    assert got == (None if expected is None else ms(expected))


def test_status_shows_causes_iso_times_and_json(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "ops")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    failpoints.arm("append.before_delta_commit", "raise")
    try:
        with pytest.raises(FailPointHit):
            cli_free_append(spark, sqlite_ledger, cfg)
    finally:
        failpoints.disarm_all()

    assert cli.main(["status", cfg.name]) == 0
    out = capsys.readouterr().out
    assert f"upper={iso(200)}" in out
    assert iso(200) in out and iso(300) in out  # the batches' lower and upper, ISO with ms
    assert "retryable: fail point append.before_delta_commit hit" in out  # the cause, shown
    assert "since=never compacted" in out

    assert cli.main(["status", cfg.name, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["upper"] == {"ms": 200, "iso": "1970-01-01T00:00:00.200Z"}
    last = data["batches"][-1]
    assert last["state"] == "staged" and last["failure_kind"] == "retryable"
    assert "fail point append.before_delta_commit hit" in last["message"]
    assert (last["lower"]["ms"], last["upper"]["ms"]) == (200, 300)
    first = data["batches"][0]
    assert first["state"] == "committed" and first["rows_ok"] == 1 and first["rows_net"] == 1


def cli_free_append(spark, ledger, cfg):
    """A run whose append fails retryably, its failure recorded as the DAG's task records it."""
    from reconcile.airflow.tasks import commit_for_run
    from reconcile.sink import mint, write

    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    write.run_write(spark, ledger, cfg, desc.batch_id)
    commit_for_run(cfg.name, "run-2", desc.batch_id)


def test_dry_run_describes_the_next_scheduled_batch(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "ops_dry", schedule="@daily", catchup=True, as_of="2026-01-01T00:00:00Z")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    assert cli.main(["dry-run", cfg.name]) == 0
    out = capsys.readouterr().out
    lower, upper = ms("2026-01-01T00:00"), ms("2026-01-02T00:00")
    assert f"batch [{iso(lower)}, {iso(upper)}) (upper: the next scheduled run's (@daily, catchup))" in out, out
    assert "nothing was written" in out
    assert sqlite_ledger.batches(cfg.name) == []  # a dry run mints nothing

"""What the on-call engineer reads is true and actionable, with the real ledgers (SQLite and
PostgreSQL), real Delta tables and foreign writes by delta-rs:

- a failure shows (red, "FAILED, needs action") only while unresolved; once a later attempt
  committed the batch it is history (grey), and the one-line cause names the OS's error;
- a superseded run that left the shard behind is grey, and status/pages name the run to clear
  with commands that work (the one without Airflow is run here and catches the shard up);
- ``check`` (no JVM) reports foreign commits with their rows and whether a batch repaired them;
  before that batch, ``check``, ``check --verify`` and ``status`` exit 4 (the shard differs, the
  next batch repairs it) and say which versions; after it, ``check --verify`` says the current
  state verifies and that older history was altered and repaired (exit 0; ``--strict-history``
  makes it fail); ``status --json`` carries the foreign versions per batch;
- an upsert shard: ``check --verify`` calls a key a foreign writer added one the feed never had,
  and a key whose commands the feed dropped its retention;
- staged files a later cleanup removes are pending cleanup (with their age), a violation only
  past the cleanup horizon.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pyarrow as pa
import pytest

from helpers import make_sink, run_stages, shard_as_of, write_json_rows
from reconcile import cli
from reconcile.airflow import ui
from reconcile.log import iso
from reconcile.storage.delta import ShardTable


def cli_out(capsys, argv: list[str]) -> str:
    capsys.readouterr()
    cli.main(argv)
    return capsys.readouterr().out


def _immutable(path, on: bool) -> bool:
    """chattr +i/-i (root on a file system with the attribute): a directory nothing may create files in."""
    done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return done.returncode == 0


def test_a_failure_is_red_until_resolved_and_its_cause_names_the_os_error(
    spark, warehouse, tmp_path, ledger, monkeypatch, capsys
):
    from reconcile.airflow.tasks import batch_line, commit_for_run
    from reconcile.errors import SinkError
    from reconcile.sink import mint, write

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"oncall_fail_{ledger.engine.dialect.name}")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    run_stages(spark, ledger, cfg, "run-1", 200)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    log_dir = ShardTable(cfg).log_path
    if not _immutable(log_dir, True):
        pytest.skip("chattr +i is not available here (needs root and a file system with the attribute)")
    try:
        with pytest.raises(SinkError) as info:
            commit_for_run(cfg.name, "run-2", desc.batch_id)
    finally:
        _immutable(log_dir, False)
    assert "Operation not permitted" in str(info.value), str(info.value)  # the OS's error, not only delta-rs's
    assert "\n" not in str(info.value)

    assert cli.main(["status", cfg.name]) == 1  # a batch needs action: status fails, as check does
    out = capsys.readouterr().out
    assert "FAILED, needs action: final:" in out and "Operation not permitted" in out, out
    assert f"NEEDS ACTION: batch {desc.batch_id}" in out, out
    assert cli.main(["status", cfg.name, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["needs_action"][0].startswith(f"batch {desc.batch_id}")
    assert "class=bad" in ui.render_sink(cfg.name)
    assert cli.main(["check", cfg.name]) == 1  # check agrees with status on what needs action
    out = capsys.readouterr().out
    assert f"NEEDS ACTION: batch {desc.batch_id}" in out and out.splitlines()[-1].endswith("; 1 need(s) action"), out

    assert "appended batch" in commit_for_run(cfg.name, "run-2", desc.batch_id)  # fixed, run again
    assert shard_as_of(cfg, 299) == {(1, "a", None): 1, (2, "b", None): 1}
    assert cli.main(["status", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out, out
    assert "resolved (a later attempt committed it at Delta version 2); earlier failure: final:" in out, out
    assert cli.main(["status", cfg.name, "--json"]) == 0
    last = json.loads(capsys.readouterr().out)["batches"][-1]
    assert last["state"] == "committed" and last["standing"]["tone"] == "ok"
    assert json.loads(cli_out(capsys, ["status", cfg.name, "--json"]))["needs_action"] == []
    assert cli.main(["check", cfg.name]) == 0 and "NEEDS ACTION" not in capsys.readouterr().out
    assert last["standing"]["note_tone"] == "done" and "Operation not permitted" in last["standing"]["note"]
    page = ui.render_sink(cfg.name)
    assert "class=bad" not in page and "class=done>resolved" in page, page
    level, line = batch_line(cfg.name, "run-2", desc.batch_id)  # the successful append's last line
    assert level == 20 and "resolved" in line and " cause: " not in line, line


def test_a_superseded_run_that_left_the_shard_behind_names_the_run_to_clear(
    spark, warehouse, tmp_path, ledger, monkeypatch, capsys
):
    """The catch-up race: the scheduled run's wide batch is superseded by a backfill's narrower
    one; the scheduled run ends green (superseded), the shard a day behind it. Status and pages
    show it grey (not "final: ... Remedy: none needed" in red) and name the run to clear now;
    the printed command without Airflow catches the shard up."""
    from reconcile.airflow.tasks import commit_for_run
    from reconcile.errors import DescriptionOutdated
    from reconcile.sink import mint, write

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"oncall_behind_{ledger.engine.dialect.name}", schedule="@daily")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    wide = mint.run_mint(ledger, cfg, "scheduled__catchup", 1, 400).description
    assert write.run_write(spark, ledger, cfg, wide.batch_id).outcome == "staged"
    run_stages(spark, ledger, cfg, "backfill__day1", 200)  # supersedes the wide batch, commits [100, 200)
    with pytest.raises(DescriptionOutdated):  # what the scheduled run's append met (Airflow: skipped, green)
        commit_for_run(cfg.name, "scheduled__catchup", wide.batch_id)

    assert cli.main(["status", cfg.name, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    row = next(b for b in data["batches"] if b["batch_id"] == wide.batch_id)
    assert row["state"] == "superseded" and row["standing"]["tone"] == "done"
    assert "Remedy" not in row["standing"]["note"]
    behind = data["behind"]
    assert behind["run_id"] == "scheduled__catchup" and (behind["from"]["ms"], behind["to"]["ms"]) == (200, 400)
    assert behind["commands"] == [
        f"airflow dags unpause {cfg.name} && airflow dags clear {cfg.name} --run-id scheduled__catchup -y",
        f"python -m reconcile run {cfg.name} --frontier 400",
    ]
    assert cli.main(["status", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and f"BEHIND: the shard is behind: run scheduled__catchup described [{iso(200)}" in out
    page = ui.render_sink(cfg.name)
    assert "class=bad" not in page and f"airflow dags clear {cfg.name} --run-id scheduled__catchup -y" in page

    assert cli.main(behind["commands"][1].split()[3:]) == 0  # `python -m reconcile run ...`, as printed
    assert ledger.get_shard(cfg.name).upper == 400
    capsys.readouterr()
    assert cli.main(["status", cfg.name, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["behind"] is None
    assert "airflow dags clear" not in ui.render_sink(cfg.name)


def _delta_rs_write(cfg, mode: str = "append", predicate: str | None = None, k: int = 7, v: str = "zz") -> None:
    from deltalake import DeltaTable, write_deltalake

    path = ShardTable(cfg).path
    if predicate:
        DeltaTable(path).delete(predicate)
        return
    row = {
        "k": pa.array([k], pa.int64()),
        "v": pa.array([v]),
        "_time": pa.array([150], pa.int64()),
        "_diff": pa.array([1], pa.int64()),
        "_error": pa.array([None], pa.string()),
    }
    for f in DeltaTable(path).schema().to_arrow():  # the shard's other columns (its stored row key): null
        row.setdefault(f.name, pa.nulls(1, pa.field(f).type))
    write_deltalake(path, pa.table(row), mode=mode)


def test_check_reports_foreign_commits_and_verify_tells_current_from_altered_history(
    spark, warehouse, tmp_path, ledger, monkeypatch, capsys
):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"oncall_drift_{ledger.engine.dialect.name}")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, ledger, cfg, "run-1", 200)
    run_stages(spark, ledger, cfg, "run-2", 300)
    _delta_rs_write(cfg)  # a foreign append: version 3
    _delta_rs_write(cfg, predicate="k = 2")  # a foreign delete: version 4 (rewrites a file)

    # the shard is known to differ from what its batches committed, and repairs itself: exit 4,
    # not green (docs/operating.md, "Exit codes"), from check, check --verify and status alike
    assert cli.main(["check", cfg.name]) == 4
    out = capsys.readouterr().out
    assert "FINDING foreign Delta version 3: WRITE by delta-rs" in out and "+1 rows" in out, out
    assert "FINDING foreign Delta version 4: DELETE by delta-rs" in out, out
    assert "not yet repaired: the next batch of the sink repairs it" in out
    assert out.splitlines()[-1] == (
        f"{cfg.name}: 0 invariant violation(s), 2 finding(s); 2 foreign Delta version(s) not yet repaired (3, 4): "
        "the shard differs from what its batches committed until the next batch repairs them"
    ), out
    assert "VIOLATION" not in out and "NEEDS ACTION" not in out
    assert cli.main(["check", cfg.name, "--verify"]) == 4
    out = capsys.readouterr().out
    assert "VIOLATION" not in out and "verify: the current state does NOT verify" in out, out
    assert "NOT YET REPAIRED the current state does not verify: batch " in out, out
    assert "(foreign Delta versions 3, 4, not yet repaired: the next batch repairs them)" in out, out
    assert cli.main(["status", cfg.name]) == 4
    out = capsys.readouterr().out
    assert "foreign Delta version 3: WRITE by delta-rs" in out and "NEEDS ACTION" not in out, out
    assert cli.main(["status", cfg.name, "--json"]) == 4
    data = json.loads(capsys.readouterr().out)
    assert data["needs_action"] == []
    assert [f["version"] for f in data["foreign_unrepaired"]] == [3, 4]
    deleted = data["foreign_unrepaired"][1]
    assert deleted["operation"] == "DELETE" and deleted["rows_added"] is not None
    assert deleted["rows_removed"] - deleted["rows_added"] == 1  # one row deleted (the file rewritten)

    run_stages(spark, ledger, cfg, "run-3", 400)  # repairs the drift
    assert shard_as_of(cfg, 399) == {(r["k"], r["v"], None): 1 for r in rows}
    repair = ledger.batch_of_run(cfg.name, "run-3")
    assert cli.main(["check", cfg.name]) == 0
    out = capsys.readouterr().out
    assert out.count(f"repaired at version {repair.delta_version} (batch {repair.batch_id}") == 2, out
    assert out.splitlines()[-1] == f"{cfg.name}: 0 invariant violation(s), 2 finding(s)", out
    assert cli.main(["status", cfg.name]) == 0
    assert "not yet repaired" not in capsys.readouterr().out
    assert cli.main(["status", cfg.name, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["foreign_unrepaired"] == []
    got = {b["batch_id"]: [f["version"] for f in b["foreign_versions"]] for b in data["batches"]}
    assert got[repair.batch_id] == [3, 4] and sum(len(v) for v in got.values()) == 2

    # --verify: the current state verifies; the older batches' history was altered and repaired
    assert cli.main(["check", cfg.name, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verify: the current state verifies" in out, out
    assert f"FINDING history altered: batch {ledger.batch_of_run(cfg.name, 'run-1').batch_id}" in out, out
    assert f"repaired at version {repair.delta_version}" in out
    assert "VIOLATION" not in out
    assert cli.main(["check", cfg.name, "--verify", "--strict-history"]) == 1
    assert "VIOLATION history altered" in capsys.readouterr().out


def test_an_upsert_shard_tells_a_key_the_feed_never_had_from_one_its_retention_dropped(
    spark, warehouse, tmp_path, ledger, monkeypatch, capsys
):
    """A foreign writer appends key 999, which the feed never had; the feed's retention drops key
    2's commands. Before the next batch: check, status and check --verify exit 4 and --verify
    calls 999 a key the feed never had (the next batch removes it), 2 one its retention dropped;
    the next batch removes 999 and keeps 2 (the plain-Python model), and all exit 0."""
    from upsert_model import UpsertModel, cmd, feed_rows, ok_rows, upsert_sink

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, f"oncall_never_{ledger.engine.dialect.name}")
    model = UpsertModel()
    feed = [cmd(1, "a", 110, 1), cmd(2, "b", 120, 2), cmd(3, "c", 130, 3)]
    feed_rows(tmp_path, feed)
    run_stages(spark, ledger, cfg, "run-1", 200)
    model.batch(feed, 100, 200)
    feed = [c for c in feed if c["k"] != 2]  # retention dropped key 2's commands
    feed_rows(tmp_path, feed)
    _delta_rs_write(cfg, k=999, v="zz_foreign")
    foreign = ShardTable(cfg).latest_version()
    assert ok_rows(shard_as_of(cfg, 199)) == model.as_of(199) + Counter({(999, "zz_foreign", None): 1})

    assert cli.main(["check", cfg.name]) == 4
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        f"{cfg.name}: 0 invariant violation(s), 1 finding(s); 1 foreign Delta version(s) not yet repaired "
        f"({foreign}): the shard differs from what its batches committed until the next batch repairs them"
    ), out
    assert cli.main(["status", cfg.name]) == 4
    assert f"foreign Delta version {foreign}: WRITE by delta-rs" in capsys.readouterr().out
    assert cli.main(["check", cfg.name, "--verify"]) == 4
    out = capsys.readouterr().out
    assert "VIOLATION" not in out and "NEEDS ACTION" not in out, out
    never = [ln for ln in out.splitlines() if '{"k": 999}' in ln]
    assert never == [
        f'NOT YET REPAIRED the shard as of {iso(199)} holds key(s) {{"k": 999}} that the feed never had: foreign '
        f"Delta versions {foreign} added them, not yet repaired (the next batch removes them)"
    ], out
    kept = [ln for ln in out.splitlines() if '{"k": 2}' in ln]
    assert len(kept) == 1 and kept[0].startswith(f'FINDING the shard as of {iso(199)} holds key(s) {{"k": 2}} '), out
    assert "that the feed holds no command for any more (its retention dropped them" in kept[0], out
    assert "verify: against the source: " in out and "does NOT match the feed's latest command per key" in out

    feed.append(cmd(3, "c2", 250, 4))
    feed_rows(tmp_path, feed)
    run_stages(spark, ledger, cfg, "run-2", 300)
    model.batch(feed, 200, 300)
    assert ok_rows(shard_as_of(cfg, 299)) == model.as_of(299)  # 999 removed, 2 kept, 3 changed
    assert (999, "zz_foreign", None) not in shard_as_of(cfg, 299) and (2, "b", None) in model.as_of(299)
    assert cli.main(["check", cfg.name]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"{cfg.name}: 0 invariant violation(s), 1 finding(s)", out
    assert f"foreign Delta version {foreign}: WRITE" in out and "repaired at version" in out, out
    assert cli.main(["status", cfg.name]) == 0
    assert "not yet repaired" not in capsys.readouterr().out


def test_staged_files_a_cleanup_removes_are_pending_until_the_horizon(spark, warehouse, tmp_path, ledger, monkeypatch):
    from reconcile.schedule import now_ms
    from reconcile.sink import check, mint, write

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"oncall_stale_{ledger.engine.dialect.name}", schedule="@hourly")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    loser = mint.run_mint(ledger, cfg, "loser", 1, 300).description
    assert write.run_write(spark, ledger, cfg, loser.batch_id).outcome == "staged"
    winner = mint.run_mint(ledger, cfg, "winner", 1, 200).description  # supersedes the loser's
    assert write.run_write(spark, ledger, cfg, winner.batch_id).outcome == "staged"
    from reconcile.sink.sync import sync
    from reconcile.storage.delta import ShardTable as T

    # the winner commits without its append's cleanup (as when the loser's files land after it)
    table = T(cfg)
    from reconcile.sink import append

    monkeypatch.setattr(append, "gc_staged", lambda *a: [])
    assert append.run_append(ledger, cfg, winner.batch_id).outcome == "committed"
    sync(ledger, table)
    assert check.violations(ledger, cfg)[-1].startswith(check.STALE)  # strictly: left over
    report = check.run_check(ledger, cfg)
    assert report.violations == [], report.violations
    assert len(report.findings) == 1 and report.findings[0].startswith(
        f"pending cleanup: staged files of {loser.batch_id}"
    )
    assert "last written 0s ago" in report.findings[0] or "s ago" in report.findings[0]
    assert "a violation after 2h 0m" in report.findings[0]  # twice the hourly period
    later = check.run_check(ledger, cfg, now=now_ms() + 3 * 3_600_000)
    assert len(later.violations) == 1 and "older than the cleanup horizon (2h 0m)" in later.violations[0]


WATCHED = """
import os, signal, sys
from reconcile.airflow.watchdog import watched
sink, run_id, stage, how = sys.argv[1:5]
with watched(sink, run_id, stage, 2):
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does: no finally, no callback
    print("finished", flush=True)
"""


def test_a_killed_stage_leaves_a_line_of_what_the_sink_knows_and_a_finished_one_none(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch
):
    """A stage process killed outright says nothing itself; its watchdog writes one line into the
    same output (the task's log under Airflow: tests/test_scheduler.py): the run's batch, what is
    staged and committed, what comes next. A stage that ends, even by an exception, leaves none."""
    import os
    import sys
    from pathlib import Path

    from reconcile.sink import mint, write

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "watched")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    desc = mint.run_mint(sqlite_ledger, cfg, "run-1", 1, 200).description
    assert write.run_write(spark, sqlite_ledger, cfg, desc.batch_id).outcome == "staged"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "include")}
    env.pop("PYSPARK_GATEWAY_PORT", None)

    def stage(how: str, stage: str = "append") -> subprocess.CompletedProcess:
        # stderr is a pipe: read to its end, which comes only once the watchdog let go of it too
        args = [sys.executable, "-c", WATCHED, cfg.name, "run-1", stage, how]
        return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)

    killed = stage("kill")
    assert killed.returncode == -9 and killed.stdout == ""
    lines = killed.stderr.strip().splitlines()
    assert len(lines) == 1, killed.stderr
    attempts = ShardTable(cfg).staged_attempts(desc.batch_id)
    assert lines[0].startswith(
        "reconcile: the append task of sink watched (run run-1, try 2) was killed before it finished"
    )
    assert f"batch {desc.batch_id} [{iso(desc.lower)}, {iso(desc.upper)}) is staged" in lines[0]
    assert f"{len(attempts)} write attempt(s) staged under {ShardTable(cfg).staging_path(desc.batch_id)}" in lines[0]
    assert "nothing committed" in lines[0] and "Next: a retry or a clear of append commits" in lines[0]

    finished = stage("finish")
    assert (finished.returncode, finished.stdout, finished.stderr) == (0, "finished\n", "")
    unknown = subprocess.run(
        [sys.executable, "-c", WATCHED, cfg.name, "no-such-run", "write", "kill"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert "the run minted no batch; nothing was staged or committed" in unknown.stderr, unknown.stderr


def test_status_json_into_a_pipe_closed_early_ends_without_a_traceback(spark, warehouse, tmp_path, sqlite_ledger):
    """``status --json | head``: the reader may close the pipe before the command writes (here it
    is closed at once, so every write fails); the command ends quietly (exit 0), as Unix tools do."""
    import os
    import sys

    cfg = make_sink(tmp_path, "oncall_pipe", partitions=1)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    env = {**os.environ, "RECONCILE_SINKS_DIR": str(tmp_path)}
    for reader in ("true", "head -c 1"):
        cmd = f"{sys.executable} -m reconcile status {cfg.name} --json | {reader}"
        done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


@pytest.mark.parametrize("mode", ["spark-submit", "connect"])
@pytest.mark.slow  # a spark-submit JVM, or a Spark Connect server, of its own
def test_a_write_the_warehouse_refuses_fails_final_in_one_line_naming_the_path_and_the_os_error(
    mode, spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, request
):
    """The warehouse cannot be written for an existing shard (here: its staging folder made
    immutable). The job (spark-submit's form: its own JVM; or a client of the Connect server)
    ends with one line naming the path and the OS's error, recorded as final: no retry can help."""
    import sys
    from pathlib import Path

    from reconcile.sink import mint

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"oncall_refused_{mode.replace('-', '_')}")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    desc = mint.run_mint(sqlite_ledger, cfg, "run-2", 1, 300).description
    staging = Path(ShardTable(cfg).path) / "batches"
    staging.mkdir(exist_ok=True)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    if mode == "connect":
        env["RECONCILE_SPARK_REMOTE"] = request.getfixturevalue("connect_url")
    root = Path(__file__).resolve().parents[1]
    job = [sys.executable, str(root / "jobs" / "write_correction.py"), "--sink", cfg.name, "--run-id", "run-2"]
    if not _immutable(staging, True):
        pytest.skip("chattr +i is not available here (needs root and a file system with the attribute)")
    try:
        done = subprocess.run(job, env=env, capture_output=True, text=True, timeout=600)
    finally:
        _immutable(staging, False)
    assert done.returncode == 3, done.stderr[-3000:]  # final (75 would be retried)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RECONCILE write FAILED: "), done.stderr[-3000:]
    assert "the warehouse refused a write" in last and str(staging) in last, last
    assert "Operation not permitted (os error 1)" in last, last
    assert "Traceback" not in last and len(last) < 800, last
    b = sqlite_ledger.get_batch(desc.batch_id, cfg.name)
    assert b.failure_kind == "final" and "the warehouse refused a write" in b.message

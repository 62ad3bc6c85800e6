"""Crash safety: a process killed at each fail point, then the natural recovery.

The crashing stage runs as a real separate process (the job script: one write in its own local
Spark, the others clients of the session's Spark Connect server; the append needs no JVM) with
``RECONCILE_FAILPOINTS=<point>=kill``: it dies with exit 137 in the middle of its work, no
cleanup. Recovery is what Airflow would do: the task's retry, a rerun of the whole run, or the
next run. Afterwards the shard equals the plain-Python model, every lower was committed at most
once, the ledger agrees with the Delta log and no outdated staged files remain.
"""

from __future__ import annotations

import pytest

from helpers import make_sink, model_kv, run_job_killed_at, run_stages, shard_as_of, write_json_rows
from reconcile import failpoints
from reconcile.sink import append, check, mint, write
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable


def assert_converged(spark, ledger, cfg, history: list[tuple[int, list[dict]]]) -> None:
    for upper, rows in history:
        assert shard_as_of(cfg, upper - 1) == model_kv(rows), f"as of {upper - 1}"
    assert check.violations(ledger, cfg, spark=spark) == []


CASES = [
    ("write", "write.after_partition_staged", "retry"),
    ("write", "write.after_staged", "retry"),
    ("append", "append.after_advance_as_of", "retry"),
    ("append", "append.before_delta_commit", "retry"),
    ("append", "append.inside_delta_commit", "retry"),
    ("append", "append.after_delta_commit", "retry"),
    ("append", "append.after_delta_commit", "rerun"),
    ("append", "append.after_delta_commit", "next_run"),
    ("append", "metadata.inside_absorb", "retry"),
    ("append", "metadata.inside_absorb", "next_run"),
]


@pytest.mark.parametrize("stage, point, recovery", CASES, ids=[f"{p}-{r}" for _, p, r in CASES])
def test_killed_process_then_recovery(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery, connect_url
):
    # one write is killed in a JVM of its own (spark-submit's form), the others as Connect clients
    remote = None if point == "write.after_partition_staged" else connect_url
    crash_and_recover(spark, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery, remote)


@pytest.mark.parametrize("stage, point, recovery", CASES, ids=[f"{p}-{r}" for _, p, r in CASES])
def test_killed_process_then_recovery_on_s3(
    spark, s3_warehouse, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery
):
    """The same on a warehouse on S3: the killed job reads the AWS environment as a deployment's
    does (a write in a JVM of its own)."""
    crash_and_recover(spark, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery, None)


def crash_and_recover(spark, tmp_path, ledger, monkeypatch, stage, point, recovery, remote) -> None:
    """Run the stage's job killed at ``point`` (a write as a client of ``remote``, or in a JVM of
    its own), recover as ``recovery`` says, run one more batch, and check the shard against the
    model at every committed upper."""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"crash_{point.replace('.', '_')}"[:60])
    history: list[tuple[int, list[dict]]] = []
    rows0 = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    if point != "append.after_advance_as_of":  # that point needs the shard's first batch
        write_json_rows(tmp_path / "src", rows0)
        run_stages(spark, ledger, cfg, "run-0", 200)
        history.append((200, rows0))
    base = history[-1][0] if history else cfg.as_of

    rows1 = [{"k": 1, "v": "A"}, {"k": 3, "v": "c"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows1)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, base + 100).description
    if stage == "append":
        write.run_write(spark, ledger, cfg, desc.batch_id)
    run_job_killed_at(stage, cfg, "run-1", point, remote)

    if recovery == "retry":  # Airflow retries the task that died, then runs what follows it
        if stage == "write":
            # killed after its manifest was recorded, the attempt's files are the batch: the retry
            # keeps them; killed before, the retry stages its own
            want = "already_staged" if point == "write.after_staged" else "staged"
            assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == want
        result = append.run_append(ledger, cfg, ledger.batch_of_run(cfg.name, "run-1").batch_id)
        assert result.outcome in ("committed", "recovered"), result
        history.append((base + 100, rows1))
    elif recovery == "rerun":  # on call clears the whole run: mint, write, append again
        _, w, a = run_stages(spark, ledger, cfg, "run-1", base + 100, attempt=2)
        assert a.outcome in ("already_committed", "recovered", "committed"), a
        history.append((base + 100, rows1))
    else:  # nothing is cleared: the next scheduled run repairs and goes on
        history.append((base + 100, rows1))
    rows2 = [{"k": 3, "v": "c"}, {"k": 4, "v": "d"}]
    write_json_rows(tmp_path / "src", rows2)
    _, w, a = run_stages(spark, ledger, cfg, "run-2", base + 200)
    assert a.outcome == "committed", a
    history.append((base + 200, rows2))
    assert_converged(spark, ledger, cfg, history)
    if recovery == "next_run" and stage == "append":
        # The killed batch had reached Delta: it was rolled forward, not appended twice.
        lowers = [c.lower for c in batch_commits(ShardTable(cfg).history_since(-1)[1])]
        assert base in lowers


UPSERT_CASES = [
    ("write", "write.after_partition_staged", "retry"),
    ("append", "append.inside_delta_commit", "retry"),
    ("append", "append.after_delta_commit", "next_run"),
    ("append", "metadata.inside_absorb", "retry"),
]


@pytest.mark.parametrize("stage, point, recovery", UPSERT_CASES, ids=[f"{p}-{r}" for _, p, r in UPSERT_CASES])
def test_killed_upsert_process_then_recovery(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, stage, point, recovery, connect_url
):
    """The feed's watermark travels with the Delta commit: a batch rolled forward after a crash
    keeps its late commands from being applied a second time."""
    from upsert_model import UpsertModel, feed_rows, ok_rows, upsert_sink

    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, name=f"crash_ups_{point.replace('.', '_')}"[:60])
    model = UpsertModel()
    feed = [{"k": 1, "v": "a", "ts": 150, "off": 1}, {"k": 2, "v": "b", "ts": 160, "off": 2}]
    feed_rows(tmp_path, feed)
    run_stages(spark, ledger, cfg, "run-0", 200)
    model.batch(feed, 100, 200)

    # run-1 sees a late command for key 1 (time 120 < lower 200) and a newer one at 250
    feed += [
        {"k": 1, "v": "late", "ts": 120, "off": 3},
        {"k": 1, "v": "newer", "ts": 250, "off": 4},
        {"k": 2, "v": None, "ts": 260, "off": 5},
    ]
    feed_rows(tmp_path, feed)
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 300).description
    if stage == "append":
        write.run_write(spark, ledger, cfg, desc.batch_id)
    run_job_killed_at(stage, cfg, "run-1", point, connect_url)
    if recovery == "retry":
        if stage == "write":
            # killed after its manifest was recorded, the attempt's files are the batch: the retry
            # keeps them; killed before, the retry stages its own
            want = "already_staged" if point == "write.after_staged" else "staged"
            assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == want
        result = append.run_append(ledger, cfg, ledger.batch_of_run(cfg.name, "run-1").batch_id)
        assert result.outcome in ("committed", "recovered"), result
    model.batch(feed, 200, 300)

    feed += [{"k": 3, "v": "c", "ts": 350, "off": 6}]
    feed_rows(tmp_path, feed)
    _, _, a = run_stages(spark, ledger, cfg, "run-2", 400)
    assert a.outcome == "committed", a
    model.batch(feed, 300, 400)
    for t in (199, 200, 299, 399):
        assert ok_rows(shard_as_of(cfg, t)) == model.as_of(t), f"as of {t}"
    assert model.as_of(399)[(1, "newer", None)] == 1
    assert sum(b.late_commands or 0 for b in ledger.batches(cfg.name, ("committed",))) == model.late == 1
    assert check.violations(ledger, cfg, spark=spark) == []


def test_failpoints_are_off_by_default_and_reject_unknown_names():
    assert failpoints._armed == {}
    failpoints.failpoint("append.after_delta_commit")  # a no-op when nothing is armed
    with pytest.raises(ValueError, match="unknown fail point"):
        failpoints.arm("append.nowhere")
    failpoints.arm("append.before_delta_commit", "raise@2")
    try:
        failpoints.failpoint("append.before_delta_commit")  # first hit passes
        with pytest.raises(failpoints.FailPointHit):
            failpoints.failpoint("append.before_delta_commit")
    finally:
        failpoints.disarm_all()

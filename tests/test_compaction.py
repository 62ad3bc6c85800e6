"""Compaction: since advances, the history before it is consolidated, reads at or after since
are unchanged, the rewrite never races an append into a wrong state, old files are vacuumed.

Every expectation comes from the plain-Python models in helpers.py (changelog_model, and
model_kv over the source rows of each query batch), never from the code under test.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from helpers import (
    AS_OF,
    CHANGELOG_NEW,
    as_of,
    changelog_model,
    committed_run,
    make_sink,
    model_kv,
    run_stages,
    shard_as_of,
    update_log,
    write_json_rows,
)
from reconcile import cli, failpoints
from reconcile.errors import FailPointHit, SinkError
from reconcile.log import iso
from reconcile.sink import check, compact
from reconcile.storage import files
from reconcile.storage.delta import ShardTable


def _rows(n: int, version: int) -> list[dict]:
    """A query source that changes a little each version (updates, inserts, deletes)."""
    return [{"k": k, "v": f"v{(k * 7 + version) % 3}"} for k in range(version % 3, n + version)]


def _query_history(spark, ledger, tmp_path, cfg, batches: int, start: int = 0) -> list[tuple[int, list[dict]]]:
    history = []
    for i in range(start, start + batches):
        rows = _rows(6, i)
        write_json_rows(tmp_path / "src", rows)
        upper = AS_OF + 100 * (i + 1)
        committed_run(spark, ledger, cfg, f"run-{i}", upper)
        history.append((upper, rows))
    return history


def _data_files(spark, cfg) -> list[str]:
    return [f for f in files.list_files(ShardTable(cfg).path) if not f.startswith("_delta_log/")]


def _consolidated(log: list[dict], cfg) -> bool:
    keys = [tuple(u[c] for c in cfg.column_names) + (u["_error"], u["_time"]) for u in log]
    return len(keys) == len(set(keys)) and all(u["_diff"] != 0 for u in log)


def test_compaction_keeps_every_read_at_or_after_since(spark, warehouse, tmp_path, ledger):
    """Changelog sink: updates at many times. After compaction to since = 300, the shard as of
    every t >= 300 is what the model says; below since nothing is promised (and reads refuse)."""
    cfg = make_sink(tmp_path, "compacted_log", kind="changelog")
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        committed_run(spark, ledger, cfg, f"run-{i}", frontier)
    before = update_log(cfg)

    result = compact.run_compact(spark, ledger, cfg, since=300)
    assert result.outcome == "compacted", result.message
    assert ledger.get_shard(cfg.name).since == 300

    after = update_log(cfg)
    assert len(after) < len(before)
    assert min(u["_time"] for u in after) == 300  # everything before since was advanced to it
    assert _consolidated(after, cfg)
    for t in range(300, 420):
        assert as_of(after, cfg, t) == changelog_model(CHANGELOG_NEW, t), f"as of {t}"
    assert check.violations(ledger, cfg, spark=spark) == []
    # a read below since is refused with the reason
    assert cli.main(["show", cfg.name, "--as-of", "299"]) == 2

    # compaction again to the same since changes nothing; to the upper it folds everything
    assert compact.run_compact(spark, ledger, cfg, since=300).outcome == "nothing"
    with pytest.raises(SinkError, match=r"latest readable time \S+ \(399\)"):
        compact.run_compact(spark, ledger, cfg, since=400)
    assert compact.run_compact(spark, ledger, cfg, since=399).outcome == "compacted"
    for t in (399, 450):
        assert as_of(update_log(cfg), cfg, t) == changelog_model(CHANGELOG_NEW, t)
    assert {u["_time"] for u in update_log(cfg)} == {399}


def test_compaction_advances_since_from_retention_and_batches_go_on(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch
):
    """Query sink with retention.history_hours = 0: since goes to the upper, the log shrinks to
    one update per row, and the batches after it still follow the source."""
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(
        tmp_path, "compacted_query", retention={"history_hours": 0, "vacuum_hours": 0}, compaction={"every_batches": 3}
    )
    history = _query_history(spark, ledger, tmp_path, cfg, 2)
    assert compact.due(ledger, cfg)[0] is False
    history += _query_history(spark, ledger, tmp_path, cfg, 1, start=2)
    assert compact.due(ledger, cfg) == (True, "3 batches to fold in (compaction.every_batches: 3)")

    files_before = _data_files(spark, cfg)
    result = compact.run_compact(spark, ledger, cfg)
    assert result.outcome == "compacted", result.message
    upper = history[-1][0]
    assert ledger.get_shard(cfg.name).since == upper - 1  # the shard stays readable as of upper - 1
    log = update_log(cfg)
    assert Counter((u["k"], u["v"], u["_error"]) for u in log for _ in range(u["_diff"])) == model_kv(history[-1][1])
    assert all(u["_diff"] > 0 and u["_time"] == upper - 1 for u in log)
    # The old files were vacuumed: only the rewrite's files are left (how many is Spark's choice).
    files_after = _data_files(spark, cfg)
    assert files_after and not set(files_after) & set(files_before)
    assert len(files_after) < len(files_before)
    assert compact.due(ledger, cfg)[0] is False

    history += _query_history(spark, ledger, tmp_path, cfg, 2, start=3)
    for u, rows in history[2:]:  # as of upper - 1 of the compacted batch and of those after it
        assert shard_as_of(cfg, u - 1) == model_kv(rows), f"as of {u - 1}"
    assert check.violations(ledger, cfg, spark=spark) == []


def test_compaction_loses_to_a_batch_that_commits_after_it_read(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """The race window between compaction reading the table and committing its rewrite: a batch
    that commits in it wins; the stale rewrite is skipped by the commit guard, nothing is lost."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "compact_race", retention={"history_hours": 0})
    history = _query_history(spark, ledger, tmp_path, cfg, 2)
    real = compact.compacted

    def batch_sneaks_in(cfg_, updates, since):
        history.extend(_query_history(spark, ledger, tmp_path, cfg, 1, start=2))
        return real(cfg_, updates, since)

    monkeypatch.setattr(compact, "compacted", batch_sneaks_in)
    result = compact.run_compact(spark, ledger, cfg)
    assert result.outcome == "raced", result.message
    assert "skipped by the commit guard" in result.message
    monkeypatch.setattr(compact, "compacted", real)

    for u, rows in history:
        assert shard_as_of(cfg, u - 1) == model_kv(rows), f"as of {u - 1}"
    assert check.violations(ledger, cfg, spark=spark) == []
    assert compact.run_compact(spark, ledger, cfg).outcome == "compacted"
    assert shard_as_of(cfg, history[-1][0] - 1) == model_kv(history[-1][1])


def test_compaction_racing_appends_in_threads(spark, warehouse, tmp_path, ledger):
    """Compactions and batches at once, on SQLite and PostgreSQL: whoever loses retries; every
    committed batch reads back as its source, the ledger agrees with the Delta log."""
    race_compaction_with_appends(spark, tmp_path, ledger)


def test_compaction_racing_appends_on_s3(spark, s3_warehouse, tmp_path, sqlite_ledger):
    """The same with the warehouse on S3."""
    race_compaction_with_appends(spark, tmp_path, sqlite_ledger)


def race_compaction_with_appends(spark, tmp_path, ledger) -> None:
    cfg = make_sink(tmp_path, "compact_threads", retention={"history_hours": 0})
    history = _query_history(spark, ledger, tmp_path, cfg, 1)
    outcomes: list[str] = []
    stop = threading.Event()

    def compactor():
        # Races with the batches while they run; once they stop, until one compaction succeeds
        # (batches can be quick enough that every compaction begun beside them loses).
        while not (stop.is_set() and "compacted" in outcomes) and len(outcomes) < 20:
            try:
                outcomes.append(compact.run_compact(spark, ledger, cfg, vacuum_files=False).outcome)
            except Exception as exc:  # noqa: BLE001 - recorded, then asserted below
                outcomes.append(f"error: {exc}")

    t = threading.Thread(target=compactor)
    t.start()
    try:
        for i in range(1, 5):
            rows = _rows(6, i)
            write_json_rows(tmp_path / "src", rows)
            upper = AS_OF + 100 * (i + 1)
            for attempt in range(1, 6):  # the append task's retries
                try:
                    _, _, a = run_stages(spark, ledger, cfg, f"run-{i}", upper, attempt=attempt)
                    if a is not None and a.outcome in ("committed", "recovered", "already_committed"):
                        break
                except Exception:  # noqa: BLE001 - a lost commit race is retryable
                    continue
            history.append((upper, rows))
    finally:
        stop.set()
        t.join()
    assert not [o for o in outcomes if o.startswith("error")], outcomes
    assert "compacted" in outcomes
    since = ledger.get_shard(cfg.name).since
    for u, rows in history:
        if u - 1 >= since:
            assert shard_as_of(cfg, u - 1) == model_kv(rows), f"as of {u - 1}"
    assert ledger.get_shard(cfg.name).upper == history[-1][0]
    assert check.violations(ledger, cfg, spark=spark) == []


@pytest.mark.parametrize("point", ["compact.after_since", "compact.after_commit"])
def test_compaction_crash_then_rerun(spark, warehouse, tmp_path, sqlite_ledger, point):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, f"compact_crash_{point.split('.')[1]}", retention={"history_hours": 0})
    history = _query_history(spark, ledger, tmp_path, cfg, 3)
    failpoints.arm(point, "raise")
    try:
        with pytest.raises(FailPointHit):
            compact.run_compact(spark, ledger, cfg)
    finally:
        failpoints.disarm_all()
    assert ledger.get_shard(cfg.name).since == history[-1][0] - 1  # since was raised first
    again = compact.run_compact(spark, ledger, cfg)  # the rerun finishes what the crash left
    expected = "compacted" if point == "compact.after_since" else "nothing"
    assert again.outcome == expected, again.message
    assert {u["_time"] for u in update_log(cfg)} == {history[-1][0] - 1}
    history += _query_history(spark, ledger, tmp_path, cfg, 1, start=3)
    for u, rows in history[-2:]:
        assert shard_as_of(cfg, u - 1) == model_kv(rows)
    assert check.violations(ledger, cfg, spark=spark) == []


def test_compaction_refuses_a_since_past_the_upper_and_waits_without_batches(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "compact_edges", retention={"history_hours": 0})
    assert compact.run_compact(spark, ledger, cfg).outcome == "nothing"  # no table yet
    history = _query_history(spark, ledger, tmp_path, cfg, 1)
    with pytest.raises(SinkError, match="would pass the shard's latest readable time"):
        compact.run_compact(spark, ledger, cfg, since=history[-1][0])
    assert ledger.get_shard(cfg.name).since == 0
    assert compact.run_compact(spark, ledger, cfg).outcome == "compacted"
    assert compact.run_compact(spark, ledger, cfg).outcome == "nothing"


def test_cli_compact(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "compact_cli", retention={"history_hours": 0, "vacuum_hours": 0})
    history = _query_history(spark, ledger, tmp_path, cfg, 2)
    assert cli.main(["compact", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "compacted the shard's history" in out and f"new_since={iso(history[-1][0] - 1)}" in out
    assert cli.main(["show", cfg.name]) == 0
    assert ledger.get_shard(cfg.name).since == history[-1][0] - 1


@pytest.mark.slow  # a protocol upgrade and a DELETE by Spark, two batches
def test_the_vacuum_keeps_a_foreign_writers_deletion_vectors(spark, warehouse, tmp_path, sqlite_ledger):
    """A user's Spark DELETE on a shard with deletion vectors enabled: the next batch repairs the
    drift, and the vacuum at zero retention keeps the vector file the snapshot still reads
    (delta-rs's vacuum counts it as unnamed): the shard stays readable by Spark and delta-rs."""
    cfg = make_sink(tmp_path, "vacuum_dv", retention={"vacuum_hours": 0})
    rows = [{"k": k, "v": f"v{k}"} for k in range(8)]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, sqlite_ledger, cfg, "r0", AS_OF + 100)
    path = ShardTable(cfg).path
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 3")
    vectors = [f for f in files.list_files(path) if f.startswith("deletion_vector_")]
    assert vectors, "Spark's DELETE wrote a deletion vector"
    run_stages(spark, sqlite_ledger, cfg, "r1", AS_OF + 200)  # repairs the drift
    compact.vacuum(sqlite_ledger, ShardTable(cfg))
    assert set(vectors) <= set(files.list_files(path))
    want = model_kv(rows)
    assert shard_as_of(cfg, AS_OF + 199) == want
    got = spark.read.format("delta").load(path).groupBy("k", "v").sum("_diff").collect()
    assert Counter({(r["k"], r["v"], None): r["sum(_diff)"] for r in got if r["sum(_diff)"]}) == want

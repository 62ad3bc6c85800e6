"""Upsert sinks against the plain-Python model (tests/upsert_model.py), with real Spark + Delta."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow.parquet as pq
import pytest

from helpers import run_stages, shard_as_of, write_json_rows
from reconcile.errors import SourceError
from reconcile.kinds import upsert
from reconcile.sink import check
from reconcile.storage import frames
from reconcile.storage.delta import ShardTable
from upsert_model import HINT, UpsertModel, check_against, cmd, feed_rows, ok_rows, upsert_sink


def test_inserts_updates_deletes_and_reinserts(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path)
    model = UpsertModel()
    feed = [cmd(1, "a", 150, 1), cmd(2, "b", 160, 2), cmd(1, "a2", 170, 3)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    check_against(spark, cfg, model, [149, 150, 165, 170, 199])

    feed += [cmd(2, None, 210, 4), cmd(1, "a3", 220, 5), cmd(2, "b2", 230, 6), cmd(3, None, 240, 7)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(feed, 200, 300)
    check_against(spark, cfg, model, [199, 210, 220, 230, 240, 299])
    assert model.as_of(299) == Counter({(1, "a3", None): 1, (2, "b2", None): 1})
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


def test_highest_offset_wins_per_key_and_time_and_replays_change_nothing(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path)
    model = UpsertModel()
    # out-of-order offsets in the file, duplicates, many commands per key in one batch
    feed = [
        cmd(1, "late-off", 150, 9),
        cmd(1, "early-off", 150, 3),
        cmd(1, "late-off", 150, 9),
        cmd(2, "x", 120, 4),
        cmd(2, "y", 130, 5),
        cmd(2, "z", 140, 6),
        cmd(2, None, 150, 7),
        cmd(2, "w", 190, 8),
    ]
    feed_rows(tmp_path, feed)
    _, w, _ = run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    check_against(spark, cfg, model, [119, 120, 135, 150, 189, 199])
    assert model.as_of(199) == Counter({(1, "late-off", None): 1, (2, "w", None): 1})

    # a replay of commands already applied (same offsets) changes nothing
    replay = feed + [cmd(1, "late-off", 150, 9), cmd(2, "y", 130, 5)]
    feed_rows(tmp_path, replay)
    _, w2, _ = run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(replay, 200, 300)
    assert w2.rows_ok == 0 and w2.rows_err == 0
    check_against(spark, cfg, model, [250, 299])


def test_commands_at_or_after_upper_wait_and_late_commands_are_counted(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path)
    model = UpsertModel()
    feed = [cmd(1, "a", 150, 1), cmd(2, "future", 250, 2), cmd(3, "far", 400, 3)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    assert ok_rows(shard_as_of(cfg, 199)) == Counter({(1, "a", None): 1})

    # a late command: time 160 (< lower 200), arrived after batch 1 read the feed
    feed += [cmd(1, "late", 160, 4), cmd(4, "late-new", 120, 5)]
    feed_rows(tmp_path, feed)
    _, w, _ = run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(feed, 200, 300)
    check_against(spark, cfg, model, [199, 200, 249, 250, 299])
    b = sqlite_ledger.batch_of_run(cfg.name, "r2")
    assert b.late_commands == 2 == model.late
    assert b.source_offset == 5
    # history before lower is not rewritten: the late value appears at lower
    assert ok_rows(shard_as_of(cfg, 199)) == Counter({(1, "a", None): 1})
    assert ok_rows(shard_as_of(cfg, 200))[(1, "late", None)] == 1

    run_stages(spark, sqlite_ledger, cfg, "r3", 500)
    model.batch(feed, 300, 500)
    check_against(spark, cfg, model, [399, 400, 499])
    assert sqlite_ledger.batch_of_run(cfg.name, "r3").late_commands == 0


@pytest.mark.slow  # the quick tier keeps the random feeds against the model
def test_feedback_repairs_a_key_tampered_into_two_values(spark, warehouse, tmp_path, sqlite_ledger):
    from pyspark.sql import functions as F

    cfg = upsert_sink(tmp_path)
    feed = [cmd(1, "a", 150, 1), cmd(2, "b", 150, 2)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    # behind the sink's back: key 1 gets a second value, key 2 a duplicate
    tamper = frames.read_updates(spark, ShardTable(cfg)).where(F.col("k") == 1).withColumn("v", F.lit("rogue"))
    dup = frames.read_updates(spark, ShardTable(cfg)).where(F.col("k") == 2)
    tamper.unionByName(dup).write.format("delta").mode("append").save(ShardTable(cfg).path)
    broken = upsert.violations(cfg, frames.read_updates(spark, ShardTable(cfg)), 199)
    assert any("key {'k': 1} has 2 values" in v for v in broken), broken
    assert any("has count 2" in v for v in broken), broken
    assert any("has 2 values" in v for v in check.violations(sqlite_ledger, cfg, spark=spark))

    feed += [cmd(1, "a2", 210, 3), cmd(2, None, 220, 4)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    assert ok_rows(shard_as_of(cfg, 299)) == Counter({(1, "a2", None): 1})
    assert upsert.violations(cfg, frames.read_updates(spark, ShardTable(cfg)), 299) == []


def test_error_values_keep_their_key_and_unkeyed_commands_are_error_rows_of_their_own(
    spark, warehouse, tmp_path, sqlite_ledger
):
    cfg = upsert_sink(
        tmp_path,
        schema=[
            {"name": "k", "type": "bigint"},
            {"name": "v", "type": "string"},
            {"name": "n", "type": "int", "nullable": False},
        ],
    )
    rows = [
        {"k": 1, "v": "a", "n": 1, "ts": 150, "off": 1},
        {"k": 2, "v": "b", "n": 1.5, "ts": 150, "off": 2},  # value does not fit: the key's value is an error
        {"k": None, "v": "c", "n": 3, "ts": 150, "off": 3},  # null key: an error row of its own
        {"k": 3, "v": "d", "n": None, "ts": 150, "off": 4},  # null in a non-nullable value column
        {"k": 4, "v": "e", "n": 4, "ts": "soon", "off": 5},  # a time that is not an integer
    ]
    write_json_rows(tmp_path / "feed", rows)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    got = shard_as_of(cfg, 199)
    assert ok_rows(got) == Counter({(1, "a", 1, None): 1})
    errors = {k: n for k, n in got.items() if k[-1] is not None}
    assert len(errors) == 4 and all(n == 1 for n in errors.values())
    keyed = sorted(k[0] for k in errors if k[0] is not None)
    assert keyed == [2, 3]  # value errors keep their key
    messages = " | ".join(k[-1] for k in errors)
    assert "column 'n' does not fit int" in messages and "key column 'k' is null" in messages
    assert "time column 'ts' is null or not an integer" in messages and "not nullable" in messages

    # a good command for key 2 retracts its error value; the unkeyed errors are not repeated
    rows.append({"k": 2, "v": "fixed", "n": 2, "ts": 250, "off": 6})
    write_json_rows(tmp_path / "feed", rows)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    got = shard_as_of(cfg, 299)
    assert ok_rows(got) == Counter({(1, "a", 1, None): 1, (2, "fixed", 2, None): 1})
    assert Counter(k[0] for k, n in got.items() if k[-1] is not None for _ in range(n)) == Counter({3: 1, None: 2})


def test_delete_column_marks_deletes(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path, upsert={"delete": {"column": "op", "values": ["d", "D"]}})
    model = UpsertModel(delete_field="op", delete_values=("d", "D"))
    feed = [
        cmd(1, "a", 150, 1, op="u"),
        cmd(2, None, 150, 2, op="u"),
        cmd(3, "c", 150, 3, op="i"),
        cmd(1, "ignored", 160, 4, op="D"),
        cmd(3, "c", 170, 5, op="d"),
    ]
    write_json_rows(tmp_path / "feed", feed + [{**HINT, "op": "u"}])
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    check_against(spark, cfg, model, [150, 160, 170, 199])
    assert model.as_of(199) == Counter({(2, None, None): 1})  # a null value is a value here


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_feeds_match_the_model(spark, warehouse, tmp_path, sqlite_ledger, seed):
    rng = random.Random(seed)
    cfg = upsert_sink(tmp_path, partitions=rng.choice([1, 3]))
    model = UpsertModel()
    feed: list[dict] = []
    off = 0
    lower = cfg.as_of
    for run in range(4):
        upper = lower + rng.choice([100, 200])
        for _ in range(rng.randint(0, 25)):
            off += rng.choice([1, 1, 2])
            t = rng.randint(cfg.as_of - 50, upper + 150)  # before as_of, late, in batch, future
            feed.append(cmd(rng.randint(0, 6), rng.choice(["a", "b", "c", None]), t, off))
        if feed and rng.random() < 0.3:
            feed.append(dict(rng.choice(feed)))  # a duplicate delivery
        rng.shuffle(feed)
        feed_rows(tmp_path, feed)
        run_stages(spark, sqlite_ledger, cfg, f"r{run}", upper)
        model.batch(feed, lower, upper)
        check_against(spark, cfg, model, sorted({lower, (lower + upper) // 2, upper - 1}))
        lower = upper
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    assert sum(b.late_commands or 0 for b in sqlite_ledger.batches(cfg.name)) == model.late


def _rows_read(spark) -> dict[int, int]:
    """Rows each finished Spark stage of this session has read from files (Spark's status store)."""
    sc = spark.sparkContext
    stages = sc._jsc.sc().statusStore().stageList(None, False, False, sc._gateway.new_array(sc._jvm.double, 0), None)
    return {int(s.stageId()): int(s.inputRecords()) for s in (stages.apply(i) for i in range(stages.size()))}


def test_a_batch_skips_feed_files_the_shard_has_applied_and_shard_files_its_keys_miss(
    spark, warehouse, tmp_path, sqlite_ledger
):
    """A Parquet file whose commands are all older than lower and at or below the watermark is
    not read (its statistics rule it out); the other feed rows are read once, and of the shard
    only the files whose key range meets the key range of the feed's unapplied files."""
    cfg = upsert_sink(tmp_path, upsert={"source": {"format": "parquet", "path": "feed"}})
    model = UpsertModel()

    def append(rows):  # one file per call
        frame = spark.createDataFrame(
            [(r["k"], r["v"], r["ts"], r["off"]) for r in rows], "k BIGINT, v STRING, ts BIGINT, off BIGINT"
        )
        frame.coalesce(1).write.mode("append").parquet(str(tmp_path / "feed"))

    first = [cmd(k, f"a{k}", 100 + k, k) for k in range(40)]
    append(first)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(first, 100, 200)
    # the second file: 8 commands of this batch, one late (time 150: before lower, offset above
    # the watermark), one waiting for the next batch (time 300)
    second = [cmd(k, f"b{k}", 200 + k, 100 + k) for k in range(0, 40, 6)] + [
        cmd(7, "late", 150, 200),
        cmd(8, "wait", 300, 201),
    ]
    append(second)
    before = _rows_read(spark)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    read = sum(n for stage, n in _rows_read(spark).items() if stage not in before)
    model.batch(first + second, 200, 300)
    check_against(spark, cfg, model, [199, 200, 299])
    b = sqlite_ledger.batch_of_run(cfg.name, "r2")
    assert (b.late_commands, b.source_offset) == (1, 201)
    # nothing of the first file, the second file once; of the shard (40 rows as of batch 1), the
    # rows of the files whose key range meets the keys the second file's statistics bound (each
    # shard file's range read from its footer here)
    lo, hi = min(c["k"] for c in second), max(c["k"] for c in second)
    shard_rows = 0
    for f in ShardTable(cfg).plain_files(b.read_version):
        keys = pq.read_table(f, columns=["k"]).column("k").to_pylist()
        shard_rows += len(keys) if min(keys) <= hi and lo <= max(keys) else 0
    assert 0 < shard_rows <= len(first)
    assert read == shard_rows + len(second), read


def test_feed_missing_a_column_is_a_clear_error(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = upsert_sink(tmp_path)
    write_json_rows(tmp_path / "feed", [{"k": 1, "v": "a", "ts": 150}])
    with pytest.raises(SourceError, match=r"upsert.source lacks column\(s\) \['off'\]"):
        run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    assert not sqlite_ledger.batches(cfg.name, ("committed",))


def test_cli_status_check_and_dry_run_of_an_upsert_sink(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys):
    from reconcile import cli

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path)
    feed = [cmd(1, "a", 150, 1), cmd(2, "b", 250, 2)]
    feed_rows(tmp_path, feed)
    assert cli.main(["run", cfg.name, "--frontier", "200", "--run-id", "r1"]) == 0
    feed.append(cmd(3, "late", 120, 3))
    feed_rows(tmp_path, feed)
    capsys.readouterr()
    assert cli.main(["dry-run", cfg.name, "--frontier", "300"]) == 0
    out = capsys.readouterr().out
    assert "upsert feed: 2 command(s) eligible, 1 late" in out and "nothing was written" in out
    assert cli.main(["run", cfg.name, "--frontier", "300", "--run-id", "r2"]) == 0
    capsys.readouterr()
    assert cli.main(["status", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "late" in out and "offset" in out
    last = [line for line in out.splitlines() if line.rstrip().endswith("r2")][0].split()
    assert last[-3:-1] == ["1", "3"], last  # late_commands, source_offset
    assert cli.main(["check", cfg.name]) == 0
    assert "0 invariant violation(s)" in capsys.readouterr().out

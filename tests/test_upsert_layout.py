"""An upsert shard laid out by key (issue 49), against the plain-Python model (tests/upsert_model.py):

- every file the sink writes (batches, the first batch, compaction) holds the rows of one hash
  partition of the key (Spark SQL's own ``pmod(xxhash64(key), P)`` computed here), sorted by key
  and cut every ``layout.ROWS_PER_FILE`` rows, so that a partition's files hold disjoint ranges;
- a batch reads only the files whose key statistics hold one of its keys and says so on its log
  line; the shard equals the model after every batch, ``check`` and ``check --verify`` stay clean;
- the first batch (one aggregate) keeps the history of keys with commands at several times;
- a shard written by the previous release (row-hash partitions, its code run in a process of its
  own) is read and corrected by the next batch with no manual step and relaid by a compaction;
  that batch records the upsert key in its own commit (issue 52), so a later change of
  ``upsert.key`` is refused by ``validate`` and by the run.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from helpers import previous_release, run_previous, run_stages
from reconcile import cli
from reconcile.sink import check
from reconcile.storage import layout, schema_change
from reconcile.storage.delta import ShardTable
from upsert_model import UpsertModel, check_against, cmd, feed_rows, upsert_sink

# The last release before the key layout (landed, CI green): its upsert shards hash whole rows.
PREVIOUS_RELEASE = "f62818e"
P = 3


def _files(table: ShardTable) -> list[tuple[str, list]]:
    """(path relative to the table, its rows' keys in file order) of every data file."""
    out = []
    for full in table.plain_files() or []:
        keys = pq.read_table(full, columns=["k"]).column("k").to_pylist()
        out.append((full.removeprefix(table.path + "/"), keys))
    return out


def _partition_by_spark(spark, keys: list[int]) -> dict[int, int]:
    """Spark SQL's ``pmod(xxhash64(k), P)`` of each key (the hash Spark's own SQL computes)."""
    if not keys:
        return {}
    values = ", ".join(f"(CAST({k} AS BIGINT))" for k in sorted(set(keys)))
    rows = spark.sql(f"SELECT k, pmod(xxhash64(k), {P}) AS p FROM VALUES {values} AS t(k)").collect()
    return {r["k"]: r["p"] for r in rows}


def _assert_laid_out_by_key(spark, table: ShardTable, rows_per_file: int) -> None:
    """Each file: one hash partition of the key (its directory's, where it has one), sorted by
    key, at most ``rows_per_file`` rows; the files one task cut hold consecutive key ranges."""
    files = _files(table)
    assert files
    part_of = _partition_by_spark(spark, [k for _, keys in files for k in keys if k is not None])
    ranges = defaultdict(list)
    for path, keys in files:
        keyed = [k for k in keys if k is not None]
        assert len(keys) <= rows_per_file, path
        assert keyed == sorted(keyed), f"{path} is not sorted by key: {keyed}"
        parts = {part_of[k] for k in keyed}
        assert len(parts) <= 1, f"{path} holds keys of partitions {parts}"
        if parts and path.startswith(layout.BATCHES_DIR + "/"):
            assert layout.part_of(path) == parts.pop(), path
        if keyed:
            directory, name = path.rsplit("/", 1)
            task = name.split("-")[1]  # part-<task>-<uuid>.c<file>: the files one task cut
            ranges[(directory, task, part_of[keyed[0]])].append((keyed[0], keyed[-1]))
    for spans in ranges.values():  # consecutive ranges (a key's updates may span two files)
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans


def _files_read(write) -> tuple[int, int]:
    found = re.search(r"files_read=(\d+) of (\d+)", write.message)
    assert found, write.message
    return int(found[1]), int(found[2])


def test_an_upsert_shard_is_laid_out_by_key_and_a_batch_reads_only_the_files_its_keys_need(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch
):
    monkeypatch.setattr(layout, "ROWS_PER_FILE", 4)
    cfg = upsert_sink(tmp_path, partitions=P)
    model = UpsertModel()
    # the first batch: 60 keys; keys 0-4 with commands at several times (their history kept),
    # replays, a delete, and a command that cannot be keyed
    feed = [cmd(k, f"a{k}", 150, k + 1) for k in range(60)]
    feed += [cmd(k, f"b{k}", 170, 100 + k) for k in range(5)] + [cmd(3, None, 180, 200), cmd(7, "a7", 150, 8)]
    feed += [cmd(None, "nokey", 160, 300)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    check_against(spark, cfg, model, [149, 150, 169, 170, 180, 199])
    table = ShardTable(cfg)
    _assert_laid_out_by_key(spark, table, 4)

    # a batch of two keys reads the files that can hold them, not the shard
    feed += [cmd(10, "c10", 250, 400), cmd(11, None, 260, 401)]
    feed_rows(tmp_path, feed)
    _, w, _ = run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(feed, 200, 300)
    read, total = _files_read(w)
    assert 0 < read <= 4 < total, (read, total)
    check_against(spark, cfg, model, [199, 250, 260, 299])

    # many keys, new and old: still exact
    feed += [cmd(k, f"d{k}", 350, 500 + k) for k in range(0, 80, 3)]
    feed_rows(tmp_path, feed)
    _, w, _ = run_stages(spark, sqlite_ledger, cfg, "r3", 400)
    model.batch(feed, 300, 400)
    check_against(spark, cfg, model, [299, 350, 399])
    _assert_laid_out_by_key(spark, table, 4)
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []
    lines, counts = check.verify_checksums(sqlite_ledger, cfg, spark)
    assert lines == [] and counts["verified"] == 3, (lines, counts)


@pytest.mark.slow
def test_an_upsert_shard_of_the_previous_release_is_corrected_and_relaid_by_compaction(
    spark, warehouse, tmp_path, sqlite_url, monkeypatch, capsys
):
    from reconcile.sink.compact import run_compact
    from reconcile.storage.ledger import Ledger

    monkeypatch.setattr(layout, "ROWS_PER_FILE", 8)
    monkeypatch.setenv("RECONCILE_METADATA_URL", sqlite_url)
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, name="ups_old", partitions=P)
    model = UpsertModel()
    feed = [cmd(k, f"a{k}", 150, k + 1) for k in range(40)]
    feed_rows(tmp_path, feed)
    env = {
        "RECONCILE_SINKS_DIR": str(tmp_path),
        "RECONCILE_WAREHOUSE": str(warehouse),
        "RECONCILE_METADATA_URL": os.environ["RECONCILE_METADATA_URL"],
    }
    old = previous_release(tmp_path, PREVIOUS_RELEASE)
    run_previous(old, cfg.name, [200], env)
    model.batch(feed, 100, 200)
    feed += [cmd(k, f"b{k}", 250, 100 + k) for k in range(0, 40, 4)]
    feed_rows(tmp_path, feed)
    run_previous(old, cfg.name, [300], env)
    model.batch(feed, 200, 300)
    check_against(spark, cfg, model, [199, 299])

    ledger = Ledger(sqlite_url)  # this release's, on the previous one's ledger
    table = ShardTable(cfg)
    assert schema_change.recorded_key(table.snapshot().schema().to_json()) is None  # that release recorded none
    before = table.latest_version()
    feed += [cmd(k, f"c{k}", 350, 200 + k) for k in range(1, 45, 5)]
    feed_rows(tmp_path, feed)
    run_stages(spark, ledger, cfg, "new-1", 400)
    model.batch(feed, 300, 400)
    # this release's first batch records the key in its own commit: one version, no other
    assert table.latest_version() == before + 1
    assert schema_change.recorded_key(table.snapshot().schema().to_json()) == ("k",)
    actions = table.commit_actions(before + 1)
    meta = json.loads(next(a["commitInfo"] for a in actions if "commitInfo" in a)["userMetadata"])["reconcile"]
    assert meta["op"] == "batch" and meta["key_recorded"] == ["k"] and "schema_change" not in meta
    assert sum("metaData" in a for a in actions) == 1 and [a["txn"]["version"] for a in actions if "txn" in a] == [300]
    check_against(spark, cfg, model, [199, 299, 350, 399])
    assert check.violations(ledger, cfg, spark=spark) == []
    lines, counts = check.verify_checksums(ledger, cfg, spark)
    assert lines == [] and counts["verified"] == 3, (lines, counts)

    run_compact(spark, ledger, cfg, since=350)
    table = ShardTable(cfg)
    _assert_laid_out_by_key(spark, table, 8)
    feed += [cmd(2, "d2", 450, 300)]
    feed_rows(tmp_path, feed)
    _, w, _ = run_stages(spark, ledger, cfg, "new-2", 500)
    model.batch(feed, 400, 500)
    read, total = _files_read(w)
    assert read < total, (read, total)
    check_against(spark, cfg, model, [399, 450, 499])
    assert check.violations(ledger, cfg, spark=spark) == []
    assert check.verify_checksums(ledger, cfg, spark)[0] == []

    # the key recorded, a change of upsert.key is refused by validate and by the run: nothing committed
    rekeyed = upsert_sink(tmp_path, name="ups_old", partitions=P, upsert={"key": ["v"]})
    version = table.latest_version()
    capsys.readouterr()
    assert cli.main(["validate", "--dir", str(tmp_path), "--no-spark"]) == 1
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("INVALID")]
    assert len(said) == 1 and said[0].startswith(f"INVALID ups_old: the sink file {rekeyed.path} changes"), said
    assert "upsert.key changed from [k] (the shard's) to [v]" in said[0] and "a new sink" in said[0]
    assert cli.main(["run", "ups_old", "--frontier", "600", "--run-id", "new-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: sink 'ups_old': "), err
    assert f"the sink file {rekeyed.path} changes the shard's upsert key" in err
    assert "upsert.key changed from [k] (the shard's) to [v]" in err and "a new sink" in err
    assert table.latest_version() == version
    assert not [b for b in ledger.batches("ups_old", ("committed",)) if b.run_id == "new-3"]
    check_against(spark, cfg, model, [499])
    ledger.dispose()

"""The row key stored in the shard (docs/design.md, "The row key stored"), with real Spark, Delta
tables and ledgers:

- every row a query sink writes carries its key, equal to Spark's ``xxhash64`` of the row computed
  here in SQL (the first half) and a salted one (the second); a batch reads the sink's own files
  as stored and hashes a foreign writer's; ``check --deep`` reports a stored key that differs
  from its row's;
- a shard written by the previous release (its code, run in a process of its own) is read,
  corrected and upgraded by the next batch of this one with no manual step (the columns added
  by a metadata-only commit under the lease; the old files hashed when read until a
  compaction stores their key), each step equal to a plain-Python model of the source.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import make_sink, model_kv, previous_release, run_previous, run_stages, shard_as_of, write_json_rows
from reconcile.differential import KEY_SALT
from reconcile.model import ROW_KEYS
from reconcile.storage.delta import ShardTable

ROOT = Path(__file__).resolve().parents[1]
# The last release before the row key was stored (landed, CI green).
PREVIOUS_RELEASE = "3a9e127"


def _stored_and_expected(spark, table: ShardTable) -> list[tuple]:
    """(stored key, the key Spark's own SQL computes from the row) for every row of the table's files."""
    files = table.plain_files()
    assert files
    df = spark.read.parquet(*files)
    df.createOrReplaceTempView("shard_files")
    return [
        tuple(r)
        for r in spark.sql(
            f"SELECT _rowkey1, _rowkey2, xxhash64(k, v, _error), xxhash64(CAST({KEY_SALT} AS BIGINT), k, v, _error) "
            "FROM shard_files"
        ).collect()
    ]


def test_every_written_row_carries_its_key_and_check_deep_reports_a_wrong_one(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    from reconcile import cli
    from reconcile.storage import frames

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_HASH_FIRST_MIN_ROWS", "1")  # the key-first comparison on a few rows
    cfg = make_sink(tmp_path, "keys_written", partitions=2)
    rows = [{"k": i, "v": f"v{i}"} for i in range(20)]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    rows = [r for r in rows if r["k"] % 3] + [{"k": 5, "v": "changed"}, {"k": 99, "v": None}]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    assert shard_as_of(cfg, 299) == model_kv(rows)
    table = ShardTable(cfg)
    assert table.keyed
    pairs = _stored_and_expected(spark, table)
    assert pairs and all(p[0] == p[2] and p[1] == p[3] for p in pairs), pairs
    keyed, other, n_keyed, n_other = table.keyed_files(table.latest_version())
    assert keyed and not other and n_other == 0 and n_keyed == len(pairs)

    # a foreign writer's file: hashed when read, the batch still exact
    from deltalake import write_deltalake

    foreign = pa.table(
        {
            "k": pa.array([7], pa.int64()),
            "v": pa.array(["foreign"]),
            "_time": pa.array([250], pa.int64()),
            "_diff": pa.array([1], pa.int64()),
            "_error": pa.array([None], pa.string()),
        }
    )
    write_deltalake(table.path, foreign, mode="append", schema_mode="merge")
    _, how = frames.read_keyed(spark, table, table.latest_version())
    assert (how.stored, how.hashed) == (n_keyed, 1)
    run_stages(spark, sqlite_ledger, cfg, "r3", 400)
    assert shard_as_of(cfg, 399) == model_kv(rows)

    # a stored key changed in one of the sink's own files: check --deep reports it
    own = table.keyed_files(table.latest_version())[0][0]
    data = pq.read_table(own)
    bad = data.set_column(
        data.schema.get_field_index(ROW_KEYS[1]), ROW_KEYS[1], pa.array([0] * data.num_rows, pa.int64())
    )
    pq.write_table(bad, own)
    Path(own).with_name(f".{Path(own).name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old bytes
    capsys.readouterr()
    assert cli.main(["check", cfg.name, "--deep"]) != 0
    out = capsys.readouterr().out
    assert f"{data.num_rows} row(s) of {own}" in out and "sink's own file" in out, out


@pytest.mark.slow
def test_a_shard_of_the_previous_release_is_upgraded_by_its_next_batch(
    spark, warehouse, tmp_path, sqlite_url, monkeypatch
):
    from reconcile.sink.compact import run_compact
    from reconcile.storage import frames
    from reconcile.storage.ledger import Ledger

    monkeypatch.setenv("RECONCILE_METADATA_URL", sqlite_url)  # created by the previous release

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    monkeypatch.setenv("RECONCILE_HASH_FIRST_MIN_ROWS", "1")
    cfg = make_sink(tmp_path, "keys_upgraded", partitions=2)
    first = [{"k": i, "v": f"a{i}"} for i in range(10)]
    write_json_rows(tmp_path / "src", first)
    old = previous_release(tmp_path, PREVIOUS_RELEASE)
    env = {
        "RECONCILE_SINKS_DIR": str(tmp_path),
        "RECONCILE_WAREHOUSE": str(warehouse),
        "RECONCILE_METADATA_URL": os.environ["RECONCILE_METADATA_URL"],
    }
    run_previous(old, cfg.name, [200], env)
    second = first[:7] + [{"k": 3, "v": "b3"}, {"k": 11, "v": "b11"}]
    write_json_rows(tmp_path / "src", second)
    run_previous(old, cfg.name, [300], env)
    sqlite_ledger = Ledger(sqlite_url)  # this release's: its migrations run on the previous one's ledger
    table = ShardTable(cfg)
    assert not table.keyed  # the previous release's table
    assert shard_as_of(cfg, 299) == model_kv(second)
    versions = table.latest_version()

    third = second[2:] + [{"k": 12, "v": "c12"}]
    write_json_rows(tmp_path / "src", third)
    _, how = frames.read_keyed(spark, table, table.latest_version())
    assert how.stored == 0 and how.hashed > 0  # every old row hashed when read
    run_stages(spark, sqlite_ledger, cfg, "new-1", 400)
    assert table.keyed
    assert shard_as_of(cfg, 399) == model_kv(third)
    assert shard_as_of(cfg, 299) == model_kv(second)  # history as it was
    upgrade = table.commit_actions(versions + 1)
    assert not [a for a in upgrade if "add" in a or "remove" in a]  # metadata only
    assert [b.state for b in sqlite_ledger.batches(cfg.name)] == ["committed"] * 3
    _, how = frames.read_keyed(spark, table, table.latest_version())
    assert how.stored > 0 and how.hashed > 0  # the new batch's rows as stored, the old hashed

    write_json_rows(tmp_path / "src", third + [{"k": 13, "v": "d13"}])
    run_stages(spark, sqlite_ledger, cfg, "new-2", 500)
    run_compact(spark, sqlite_ledger, cfg, since=450)
    _, how = frames.read_keyed(spark, table, table.latest_version())
    assert how.hashed == 0 and how.stored > 0  # the compaction stored every row's key
    assert shard_as_of(cfg, 499) == model_kv(third + [{"k": 13, "v": "d13"}])
    assert frames.wrong_row_keys(spark, table) == []
    assert Counter(b.state for b in sqlite_ledger.batches(cfg.name)) == Counter({"committed": 4})
    sqlite_ledger.dispose()

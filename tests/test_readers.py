"""Other engines read (and write) the shard: DuckDB (its ``delta`` extension, from PyPI's
``duckdb-extension-delta``), Polars (``scan_delta``), delta-rs and Spark return the same
collection as of several times, for every kind of sink, before and after compaction, with the
README's as-of query. A write by delta-rs behind the sink's back is drift that the next batch
repairs.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from helpers import (
    CHANGELOG_NEW,
    arrow_updates,
    changelog_model,
    make_sink,
    model_kv,
    run_stages,
    shard_as_of,
    write_json_rows,
)
from reconcile.sink import check
from reconcile.sink.compact import run_compact
from reconcile.storage.delta import ShardTable


def duckdb_as_of(cfg, t: int) -> Counter:
    """The README's as-of query, run by DuckDB over the Delta table (``delta_scan``)."""
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    cols = ", ".join(f'"{c}"' for c in [*cfg.column_names, "_error"])
    rows = con.sql(
        f"SELECT {cols}, SUM(_diff) FROM delta_scan('{ShardTable(cfg).path}') "
        f"WHERE _time <= {t} GROUP BY {cols} HAVING SUM(_diff) <> 0"
    ).fetchall()
    con.close()
    return Counter({tuple(r[:-1]): int(r[-1]) for r in rows})


def polars_as_of(cfg, t: int) -> Counter:
    """The README's as-of query in Polars over the table's current version (``scan_delta``):
    updates with ``_time <= t``, grouped by the row and ``_error``, diffs summed, zeros dropped."""
    import polars as pl

    keys = [*cfg.column_names, "_error"]
    frame = (
        pl.scan_delta(ShardTable(cfg).path)
        .filter(pl.col("_time") <= t)
        .group_by(keys)
        .agg(pl.col("_diff").sum())
        .filter(pl.col("_diff") != 0)
        .select(*keys, "_diff")
        .collect()
    )
    return Counter({tuple(r[:-1]): int(r[-1]) for r in frame.iter_rows()})


def spark_as_of(spark, cfg, t: int) -> Counter:
    """The README's as-of query in Spark over the Delta table (``spark.read.format("delta")``)."""
    from pyspark.sql import functions as F

    keys = [*cfg.column_names, "_error"]
    updates = spark.read.format("delta").load(ShardTable(cfg).path).where(F.col("_time") <= t)
    counts = updates.groupBy(*keys).agg(F.sum("_diff").alias("n")).where(F.col("n") != 0)
    return Counter({tuple(r[:-1]): int(r[-1]) for r in counts.collect()})


def same_everywhere(spark, cfg, t: int) -> Counter:
    """The shard as of ``t`` by delta-rs, Spark, DuckDB and Polars: all four must agree."""
    by_delta_rs = shard_as_of(cfg, t)
    assert spark_as_of(spark, cfg, t) == by_delta_rs, f"Spark as of {t}"
    assert duckdb_as_of(cfg, t) == by_delta_rs, f"DuckDB as of {t}"
    assert polars_as_of(cfg, t) == by_delta_rs, f"Polars as of {t}"
    return by_delta_rs


def test_query_sink_before_and_after_compaction(spark, warehouse, tmp_path, sqlite_ledger):
    cfg = make_sink(tmp_path, "rq", retention={"history_hours": 0, "vacuum_hours": 0})
    runs = [
        (200, [{"k": 1, "v": "é"}, {"k": 2, "v": ""}, {"k": 2, "v": ""}]),
        (300, [{"k": 1, "v": "é"}, {"k": 3, "v": None}, {"k": 4, "v": "日本"}]),
        (400, [{"k": 4, "v": "日本"}]),
    ]
    for i, (frontier, rows) in enumerate(runs):
        write_json_rows(tmp_path / "src", rows)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", frontier)
    for frontier, rows in runs:
        assert same_everywhere(spark, cfg, frontier - 1) == model_kv(rows)
    run_compact(spark, sqlite_ledger, cfg, since=299)
    for frontier, rows in runs[1:]:  # exact at and after since
        assert same_everywhere(spark, cfg, frontier - 1) == model_kv(rows)


def test_changelog_sink_everywhere(spark, warehouse, tmp_path, sqlite_ledger):

    cfg = make_sink(tmp_path, "rc", kind="changelog")
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", frontier)
    for t in (150, 199, 250, 299, 399):
        assert same_everywhere(spark, cfg, t) == changelog_model(CHANGELOG_NEW, t), t


def test_upsert_sink_before_and_after_compaction(spark, warehouse, tmp_path, sqlite_ledger):
    from upsert_model import UpsertModel, cmd, feed_rows, ok_rows, upsert_sink

    cfg = upsert_sink(tmp_path, name="ru", retention={"history_hours": 0, "vacuum_hours": 0})
    model = UpsertModel()
    feed = [cmd(1, "a", 110, 1), cmd(2, "b", 120, 2), cmd(1, None, 150, 3), cmd(3, "c", 180, 4)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)
    feed += [cmd(1, "again", 210, 5), cmd(2, "b2", 250, 6), cmd(3, None, 260, 7)]
    feed_rows(tmp_path, feed)
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    model.batch(feed, 200, 300)
    for t in (115, 150, 199, 220, 299):
        assert ok_rows(same_everywhere(spark, cfg, t)) == model.as_of(t), t
    run_compact(spark, sqlite_ledger, cfg, since=250)
    for t in (250, 299):
        assert ok_rows(same_everywhere(spark, cfg, t)) == model.as_of(t), t


def test_extreme_values_read_the_same_in_duckdb_and_polars(spark, warehouse, tmp_path, sqlite_ledger):
    schema = [
        {"name": "k", "type": "bigint", "nullable": False},
        {"name": "at", "type": "timestamp"},
        {"name": "day", "type": "date"},
        {"name": "amount", "type": "decimal(38,9)"},
        {"name": "s", "type": "string"},
        {"name": "ok", "type": "boolean"},
        {"name": "x", "type": "double"},
    ]
    sql = (
        "SELECT k, CAST(at AS TIMESTAMP) AS at, CAST(day AS DATE) AS day, "
        "CAST(amount AS DECIMAL(38,9)) AS amount, s, ok, x FROM src"
    )
    cfg = make_sink(
        tmp_path, "rx", schema=schema, query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
    )
    rows = [
        {
            "k": 1,
            "at": "1600-01-01T00:00:00.000001Z",
            "day": "0001-01-01",
            "amount": "-99999999999999999999999999999.999999999",
            "s": "",
            "ok": True,
            "x": -1.5e300,
        },
        {
            "k": 2,
            "at": "9999-12-31T23:59:59.999999Z",
            "day": "9999-12-31",
            "amount": "12345678901234567890.123456789",
            "s": "ünï😀",
            "ok": False,
            "x": 0.0,
        },
        {"k": 3, "at": None, "day": None, "amount": None, "s": None, "ok": None, "x": None},
    ]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)

    def norm(at):
        return None if at is None else (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC)

    def plain(counter: Counter) -> Counter:
        return Counter({(r[0], norm(r[1]), *r[2:]): n for r, n in counter.items()})

    by_delta_rs = plain(shard_as_of(cfg, 199))
    assert plain(duckdb_as_of(cfg, 199)) == by_delta_rs
    assert plain(polars_as_of(cfg, 199)) == by_delta_rs
    want = {
        (
            r["k"],
            norm(datetime.fromisoformat(r["at"].replace("Z", "+00:00")) if r["at"] else None),
            datetime.fromisoformat(r["day"]).date() if r["day"] else None,
            Decimal(r["amount"]) if r["amount"] else None,
            r["s"],
            r["ok"],
            r["x"],
            None,
        )
        for r in rows
    }
    assert set(by_delta_rs) == want and set(by_delta_rs.values()) == {1}


@pytest.mark.parametrize("mode", ["append", "overwrite"])
def test_a_write_by_delta_rs_is_drift_the_next_batch_repairs(spark, warehouse, tmp_path, sqlite_ledger, mode):
    from deltalake import write_deltalake

    cfg = make_sink(tmp_path, f"rw_{mode}")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    foreign = arrow_updates([{"k": 7, "v": "zz", "t": 150}])
    write_deltalake(
        ShardTable(cfg).path, foreign, mode=mode, schema_mode="merge"
    )  # behind the sink's back (its row key columns: null)
    _, w, a = run_stages(spark, sqlite_ledger, cfg, "run-2", 300)
    assert a.outcome == "committed", a.message
    assert w.drift_rows == (1 if mode == "append" else 3)  # an overwrite also removed the 2 rows
    assert same_everywhere(spark, cfg, 299) == model_kv(rows)
    assert check.violations(sqlite_ledger, cfg, spark=spark) == []


@pytest.mark.parametrize("feature", ["deletion_vectors", "column_mapping"])
def test_the_write_reads_the_shard_through_delta_once_a_reader_feature_needs_it(
    spark, warehouse, tmp_path, sqlite_ledger, feature
):
    """The write reads the shard's files as plain Parquet (the log replayed in-process) until the
    table needs Delta's own reader: a deletion vector written behind the sink's back must hide
    its row; column mapping may give the files other column names."""
    from reconcile.storage import frames

    cfg = make_sink(tmp_path, f"read_{feature}")
    write_json_rows(tmp_path / "src", [{"k": k, "v": f"v{k}"} for k in range(6)])
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    assert len(ShardTable(cfg).plain_files()) >= 1
    path = ShardTable(cfg).path
    if feature == "deletion_vectors":
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 3")  # a deletion vector, not a rewrite
    else:
        spark.sql(
            f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.columnMapping.mode' = 'name', "
            "'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
        )
    assert ShardTable(cfg).plain_files() is None
    by_delta = sorted(spark.read.format("delta").load(path).collect())
    assert sorted(frames.read_updates(spark, ShardTable(cfg)).collect()) == by_delta
    assert {r["k"] for r in by_delta} == ({0, 1, 2, 4, 5} if feature == "deletion_vectors" else set(range(6)))

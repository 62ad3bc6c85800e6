"""The S3 pieces under the warehouse, on a real S3 server (versitygw, harness/s3_server.py):

- the server's put-if-absent is atomic: of many conditional puts of one key racing, exactly one
  wins and the rest get 412, round after round (what every Delta commit on S3 relies on);
- delta-rs (as ``append`` uses it) creates and appends on it with its default commit, a
  ``PutObject`` with ``If-None-Match: *``: a version someone else wrote first is refused, never
  overwritten; of commits racing for one version exactly one lands; racing appends with retries
  all land, at distinct versions;
- Spark writes and reads Parquet through s3a (hadoop-aws and the AWS SDK v2 modules in .jars) and
  reads a Delta table delta-rs wrote there.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

import object_store_harness as harness
from harness import s3_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    yield from harness.serve(s3_server.start, tmp_path_factory.mktemp("s3"))


def test_put_if_absent_has_exactly_one_winner_per_key(s3):
    harness.assert_put_if_absent_has_exactly_one_winner(s3, rounds=25)  # 412 for the losers


def test_delta_rs_creates_and_appends_and_never_overwrites_a_commit(s3):
    """delta-rs commits with put-if-absent: a version someone else wrote first is refused (412)."""
    harness.assert_delta_rs_never_overwrites_a_commit(
        s3.client(), s3.url("create_append"), "create_append", s3.storage_options()
    )


def test_delta_rs_commits_racing_for_one_version_have_one_winner(s3):
    harness.assert_one_racing_commit_lands_per_version(s3.url("one_winner"), s3.storage_options(), writers=8, rounds=8)


def test_delta_rs_racing_appends_all_land_at_distinct_versions(s3):
    from deltalake import DeltaTable, write_deltalake

    url, opts = s3.url("all_land"), s3.storage_options()
    write_deltalake(url, pa.table({"k": [0]}), storage_options=opts)
    writers = 8
    outcome = harness.race_delta_commits(url, opts, list(range(1, writers + 1)), retries=None)  # delta-rs retries
    assert outcome == ["committed"] * writers
    dt = DeltaTable(url, storage_options=opts)
    assert dt.version() == writers
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == list(range(writers + 1))
    appends = [h for h in dt.history() if h["operation"] == "WRITE" and h["version"] > 0]
    assert sorted(h["version"] for h in appends) == list(range(1, writers + 1))


def test_spark_reads_and_writes_through_s3a(s3, spark):
    """The shared in-process session gets this server's settings as S3A per-bucket options (the
    bucket's name is unique to the server), so no other test's session state changes."""
    from deltalake import write_deltalake

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in s3.hadoop_conf(per_bucket=True).items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)

    # Parquet, both ways; the objects are on the server
    df = spark.range(20).selectExpr("id", "CAST(id * 2 AS STRING) AS v")
    df.write.mode("overwrite").parquet(s3.url("spark/parquet", scheme="s3a"))
    back = spark.read.parquet(s3.url("spark/parquet", scheme="s3a"))
    assert sorted((r.id, r.v) for r in back.collect()) == [(i, str(i * 2)) for i in range(20)]
    keys = s3.client().keys("spark/parquet/")
    assert any(k.endswith(".parquet") for k in keys) and not any("_temporary" in k for k in keys)

    # A Delta table delta-rs wrote (created, then appended): Spark reads the latest version
    url = s3.url("spark/delta")
    write_deltalake(url, pa.table({"k": [1, 2], "s": ["a", "b"]}), storage_options=s3.storage_options())
    write_deltalake(url, pa.table({"k": [3], "s": ["c"]}), mode="append", storage_options=s3.storage_options())
    delta = spark.read.format("delta").load(s3.url("spark/delta", scheme="s3a"))
    assert sorted((r.k, r.s) for r in delta.collect()) == [(1, "a"), (2, "b"), (3, "c")]
    # s3:// as the warehouse names it, through the same connector
    delta_s3 = spark.read.format("delta").load(s3.url("spark/delta"))
    assert delta_s3.count() == 3

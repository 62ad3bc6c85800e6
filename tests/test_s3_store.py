"""The S3 pieces under the warehouse, on a real S3 server (versitygw, tests/s3_server.py):

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

import json
import os
import socket
import threading
import time

import pyarrow as pa
import pytest

import s3_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    try:
        server = s3_server.start(tmp_path_factory.mktemp("s3"))
    except s3_server.S3ServerMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    yield server
    server.stop()


def _race_conditional_puts(server: s3_server.S3Server, key: str, writers: int) -> list[int]:
    """``writers`` PutObject requests of ``key`` with ``If-None-Match: *``, each on its own
    connection, all sent but their last byte before any is let go: the server handles them at the
    same moment. Returns each writer's HTTP status."""
    client = server.client()
    requests = [
        client.raw_put(key, f"writer {i}".encode().ljust(2048, b"."), {"If-None-Match": "*"}) for i in range(writers)
    ]
    socks = [socket.create_connection((server.host, server.port), timeout=60) for _ in range(writers)]
    try:
        for sock, req in zip(socks, requests):
            sock.sendall(req[:-1])
        time.sleep(0.02)
        for sock, req in zip(socks, requests):
            sock.sendall(req[-1:])
        statuses = []
        for sock in socks:
            status_line = sock.makefile("rb").readline()
            statuses.append(int(status_line.split()[1]))
        return statuses
    finally:
        for sock in socks:
            sock.close()


def test_put_if_absent_has_exactly_one_winner_per_key(s3):
    client = s3.client()
    winners_per_round = []
    for round_ in range(25):
        key = f"race/{round_:04d}.json"
        statuses = _race_conditional_puts(s3, key, writers=48)
        assert set(statuses) <= {200, 412}, statuses
        winners = [i for i, status in enumerate(statuses) if status == 200]
        winners_per_round.append(len(winners))
        if len(winners) == 1:  # the object holds the winner's bytes, whole
            assert client.get(key) == f"writer {winners[0]}".encode().ljust(2048, b".")
    assert winners_per_round == [1] * 25
    # the 412s were about the key existing: a plain put still replaces it
    assert client.put("race/0000.json", b"replaced") == 200
    assert client.get("race/0000.json") == b"replaced"


def _table(url, storage_options):
    from deltalake import DeltaTable

    return DeltaTable(url, storage_options=storage_options)


def test_delta_rs_creates_and_appends_and_never_overwrites_a_commit(s3):
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    url, opts = s3.url("create_append"), s3.storage_options()
    write_deltalake(url, pa.table({"k": [1, 2]}), storage_options=opts)
    write_deltalake(url, pa.table({"k": [3]}), mode="append", storage_options=opts)
    dt = _table(url, opts)
    assert dt.version() == 1
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == [1, 2, 3]
    client = s3.client()
    log = [k for k in client.list_keys("create_append/_delta_log/") if k.endswith(".json")]
    assert [k.rsplit("/", 1)[1] for k in log] == [f"{v:020d}.json" for v in (0, 1)]

    # A foreign writer takes version 2 first. delta-rs, still at version 1, commits with
    # put-if-absent: refused (412), and the foreign commit is left as it was.
    stale = _table(url, opts)
    foreign = json.dumps({"commitInfo": {"operation": "FOREIGN", "timestamp": 0}}).encode() + b"\n"
    assert client.put("create_append/_delta_log/00000000000000000002.json", foreign, if_none_match="*") == 200
    with pytest.raises(CommitFailedError):
        write_deltalake(
            stale, pa.table({"k": [4]}), mode="append", commit_properties=CommitProperties(max_commit_retries=0)
        )
    assert client.get("create_append/_delta_log/00000000000000000002.json") == foreign


def _race_commits(url, opts, values: list[int], retries: int | None) -> list[str]:
    """One delta-rs append per value, all from tables loaded at the same version and let go at
    once (``retries``: delta-rs's commit retries, None for its default). Returns each writer's
    outcome: "committed", "lost the race" (CommitFailedError) or any other error, named."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    tables = [_table(url, opts) for _ in values]
    props = CommitProperties(max_commit_retries=retries) if retries is not None else None
    outcome = [""] * len(values)
    start = threading.Barrier(len(values))

    def commit(i: int) -> None:
        start.wait()
        try:
            write_deltalake(tables[i], pa.table({"k": [values[i]]}), mode="append", commit_properties=props)
            outcome[i] = "committed"
        except CommitFailedError:
            outcome[i] = "lost the race"
        except Exception as exc:  # any other error is a finding: say which
            outcome[i] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(values))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcome


def test_delta_rs_commits_racing_for_one_version_have_one_winner(s3):
    from deltalake import write_deltalake

    url, opts = s3.url("one_winner"), s3.storage_options()
    write_deltalake(url, pa.table({"k": [0]}), storage_options=opts)
    writers, rounds = 8, 8
    expected = [0]
    for round_ in range(rounds):
        values = [round_ * 100 + i + 1 for i in range(writers)]
        outcome = _race_commits(url, opts, values, retries=0)
        assert sorted(outcome) == ["committed"] + ["lost the race"] * (writers - 1), outcome
        expected.append(values[outcome.index("committed")])
    dt = _table(url, opts)
    assert dt.version() == rounds
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == sorted(expected)


def test_delta_rs_racing_appends_all_land_at_distinct_versions(s3):
    from deltalake import write_deltalake

    url, opts = s3.url("all_land"), s3.storage_options()
    write_deltalake(url, pa.table({"k": [0]}), storage_options=opts)
    writers = 8
    outcome = _race_commits(url, opts, list(range(1, writers + 1)), retries=None)  # delta-rs retries
    assert outcome == ["committed"] * writers
    dt = _table(url, opts)
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
    keys = s3.client().list_keys("spark/parquet/")
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

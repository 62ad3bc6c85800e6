"""The warehouse on Azure (``RECONCILE_WAREHOUSE=abfss://container@account.dfs.core.windows.net/...``)
on Azurite (tests/azurite_server.py), as far as an emulator of the Blob API can show it:

- its put-if-absent (``If-None-Match: *`` on Put Blob) has exactly one winner among racing puts;
- delta-rs creates and appends with the sink's settings and never overwrites a commit; of
  commits racing for one version exactly one lands;
- the sink's JVM-free paths: ``ShardTable`` creating the table, the guarded ``commit_files``
  (racing, repeated, fenced), the log read back, and the staged files listed and deleted
  through ``storage/files.py``;
- the Hadoop conf for ABFS carries no secret, only ``${env.NAME}`` references that Hadoop
  resolves to the JVM's environment.

Not here: a sink's write and compaction need Spark's ABFS connector, which speaks the Data Lake
Storage Gen2 (``dfs``) API that Azurite does not serve (docs/object-stores.md).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import azurite_server
from helpers import make_sink, shard_as_of
from reconcile import settings
from reconcile.storage import files
from reconcile.storage.delta import ShardTable


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    try:
        server = azurite_server.start(tmp_path_factory.mktemp("azurite"))
    except azurite_server.AzuriteMissing as exc:
        if os.environ.get("CI"):
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    yield server
    server.stop()


@pytest.fixture
def adls_warehouse(azurite, monkeypatch) -> str:
    """``RECONCILE_WAREHOUSE=abfss://<container>@<account>.dfs.core.windows.net/<fresh prefix>``
    with the standard Azure variables a deployment sets (and the emulator's endpoint)."""
    for k, v in azurite.environment().items():
        monkeypatch.setenv(k, v)
    url = azurite.url(f"wh-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("RECONCILE_WAREHOUSE", url)
    return url


def _race_conditional_puts(server: azurite_server.AzuriteServer, blob: str, writers: int) -> list[int]:
    """``writers`` Put Blob requests of ``blob`` with ``If-None-Match: *``, each on its own
    connection, all sent but their last byte before any is let go. Returns each one's status."""
    import socket

    client = server.client()
    body = [f"writer {i}".encode().ljust(2048, b".") for i in range(writers)]
    requests = [client.raw_put(blob, body[i], {"If-None-Match": "*"}) for i in range(writers)]
    socks = [socket.create_connection((server.host, server.port), timeout=60) for _ in range(writers)]
    try:
        for sock, req in zip(socks, requests):
            sock.sendall(req[:-1])
        time.sleep(0.02)
        for sock, req in zip(socks, requests):
            sock.sendall(req[-1:])
        return [int(sock.makefile("rb").readline().split()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def test_azurite_put_if_absent_has_exactly_one_winner_per_blob(azurite):
    client = azurite.client()
    winners_per_round = []
    for round_ in range(20):
        blob = f"race/{round_:04d}.json"
        statuses = _race_conditional_puts(azurite, blob, writers=48)
        assert set(statuses) <= {201, 409}, statuses  # 409 BlobAlreadyExists, as Azure answers
        winners = [i for i, status in enumerate(statuses) if status == 201]
        winners_per_round.append(len(winners))
        if len(winners) == 1:  # the blob holds the winner's bytes, whole
            assert client.get(blob) == f"writer {winners[0]}".encode().ljust(2048, b".")
    assert winners_per_round == [1] * 20
    assert client.put("race/0000.json", b"replaced") == 201  # an unconditional put still replaces it
    assert client.get("race/0000.json") == b"replaced"


def test_delta_rs_creates_and_appends_on_adls_and_never_overwrites_a_commit(azurite, adls_warehouse):
    import json

    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    url, opts = f"{adls_warehouse}/t", settings.delta_storage_options()  # what ShardTable passes
    write_deltalake(url, pa.table({"k": [1, 2]}), storage_options=opts)
    write_deltalake(url, pa.table({"k": [3]}), mode="append", storage_options=opts)
    dt = DeltaTable(url, storage_options=opts)
    assert dt.version() == 1
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == [1, 2, 3]
    prefix = url.split(".dfs.core.windows.net/", 1)[1]
    client = azurite.client()
    log = [b.rsplit("/", 1)[1] for b in client.list_blobs(f"{prefix}/_delta_log/") if b.endswith(".json")]
    assert log == [f"{v:020d}.json" for v in (0, 1)]

    # A foreign writer takes version 2 first: delta-rs, still at version 1, is refused, and the
    # foreign commit is left as it was.
    stale = DeltaTable(url, storage_options=opts)
    foreign = json.dumps({"commitInfo": {"operation": "FOREIGN", "timestamp": 0}}).encode() + b"\n"
    assert client.put(f"{prefix}/_delta_log/{2:020d}.json", foreign, if_none_match="*") == 201
    with pytest.raises(CommitFailedError):
        write_deltalake(
            stale, pa.table({"k": [4]}), mode="append", commit_properties=CommitProperties(max_commit_retries=0)
        )
    assert client.get(f"{prefix}/_delta_log/{2:020d}.json") == foreign


def _race_commits(url: str, opts: dict, values: list[int]) -> list[str]:
    """One delta-rs append per value (no retry), all from tables loaded at the same version and
    let go at once. Returns each writer's outcome: "committed", "lost the race"
    (CommitFailedError) or any other error, named."""
    from deltalake import CommitProperties, DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    tables = [DeltaTable(url, storage_options=opts) for _ in values]
    outcome = [""] * len(values)
    start = threading.Barrier(len(values))

    def commit(i: int) -> None:
        start.wait()
        try:
            props = CommitProperties(max_commit_retries=0)
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


def test_delta_rs_commits_racing_for_one_version_on_adls_have_one_winner(adls_warehouse):
    from deltalake import DeltaTable, write_deltalake

    url, opts = f"{adls_warehouse}/race", settings.delta_storage_options()
    write_deltalake(url, pa.table({"k": [0]}), storage_options=opts)
    writers, rounds, expected = 6, 6, [0]
    for round_ in range(rounds):
        values = [round_ * 100 + i + 1 for i in range(writers)]
        outcome = _race_commits(url, opts, values)
        assert sorted(outcome) == ["committed"] + ["lost the race"] * (writers - 1), outcome
        expected.append(values[outcome.index("committed")])
    dt = DeltaTable(url, storage_options=opts)
    assert dt.version() == rounds
    assert sorted(dt.to_pyarrow_table()["k"].to_pylist()) == sorted(expected)


def _stage(table: ShardTable, batch_id: str, stage_id: str, rows: list[dict]) -> list[tuple[str, int, dict]]:
    """Stage ``rows`` (k, v at time ``_time``) as one Parquet file where the write stage puts a
    batch's files, written with Arrow (the write stage itself needs Spark's ABFS). Returns the
    ``(path relative to the table, size, stats)`` that commit_files takes."""
    data = pa.table(
        {
            "k": pa.array([r["k"] for r in rows], pa.int64()),
            "v": pa.array([r["v"] for r in rows], pa.string()),
            "_time": pa.array([r["t"] for r in rows], pa.int64()),
            "_diff": pa.array([1] * len(rows), pa.int64()),
            "_error": pa.array([None] * len(rows), pa.string()),
        }
    )
    path = f"{table.staging_path(batch_id, stage_id)}/part-00000.parquet"
    fs, inside = files.fs_of(path)
    pq.write_table(data, inside, filesystem=fs)
    size = files.list_files(table.staging_path(batch_id, stage_id))["part-00000.parquet"]
    return [(path[len(table.path) + 1 :], size, {"numRecords": len(rows)})]


def test_the_shard_table_commits_guarded_on_adls(adls_warehouse, tmp_path):
    cfg = make_sink(tmp_path, "q")
    table = ShardTable(cfg)
    assert table.path == f"{adls_warehouse}/q"
    table.ensure()
    table.ensure()  # found, not created again
    assert table.log_versions() == [0]

    first = _stage(table, "b1", "s1", [{"k": 1, "v": "a", "t": 150}, {"k": 2, "v": "b", "t": 160}])
    assert table.commit_files(first, {"batch_id": "b1"}, lower=100) == 1
    assert table.commit_files(first, {"batch_id": "b1"}, lower=100) is None  # that lower is recorded

    class LeaseLost(Exception):
        pass

    def lost() -> None:
        raise LeaseLost

    second = _stage(table, "b2", "s1", [{"k": 3, "v": "c", "t": 250}])
    with pytest.raises(LeaseLost):
        table.commit_files(second, {"batch_id": "b2"}, lower=200, fence=lost)
    assert table.log_versions() == [0, 1]  # the fenced writer put nothing
    assert table.commit_files(second, {"batch_id": "b2"}, lower=200) == 2

    # the log read back through files.py: who committed what
    latest, entries = table.log_entries(0)
    assert latest == 2
    assert [(v, meta["batch_id"], txn) for v, meta, txn in entries] == [(1, "b1", 100), (2, "b2", 200)]
    assert table.commit_info(2)["operation"] == "WRITE"
    assert table.last_txn_version() == 200 and table.last_txn_version(as_of=1) == 100
    assert sorted(table.snapshot_files()) == sorted(p for p, _, _ in first + second)
    assert table.foreign_commits(0, 2) == []
    # another engine (delta-rs, as tests/helpers.py reads) sees the shard as committed
    assert shard_as_of(cfg, 199) == Counter({(1, "a", None): 1, (2, "b", None): 1})
    assert shard_as_of(cfg, 299) == Counter({(1, "a", None): 1, (2, "b", None): 1, (3, "c", None): 1})


def test_guarded_commits_racing_on_adls_land_once_per_lower(adls_warehouse, tmp_path):
    """Writers (each its own ShardTable, as separate tasks hold) race commit_files: for one lower
    exactly one commits and the others see it recorded; for different lowers each lands at a
    version of its own or is skipped because a higher lower was recorded first (a loser of the
    put re-checks on the newer snapshot): the recorded lowers only increase, the highest lands."""
    cfg = make_sink(tmp_path, "race")
    ShardTable(cfg).ensure()
    staged = _stage(ShardTable(cfg), "b1", "s1", [{"k": 1, "v": "a", "t": 150}])

    def race(lowers: list[int]) -> list[int | None]:
        tables = [ShardTable(cfg) for _ in lowers]
        for t in tables:
            t.snapshot()  # each holds the same snapshot before the race
        got: list[int | None] = [None] * len(lowers)
        start = threading.Barrier(len(lowers))

        def commit(i: int) -> None:
            start.wait()
            got[i] = tables[i].commit_files(staged, {"batch_id": f"b{lowers[i]}"}, lower=lowers[i])

        threads = [threading.Thread(target=commit, args=(i,)) for i in range(len(lowers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    same = race([100] * 5)
    assert sorted(same, key=lambda v: v is None) == [1, None, None, None, None], same
    different = race([200, 300, 400])
    landed = sorted(v for v in different if v is not None)
    assert landed == list(range(2, 2 + len(landed))) and different[2] is not None, different
    _, entries = ShardTable(cfg).log_entries(0)
    txns = [txn for _, _, txn in entries]
    assert txns[0] == 100 and txns[-1] == 400 and txns == sorted(set(txns)), txns


def test_staged_files_are_listed_and_deleted_on_adls(adls_warehouse, tmp_path):
    cfg = make_sink(tmp_path, "gc")
    table = ShardTable(cfg)
    keep = _stage(table, "b1", "s1", [{"k": 1, "v": "a", "t": 150}])
    _stage(table, "b1", "s2", [{"k": 1, "v": "a", "t": 150}])
    _stage(table, "b2", "s1", [{"k": 2, "v": "b", "t": 250}])
    assert table.staged_batches() == ["b1", "b2"]
    assert table.staged_attempts("b1") == ["s1", "s2"]
    staged = f"{table.path}/{keep[0][0]}"
    assert files.digest(staged) == hashlib.sha256(files.read_bytes(staged)).hexdigest()
    assert files.read_text(f"{table.log_path}/{0:020d}.json") is None  # no table yet: nothing to read

    assert files.delete_path(table.staging_path("b1", "s2")) is True
    assert table.staged_attempts("b1") == ["s1"]
    assert files.delete_path(table.staging_path("b2")) is True
    assert files.delete_path(table.staging_path("b2")) is False  # already gone
    assert table.staged_batches() == ["b1"]
    assert list(table.files()) == [keep[0][0]]


def test_an_azure_path_without_an_account_is_one_clear_error(monkeypatch):
    from reconcile.errors import SinkError

    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(SinkError) as err:
        files.list_files("az://warehouse/prefix")
    assert "names no Azure storage account" in str(err.value)
    assert "abfss://<container>@<account>.dfs.core.windows.net/<prefix>" in err.value.remedy


def test_the_abfs_conf_names_the_secrets_and_hadoop_resolves_them_from_the_environment(monkeypatch):
    """ABFS reads no environment variable itself: the sink's Hadoop conf names the standard
    variable (``${env.NAME}``), never its value, and Hadoop's Configuration (Spark's Hadoop
    3.5.0) resolves the reference from the JVM's environment where ABFS reads the key
    (``getPassword``). Each kind of credential in turn, then GCS."""
    from pyspark.java_gateway import launch_gateway

    key, client_secret = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    for name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AZURE_FEDERATED_TOKEN_FILE", raising=False)
    monkeypatch.setenv("RECONCILE_WAREHOUSE", "abfss://lake@acme.dfs.core.windows.net/reconcile")
    host = "acme.dfs.core.windows.net"
    assert not any(k.startswith("fs.azure.") for k in settings.spark_store_conf())  # no credential: none set

    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", key)
    shared_key = settings.spark_store_conf()
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_KEY")
    monkeypatch.setenv("AZURE_CLIENT_ID", "app-id")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant-id")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", client_secret)
    principal = settings.spark_store_conf()
    monkeypatch.setenv("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/azure/tokens/azure-identity-token")
    workload = settings.spark_store_conf()
    assert shared_key[f"fs.azure.account.auth.type.{host}"] == "SharedKey"
    assert principal[f"fs.azure.account.oauth.provider.type.{host}"].endswith(".ClientCredsTokenProvider")
    assert workload[f"fs.azure.account.oauth.provider.type.{host}"].endswith(".WorkloadIdentityTokenProvider")
    for conf in (shared_key, principal, workload, settings.delta_storage_options()):
        assert not any(key in v or client_secret in v for v in conf.values())

    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", key)  # the JVM starts with these variables
    gateway = launch_gateway()
    try:
        for conf, password in ((shared_key, "key"), (principal, "oauth2.client.secret")):
            hadoop = gateway.jvm.org.apache.hadoop.conf.Configuration(False)
            for k, v in conf.items():
                hadoop.set(k, v)
            resolved = "".join(hadoop.getPassword(f"fs.azure.account.{password}.{host}"))
            assert resolved == (key if password == "key" else client_secret)
        hadoop = gateway.jvm.org.apache.hadoop.conf.Configuration(False)
        for k, v in principal.items():
            hadoop.set(k, v)
        endpoint = hadoop.get(f"fs.azure.account.oauth2.client.endpoint.{host}")
        assert endpoint == "https://login.microsoftonline.com/tenant-id/oauth2/token"
    finally:
        gateway.shutdown()

    monkeypatch.setenv("RECONCILE_WAREHOUSE", "gs://lake/reconcile")
    gcs = settings.spark_store_conf()
    assert gcs["fs.gs.auth.type"] == "APPLICATION_DEFAULT" and not any(k.startswith("fs.azure.") for k in gcs)

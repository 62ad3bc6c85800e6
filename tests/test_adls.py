"""The warehouse on Azure (``RECONCILE_WAREHOUSE=abfss://container@account.dfs.core.windows.net/...``)
on Azurite (harness/azurite_server.py), as far as an emulator of the Blob API can show it:

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
import secrets
import uuid
from collections import Counter

import pyarrow.parquet as pq
import pytest

import object_store_harness as harness
from harness import azurite_server
from helpers import arrow_updates, make_sink, shard_as_of
from reconcile import settings
from reconcile.storage import files
from reconcile.storage.delta import ShardTable


@pytest.fixture(scope="module")
def azurite(tmp_path_factory):
    yield from harness.serve(azurite_server.start, tmp_path_factory.mktemp("azurite"))


@pytest.fixture
def adls_warehouse(azurite, monkeypatch) -> str:
    """``RECONCILE_WAREHOUSE=abfss://<container>@<account>.dfs.core.windows.net/<fresh prefix>``
    with the standard Azure variables a deployment sets (and the emulator's endpoint)."""
    for k, v in azurite.environment().items():
        monkeypatch.setenv(k, v)
    url = azurite.url(f"wh-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("RECONCILE_WAREHOUSE", url)
    return url


def test_azurite_put_if_absent_has_exactly_one_winner_per_blob(azurite):
    harness.assert_put_if_absent_has_exactly_one_winner(azurite, rounds=20)  # 409 BlobAlreadyExists for the losers


def test_delta_rs_creates_and_appends_on_adls_and_never_overwrites_a_commit(azurite, adls_warehouse):
    url, opts = f"{adls_warehouse}/t", settings.delta_storage_options()  # what ShardTable passes
    prefix = url.split(".dfs.core.windows.net/", 1)[1]
    harness.assert_delta_rs_never_overwrites_a_commit(azurite.client(), url, prefix, opts)


def test_delta_rs_commits_racing_for_one_version_on_adls_have_one_winner(adls_warehouse):
    url, opts = f"{adls_warehouse}/race", settings.delta_storage_options()
    harness.assert_one_racing_commit_lands_per_version(url, opts, writers=6, rounds=6)


def _stage(table: ShardTable, batch_id: str, stage_id: str, rows: list[dict]) -> list[tuple[str, int, dict]]:
    """Stage ``rows`` (k, v at time ``_time``) as one Parquet file where the write stage puts a
    batch's files, written with Arrow (the write stage itself needs Spark's ABFS). Returns the
    ``(path relative to the table, size, stats)`` that commit_files takes."""
    path = f"{table.staging_path(batch_id, stage_id)}/part-00000.parquet"
    fs, inside = files.fs_of(path)
    pq.write_table(arrow_updates(rows), inside, filesystem=fs)
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


def test_the_current_table_commits_on_adls(adls_warehouse, tmp_path):
    """The current-state table's own commits (put-if-absent through obstore) on ADLS: created in
    its layout (no deletion vectors there), a version taken is refused, an overwrite replaces the
    rows, and delta-rs reads them back with the freshness they record."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from reconcile.storage.current import CurrentTable

    cfg = make_sink(tmp_path, "cur", current=True)
    ct = CurrentTable(cfg)
    assert ct.path == f"{adls_warehouse}/cur.current" and not ct.wants_vectors()
    ct.create()
    ct.create()  # found, not created again
    dt = ct.snapshot()
    rows = pa.table({"k": pa.array([1, 2], pa.int64()), "v": ["a", None]})
    assert ct.commit(dt, "append", ct.write_rows(rows), [], {}, 3, upper=200) == 1
    assert ct.commit(dt, "append", ct.write_rows(rows), [], {}, 3, upper=200) is None  # version 1 taken
    dt = ct.snapshot()
    again = pa.table({"k": pa.array([7], pa.int64()), "v": ["z"]})
    assert ct.commit(dt, "overwrite", ct.write_rows(again), [], {}, 5, upper=300) == 2
    read = DeltaTable(ct.path, storage_options=settings.delta_storage_options())
    assert read.to_pyarrow_table().to_pylist() == [{"k": 7, "v": "z"}]
    assert read.protocol().reader_features is None and read.schema().fields[0].nullable is False
    assert read.metadata().configuration["reconcile.upper"] == "300" and ct.reflected(read) == 5


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

        def commit(i: int) -> None:
            got[i] = tables[i].commit_files(staged, {"batch_id": f"b{lowers[i]}"}, lower=lowers[i])

        harness.at_once(len(lowers), commit)
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

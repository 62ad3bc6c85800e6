"""The shard's storage: a Delta table of updates, its commit log, and staged batch files.

Layout under the warehouse root (a local folder or any Hadoop-compatible URI)::

    <warehouse>/<sink>/                                 Delta table: sink columns, _error, _time, _diff
    <warehouse>/_staging/<sink>/<batch_id>/<stage_id>/  one write attempt's correction,
                                                        _part=<p>/ per hash partition

Every write attempt stages into a directory of its own (``stage_id``); the ledger's manifest
names the one attempt whose files are the batch, and the append commits exactly those files.

Every Delta commit the sink makes carries ``userMetadata = {"reconcile": {...}}`` naming the
operation and, for a batch, its ``batch_id``, ``lower`` and ``upper``. Batch commits also use
Delta's idempotent writes (``txnAppId = reconcile-sink:<sink>``, ``txnVersion = lower``): Delta
skips a write whose ``txnVersion`` is not above the last one it recorded, so a batch, or any
batch with an older ``lower``, can never be committed twice, whatever the metadata says.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from functools import lru_cache
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from reconcile import settings
from reconcile.config import SinkConfig
from reconcile.errors import Retryable, ShardSchemaChanged, brief
from reconcile.model import CommitRecord

log = logging.getLogger("reconcile.shard")
META_KEY = "reconcile"


def table_path(cfg: SinkConfig) -> str:
    return f"{settings.warehouse()}/{cfg.name}"


def staging_root(cfg: SinkConfig) -> str:
    return f"{settings.warehouse()}/_staging/{cfg.name}"


def staging_path(cfg: SinkConfig, batch_id: str, stage_id: str | None = None) -> str:
    """The batch's staging directory, or one write attempt's directory inside it."""
    path = f"{staging_root(cfg)}/{batch_id}"
    return f"{path}/{stage_id}" if stage_id else path


def new_stage_id() -> str:
    return f"w-{uuid.uuid4().hex[:16]}"


def app_id(cfg: SinkConfig) -> str:
    return f"reconcile-sink:{cfg.name}"


def schema(cfg: SinkConfig, *, with_part: bool = False) -> StructType:
    return _parse_ddl(cfg.ddl + (", `_part` INT" if with_part else ""))


@lru_cache(maxsize=256)
def _parse_ddl(ddl: str) -> StructType:
    parsed = StructType.fromDDL(ddl)  # a round trip to the JVM's parser (~50 ms): parse once
    assert isinstance(parsed, StructType)
    return parsed


def writer(df: DataFrame, meta: dict, mode: str):
    """A Delta writer whose commit carries ``meta`` as the sink's own commit metadata.

    The metadata is an option of this one write, never the session-wide
    ``spark.databricks.delta.commitInfo.userMetadata``: writers sharing a SparkSession (threads,
    a notebook) would otherwise stamp each other's commits, and a batch commit stamped as
    anything else is invisible to :func:`reconcile.sink.sync.sync`.
    """
    return df.write.format("delta").mode(mode).option("userMetadata", json.dumps({META_KEY: meta}, sort_keys=True))


def exists(spark: SparkSession, cfg: SinkConfig) -> bool:
    from delta.tables import DeltaTable

    return DeltaTable.isDeltaTable(spark, table_path(cfg))


def ensure_table(spark: SparkSession, cfg: SinkConfig) -> None:
    """Create the shard's Delta table if missing; refuse one whose schema drifted."""
    from delta.tables import DeltaTable

    path = table_path(cfg)
    expected = schema(cfg)
    attempt = 0
    while not DeltaTable.isDeltaTable(spark, path):
        # Version 0 is one metadata-only commit (no Spark job: ~0.3 s, against ~0.7 s, and ~7 s
        # for the first write of a JVM, for an empty DataFrame write), atomic by Delta's
        # put-if-absent of the first commit file; concurrent creators lose that race with an
        # exception and then find the table. It changes no data: a "maintenance" commit.
        attempt += 1
        try:
            DeltaTable.createIfNotExists(spark).location(path).addColumns(expected).execute()
        except Exception as exc:
            if DeltaTable.isDeltaTable(spark, path):
                break
            if attempt >= 5:
                raise Retryable(
                    f"cannot create the shard's Delta table at {path}: {brief(exc, 300)}.",
                    sink=cfg.name,
                    remedy="the task retries by itself; if it persists, check the warehouse path.",
                ) from None
            time.sleep(0.5 * attempt)
    actual = _schema_from_checksum(spark, cfg) or spark.read.format("delta").load(path).schema
    want = [(f.name.lower(), f.dataType.simpleString()) for f in expected.fields]
    have = [(f.name.lower(), f.dataType.simpleString()) for f in actual.fields]
    if want != have:
        raise ShardSchemaChanged(f"Delta table {path} has columns {have}, the sink expects {want}", sink=cfg.name)


def _read_text(spark: SparkSession, path: str) -> str | None:
    """A small file's text through the Hadoop FileSystem (None if it does not exist)."""
    fs, p = _fs(spark, path)
    if not fs.exists(p):
        return None
    stream = fs.open(p)
    try:
        return _jvm(spark).org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def _checksum(spark: SparkSession, cfg: SinkConfig, version: int | None = None) -> dict | None:
    """The version checksum Delta writes beside a commit (``<version>.crc``: metadata, protocol,
    set transactions), or None if it is missing or unreadable (then ask Delta itself)."""
    try:
        if version is None:
            version = latest_version(spark, cfg)
        text = _read_text(spark, f"{_log_path(cfg)}/{version:020d}.crc")
        return None if text is None else json.loads(text)
    except Exception:  # noqa: BLE001 - only an optimisation: callers fall back to Delta
        return None


def _schema_from_checksum(spark: SparkSession, cfg: SinkConfig) -> StructType | None:
    try:
        crc = _checksum(spark, cfg) or {}
        return StructType.fromJson(json.loads(crc["metadata"]["schemaString"]))
    except (TypeError, KeyError, ValueError):
        return None


def read_updates(spark: SparkSession, cfg: SinkConfig, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table_path(cfg))


def read_as_of(spark: SparkSession, cfg: SinkConfig, t: int) -> tuple[DataFrame, DataFrame]:
    """The shard as of time ``t``, consolidated: (ok rows with ``_count``, errors with ``_count``).

    Exact for ``t >= since`` (the caller checks the shard's since in the metadata table).
    """
    from reconcile.differential import as_of

    snap = as_of(cfg, read_updates(spark, cfg), t).withColumnRenamed("_diff", "_count")
    ok = snap.where(F.col("_error").isNull()).drop("_error")
    errors = snap.where(F.col("_error").isNotNull()).select("_error", "_count")
    return ok, errors


def _log_path(cfg: SinkConfig) -> str:
    return f"{table_path(cfg)}/_delta_log"


def log_versions(spark: SparkSession, cfg: SinkConfig) -> list[int]:
    """The versions whose commit files are in the Delta log, ascending.

    Reads the log's file names (one listing) instead of ``DeltaTable.history()``, which runs a
    Spark job per call (~0.3 s against ~0.02 s); a commit file appears atomically (Delta's
    put-if-absent), so the highest name is the latest version.
    """
    fs, pattern = _fs(spark, f"{_log_path(cfg)}/*.json")
    found = fs.globStatus(pattern) or []
    names = [st.getPath().getName() for st in found]
    return sorted(int(n[:-5]) for n in names if n[:-5].isdigit())


def _committed_versions(spark: SparkSession, cfg: SinkConfig) -> list[int]:
    versions = log_versions(spark, cfg)
    if not versions:
        raise Retryable(f"the Delta table at {table_path(cfg)} has no commits", sink=cfg.name)
    return versions


def latest_version(spark: SparkSession, cfg: SinkConfig) -> int:
    return _committed_versions(spark, cfg)[-1]


def _commit_actions(spark: SparkSession, cfg: SinkConfig, version: int) -> list[dict]:
    """The actions of one Delta version, read from its commit file (one JSON object per line)."""
    text = _read_text(spark, f"{_log_path(cfg)}/{version:020d}.json")
    if text is None:  # listed a moment ago: removed by Delta's log cleanup meanwhile
        raise Retryable(f"Delta commit file of version {version} under {_log_path(cfg)} is gone", sink=cfg.name)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _info_of(actions: list[dict]) -> dict:
    return next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def _guard_txn(cfg: SinkConfig, actions: list[dict]) -> int | None:
    """The ``txnVersion`` a version's actions record for the sink's commit guard, if any."""
    return next((int(a["txn"]["version"]) for a in actions if a.get("txn", {}).get("appId") == app_id(cfg)), None)


def commit_info(spark: SparkSession, cfg: SinkConfig, version: int) -> dict:
    """The ``commitInfo`` action of one Delta version."""
    return _info_of(_commit_actions(spark, cfg, version))


def last_txn_version(spark: SparkSession, cfg: SinkConfig, as_of: int) -> int | None:
    """The last ``txnVersion`` the sink's commit guard recorded (``txn`` action of the app id) in
    Delta versions up to ``as_of`` (the version the caller read), from the checksum of that
    version or else the commit files from ``as_of`` back; None if none is left in the log."""
    versions = [v for v in log_versions(spark, cfg) if v <= as_of]
    crc = _checksum(spark, cfg, versions[-1]) if versions else None
    if crc is not None and isinstance(crc.get("setTransactions"), list):
        mine = [t for t in crc["setTransactions"] if t.get("appId") == app_id(cfg)]
        return int(mine[0]["version"]) if mine else None
    for v in reversed(versions):
        txn = _guard_txn(cfg, _commit_actions(spark, cfg, v))
        if txn is not None:
            return txn
    return None


def reconcile_meta(info: dict) -> dict | None:
    """The sink's own commit metadata (``userMetadata["reconcile"]``), None for foreign commits."""
    try:
        meta = json.loads(info.get("userMetadata") or "").get(META_KEY)
    except (ValueError, AttributeError):
        return None
    return meta if isinstance(meta, dict) else None


MAINTENANCE = "maintenance"


def describe_commit(actions: list[dict]) -> dict | None:
    """What the sink makes of one Delta version: its own commit metadata; for a foreign commit
    that changes no data (``VACUUM START``/``END``, ``OPTIMIZE``, table properties: no
    ``add``/``remove`` with ``dataChange``) ``{"op": "maintenance", ...}``; None for a foreign
    commit that changes data (drift the next batch repairs and measures)."""
    info = _info_of(actions)
    meta = reconcile_meta(info)
    if meta is not None:
        return meta
    changes = [a.get("add") or a.get("remove") or {} for a in actions if "add" in a or "remove" in a]
    if any(c.get("dataChange", True) for c in changes):
        return None
    return {"op": MAINTENANCE, "operation": info.get("operation")}


def log_entries(
    spark: SparkSession, cfg: SinkConfig, after: int
) -> tuple[int, list[tuple[int, dict | None, int | None]]]:
    """(latest version, [(version, :func:`describe_commit`, the ``txnVersion`` the version
    records for the sink's commit guard or None)] for versions > after, ascending)."""
    versions = _committed_versions(spark, cfg)
    entries = []
    for v in versions:
        if v > after:
            actions = _commit_actions(spark, cfg, v)
            entries.append((v, describe_commit(actions), _guard_txn(cfg, actions)))
    return versions[-1], entries


def history_since(spark: SparkSession, cfg: SinkConfig, after: int) -> tuple[int, list[tuple[int, dict | None]]]:
    """(latest version, [(version, :func:`describe_commit`)] for versions > after, ascending)."""
    latest, entries = log_entries(spark, cfg, after)
    return latest, [(v, meta) for v, meta, _ in entries]


def batch_commits(entries: list[tuple[int, dict | None]]) -> list[CommitRecord]:
    return [
        CommitRecord(
            version=v,
            batch_id=m["batch_id"],
            lower=int(m["lower"]),
            upper=int(m["upper"]),
            run_id=m.get("run_id"),
            rows_ok=m.get("rows_ok"),
            rows_err=m.get("rows_err"),
            source_offset=m.get("source_offset"),
            late_commands=m.get("late_commands"),
        )
        for v, m in entries
        if m and m.get("op") == "batch"
    ]


def commit_batch(spark: SparkSession, cfg: SinkConfig, updates: DataFrame, meta: dict) -> None:
    """Append one batch as one Delta version, idempotently keyed by its lower."""
    cols = [f"`{c}`" for c in cfg.column_names] + ["_error", "_time", "_diff"]
    (
        writer(updates.select(*cols), {"op": "batch", "sink": cfg.name, **meta}, "append")
        .option("txnAppId", app_id(cfg))
        .option("txnVersion", int(meta["lower"]))
        .save(table_path(cfg))
    )


# -- staged files (Hadoop FileSystem, so the same code works on object storage) -----------------


def _jvm(spark: SparkSession) -> Any:
    """The py4j gateway's JVM view (classic Spark; not Spark Connect)."""
    jvm = spark._jvm
    assert jvm is not None, "the sink needs a classic SparkSession (py4j), not Spark Connect"
    return jvm


def _fs(spark: SparkSession, path: str):
    p = _jvm(spark).org.apache.hadoop.fs.Path(path)
    return p.getFileSystem(spark._jsc.hadoopConfiguration()), p


def list_files(spark: SparkSession, path: str) -> dict[str, int]:
    """{relative path: size} of the data files below ``path`` (empty if it does not exist).

    A directory deleted while it is listed (another attempt's cleanup) is listed again; one
    that is gone is empty."""
    fs, root = _fs(spark, path)
    for attempt in range(3):
        if not fs.exists(root):
            return {}
        try:
            return _list_files(fs, root)
        except Exception:  # noqa: BLE001 - FileNotFoundException from a concurrent delete
            if attempt == 2:
                raise
    return {}


def _list_files(fs, root) -> dict[str, int]:
    base = fs.makeQualified(root).toString().rstrip("/") + "/"
    it = fs.listFiles(root, True)
    out = {}
    while it.hasNext():
        st = it.next()
        full = st.getPath().toString()
        rel = full[len(base) :] if full.startswith(base) else full
        name = rel.rsplit("/", 1)[-1]
        if name.startswith(("_", ".")):
            continue
        out[rel] = int(st.getLen())
    return out


def list_dirs(spark: SparkSession, path: str) -> list[str]:
    fs, root = _fs(spark, path)
    try:
        return [st.getPath().getName() for st in fs.listStatus(root) if st.isDirectory()] if fs.exists(root) else []
    except Exception:  # noqa: BLE001 - deleted between exists() and listStatus()
        if fs.exists(root):
            raise
        return []


def path_exists(spark: SparkSession, path: str) -> bool:
    fs, p = _fs(spark, path)
    return bool(fs.exists(p))


def delete_path(spark: SparkSession, path: str) -> bool:
    fs, p = _fs(spark, path)
    return bool(fs.delete(p, True)) if fs.exists(p) else False


def write_staged(spark: SparkSession, cfg: SinkConfig, batch_id: str, stage_id: str, corr: DataFrame) -> str:
    """Stage one write attempt's correction in a directory no other attempt writes to."""
    path = staging_path(cfg, batch_id, stage_id)
    corr.write.mode("errorifexists").partitionBy("_part").parquet(path)
    return path


def read_staged(spark: SparkSession, cfg: SinkConfig, path: str, files: list[str] | None = None) -> DataFrame:
    """The staged rows under ``path`` (one write attempt), or exactly ``files`` (paths relative to
    it, as the manifest names them): no other file is ever read."""
    reader = spark.read.schema(schema(cfg, with_part=True))
    if files is None:
        return reader.parquet(path)
    if not files:
        return spark.createDataFrame([], schema(cfg, with_part=True))
    return reader.option("basePath", path).parquet(*[f"{path}/{f}" for f in sorted(files)])


def _stats_aggregates(cfg: SinkConfig) -> list:
    h = F.xxhash64(*[F.col(f"`{c}`") for c in cfg.column_names], "_error", "_time", "_diff")
    return [
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.when(F.col("_error").isNotNull(), 1).otherwise(0)).alias("err"),
        F.sum(F.abs("_diff")).alias("weight"),
        F.sum(h.cast("decimal(38,0)")).cast("string").alias("checksum"),
    ]


def _stats_of(r) -> dict:
    return {"rows": int(r["rows"]), "err": int(r["err"]), "weight": int(r["weight"]), "checksum": r["checksum"]}


def partition_stats(cfg: SinkConfig, staged: DataFrame) -> dict[int, dict]:
    """Per partition: rows, ok/err rows, checksum (sum of a row hash; order-independent)."""
    rows = staged.groupBy("_part").agg(*_stats_aggregates(cfg)).collect()
    return {int(r["_part"]): _stats_of(r) for r in rows}


def added_files(actions: list[dict]) -> list[str]:
    """The data files a Delta version added (paths relative to the table, decoded)."""
    from urllib.parse import unquote

    return [unquote(a["add"]["path"]) for a in actions if "add" in a]


def committed_stats(spark: SparkSession, cfg: SinkConfig, versions: dict[int, int]) -> dict[int, dict[int, dict]]:
    """Per Delta version (``{version: its batch's partition count P}``) and hash partition: the
    statistics of the rows that version added, in one Spark job. Versions whose added files are
    no longer all on storage (vacuumed after a compaction) are left out: not verifiable."""
    from reconcile.differential import partition_of

    root = table_path(cfg)
    present = set(list_files(spark, root))
    out: dict[int, dict[int, dict]] = {}
    owner: list[tuple[str, int, int]] = []
    for v, parts in versions.items():
        files = added_files(_commit_actions(spark, cfg, v))
        if all(f in present for f in files):
            out[v] = {}
            owner += [(f, v, parts) for f in files]
    if not owner:
        return out
    by_file = spark.createDataFrame(
        [(f.rsplit("/", 1)[-1], v, parts) for f, v, parts in owner], "_file STRING, _version BIGINT, _parts INT"
    )
    rows = (
        spark.read.schema(schema(cfg))
        .parquet(*[f"{root}/{f}" for f, _, _ in owner])
        .withColumn("_file", F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1))
        .join(F.broadcast(by_file), "_file")
        .withColumn("_part", partition_of(cfg, F.col("_parts")))
        .groupBy("_version", "_part")
        .agg(*_stats_aggregates(cfg))
        .collect()
    )
    for r in rows:
        out[int(r["_version"])][int(r["_part"])] = _stats_of(r)
    return out

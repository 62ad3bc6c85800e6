"""The shard as Spark DataFrames: the Delta table read as of any time, staged corrections written
and read, statistics of rows. Spark jobs only (write, compact, deep checks); the control plane
uses :class:`reconcile.storage.delta.ShardTable`, which needs no JVM.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from reconcile.config import SinkConfig
from reconcile.differential import HASH_COLUMN, key_order, with_row_key
from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name
from reconcile.storage import layout
from reconcile.storage.commits import added_files
from reconcile.storage.delta import ShardTable
from reconcile.storage.layout import PART_COLUMN, part_of


def schema(cfg: SinkConfig, *, with_part: bool = False, keyed: bool = False) -> StructType:
    """The shard's columns (``keyed``: and the row key, :data:`~reconcile.model.ROW_KEYS`)."""
    keys = "".join(f", {spark_name(k)} BIGINT" for k in ROW_KEYS) if keyed else ""
    return _parse_ddl(cfg.ddl + keys + (", `_part` INT" if with_part else ""))


@lru_cache(maxsize=256)
def _parse_ddl(ddl: str) -> StructType:
    parsed = StructType.fromDDL(ddl)  # a round trip to the JVM's parser (~50 ms): parse once
    assert isinstance(parsed, StructType)
    return parsed


def holds_nothing(table: ShardTable, version: int) -> bool:
    """Whether the shard's table at ``version`` has no data file (a new shard's first batch): the
    log replayed in this process. False when it cannot tell (it then reads through Delta)."""
    try:
        return table.plain_files(version) == []
    except Exception:  # noqa: BLE001 - no such version, or a reader feature: not known to be empty
        return False


def update_rows(table: ShardTable, version: int) -> int | None:
    """How many update rows the table's files hold at ``version`` (their ``numRecords``
    statistics, from the log replayed in this process; None when a file has none)."""
    try:
        counts = table.snapshot(version).get_add_actions(flatten=True).column("num_records").to_pylist()
    except Exception:  # noqa: BLE001 - no such version, or an unreadable log: not known
        return None
    return None if any(c is None for c in counts) else int(sum(counts))


def read_updates(spark: SparkSession, table: ShardTable, version: int | None = None) -> DataFrame:
    """The shard's update log at Delta ``version`` (latest: None). The files the log names are read
    as plain Parquet when they can be (:meth:`ShardTable.plain_files`: the log is
    replayed in this process, not by a Spark job of Delta's); else through Delta's reader."""
    cfg = table.cfg
    try:
        files = table.plain_files(version)
    except Exception:  # noqa: BLE001 - no such table or version: Delta's reader says so in its words
        files = None
    if files is not None:
        if not files:
            return spark.createDataFrame([], schema(cfg))
        return spark.read.schema(schema(cfg)).parquet(*files)
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table.path)


def read_files_holding(
    spark: SparkSession, table: ShardTable, version: int, column: str, ranges: list
) -> tuple[DataFrame, int, int] | None:
    """The shard's update log at ``version`` restricted to the files whose key statistics meet
    one of ``ranges`` (:meth:`ShardTable.files_holding`): every update of the keys in them, and
    maybe others. (frame, files read, files in the table); None where files cannot be told apart."""
    found = table.files_holding(version, column, ranges)
    if found is None:
        return None
    kept, total = found
    frame = (
        spark.read.schema(schema(table.cfg)).parquet(*kept) if kept else spark.createDataFrame([], schema(table.cfg))
    )
    return frame, len(kept), total


@dataclass(frozen=True)
class KeyedRead:
    """How :func:`read_keyed` read the shard: its update rows whose stored row key was taken as
    stored (``stored``) and those hashed when read (``hashed``; None: not counted, the table was
    read through Delta's reader)."""

    stored: int
    hashed: int | None

    def line(self) -> str:
        if self.hashed is None:
            return "every row's key hashed when read (the table is read through Delta's reader)"
        return f"{self.stored} row key(s) read as stored, {self.hashed} hashed when read"


def read_keyed(spark: SparkSession, table: ShardTable, version: int) -> tuple[DataFrame, KeyedRead]:
    """The shard's update log at Delta ``version`` with each row's key
    (:data:`~reconcile.model.ROW_KEYS`): as stored in the files the sink wrote itself (under its
    batches' and compactions' directories, every row with a key: :meth:`ShardTable.keyed_files`),
    so that a read of the key, ``_time`` and ``_diff`` reads those columns only; hashed from the
    row for every other file (a foreign writer's, or one written before the key was stored, whose
    rows read it as null) and wherever the table must be read through Delta's reader."""
    cfg = table.cfg
    split = table.keyed_files(version)
    if split is None:
        return with_row_key(cfg, read_updates(spark, table, version).drop(*ROW_KEYS)), KeyedRead(0, None)
    keyed, other, stored, hashed = split
    sides = []
    if keyed:
        sides.append(spark.read.schema(schema(cfg, keyed=True)).parquet(*keyed))
    if other:
        sides.append(with_row_key(cfg, spark.read.schema(schema(cfg)).parquet(*other)))
    if not sides:
        return spark.createDataFrame([], schema(cfg, keyed=True)), KeyedRead(0, 0)
    out = sides[0]
    for more in sides[1:]:
        out = out.unionByName(more)
    return out, KeyedRead(stored, hashed)


def wrong_row_keys(spark: SparkSession, table: ShardTable, version: int | None = None) -> list[str]:
    """One line per data file whose stored row key differs from its row's (``check --deep``):
    in a file of the sink's own, a batch would take the wrong key as stored (a violation); in
    another writer's file the key is hashed when read, so the line says it is harmless."""
    from reconcile.differential import row_key

    if not table.keyed:
        return []
    version = table.latest_version() if version is None else version
    split = table.keyed_files(version)
    files = (split[0] + split[1]) if split is not None else table.plain_files(version) or []
    if not files:
        return []
    own = set(split[0]) if split is not None else set()
    k1, k2 = row_key(table.cfg)
    stored = [F.col(spark_name(k)) for k in ROW_KEYS]
    wrong = (
        spark.read.schema(schema(table.cfg, keyed=True))
        .parquet(*files)
        .where(stored[0].isNotNull() & ((stored[0] != k1) | (stored[1] != k2)))
        .groupBy(F.col("_metadata.file_path").alias("file"))
        .count()
        .collect()
    )
    out = []
    for r in wrong:
        path = str(r["file"]).removeprefix("file:")
        trusted = any(path.endswith(f.removeprefix(table.path)) for f in own)
        where = "the sink's own file (a batch reads it as stored)" if trusted else "a file the sink hashes when read"
        out.append(f"{r['count']} row(s) of {path} carry a stored row key that differs from the row's: {where}")
    return out


def read_as_of(spark: SparkSession, table: ShardTable, t: int) -> tuple[DataFrame, DataFrame]:
    """The shard as of time ``t``, consolidated: (ok rows with ``_count``, errors with ``_count``).

    Exact for ``t >= since`` (the caller checks the shard's since in the ledger).
    """
    from reconcile.differential import as_of

    snap = as_of(table.cfg, read_updates(spark, table), t).withColumnRenamed("_diff", "_count")
    ok = snap.where(F.col("_error").isNull()).drop("_error")
    errors = snap.where(F.col("_error").isNotNull()).select("_error", "_count")
    return ok, errors


def write_staged(
    spark: SparkSession, table: ShardTable, batch_id: str, stage_id: str, corr: DataFrame, checks=None
) -> tuple[str, dict[int, dict]]:
    """Stage one write attempt's correction in a directory no other attempt writes to; returns
    the directory and, per partition with rows, their statistics (:func:`_stats_aggregates`),
    observed while writing (no second read of the staged files). ``checks``
    (:class:`reconcile.checksums.BatchChecks`): the correction's checksums join that observation
    and count into the shard's side."""
    from pyspark.sql import Observation

    cfg = table.cfg
    path = table.staging_path(batch_id, stage_id)
    observation = Observation(f"staged-{stage_id}")
    corr = corr.withColumn(STATS_HASH, stats_hash(cfg))  # hashed once a row, not once an aggregate
    aggregates, tmp = [F.expr(text) for p in range(cfg.partitions) for text in _stats_sql(p)], [STATS_HASH]
    if checks is not None:
        if HASH_COLUMN in corr.columns:  # the row hash the correction carries: nothing to add
            aggregates += checks.hashed_aggregates("correction")
        else:
            corr, more, added = checks.aggregates(corr, "correction")
            aggregates += more
            tmp += added
        checks.attach(observation, "correction", dict(checks.correction_into))
    corr = corr if all(k in corr.columns for k in ROW_KEYS) else with_row_key(cfg, corr)
    observed = corr.observe(observation, *aggregates).drop(*tmp, HASH_COLUMN)
    out = observed.withColumnRenamed("_part", PART_COLUMN)
    writer = out.write
    if key_order(cfg):  # an upsert shard's layout: sorted by key, cut into files of narrow key ranges
        out = out.sortWithinPartitions(PART_COLUMN, *[spark_name(k) for k in key_order(cfg)])
        writer = out.write.option("maxRecordsPerFile", layout.ROWS_PER_FILE)
    writer.mode("error").partitionBy(PART_COLUMN).parquet(path)
    got = observation.get
    stats = {p: _stats_of(got, f"_{p}") for p in range(cfg.partitions) if got.get(f"rows_{p}")}
    return path, stats


def read_staged(spark: SparkSession, cfg: SinkConfig, path: str, files: list[str] | None = None) -> DataFrame:
    """The staged rows under ``path`` (one write attempt), or exactly ``files`` (paths relative to
    it, as the manifest names them): no other file is ever read."""
    if files is not None and not files:
        return spark.createDataFrame([], schema(cfg, with_part=True))
    reader = spark.read.schema(_parse_ddl(f"{cfg.ddl}, {spark_name(PART_COLUMN)} INT")).option("basePath", path)
    found = reader.parquet(path) if files is None else reader.parquet(*[f"{path}/{f}" for f in sorted(files)])
    return found.withColumnRenamed(PART_COLUMN, "_part")


# The statistics of a set of updates, per hash partition (manifests, commit checks).
STATS = ("rows", "err", "weight", "checksum", "net")
STAT_COLUMNS = ("rows", "err", "weight", "checksum", "checksum_high", "net")  # what _stats_aggregates names


STATS_HASH = "_st_h"  # the statistics' row hash, as a column while a staged write observes it


def stats_hash(cfg: SinkConfig):
    """The hash the statistics' checksum sums: ``xxhash64(row, _error, _time, _diff)``."""
    return F.xxhash64(*[F.col(spark_name(c)) for c in cfg.column_names], "_error", "_time", "_diff")


def _stats_aggregates(cfg: SinkConfig, where=None, h=None) -> list:
    """rows, error rows, weight (sum of |diff|), checksum (the exact sum of a row hash,
    :func:`stats_hash`, or ``h`` where a column holds it, as its two 32-bit limbs:
    order-independent) and net (sum of diff) of the rows, or of those matching ``where``
    (:func:`_stats_of` reads them). BIGINT sums throughout: a limb's sum is exact below 2^31 rows
    (Spark fails the job past that)."""
    h = stats_hash(cfg) if h is None else h
    keep = F.lit(True) if where is None else where
    return [
        F.sum(F.when(keep, 1).otherwise(0)).alias("rows"),
        F.sum(F.when(keep & F.col("_error").isNotNull(), 1).otherwise(0)).alias("err"),
        F.sum(F.when(keep, F.abs("_diff")).otherwise(0)).alias("weight"),
        F.sum(F.when(keep, h.bitwiseAND(F.lit(0xFFFFFFFF))).otherwise(0)).alias("checksum"),
        F.sum(F.when(keep, F.shiftright(h, 32)).otherwise(0)).alias("checksum_high"),
        F.sum(F.when(keep, F.col("_diff")).otherwise(0)).alias("net"),
    ]


def _checksum_text(low, high) -> str:
    """The sum of the row hashes (signed 64-bit) from its limbs' sums, in decimal."""
    return str(int(low or 0) + (int(high or 0) << 32))


def _stats_sql(p: int) -> list[str]:
    """:func:`_stats_aggregates` of partition ``p`` over a frame carrying ``_part`` and the
    statistics' row hash (:data:`STATS_HASH`), as Spark SQL (one parse each, not a call to the JVM
    per node: a write observes six a partition), named as :data:`STAT_COLUMNS` with ``_p``."""
    mine, h = f"`_part` = {p}", f"`{STATS_HASH}`"
    values = ("1", "1", "abs(`_diff`)", f"{h} & 4294967295", f"shiftright({h}, 32)", "`_diff`")
    where = (mine, f"{mine} AND `_error` IS NOT NULL", mine, mine, mine, mine)
    return [
        f"sum(CASE WHEN {cond} THEN {value} ELSE 0 END) AS `{name}_{p}`"
        for name, value, cond in zip(STAT_COLUMNS, values, where, strict=True)
    ]


def _stats_of(r, suffix: str = "") -> dict:
    out: dict[str, int | str] = {k: int(r[f"{k}{suffix}"] or 0) for k in STATS if k != "checksum"}
    out["checksum"] = _checksum_text(r[f"checksum{suffix}"], r[f"checksum_high{suffix}"])
    return out


def _partition_by(cfg: SinkConfig, parts: Column, by: Column) -> Column:
    """The hash partition of each row under the partitioning its batch recorded (``by``: a
    column holding ``"key"`` or null), for rows of batches written under different ones."""
    from reconcile.differential import KEY, partition_of

    row = partition_of(cfg, parts, by=None)
    if not cfg.partition_key:
        return row
    return F.when(by == F.lit(KEY), partition_of(cfg, parts, by=KEY)).otherwise(row)


def committed_stats(
    spark: SparkSession, table: ShardTable, versions: dict[int, tuple[int, str | None]]
) -> dict[int, dict[int, dict]]:
    """Per Delta version (``{version: its batch's partitioning (P, by)}``: ``Manifest.partitioning``) and hash partition: the
    statistics of the rows that version added, in one Spark job. Versions whose added files are
    no longer all on storage (vacuumed after a compaction) are left out: not verifiable."""

    cfg, root = table.cfg, table.path
    present = set(table.files())
    out: dict[int, dict[int, dict]] = {}
    owner: list[tuple[str, int, int, str | None]] = []
    for v, (parts, by) in versions.items():
        # a partition's files (not the shard rewritten into a new schema in the batch's version)
        files = [a["path"] for a in added_files(table.commit_actions(v)) if part_of(a["path"]) is not None]
        if all(f in present for f in files):
            out[v] = {}
            owner += [(f, v, parts, by) for f in files]
    if not owner:
        return out
    by_file = spark.createDataFrame(owner, "_file STRING, _version BIGINT, _parts INT, _by STRING")
    rows = (
        spark.read.schema(schema(cfg))
        .parquet(*[f"{root}/{f}" for f, _, _, _ in owner])
        # the path inside the table (Spark names the files of one job alike in every directory)
        .withColumn("_file", F.substring_index(F.col("_metadata.file_path"), f"/{cfg.name}/", -1))
        .join(F.broadcast(by_file), "_file")
        .withColumn("_part", _partition_by(cfg, F.col("_parts"), F.col("_by")))
        .groupBy("_version", "_part")
        .agg(*_stats_aggregates(cfg))
        .collect()
    )
    for r in rows:
        out[int(r["_version"])][int(r["_part"])] = _stats_of(r)
    return out


def checksums_by_time(
    spark: SparkSession, table: ShardTable, partitionings: list[tuple[int, str | None]], version: int
) -> dict[tuple[int, str | None], list[tuple[int, dict[int, int]]]]:
    """Per partitioning ``(P, by)`` (``Manifest.partitioning``): ``[(time, {partition: checksum of the updates at that time})]`` in
    ascending time, of the table as of Delta version ``version``, in one Spark job that returns
    one row per distinct time and partition (:mod:`reconcile.checksums`: the checksum of the
    shard as of ``t`` is the sum over the times ``<= t``)."""
    from collections import defaultdict

    from reconcile.checksums import MOD, WIDE_LIMBS, combine, limbs, row_hash

    cfg = table.cfg
    from reconcile.differential import partition_of

    counts = sorted(set(partitionings), key=lambda x: (x[0], x[1] or ""))
    h, diff = F.col("_h"), F.col("_diff")
    keys = [f"_p{i}" for i in range(len(counts))]
    sums = [f"_l{i}" for i in range(len(WIDE_LIMBS))]
    rows = (
        read_updates(spark, table, version)
        .where(F.col("_time").isNotNull())
        .select("_time", row_hash(cfg).alias("_h"), "_diff", *[spark_name(k) for k in cfg.partition_key])
        .select(
            "_time",
            *[
                (F.pmod(h, F.lit(n)) if by is None else partition_of(cfg, n, by=by)).cast("int").alias(k)
                for (n, by), k in zip(counts, keys, strict=True)
            ],
            *[c.alias(s) for c, s in zip(limbs(h, diff, WIDE_LIMBS), sums, strict=True)],
        )
        .groupBy("_time", *keys)
        .agg(*[F.sum(s).alias(s) for s in sums])
        .collect()
    )
    out: dict[tuple[int, str | None], list[tuple[int, dict[int, int]]]] = {}
    for n, k in zip(counts, keys, strict=True):
        by_time: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for r in rows:
            part = by_time[int(r["_time"])]
            part[int(r[k])] = (part[int(r[k])] + combine([r[s] for s in sums], WIDE_LIMBS)) % MOD
        out[n] = [(t, dict(by_time[t])) for t in sorted(by_time)]
    return out

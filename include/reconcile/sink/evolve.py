"""The shard rewritten into its sink file's schema, staged with the batch that applies it (issue
52): a numeric type widened, a column dropped, renamed (``renamed_from``) or the columns reordered
change the row key of every row (``xxhash64`` over the row's columns in order, with their types),
so the write of the batch that meets such a change projects the shard's updates into the new
schema, each row with a fresh key (:func:`projected`), computes its correction against that
projection as persist, and stages the projection too (:func:`stage_rewrite`), under the write
attempt's own directory (``batches/<batch>/<stage>/rewrite/``) beside the correction. Its
manifest records it (:class:`reconcile.manifest.Rewrite`: the Delta version read, the files with
their sizes and digests, the rows).

The append commits both in **one Delta version**: every file of the version the write read
removed, the rewritten files and the correction added, the new schema, the application
transaction of the batch's ``lower``, the batch in the commit metadata with ``schema_change``
and ``rekeyed`` (:meth:`reconcile.storage.delta.ShardTable.commit_files` with ``rewrite_of``):
as the version right after the one read or never, under the commit lease and the correction
guard (the rewritten rows count: :mod:`reconcile.sink.guard`). Every update keeps its time and
diff (values cast to the wider type, renamed, the dropped column gone; rows that become equal
stay separate updates of the same row), ``since`` does not move: every read as of any time at or
after ``since`` holds what it held, projected into the new schema. Carried checksums are never
carried across a ``rekeyed`` commit, and ``check`` does not verify the batches committed before
it (their recorded checksums hash the old columns).

A crash anywhere leaves the old table (nothing committed: the retry or the next run stages the
batch again; the staged files of an attempt never committed are deleted as any are) or the new
one (committed: the sync absorbs the batch). A table that moved after the write read it (a
compaction, a foreign commit) makes the append refuse the staged batch: its write stages it
again against the table as it is.

Why not in place: Delta's type widening and column mapping, which delta-rs 1.6.6 does not both
read and commit correctly (docs/design.md, "A sink file's schema change").
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from reconcile.differential import with_row_key
from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name
from reconcile.storage import files, footers
from reconcile.storage.delta import ShardTable
from reconcile.storage.schema_change import SchemaPlan

REKEYED = "rekeyed"  # the commit metadata's flag: the row keys (and checksums) changed here
REWRITE_DIR = "rewrite"  # the rewritten shard, inside the write attempt's directory


def projected(spark: SparkSession, table: ShardTable, version: int, plan: SchemaPlan) -> DataFrame:
    """The shard's updates at ``version`` in the sink file's schema: read with the table's own
    schema, each column of the file from the one it was (``renamed_from``), cast to its type, a
    new column null; a fresh row key. Deterministic: the correction computed against it and the
    files :func:`stage_rewrite` writes from it hold the same rows."""
    cfg = table.cfg
    dt = table.snapshot(version)
    old = StructType.fromJson(json.loads(dt.schema().to_json()))
    plain = table.plain_files(version)
    if plain is None:
        rows = spark.read.format("delta").option("versionAsOf", version).load(table.path)
    elif not plain:
        rows = spark.createDataFrame([], old)
    else:
        rows = spark.read.schema(old).parquet(*plain)
    have = {f.name.lower(): f.name for f in old.fields}
    renamed = {c.column: c.old for c in plan.changes if c.what == "renamed"}
    cols = []
    for c in cfg.columns:
        src = have.get((renamed.get(c.name.lower()) or c.name).lower())
        value = F.col(spark_name(src)) if src is not None else F.lit(None)
        cols.append(value.cast(c.type).alias(c.name))
    out = rows.select(*cols, "_error", F.col("_time").cast("bigint"), F.col("_diff").cast("bigint"))
    return with_row_key(cfg, out)


def stage_rewrite(spark: SparkSession, table: ShardTable, version: int, plan: SchemaPlan, path: str) -> int:
    """Write :func:`projected` as plain Parquet under ``<path>/rewrite/`` (``path``: the write
    attempt's directory); returns the rows written."""
    cfg = table.cfg
    keep = [spark_name(c) for c in cfg.column_names] + ["_error", "_time", "_diff", *ROW_KEYS]
    out = f"{path}/{REWRITE_DIR}"
    projected(spark, table, version, plan).select(*keep).write.mode("error").parquet(out)
    return sum(
        int(footers.file_stats(f"{out}/{f}")["numRecords"]) for f in files.list_files(out) if f.endswith(".parquet")
    )

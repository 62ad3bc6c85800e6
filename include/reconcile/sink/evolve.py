"""The shard rewritten into its sink file's schema (issue 52): a numeric type widened, a column
dropped, renamed (``renamed_from``) or the columns reordered change the row key of every row
(``xxhash64`` over the row's columns in order, with their types), so the write of the run that
meets such a change first rewrites the shard's files into the new schema, each row with a fresh
key, before it computes its correction.

The rewrite is a compaction's commit without advancing ``since``: every update keeps its time
and diff (values cast to the wider type, renamed, the dropped column gone; rows that become
equal stay separate updates of the same row), written by Spark as plain Parquet into
``compactions/<read version>-<token>/`` and committed by delta-rs as one overwrite that replaces
every file of the version it read and carries the new schema, as the version right after that
one or never, under the shard's commit lease. So every read as of any time at or after
``since`` holds what it held, projected into the new schema. Its commit metadata says
``schema_change`` and ``rekeyed``: carried checksums are never carried across it, and ``check``
counts the batches committed before it as not verifiable (their recorded checksums hash the old
columns). A write killed after the rewrite's commit (``write.after_schema_rewrite``) finds the
table in the new schema when retried; one killed before leaves a rewrite no commit names, which
the garbage collection of compactions deletes.

Why not in place: Delta's type widening and column mapping, which delta-rs 1.6.6 does not both
read and commit correctly (docs/design.md, "A sink file's schema change").
"""

from __future__ import annotations

import json
import logging
import uuid

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from reconcile.differential import with_row_key
from reconcile.failpoints import failpoint
from reconcile.log import event
from reconcile.model import ROW_KEYS
from reconcile.sql_names import spark_name
from reconcile.storage import files, footers, layout
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.schema_change import SchemaPlan

log = logging.getLogger(__name__)

REKEYED = "rekeyed"  # the commit metadata's flag: the row keys (and checksums) changed here


def projected(spark: SparkSession, table: ShardTable, version: int, plan: SchemaPlan) -> DataFrame:
    """The shard's updates at ``version`` in the sink file's schema: read with the table's own
    schema, each column of the file from the one it was (``renamed_from``), cast to its type, a
    new column null; a fresh row key."""
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


def rewrite(spark: SparkSession, ledger: Ledger, table: ShardTable, plan: SchemaPlan, state: dict) -> int | None:
    """Rewrite the shard into the sink file's schema (``plan`` rewrites) in one commit; returns
    its version, or None when a commit took the version after the one it read (the caller's
    batch is then computed on whatever the table is: it checks the schema again)."""
    cfg = table.cfg
    read_version = table.latest_version()
    recorded = table.last_txn_version(read_version)
    since = ledger.get_shard(cfg.name).since
    token = uuid.uuid4().hex
    name = layout.compaction_dir(read_version, token)
    meta = {
        "op": "compact",
        "since": since,
        "read_version": read_version,
        "token": token,
        "schema_change": plan.describe(),
        REKEYED: True,
    }
    data = projected(spark, table, read_version, plan)
    keep = [spark_name(c) for c in cfg.column_names] + ["_error", "_time", "_diff", *ROW_KEYS]
    path, rel = table.compaction_path(name), f"{layout.COMPACTIONS_DIR}/{name}"
    data.select(*keep).write.mode("error").parquet(path)
    written = [
        (f"{rel}/{f}", size, footers.file_stats(f"{path}/{f}"))
        for f, size in sorted(files.list_files(path).items())
        if f.endswith(".parquet")
    ]
    committed = None
    with ledger.commit_lease(cfg.name, f"schema rewrite from Delta version {read_version} ({token})") as lease:
        if table.latest_version() == read_version:
            committed = table.commit_rewrite(
                written,
                {**meta, "commit_epoch": lease.epoch},
                read_version,
                recorded if recorded is not None else -1,  # the commit guard's record unchanged
                fence=lease.fence,
                schema=table.schema_for_commit(),
            )
    if committed is None:
        files.delete_path(path)  # never committed: no commit can add it any more
        event(
            log,
            f"schema rewrite skipped: a commit took Delta version {read_version + 1} after it read the table",
            level=logging.WARNING,
            **state,
        )
        return None
    failpoint("write.after_schema_rewrite")
    version, removed = committed
    rows = sum(int(s["numRecords"]) for _, _, s in written)
    event(
        log,
        f"rewrote the shard into the sink file's schema ({plan.describe()})",
        delta_version=version,
        rows_rewritten=rows,
        files_removed=removed,
        **state,
    )
    return version


def apply(spark: SparkSession, ledger: Ledger, table: ShardTable, state: dict) -> bool:
    """The write's first step when the sink file's schema change rewrites the shard: whether it
    rewrote it (the batch is then staged anew, whatever an earlier attempt staged)."""
    plan = table.check_schema()
    if not plan.rewrites:
        return False
    _guard(ledger, table, state["batch"])
    rewrite(spark, ledger, table, plan, state)
    table.check_schema()  # the table now has the sink file's schema (or refuses what moved meanwhile)
    return True


def _guard(ledger: Ledger, table: ShardTable, batch_id: str) -> None:
    """A rewrite touches every row: with a correction guard set (and the shard holding its
    ``min_rows``), it waits for the batch's approval, as a batch that changes most rows does."""
    from reconcile.errors import CorrectionBlocked

    cfg = table.cfg
    guard = cfg.correction_guard
    if guard.max_share is None or ledger.get_batch(batch_id, cfg.name).approved:
        return
    plan = table.schema_plan()
    if plan.rows is not None and plan.rows < guard.min_rows:
        return
    raise CorrectionBlocked(
        f"batch {batch_id}: the sink file's schema change ({plan.describe()}) rewrites all {plan.rows} update rows "
        "of the shard before its correction (correction_guard is set); nothing was written",
        sink=cfg.name,
        remedy=f"if the change is intended, approve it: `python -m reconcile approve {cfg.name} {batch_id}`, then "
        "rerun the run's write.",
    )

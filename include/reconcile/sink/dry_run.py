"""``dry-run``: the next batch's correction, written nowhere.

:func:`next_correction` plans the batch a run would mint next and computes its correction: by
DuckDB without a JVM (:func:`correction`), or by Spark as the run computes it
(:func:`spark_correction`) on request or where DuckDB's might differ. The shard's update log is
read as ``show`` reads it (:class:`~reconcile.storage.reads.ShardReader`: DuckDB over the files
delta-rs names); the kind says what the batch changes (:meth:`reconcile.kinds.Kind.preview`, or
:class:`~reconcile.kinds.preview.NotExact` where DuckDB might not compute exactly what Spark
will); the updates are consolidated here, as the write consolidates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconcile import kinds
from reconcile.config import SinkConfig
from reconcile.kinds.preview import NotExact, duck_type, failed
from reconcile.model import ROW_KEYS, FeedProgress
from reconcile.schedule import next_scheduled_frontier, now_ms
from reconcile.sink import guard
from reconcile.sink.mint import next_lower
from reconcile.sql_names import duckdb_name
from reconcile.storage.delta import ShardTable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from reconcile.storage.ledger import Ledger

__all__ = ["DryRun", "NotExact", "Preview", "SparkCorrection", "correction", "next_correction", "spark_correction"]


@dataclass
class Preview:
    """The correction a run would write: its update rows (the sink's columns, ``_error``,
    ``_time``, ``_diff``: the first ``limit``) and their totals."""

    rows: list[dict]
    updates: int
    inserts: int
    retractions: int
    errors: int
    feed: FeedProgress | None = None  # an upsert feed's progress


@dataclass
class SparkCorrection:
    """Spark's correction of the batch: its totals per partition (``per_part``) and its update
    rows (``rows``), frames to show; its totals and an upsert feed's progress."""

    per_part: DataFrame
    rows: DataFrame
    inserts: int
    retractions: int
    feed: FeedProgress | None = None  # an upsert feed's progress


@dataclass
class DryRun:
    """The batch ``[lower, upper)`` a run would mint next (``upper_from``: where its upper comes
    from) and its correction: DuckDB's (``preview``) or Spark's (``spark``), neither when upper
    is not ahead of lower; ``guard``: what the correction guard would do with it."""

    lower: int
    upper: int
    upper_from: str
    preview: Preview | None = None
    spark: SparkCorrection | None = None
    guard: str | None = None


def next_correction(
    ledger: Ledger,
    cfg: SinkConfig,
    frontier: int | None,
    limit: int,
    use_spark: bool,
    start_spark: Callable[[str | None], SparkSession],
) -> DryRun:
    """The next batch up to ``frontier`` (default: the next scheduled run's upper, else now) and
    its correction, by DuckDB (the first ``limit`` rows), or by Spark with ``use_spark`` or where
    DuckDB's might differ: ``start_spark(why)`` gives the session (``why``: DuckDB's refusal;
    None with ``use_spark``). Writes nothing but the shard's ledger row, if it had none."""
    table = ShardTable(cfg)
    ledger.ensure_shard(cfg.name, cfg.as_of)
    lower = next_lower(ledger.get_shard(cfg.name))
    upper, upper_from = _upper(cfg, frontier, lower)
    out = DryRun(lower, upper, upper_from)
    if upper <= lower:
        return out
    why = None
    if not use_spark:
        try:
            out.preview = correction(cfg, table, lower, upper, limit, ledger.watermark(cfg.name))
            out.guard = guard.preview(table, out.preview.inserts, out.preview.retractions)
            return out
        except NotExact as exc:
            why = str(exc)
    out.spark = spark_correction(start_spark(why), ledger, cfg, table, lower, upper)
    out.guard = guard.preview(table, out.spark.inserts, out.spark.retractions)
    return out


def _upper(cfg: SinkConfig, frontier: int | None, lower: int) -> tuple[int, str]:
    """The next batch's upper and where it comes from: ``frontier``, else the next scheduled
    run's, else now."""
    now = now_ms()
    scheduled = next_scheduled_frontier(cfg.schedule, cfg.catchup, lower, now)
    upper = frontier or scheduled or now
    if frontier:
        return upper, "the given frontier"
    if scheduled:
        return upper, f"the next scheduled run's ({cfg.schedule}{', catchup' if cfg.catchup else ''})"
    return upper, "now (the sink has no recurring schedule)"


def spark_correction(
    spark: SparkSession, ledger: Ledger, cfg: SinkConfig, table: ShardTable, lower: int, upper: int
) -> SparkCorrection:
    """The correction of ``[lower, upper)`` as the write stage computes it (the sink's SQL, its
    sources), cached; its totals read by one Spark job."""
    from pyspark.sql import functions as F

    from reconcile import differential
    from reconcile.sink.write import batch_correction
    from reconcile.storage import frames

    persist = frames.read_updates(spark, table) if table.exists() else spark.createDataFrame([], frames.schema(cfg))
    result = batch_correction(spark, ledger, cfg, persist, lower, upper)
    corr = result.updates.cache()
    per_part = corr.groupBy("_part").agg(
        F.count(F.lit(1)).alias("updates"),
        F.sum(F.when(F.col("_error").isNotNull(), 1).otherwise(0)).alias("errors"),
        F.sum(F.when(F.col("_diff") > 0, F.col("_diff")).otherwise(0)).alias("inserts"),
        F.sum(F.when(F.col("_diff") < 0, -F.col("_diff")).otherwise(0)).alias("retractions"),
    )
    totals = per_part.agg(F.sum("inserts"), F.sum("retractions")).collect()[0]
    differential.release()  # what computing it cached: the correction itself is now cached
    feed = result.progress  # observed by the job above
    ordered = per_part.orderBy("_part")
    shown = corr.drop("_part", *ROW_KEYS)  # the sink's columns, _error, _time, _diff
    return SparkCorrection(ordered, shown, int(totals[0] or 0), int(totals[1] or 0), feed)


def correction(
    cfg: SinkConfig, table: ShardTable, lower: int, upper: int, limit: int, watermark: int | None = None
) -> Preview:
    """The correction of the batch ``(lower, upper)`` (``watermark``: an upsert feed's),
    consolidated per (row, ``_error``, ``_time``); the first ``limit`` rows, ok rows first."""
    import duckdb

    from reconcile.storage.reads import UPDATES, ShardReader

    reader = ShardReader(table) if table.exists() else None
    con = reader.con if reader is not None else duckdb.connect()
    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    try:
        if reader is None:  # a shard without a table yet holds nothing
            typed = ", ".join(f"CAST(NULL AS {duck_type(c.type)}) AS {duckdb_name(c.name)}" for c in cfg.columns)
            con.execute(
                f"CREATE TEMP TABLE {UPDATES} AS SELECT {typed}, CAST(NULL AS VARCHAR) AS _error, "
                "CAST(NULL AS BIGINT) AS _time, CAST(NULL AS BIGINT) AS _diff WHERE false"
            )
        con.execute("SET TimeZone = 'UTC'")
        updates = kinds.of(cfg).preview(con, UPDATES, kinds.Bounds(lower, upper, watermark))
        time = updates.time
        con.execute(
            f"CREATE TEMP TABLE reconcile_correction AS SELECT {cols}, _error, CAST({time} AS BIGINT) AS _time, "
            f"CAST(SUM(_diff) AS BIGINT) AS _diff FROM ({updates.sql}) GROUP BY {cols}, _error, {time} "
            "HAVING SUM(_diff) <> 0"
        )
        totals = con.execute(
            "SELECT count(*), coalesce(sum(greatest(_diff, 0)), 0), coalesce(sum(greatest(-_diff, 0)), 0), "
            "count(_error) FROM reconcile_correction"
        ).fetchone()
        assert totals is not None
        n, ins, ret, err = totals
        order = ", ".join(f"{duckdb_name(c)} ASC NULLS FIRST" for c in cfg.column_names)
        cur = con.execute(
            f"SELECT {cols}, _error, _time, _diff FROM reconcile_correction "
            f"ORDER BY _error NULLS FIRST, _time, {order}, _diff LIMIT {int(limit)}"
        )
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        return Preview(rows, int(n), int(ins), int(ret), int(err), updates.feed)
    except duckdb.Error as exc:  # anything DuckDB refuses that the kind did not foresee
        raise failed("compute the correction", exc) from None
    finally:
        con.close()

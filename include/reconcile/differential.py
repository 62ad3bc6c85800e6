"""The correction ``desired - persist`` as pure DataFrame transforms (no I/O here).

An *update frame* has the sink's columns plus ``_error`` (null for ok rows, a message for error
rows), ``_time`` (BIGINT ms) and ``_diff`` (BIGINT). For a description ``(lower, upper)``:

changelog::

    correction = consolidate( advance(desired updates with time < upper)
                            - advance(persist updates with time < upper) ),  advance(t) = max(t, lower)

query (a snapshot, refreshed at ``upper - 1``)::

    correction = consolidate( snapshot - persist as of (upper - 1) ),  all stamped at upper - 1

DESIGN.md reads persist below ``lower``: the sink itself never writes at or after the shard's
upper, so the two agree unless someone wrote updates at times in ``[lower, upper)`` behind the
sink's back. Reading below ``upper`` repairs those too (at their own times for a change log),
so after the batch the shard equals desired at every time below ``upper``.

Both sides carry the same hash partition ``_part = pmod(xxhash64(row, _error), P)``, so updates
that cancel meet in one partition and each partition's correction is computed independently.
"""

from __future__ import annotations

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from reconcile.config import SinkConfig

META = ("_error", "_time", "_diff")


def _q(name: str) -> str:
    return f"`{name}`"


def row_columns(cfg: SinkConfig) -> list[str]:
    return cfg.column_names + ["_error"]


def partition_of(cfg: SinkConfig, partitions: int | SCol | None = None) -> SCol:
    """The hash partition of each row: ``pmod(xxhash64(row, _error), P)``; P defaults to the
    sink's ``partitions`` (a column when rows of batches with different P are mixed)."""
    p = partitions if isinstance(partitions, SCol) else F.lit(partitions or cfg.partitions)
    return F.pmod(F.xxhash64(*[F.col(_q(c)) for c in row_columns(cfg)]), p).cast("int")


def consolidate(cfg: SinkConfig, updates: DataFrame, *, partitioned: bool = True) -> DataFrame:
    """Sum diffs per (row, _error, _time[, _part]); drop zero sums."""
    keys = row_columns(cfg) + ["_time"] + (["_part"] if partitioned else [])
    return (
        updates.groupBy(*[F.col(_q(k)) for k in keys])
        .agg(F.sum("_diff").cast("bigint").alias("_diff"))
        .where(F.col("_diff") != 0)
    )


def correction(cfg: SinkConfig, desired: DataFrame, persist: DataFrame, lower: int, upper: int) -> DataFrame:
    """The correction for ``(lower, upper)``: update frame plus ``_part``.

    ``desired`` is an update frame (a query snapshot has ``_time`` ignored and ``_diff`` = 1 per
    row); ``persist`` is the shard's update log (any times; filtered here).
    """
    assert lower < upper, f"invalid description [{lower}, {upper})"
    cols = row_columns(cfg)
    if cfg.kind == "query":
        stamp_d = stamp_p = F.lit(upper - 1).cast("bigint")
        d = desired
    else:
        d = desired.where(F.col("_time") < upper)
        stamp_d = stamp_p = F.greatest(F.col("_time"), F.lit(lower)).cast("bigint")
    d = d.select(*[F.col(_q(c)) for c in cols], stamp_d.alias("_time"), F.col("_diff").cast("bigint"))
    p = persist.where(F.col("_time") < upper).select(
        *[F.col(_q(c)) for c in cols], stamp_p.alias("_time"), (-F.col("_diff")).cast("bigint").alias("_diff")
    )
    both = d.unionByName(p).withColumn("_part", partition_of(cfg))
    # Shuffle once by partition; the aggregation below reuses that distribution.
    both = both.repartition(cfg.partitions, "_part")
    return consolidate(cfg, both)


def as_of(cfg: SinkConfig, updates: DataFrame, t: int) -> DataFrame:
    """The consolidated collection as of time ``t``: one row per distinct row, ``_diff`` = count."""
    cols = row_columns(cfg)
    return (
        updates.where(F.col("_time") <= t)
        .groupBy(*[F.col(_q(c)) for c in cols])
        .agg(F.sum("_diff").cast("bigint").alias("_diff"))
        .where(F.col("_diff") != 0)
    )


INTEGRAL = ("tinyint", "smallint", "int", "integer", "bigint")


def lossy(src: SCol, val: SCol, typ: str) -> SCol:
    """True where casting to an integral type dropped a fraction (1.5 -> 1 is an error, not 1)."""
    if typ not in INTEGRAL:
        return F.lit(False)
    exact = src.try_cast("decimal(38,9)")
    return F.coalesce(exact != val.cast("decimal(38,9)"), F.lit(False))


def validate(
    cfg: SinkConfig, raw: DataFrame, diff: SCol, time: SCol | None, extra_problem: SCol | None = None
) -> DataFrame:
    """Cast raw desired rows to the sink's schema; rows that do not fit become error rows.

    A value that cannot be cast, or a null in a non-nullable column, turns the row into an
    error update: all sink columns null, ``_error`` naming the columns and the raw row (as JSON),
    with the row's time and diff. Nothing is dropped.

    Columns whose source type already is the sink's type are taken as they are (no cast, no
    check), and integral sources skip the lost-fraction check: on a typed source (Parquet,
    Delta, a typed query) validation costs next to nothing.
    """
    problems = [] if extra_problem is None else [extra_problem]
    casted = []
    source_types = {f.name.lower(): f.dataType.simpleString() for f in raw.schema.fields}
    for c in cfg.columns:
        src = F.col(_q(c.name))
        have = source_types.get(c.name.lower())
        if have == c.type:
            casted.append(src.alias(c.name))
        else:
            val = src.try_cast(c.type)
            casted.append(val.alias(c.name))
            fraction = F.lit(False) if have in INTEGRAL else lossy(src, val, c.type)
            bad_cast = src.isNotNull() & (val.isNull() | fraction)
            problems.append(F.when(bad_cast, F.lit(f"column '{c.name}' does not fit {c.type}")))
        if not c.nullable:
            problems.append(F.when(src.isNull(), F.lit(f"column '{c.name}' is null but not nullable")))
    if not problems:  # nothing can fail: every column has the sink's type and may be null
        return raw.select(
            *casted,
            F.lit(None).cast("string").alias("_error"),
            (time if time is not None else F.lit(None)).cast("bigint").alias("_time"),
            diff.cast("bigint").alias("_diff"),
        )
    message = F.concat_ws("; ", *problems)
    raw_json = F.to_json(F.struct(*[F.col(_q(c)).cast("string").alias(c) for c in cfg.column_names]))
    error = F.when(message != "", F.concat(message, F.lit(" in row "), raw_json))
    out = raw.select(
        *casted,
        error.alias("_error"),
        (time if time is not None else F.lit(None)).cast("bigint").alias("_time"),
        diff.cast("bigint").alias("_diff"),
    )
    # Error rows keep only the message: their column values live in the message.
    return out.select(
        *[F.when(F.col("_error").isNull(), F.col(_q(c.name))).cast(c.type).alias(c.name) for c in cfg.columns],
        "_error",
        "_time",
        "_diff",
    )

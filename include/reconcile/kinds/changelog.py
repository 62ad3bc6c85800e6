"""Change-log sinks: rows ``(row, time, diff)`` whose history is known and kept.

For a description ``(lower, upper)``, with ``advance(t) = max(t, lower)``::

    correction = consolidate( advance(desired updates with time < upper)
                            - advance(persist updates with time < upper) )

so the batch repairs at ``lower`` any drift in the shard's history and carries the changes in
``[lower, upper)`` at their own times. (Reading persist below ``upper`` rather than ``lower``
also repairs foreign updates written inside ``[lower, upper)``; the sink itself never writes
there before this batch.)
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import ChangelogSink
from reconcile.differential import difference
from reconcile.kinds.decode import lossy, read_source, require_columns, validate
from reconcile.kinds.protocol import CHANGELOG_SOURCE
from reconcile.sql_names import spark_name


def desired(spark: SparkSession, cfg: ChangelogSink) -> DataFrame:
    """The change log as an update frame (bad times and diffs become error rows)."""
    df = read_source(spark, cfg, cfg.source, CHANGELOG_SOURCE)
    require_columns(cfg, df, cfg.column_names + [cfg.time_column, cfg.diff_column], "changelog.source")
    return decode(cfg, df)


def decode(cfg: ChangelogSink, df: DataFrame) -> DataFrame:
    """Changelog rows: a null/zero/non-integer diff or a null time makes an error row (diff 1);
    a time or diff column of a type that is no number (a date, a struct) is refused up front."""
    traw, draw = F.col(spark_name(cfg.time_column)), F.col(spark_name(cfg.diff_column))
    types = {f.name.lower(): f.dataType.simpleString() for f in df.schema.fields}
    t, d = traw.try_cast("bigint"), draw.try_cast("bigint")
    bad_diff = d.isNull() | (d == 0) | lossy(draw, d, "bigint", types.get(cfg.diff_column.lower()))
    bad_time = t.isNull() | lossy(traw, t, "bigint", types.get(cfg.time_column.lower()))
    problem = F.concat_ws(
        "; ",
        F.when(bad_diff, F.lit(f"diff column '{cfg.diff_column}' is null, zero or not an integer")),
        F.when(bad_time, F.lit(f"time column '{cfg.time_column}' is null or not an integer")),
    )
    return validate(
        cfg,
        df,
        CHANGELOG_SOURCE,
        F.when(bad_diff | bad_time, F.lit(1)).otherwise(d),
        F.coalesce(t, F.lit(0)),
        extra_problem=F.when(bad_diff | bad_time, problem),
        counters=(cfg.time_column, cfg.diff_column),
    )


def correction(
    cfg: ChangelogSink, log: DataFrame, persist: DataFrame, lower: int, upper: int, checks=None
) -> DataFrame:
    """The change log's correction for ``(lower, upper)``: update frame plus ``_part`` (``checks``:
    :func:`reconcile.differential.difference`'s)."""
    assert lower < upper, f"invalid description [{lower}, {upper})"
    advance = F.greatest(F.col("_time"), F.lit(lower)).cast("bigint")
    below = F.col("_time") < upper
    return difference(cfg, log.where(below), persist.where(below), advance, checks)

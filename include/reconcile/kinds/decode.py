"""Reading sources and decoding their rows into update frames, shared by every kind.

Rows that do not fit the sink's schema become error updates (:func:`validate`): errors are data,
persisted and corrected like rows, never dropped. A source that is missing or lacks a column is
a :class:`~reconcile.errors.SourceError` and nothing is staged.
"""

from __future__ import annotations

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import SinkConfig, Source
from reconcile.errors import SourceError, brief


def _q(name: str) -> str:
    return f"`{name}`"


def read_source(spark: SparkSession, cfg: SinkConfig, src: Source, field: str) -> DataFrame:
    options = dict(src.options)
    if src.format == "csv":
        options.setdefault("header", "true")
    reader = spark.read.format(src.format).options(**options)
    try:
        df = reader.load(src.path)
        df.schema  # noqa: B018 - forces resolution, so a missing path fails here
    except Exception as exc:  # AnalysisException and friends
        text = brief(exc, 300)
        raise SourceError(f"cannot read source {field} ({src.format} at {src.path}): {text}", sink=cfg.name) from None
    return df


def require_columns(cfg: SinkConfig, df: DataFrame, needed: list[str], what: str) -> None:
    have = {c.lower() for c in df.columns}
    missing = [c for c in needed if c.lower() not in have]
    if missing:
        raise SourceError(
            f"{what} lacks column(s) {missing} of the sink's schema (it has {sorted(df.columns)})",
            sink=cfg.name,
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

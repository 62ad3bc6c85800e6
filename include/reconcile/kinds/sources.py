"""Reading the desired collection of a sink as an update frame (I/O at the edge).

A ``query`` sink evaluates its Spark SQL over the declared sources (registered as temporary
views under their plain names) and yields a snapshot (``_diff`` = 1 per row). A ``changelog``
sink reads rows with a time and a diff column. Rows that do not fit the sink's schema become
error updates (see :func:`reconcile.correction.validate`); a source that is missing or lacks a
column is a :class:`~reconcile.errors.SourceError` and nothing is staged.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from reconcile.config import SinkConfig, Source
from reconcile.differential import lossy, validate
from reconcile.errors import SourceError, brief


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


def _require_columns(cfg: SinkConfig, df: DataFrame, needed: list[str], what: str) -> None:
    have = {c.lower() for c in df.columns}
    missing = [c for c in needed if c.lower() not in have]
    if missing:
        raise SourceError(
            f"{what} lacks column(s) {missing} of the sink's schema (it has {sorted(df.columns)})",
            sink=cfg.name,
        )


WRITES = ("InsertIntoStatement", "OverwriteByExpression", "AppendData", "ReplaceData", "WriteDelta")


def require_query(spark: SparkSession, cfg: SinkConfig) -> None:
    """Refuse query.sql that is not a plain query *before* running it: ``spark.sql`` executes
    commands (DELETE, INSERT, DROP, SET ...) at once."""
    jvm = spark._jvm
    assert jvm is not None, "the sink needs a classic SparkSession (py4j), not Spark Connect"
    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(cfg.sql)
    except Exception as exc:
        text = brief(exc, 300)
        raise SourceError(f"query.sql does not run (it does not parse): {text}", sink=cfg.name) from None
    command = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.Command")
    kind = plan.getClass().getSimpleName()
    while kind == "UnresolvedWith":  # WITH ... <statement>: look at the statement
        plan = plan.child()
        kind = plan.getClass().getSimpleName()
    if command.isInstance(plan) or kind in WRITES:
        raise SourceError(
            f"query.sql must be a query (SELECT/WITH/VALUES), not a command ({kind}); nothing was run.",
            sink=cfg.name,
        )


def read_desired(spark: SparkSession, cfg: SinkConfig) -> DataFrame:
    """The desired update frame (sink columns, _error, _time, _diff)."""
    if cfg.kind == "query":
        for src in cfg.sources:
            read_source(spark, cfg, src, f"query.sources.{src.name}").createOrReplaceTempView(src.name)
        require_query(spark, cfg)
        assert cfg.sql is not None  # a query sink's config requires it
        try:
            df = spark.sql(cfg.sql)
            df.schema  # noqa: B018
        except Exception as exc:
            text = brief(exc, 400)
            raise SourceError(f"query.sql does not run: {text}", sink=cfg.name) from None
        _require_columns(cfg, df, cfg.column_names, "the result of query.sql")
        extra = sorted({c.lower() for c in df.columns} - {c.lower() for c in cfg.column_names})
        if extra:
            raise SourceError(
                f"the result of query.sql has column(s) {extra} that are not in the sink's schema",
                sink=cfg.name,
            )
        return validate(cfg, df, F.lit(1), None)
    if cfg.kind == "changelog":
        assert cfg.source and cfg.time_column and cfg.diff_column
        df = read_source(spark, cfg, cfg.source, "changelog.source")
        _require_columns(cfg, df, cfg.column_names + [cfg.time_column, cfg.diff_column], "changelog.source")
        return validate_changelog(cfg, df)
    raise SourceError(f"kind {cfg.kind!r} is a command feed, not a desired collection (see read_feed)", sink=cfg.name)


def read_feed(spark: SparkSession, cfg: SinkConfig) -> DataFrame:
    """An upsert sink's command feed, raw (validated per command in :mod:`reconcile.upsert`)."""
    assert cfg.kind == "upsert" and cfg.source and cfg.time_column and cfg.offset_column
    df = read_source(spark, cfg, cfg.source, "upsert.source")
    needed = cfg.column_names + [cfg.time_column, cfg.offset_column]
    if cfg.delete_column:
        needed.append(cfg.delete_column)
    _require_columns(cfg, df, needed, "upsert.source")
    return df


def validate_changelog(cfg: SinkConfig, df: DataFrame) -> DataFrame:
    """Changelog rows: a null/zero/non-integer diff or a null time makes an error row (diff 1)."""
    traw, draw = F.col(f"`{cfg.time_column}`"), F.col(f"`{cfg.diff_column}`")
    t, d = traw.try_cast("bigint"), draw.try_cast("bigint")
    bad_diff = d.isNull() | (d == 0) | lossy(draw, d, "bigint")
    bad_time = t.isNull() | lossy(traw, t, "bigint")
    problem = F.concat_ws(
        "; ",
        F.when(bad_diff, F.lit(f"diff column '{cfg.diff_column}' is null, zero or not an integer")),
        F.when(bad_time, F.lit(f"time column '{cfg.time_column}' is null or not an integer")),
    )
    return validate(
        cfg,
        df,
        F.when(bad_diff | bad_time, F.lit(1)).otherwise(d),
        F.coalesce(t, F.lit(0)),
        extra_problem=F.when(bad_diff | bad_time, problem),
    )

"""Reading sources and decoding their rows into update frames, shared by every kind.

Rows that do not fit the sink's schema become error updates (:func:`validate`): errors are data,
persisted and corrected like rows, never dropped. A source that is missing or lacks a column is
a :class:`~reconcile.errors.SourceError` and nothing is staged; so is a source column whose
*type* cannot become the sink's (:func:`require_castable`: a struct, array or map for a scalar
column, a binary for a date, any pair Spark refuses to cast), found by analysis before any job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import Column as SCol
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from reconcile.config import SinkConfig, Source
from reconcile.errors import SourceError, brief, shorten
from reconcile.sql_names import spark_name


def read_source(
    spark: SparkSession, cfg: SinkConfig, src: Source, field: str, versions: dict[str, int] | None = None
) -> DataFrame:
    """The source as a DataFrame. ``versions``: a Delta source is read at its latest version (or
    the ``versionAsOf`` its options name), recorded there under the source's name: what the batch
    read of it, whatever is committed to it meanwhile."""
    options = dict(src.options)
    if src.format == "csv":
        options.setdefault("header", "true")
    if versions is not None and src.format == "delta" and "timestampAsOf" not in options:
        named = options.get("versionAsOf")
        if named is not None and not str(named).strip().isdigit():
            raise SourceError(
                f"{field}.options.versionAsOf must be a Delta version (a whole number), not {named!r}", sink=cfg.name
            )
        version = int(named) if named is not None else delta_version(spark, cfg, src, field)
        options["versionAsOf"] = str(version)
        versions[src.name] = version
    reader = spark.read.format(src.format).options(**options)
    try:
        df = reader.load(src.path)
        df.schema  # noqa: B018 - forces resolution, so a missing path fails here
    except Exception as exc:  # AnalysisException and friends
        text = brief(exc, 300)
        raise SourceError(f"cannot read source {field} ({src.format} at {src.path}): {text}", sink=cfg.name) from None
    return df


def delta_version(spark: SparkSession, cfg: SinkConfig, src: Source, field: str) -> int:
    """The latest version of a Delta source: its log replayed by delta-rs in this process (no
    Spark job), else as Spark reads it (``DESCRIBE HISTORY``: a store or a feature delta-rs does
    not read)."""
    if "://" not in src.path or src.path.startswith("file:"):
        try:
            from deltalake import DeltaTable

            return int(DeltaTable(src.path.removeprefix("file:")).version())
        except Exception:  # noqa: BLE001 - Spark's reader says it in its words, or reads it
            pass
    path = src.path.replace("`", "``")
    try:
        row = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").select("version").first()
    except Exception as exc:  # not a Delta table, missing: the same words the read would say
        text = brief(exc, 300)
        raise SourceError(f"cannot read source {field} ({src.format} at {src.path}): {text}", sink=cfg.name) from None
    if row is None:
        raise SourceError(f"cannot read source {field} (delta at {src.path}): it has no version", sink=cfg.name)
    return int(row["version"])


def require_columns(cfg: SinkConfig, df: DataFrame, needed: list[str], what: str) -> None:
    have = {c.lower() for c in df.columns}
    missing = [c for c in needed if c.lower() not in have]
    if missing:
        raise SourceError(
            f"{what} lacks column(s) {missing} of the sink's schema (it has {sorted(df.columns)})",
            sink=cfg.name,
        )


INTEGRAL = ("tinyint", "smallint", "int", "integer", "bigint")
FRACTIONAL = ("float", "double")
DATETIME = ("date", "timestamp", "timestamp_ntz")
NESTED = (ArrayType, MapType, StructType)
# The range of Spark's date and timestamp types (years 1 to 9999): a cast from a number or a
# string can produce times outside it (a bigint of seconds saturates at the year 294247), which
# no other Delta reader can represent.
MIN_DAY, MAX_DAY = -719162, 2932896  # 0001-01-01, 9999-12-31 (days since the epoch)
MIN_MICROS, MAX_MICROS = -62135596800000000, 253402300799999999
MIN_SECONDS, END_SECONDS = MIN_MICROS // 1_000_000, MAX_MICROS // 1_000_000 + 1
INFINITY_WORDS = ("inf", "+inf", "infinity", "+infinity", "-inf", "-infinity")  # Spark's spellings


def type_name(dt: DataType) -> str:
    """A source column's type as Spark's SQL spells it, on one line (a struct's field names may
    hold anything) and bounded."""
    text = " ".join(dt.simpleString().split())
    return text if len(text) <= 200 else text[:197] + "..."


def lossy(src: SCol, val: SCol, typ: str, have: str | None = None) -> SCol:
    """True where casting to an integral type dropped a fraction (1.5 -> 1 is an error, not 1).

    ``have`` (the source's type, when known) makes the comparison exact: a float or double, or
    a decimal of any scale, is compared with the integer in its own type (a decimal(38,9) would
    round 1.0000000001 to 1)."""
    if typ not in INTEGRAL or have in INTEGRAL:
        return F.lit(False)
    if have in FRACTIONAL:  # 2^63 saturates to the largest bigint, which reads back as 2^63
        exact = (src.cast("double") != val.cast("double")) | (src.cast("double") >= F.lit(2.0**63))
    elif have is not None and have.startswith("decimal"):
        exact = src != val.cast(have)
    else:
        exact = src.try_cast("decimal(38,9)") != val.cast("decimal(38,9)")
    return F.coalesce(exact, F.lit(False))


def _infinity(src: SCol, have: str | None) -> SCol:
    """True where the source value itself is an infinity (not a finite value that overflowed)."""
    if have in FRACTIONAL:
        return F.abs(src.cast("double")) == F.lit(float("inf"))
    if have == "string":
        return F.lower(F.trim(src)).isin(*INFINITY_WORDS)
    return F.lit(False)


def fit(src: SCol, have: str | None, typ: str) -> tuple[SCol, SCol]:
    """``src`` (of type ``have``) cast to the sink's type ``typ``, and where a non-null value
    does not fit it: the cast fails, drops an integral fraction, overflows a float or double to
    an infinity, lands outside years 1-9999, or (binary to string) is not UTF-8. A column that
    already has the sink's type is taken as it is: no cast, no check."""
    if have == typ:
        return src, F.lit(False)
    val = src.try_cast(typ)
    misfit = [val.isNull()]
    if typ in INTEGRAL:
        misfit.append(lossy(src, val, typ, have))
    elif typ in FRACTIONAL:
        misfit.append((F.abs(val) == F.lit(float("inf"))) & ~_infinity(src, have))
    elif typ == "date":
        misfit.append(~F.unix_date(val).between(MIN_DAY, MAX_DAY))
    elif typ == "timestamp":
        misfit.append(~F.unix_micros(val).between(MIN_MICROS, MAX_MICROS))
        if have is not None and (have in INTEGRAL or have in FRACTIONAL or have.startswith("decimal")):
            # seconds since the epoch: Spark saturates (a bigint, a double) or wraps (a decimal:
            # 1e17 s becomes a time in the year 8319) what does not fit, so check the seconds
            misfit.append(~((src >= F.lit(MIN_SECONDS)) & (src < F.lit(END_SECONDS))))
    elif typ == "timestamp_ntz":
        low, high = (F.lit(t).cast("timestamp_ntz") for t in ("0001-01-01 00:00:00", "9999-12-31 23:59:59.999999"))
        misfit.append(~val.between(low, high))
    elif typ == "string" and have == "binary":
        misfit.append(~F.is_valid_utf8(val))
    bad = misfit[0]
    for m in misfit[1:]:
        bad = bad | F.coalesce(m, F.lit(False))
    return val, src.isNotNull() & bad


def raw_text(src: SCol, have: str | None) -> SCol:
    """A source value as text for an error message: bytes in base64 (they need not be UTF-8)."""
    return F.base64(src) if have == "binary" else src.cast("string")


@contextmanager
def _quiet_analysis() -> Iterator[None]:
    """PySpark logs every AnalysisException it raises (at ERROR, with the JVM's stack): a
    refusal found here is reported once, by its SourceError. The loggers are PySpark's own class
    (a plain logger made first under their names would break PySpark's conversion of every later
    Spark error with a query context into a TypeError)."""
    from pyspark.logger import PySparkLogger

    loggers = [PySparkLogger.getLogger(n) for n in ("DataFrameQueryContextLogger", "SQLQueryContextLogger")]
    before = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, before, strict=True):
            lg.disabled = was


def _spark_reason(exc: BaseException) -> str:
    """Why Spark refused, on one line: its message without the plan, the SQL state and the
    expression this module built (``Cannot resolve "TRY_CAST(...)" due to ...``)."""
    text = " ".join(str(exc).split(";\n")[0].split())
    text = text.split(" SQLSTATE:")[0]
    _, sep, rest = text.partition("due to data type mismatch: ")
    return shorten(rest if sep else text, 300)


def require_castable(
    cfg: SinkConfig, df: DataFrame, what: str, targets: Mapping[str, str], counters: tuple[str, ...] = ()
) -> None:
    """Refuse a source whose column types cannot become the types the sink needs, before any
    row is read: ``targets`` maps source columns to the type they are cast to (a sink column's
    type; bigint for a time, diff or offset, the ``counters``, which must be numbers or text:
    a date or timestamp is not epoch milliseconds). One analysis of the casts the decoding
    uses (no Spark job); a refusal is a one-line SourceError naming the sink, the column, its
    type and the sink's type."""
    fields = {f.name.lower(): f.dataType for f in df.schema.fields}

    def refuse(name: str, dt: DataType, typ: str, why: str) -> SourceError:
        return SourceError(
            f"{what}: column '{name}' is {type_name(dt)}, which cannot become the sink's type {typ} ({why}); "
            "nothing was staged",
            sink=cfg.name,
        )

    checks: list[tuple[str, DataType, str, str | list[SCol]]] = []  # a reason, or the casts to analyse
    for name, typ in targets.items():
        dt = fields.get(name.lower())
        if dt is None:
            continue  # require_columns names it
        have = dt.simpleString()
        if isinstance(dt, NESTED):
            checks.append((name, dt, typ, "a struct, array or map is not a scalar value"))
        elif name in counters and have in DATETIME:
            checks.append((name, dt, typ, "a date or timestamp is not a number of epoch milliseconds"))
        else:
            val, bad = fit(F.col(spark_name(name)), have, typ)
            checks.append((name, dt, typ, [val, bad, raw_text(F.col(spark_name(name)), have)]))
    reason = "no single column is refused"
    with _quiet_analysis():
        if all(not isinstance(c[3], str) for c in checks):
            try:
                df.select(*[e for c in checks for e in c[3]]).schema  # noqa: B018 - analysis only, no job
                return
            except Exception as whole:
                reason = _spark_reason(whole)
        for name, dt, typ, check in checks:  # the first column refused, in the schema's order
            if isinstance(check, str):
                raise refuse(name, dt, typ, check)
            try:
                df.select(*check).schema  # noqa: B018
            except Exception as exc:
                raise refuse(name, dt, typ, f"Spark: {_spark_reason(exc)}") from None
    raise SourceError(f"{what} cannot be decoded as the sink's schema: {reason}", sink=cfg.name)


def validate(
    cfg: SinkConfig,
    raw: DataFrame,
    what: str,
    diff: SCol,
    time: SCol | None,
    extra_problem: SCol | None = None,
    counters: tuple[str, ...] = (),
) -> DataFrame:
    """Cast raw desired rows to the sink's schema; rows that do not fit become error rows.

    A value that cannot be cast (see :func:`fit`), or a null in a non-nullable column, turns
    the row into an error update: all sink columns null, ``_error`` naming the columns and the
    raw row (as JSON), with the row's time and diff. Nothing is dropped. A column whose *type*
    cannot become the sink's (and ``counters``: raw columns the caller reads as bigint, a
    change log's time and diff) is refused up front: :func:`require_castable`.

    Columns whose source type already is the sink's type are taken as they are (no cast, no
    check), and integral sources skip the lost-fraction check: on a typed source (Parquet,
    Delta, a typed query) validation costs next to nothing.
    """
    source_types = {f.name.lower(): f.dataType.simpleString() for f in raw.schema.fields}
    targets = {**{c.name: c.type for c in cfg.columns}, **dict.fromkeys(counters, "bigint")}
    require_castable(cfg, raw, what, targets, counters)
    problems = [] if extra_problem is None else [extra_problem]
    casted = []
    for c in cfg.columns:
        src = F.col(spark_name(c.name))
        have = source_types.get(c.name.lower())
        val, bad_cast = fit(src, have, c.type)
        casted.append(val.alias(c.name))
        if have != c.type:
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
    raw_json = F.to_json(
        F.struct(*[raw_text(F.col(spark_name(c)), source_types.get(c.lower())).alias(c) for c in cfg.column_names])
    )
    error = F.when(message != "", F.concat(message, F.lit(" in row "), raw_json))
    out = raw.select(
        *casted,
        error.alias("_error"),
        (time if time is not None else F.lit(None)).cast("bigint").alias("_time"),
        diff.cast("bigint").alias("_diff"),
    )
    # Error rows keep only the message: their column values live in the message.
    return out.select(
        *[F.when(F.col("_error").isNull(), F.col(spark_name(c.name))).cast(c.type).alias(c.name) for c in cfg.columns],
        "_error",
        "_time",
        "_diff",
    )

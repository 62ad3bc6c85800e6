"""A sink's next correction in DuckDB, without a JVM (``dry-run``: :mod:`reconcile.sink.dry_run`).

Each kind computes its correction with its own semantics (:meth:`reconcile.kinds.Kind.preview`)
over the shard's update log (a table of the connection the caller fills, as ``show`` reads it):
a query's result rows each ``+1`` at ``upper - 1`` minus the shard below ``upper``
(:func:`query_desired`); a change log's updates below ``upper`` minus the shard's, advanced to
``lower`` (:func:`changelog_desired`); both through :func:`own_updates`. An upsert feed's
eligible commands, highest offset first per (key, time), each key's value as of ``lower - 1``
retracted at its first command, are :mod:`reconcile.kinds.upsert_preview`'s. Rows that do not
fit the schema become error rows with the message Spark's validation writes; the sum is
consolidated by the caller. A query is Spark SQL, written in DuckDB's dialect by sqlglot;
Spark's ``CAST`` stays strict (Spark 4 runs with ANSI casts).

The preview is taken only where the two engines agree by construction; anything else raises
:class:`NotExact` with the reason, and ``dry-run`` asks Spark as the run will:

- local JSON-lines, Parquet or Delta sources without options, a file or a folder of files
  (no partition folders), JSON values that Spark infers as the same type (numbers, strings,
  booleans: a string DuckDB would read as a date stays a string, as in Spark);
- SQL that sqlglot parses as one query and writes in DuckDB's dialect without a loss;
- columns that already have the sink's type (Spark's casts decide what fits a different type),
  except a ``HUGEINT`` sum that fits the sink's ``bigint``; times, diffs and offsets integers;
- error rows only where Spark's text of each value is known (strings, integers, booleans,
  decimals of scale <= 6, dates);
- no two commands of one key, time and offset that differ (Spark's order of their values
  picks one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from reconcile.config import ChangelogSink, QuerySink, SinkConfig, Source
from reconcile.errors import shorten
from reconcile.model import FeedProgress
from reconcile.sql_names import duckdb_name

# the sink's type -> DuckDB's; DuckDB's type names back to the sink's
DUCK_TYPES = {
    "boolean": "BOOLEAN", "tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "integer": "INTEGER",
    "bigint": "BIGINT", "float": "FLOAT", "double": "DOUBLE", "string": "VARCHAR", "date": "DATE",
    "timestamp": "TIMESTAMP WITH TIME ZONE", "timestamp_ntz": "TIMESTAMP", "binary": "BLOB",
}  # fmt: skip
SPARK_TYPES = {v: k for k, v in DUCK_TYPES.items() if k != "integer"}
# JSON values DuckDB reads as these types are what Spark infers as the same (VARCHAR: string)
JSON_AS_SPARK = {
    "BIGINT": "BIGINT",
    "UBIGINT": "BIGINT",
    "HUGEINT": "BIGINT",
    "DOUBLE": "DOUBLE",
    "BOOLEAN": "BOOLEAN",
    "VARCHAR": "VARCHAR",
}
JSON_AS_STRING = ("DATE", "TIMESTAMP", "TIME", "UUID", "NULL")  # string tokens (or none): Spark infers a string
TEXT_TYPES = ("string", "tinyint", "smallint", "int", "bigint", "boolean", "date")  # Spark's text known
DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")


class NotExact(Exception):
    """The preview could differ from Spark's correction (or cannot be computed here): why."""


def sink_type(text: str) -> str:
    t = "".join(text.lower().split())
    return "int" if t == "integer" else t


def duck_type(spark_type: str) -> str:
    t = sink_type(spark_type)
    m = DECIMAL.match(t)
    return f"DECIMAL({m.group(1)},{m.group(2)})" if m else DUCK_TYPES[t]


def spark_type_of(duck: str) -> str | None:
    """The sink type a DuckDB column type is (None: none of the supported types)."""
    m = re.match(r"^DECIMAL\((\d+),\s*(\d+)\)$", duck)
    return f"decimal({m.group(1)},{m.group(2)})" if m else SPARK_TYPES.get(duck)


def literal(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def source_files(src: Source, label: str) -> list[str]:
    """The files Spark reads for a local source: the file, or a folder's files except hidden
    ones (names starting with ``_`` or ``.``)."""
    if "://" in src.path and not src.path.startswith("file://"):
        raise NotExact(f"{label} is not on a local disk ({src.path})")
    path = Path(src.path.removeprefix("file://"))
    if any(ch in str(path) for ch in "*?[{"):
        raise NotExact(f"{label}'s path is a glob")
    if path.is_file():
        return [str(path)]
    if not path.is_dir():
        raise NotExact(f"{label} does not exist at {path}")
    entries = [p for p in sorted(path.iterdir()) if not p.name.startswith(("_", "."))]
    if any(p.is_dir() for p in entries):
        raise NotExact(f"{label} has sub-folders (partitions)")
    if not entries:
        raise NotExact(f"{label} has no files")
    return [str(p) for p in entries]


def register_source(con, src: Source, label: str | None = None) -> None:
    """A DuckDB view named as the source, of its rows as Spark reads them (``label``: the
    source's name in a refusal, default ``source NAME``)."""
    label = label or f"source {src.name}"
    if src.options:
        raise NotExact(f"{label} has reader options")
    if src.format == "delta":
        from deltalake import DeltaTable

        if "://" in src.path and not src.path.startswith("file://"):
            raise NotExact(f"{label} is not on a local disk ({src.path})")
        import pyarrow as pa

        # delta-rs's scan applies deletion vectors (a current-state table, a Spark DELETE)
        arrow = pa.RecordBatchReader.from_stream(DeltaTable(src.path).scan()).read_all()  # noqa: F841 - DuckDB reads it by name
        con.execute(f"CREATE TEMP TABLE {duckdb_name(src.name)} AS SELECT * FROM arrow")
        return
    if src.format not in ("parquet", "json"):
        raise NotExact(f"{label} is {src.format} (its parsing is Spark's)")
    listed = "[" + ", ".join(literal(f) for f in source_files(src, label)) + "]"
    if src.format == "parquet":
        con.execute(
            f"CREATE TEMP VIEW {duckdb_name(src.name)} AS SELECT * FROM read_parquet({listed}, hive_partitioning = false)"
        )
        return
    read = f"read_json({listed}, format = 'newline_delimited'"
    detected = con.execute(f"DESCRIBE SELECT * FROM {read})").fetchall()
    columns = {}
    for name, typ, *_ in detected:
        if typ in JSON_AS_STRING:
            columns[name] = "VARCHAR"
        elif typ in JSON_AS_SPARK:
            columns[name] = JSON_AS_SPARK[typ]
        else:  # JSON: tokens of several types (Spark keeps a number's own text as a string)
            raise NotExact(f"{label}'s field {name} is read as {typ} (Spark infers its own type)")
    spec = "{" + ", ".join(f"{literal(n)}: {literal(t)}" for n, t in columns.items()) + "}"
    con.execute(f"CREATE TEMP VIEW {duckdb_name(src.name)} AS SELECT * FROM {read}, columns = {spec})")


TRANSPILE = "strict-cast-1"  # what :func:`transpile` does beyond sqlglot (part of the cache key)


def duckdb_sql(cfg: QuerySink) -> str:
    """The sink's Spark SQL in DuckDB's dialect (:func:`transpile`), kept under the home's
    ``cache/duckdb-sql/`` by the SQL and sqlglot's version: the next dry run of the sink skips
    sqlglot's import and parse (a quarter of a second)."""
    import hashlib
    from importlib.metadata import version

    from reconcile import settings

    key = hashlib.sha256(f"{version('sqlglot')}\0{TRANSPILE}\0{cfg.sql}".encode()).hexdigest()
    cached = settings.home() / "cache" / "duckdb-sql" / f"{key}.sql"
    try:
        return cached.read_text()
    except OSError:
        pass
    sql = transpile(cfg)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(sql)
        partial.replace(cached)  # whole or absent
    except OSError:
        pass  # a home that cannot be written: computed again next time
    return sql


def transpile(cfg: QuerySink) -> str:
    """The sink's Spark SQL in DuckDB's dialect (sqlglot), Spark's strict ``CAST`` kept strict."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import ErrorLevel, SqlglotError

    try:
        trees = [t for t in sqlglot.parse(cfg.sql, read="spark") if t is not None]
        if len(trees) != 1 or not isinstance(trees[0], exp.Query):
            raise NotExact("query.sql is not one query (Spark reports what it is)")
        tree = trees[0]
        for node in list(tree.find_all(exp.TryCast)):
            if not node.args.get("safe"):  # Spark's CAST, which the Spark dialect parses as TRY_CAST
                node.replace(exp.Cast(this=node.this.copy(), to=node.args["to"].copy()))
        return tree.sql(dialect="duckdb", unsupported_level=ErrorLevel.RAISE)
    except SqlglotError as exc:
        raise NotExact(f"sqlglot cannot write query.sql for DuckDB ({shorten(str(exc), 200)})") from None


def json_text(text: str) -> str:
    """A JSON string as Spark's ``to_json`` (Jackson) writes it."""
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def spark_text(v: Any) -> str:
    """A value of a :data:`TEXT_TYPES` or decimal column as Spark's cast to string writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Decimal):
        return format(v, "f")
    return str(v)


def error_message(cfg: SinkConfig, row: dict, first: list[str] | None = None) -> str | None:
    """:func:`reconcile.kinds.decode.validate`'s ``_error`` for a row whose every sink column has
    the sink's type: the ``first`` problems (a change log's time and diff), each non-nullable
    null named, then the row's sink columns as JSON (null fields left out)."""
    nulls = [
        f"column '{c.name}' is null but not nullable" for c in cfg.columns if not c.nullable and row[c.name] is None
    ]
    problems = [*(first or []), *nulls]
    if not problems:
        return None
    fields = ",".join(f"{json_text(c)}:{json_text(spark_text(row[c]))}" for c in cfg.column_names if row[c] is not None)
    return "; ".join(problems) + " in row {" + fields + "}"


def require_known_text(cfg: SinkConfig) -> None:
    """Refuse error rows of a sink whose values Spark writes as text its own way (floats, times,
    bytes, decimals of scale > 6): the message quotes them."""
    for c in cfg.columns:
        m = DECIMAL.match(sink_type(c.type))
        if sink_type(c.type) not in TEXT_TYPES and not (m is not None and int(m.group(2)) <= 6):
            raise NotExact("error rows hold values whose text Spark writes its own way (floats, times or bytes)")


def insert_rows(con, table: str, rows: list[str]) -> None:
    """Rows (each a SQL tuple of literals) into ``table``, a thousand a statement: literals, since
    DuckDB's query parameters import pandas (a third of a second)."""
    for start in range(0, len(rows), 1000):
        con.execute(f"INSERT INTO {table} VALUES {', '.join(rows[start : start + 1000])}")


def failed(what: str, exc: Exception) -> NotExact:
    return NotExact(f"DuckDB cannot {what} ({shorten(str(exc), 200)})")


@dataclass(frozen=True)
class Updates:
    """What a batch changes, as DuckDB computes it: the SQL of the updates to consolidate (the
    sink's columns, ``_error``, ``_time``, ``_diff``), the time each is consolidated at (a SQL
    expression over ``_time``) and an upsert feed's progress."""

    sql: str
    time: str
    feed: FeedProgress | None = None


@dataclass(frozen=True)
class Desired:
    """What a kind desires, as DuckDB reads it: the relation, the times of its updates below
    ``upper`` (a SQL expression over ``_time``) and, for a change log, its time and diff columns."""

    relation: str
    advance: str
    counters: tuple[str, str] | None = None  # (time column, diff column)


def query_desired(con, cfg: QuerySink, lower: int, upper: int) -> Desired:
    """The query's result, its sources registered as views of ``con``; stamped at ``upper - 1``."""
    sql = duckdb_sql(cfg)
    for src in cfg.sources:
        register_source(con, src)
    return Desired(f"({sql})", f"CAST({int(upper) - 1} AS BIGINT)")


def changelog_desired(con, cfg: ChangelogSink, lower: int, upper: int) -> Desired:
    """The change log, registered as a view of ``con``; its times advanced to ``lower``."""
    register_source(
        con, Source("reconcile_source", cfg.source.format, cfg.source.path, cfg.source.options), "changelog.source"
    )
    return Desired("reconcile_source", f"greatest(_time, {int(lower)})", (cfg.time_column, cfg.diff_column))


def _columns(con, cfg: SinkConfig, want: Desired) -> tuple[list[str], str, str]:
    """The sink's columns of ``want.relation`` (each of the sink's type: DuckDB's sum of integers,
    a ``HUGEINT``, as a bigint) and its time and diff as bigints."""
    try:
        con.execute(f"CREATE TEMP VIEW reconcile_result AS SELECT * FROM {want.relation}")
        described = con.execute("DESCRIBE reconcile_result").fetchall()
    except Exception as exc:
        raise failed("run the query" if want.counters is None else "read the change log", exc) from None
    have = {name.lower(): typ for name, typ, *_ in described}
    needed = {c.lower() for c in cfg.column_names} | {c.lower() for c in want.counters or ()}
    if len(have) != len(described) or not needed <= set(have):
        raise NotExact("the source lacks columns of the sink (Spark says which)")
    if want.counters is None and set(have) != needed:
        raise NotExact("the query's columns are not the sink's (Spark says which)")
    picks = []
    for c in cfg.columns:
        typ, target = have[c.name.lower()], sink_type(c.type)
        if spark_type_of(typ) == target:
            picks.append(duckdb_name(c.name))
        elif typ == "HUGEINT" and target == "bigint":
            picks.append(f"CAST({duckdb_name(c.name)} AS BIGINT) AS {duckdb_name(c.name)}")
        else:
            raise NotExact(f"column {c.name} is {typ} in DuckDB, the sink's type is {c.type} (Spark's cast decides)")
    if want.counters is None:  # a query's rows: the result as of upper - 1, each +1
        return picks, want.advance, "CAST(1 AS BIGINT)"
    counters = []
    for name in want.counters:
        if have[name.lower()] not in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT"):
            raise NotExact(f"column {name} is {have[name.lower()]} in DuckDB (Spark's cast to bigint decides)")
        counters.append(f"CAST({duckdb_name(name)} AS BIGINT)")
    return picks, counters[0], counters[1]


def _decode(con, cfg: SinkConfig, want: Desired) -> None:
    """The temp table ``desired_updates``: the kind's updates (the sink's columns, ``_error``,
    ``_time``, ``_diff``) as :func:`reconcile.kinds.decode.validate` makes them."""
    picks, time, diff = _columns(con, cfg, want)
    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    bad_diff, bad_time = "(_d IS NULL OR _d = 0)", "(_t IS NULL)"
    nulls = [f"{duckdb_name(c.name)} IS NULL" for c in cfg.columns if not c.nullable]
    problem = " OR ".join([*nulls, *([bad_diff, bad_time] if want.counters else [])]) or "false"
    try:
        con.execute(
            f"CREATE TEMP TABLE desired AS SELECT {', '.join(picks)}, {time} AS _t, {diff} AS _d FROM reconcile_result"
        )
        con.execute(
            f"CREATE TEMP TABLE desired_updates AS SELECT {cols}, CAST(NULL AS VARCHAR) AS _error, _t AS _time, "
            f"_d AS _diff FROM desired WHERE NOT ({problem})"
        )
        bad = con.execute(f"SELECT {cols}, _t, _d FROM desired WHERE {problem}").fetchall()
    except Exception as exc:
        raise failed("read the rows", exc) from None
    if bad:
        require_known_text(cfg)
    values = []
    for r in bad:
        row = dict(zip(cfg.column_names, r, strict=False))
        t, d = r[-2], r[-1]
        first = []
        if want.counters is not None:
            time_col, diff_col = want.counters
            if d is None or d == 0:
                first.append(f"diff column '{diff_col}' is null, zero or not an integer")
            if t is None:
                first.append(f"time column '{time_col}' is null or not an integer")
        message = error_message(cfg, row, first) or ""
        values.append((message, 0 if t is None else int(t), 1 if first else int(d)))
    nulls_typed = ", ".join(f"CAST(NULL AS {duck_type(c.type)})" for c in cfg.columns)
    insert_rows(con, "desired_updates", [f"({nulls_typed}, {literal(m)}, {t}, {d})" for m, t, d in values])


def own_updates(con, cfg: SinkConfig, want: Desired, upper: int, shard: str) -> Updates:
    """The updates of a kind with a desired collection of its own (``want``) over the connection
    ``con`` whose table ``shard`` holds the shard's update log: the desired updates below
    ``upper`` minus the shard's, consolidated at ``want.advance``."""
    _decode(con, cfg, want)
    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    sql = (
        f"SELECT {cols}, _error, _time, _diff FROM desired_updates WHERE _time < {int(upper)} "
        f"UNION ALL SELECT {cols}, _error, _time, -_diff FROM {shard} WHERE _time < {int(upper)}"
    )
    return Updates(sql, want.advance)

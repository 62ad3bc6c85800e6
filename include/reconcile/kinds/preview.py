"""A sink's next correction in DuckDB, without a JVM (``dry-run``: :mod:`reconcile.sink.dry_run`).

DuckDB computes the correction with the kind's semantics over the shard's update log (a table
of the connection the caller fills, as ``show`` reads it): a query's result rows each
``+1`` at ``upper - 1`` minus the shard below ``upper`` (:mod:`reconcile.kinds.query`); a change
log's updates below ``upper`` minus the shard's, advanced to ``lower``
(:mod:`reconcile.kinds.changelog`); an upsert feed's eligible commands, highest offset first per
(key, time), each key's value as of ``lower - 1`` retracted at its first command
(:mod:`reconcile.kinds.upsert`). Rows that do not fit the schema become error rows with the
message Spark's validation writes; the sum is consolidated. A query is Spark SQL, written in
DuckDB's dialect by sqlglot; Spark's ``CAST`` stays strict (Spark 4 runs with ANSI casts).

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

from reconcile.config import ChangelogSink, QuerySink, SinkConfig, Source, UpsertSink
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


def _lit(text: str) -> str:
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
    listed = "[" + ", ".join(_lit(f) for f in source_files(src, label)) + "]"
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
    spec = "{" + ", ".join(f"{_lit(n)}: {_lit(t)}" for n, t in columns.items()) + "}"
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
        raise NotExact(f"sqlglot cannot write query.sql for DuckDB ({' '.join(str(exc).split())[:200]})") from None


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


def _small_decimal(typ: str) -> bool:
    m = DECIMAL.match(sink_type(typ))
    return m is not None and int(m.group(2)) <= 6


def _insert(con, table: str, rows: list[str]) -> None:
    """Rows (each a SQL tuple of literals) into ``table``, a thousand a statement: literals, since
    DuckDB's query parameters import pandas (a third of a second)."""
    for start in range(0, len(rows), 1000):
        con.execute(f"INSERT INTO {table} VALUES {', '.join(rows[start : start + 1000])}")


def failed(what: str, exc: Exception) -> NotExact:
    return NotExact(f"DuckDB cannot {what} ({' '.join(str(exc).split())[:200]})")


@dataclass(frozen=True)
class _Desired:
    """What a kind desires, as DuckDB reads it: the relation, the times of its updates below
    ``upper`` (a SQL expression over ``_time``) and, for a change log, its time and diff columns."""

    relation: str
    advance: str
    counters: tuple[str, str] | None = None  # (time column, diff column)


def _desired(con, cfg: SinkConfig, lower: int, upper: int) -> _Desired:
    if isinstance(cfg, QuerySink):
        sql = duckdb_sql(cfg)
        for src in cfg.sources:
            register_source(con, src)
        return _Desired(f"({sql})", f"CAST({int(upper) - 1} AS BIGINT)")
    if isinstance(cfg, ChangelogSink):
        register_source(
            con, Source("reconcile_source", cfg.source.format, cfg.source.path, cfg.source.options), "changelog.source"
        )
        return _Desired("reconcile_source", f"greatest(_time, {int(lower)})", (cfg.time_column, cfg.diff_column))
    raise AssertionError(f"no desired collection for kind {cfg.kind!r}")


def _columns(con, cfg: SinkConfig, want: _Desired) -> tuple[list[str], str, str]:
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


def _decode(con, cfg: SinkConfig, want: _Desired) -> None:
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
    if bad and not all(sink_type(c.type) in TEXT_TYPES or _small_decimal(c.type) for c in cfg.columns):
        raise NotExact("error rows hold values whose text Spark writes its own way (floats, times or bytes)")
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
    _insert(con, "desired_updates", [f"({nulls_typed}, {_lit(m)}, {t}, {d})" for m, t, d in values])


def updates_sql(
    con, cfg: SinkConfig, lower: int, upper: int, watermark: int | None, shard: str
) -> tuple[str, str, dict | None]:
    """What the batch ``(lower, upper)`` changes, as the sink's kind computes it, over the DuckDB
    connection ``con`` whose table ``shard`` holds the shard's update log: (the SQL of the
    updates to consolidate, with the sink's columns, ``_error``, ``_time`` and ``_diff``; the
    time each is consolidated at, a SQL expression over ``_time``; an upsert feed's progress).
    Registers the sources as views of ``con``. :class:`NotExact` where the result might not be
    exactly Spark's."""
    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    if isinstance(cfg, UpsertSink):
        feed = _upsert_commands(con, cfg, lower, upper, watermark)
        return _upsert_correction(con, cfg, lower, shard), "_time", feed
    want = _desired(con, cfg, lower, upper)
    _decode(con, cfg, want)
    updates = (
        f"SELECT {cols}, _error, _time, _diff FROM desired_updates WHERE _time < {int(upper)} "
        f"UNION ALL SELECT {cols}, _error, _time, -_diff FROM {shard} WHERE _time < {int(upper)}"
    )
    return updates, want.advance, None


# -- upsert sinks -------------------------------------------------------------------------------


def _upsert_messages(cfg: UpsertSink, row: dict, t, o, is_delete: bool) -> tuple[str | None, bool]:
    """:func:`reconcile.kinds.upsert.commands`' ``_error`` and ``_unkeyed`` for a command whose
    key and value columns have the sink's types and whose time and offset are integers."""
    keyed = [f"key column '{k}' is null" for k in cfg.key_columns if row[k] is None]
    keyed += [f"time column '{cfg.time_column}' is null or not an integer"] if t is None else []
    keyed += [f"offset column '{cfg.offset_column}' is null or not an integer"] if o is None else []
    types = {c.name: c for c in cfg.columns}
    valued = [] if is_delete else [
        f"column '{v}' is null but not nullable" for v in cfg.value_columns if not types[v].nullable and row[v] is None
    ]  # fmt: skip
    if not keyed and not valued:
        return None, False
    raw = {**row, cfg.time_column: t, cfg.offset_column: o}
    fields = ",".join(
        f"{json_text(c)}:{json_text(spark_text(raw[c]))}"
        for c in [*cfg.column_names, cfg.time_column, cfg.offset_column]
        if raw[c] is not None
    )
    if keyed:
        return f"upsert command cannot be applied: {'; '.join(keyed)} in {{{fields}}}", True
    return f"{'; '.join(valued)} in {{{fields}}}", False


def _upsert_commands(con, cfg: UpsertSink, lower: int, upper: int, watermark: int | None) -> dict:
    """The temp table ``cmds``: the eligible commands as :func:`reconcile.kinds.upsert.commands`
    makes them; returns the feed's progress (commands, late, the offset read up to)."""
    register_source(
        con, Source("reconcile_feed", cfg.source.format, cfg.source.path, cfg.source.options), "upsert.source"
    )
    described = {n.lower(): (n, typ) for n, typ, *_ in con.execute("DESCRIBE reconcile_feed").fetchall()}
    needed = [
        *cfg.column_names,
        cfg.time_column,
        cfg.offset_column,
        *([cfg.delete_column] if cfg.delete_column else []),
    ]
    if any(n.lower() not in described for n in needed):
        raise NotExact("the feed lacks columns of the sink (Spark says which)")
    for c in cfg.columns:
        if spark_type_of(described[c.name.lower()][1]) != sink_type(c.type):
            raise NotExact(f"column {c.name} is {described[c.name.lower()][1]} in DuckDB, the sink's type is {c.type}")
    integral = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT")
    for n in (cfg.time_column, cfg.offset_column):
        if described[n.lower()][1] not in integral:
            raise NotExact(f"column {n} is {described[n.lower()][1]} in DuckDB (Spark's cast to bigint decides)")
    if cfg.delete_column:
        if described[cfg.delete_column.lower()][1] not in (*integral, "VARCHAR", "BOOLEAN"):
            raise NotExact(f"the delete column's text is Spark's ({described[cfg.delete_column.lower()][1]})")
        marks = ", ".join(_lit(v) for v in cfg.delete_values)
        is_delete = f"coalesce(CAST({duckdb_name(cfg.delete_column)} AS VARCHAR) IN ({marks}), false)"
    else:
        is_delete = " AND ".join(f"{duckdb_name(v)} IS NULL" for v in cfg.value_columns) or "true"
    t, o = f"CAST({duckdb_name(cfg.time_column)} AS BIGINT)", f"CAST({duckdb_name(cfg.offset_column)} AS BIGINT)"
    if watermark is None:
        eligible, late = f"coalesce({t} < {upper}, true)", "false"
    else:
        new = f"coalesce({o} > {watermark}, false)"
        eligible = f"CASE WHEN {t} IS NULL THEN {new} ELSE ({t} < {upper}) AND ({t} >= {lower} OR {new}) END"
        late = f"coalesce({t} < {lower} AND {new}, false)"
    cols = ", ".join(duckdb_name(c) for c in cfg.column_names)
    n, n_late, top = con.execute(
        f"SELECT count(*) FILTER (WHERE {eligible}), count(*) FILTER (WHERE {eligible} AND {late}), max({o}) "
        "FROM reconcile_feed"
    ).fetchone()
    con.execute(
        f"CREATE TEMP TABLE commands AS SELECT row_number() OVER () AS _rid, {cols}, {t} AS _t, {o} AS _off, "
        f"{is_delete} AS _isdel FROM reconcile_feed WHERE {eligible}"
    )
    values = cfg.value_columns
    suspect = " OR ".join(
        [f"{duckdb_name(k)} IS NULL" for k in cfg.key_columns]
        + ["_t IS NULL", "_off IS NULL"]
        + [
            f"(NOT _isdel AND {duckdb_name(c.name)} IS NULL)"
            for c in cfg.columns
            if c.name in values and not c.nullable
        ]
    )
    bad = con.execute(f"SELECT _rid, {cols}, _t, _off, _isdel FROM commands WHERE {suspect}").fetchall()
    errors = []
    for r in bad:
        row = dict(zip(cfg.column_names, r[1:], strict=False))
        message, unkeyed = _upsert_messages(cfg, row, r[-3], r[-2], bool(r[-1]))
        errors.append((r[0], message, unkeyed))
    if errors and not all(sink_type(c.type) in TEXT_TYPES or _small_decimal(c.type) for c in cfg.columns):
        raise NotExact("error rows hold values whose text Spark writes its own way (floats, times or bytes)")
    con.execute("CREATE TEMP TABLE command_errors (_rid BIGINT, _error VARCHAR, _unkeyed BOOLEAN)")
    _insert(con, "command_errors", [f"({rid}, {_lit(m or '')}, {str(u).lower()})" for rid, m, u in errors])
    keys = [duckdb_name(k) for k in cfg.key_columns]
    con.execute(
        "CREATE TEMP TABLE cmds AS SELECT "
        + ", ".join(f"CASE WHEN coalesce(e._unkeyed, false) THEN NULL ELSE c.{k} END AS {k}" for k in keys)
        + ", "
        + ", ".join(f"CASE WHEN e._error IS NULL THEN c.{duckdb_name(v)} END AS {duckdb_name(v)}" for v in values)
        + (", " if values else "")
        + "e._error AS _error, coalesce(e._unkeyed, false) AS _unkeyed, "
        "CASE WHEN e._error IS NULL THEN c._isdel ELSE false END AS _del, "
        f"CAST(greatest(coalesce(c._t, {lower}), {lower}) AS BIGINT) AS _time, c._off AS _off "
        "FROM commands c LEFT JOIN command_errors e USING (_rid)"
    )
    offsets = [x for x in (watermark, top) if x is not None]
    return {"commands": int(n), "late": int(n_late), "offset": max(offsets) if offsets else None}


def _upsert_correction(con, cfg: UpsertSink, lower: int, shard: str) -> str:
    """The SQL of :func:`reconcile.kinds.upsert.upsert_correction`'s updates (before they are
    consolidated; columns: keys, values, ``_error``, ``_time``, ``_diff``) over ``cmds`` and the
    shard's update log ``shard``."""
    keys = [duckdb_name(k) for k in cfg.key_columns]
    values = [duckdb_name(v) for v in cfg.value_columns]
    klist = ", ".join(keys)
    # Highest offset wins per (key, time): Spark's max of the struct (offset, delete, error,
    # values), nulls lowest. Commands of one key, time and offset that differ are ordered by
    # Spark's comparison of their values: not previewed.
    group = f"{klist}, _time, CASE WHEN _unkeyed THEN _error END"
    ties = con.execute(
        f"SELECT count(*) FROM (SELECT {group}, _off, count(DISTINCT ({', '.join(['_del', '_error', *values])})) AS n "
        "FROM cmds GROUP BY ALL) WHERE n > 1"
    ).fetchone()[0]
    if ties:
        raise NotExact("commands of one key, time and offset differ (Spark's order of them decides)")
    order = ", ".join(f"{c} DESC NULLS LAST" for c in ["_off", "_del", "_error", *values])
    picked = ", ".join(["_off", "_del", "_error", *values])
    con.execute(
        f"CREATE TEMP TABLE per_time AS SELECT * EXCLUDE (_rank) FROM (SELECT {klist}, _time, {picked}, "
        f"sum(CAST(_unkeyed AS BIGINT)) OVER (PARTITION BY {group}) AS _n, "
        f"row_number() OVER (PARTITION BY {group} ORDER BY {order}) AS _rank FROM cmds) WHERE _rank = 1"
    )
    w = f"(PARTITION BY {klist} ORDER BY _time)"
    prev = "".join(f", lag({v}) OVER {w} AS _prev_{i}" for i, v in enumerate(values))
    con.execute(
        f"CREATE TEMP TABLE ordered AS SELECT *, lag(true) OVER {w} AS _has_prev, lag(_del) OVER {w} AS _prev_del, "
        f"lag(_error) OVER {w} AS _prev_error{prev}, min(_time) OVER (PARTITION BY {klist}) AS _first FROM per_time"
    )
    types = {c.name: c.type for c in cfg.columns}
    null_values = [f"CAST(NULL AS {duck_type(types[v])})" for v in cfg.value_columns]
    prev_values = [f"_prev_{i}" for i in range(len(values))]

    def branch(vals: list[str], error: str, diff: str, where: str) -> str:
        return f"SELECT {', '.join([*keys, *vals, error])}, _time, {diff} FROM ordered WHERE {where}"

    on = " AND ".join(f"u.{k} IS NOT DISTINCT FROM t.{k}" for k in keys)
    both = ", ".join(f"u.{c}" for c in [*keys, *values])
    # keys first, then values, in every branch (UNION ALL is by position); named by the first
    kv = [f"{c} AS {c}" for c in [*keys, *values]]
    return " UNION ALL ".join(
        [
            f"SELECT {', '.join([*kv, '_error AS _error'])}, _time AS _time, CAST(1 AS BIGINT) AS _diff "
            "FROM ordered WHERE _n = 0 AND NOT _del",
            branch(prev_values, "_prev_error", "CAST(-1 AS BIGINT)", "_n = 0 AND _has_prev AND NOT _prev_del"),
            branch(null_values, "_error", "_n", "_n <> 0"),
            f"SELECT {both}, u._error, t._first, -sum(u._diff) FROM {shard} u "
            f"JOIN (SELECT {klist}, _first FROM ordered WHERE _n = 0 AND _time = _first) t ON {on} "
            f"WHERE u._time <= {int(lower) - 1} GROUP BY {both}, u._error, t._first HAVING sum(u._diff) <> 0",
        ]
    )

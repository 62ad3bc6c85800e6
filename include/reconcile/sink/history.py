"""The queries of a shard's history as type-2 versions, and of the changes between two times: plain
SQL over the Delta table (``python -m reconcile history`` and ``diff``; their reports are printed by
:mod:`reconcile.sink.history_print`).

The shard is an update log; the collection as of ``t`` sums, per row, the ``_diff`` of the
updates with ``_time <= t``. Read as a slowly changing dimension of type 2:

- **query and changelog sinks**: a version of a distinct row is a maximal time interval during
  which its count (multiplicity) is constant and non-zero: ``(row..., count, valid_from,
  valid_to)``. A row whose count goes 1 -> 2 -> 0 has two versions.
- **upsert sinks**: the same, numbered per key: a key's version is its value row from the
  command that set it until the next change of its value or its delete (``valid_to``); the
  columns are ``(schema columns..., version, count, valid_from, valid_to)``, ``count`` is 1
  unless someone wrote behind the sink's back.
- ``valid_from`` is the first time (epoch ms) the version is in the collection, ``valid_to``
  the first time it is not (exclusive; null while current).
- **Error rows are not values**: the history of ok rows leaves them out (an upsert key whose
  value becomes an error row has no version meanwhile); ``errors=True`` gives the error rows'
  own history (per distinct ``(row, _error)``, with ``_error``).
- **Exact at and after since**: compaction advanced every update before the shard's ``since``
  to ``since``, so versions that ended before it are gone, a version starting at ``since`` may
  have begun earlier, and an upsert key's versions are numbered from there. Times before since
  are refused (:func:`check_time`, :func:`check_range`).

The SQL is standard (GROUP BY, window functions: ``SUM ... OVER``, ``LEAD``, ``ROW_NUMBER``), so
Spark (``delta.`path```), DuckDB (``delta_scan('path')``) and Trino (a registered Delta table)
run the same view; only identifier quoting differs. ``history`` and ``diff`` run it on DuckDB over
the shard's update log read by delta-rs (:class:`~reconcile.storage.reads.ShardReader`: no JVM),
or, on request (``--spark``), on a SparkSession (:func:`history`, :func:`diff`); both give the
same report.

**Times inside a batch.** A batch's updates carry their own times: a query sink's result is
stamped at its batch's ``upper - 1`` (the snapshot as of the batch's end), so a time between a
batch's ``lower`` and its ``upper - 1`` reads the collection before that batch. When a time
given to ``history --as-of`` or ``diff`` falls there, in a batch all of whose updates are stamped
at ``upper - 1``, the report says so and names the time that includes the batch
(:func:`reconcile.storage.reads.stamp_note`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconcile import kinds
from reconcile.config import SinkConfig
from reconcile.errors import SinkError
from reconcile.kinds import HistoryKeys
from reconcile.log import iso
from reconcile.model import COMMITTED
from reconcile.report import stamp
from reconcile.sql_names import duckdb_name, quoter, spark_name, trino_name
from reconcile.storage.delta import ShardTable
from reconcile.storage.reads import UPDATES, ShardReader, stamp_note

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DIALECTS = ("spark", "duckdb", "trino")


# -- names -----------------------------------------------------------------------------------------


def output_names(cfg: SinkConfig) -> dict[str, str]:
    """The names of the columns the views add (``count``, ``valid_from``, ``valid_to``,
    ``version``, ``diff``), each prefixed with ``_`` as often as it takes to differ from the
    sink's own columns."""
    taken = {c.lower() for c in cfg.column_names}
    out = {}
    for base in ("count", "valid_from", "valid_to", "version", "diff"):
        name = base
        while name.lower() in taken:
            name = "_" + name
        out[base] = name
    return out


def grouping(cfg: SinkConfig, errors: bool = False) -> HistoryKeys:
    """How the history groups versions: as the sink's kind says (per key or per distinct row),
    or, for the error rows' history, per distinct ``(row, _error)``."""
    return HistoryKeys() if errors else kinds.of(cfg).history_keys


def table_ref(cfg: SinkConfig, dialect: str = "spark", location: str | None = None) -> str:
    """How ``dialect`` names the shard's Delta table at ``location`` (default: the sink's)."""
    loc = location or ShardTable(cfg).path
    if dialect == "spark":
        return "delta." + spark_name(loc)
    if dialect == "duckdb":
        return "delta_scan('" + loc.replace("'", "''") + "')"
    if dialect == "trino":  # Trino reads a Delta table registered in its catalog (see view_sql)
        return '"delta"."reconcile".' + trino_name(cfg.name)
    raise SinkError(f"unknown SQL dialect {dialect!r}: one of {', '.join(DIALECTS)}", sink=cfg.name)


# -- SQL ---------------------------------------------------------------------------------------------


def history_sql(cfg: SinkConfig, table: str, dialect: str = "spark", *, errors: bool = False) -> str:
    """The SELECT of the shard's type-2 history over ``table`` (see :func:`table_ref`): per key
    for upsert sinks, per distinct row otherwise; ok rows only, or (``errors``) the error rows'
    history per distinct ``(row, _error)``."""
    q = quoter(dialect)
    n = output_names(cfg)
    cols = cfg.column_names + (["_error"] if errors else [])
    row = ", ".join(q(c) for c in cols)
    t, d = q("_time"), q("_diff")
    cnt, vf, vt = q(n["count"]), q(n["valid_from"]), q(n["valid_to"])
    by_row = f"PARTITION BY {row} ORDER BY {t}"
    sql = (
        "WITH updates AS (\n"
        f"  SELECT {row}, {t}, CAST(SUM({d}) AS BIGINT) AS {d}\n"
        f"  FROM {table}\n"
        f"  WHERE {q('_error')} IS {'NOT ' if errors else ''}NULL\n"
        f"  GROUP BY {row}, {t}\n"
        f"  HAVING SUM({d}) <> 0\n"
        "), counts AS (\n"
        f"  SELECT {row},\n"
        f"    CAST(SUM({d}) OVER ({by_row} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS BIGINT) AS {cnt},\n"
        f"    {t} AS {vf},\n"
        f"    LEAD({t}) OVER ({by_row}) AS {vt}\n"
        "  FROM updates\n"
        ")"
    )
    per = grouping(cfg, errors)
    if not per.keys:
        return sql + f"\nSELECT {row}, {cnt}, {vf}, {vt}\nFROM counts\nWHERE {cnt} <> 0"
    keys = ", ".join(q(k) for k in per.keys)
    ties = "".join(f", {q(v)} NULLS FIRST" for v in per.ties)
    return (
        sql
        + f", versions AS (\n  SELECT {row}, {cnt}, {vf}, {vt}\n  FROM counts\n  WHERE {cnt} <> 0\n)\n"
        + f"SELECT {row},\n  ROW_NUMBER() OVER (PARTITION BY {keys} ORDER BY {vf}{ties}) AS {q(n['version'])},\n"
        + f"  {cnt}, {vf}, {vt}\nFROM versions"
    )


def diff_sql(cfg: SinkConfig, table: str, t1: int, t2: int, dialect: str = "spark") -> str:
    """The consolidated changes from ``t1`` (exclusive) to ``t2`` (inclusive): per distinct
    ``(row, _error)`` the sum of the diffs of its updates with ``t1 < _time <= t2``, non-zero."""
    q = quoter(dialect)
    row = ", ".join(q(c) for c in [*cfg.column_names, "_error"])
    t, d = q("_time"), q("_diff")
    return (
        f"SELECT {row}, CAST(SUM({d}) AS BIGINT) AS {q(output_names(cfg)['diff'])}\n"
        f"FROM {table}\n"
        f"WHERE {t} > {int(t1)} AND {t} <= {int(t2)}\n"
        f"GROUP BY {row}\n"
        f"HAVING SUM({d}) <> 0"
    )


def view_sql(cfg: SinkConfig, dialect: str = "spark", location: str | None = None, *, errors: bool = False) -> str:
    """A view definition of the history (``history --sql``) for ``dialect``, over the Delta
    table at ``location`` (default: the sink's)."""
    loc = location or ShardTable(cfg).path
    name = f"{cfg.name}_{'error_' if errors else ''}history"
    what = "error rows, per distinct (row, _error)" if errors else f"per {grouping(cfg).per}"
    head = [
        f"-- type-2 history of sink {cfg.name} ({cfg.kind}, {what}): valid_from inclusive, valid_to exclusive",
        "-- (epoch ms; null while current). Exact at and after the shard's since (see `reconcile status`).",
    ]
    if dialect == "trino":
        head.append(
            "-- register the table first: CALL delta.system.register_table(schema_name => 'reconcile', "
            f"table_name => '{cfg.name}', table_location => '{loc}')"
        )
        create = f'CREATE OR REPLACE VIEW "delta"."reconcile".{trino_name(name)} AS'
    elif dialect == "spark":
        create = f"CREATE OR REPLACE TEMPORARY VIEW {spark_name(name)} AS"
    else:
        create = f"CREATE OR REPLACE VIEW {duckdb_name(name)} AS"
    body = history_sql(cfg, table_ref(cfg, dialect, loc), dialect, errors=errors)
    return "\n".join([*head, create, body + ";"])


# -- ranges --------------------------------------------------------------------------------


def check_time(cfg: SinkConfig, since: int, upper: int, t: int) -> None:
    """Refuse a time the shard cannot answer exactly: before since, or not yet final."""
    if upper <= since or upper <= 0:
        raise SinkError("the shard has no committed batch yet: no readable time", sink=cfg.name)
    if not since <= t < upper:
        raise SinkError(
            f"as of {iso(t)} is outside the shard's readable times [since, upper - 1] = "
            f"[{iso(since)}, {iso(upper - 1)}]" + (" (before since it was compacted)" if t < since else ""),
            sink=cfg.name,
        )


def check_range(cfg: SinkConfig, since: int, upper: int, t1: int, t2: int) -> None:
    """``since <= t1 < t2 < upper``, or a one-line :class:`SinkError` naming the valid range."""
    if upper <= since or upper <= 0:
        raise SinkError("the shard has no committed batch yet: nothing to diff", sink=cfg.name)
    if not since <= t1 < t2 < upper:
        raise SinkError(
            f"diff from {iso(t1)} to {iso(t2)} is out of range: it needs since <= FROM < TO < upper, "
            f"i.e. {iso(since)} <= FROM < TO <= {iso(upper - 1)}",
            sink=cfg.name,
        )


def _require_table(cfg: SinkConfig) -> None:
    table = ShardTable(cfg)
    if not table.exists():
        raise SinkError(f"the shard's Delta table at {table.path} has no commits yet", sink=cfg.name)


# -- running on Spark ----------------------------------------------------------------------------------


def key_filter(cfg: SinkConfig, keys: list[str] | None) -> dict[str, str]:
    """``--key`` arguments as ``{column: value}``: ``COL=VALUE`` (any column of the sink), or a
    bare ``VALUE`` for an upsert sink with one key column."""
    names = {c.lower(): c for c in cfg.column_names}
    per = grouping(cfg)
    out: dict[str, str] = {}
    for k in keys or []:
        col, sep, value = k.partition("=")
        if sep and col.strip().lower() in names:
            out[names[col.strip().lower()]] = value
        elif per.bare_key is not None:
            out[per.bare_key] = k
        else:
            raise SinkError(
                f"--key {k!r}: expected COLUMN=VALUE with a column of {cfg.column_names}"
                + (f" (key: {list(per.keys)})" if per.keys else ""),
                sink=cfg.name,
            )
    return out


def history(
    spark: SparkSession,
    cfg: SinkConfig,
    *,
    errors: bool = False,
    key: Mapping[str, str] | None = None,
    as_of: int | None = None,
) -> DataFrame:
    """The history view run by Spark over the shard's Delta table; ``key``: only versions whose
    columns equal these values (compared as strings); ``as_of``: only the versions valid then."""
    from pyspark.sql import functions as F

    n = output_names(cfg)
    df = spark.sql(history_sql(cfg, table_ref(cfg, "spark"), "spark", errors=errors))
    for col, value in (key or {}).items():
        df = df.where(F.col(spark_name(col)).cast("string") == F.lit(value))
    if as_of is not None:
        vf, vt = F.col(n["valid_from"]), F.col(n["valid_to"])
        df = df.where((vf <= as_of) & (vt.isNull() | (vt > as_of)))
    return df


def diff(spark: SparkSession, cfg: SinkConfig, t1: int, t2: int) -> DataFrame:
    """The consolidated changes ``t1 < _time <= t2`` (:func:`diff_sql`) run by Spark."""
    return spark.sql(diff_sql(cfg, table_ref(cfg, "spark"), t1, t2, "spark"))


def _order(cfg: SinkConfig, errors: bool) -> list[str]:
    columns = [*cfg.column_names, *(["_error"] if errors else [])]
    return grouping(cfg, errors).order(columns, output_names(cfg)["valid_from"])


# -- running on DuckDB (no JVM) ----------------------------------------------------------------------


def _duckdb_key_filter(cfg: SinkConfig, key: Mapping[str, str]) -> tuple[list[str], list]:
    """``--key`` as DuckDB conditions with their parameters, matching what Spark's comparison of
    the column cast to a string matches: the same text for strings, integers, booleans, dates
    and decimals; the value the text parses to for floating point, timestamps and binary."""
    types = {c.name: c.type.lower().replace(" ", "") for c in cfg.columns}
    conds: list[str] = []
    params: list = []
    for col, value in key.items():
        q, typ = duckdb_name(col), types[col]
        parsed = {"float": "REAL", "double": "DOUBLE", "timestamp": "TIMESTAMPTZ", "timestamp_ntz": "TIMESTAMP"}
        if typ in parsed:
            conds.append(f"{q} = TRY_CAST(? AS {parsed[typ]})")
        elif typ == "binary":
            conds.append(f"{q} = ?")
            params.append(value.encode())
            continue
        else:
            conds.append(f"CAST({q} AS VARCHAR) = ?")
        params.append(value)
    return conds, params


@dataclass(frozen=True)
class _Versions:
    """The versions a history report asks either engine for: error rows or not, of ``key``
    (column: value), valid at ``as_of`` (None: all), the first ``limit + 1`` in :func:`_order`,
    and whether any starts at or before ``since`` (compaction cut the history there)."""

    errors: bool
    key: Mapping[str, str]
    as_of: int | None
    limit: int
    since: int


def _duckdb_versions(reader: ShardReader, cfg: SinkConfig, ask: _Versions) -> tuple[list[dict], bool]:
    """(the versions, whether any starts at or before ``since``) by DuckDB."""
    n = output_names(cfg)
    vf, vt = duckdb_name(n["valid_from"]), duckdb_name(n["valid_to"])
    conds, params = _duckdb_key_filter(cfg, ask.key)
    if ask.as_of is not None:
        conds.append(f"{vf} <= {int(ask.as_of)} AND ({vt} IS NULL OR {vt} > {int(ask.as_of)})")
    where = f"\nWHERE {' AND '.join(conds)}" if conds else ""
    body = history_sql(cfg, UPDATES, "duckdb", errors=ask.errors)
    reader.execute(f"CREATE OR REPLACE TEMP TABLE shard_versions AS SELECT * FROM (\n{body}\n) AS h{where}", params)
    order = ", ".join(f"{duckdb_name(c)} ASC NULLS FIRST" for c in _order(cfg, ask.errors))
    rows = reader.rows(f"SELECT * FROM shard_versions ORDER BY {order} LIMIT {int(ask.limit) + 1}")
    first = f"SELECT 1 AS one FROM shard_versions WHERE {vf} <= {int(ask.since)} LIMIT 1"
    return rows, ask.since > 0 and bool(reader.rows(first))


def _duckdb_changes(
    reader: ShardReader, cfg: SinkConfig, t1: int, t2: int, *, errors: bool, limit: int
) -> tuple[dict[tuple[bool, bool], tuple[int, int]], list[dict]]:
    """(rows and total |diff| per (error row?, added?), the first ``limit + 1`` changes) by DuckDB."""
    name = duckdb_name(output_names(cfg)["diff"])
    reader.execute(f"CREATE OR REPLACE TEMP TABLE shard_changes AS {diff_sql(cfg, UPDATES, t1, t2, 'duckdb')}")
    totals = {
        (r["err"], r["up"]): (int(r["n"]), int(r["weight"]))
        for r in reader.rows(
            f'SELECT "_error" IS NOT NULL AS err, {name} > 0 AS up, count(*) AS n, SUM(ABS({name})) AS weight '
            "FROM shard_changes GROUP BY ALL"
        )
    }
    cols = [*cfg.column_names, *(["_error"] if errors else [])]
    select = ", ".join(duckdb_name(c) for c in cols)
    order = ", ".join(f"{duckdb_name(c)} ASC NULLS FIRST" for c in cols)
    rows = reader.rows(
        f'SELECT {select}, {name} FROM shard_changes WHERE "_error" IS {"NOT " if errors else ""}NULL '
        f"ORDER BY {order}, {name} LIMIT {int(limit) + 1}"
    )
    return totals, rows


# -- running on Spark (--spark) ----------------------------------------------------------------------


def _spark_versions(spark: SparkSession, cfg: SinkConfig, ask: _Versions) -> tuple[list[dict], bool]:
    """(the versions, whether any starts at or before ``since``) by Spark."""
    from pyspark.sql import functions as F

    n = output_names(cfg)
    df = history(spark, cfg, errors=ask.errors, key=ask.key, as_of=ask.as_of)
    order = [F.col(spark_name(c)).asc_nulls_first() for c in _order(cfg, ask.errors)]
    rows = [r.asDict() for r in df.orderBy(*order).limit(ask.limit + 1).collect()]
    cut = ask.since > 0 and bool(df.where(F.col(n["valid_from"]) <= ask.since).limit(1).count())
    return rows, cut


def _spark_changes(
    spark: SparkSession, cfg: SinkConfig, t1: int, t2: int, *, errors: bool, limit: int
) -> tuple[dict[tuple[bool, bool], tuple[int, int]], list[dict]]:
    from pyspark.sql import functions as F

    name = output_names(cfg)["diff"]
    df = diff(spark, cfg, t1, t2).cache()
    try:
        totals = {
            (r["err"], r["up"]): (int(r["rows"]), int(r["weight"]))
            for r in df.groupBy(F.col("_error").isNotNull().alias("err"), (F.col(name) > 0).alias("up"))
            .agg(F.count(F.lit(1)).alias("rows"), F.sum(F.abs(F.col(name))).alias("weight"))
            .collect()
        }
        mine = df.where(F.col("_error").isNotNull() if errors else F.col("_error").isNull())
        if not errors:
            mine = mine.drop("_error")
        order = [F.col(spark_name(c)).asc_nulls_first() for c in [*cfg.column_names] + (["_error"] if errors else [])]
        rows = [r.asDict() for r in mine.orderBy(*order, F.col(name)).limit(limit + 1).collect()]
    finally:
        df.unpersist()
    return totals, rows


# -- the reports ------------------------------------------------------------------------------------


def _notes(source: ShardTable | ShardReader, ledger, cfg: SinkConfig, times: list[tuple[str, int]]) -> list[str]:
    """What a time given inside a batch stamped at its ``upper - 1`` reads (see the module doc)."""
    if not times:
        return []
    batches = [(b.lower, b.upper) for b in ledger.batches(cfg.name, states=(COMMITTED,))]
    return [n for what, t in times if (n := stamp_note(source, batches, what, t)) is not None]


def _sources_of(ledger, cfg: SinkConfig, versions: list[dict]) -> list[dict]:
    """Per committed batch whose time (``upper - 1``) begins or ends a listed version: the Delta
    source versions it read (a query sink's over Delta sources), oldest first."""
    from reconcile.manifest import source_versions
    from reconcile.report import refresh_of

    n = output_names(cfg)
    times = {v[n[end]]["ms"] for v in versions for end in ("valid_from", "valid_to") if v[n[end]]}
    out = []
    for b in ledger.batches(cfg.name, states=(COMMITTED,)):
        found = source_versions(b.manifest) if b.upper - 1 in times else None
        if found:
            way = refresh_of(b.manifest)
            out.append(
                {
                    "time": stamp(b.upper - 1),
                    "batch_id": b.batch_id,
                    "sources": found,
                    "refresh": way["text"] if way else None,
                }
            )
    return out


def history_report(
    ledger,
    cfg: SinkConfig,
    *,
    spark: SparkSession | None = None,
    errors: bool = False,
    keys: list[str] | None = None,
    as_of: int | None = None,
    limit: int = 50,
) -> dict:
    """What ``history`` prints: the shard's frontiers, its versions (ordered by key or row, then
    valid_from; at most ``limit``), when compaction cut the history the note saying so, and the
    note on an ``as_of`` inside a batch stamped at its ``upper - 1``. Read by DuckDB (no JVM), or
    by ``spark`` when given: the same report."""
    shard = ledger.get_shard(cfg.name)
    if as_of is not None:
        check_time(cfg, shard.since, shard.upper, as_of)
    _require_table(cfg)
    n = output_names(cfg)
    key = key_filter(cfg, keys)
    times = [("--as-of", as_of)] if as_of is not None else []
    ask = _Versions(errors, key, as_of, limit, shard.since)
    if spark is not None:
        rows, cut = _spark_versions(spark, cfg, ask)
        notes = _notes(ShardTable(cfg), ledger, cfg, times)
    else:
        with ShardReader(ShardTable(cfg)) as reader:
            rows, cut = _duckdb_versions(reader, cfg, ask)
            notes = _notes(reader, ledger, cfg, times)
    note = None
    if cut:
        note = (
            f"history before since {iso(shard.since)} was compacted: versions that ended before it are gone, "
            "and those valid from since may have begun earlier (exact from since on)"
        )
    versions = []
    for d in rows[:limit]:
        d[n["valid_from"]] = stamp(d[n["valid_from"]])
        d[n["valid_to"]] = stamp(d[n["valid_to"]])
        versions.append(d)
    return {
        "sources": _sources_of(ledger, cfg, versions),
        "sink": cfg.name,
        "kind": cfg.kind,
        "per": "error row" if errors else grouping(cfg).per,
        "since": stamp(shard.since),
        "upper": stamp(shard.upper),
        "as_of": stamp(as_of),
        "note": note,
        "notes": notes,
        "versions": versions,
        "truncated": len(rows) > limit,
    }


def diff_report(
    ledger,
    cfg: SinkConfig,
    t1: int,
    t2: int,
    *,
    spark: SparkSession | None = None,
    errors: bool = False,
    limit: int = 50,
) -> dict:
    """What ``diff`` prints: the rows added (``diff`` > 0) and removed (< 0) from ``t1``
    (exclusive) to ``t2`` (inclusive), ok rows or (``errors``) error rows, with totals, and the
    notes on a time inside a batch stamped at its ``upper - 1``. Read by DuckDB (no JVM), or by
    ``spark`` when given: the same report."""
    shard = ledger.get_shard(cfg.name)
    check_range(cfg, shard.since, shard.upper, t1, t2)
    _require_table(cfg)
    times = [("--from", t1), ("--to", t2)]
    if spark is not None:
        totals, rows = _spark_changes(spark, cfg, t1, t2, errors=errors, limit=limit)
        notes = _notes(ShardTable(cfg), ledger, cfg, times)
    else:
        with ShardReader(ShardTable(cfg)) as reader:
            totals, rows = _duckdb_changes(reader, cfg, t1, t2, errors=errors, limit=limit)
            notes = _notes(reader, ledger, cfg, times)

    def total(err: bool, up: bool) -> dict:
        n_rows, weight = totals.get((err, up), (0, 0))
        return {"rows": n_rows, "count": weight}

    return {
        "sink": cfg.name,
        "from": stamp(t1),
        "to": stamp(t2),
        "errors": errors,
        "added": total(errors, True),
        "removed": total(errors, False),
        "error_rows_changed": sum(total(True, up)["rows"] for up in (True, False)),
        "notes": notes,
        "changes": rows[:limit],
        "truncated": len(rows) > limit,
    }

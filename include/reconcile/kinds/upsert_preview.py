"""An upsert sink's next correction in DuckDB, without a JVM (:mod:`reconcile.kinds.preview`).

As :mod:`reconcile.kinds.upsert` computes it in Spark: the feed's eligible commands, validated
(:func:`_commands`); the highest offset wins per (key, time); each touched key's value as of
``lower - 1`` retracted at its first command, every later command retracting the previous one's
value (:func:`_correction`). :class:`~reconcile.kinds.preview.NotExact` where Spark might
differ (see :mod:`reconcile.kinds.preview`).
"""

from __future__ import annotations

from reconcile.config import Source, UpsertSink
from reconcile.kinds.preview import (
    NotExact,
    Updates,
    duck_type,
    insert_rows,
    json_text,
    literal,
    register_source,
    require_known_text,
    sink_type,
    spark_text,
    spark_type_of,
)
from reconcile.model import FeedProgress
from reconcile.sql_names import duckdb_name


def updates(con, cfg: UpsertSink, lower: int, upper: int, watermark: int | None, shard: str) -> Updates:
    """The batch's updates over the connection ``con`` whose table ``shard`` holds the shard's
    update log (the feed registered as a view of ``con``), each at its own ``_time``; the feed's
    progress."""
    feed = _commands(con, cfg, lower, upper, watermark)
    return Updates(_correction(con, cfg, lower, shard), "_time", feed)


def _messages(cfg: UpsertSink, row: dict, t, o, is_delete: bool) -> tuple[str | None, bool]:
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


def _commands(con, cfg: UpsertSink, lower: int, upper: int, watermark: int | None) -> FeedProgress:
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
        marks = ", ".join(literal(v) for v in cfg.delete_values)
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
        message, unkeyed = _messages(cfg, row, r[-3], r[-2], bool(r[-1]))
        errors.append((r[0], message, unkeyed))
    if errors:
        require_known_text(cfg)
    con.execute("CREATE TEMP TABLE command_errors (_rid BIGINT, _error VARCHAR, _unkeyed BOOLEAN)")
    insert_rows(con, "command_errors", [f"({rid}, {literal(m or '')}, {str(u).lower()})" for rid, m, u in errors])
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
    return FeedProgress(commands=int(n), late_commands=int(n_late), source_offset=max(offsets) if offsets else None)


def _correction(con, cfg: UpsertSink, lower: int, shard: str) -> str:
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

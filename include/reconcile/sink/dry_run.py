"""``dry-run`` without a JVM: the next batch's correction computed by DuckDB, written nowhere.

The shard's update log is read as ``show`` reads it (:class:`~reconcile.storage.reads.ShardReader`:
DuckDB over the files delta-rs names); the kind says what the batch changes
(:func:`reconcile.kinds.preview.updates_sql`, or :class:`~reconcile.kinds.preview.NotExact` where
DuckDB might not compute exactly what Spark will, and the command asks Spark); the updates are
consolidated here, as the write consolidates them.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconcile.config import SinkConfig
from reconcile.kinds.preview import NotExact, duck_type, failed, updates_sql
from reconcile.sql_names import duckdb_name
from reconcile.storage.delta import ShardTable

__all__ = ["NotExact", "Preview", "correction"]


@dataclass
class Preview:
    """The correction a run would write: its update rows (the sink's columns, ``_error``,
    ``_time``, ``_diff``: the first ``limit``) and their totals."""

    rows: list[dict]
    updates: int
    inserts: int
    retractions: int
    errors: int
    feed: dict | None = None  # an upsert feed's progress: commands, late, offset


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
        updates, time, feed = updates_sql(con, cfg, lower, upper, watermark, UPDATES)
        con.execute(
            f"CREATE TEMP TABLE reconcile_correction AS SELECT {cols}, _error, CAST({time} AS BIGINT) AS _time, "
            f"CAST(SUM(_diff) AS BIGINT) AS _diff FROM ({updates}) GROUP BY {cols}, _error, {time} "
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
        return Preview(rows, int(n), int(ins), int(ret), int(err), feed)
    except duckdb.Error as exc:  # anything DuckDB refuses that the kind did not foresee
        raise failed("compute the correction", exc) from None
    finally:
        con.close()

"""The shard read without a JVM: its update log as a DuckDB table, for the reads that fit one
machine (``show``, ``history``, ``diff``; Spark on request, ``--spark``).

How the rows reach DuckDB (:class:`ShardReader`), both through the shard's
:class:`~reconcile.storage.delta.ShardTable`, so its storage options apply:

- a local table whose files are plain Parquet (:meth:`ShardTable.plain_files`: the snapshot's
  files, no deletion vector, no column mapping): DuckDB reads exactly those files, the
  ``_time`` filter pushed into its scan;
- anything else (an object store, deletion vectors, column mapping, a table without files):
  delta-rs scans the snapshot (its DataFusion reader applies deletion vectors and column
  mapping) and hands DuckDB the Arrow batches.

Values come back as PySpark's ``collect`` returns them (the output is the same whichever engine
read): timestamps as naive datetimes in local time, binary as ``bytearray``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from reconcile.log import iso
from reconcile.storage.delta import ShardTable

UPDATES = "updates"  # the name of the shard's update log in the reader's DuckDB connection


def _spark_value(v: Any) -> Any:
    if isinstance(v, datetime) and v.tzinfo is not None:
        return v.astimezone().replace(tzinfo=None)  # PySpark: local time, naive
    if isinstance(v, bytes):
        return bytearray(v)
    return v


class ShardReader:
    """A DuckDB connection whose table ``updates`` is the shard's update log at its latest Delta
    version (every column of the table: the sink's, ``_time``, ``_diff``, ``_error``)."""

    def __init__(self, table: ShardTable):
        import duckdb

        self.table = table
        self.con = duckdb.connect()
        # Times are compared as numbers; a TIMESTAMPTZ is returned in UTC before _spark_value
        # makes it local (no dependency on DuckDB's own time zone handling).
        self.con.execute("SET TimeZone = 'UTC'")
        files = None if "://" in table.path else table.plain_files()  # a URI: delta-rs's store
        if files:
            listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
            self.con.execute(
                f"CREATE TEMP TABLE {UPDATES} AS SELECT * FROM read_parquet([{listed}], "
                f"hive_partitioning = false, union_by_name = true)"
            )
        else:
            self._from_arrow()
        self.engine = "duckdb" if files else "delta-rs"
        self._project()

    def _project(self) -> None:
        """While the sink file's schema change waits for the next run (issue 52), the update log
        read in the file's columns: a renamed column under its new name, an added one null, a
        dropped one left out (values as stored: a widened column's fit its new type)."""
        from reconcile.sql_names import duckdb_name as duck_name
        from reconcile.storage import schema_change

        cols = [d[0] for d in self.con.execute(f"DESCRIBE {UPDATES}").fetchall()]
        have = {c.lower(): c for c in cols}
        cfg = self.table.cfg
        if all(c.name.lower() in have for c in cfg.columns):
            return
        sink_cols, _ = schema_change.table_columns(self.table.snapshot().schema().to_json())
        plan = schema_change.plan(cfg, sink_cols)
        renamed = {c.column: c.old for c in plan.changes if c.what == schema_change.RENAMED}
        exprs = []
        for c in cfg.columns:
            src = have.get((renamed.get(c.name.lower()) or c.name).lower())
            exprs.append(f"{duck_name(src) if src else 'NULL'} AS {duck_name(c.name)}")
        own = [duck_name(have[k]) for k in ("_error", "_time", "_diff") if k in have]
        self.con.execute(f"ALTER TABLE {UPDATES} RENAME TO {UPDATES}_as_stored")
        self.con.execute(f"CREATE TEMP TABLE {UPDATES} AS SELECT {', '.join(exprs + own)} FROM {UPDATES}_as_stored")
        self.con.execute(f"DROP TABLE {UPDATES}_as_stored")

    def _from_arrow(self) -> None:
        import pyarrow as pa

        reader = pa.RecordBatchReader.from_stream(self.table.snapshot().scan())
        arrow = reader.read_all()  # noqa: F841 - DuckDB reads the local variable by name
        self.con.execute(f"CREATE TEMP TABLE {UPDATES} AS SELECT * FROM arrow")

    def rows(self, sql: str, params: list | None = None) -> list[dict]:
        """The rows of a query, each a dict of column -> value (as PySpark returns values)."""
        cur = self.con.execute(sql, params or [])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, map(_spark_value, r), strict=True)) for r in cur.fetchall()]

    def execute(self, sql: str, params: list | None = None) -> None:
        self.con.execute(sql, params or [])

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def stamp_note(source: ShardTable | ShardReader, batches: list[tuple[int, int]], what: str, t: int) -> str | None:
    """Why the shard as of ``t`` lacks the batch ``t`` falls in, when it does: ``t`` is inside a
    committed batch ``(lower, upper)`` (``batches``) before its ``upper - 1``, and every update
    of that batch is stamped at ``upper - 1`` (a query sink's snapshot is: it is the result as of
    the batch's end). None otherwise. Reads only the ``_time`` of the batch's updates: from a
    reader's DuckDB table, or from the table (delta-rs)."""
    inside = [(lo, up) for lo, up in batches if lo <= t < up - 1]
    if not inside:
        return None
    lower, upper = inside[0]
    if isinstance(source, ShardReader):
        found = source.rows(
            f"SELECT DISTINCT _time FROM {UPDATES} WHERE _time >= {int(lower)} AND _time < {int(upper)} LIMIT 2"
        )
        times = {r["_time"] for r in found}
    else:
        import pyarrow as pa

        where = f"_time >= {int(lower)} AND _time < {int(upper)}"
        scan = source.snapshot().scan(columns=["_time"], predicate=where)
        times = set(pa.RecordBatchReader.from_stream(scan).read_all().column("_time").unique().to_pylist())
    if times != {upper - 1}:
        return None  # no update in the batch, or some at their own times: t reads them as they are
    return (
        f"{what} {iso(t)} is inside batch [{iso(lower)}, {iso(upper)}), all of whose updates are stamped at its "
        f"upper - 1, {iso(upper - 1)} (a query's result is the collection as of its batch's end): as of {what} "
        f"the shard still holds what it held before that batch, whose changes count from {upper - 1} on"
    )

"""Every reader the docs name, reading a current-state table (tests/test_current.py and
tests/test_dbt.py compare them with their models)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

READERS = ["delta-rs scan", "delta-rs to_pyarrow_table", "duckdb", "polars", "spark"]


def every_reader(spark, path: str, columns: list[str], *, vectors: bool = False) -> dict[str, Counter]:
    """A current table's rows (``columns``) as each reader the docs name reads them (:data:`READERS`):
    delta-rs (``scan``, and ``to_pyarrow_table`` where it reads the table: without deletion
    vectors), DuckDB (``delta_scan``), Polars and Spark (dbt-duckdb: tests/test_dbt.py)."""
    import duckdb
    import polars as pl
    from deltalake import DeltaTable
    from duckdb_extensions import import_extension

    def rows(table: pa.Table) -> Counter:
        return Counter(zip(*table.select(columns).to_pydict().values(), strict=True))

    out = {"delta-rs scan": rows(pa.RecordBatchReader.from_stream(DeltaTable(path).scan()).read_all())}
    if vectors:
        with pytest.raises(Exception, match="(?i)deletion ?vectors"):  # the reason the default has none
            DeltaTable(path).to_pyarrow_table()
    else:
        out["delta-rs to_pyarrow_table"] = rows(DeltaTable(path).to_pyarrow_table())
    con = duckdb.connect()
    import_extension("delta", con=con)
    con.sql("LOAD delta")
    names = ", ".join(f'"{c}"' for c in columns)
    out["duckdb"] = Counter(con.execute(f"SELECT {names} FROM delta_scan('{path}')").fetchall())
    out["polars"] = Counter(pl.read_delta(path).select(columns).iter_rows())
    out["spark"] = Counter(tuple(r) for r in spark.read.format("delta").load(path).select(*columns).collect())
    return out

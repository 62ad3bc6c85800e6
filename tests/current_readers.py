"""Every reader the docs name, reading a current-state table (tests/test_current.py and
tests/test_dbt.py compare them with their models); and analysts' readers in processes of their
own reading a table by name while a run writes its batch (tests/test_current.py and
tests/test_metastore_service.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from helpers import write_json_rows

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


def rows_of(counter: Counter) -> list[list]:
    """A ``(k, v)`` model's rows (:func:`helpers.model_kv`) as a sorted list of ``[k, v]``."""
    return sorted(([k, v] for k, v, _ in counter.elements()), key=json.dumps)


def start_run(env: dict[str, str], sink: str, frontier: int, src: Path, rows: list[dict]) -> subprocess.Popen:
    """``reconcile run SINK --frontier FRONTIER`` in a process of its own, once the feed's ``rows``
    are written to the JSON folder ``src``."""
    write_json_rows(src, rows)
    argv = [sys.executable, "-m", "reconcile", "run", sink, "--frontier", str(frontier)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start_readers(
    env: dict[str, str], cwd: Path, query: str, analyst: str, *args: str
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """Two analysts reading at once, each in a process of its own: ``python -m reconcile sql
    QUERY`` (run in ``cwd``) and the Python script ``analyst`` with ``args``."""
    sql = subprocess.Popen(
        [sys.executable, "-m", "reconcile", "sql", query],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    reader = subprocess.Popen(
        [sys.executable, "-c", analyst, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return sql, reader


def readers_saw(
    batch: subprocess.Popen,
    readers: tuple[subprocess.Popen, subprocess.Popen],
    stop: Path,
    before: list[list],
    after: list[list],
) -> tuple[str, float, dict]:
    """Wait for ``batch`` (the run the :func:`start_readers` readers read during; it must
    succeed), then touch ``stop`` (the analyst's last read) and wait for both readers (both must
    succeed). Each read the ``k, v`` rows ``before`` or ``after`` the batch, never a half-applied
    state; the analyst read ``after`` last and printed its model over it (``RESULT {...}``: its
    reads, ``seen``, and ``model``, the count of rows by ``v``). Returns the batch's stdout and
    stderr, when it ended and the analyst's RESULT."""
    sql, analyst = readers
    out, err = batch.communicate(timeout=600)
    ended = time.time()
    assert batch.returncode == 0, out[-2000:] + err[-2000:]
    stop.touch()
    sql_out, sql_err = sql.communicate(timeout=600)
    got_out, got_err = analyst.communicate(timeout=600)
    assert sql.returncode == 0 and analyst.returncode == 0, sql_err[-3000:] + got_err[-3000:]
    # the sql command: a header and the rows, the state before or after the batch
    header, *body = sql_out.splitlines()
    assert header == "k\tv"
    shown = sorted(([int(k), None if v == "NULL" else v] for k, v in (ln.split("\t") for ln in body)), key=json.dumps)
    assert shown in (before, after), sql_out
    got = json.loads(next(ln for ln in got_out.splitlines() if ln.startswith("RESULT "))[7:])
    assert all(s["rows"] in (before, after) for s in got["seen"]) and got["seen"][-1]["rows"] == after
    assert got["model"] == sorted(([v, n] for v, n in Counter(v for _, v in after).items()), key=json.dumps)
    return out + err, ended, got

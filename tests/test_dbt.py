"""A consumer's dbt project over the sinks' current-state tables (tests/dbt_project: dbt-core and
dbt-duckdb from PyPI, DuckDB's delta extension from its PyPI package): sources on a query sink's
table (DuckDB's ``delta_scan``) and an upsert sink's (dbt-duckdb's ``delta`` plugin, delta-rs's
reader, which reads the default layout), one model joining them. ``dbt build`` runs offline (in a
network namespace of its own where the machine lets it make one), green with its tests, after
batches that update, delete and re-insert; its model equals a plain-Python computation from the
sinks' models; and so do delta-rs, DuckDB, Polars and Spark."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from current_readers import READERS, every_reader
from helpers import make_sink, run_stages, write_json_rows
from reconcile.storage.current import CurrentTable
from upsert_model import HINT, UpsertModel, cmd, upsert_sink

PROJECT = Path(__file__).resolve().parent / "dbt_project"

ORDERS = [  # (order_id, customer, amount) per batch
    [(1, 1, "10.00"), (2, 1, "5.50"), (3, 2, "7.25")],
    [(1, 1, "12.00"), (3, 2, "7.25"), (4, 3, "1.00")],  # 1 updated, 2 deleted, 4 new
    [(1, 1, "12.00"), (2, 1, "5.50"), (3, 2, "7.25"), (4, 3, "1.00"), (5, 2, "0.01")],  # 2 re-inserted
]


def customers_feed(batch: int, lower: int) -> list[dict]:
    """The upsert sink's commands of one batch: names set, one updated, one deleted, re-inserted."""
    if batch == 0:
        return [cmd(k, name, lower + k, k, op="set") for k, name in ((1, "Ann"), (2, "Bob"), (3, "Cy"), (4, "Dee"))]
    if batch == 1:
        return [cmd(1, "Anne", lower + 1, 11, op="set"), cmd(2, None, lower + 2, 12, op="delete")]
    return [cmd(2, "Bobby", lower + 1, 21, op="set"), cmd(4, None, lower + 2, 22, op="delete")]


def expected(customers: dict[int, str], orders: list[tuple[int, int, str]]) -> list[tuple]:
    """The model, computed in plain Python: per customer, its name, orders and total."""
    out = []
    for k, name in customers.items():
        mine = [Decimal(a) for _, c, a in orders if c == k]
        out.append((k, name, len(mine), sum(mine, Decimal("0"))))
    return sorted(out)


def offline(argv: list[str]) -> list[str]:
    """``argv`` in a network namespace of its own (no network at all), where one can be made."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n", *argv]
    return argv


def dbt_build(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[tuple]]:
    import duckdb

    db = tmp_path / "marts.duckdb"
    env = {
        **os.environ,
        "DBT_DUCKDB_PATH": str(db),
        "DBT_PROFILES_DIR": str(PROJECT),
        "DBT_TARGET_PATH": str(tmp_path / "dbt-target"),
        "DBT_LOG_PATH": str(tmp_path / "dbt-logs"),
    }
    dbt = str(Path(sys.executable).with_name("dbt"))
    run = subprocess.run(
        offline([dbt, "build", "--project-dir", str(PROJECT)]), env=env, capture_output=True, text=True, timeout=300
    )
    if run.returncode != 0:
        return run, []
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT customer, name, orders, total FROM customer_totals").fetchall()
    con.close()
    return run, sorted((int(k), n, int(o), Decimal(t)) for k, n, o, t in rows)


@pytest.mark.slow  # six batches of two sinks, then one dbt build (seconds)
def test_dbt_build_over_two_current_tables_equals_the_model(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    import duckdb
    from duckdb_extensions import import_extension

    import_extension("delta", con=duckdb.connect())  # from the PyPI package into DuckDB's extensions
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    orders = make_sink(
        tmp_path,
        "orders",
        schema=[
            {"name": "order_id", "type": "bigint", "nullable": False},
            {"name": "customer", "type": "bigint", "nullable": False},
            {"name": "amount", "type": "decimal(12,2)"},
        ],
        query={
            "sources": {"src": {"format": "json", "path": "src"}},
            "sql": "SELECT order_id, customer, CAST(amount AS DECIMAL(12,2)) AS amount FROM src",
        },
        current=True,
    )
    customers = upsert_sink(
        tmp_path, "customers", upsert={"delete": {"column": "op", "values": ["delete"]}}, current=True
    )
    model = UpsertModel(delete_field="op", delete_values=("delete",))
    feed: list[dict] = []
    for i, rows in enumerate(ORDERS):
        lower, upper = 100 * (i + 1), 100 * (i + 2)
        write_json_rows(tmp_path / "src", [{"order_id": o, "customer": c, "amount": a} for o, c, a in rows])
        feed += customers_feed(i, lower)
        write_json_rows(tmp_path / "feed", feed + [{**HINT, "op": "set"}])
        for cfg in (orders, customers):
            _, _, appended = run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
            assert appended.outcome == "committed", appended.message
        model.batch(feed, lower, upper)
    run, got = dbt_build(tmp_path)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "Completed successfully" in run.stdout and "ERROR=0" in run.stdout, run.stdout[-2000:]
    names = {k: v for (k, v, _), n in model.as_of(upper - 1).items() if n > 0}
    assert got == expected(names, ORDERS[-1])
    assert [k for k, *_ in got] == [1, 2, 3] and got[1][1] == "Bobby"  # 2 re-inserted, 4 deleted
    # every other reader the docs name reads the same default tables
    for cfg, want in (
        (orders, Counter((o, c, Decimal(a)) for o, c, a in ORDERS[-1])),
        (customers, Counter(names.items())),
    ):
        columns = cfg.column_names
        assert every_reader(spark, CurrentTable(cfg).path, columns) == dict.fromkeys(READERS, want), cfg.name

"""``dry-run`` without a JVM: a query sink's next correction computed by DuckDB
(:mod:`reconcile.sink.dry_run`, :mod:`reconcile.kinds.preview`) equals the one Spark computes for the run (the write stage's
``batch_correction``) and a plain-Python model of the query kind (the result's rows minus the shard
as of ``upper - 1``, a null in a non-nullable column an error row with Spark's message), on random
snapshots with duplicates, nulls, aggregates, decimals, dates and error rows. Where the two engines
could differ the preview refuses with the reason, and the command asks Spark as the run will.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import AS_OF, make_sink, run_stages, update_log, write_json_rows
from reconcile import cli
from reconcile.kinds import preview
from reconcile.sink import dry_run
from reconcile.sink.write import batch_correction
from reconcile.storage import frames
from reconcile.storage.delta import ShardTable
from upsert_model import HINT, upsert_sink

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = [
    {"name": "k", "type": "bigint", "nullable": False},
    {"name": "v", "type": "string"},
    {"name": "amount", "type": "decimal(10,2)"},
    {"name": "day", "type": "date"},
    {"name": "flag", "type": "boolean"},
]
SQL = (
    "SELECT k, v, CAST(amount AS DECIMAL(10,2)) AS amount, CAST(day AS DATE) AS day, flag "
    "FROM src WHERE coalesce(v, '') <> 'skip'"
)
GROUPED = [
    {"name": "v", "type": "string", "nullable": False},
    {"name": "n", "type": "bigint", "nullable": False},
    {"name": "total", "type": "bigint"},
    {"name": "amount", "type": "decimal(12,2)"},
]
GROUPED_SQL = (
    "SELECT v, count(*) AS n, sum(k) AS total, CAST(sum(amount) AS DECIMAL(12,2)) AS amount FROM src GROUP BY v"
)


def random_rows(rng: random.Random) -> list[dict]:
    rows = []
    for _ in range(rng.randint(0, 8)):
        rows.append(
            {
                "k": rng.choice([1, 2, 3, None]),
                "v": rng.choice(["a", "b", 'q"uote', "é/ü", "skip", None]),
                "amount": rng.choice([1.5, 2.25, 10.0, None]),
                "day": rng.choice(["2026-01-01", "2026-02-28", None]),
                "flag": rng.choice([True, False, None]),
            }
        )
    # every field typed in every file, as Spark infers it (a field null in every row is a string)
    rows.append({"k": 9, "v": "x", "amount": 0.5, "day": "2026-03-01", "flag": False})
    return rows


def spark_text(v) -> str:
    return str(v).lower() if isinstance(v, bool) else f"{v:.2f}" if isinstance(v, Decimal) else str(v)


def model(cfg, result: list[dict], shard: Counter) -> Counter:
    """The correction the query kind defines: each result row +1 (a null in a non-nullable column:
    an error row, all columns null, Spark's message), minus the shard as of ``upper - 1``."""
    names = cfg.column_names
    out: Counter = Counter()
    for r in result:
        nulls = [c.name for c in cfg.columns if not c.nullable and r[c.name] is None]
        if nulls:
            fields = ",".join(json.dumps(c) + ":" + json.dumps(spark_text(r[c])) for c in names if r[c] is not None)
            msg = "; ".join(f"column '{c}' is null but not nullable" for c in nulls) + " in row {" + fields + "}"
            out[(*[None] * len(names), msg)] += 1
        else:
            out[(*[r[c] for c in names], None)] += 1
    out.subtract(shard)
    return Counter({k: v for k, v in out.items() if v})


def plain_result(rows: list[dict], grouped: bool) -> list[dict]:
    """The query's result, by Python."""

    def typed(r: dict) -> dict:
        amount = None if r["amount"] is None else Decimal(str(r["amount"])).quantize(Decimal("0.01"))
        day = None if r["day"] is None else dt.date.fromisoformat(r["day"])
        return {**r, "amount": amount, "day": day}

    if not grouped:
        return [typed(r) for r in rows if (r["v"] or "") != "skip"]
    groups: dict = {}
    for r in map(typed, rows):
        groups.setdefault(r["v"], []).append(r)
    out = []
    for v, rs in groups.items():
        ks = [r["k"] for r in rs if r["k"] is not None]
        amounts = [r["amount"] for r in rs if r["amount"] is not None]
        out.append(
            {"v": v, "n": len(rs), "total": sum(ks) if ks else None, "amount": sum(amounts) if amounts else None}
        )
    return out


def by_row(cfg, rows) -> Counter:
    return Counter({(*[r[c] for c in cfg.column_names], r["_error"]): r["_diff"] for r in rows})


@pytest.mark.parametrize("grouped", [False, True], ids=["rows", "grouped"])
def test_the_preview_equals_spark_s_correction_and_the_model(spark, warehouse, tmp_path, sqlite_ledger, grouped):
    rng = random.Random(7 + grouped)
    schema, sql = (GROUPED, GROUPED_SQL) if grouped else (SCHEMA, SQL)
    cfg = make_sink(
        tmp_path, "pv", schema=schema, query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
    )
    table = ShardTable(cfg)
    shard: Counter = Counter()  # the model's shard as of the last upper - 1
    for i in range(4):
        rows = random_rows(rng)
        write_json_rows(tmp_path / "src", rows)
        lower, upper = AS_OF + 100 * i, AS_OF + 100 * (i + 1)
        got = dry_run.correction(cfg, table, lower, upper, limit=1000)
        assert got.rows == sorted(got.rows, key=lambda r: r["_error"] is not None), "ok rows first"
        assert all(r["_time"] == upper - 1 for r in got.rows)
        persist = frames.read_updates(spark, table) if table.exists() else spark.createDataFrame([], frames.schema(cfg))
        by_spark = batch_correction(spark, sqlite_ledger, cfg, persist, lower, upper).updates.collect()
        assert by_row(cfg, got.rows) == by_row(cfg, [r.asDict() for r in by_spark]), (i, rows)
        want = model(cfg, plain_result(rows, grouped), shard)
        assert by_row(cfg, got.rows) == want, (i, rows)
        assert got.updates == len(want) and got.errors == sum(1 for k in want if k[-1] is not None)
        assert (got.inserts, got.retractions) == (
            sum(v for v in want.values() if v > 0),
            sum(-v for v in want.values() if v < 0),
        )
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", upper)
        shard.update(want)
        shard = +shard
    assert shard, "the shard holds rows"


def changelog_model(cfg, log: list[dict], shard_updates: list[dict], lower: int, upper: int) -> Counter:
    """The change-log kind's correction: the log's updates below ``upper`` (a null or zero diff,
    a null time or a null non-nullable column: an error row with Spark's message) minus the
    shard's, both advanced to ``lower``; per (row..., error, time)."""
    names = cfg.column_names
    out: Counter = Counter()
    for r in log:
        t, d = r["ts"], r["diff"]
        first = ["diff column 'diff' is null, zero or not an integer"] if not d else []
        first += ["time column 'ts' is null or not an integer"] if t is None else []
        nulls = [
            f"column '{c.name}' is null but not nullable" for c in cfg.columns if not c.nullable and r[c.name] is None
        ]
        if first or nulls:
            fields = ",".join(json.dumps(c) + ":" + json.dumps(spark_text(r[c])) for c in names if r[c] is not None)
            key = (*[None] * len(names), "; ".join(first + nulls) + " in row {" + fields + "}")
            t, d = t or 0, 1 if first else d
        else:
            key = (*[r[c] for c in names], None)
        if t < upper:
            out[(*key, max(t, lower))] += d
    for u in shard_updates:
        if u["_time"] < upper:
            out[(*[u[c] for c in names], u["_error"], max(u["_time"], lower))] -= u["_diff"]
    return Counter({k: v for k, v in out.items() if v})


def test_a_change_log_s_preview_equals_spark_s_correction_and_the_model(spark, warehouse, tmp_path, sqlite_ledger):
    rng = random.Random(5)
    cfg = make_sink(tmp_path, "pvc", kind="changelog")
    table = ShardTable(cfg)
    log: list[dict] = []
    for i in range(4):
        lower, upper = AS_OF + 100 * i, AS_OF + 100 * (i + 1)
        for _ in range(rng.randint(1, 6)):  # late, current and future updates, some bad
            log.append(
                {
                    "k": rng.choice([1, 2, None]),
                    "v": rng.choice(["a", "b", None]),
                    "ts": rng.choice([None, rng.randrange(0, upper + 150)]),
                    "diff": rng.choice([1, 1, -1, 2, 0, None]),
                }
            )
        write_json_rows(tmp_path / "log", [*log, {"k": 7, "v": "z", "ts": 10_000, "diff": 1}])  # typed fields
        got = dry_run.correction(cfg, table, lower, upper, limit=1000)
        persist = frames.read_updates(spark, table) if table.exists() else spark.createDataFrame([], frames.schema(cfg))
        by_spark = batch_correction(spark, sqlite_ledger, cfg, persist, lower, upper).updates.collect()

        def timed(rows) -> Counter:
            return Counter({(*[r[c] for c in cfg.column_names], r["_error"], r["_time"]): r["_diff"] for r in rows})

        assert timed(got.rows) == timed([r.asDict() for r in by_spark]), (i, log)
        assert timed(got.rows) == changelog_model(cfg, log, update_log(cfg) if table.exists() else [], lower, upper)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", upper)
    assert update_log(cfg), "the shard holds updates"


@pytest.mark.parametrize("deletes", ["null-values", "marker"])
def test_an_upsert_sink_s_preview_equals_spark_s_correction(spark, warehouse, tmp_path, sqlite_ledger, deletes):
    """Random feeds over four batches (late commands past the watermark, replays, deletes, keys
    updated twice in a batch, commands without a key, time or offset, values that do not fit):
    the preview's correction and feed progress equal Spark's for the run."""
    rng = random.Random(3 if deletes == "marker" else 4)
    extra = {}
    if deletes == "marker":
        extra = {
            "upsert": {"delete": {"column": "op", "values": ["d", "D"]}},
            "schema": [
                {"name": "k", "type": "bigint", "nullable": False},
                {"name": "v", "type": "string", "nullable": False},
            ],
        }
    cfg = upsert_sink(tmp_path, "pvu", **extra)
    table = ShardTable(cfg)
    feed: list[dict] = []
    off = 0
    for i in range(4):
        lower, upper = AS_OF + 100 * i, AS_OF + 100 * (i + 1)
        for _ in range(rng.randint(2, 8)):
            off += 1
            c = {
                "k": rng.choice([1, 2, 3, 4, None]),
                "v": rng.choice(["a", "b", None]),
                "ts": rng.choice([None, rng.randrange(max(0, lower - 120), upper + 60)]),
                "off": rng.choice([off, off, off, None]),
            }
            if deletes == "marker":
                c["op"] = rng.choice(["u", "u", "d", "D", None])
            feed.append(c)
        if feed and rng.random() < 0.5:
            feed.append(dict(rng.choice(feed)))  # a replay
        hint = {**HINT, **({"op": "u"} if deletes == "marker" else {})}
        write_json_rows(tmp_path / "feed", [*feed, hint])
        wm = sqlite_ledger.watermark(cfg.name)
        got = dry_run.correction(cfg, table, lower, upper, limit=1000, watermark=wm)
        persist = frames.read_updates(spark, table) if table.exists() else spark.createDataFrame([], frames.schema(cfg))
        result = batch_correction(spark, sqlite_ledger, cfg, persist, lower, upper)
        by_spark = [r.asDict() for r in result.updates.collect()]
        progress = result.progress

        def timed(rows) -> Counter:
            return Counter({(*[r[c] for c in cfg.column_names], r["_error"], r["_time"]): r["_diff"] for r in rows})

        assert timed(got.rows) == timed(by_spark), (i, feed)
        assert got.feed == progress, (i, feed)
        run_stages(spark, sqlite_ledger, cfg, f"run-{i}", upper)
    assert update_log(cfg), "the shard holds updates"


def test_the_demo_sink_s_preview_equals_spark_s_correction(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """Every example sink in include/sinks (the demo's), over the demo's three days of orders."""
    from reconcile import demo
    from reconcile.config_loading import load_file

    monkeypatch.setenv("RECONCILE_HOME", str(tmp_path / "home"))
    examples = sorted((ROOT / "include" / "sinks").glob("*.yaml"))
    assert [p.stem for p in examples] == ["demo_orders"], "a new example sink needs its data here"
    cfg = load_file(examples[0])
    table = ShardTable(cfg)
    day = 24 * 3600 * 1000
    for i in range(len(demo.DAYS)):
        demo.write_orders(i)
        lower, upper = cfg.as_of + i * day, cfg.as_of + (i + 1) * day
        got = dry_run.correction(cfg, table, lower, upper, limit=1000)
        persist = frames.read_updates(spark, table) if table.exists() else spark.createDataFrame([], frames.schema(cfg))
        by_spark = batch_correction(spark, sqlite_ledger, cfg, persist, lower, upper).updates.collect()
        assert got.rows and by_row(cfg, got.rows) == by_row(cfg, [r.asDict() for r in by_spark]), i
        run_stages(spark, sqlite_ledger, cfg, f"demo-{i}", upper)


def test_a_query_s_duckdb_sql_is_kept_per_sql_and_sqlglot_version(tmp_path, monkeypatch):
    """The next dry run of a sink reads its query in DuckDB's dialect from the home's cache (no
    sqlglot import); another SQL text is another entry; an unreadable entry is computed again."""
    monkeypatch.setenv("RECONCILE_HOME", str(tmp_path / "home"))
    cfg = make_sink(
        tmp_path,
        "cached",
        query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, CAST(v AS STRING) v FROM src"},
    )
    sql = preview.duckdb_sql(cfg)
    assert sql == preview.transpile(cfg) and "CAST(v AS TEXT)" in sql and "TRY_CAST" not in sql, sql
    entries = list((tmp_path / "home" / "cache" / "duckdb-sql").iterdir())
    assert [e.read_text() for e in entries] == [sql]
    entries[0].write_text("SELECT 'from the cache' AS k")
    assert preview.duckdb_sql(cfg) == "SELECT 'from the cache' AS k"  # read, not computed
    other = make_sink(
        tmp_path, "other", query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src"}
    )
    assert preview.duckdb_sql(other) == "SELECT k, v FROM src"
    assert len(list(entries[0].parent.iterdir())) == 2
    entries[0].unlink()
    entries[0].mkdir()  # unreadable, and cannot be replaced: computed each time
    assert preview.duckdb_sql(cfg) == sql


def test_the_preview_refuses_what_it_could_get_wrong(tmp_path, warehouse, sqlite_ledger):
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a", "x": 1.5}])
    write_json_rows(tmp_path / "mixed", [{"k": 1, "v": 1.50}, {"k": 2, "v": "b"}])  # Spark: v "1.50"
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("k,v\n1,a\n")
    (tmp_path / "nested" / "p=1").mkdir(parents=True)
    cases = {
        "is csv": {
            "sources": {"src": {"format": "csv", "path": "csv"}},
            "sql": "SELECT CAST(k AS BIGINT) k, v FROM src",
        },
        "reader options": {"sources": {"src": {"format": "json", "path": "src", "options": {"multiLine": True}}}},
        "sub-folders": {"sources": {"src": {"format": "json", "path": "nested"}}},
        "field v is read as JSON": {"sources": {"src": {"format": "json", "path": "mixed"}}},
        "not one query": {"sql": "SELECT k, v FROM src; SELECT k, v FROM src"},
        "the sink's type is bigint": {"sql": "SELECT CAST(x AS DOUBLE) AS k, v FROM src"},
        "not the sink's": {"sql": "SELECT k, v, x FROM src"},
    }
    for i, (why, query) in enumerate(cases.items()):
        query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src", **query}
        cfg = make_sink(tmp_path, f"no{i}", query=query)
        with pytest.raises(dry_run.NotExact, match=why):
            dry_run.correction(cfg, ShardTable(cfg), 100, 200, limit=10)
    doubles = make_sink(
        tmp_path, "dbl", schema=[{"name": "k", "type": "bigint", "nullable": False}, {"name": "x", "type": "double"}],
        query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT CAST(NULL AS BIGINT) AS k, x FROM src"},
    )  # fmt: skip
    with pytest.raises(dry_run.NotExact, match="floats, times or bytes"):
        dry_run.correction(doubles, ShardTable(doubles), 100, 200, limit=10)
    ups = upsert_sink(tmp_path, upsert={"source": {"format": "csv", "path": "csv"}})
    with pytest.raises(dry_run.NotExact, match="upsert.source is csv"):
        dry_run.correction(ups, ShardTable(ups), 100, 200, limit=10)


def test_dry_run_prints_the_preview_or_says_why_spark_computes_it(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": None, "v": "x"}, {"k": 1, "v": "a"}])
    cfg = make_sink(tmp_path, "dr")
    assert cli.main(["dry-run", cfg.name, "--frontier", "300"]) == 0
    out = capsys.readouterr().out
    assert "computed by DuckDB" in out and "nothing was written" in out, out
    assert "2 update(s): 3 row(s) inserted, 0 retracted, 1 error update(s)" in out, out
    assert 'column \'k\' is null but not nullable in row {"v":"x"}' in out, out
    assert sqlite_ledger.batches(cfg.name) == []  # a dry run mints nothing

    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("k,v\n1,a\n2,b\n")
    csv = make_sink(
        tmp_path,
        "drcsv",
        query={"sources": {"src": {"format": "csv", "path": "csv"}}, "sql": "SELECT CAST(k AS BIGINT) k, v FROM src"},
    )
    assert cli.main(["dry-run", csv.name, "--frontier", "300"]) == 0
    out = capsys.readouterr().out
    assert "dry run with Spark, as the run computes it: source src is csv" in out, out
    assert "|_part|updates|errors|inserts|retractions|" in out and "|1  |a  |NULL  |299  |1    |" in out, out
    assert cli.main(["dry-run", cfg.name, "--frontier", "300", "--spark"]) == 0
    out = capsys.readouterr().out
    assert "computed by DuckDB" not in out and "dry run with Spark" not in out and "nothing was written" in out, out

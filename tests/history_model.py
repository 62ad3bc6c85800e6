"""Models and shards of the history tests (``history`` and ``diff`` of every kind): a version is
a maximal interval of constant non-zero count of a plain-Python model evaluated at every
millisecond, never read from the code under test; and the randomized shards they are checked on."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from helpers import change, changelog_model, make_sink, run_stages, write_json_rows
from reconcile.sink import history

AS_OF = 100  # make_sink's default; batch i covers [100 * (i + 1), 100 * (i + 2))


# -- the model -------------------------------------------------------------------------------------


def model_versions(state_at: Callable[[int], Counter], start: int, end: int) -> Counter:
    """Versions ``(row..., count, valid_from, valid_to)`` of the collection ``state_at(t)``
    (a Counter of row tuples) over the times ``start <= t < end``, one millisecond at a time;
    versions still open at ``end`` are current (``valid_to`` None)."""
    open_: dict[tuple, tuple[int, int]] = {}
    out: list[tuple] = []
    for t in range(start, end):
        state = state_at(t)
        for row in set(open_) | {r for r, n in state.items() if n}:
            n = state.get(row, 0)
            if row in open_ and open_[row][0] != n:
                count, since = open_.pop(row)
                out.append((*row, count, since, t))
            if n and row not in open_:
                open_[row] = (n, t)
    out += [(*row, count, since, None) for row, (count, since) in open_.items()]
    return Counter(out)


def numbered_per_key(versions: Counter) -> Counter:
    """Upsert versions ``(k, v, count, valid_from, valid_to)`` as ``(k, v, version, count,
    valid_from, valid_to)``, numbered per key in ``valid_from`` order (then null v, then v)."""
    out: Counter = Counter()
    seen: Counter = Counter()
    for k, v, count, since, until in sorted(versions, key=lambda x: (x[0], x[3], x[1] is not None, x[1] or "")):
        seen[k] += 1
        out[(k, v, seen[k], count, since, until)] += 1
    return out


def model_diff(state_at: Callable[[int], Counter], t1: int, t2: int) -> Counter:
    before, after = state_at(t1), state_at(t2)
    return Counter({r: after[r] - before[r] for r in set(before) | set(after) if after[r] != before[r]})


# -- reading what the code computes ------------------------------------------------------------------


def duckdb_rows(sql: str, setup: str | None = None, *, delta: bool = True) -> Counter:
    """What DuckDB returns for ``sql`` (after ``setup``); ``delta``: with its Delta extension."""
    import duckdb
    from duckdb_extensions import import_extension

    con = duckdb.connect()
    try:
        if delta:
            import_extension("delta", con=con)
            con.sql("LOAD delta")
        if setup:
            con.execute(setup)
        return Counter(tuple(r) for r in con.sql(sql).fetchall())
    finally:
        con.close()


def spark_history(spark, cfg, **kw) -> Counter:
    return Counter(tuple(r) for r in history.history(spark, cfg, **kw).collect())


def same_history_everywhere(spark, cfg, *, errors: bool = False) -> Counter:
    """The history by Spark and by DuckDB over the Delta table: they must agree."""
    by_spark = spark_history(spark, cfg, errors=errors)
    by_duckdb = duckdb_rows(history.history_sql(cfg, history.table_ref(cfg, "duckdb"), "duckdb", errors=errors))
    assert by_duckdb == by_spark
    return by_spark


def ok_diff(spark, cfg, t1: int, t2: int) -> Counter:
    """``diff`` by Spark, ok rows: ``(row...) -> diff``; DuckDB's must be the same."""
    got = Counter({tuple(r)[:-1]: r[-1] for r in history.diff(spark, cfg, t1, t2).collect()})
    duck = duckdb_rows(history.diff_sql(cfg, history.table_ref(cfg, "duckdb"), t1, t2, "duckdb"))
    assert Counter({r[:-1]: r[-1] for r in duck}) == got
    return Counter({r[:-1]: n for r, n in got.items() if r[-1] is None})


def check_diffs(spark, cfg, rng: random.Random, state_at, since: int, upper: int, pairs: int = 2) -> None:
    for _ in range(pairs):
        t1, t2 = sorted(rng.sample(range(since, upper), 2))
        assert ok_diff(spark, cfg, t1, t2) == model_diff(state_at, t1, t2), (t1, t2)


# -- building shards -----------------------------------------------------------------------------------


def query_shard(spark, ledger, tmp_path, rng: random.Random, batches: int):
    """A query sink refreshed ``batches`` times with random snapshots (duplicates, null values,
    sometimes a row that does not fit: an error row); returns its config, the ok-rows model and
    the error rows' model."""
    cfg = make_sink(tmp_path, "hq")
    runs: list[tuple[int, list[dict]]] = []
    for i in range(batches):
        rows = [{"k": rng.randint(1, 3), "v": rng.choice(["a", "b", None])} for _ in range(rng.randint(1, 5))]
        rows += [{"k": None, "v": "bad"}] * rng.choice([0, 0, 1, 2])  # k is not nullable
        write_json_rows(tmp_path / "src", rows)
        frontier = AS_OF + 100 * (i + 1)
        run_stages(spark, ledger, cfg, f"run-{i}", frontier)
        runs.append((frontier, rows))

    def snapshot(t: int) -> list[dict]:
        seen = [rows for frontier, rows in runs if frontier - 1 <= t]  # stamped at upper - 1
        return seen[-1] if seen else []

    def ok(t: int) -> Counter:
        return Counter((r["k"], r["v"]) for r in snapshot(t) if r["k"] is not None)

    def err(t: int) -> Counter:
        return +Counter({("ERR",): sum(r["k"] is None for r in snapshot(t))})

    return cfg, ok, err


def changelog_shard(spark, ledger, tmp_path, rng: random.Random, batches: int):

    cfg = make_sink(tmp_path, "hc", kind="changelog")
    runs: list[tuple[int, list[dict]]] = []
    source: list[dict] = []
    for i in range(batches):
        lower, frontier = AS_OF + 100 * i, AS_OF + 100 * (i + 1)
        # some before lower (late: land at lower), some at or after the frontier (wait)
        new = [
            change(
                rng.randint(1, 3),
                rng.choice(["a", "b"]),
                rng.randint(lower - 40, frontier + 30),
                rng.choice([1, 1, 2, -1]),
            )
            for _ in range(rng.randint(2, 6))
        ]
        source += new
        write_json_rows(tmp_path / "log", source)
        run_stages(spark, ledger, cfg, f"run-{i}", frontier)
        runs.append((frontier, new))

    def ok(t: int) -> Counter:
        return Counter({row[:-1]: n for row, n in changelog_model(runs, t).items()})

    return cfg, ok


def upsert_shard(spark, ledger, tmp_path, rng: random.Random, batches: int):
    from upsert_model import UpsertModel, cmd, feed_rows, upsert_sink

    cfg = upsert_sink(tmp_path, name="hu")
    model = UpsertModel()
    feed: list[dict] = []
    offset = 0
    for i in range(batches):
        lower, frontier = AS_OF + 100 * i, AS_OF + 100 * (i + 1)
        for _ in range(rng.randint(2, 6)):
            offset += 1  # null value: a delete
            feed.append(
                cmd(
                    rng.randint(1, 3), rng.choice(["a", "b", "c", None]), rng.randint(lower - 30, frontier + 20), offset
                )
            )
        if i == 0:
            offset += 1
            feed.append(cmd(None, "unkeyed", lower + 5, offset))  # an error row of its own
        feed_rows(tmp_path, feed)
        run_stages(spark, ledger, cfg, f"run-{i}", frontier)
        model.batch(feed, lower, frontier)

    def ok(t: int) -> Counter:
        return Counter({row[:-1]: n for row, n in model.as_of(t).items()})

    return cfg, ok


# -- the SQL alone, on DuckDB tables of random updates (no Spark: many histories) ---------------------

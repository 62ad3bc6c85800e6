"""Query sinks over Delta sources with change data feeds whose query groups or joins: each batch
recomputes only the keys its sources' changes touch (reconcile.kinds.incremental.keyed_updates),
and equals the model computed from the sources' rows in plain Python after every batch."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from helpers import make_sink, run_stages, shard_as_of

FROM_FEEDS = "incremental: the correction from the sources' change feeds"


def _said(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records if not r.getMessage().startswith("staged batch"))


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "incremental" in r.getMessage()]


def _columns(spec: str) -> list[dict]:
    """``"g string, n bigint"`` as a sink's schema (every column nullable)."""
    return [{"name": n, "type": t, "nullable": True} for n, t in (c.split() for c in spec.split(", "))]


class Source:
    """A Delta source with a change data feed and its rows, as the model sees them."""

    def __init__(self, spark, path: str, ddl: str, feed: bool = True) -> None:
        self.spark, self.path, self.ddl = spark, path, ddl
        self.rows: list[tuple] = []
        self.next_id = 0
        on = "true" if feed else "false"
        spark.sql(f"CREATE TABLE delta.`{path}` ({ddl}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = {on})")

    def insert(self, rows: list[tuple]) -> None:
        """Rows after their id (the first column)."""
        new = [(self.next_id + i, *r) for i, r in enumerate(rows)]
        self.next_id += len(rows)
        self.spark.createDataFrame(new, self.ddl).write.format("delta").mode("append").save(self.path)
        self.rows += new

    def update(self, row_id: int, column: str, position: int, value) -> None:
        literal = "NULL" if value is None else repr(value)
        self.spark.sql(f"UPDATE delta.`{self.path}` SET {column} = {literal} WHERE id = {row_id}")
        self.rows = [(*r[:position], value, *r[position + 1 :]) if r[0] == row_id else r for r in self.rows]

    def delete(self, where: str, keep) -> None:
        self.spark.sql(f"DELETE FROM delta.`{self.path}` WHERE {where}")
        self.rows = [r for r in self.rows if keep(r)]


def _sinks_over(tmp_path, source: Source, specs: dict[str, tuple[str, str]]) -> list:
    """Query sinks over ``source`` (as ``a``): per name, its columns (:func:`_columns`) and SQL."""
    sources = {"a": {"format": "delta", "path": source.path}}
    return [
        make_sink(tmp_path, name, schema=_columns(columns), query={"sources": sources, "sql": sql})
        for name, (columns, sql) in specs.items()
    ]


GROUPED = "SELECT g, count(*) AS n, sum(x) AS s, min(x) AS lo, max(x) AS hi FROM a WHERE x >= 0 GROUP BY g HAVING count(*) < 4"
UNKEYED = "SELECT max(x) AS hi, count(*) AS n FROM a GROUP BY lower(g)"  # an expression, not in the output


def _grouped(rows: list[tuple]) -> Counter:
    groups: dict = {}
    for _, g, x in rows:
        if x >= 0:
            groups.setdefault(g, []).append(x)
    return Counter((g, len(xs), sum(xs), min(xs), max(xs), None) for g, xs in groups.items() if len(xs) < 4)


def _unkeyed(rows: list[tuple]) -> Counter:
    groups: dict = {}
    for _, g, x in rows:
        groups.setdefault(g, []).append(x)
    return Counter((max(xs), len(xs), None) for xs in groups.values())


@pytest.mark.slow  # five batches of two sinks through Spark
def test_group_by_batches_recompute_the_groups_the_changes_touch(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """Two GROUP BY sinks over one source, of a column and of an expression (count, sum, min, max,
    HAVING; a null group; groups that appear, vanish, move between groups, pass and fail HAVING):
    after the first batch each batch recomputes the touched groups, their old rows read from the
    shard where the output carries the key, else from the source as of the previous batch's
    version; every batch equals the model."""
    a = Source(spark, str(tmp_path / "a"), "id BIGINT, g STRING, x BIGINT")
    by_shard, by_versions = _sinks_over(
        tmp_path,
        a,
        {
            "grouped": ("g string, n bigint, s bigint, lo bigint, hi bigint", GROUPED),
            "unkeyed": ("hi bigint, n bigint", UNKEYED),
        },
    )
    rng = random.Random(11)
    names = ["p", "q", "r", None]
    a.insert([(rng.choice(names), rng.randrange(-2, 9)) for _ in range(14)])

    def batch(i: int) -> None:
        caplog.clear()
        for cfg in (by_shard, by_versions):
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
        assert shard_as_of(by_shard, 199 + 100 * i) == _grouped(a.rows), i
        assert shard_as_of(by_versions, 199 + 100 * i) == _unkeyed(a.rows), i

    with caplog.at_level(logging.INFO, logger="reconcile"):
        batch(0)
        steps = [
            lambda: a.insert([("s", 1), ("s", 2), (None, 5)]),  # a new group; the null group grows
            lambda: (a.update(a.rows[0][0], "x", 2, 40), a.update(a.rows[1][0], "g", 1, "s")),  # a row moves
            lambda: a.delete("g = 'p'", lambda r: r[1] != "p"),  # a group vanishes
            lambda: (
                a.insert([("q", 3)] * 3),
                a.delete("g IS NULL AND x < 3", lambda r: not (r[1] is None and r[2] < 3)),
            ),
        ]
        for i, step in enumerate(steps, 1):
            step()
            batch(i)
            assert _said(caplog, FROM_FEEDS) == 2, _lines(caplog)
            assert _said(caplog, "incremental: a GROUP BY") == 2, _lines(caplog)
            assert _said(caplog, "their old rows from the shard") == 1, _lines(caplog)
            assert _said(caplog, "their old rows from the sources as of the previous batch's versions") == 1
        caplog.clear()
        run_stages(spark, sqlite_ledger, by_shard, "r5", 700)  # no change: nothing recomputed
        assert _said(caplog, FROM_FEEDS) == 1 and _said(caplog, "incremental: a GROUP BY") == 0, _lines(caplog)
        assert shard_as_of(by_shard, 699) == _grouped(a.rows)


COUNTED = (
    "SELECT g, count(*) AS n, count(x) AS c, sum(x) AS s, min(x) AS lo, max(x) AS hi, max(d) AS dm "
    "FROM a WHERE x IS NULL OR x > -5 GROUP BY g"
)
UNCOUNTED = "SELECT sum(x) AS s, g, min(d) AS dl FROM a GROUP BY g"  # no count(*): a group's end is unknown
FROM_AGGREGATES = "each touched group's row from its old one and the changes' aggregates"


def _counted(rows: list[tuple]) -> Counter:
    groups: dict = {}
    for _, g, x, d in rows:
        if x is None or x > -5:
            groups.setdefault(g, []).append((x, d))
    out = Counter()
    for g, members in groups.items():
        xs, ds = [x for x, _ in members if x is not None], [d for _, d in members if d is not None]
        out[
            (
                g,
                len(members),
                len(xs),
                sum(xs) if xs else None,
                min(xs, default=None),
                max(xs, default=None),
                max(ds, default=None),
                None,
            )
        ] += 1
    return out


def _uncounted(rows: list[tuple]) -> Counter:
    groups: dict = {}
    for _, g, x, d in rows:
        groups.setdefault(g, []).append((x, d))
    out = Counter()
    for g, members in groups.items():
        xs, ds = [x for x, _ in members if x is not None], [d for _, d in members if d is not None]
        out[(sum(xs) if xs else None, g, min(ds, default=None), None)] += 1
    return out


@pytest.mark.slow  # nine batches of two sinks through Spark
def test_group_by_batches_add_the_changes_partial_aggregates_to_the_old_rows(
    spark, warehouse, tmp_path, sqlite_ledger, caplog
):
    """GROUP BY sinks of count(*), count, sum (bigint, decimal), min and max (without HAVING, the
    output carrying the key) take each touched group's new row from its old row in the shard and
    the changes' partial aggregates, reading no source; a group whose extreme value the changes
    removed, or (without count(*)) whose rows may all be gone, is recomputed from the source. An
    update that leaves the extreme as it was needs no recomputation. Random inserts, updates
    (values, nulls, a row moving group), deletes (a group emptied, a maximum removed) over nine
    batches: every batch equals the model computed in Python."""
    from decimal import Decimal

    a = Source(spark, str(tmp_path / "a"), "id BIGINT, g STRING, x BIGINT, d DECIMAL(10,2)")
    counted, uncounted = _sinks_over(
        tmp_path,
        a,
        {
            "counted": ("g string, n bigint, c bigint, s bigint, lo bigint, hi bigint, dm decimal(10,2)", COUNTED),
            "uncounted": ("s bigint, g string, dl decimal(10,2)", UNCOUNTED),
        },
    )
    rng = random.Random(23)
    names = ["p", "q", "r", "s", None]

    def value():
        return None if rng.random() < 0.15 else rng.randrange(-8, 20)

    def dec():
        return None if rng.random() < 0.1 else Decimal(rng.randrange(0, 5000)) / 100

    a.insert([(rng.choice(names), value(), dec()) for _ in range(30)])
    recomputed = Counter()

    def batch(i: int) -> None:
        caplog.clear()
        for cfg in (counted, uncounted):
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
        assert shard_as_of(counted, 199 + 100 * i) == _counted(a.rows), i
        assert shard_as_of(uncounted, 199 + 100 * i) == _uncounted(a.rows), i

    def top_of(g):
        xs = [r for r in a.rows if r[1] == g and r[2] is not None]
        return max(xs, key=lambda r: r[2]) if xs else None

    def drop_top(g) -> None:
        top = top_of(g)[0]
        a.delete(f"id = {top}", lambda r: r[0] != top)

    with caplog.at_level(logging.INFO, logger="reconcile"):
        batch(0)
        steps = [
            lambda: a.insert([("t", 3, Decimal("1.50")), (None, None, None)]),  # a new group; nulls
            lambda: a.update(top_of("p")[0], "x", 2, top_of("p")[2]),  # rewritten as it was: nothing lost
            lambda: drop_top("q"),  # q's maximum gone
            lambda: a.update(a.rows[0][0], "g", 1, "t"),  # a row moves group
            lambda: a.delete("g = 'r'", lambda r: r[1] != "r"),  # a group emptied
            lambda: [a.update(r[0], "x", 2, None) for r in a.rows if r[1] == "t"],  # every x of t null
            lambda: a.insert([(rng.choice(names), value(), dec()) for _ in range(6)]),
            lambda: (a.delete("x < 0", lambda r: r[2] is None or r[2] >= 0), a.insert([("r", 7, None)])),
        ]
        for i, step in enumerate(steps, 1):
            step()
            batch(i)
            assert _said(caplog, FROM_FEEDS) == 2, _lines(caplog)
            assert _said(caplog, FROM_AGGREGATES) == 2, _lines(caplog)
            recomputed[i] = _said(caplog, "recomputed")
        assert recomputed[1] == 0 and recomputed[2] == 0, recomputed  # inserts, and a value kept: no source read
        assert recomputed[3] >= 1 and recomputed[5] >= 1, recomputed  # a maximum removed; rows gone (uncounted)


INNER = "SELECT a.k, a.v, b.w FROM a JOIN b ON a.k = b.k WHERE a.v <> 'z'"
LEFT = "SELECT a.k AS ak, b.k AS bk, a.v, b.w FROM a LEFT JOIN b ON a.k = b.k AND b.w <> 'n'"


def _inner(a: list[tuple], b: list[tuple]) -> Counter:
    return Counter((k, v, w, None) for _, k, v in a for _, kb, w in b if k is not None and k == kb and v != "z")


def _left(a: list[tuple], b: list[tuple]) -> Counter:
    out: Counter = Counter()
    for _, k, v in a:
        matches = [(kb, w) for _, kb, w in b if k is not None and k == kb and w != "n"]
        for kb, w in matches or [(None, None)]:
            out[(k, kb, v, w, None)] += 1
    return out


@pytest.mark.slow  # five batches of two sinks through Spark
def test_join_batches_recompute_the_keys_the_changes_touch(
    spark, warehouse, tmp_path, sqlite_ledger, caplog, monkeypatch
):
    """An inner and a left join of two sources on a key (duplicates on both sides, null keys, a
    condition beyond the key): changes on either side or both, keys appearing and vanishing, a
    row moving to another key; every batch after the first recomputes the touched keys from the
    sources as of now and as of the previous batch's versions (by their values up to two touched
    keys, by a semi-join beyond), and equals the model."""
    from reconcile.kinds import incremental

    monkeypatch.setattr(incremental, "FEW_KEYS", 2)
    a = Source(spark, str(tmp_path / "a"), "id BIGINT, k BIGINT, v STRING")
    b = Source(spark, str(tmp_path / "b"), "id BIGINT, k BIGINT, w STRING")
    sources = {"a": {"format": "delta", "path": a.path}, "b": {"format": "delta", "path": b.path}}
    inner = make_sink(
        tmp_path, "inner", schema=_columns("k bigint, v string, w string"), query={"sources": sources, "sql": INNER}
    )
    left = make_sink(
        tmp_path,
        "left",
        schema=_columns("ak bigint, bk bigint, v string, w string"),
        query={"sources": sources, "sql": LEFT},
    )
    rng = random.Random(3)
    keys = [1, 2, 3, 4, None]
    a.insert([(rng.choice(keys), rng.choice("xyz")) for _ in range(9)])
    b.insert([(rng.choice(keys), rng.choice("mn")) for _ in range(6)])

    def batch(i: int) -> None:
        caplog.clear()
        for cfg in (inner, left):
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
        assert shard_as_of(inner, 199 + 100 * i) == _inner(a.rows, b.rows), i
        assert shard_as_of(left, 199 + 100 * i) == _left(a.rows, b.rows), i

    with caplog.at_level(logging.INFO, logger="reconcile"):
        batch(0)
        steps = [
            lambda: a.insert([(5, "x"), (5, "y"), (None, "x")]),  # a key only a has; a null key
            lambda: b.insert([(5, "m"), (5, "m"), (6, "m")]),  # ... now matched twice; a key only b has
            lambda: (b.delete("k = 1", lambda r: r[1] != 1), a.update(a.rows[0][0], "k", 1, 6)),  # both sides
            lambda: (b.update(b.rows[0][0], "w", 2, "n"), a.delete("k = 5", lambda r: r[1] != 5)),
        ]
        ways = Counter()
        for i, step in enumerate(steps, 1):
            step()
            batch(i)
            assert _said(caplog, FROM_FEEDS) == 2, _lines(caplog)
            assert _said(caplog, "incremental: an inner join") == 1, _lines(caplog)
            assert _said(caplog, "incremental: a left outer join") == 1, _lines(caplog)
            ways["values"] += _said(caplog, "touched key value(s) recomputed")
            ways["semi-join"] += _said(caplog, "the touched key values recomputed")
        assert ways["values"] and ways["semi-join"], ways


def test_what_the_keys_do_not_determine_is_compared_in_full(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """A subquery (IN over another source), a window, a GROUP BY of a projection's column, a table read
    that is not a source (its changes are not seen), a GROUP BY over a source updated without a
    change data feed: each batch compares in full, says why, and equals the model."""
    a = Source(spark, str(tmp_path / "a"), "id BIGINT, k BIGINT, v STRING")
    b = Source(spark, str(tmp_path / "b"), "id BIGINT, k BIGINT, w STRING")
    c = Source(spark, str(tmp_path / "c"), "id BIGINT, k BIGINT, v STRING", feed=False)
    sources = {"a": {"format": "delta", "path": a.path}, "b": {"format": "delta", "path": b.path}}
    queries = {
        "sub": ("SELECT k, v FROM a WHERE k IN (SELECT k FROM b)", "k bigint, v string"),
        "window": (
            "SELECT k, v, row_number() OVER (PARTITION BY k ORDER BY v) AS n FROM a",
            "k bigint, v string, n int",
        ),
        "expr": (
            "SELECT kk % 2 AS odd, count(*) AS n FROM (SELECT k + 1 AS kk FROM a) GROUP BY kk % 2",
            "odd bigint, n bigint",
        ),
        "other": (f"SELECT k, v FROM a UNION ALL SELECT k, w FROM delta.`{b.path}`", "k bigint, v string"),
    }
    sinks = [
        make_sink(tmp_path, f"full_{n}", schema=_columns(cols), query={"sources": sources, "sql": sql})
        for n, (sql, cols) in queries.items()
    ]
    no_feed = {"c": {"format": "delta", "path": c.path}}
    sinks.append(
        make_sink(
            tmp_path,
            "full_no_feed",
            schema=_columns("k bigint, n bigint"),
            query={"sources": no_feed, "sql": "SELECT k, count(*) AS n FROM c GROUP BY k"},
        )
    )
    c.insert([(1, "x"), (1, "y"), (2, "z")])
    a.insert([(1, "x"), (2, "y"), (3, "x")])
    b.insert([(1, "m")])
    with caplog.at_level(logging.INFO, logger="reconcile"):
        for cfg in sinks:
            run_stages(spark, sqlite_ledger, cfg, "r0", 200)
        b.insert([(2, "m")])
        a.insert([(2, "w"), (5, "u")])
        c.update(c.rows[0][0], "k", 1, 2)
        caplog.clear()
        for cfg in sinks:
            run_stages(spark, sqlite_ledger, cfg, "r1", 300)
    assert _said(caplog, FROM_FEEDS) == 0, _lines(caplog)
    assert _said(caplog, "the query holds a subquery") == 1, _lines(caplog)
    assert _said(caplog, "nor one GROUP BY or join under projections and filters (Window)") == 1, _lines(caplog)
    assert _said(caplog, "is not a column or an expression of a source's columns") == 1, _lines(caplog)
    assert _said(caplog, "the query reads a table that is not one of its sources") == 1, _lines(caplog)
    assert _said(caplog, "not readable") == 1, _lines(caplog)
    rows = [(k, v) for _, k, v in a.rows]
    assert shard_as_of(sinks[0], 299) == Counter((k, v, None) for k, v in rows if k in {1, 2})
    by_k = {k: sorted(v for kk, v in rows if kk == k) for k, _ in rows}
    assert shard_as_of(sinks[1], 299) == Counter(
        (k, v, i + 1, None) for k, vs in by_k.items() for i, v in enumerate(vs)
    )
    assert shard_as_of(sinks[2], 299) == Counter(
        (o, sum((k + 1) % 2 == o for k, _ in rows), None) for o in {(k + 1) % 2 for k, _ in rows}
    )
    assert shard_as_of(sinks[3], 299) == Counter([(k, v, None) for k, v in rows] + [(k, w, None) for _, k, w in b.rows])
    assert shard_as_of(sinks[4], 299) == Counter((k, n, None) for k, n in Counter(k for _, k, _ in c.rows).items())

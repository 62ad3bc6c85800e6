"""Query sinks over Delta sources whose change data feed is on: batches computed from the sources'
changes (reconcile.kinds.incremental), each equal to the model computed from the sources' rows in
plain Python, and the full comparison wherever the changes do not determine the correction."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from helpers import append_foreign_row, make_sink, run_stages, shard_as_of

SQL = "SELECT k, v FROM a WHERE k % 3 <> 0 UNION ALL SELECT k, upper(v) AS v FROM b"


def _model(a: list[tuple[int, str]], b: list[tuple[int, str]]) -> Counter:
    """What the query gives, computed in Python: the shard's rows (k, v, no error) and counts."""
    return Counter([(k, v, None) for k, v in a if k % 3 != 0] + [(k, v.upper(), None) for k, v in b])


def _create(spark, path: str, cdf: bool = True) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k BIGINT, v STRING) USING delta "
        f"TBLPROPERTIES (delta.enableChangeDataFeed = {'true' if cdf else 'false'})"
    )


def _said(caplog, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


@pytest.mark.slow  # eleven batches through Spark
def test_batches_from_the_sources_change_feeds_equal_the_model(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """After its first batch, each batch of a projection/filter/UNION ALL query over two Delta
    sources with change data feeds takes the correction from the feeds (inserts, updates and
    deletes, duplicates, a batch in which one source or neither changed): the shard equals the
    model after every batch, as of each batch's time. A write to the shard behind the sink's back,
    or an edit of the sink file's query, sends the next batch to the full comparison (which repairs
    the drift, or applies the new query); the batch after is incremental again."""
    paths = {n: str(tmp_path / n) for n in ("a", "b")}
    for p in paths.values():
        _create(spark, p)
    sources = {n: {"format": "delta", "path": p} for n, p in paths.items()}
    cfg = make_sink(tmp_path, "incr", query={"sources": sources, "sql": SQL})
    rows: dict[str, list[tuple[int, str]]] = {"a": [], "b": []}
    rng = random.Random(5)
    next_k = 0

    def insert(name: str, n: int) -> None:
        nonlocal next_k
        new = []
        for _ in range(n):
            k = rng.choice([next_k, next_k]) if not rows[name] or rng.random() < 0.8 else rng.choice(rows[name])[0]
            next_k += 1
            new.append((k, rng.choice("xyz")))
        spark.createDataFrame(new, "k BIGINT, v STRING").write.format("delta").mode("append").save(paths[name])
        rows[name] += new

    def change(name: str) -> None:
        if not rows[name]:
            return
        k = rng.choice(rows[name])[0]
        if rng.random() < 0.5:
            spark.sql(f"UPDATE delta.`{paths[name]}` SET v = concat(v, 'u') WHERE k = {k}")
            rows[name] = [(kk, v + "u" if kk == k else v) for kk, v in rows[name]]
        else:
            spark.sql(f"DELETE FROM delta.`{paths[name]}` WHERE k = {k}")
            rows[name] = [(kk, v) for kk, v in rows[name] if kk != k]

    insert("a", 12)
    insert("b", 6)
    with caplog.at_level(logging.INFO, logger="reconcile"):
        run_stages(spark, sqlite_ledger, cfg, "r0", 200)
        assert shard_as_of(cfg, 199) == _model(rows["a"], rows["b"])
        assert _said(caplog, "incremental: the correction") == 0  # the first batch compares in full
        history = {199: _model(rows["a"], rows["b"])}
        plans = [("a", "b"), ("a",), (), ("b",), ("a", "b"), ("b", "a")]
        for i, touched in enumerate(plans, 1):
            for name in touched:
                insert(name, rng.randrange(0, 4))
                change(name)
                change(name)
            caplog.clear()
            upper = 200 + 100 * i
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
            assert _said(caplog, "incremental: the correction from the sources' change feeds") == 1, [
                r.getMessage() for r in caplog.records if "incremental" in r.getMessage() or "carried" in r.getMessage()
            ]
            assert _said(caplog, "comparing in full") == 0, i
            history[upper - 1] = _model(rows["a"], rows["b"])
        for t, want in history.items():
            assert shard_as_of(cfg, t) == want, t

        # drift: the next batch compares in full (and repairs it); the one after is incremental
        append_foreign_row(spark, cfg, 850)
        insert("a", 2)
        caplog.clear()
        run_stages(spark, sqlite_ledger, cfg, "r7", 900)
        assert _said(caplog, "incremental: the correction") == 0  # the shard is read and compared
        assert shard_as_of(cfg, 899) == _model(rows["a"], rows["b"])
        change("b")
        caplog.clear()
        run_stages(spark, sqlite_ledger, cfg, "r8", 1000)
        assert _said(caplog, "incremental: the correction") == 1
        assert shard_as_of(cfg, 999) == _model(rows["a"], rows["b"])

        # the sink file's query edited: the changes say nothing of it, the batch compares in full
        cfg = make_sink(tmp_path, "incr", query={"sources": sources, "sql": SQL.replace("upper(v)", "lower(v)")})
        change("a")
        caplog.clear()
        run_stages(spark, sqlite_ledger, cfg, "r9", 1100)
        assert _said(caplog, "the sink file's query, sources or columns changed") == 1
        assert _said(caplog, "incremental: the correction") == 0
        want = _model(rows["a"], []) + Counter((k, v.lower(), None) for k, v in rows["b"])
        assert shard_as_of(cfg, 1099) == want
        change("b")
        caplog.clear()
        run_stages(spark, sqlite_ledger, cfg, "r10", 1200)  # the next batch takes the changes again
        assert _said(caplog, "incremental: the correction") == 1
        assert shard_as_of(cfg, 1199) == _model(rows["a"], []) + Counter((k, v.lower(), None) for k, v in rows["b"])


def test_what_the_changes_do_not_determine_is_compared_in_full(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """A query with a window, and a source without a change data feed: every batch compares in
    full, says why on its log, and equals the model."""
    on, off = str(tmp_path / "on"), str(tmp_path / "off")
    _create(spark, on)
    _create(spark, off, cdf=False)
    spark.sql(f"INSERT INTO delta.`{on}` VALUES (1, 'x'), (1, 'y'), (2, 'z')")
    spark.sql(f"INSERT INTO delta.`{off}` VALUES (1, 'x'), (4, 'w')")
    grouped = make_sink(
        tmp_path,
        "incr_grouped",
        query={
            "sources": {"a": {"format": "delta", "path": on}},
            "sql": "SELECT k, cast(row_number() OVER (PARTITION BY k ORDER BY v) AS STRING) AS v FROM a",
        },
    )
    no_feed = make_sink(
        tmp_path,
        "incr_no_feed",
        query={"sources": {"a": {"format": "delta", "path": off}}, "sql": "SELECT k, v FROM a"},
    )
    with caplog.at_level(logging.INFO, logger="reconcile"):
        for cfg in (grouped, no_feed):
            run_stages(spark, sqlite_ledger, cfg, "r0", 200)
        spark.sql(f"INSERT INTO delta.`{on}` VALUES (2, 'q'), (3, 'r')")
        spark.sql(f"DELETE FROM delta.`{off}` WHERE k = 4")
        caplog.clear()
        for cfg in (grouped, no_feed):
            run_stages(spark, sqlite_ledger, cfg, "r1", 300)
    assert _said(caplog, "nor one GROUP BY or join under projections and filters (Window)") == 1
    assert _said(caplog, "change data feed is not readable") == 1
    assert _said(caplog, "incremental: the correction") == 0
    assert shard_as_of(grouped, 299) == Counter(
        (k, n, None) for k, n in [(1, "1"), (1, "2"), (2, "1"), (2, "2"), (3, "1")]
    )
    assert shard_as_of(no_feed, 299) == Counter({(1, "x", None): 1})


def test_a_source_that_only_grew_needs_no_change_feed(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """A source without a change data feed whose commits since the previous batch only appended
    rows: the files they added are the change, and the batch takes them alone; an UPDATE of the
    source sends the next batch to the full comparison. Every batch equals the model."""
    path = str(tmp_path / "grows")
    _create(spark, path, cdf=False)
    rows = [(1, "x"), (2, "y")]
    spark.createDataFrame(rows, "k BIGINT, v STRING").write.format("delta").mode("append").save(path)
    cfg = make_sink(
        tmp_path,
        "incr_appends",
        query={"sources": {"a": {"format": "delta", "path": path}}, "sql": "SELECT k, v FROM a WHERE k % 3 <> 0"},
    )
    with caplog.at_level(logging.INFO, logger="reconcile"):
        run_stages(spark, sqlite_ledger, cfg, "r0", 200)
        for i, more in enumerate([[(3, "z"), (4, "w"), (4, "w")], [(5, "v")], []], 1):
            for row in more:  # one commit a row
                spark.createDataFrame([row], "k BIGINT, v STRING").write.format("delta").mode("append").save(path)
            rows += more
            caplog.clear()
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", 200 + 100 * i)
            assert _said(caplog, "incremental: the correction") == 1, i
            assert shard_as_of(cfg, 199 + 100 * i) == _model(rows, []), i
        spark.sql(f"UPDATE delta.`{path}` SET v = 'u' WHERE k = 4")
        rows = [(k, "u" if k == 4 else v) for k, v in rows]
        caplog.clear()
        run_stages(spark, sqlite_ledger, cfg, "r4", 600)
        assert _said(caplog, "changed other than by appends") == 1
        assert shard_as_of(cfg, 599) == _model(rows, [])

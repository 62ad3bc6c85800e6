"""The kind protocol (``reconcile.kinds``): each kind says what the stages ask of it, and what it
says is what its correction does."""

from __future__ import annotations

import pytest

from helpers import make_sink, write_json_rows
from reconcile import checksums, kinds
from reconcile.checksums import SIDES, BatchChecks
from reconcile.storage import frames
from upsert_model import HINT, cmd, feed_rows, upsert_sink

LOWER, UPPER = 100, 200


def sink(tmp_path, kind: str, commands=()):
    """A sink of ``kind`` whose desired side adds nothing below UPPER: a query whose result is
    empty, a change log whose one update is at UPPER, a feed of ``commands`` (plus its schema
    hint, far in the future)."""
    if kind == "upsert":
        feed_rows(tmp_path, commands)
        return upsert_sink(tmp_path)
    if kind == "query":
        write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
        sql = "SELECT k, v FROM src WHERE k < 0"
        return make_sink(
            tmp_path, kind, kind, query={"sources": {"src": {"format": "json", "path": "src"}}, "sql": sql}
        )
    write_json_rows(tmp_path / "log", [{"k": 1, "v": "a", "ts": UPPER, "diff": 1}])
    return make_sink(tmp_path, kind, kind)


def correct(spark, cfg, carried):
    """The kind's correction of [LOWER, UPPER) over an empty shard whose checksums are ``carried``,
    run; (the correction, its rows, the batch's checksum totals)."""
    checks = BatchChecks(cfg, LOWER, UPPER, "test", carried)
    persist = spark.createDataFrame([], frames.schema(cfg))
    corr = kinds.of(cfg).correction(spark, persist, kinds.Bounds(LOWER, UPPER, checks=checks))
    with checksums.observable(spark):
        rows = corr.updates.collect()
    return corr, rows, checks.totals()


@pytest.mark.parametrize("kind", ["query", "changelog", "upsert"])
def test_the_shard_as_read_counts_into_the_checksum_sides_the_kind_names(spark, tmp_path, kind):
    """Nothing desired below UPPER: each checksum side is the carried shard's checksum times what
    the kind's ``persist_sides`` says (a query or change log desires its own frame; an upsert sink
    desires the shard as read, with no key touched)."""
    cfg = sink(tmp_path, kind)
    carried = {p: 1000 + 7 * p for p in range(cfg.partitions)}
    corr, rows, totals = correct(spark, cfg, carried)
    assert rows == []
    sides = kinds.of(cfg).persist_sides
    for side in SIDES:
        assert totals[side] == {p: c * sides.get(side, 0) for p, c in carried.items()}, side


def test_only_a_kind_that_reads_a_feed_reports_its_progress(spark, tmp_path):
    upsert = sink(tmp_path / "u", "upsert", [cmd(1, "a", 110, 5), cmd(2, "b", 150, 9), cmd(3, "c", 250, 12)])
    query = sink(tmp_path / "q", "query")
    assert [kinds.of(c).reads_feed for c in (upsert, query)] == [True, False]
    corr, rows, _ = correct(spark, upsert, None)
    assert len(rows) == 2  # the command at 250 waits for its batch
    assert corr.progress == kinds.FeedProgress(commands=2, late_commands=0, source_offset=12)
    assert corr.progress.to_dict() == {"commands": 2, "late_commands": 0, "source_offset": 12}
    corr, _, _ = correct(spark, query, None)
    assert corr.progress is None


def test_each_kind_groups_its_history_and_plans_its_sql_as_it_says(tmp_path):
    query, changelog, upsert = (kinds.of(sink(tmp_path, k)) for k in ("query", "changelog", "upsert"))
    assert [k.history_keys.per for k in (query, changelog, upsert)] == ["distinct row", "distinct row", "key"]
    assert upsert.history_keys.keys == ("k",) and upsert.history_keys.bare_key == "k"
    assert upsert.history_keys.order(["k", "v"], "valid_from") == ["k", "valid_from", "v"]
    assert query.history_keys.order(["k", "v"], "valid_from") == ["k", "v", "valid_from"]
    assert [k.plans_sql for k in (query, changelog, upsert)] == [True, False, False]
    assert HINT["ts"] >= UPPER  # the feeds' schema hint is never eligible here

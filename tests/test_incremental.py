"""Query sinks over Delta sources whose change data feed is on: batches computed from the sources'
changes (reconcile.kinds.incremental), each equal to the model computed from the sources' rows in
plain Python, and the full comparison wherever the changes do not determine the correction."""

from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from helpers import append_foreign_row, make_sink, run_stages, shard_as_of
from reconcile.manifest import Manifest

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
    """How many log lines say ``text``, but the batch's "staged batch" line (which repeats the way)."""
    return sum(text in r.getMessage() for r in caplog.records if not r.getMessage().startswith("staged batch"))


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
            jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup())
            _, staged, appended = run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
            if not touched:  # neither source changed: committed, nothing staged, no Spark job run
                assert len(spark.sparkContext.statusTracker().getJobIdsForGroup()) == jobs
                b = sqlite_ledger.get_batch(staged.batch_id, cfg.name)
                assert appended.outcome == "committed" and b.state == "committed"
                assert not Manifest.from_json(b.manifest).staged_files()
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


def _ways(ledger, cfg) -> list[str]:
    """The way each committed batch took, oldest first, as status --json says it."""
    from reconcile.report import status_data

    return [b["refresh"]["text"] for b in status_data(ledger, cfg.name, limit=100)["batches"]]


def test_refresh_incremental_fails_a_batch_the_changes_do_not_determine(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    """``refresh: incremental`` over a source without a change feed: the first batch compares in
    full, a batch of appends is taken from the changes, an UPDATE of the source fails the write
    final in one line (the sink, why, what to do), nothing staged; set to auto, the rerun write
    compares in full and the shard equals the model. Status (text and JSON), history and the
    run's line say each batch's way."""
    from helpers import assert_one_line, snapshot
    from reconcile.airflow import tasks
    from reconcile.errors import SinkError
    from reconcile.model import FINAL
    from reconcile.report import print_status, status_data
    from reconcile.sink import append, history, history_print, mint
    from reconcile.storage import files
    from reconcile.storage.delta import ShardTable

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    path = str(tmp_path / "n")
    _create(spark, path, cdf=False)
    rows = [(1, "x"), (2, "y")]
    spark.createDataFrame(rows, "k BIGINT, v STRING").write.format("delta").mode("append").save(path)
    query = {"sources": {"n": {"format": "delta", "path": path}}, "sql": "SELECT k, v FROM n WHERE k % 3 <> 0"}
    cfg = make_sink(tmp_path, "pol_incr", query={**query, "refresh": "incremental"})
    run_stages(spark, sqlite_ledger, cfg, "r0", 200)
    more = [(4, "w"), (5, "v")]
    spark.createDataFrame(more, "k BIGINT, v STRING").write.format("delta").mode("append").save(path)
    rows += more
    run_stages(spark, sqlite_ledger, cfg, "r1", 300)
    assert shard_as_of(cfg, 299) == _model(rows, [])
    assert _ways(sqlite_ledger, cfg) == [
        "full comparison: the shard holds nothing yet",
        "incremental (1 source version, 2 rows changed)",
    ]

    # `dry-run --spark` is a full comparison, whatever the policy: nothing to correct
    from reconcile.sink.dry_run import spark_correction

    dry = spark_correction(spark, sqlite_ledger, cfg, ShardTable(cfg), 300, 301)
    assert (dry.inserts, dry.retractions) == (0, 0)

    spark.sql(f"UPDATE delta.`{path}` SET v = 'u' WHERE k = 4")
    rows = [(k, "u" if k == 4 else v) for k, v in rows]
    desc = mint.run_mint(sqlite_ledger, cfg, "r2", 1, 400).description
    before = snapshot(spark, sqlite_ledger, cfg)
    with pytest.raises(SinkError) as info:
        tasks.stage_for_run(cfg.name, "r2", spark=spark)
    line = assert_one_line(info.value, "pol_incr")
    assert "refresh: incremental, and this batch cannot be computed from its sources' changes" in line
    assert "source n changed other than by appends" in line
    assert "enable the change data feed on source n" in line and "set query.refresh: auto" in line
    assert snapshot(spark, sqlite_ledger, cfg) == before  # nothing committed
    assert files.list_files(ShardTable(cfg).staging_path(desc.batch_id)) == {}  # nothing staged
    assert tasks.failure_verdict(cfg.name, "r2") == (True, str(info.value))
    assert sqlite_ledger.get_batch(desc.batch_id).failure_kind == FINAL

    cfg = make_sink(tmp_path, "pol_incr", query={**query, "refresh": "auto"})
    tasks.stage_for_run(cfg.name, "r2", spark=spark)
    assert append.run_append(sqlite_ledger, cfg, desc.batch_id).outcome == "committed"
    assert shard_as_of(cfg, 399) == _model(rows, [])
    third = "full comparison: source n changed other than by appends and its change data feed is not readable"
    assert _ways(sqlite_ledger, cfg)[2] == third

    # where the way is said: status (JSON and text), history, the run's line (its note)
    last = status_data(sqlite_ledger, cfg.name)["batches"][-1]
    assert last["refresh"]["path"] == "full" and last["refresh"]["why"].startswith(third.split(": ", 1)[1])
    print_status(status_data(sqlite_ledger, cfg.name))
    text = capsys.readouterr().out
    assert f"      read n at version 2; {_ways(sqlite_ledger, cfg)[1]}" in text
    assert f"      read n at version 3; {third}\n" in text
    history_print.print_history(cfg, history.history_report(sqlite_ledger, cfg))
    said = capsys.readouterr().out
    assert "the batch at 1970-01-01T00:00:00.299Z (299) read n at version 2; incremental (1 source version" in said
    _, note = tasks.batch_line(cfg.name, "r1", None)
    assert note.endswith("; incremental (1 source version, 2 rows changed)"), note
    from reconcile.airflow import ui

    page = ui.render_sink(cfg.name)
    assert "read n at version 2; incremental (1 source version, 2 rows changed)" in page
    assert f"read n at version 3; {third}" in page

    # check --verify: the shard against the query over the sources at the versions the last batch
    # read, compared in full; a foreign write since is a difference the next batch repairs
    from reconcile.sink import check

    found, line = check.verify_source(sqlite_ledger, cfg, spark)
    assert (found.violations, found.repairing) == ([], []), found
    assert line.endswith(
        "is the query over its sources at the versions the last batch read (n at version 3): compared in full"
    ), line
    append_foreign_row(spark, cfg, 350)
    found, line = check.verify_source(sqlite_ledger, cfg, spark)
    assert found.violations == [] and len(found.repairing) == 1, found
    assert (
        "differs from the query over its sources at the versions the last batch read (n at version 3) in 1 update(s)"
        in line
    )
    assert "the next batch repairs them" in found.repairing[0]


@pytest.mark.slow  # twelve batches through Spark
def test_refresh_full_and_full_every_take_the_full_comparison_when_said(
    spark, warehouse, tmp_path, sqlite_ledger, caplog
):
    """``refresh: full`` never reads the changes; ``full_every`` makes every Nth batch, and the
    first batch H hours of the shard's time after the last full one, a full comparison (the
    batches between from the changes). Every batch equals the model."""
    path = str(tmp_path / "a")
    _create(spark, path)
    rows: list[tuple[int, str]] = []
    query = {"sources": {"a": {"format": "delta", "path": path}}, "sql": "SELECT k, v FROM a WHERE k % 3 <> 0"}
    every = make_sink(tmp_path, "pol_every", query={**query, "full_every": {"batches": 3, "hours": 0}})
    never = make_sink(tmp_path, "pol_full", query={**query, "refresh": "full"})

    def grow(i: int) -> None:
        new = [(10 * i + 1, "x"), (10 * i + 2, "y")]
        spark.createDataFrame(new, "k BIGINT, v STRING").write.format("delta").mode("append").save(path)
        spark.sql(f"UPDATE delta.`{path}` SET v = concat(v, 'u') WHERE k = {10 * i + 1}")
        rows.extend([(10 * i + 1, "xu"), (10 * i + 2, "y")])

    uppers = [200, 300, 400, 500, 600]
    for i, upper in enumerate(uppers):
        grow(i)
        for cfg in (every, never) if i < 2 else (every,):
            run_stages(spark, sqlite_ledger, cfg, f"r{i}", upper)
            assert shard_as_of(cfg, upper - 1) == _model(rows, []), (cfg.name, i)
    periodic = "full comparison: the periodic one (full_every.batches: 3)"
    ways = _ways(sqlite_ledger, every)
    assert [w.split(" (")[0] if w.startswith("incr") else w for w in ways] == [
        "full comparison: the shard holds nothing yet",
        "incremental",
        "incremental",
        periodic,
        "incremental",
    ]
    assert ways[1] == "incremental (2 source versions, 1 row changed)"  # an append and an update, one row kept
    assert _ways(sqlite_ledger, never)[1:] == ["full comparison: refresh: full"]

    # by the shard's time: a full comparison once an hour past the last one
    every = make_sink(tmp_path, "pol_every", query={**query, "full_every": {"batches": 0, "hours": 1}})
    hour = 3_600_000
    for i, upper in enumerate([700, 500 + hour // 2, 600 + hour], len(uppers)):
        grow(i)
        run_stages(spark, sqlite_ledger, every, f"r{i}", upper)
        assert shard_as_of(every, upper - 1) == _model(rows, []), i
    assert [w.split(" (")[0] for w in _ways(sqlite_ledger, every)[5:]] == [
        "incremental",
        "incremental",
        "full comparison: the periodic one",
    ]

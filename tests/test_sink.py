"""The sink end to end: mint -> write -> append on real Spark + Delta, checked against a model.

Every expectation is computed independently in plain Python (``helpers.model_query``, Counters
over the source rows); the shard is read back with delta-rs (the Delta table's update log) and
its ledger with the ledger. Data is tiny: the point is the protocol, not Spark.

Times: the sinks use ``as_of = 100`` (``helpers.make_sink``'s default) and run frontiers
200, 300, ... so that batch ``i`` covers ``[F_{i-1}, F_i)``.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from delta.tables import DeltaTable

from helpers import (
    AS_OF,
    CHANGELOG_NEW,
    append_foreign_row,
    as_of,
    changelog_model,
    committed_run,
    leftover_staged,
    make_sink,
    model_query,
    normalize_errors,
    run_stages,
    shard_as_of,
    update_log,
    write_json_rows,
)
from reconcile import failpoints
from reconcile.errors import DescriptionOutdated, FailPointHit, InconsistentState, LostRace
from reconcile.log import iso
from reconcile.model import COMMITTED, MINTED, STAGED, SUPERSEDED
from reconcile.sink import append, check, mint, write
from reconcile.storage import files, frames
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger

# --- reading the shard back (plain Spark/Python, not the code under test) ---------------------


def query_as_of(log, cfg, t) -> Counter:
    """A query shard as of t, with error rows named by their columns (like ``model_query``)."""
    return normalize_errors(as_of(log, cfg, t), cfg)


def batch_commits(spark, cfg) -> list[dict]:
    """The reconcile metadata of every batch commit in the Delta log, oldest first."""
    _, entries = ShardTable(cfg).history_since(-1)
    return [meta for _, meta in entries if meta and meta.get("op") == "batch"]


def assert_ledger(spark, ledger, cfg, frontiers: list[int]) -> None:
    """Committed batches chain from as_of through every frontier, one per lower, in Delta too."""
    committed = ledger.batches(cfg.name, (COMMITTED,))
    lowers = [b.lower for b in committed]
    uppers = [b.upper for b in committed]
    assert lowers == [cfg.as_of] + frontiers[:-1], [(b.lower, b.upper, b.batch_id) for b in committed]
    assert uppers == frontiers
    assert all(a < b for a, b in zip(lowers, lowers[1:])), "committed lowers must strictly increase"
    assert all(lo == prev for lo, prev in zip(lowers[1:], uppers)), "each lower is the previous upper"
    assert len(set(lowers)) == len(lowers), "one committed batch per lower"
    assert ledger.get_shard(cfg.name).upper == frontiers[-1]
    in_delta = batch_commits(spark, cfg)
    assert [(m["lower"], m["upper"], m["batch_id"]) for m in in_delta] == [
        (b.lower, b.upper, b.batch_id) for b in committed
    ], "the Delta log holds exactly the committed batches, once each"


# --- a query sink over several runs -----------------------------------------------------------

QUERY_RUNS = [
    (200, [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 3, "v": "c"}]),
    # update k=1, delete k=2, one copy of k=3 less, insert k=4 (null v) and k=5
    (300, [{"k": 1, "v": "a2"}, {"k": 3, "v": "c"}, {"k": 4, "v": None}, {"k": 5, "v": "e"}]),
    # re-insert the deleted row, k=3 three times, a row that fails validation (null key)
    (
        400,
        [
            {"k": 1, "v": "a2"},
            {"k": 2, "v": "b"},
            {"k": 3, "v": "c"},
            {"k": 3, "v": "c"},
            {"k": 3, "v": "c"},
            {"k": None, "v": "bad"},
            {"k": 5, "v": "e"},
        ],
    ),
    # the error row goes away again; most rows deleted; a new row twice
    (500, [{"k": 1, "v": "a3"}, {"k": 4, "v": None}, {"k": 6, "v": "f"}, {"k": 6, "v": "f"}]),
]


def test_consecutive_runs_follow_the_source(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "orders")
    frontiers: list[int] = []
    for i, (frontier, rows) in enumerate(QUERY_RUNS):
        write_json_rows(tmp_path / "src", rows)
        batch = committed_run(spark, ledger, cfg, f"run-{i}", frontier)
        frontiers.append(frontier)
        assert (batch.lower, batch.upper) == ((frontiers[-2] if i else AS_OF), frontier)
        assert batch.drift_rows == 0

        log = update_log(cfg)
        assert {u["_time"] for u in log} <= {f - 1 for f in frontiers}, "query updates land at upper - 1"
        assert query_as_of(log, cfg, frontier - 1) == model_query(rows, cfg), f"run {i}"
        for earlier, earlier_rows in QUERY_RUNS[:i]:  # history is kept as it was
            assert query_as_of(log, cfg, earlier - 1) == model_query(earlier_rows, cfg), f"run {i}, as of {earlier - 1}"
        assert query_as_of(log, cfg, AS_OF - 1) == Counter()
        assert_ledger(spark, ledger, cfg, frontiers)

    # the error row of run 3 is stored as data, with a readable message
    errors = [u for u in update_log(cfg) if u["_error"] is not None]
    assert sorted((u["_time"], u["_diff"]) for u in errors) == [(399, 1), (499, -1)]
    assert "column 'k' is null" in errors[0]["_error"] and '"bad"' in errors[0]["_error"]


# --- drift, empty corrections, new shards, reruns ---------------------------------------------


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_drift_is_repaired_and_an_unchanged_source_appends_an_empty_batch(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "drifty")
    rows1 = [{"k": 1, "v": "a"}, {"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}]
    rows2 = [{"k": 1, "v": "a2"}, {"k": 2, "v": "b"}, {"k": 3, "v": "c"}, {"k": 4, "v": "d"}]
    write_json_rows(tmp_path / "src", rows1)
    committed_run(spark, ledger, cfg, "run-1", 200)

    # tamper with the Delta table behind the sink's back, using plain Spark/Delta
    path = ShardTable(cfg).path
    before = update_log(cfg)
    deleted = [u for u in before if u["k"] == 1]
    # the first batch of a new shard writes the query's rows as they come: (1, a) twice, each +1
    assert sorted((u["v"], u["_time"], u["_diff"]) for u in deleted) == [("a", 199, 1), ("a", 199, 1)]
    DeltaTable.forPath(spark, path).delete("k = 1")
    duplicate = next(u for u in before if u["k"] == 2)  # (2,b)+1 at 199, appended once more
    foreign = {"k": 7, "v": "zz", "_error": None, "_time": 150, "_diff": 3}
    spark.createDataFrame([duplicate, foreign], frames.schema(cfg)).write.format("delta").mode("append").save(path)
    tampered = sum(abs(u["_diff"]) for u in deleted) + abs(duplicate["_diff"]) + abs(foreign["_diff"])
    assert tampered == 6

    _, entries = ShardTable(cfg).history_since(-1)
    assert [meta for _, meta in entries[-2:]] == [None, None], "the tampering commits are foreign"
    assert query_as_of(update_log(cfg), cfg, 199) == Counter({(2, "b", None): 2, (3, "c", None): 1, (7, "zz", None): 3})

    # the next run (with a changed source) repairs the drift and records how much it found
    write_json_rows(tmp_path / "src", rows2)
    repaired = committed_run(spark, ledger, cfg, "run-2", 300)
    assert repaired.drift_rows == tampered
    log = update_log(cfg)
    assert query_as_of(log, cfg, 299) == model_query(rows2, cfg)
    correction = Counter({(u["k"], u["v"]): u["_diff"] for u in log if u["_time"] == 299})
    assert correction == Counter({(1, "a2"): 1, (2, "b"): -1, (7, "zz"): -3, (4, "d"): 1})

    # a run without tampering and with an unchanged source: no drift, no data, the upper advances
    versions_before = ShardTable(cfg).latest_version()
    m, w, a = run_stages(spark, ledger, cfg, "run-3", 400)
    assert (m.description.lower, m.description.upper) == (300, 400)
    assert (w.outcome, w.rows_ok, w.rows_err, w.drift_rows) == ("staged", 0, 0, 0)
    assert a.outcome == "committed", a.message
    empty = ledger.get_batch(m.description.batch_id)
    assert (empty.state, empty.drift_rows, empty.rows_ok) == (COMMITTED, 0, 0)
    log_after = update_log(cfg)
    assert [u for u in log_after if 300 <= u["_time"] < 400] == []
    assert sorted(map(str, log_after)) == sorted(map(str, log))  # no data rows written
    assert query_as_of(log_after, cfg, 399) == model_query(rows2, cfg)
    assert ShardTable(cfg).latest_version() > versions_before  # an empty Delta commit records the batch
    assert_ledger(spark, ledger, cfg, [200, 300, 400])


def test_drift_written_between_write_and_append_is_counted(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "sneaky")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, ledger, cfg, "run-1", 200)
    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    append_foreign_row(spark, cfg, 150)  # after the write read the shard, before the append
    assert append.run_append(ledger, cfg, desc.batch_id).outcome == "committed"
    assert query_as_of(update_log(cfg), cfg, 299)[(7, "zz", None)] == 1  # not repaired yet

    repair = committed_run(spark, ledger, cfg, "run-3", 400)
    assert query_as_of(update_log(cfg), cfg, 399) == model_query(rows, cfg)  # repaired ...
    assert repair.drift_rows == 1  # ... and counted


def test_commit_metadata_belongs_to_the_write_not_the_session(spark, warehouse, tmp_path, sqlite_ledger):
    """Writers sharing one SparkSession (a compaction thread beside a batch, a notebook) must not
    stamp each other's commits: a batch commit stamped as anything else would never be absorbed
    and the shard's upper would stall (the CI failure of session 3)."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "stamped")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    key = "spark.databricks.delta.commitInfo.userMetadata"
    other = json.dumps({"reconcile": {"op": "compact", "sink": cfg.name, "token": "other-thread"}})
    spark.conf.set(key, other)  # what another writer of this session has set, mid-write
    try:
        committed_run(spark, ledger, cfg, "run-1", 200)
        committed_run(spark, ledger, cfg, "run-2", 300)
        assert spark.conf.get(key, None) == other, "the sink must not touch the session's commit metadata"
    finally:
        spark.conf.unset(key)
    # version 0 (the table's creation, metadata only) may carry the session's setting; it holds no
    # data and no commit guard, so it is nobody's batch
    assert [m["op"] for _, m in ShardTable(cfg).history_since(-1)[1][1:]] == ["batch", "batch"]
    assert_ledger(spark, ledger, cfg, [200, 300])
    assert query_as_of(update_log(cfg), cfg, 299) == model_query(rows, cfg)


def test_a_guarded_commit_without_batch_metadata_is_reported_and_never_doubled(
    spark, warehouse, tmp_path, sqlite_ledger
):
    """What a batch commit stamped with someone else's metadata looks like: a Delta version under
    the sink's commit guard that is not one of its batches. check names it, and the next append
    fails loudly (Delta skips its txnVersion) instead of writing the interval a second time."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "unstamped")
    rows = [{"k": 1, "v": "a"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, ledger, cfg, "run-1", 200)
    assert check.violations(ledger, cfg, spark=spark) == []
    row = {"k": 2, "v": "b", "_error": None, "_time": 299, "_diff": 1}
    (
        spark.createDataFrame([row], frames.schema(cfg))
        .write.format("delta")
        .mode("append")
        .option("txnAppId", ShardTable(cfg).app_id)
        .option("txnVersion", 200)
        .save(ShardTable(cfg).path)
    )
    found = check.violations(ledger, cfg, spark=spark)
    assert len(found) == 1 and "carries the sink's commit guard (txnVersion 200)" in found[0], found
    with pytest.raises(InconsistentState, match="Delta skipped the commit") as err:
        run_stages(spark, ledger, cfg, "run-2", 300)
    assert "reconcile check unstamped" in err.value.remedy
    assert ledger.get_shard(cfg.name).upper == 200
    assert [m["op"] for _, m in ShardTable(cfg).history_since(-1)[1] if m] == ["maintenance", "batch"]


def test_maintenance_commits_are_not_drift(spark, warehouse, tmp_path, sqlite_ledger):
    """VACUUM (which logs VACUUM START/END) and OPTIMIZE write foreign Delta versions that change
    no data: the next batch must not count them as drift (nor pay two full time-travel reads to
    measure it: the 2x batch after every compaction in BENCHMARKS.md)."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "maintained")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, ledger, cfg, "run-1", 200)
    committed_run(spark, ledger, cfg, "run-2", 300)  # a second file to compact
    table = DeltaTable.forPath(spark, ShardTable(cfg).path)
    table.optimize().executeCompaction()
    table.vacuum(168.0)
    _, entries = ShardTable(cfg).history_since(ledger.get_shard(cfg.name).delta_version)
    assert [(m["op"], m["operation"]) for _, m in entries] == [
        ("maintenance", "OPTIMIZE"),
        ("maintenance", "VACUUM START"),
        ("maintenance", "VACUUM END"),
    ]
    rows2 = rows + [{"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows2)
    batch = committed_run(spark, ledger, cfg, "run-3", 400)
    assert batch.drift_rows == 0 and batch.rows_ok == 1
    assert query_as_of(update_log(cfg), cfg, 399) == model_query(rows2, cfg)


def test_foreign_update_at_or_after_the_upper_is_repaired(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "ahead")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    committed_run(spark, ledger, cfg, "run-1", 200)
    append_foreign_row(spark, cfg, 250)  # at/after the shard's upper (200)

    batch = committed_run(spark, ledger, cfg, "run-2", 300)
    assert query_as_of(update_log(cfg), cfg, 299) == model_query(rows, cfg)
    assert batch.drift_rows == 1


def test_new_shard_starts_at_as_of_and_reruns_are_no_ops(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "fresh", as_of=1000)
    rows = [{"k": 1, "v": "a"}, {"k": 1, "v": "a"}, {"k": 2, "v": None}]
    write_json_rows(tmp_path / "src", rows)

    for frontier in (500, 1000):  # not ahead of as_of: nothing to mint, and the message says why
        m = mint.run_mint(ledger, cfg, f"early-{frontier}", 1, frontier)
        assert m.description is None
        assert f"desired frontier {iso(frontier)} is not ahead of lower {iso(1000)}" in m.message
        assert "already covered" in m.message
    assert ledger.get_shard(cfg.name).upper == 0
    assert ledger.batches(cfg.name) == []

    batch = committed_run(spark, ledger, cfg, "run-1", 1500)
    assert (batch.lower, batch.upper) == (cfg.as_of, 1500)
    log = update_log(cfg)
    assert query_as_of(log, cfg, 999) == Counter()
    assert query_as_of(log, cfg, 1499) == model_query(rows, cfg)
    assert_ledger(spark, ledger, cfg, [1500])

    # rerunning the append (or the write) of a committed batch changes nothing
    version = ShardTable(cfg).latest_version()
    again = append.run_append(ledger, cfg, batch.batch_id)
    assert again.outcome == "already_committed" and again.delta_version == batch.delta_version
    rewrite = write.run_write(spark, ledger, cfg, batch.batch_id)
    assert rewrite.outcome == "skipped" and "committed" in rewrite.message
    assert ShardTable(cfg).latest_version() == version
    assert [m["lower"] for m in batch_commits(spark, cfg)] == [cfg.as_of]
    assert leftover_staged(ledger, cfg) == []
    assert query_as_of(update_log(cfg), cfg, 1499) == model_query(rows, cfg)
    assert_ledger(spark, ledger, cfg, [1500])


# --- mint rules (metadata only) ---------------------------------------------------------------


def test_mint_rules(tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "minty")

    # a retried mint of the same run returns the same description while the upper has not moved
    first = mint.run_mint(ledger, cfg, "run-a", 1, 300)
    again = mint.run_mint(ledger, cfg, "run-a", 2, 300)
    assert first.description is not None
    assert again.description == first.description
    assert "re-using" in again.message and first.description.batch_id in again.message

    # another run minting the same lower supersedes the older description
    other = mint.run_mint(ledger, cfg, "run-b", 1, 300)
    assert other.description.batch_id != first.description.batch_id
    assert other.description.lower == first.description.lower == AS_OF
    older = ledger.get_batch(first.description.batch_id)
    assert older.state == SUPERSEDED and other.description.batch_id in older.message
    assert ledger.get_batch(other.description.batch_id).state == MINTED
    assert "superseding 1 older description" in other.message

    # once the upper moved, a retry of the same run describes the rest, from the new upper
    ledger.compare_and_set_upper(cfg.name, 0, 200)
    moved = mint.run_mint(ledger, cfg, "run-b", 2, 300)
    assert (moved.description.lower, moved.description.upper) == (200, 300)
    assert moved.description.batch_id != other.description.batch_id

    # read-only: the shard's flag, the run's flag, or the sink's config
    ledger.set_read_only(cfg.name, True)
    ro = mint.run_mint(ledger, cfg, "run-c", 1, 400)
    assert ro.description is None and "read-only" in ro.message
    ledger.set_read_only(cfg.name, False)
    ro_run = mint.run_mint(ledger, cfg, "run-c", 1, 400, read_only=True)
    assert ro_run.description is None and "read-only" in ro_run.message
    ro_cfg = make_sink(tmp_path, "minty", read_only=True)
    assert mint.run_mint(ledger, ro_cfg, "run-c", 1, 400).description is None
    assert ledger.get_batch(moved.description.batch_id).state == MINTED  # read-only touched nothing

    # read-only off again: the next run mints normally
    resumed = mint.run_mint(ledger, cfg, "run-d", 1, 400)
    assert resumed.description is not None and (resumed.description.lower, resumed.description.upper) == (200, 400)
    assert "minted batch" in resumed.message


# --- outdated batches ------------------------------------------------------------------------


@pytest.mark.parametrize("older_upper, newer_upper", [(200, 300), (300, 200)], ids=["covered", "lost_race"])
def test_outdated_batch_is_cleaned_up(spark, warehouse, tmp_path, sqlite_ledger, older_upper, newer_upper):
    """Two runs describe the same lower; the newer commits; the older's append never writes."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "outdated")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)

    older = mint.run_mint(ledger, cfg, "run-old", 1, older_upper).description
    assert write.run_write(spark, ledger, cfg, older.batch_id).outcome == "staged"
    assert files.list_files(ShardTable(cfg).staging_path(older.batch_id))
    newer_desc = mint.run_mint(ledger, cfg, "run-new", 1, newer_upper).description
    assert newer_desc.lower == older.lower
    assert ledger.get_batch(older.batch_id).state == SUPERSEDED

    # appending the older one before the newer one commits: a no-op when the newer covers it,
    # refused otherwise; cleaned up and nothing written either way
    if newer_upper >= older_upper:
        assert append.run_append(ledger, cfg, older.batch_id).outcome == "superseded"
    else:
        with pytest.raises(DescriptionOutdated):
            append.run_append(ledger, cfg, older.batch_id)
    # its files stay until the shard's upper passes its lower: an append of it already in
    # flight may still commit them (the guard lets one batch of each lower through)
    assert files.list_files(ShardTable(cfg).staging_path(older.batch_id))
    assert batch_commits(spark, cfg) == []
    assert ledger.get_shard(cfg.name).upper < AS_OF
    assert ledger.get_batch(newer_desc.batch_id).state == MINTED  # the newer description stays valid

    # the newer one commits; appending the older one again never writes
    assert write.run_write(spark, ledger, cfg, newer_desc.batch_id).outcome == "staged"
    assert append.run_append(ledger, cfg, newer_desc.batch_id).outcome == "committed"
    newer = ledger.get_batch(newer_desc.batch_id)

    if newer_upper >= older_upper:
        result = append.run_append(ledger, cfg, older.batch_id)
        assert result.outcome == "covered"
        assert "already covered" in result.message
    else:
        with pytest.raises(LostRace) as info:
            append.run_append(ledger, cfg, older.batch_id)
        assert f"upper to {iso(newer_upper)}" in str(info.value) and "nothing was written" in str(info.value)
        assert "Remedy:" in str(info.value)

    assert ledger.get_batch(older.batch_id).state == SUPERSEDED
    assert not files.list_files(ShardTable(cfg).staging_path(older.batch_id))
    assert older.batch_id not in files.list_dirs(ShardTable(cfg).staging_root)
    assert [m["batch_id"] for m in batch_commits(spark, cfg)] == [newer.batch_id]
    assert query_as_of(update_log(cfg), cfg, newer_upper - 1) == model_query(rows, cfg)
    assert_ledger(spark, ledger, cfg, [newer_upper])


@pytest.mark.parametrize("older_upper, newer_upper", [(200, 300), (300, 200)], ids=["covered", "narrower"])
def test_superseded_batch_message_names_its_successor(
    spark, warehouse, tmp_path, sqlite_ledger, older_upper, newer_upper
):
    """An older description appended before its successor commits: a successor that covers its
    interval makes it a no-op; a narrower one makes it fail harmlessly. Either way it says why."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "early")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    older = mint.run_mint(ledger, cfg, "run-old", 1, older_upper).description
    assert write.run_write(spark, ledger, cfg, older.batch_id).outcome == "staged"
    newer = mint.run_mint(ledger, cfg, "run-new", 1, newer_upper).description
    if newer_upper >= older_upper:
        result = append.run_append(ledger, cfg, older.batch_id)
        assert result.outcome == "superseded" and newer.batch_id in result.message, result
    else:
        with pytest.raises(DescriptionOutdated) as info:
            append.run_append(ledger, cfg, older.batch_id)
        text = str(info.value)
        assert "superseded" in text and newer.batch_id in text, text
        # true in the narrower-winner case: the winner covers only part; the rest comes next
        assert f"covers only [{iso(cfg.as_of)}, {iso(newer_upper)})" in text, text
        assert f"the next scheduled run appends [{iso(newer_upper)}, {iso(older_upper)})" in text, text
        assert "the superseding run appends this interval" not in text
    # its staged files stay until the shard's upper passes its lower (an append in flight may still commit them)
    assert ShardTable(cfg).staged_attempts(older.batch_id)
    assert ledger.get_shard(cfg.name).upper <= cfg.as_of  # nothing was committed


def test_a_narrower_winner_of_an_unscheduled_sink_asks_for_the_run_to_be_cleared(
    spark, warehouse, tmp_path, sqlite_ledger
):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "manual_only", schedule="none")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    older = mint.run_mint(ledger, cfg, "run-old", 1, 300).description
    assert write.run_write(spark, ledger, cfg, older.batch_id).outcome == "staged"
    mint.run_mint(ledger, cfg, "run-new", 1, 200)
    with pytest.raises(DescriptionOutdated) as info:
        append.run_append(ledger, cfg, older.batch_id)
    assert (
        f"a new run appends [{iso(200)}, {iso(300)}): `airflow dags unpause manual_only && airflow dags trigger manual_only`"
        in str(info.value)
    )


# --- a crash between the Delta commit and the metadata update ---------------------------------


@pytest.mark.parametrize(
    "kind, metadata",
    [
        ("append.after_delta_commit", "sqlite"),
        ("append.after_delta_commit", "postgres"),
        ("metadata.inside_absorb", "sqlite"),  # the metadata update itself fails (and rolls back)
    ],
)
def test_crash_after_delta_commit_is_recovered(spark, warehouse, tmp_path, monkeypatch, request, kind, metadata):
    if metadata == "sqlite":
        ledger = request.getfixturevalue("sqlite_ledger")
    else:  # the same end-to-end run with the ledger on PostgreSQL
        url = request.getfixturevalue("pg_url")
        monkeypatch.setenv("RECONCILE_METADATA_URL", url)
        ledger = Ledger(url)
        request.addfinalizer(ledger.dispose)
    cfg = make_sink(tmp_path, "crashy")
    rows1 = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    rows2 = [{"k": 1, "v": "a"}, {"k": 3, "v": "c"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows1)
    committed_run(spark, ledger, cfg, "run-1", 200)

    write_json_rows(tmp_path / "src", rows2)
    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    failpoints.arm(kind, "raise")
    try:
        with pytest.raises(FailPointHit, match=kind):
            append.run_append(ledger, cfg, desc.batch_id)
    finally:
        failpoints.disarm_all()

    # the Delta log holds the batch, the metadata does not know yet
    assert [m["batch_id"] for m in batch_commits(spark, cfg)][-1] == desc.batch_id
    assert ledger.get_shard(cfg.name).upper == 200
    assert ledger.get_batch(desc.batch_id).state == STAGED

    result = append.run_append(ledger, cfg, desc.batch_id)
    assert result.outcome == "recovered", result.message
    assert "earlier attempt had committed this batch" in result.message
    assert ledger.get_shard(cfg.name).upper == 300
    assert ledger.get_batch(desc.batch_id).state == COMMITTED
    assert [m["lower"] for m in batch_commits(spark, cfg)] == [AS_OF, 200]  # once, never twice
    assert leftover_staged(ledger, cfg) == []
    log = update_log(cfg)
    assert query_as_of(log, cfg, 299) == model_query(rows2, cfg)
    assert query_as_of(log, cfg, 199) == model_query(rows1, cfg)
    assert_ledger(spark, ledger, cfg, [200, 300])


# --- a changelog sink -------------------------------------------------------------------------


def test_changelog_sink_history(spark, warehouse, tmp_path, sqlite_ledger):
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "events", kind="changelog")
    source: list[dict] = []
    frontiers: list[int] = []
    # the model itself, on a hand-checked point: as of 199 after run 1
    assert changelog_model(CHANGELOG_NEW[:1], 199) == Counter(
        {(1, "a", None): 1, (2, "b", None): 2, (4, "d", None): 2, (5, "e", None): 2}
    )

    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        batch = committed_run(spark, ledger, cfg, f"run-{i}", frontier)
        frontiers.append(frontier)
        assert (batch.lower, batch.upper) == ((frontiers[-2] if i else AS_OF), frontier)

        log = update_log(cfg)
        assert all(u["_error"] is None for u in log)
        assert min(u["_time"] for u in log) == AS_OF  # nothing before the first lower
        runs = CHANGELOG_NEW[: i + 1]
        for t in range(AS_OF - 1, frontier):
            assert as_of(log, cfg, t) == changelog_model(runs, t), f"after run {i}, as of {t}"
        assert_ledger(spark, ledger, cfg, frontiers)

    log = update_log(cfg)
    assert {(u["k"], u["_time"], u["_diff"]) for u in log if u["k"] in (6, 9)} == {(6, 250, 1), (9, 300, 1)}
    assert max(u["_diff"] for u in log) >= 2 and min(u["_diff"] for u in log) < 0


def test_read_as_of_splits_ok_rows_and_errors(spark, warehouse, tmp_path, sqlite_ledger):
    """The reading API: consolidated rows with their multiplicity, errors apart, as of any time."""
    from reconcile.storage.frames import read_as_of

    cfg = make_sink(tmp_path, "reader")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 1, "v": "a"}, {"k": None, "v": "x"}])
    run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    write_json_rows(tmp_path / "src", [{"k": 2, "v": "b"}])
    run_stages(spark, sqlite_ledger, cfg, "run-2", 300)
    ok, errs = read_as_of(spark, ShardTable(cfg), 199)
    assert sorted(tuple(r) for r in ok.collect()) == [(1, "a", 2)]
    assert [r["_count"] for r in errs.collect()] == [1] and "'k'" in errs.first()["_error"]
    ok, errs = read_as_of(spark, ShardTable(cfg), 299)
    assert sorted(tuple(r) for r in ok.collect()) == [(2, "b", 1)] and errs.count() == 0


def test_a_query_over_delta_sources_records_the_version_of_each_it_read(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    """A query sink whose sources are Delta tables reads each at one version and records it per
    batch (manifest in the ledger, the Delta commit's description); status, history and the
    sink's page say which versions each batch read. A source written after its version was
    pinned does not leak into the batch."""
    from reconcile import cli
    from reconcile.airflow import ui
    from reconcile.kinds import query
    from reconcile.manifest import source_versions

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    orders, regions = str(tmp_path / "orders"), str(tmp_path / "regions")

    def put(path: str, rows: list[tuple], mode: str = "append") -> None:
        spark.createDataFrame(rows, "k BIGINT, v STRING").write.format("delta").mode(mode).save(path)

    put(orders, [(1, "a"), (2, "b")])  # version 0
    put(regions, [(1, "x")])  # version 0
    sql = "SELECT o.k, concat(o.v, '-', coalesce(r.v, '?')) AS v FROM orders o LEFT JOIN regions r ON o.k = r.k"
    sources = {"orders": {"format": "delta", "path": orders}, "regions": {"format": "delta", "path": regions}}
    cfg = make_sink(tmp_path, "delta_sources", query={"sources": sources, "sql": sql})
    run_stages(spark, sqlite_ledger, cfg, "r1", 200)
    put(orders, [(3, "c")])  # orders version 1
    put(orders, [(4, "d")])  # orders version 2
    run_stages(spark, sqlite_ledger, cfg, "r2", 300)
    assert shard_as_of(cfg, 199) == Counter({(1, "a-x", None): 1, (2, "b-?", None): 1})
    assert shard_as_of(cfg, 299) == Counter(
        {(1, "a-x", None): 1, (2, "b-?", None): 1, (3, "c-?", None): 1, (4, "d-?", None): 1}
    )
    got = [source_versions(b.manifest) for b in sqlite_ledger.batches(cfg.name, (COMMITTED,))]
    assert got == [{"orders": 0, "regions": 0}, {"orders": 2, "regions": 0}]

    # pinned: rows committed to a source after the version was read are not in that read
    versions: dict[str, int] = {}
    pinned = query.desired(spark, cfg, versions)
    put(orders, [(5, "e")])  # version 3, after the pin
    assert versions == {"orders": 2, "regions": 0}
    assert sorted(r["k"] for r in pinned.collect()) == [1, 2, 3, 4]

    capsys.readouterr()
    assert cli.main(["status", cfg.name]) == 0
    out = capsys.readouterr().out
    assert "read orders at version 0, regions at version 0" in out and "read orders at version 2" in out
    assert cli.main(["status", cfg.name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["batches"]
    assert [b["sources"] for b in shown] == got
    assert cli.main(["history", cfg.name]) == 0
    out = capsys.readouterr().out
    assert f"the batch at {iso(299)} read orders at version 2, regions at version 0" in out, out
    page = ui.render_sink(cfg.name)
    assert "read orders at version 2, regions at version 0" in page

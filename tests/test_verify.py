"""Batches that verify themselves (issue 18.3): each batch records, per hash partition, the
checksum of what its kind says the shard must hold as of ``upper - 1`` and the checksum of the
shard after it; the write refuses a batch whose two differ, and ``check --verify`` recomputes the
second from the Delta table.

Expectations are computed independently: the partition of a row with Spark's own
``pmod(xxhash64(row, _error), P)`` on a one-row frame, the shard's contents with plain Python
models (``helpers``), the foreign writes with delta-rs.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from helpers import (
    CHANGELOG_NEW,
    change,
    changelog_model,
    make_sink,
    model_query,
    run_stages,
    shard_as_of,
    write_json_rows,
)
from reconcile import checksums, cli
from reconcile.log import iso
from reconcile.model import COMMITTED, MINTED
from reconcile.sink import check, compact, mint, write
from reconcile.storage import files
from reconcile.storage.delta import ShardTable


def partition_of_row(spark, cfg, k, v, error=None) -> int:
    """The hash partition of a row: of the whole row, or of its key for an upsert sink (whose
    partitions hash the key: every update of a key in one partition)."""
    row = spark.createDataFrame([(k, v, error)], "k BIGINT, v STRING, _error STRING")
    hashed = "k" if cfg.kind == "upsert" else "k, v, _error"
    return row.selectExpr(f"pmod(xxhash64({hashed}), {cfg.partitions}) AS p").first()["p"]


def foreign_update(cfg, k, v, time: int, diff: int) -> None:
    """An update appended by delta-rs behind the sink's back."""
    from deltalake import DeltaTable, write_deltalake

    row = {
        "k": pa.array([k], pa.int64()),
        "v": pa.array([v]),
        "_error": pa.array([None], pa.string()),
        "_time": pa.array([time], pa.int64()),
        "_diff": pa.array([diff], pa.int64()),
    }
    for f in DeltaTable(ShardTable(cfg).path).schema().to_arrow():  # the shard's other columns: null
        row.setdefault(f.name, pa.nulls(1, pa.field(f).type))
    write_deltalake(ShardTable(cfg).path, pa.table(row), mode="append")


def assert_self_checked(ledger, cfg, skip: int = 0) -> None:
    """Every committed batch (but the first ``skip``) recorded, per partition, equal desired and
    shard checksums, in the ledger's manifest and in its Delta commit."""
    commits = {m["batch_id"]: m for _, m in ShardTable(cfg).history_since(-1)[1] if m and m.get("op") == "batch"}
    for b in ledger.batches(cfg.name, (COMMITTED,))[skip:]:
        parts = json.loads(b.manifest)["parts"]
        assert sorted(parts, key=int) == [str(p) for p in range(cfg.partitions)]
        for p, part in parts.items():
            assert part["desired_checksum"] == part["shard_checksum"], (b.batch_id, p, part)
            assert len(part["shard_checksum"]) == 16
            committed = commits[b.batch_id]["parts"][p]
            assert (committed["desired_checksum"], committed["shard_checksum"]) == (
                part["desired_checksum"],
                part["shard_checksum"],
            )


def verify(ledger, cfg, spark) -> tuple[list[str], dict]:
    """``check --verify``'s findings and counts."""
    return check.verify_checksums(ledger, cfg, spark)


def test_query_batches_verify_and_a_foreign_edit_is_reported(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch, capsys
):
    ledger = sqlite_ledger
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "vq")
    rows1 = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}, {"k": None, "v": "bad"}]
    write_json_rows(tmp_path / "src", rows1)
    m1, _, a1 = run_stages(spark, ledger, cfg, "run-1", 200)
    assert a1.outcome == "committed", a1.message
    assert_self_checked(ledger, cfg)

    # behind the sink's back: row (1, a) is retracted at 150, inside batch 1's [100, 200)
    foreign_update(cfg, 1, "a", 150, -1)
    p = partition_of_row(spark, cfg, 1, "a")
    version = ShardTable(cfg).latest_version()
    capsys.readouterr()
    # a foreign version explains it, and the next batch repairs it: exit 4, not a violation
    assert cli.main(["check", cfg.name, "--verify"]) == 4
    out = capsys.readouterr().out
    assert "VIOLATION" not in out, out
    differ = [
        line for line in out.splitlines() if line.startswith("NOT YET REPAIRED the current state does not verify")
    ]
    assert len(differ) == 1, out
    assert f"batch {m1.description.batch_id} " in differ[0] and f"Delta version 1's partition {p}:" in differ[0]
    assert "the shard as of 1970-01-01" in differ[0] and "the batch recorded" in differ[0]
    assert differ[0].endswith(f"(foreign Delta versions {version}, not yet repaired: the next batch repairs them)")
    assert (
        f"the current state does NOT verify; 1 batch(es) (3 partitions) checked against Delta version {version}" in out
    )

    # the next batch repairs the shard as usual; its own checksums hold, batch 1's history stays edited
    rows2 = [{"k": 1, "v": "a"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows2)
    m2, w2, a2 = run_stages(spark, ledger, cfg, "run-2", 300)
    assert a2.outcome == "committed" and w2.drift_rows == 1, a2.message
    assert shard_as_of(cfg, 299) == model_query(rows2, cfg)
    lines, counts = verify(ledger, cfg, spark)
    assert len(lines) == 1 and lines[0].startswith(f"batch {m1.description.batch_id} [{iso(100)}, {iso(200)})")
    assert (counts["verified"], counts["partitions"]) == (2, 6)
    assert_self_checked(ledger, cfg)

    # a difference no foreign version explains (a data file of batch 2 changed in place: a bug,
    # a broken disk): a violation, exit 1, however the shard would repair itself otherwise
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    mine = [u for u in DeltaTable(ShardTable(cfg).path).file_uris() if pq.read_table(u).num_rows]
    rows = pq.read_table(mine[-1])
    pq.write_table(rows.set_column(rows.schema.get_field_index("v"), "v", pa.array(["bad"] * rows.num_rows)), mine[-1])
    fs, local = files.fs_of(mine[-1])
    crc = "{}/.{}.crc".format(*local.rsplit("/", 1))  # Hadoop's checksum of the file as it was
    if fs.exists(crc):
        fs.rm(crc)
    assert ShardTable(cfg).foreign_commits(-1, ShardTable(cfg).latest_version()) != []  # version 2's, repaired
    capsys.readouterr()
    assert cli.main(["check", cfg.name, "--verify"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATION the current state does not verify: batch " in out and "NOT YET REPAIRED" not in out, out
    assert out.splitlines()[-1].startswith(f"{cfg.name}: 1 invariant violation(s)"), out


def test_changelog_batches_verify_before_and_after_compaction(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):

    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "vc", kind="changelog")
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW):
        source += new
        write_json_rows(tmp_path / "log", source)
        # the first batch without checksums (self-checks off): not verifiable, still checked by rows
        monkeypatch.setattr(checksums, "ENABLED", i > 0)
        _, _, a = run_stages(spark, ledger, cfg, f"run-{i}", frontier)
        assert a.outcome == "committed", a.message
    assert_self_checked(ledger, cfg, skip=1)

    # compaction advances every time below 299 to it: batch 2's upper - 1 is since itself
    assert compact.run_compact(spark, ledger, cfg, since=299, vacuum_files=False).outcome == "compacted"
    assert shard_as_of(cfg, 299) == changelog_model(CHANGELOG_NEW, 299)
    lines, counts = verify(ledger, cfg, spark)
    assert lines == [], lines
    assert counts == {
        "verified": 2,
        "partitions": 6,
        "not_verifiable": 1,
        "before_since": 0,
        "version": ShardTable(cfg).latest_version(),
    }
    # a since past a batch's upper - 1 (compaction raises it first) leaves the batch out
    ledger.advance_since(cfg.name, 300)
    assert verify(ledger, cfg, spark)[1] == {**counts, "verified": 1, "partitions": 3, "before_since": 1}


def test_upsert_batches_verify_and_a_tampered_key_is_reported(spark, warehouse, tmp_path, sqlite_ledger):
    from upsert_model import UpsertModel, cmd, feed_rows, ok_rows, upsert_sink

    ledger = sqlite_ledger
    cfg = upsert_sink(tmp_path, name="vu")
    model = UpsertModel()
    feed = [cmd(1, "a", 150, 1), cmd(2, "b", 160, 2), cmd(1, "a2", 170, 3), cmd(None, "x", 180, 4)]
    feed_rows(tmp_path, feed)
    m1, _, _ = run_stages(spark, ledger, cfg, "r1", 200)
    model.batch(feed, 100, 200)

    foreign_update(cfg, 1, "rogue", 190, 1)  # key 1 gets a second value inside batch 1
    lines, _ = verify(ledger, cfg, spark)
    p = partition_of_row(spark, cfg, 1, "rogue")
    assert len(lines) == 1 and f"batch {m1.description.batch_id} " in lines[0] and f"partition {p}:" in lines[0], lines

    # updates, a delete, a key touched twice, a late command; key 1's next command repairs it
    feed += [cmd(1, "a3", 210, 5), cmd(2, None, 220, 6), cmd(3, "c", 230, 7), cmd(3, "c2", 240, 8), cmd(4, "d", 120, 9)]
    feed_rows(tmp_path, feed)
    _, _, a = run_stages(spark, ledger, cfg, "r2", 300)
    assert a.outcome == "committed", a.message
    model.batch(feed, 200, 300)
    assert ok_rows(shard_as_of(cfg, 299)) == model.as_of(299)
    # a batch without commands (nothing touched: the semi-join reads nothing of the shard)
    _, _, a = run_stages(spark, ledger, cfg, "r3", 400)
    assert a.outcome == "committed", a.message
    lines, counts = verify(ledger, cfg, spark)
    assert len(lines) == 1 and m1.description.batch_id in lines[0] and counts["verified"] == 3, lines
    assert_self_checked(ledger, cfg)


def test_an_empty_batch_of_an_empty_shard_checks_itself(spark, warehouse, tmp_path, sqlite_ledger):
    """Nothing desired, nothing held: every stage of the write is empty, and still observed."""
    query = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src WHERE k < 0"}
    cfg = make_sink(tmp_path, "vempty", query=query)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}])
    _, w, a = run_stages(spark, sqlite_ledger, cfg, "run-1", 200)
    assert (w.rows_ok, a.outcome) == (0, "committed"), a.message
    parts = json.loads(sqlite_ledger.get_batch(w.batch_id).manifest)["parts"]
    assert {part["shard_checksum"] for part in parts.values()} == {"0" * 16}
    assert verify(sqlite_ledger, cfg, spark)[0] == []


def test_checksums_that_cannot_be_summed_exactly_are_left_unrecorded_not_wrong(
    spark, warehouse, tmp_path, sqlite_ledger, caplog
):
    """The write sums 32-bit limbs of the row hash times the diff (:mod:`reconcile.checksums`).
    Batch 1: two updates of one row with diff 2^31 - 1 whose low limb is >= 2^31 overflow their
    partition's sum: that partition's checksums are not recorded, the others are, and verify.
    Batch 2: a diff of 3 billion makes no product exact: no partition is recorded (the batch is
    not verifiable). Both commit what the model says, and the write says why in one warning."""

    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "vbig", kind="changelog")
    low = spark.range(1, 200).selectExpr("id AS k", "xxhash64(id, 'a', CAST(NULL AS STRING)) & 4294967295 AS low")
    k = low.where("low >= 2147483650").orderBy("k").first()["k"]
    big_part = partition_of_row(spark, cfg, k, "a")
    near = 2**31 - 1
    runs = [
        (200, [change(k, "a", 150, near), change(k, "a", 160, near), change(1000, "b", 160, 1)]),
        (300, [change(2000, "c", 250, 3_000_000_000)]),
    ]
    source: list[dict] = []
    recorded = []
    for i, (frontier, new) in enumerate(runs):
        source += new
        write_json_rows(tmp_path / "log", source)
        with caplog.at_level("WARNING", logger="reconcile.sink.write"):
            _, w, a = run_stages(spark, ledger, cfg, f"run-{i}", frontier)
        assert a.outcome == "committed", a.message
        assert "cannot be summed exactly" in caplog.text
        caplog.clear()
        parts = json.loads(ledger.get_batch(w.batch_id).manifest)["parts"]
        recorded.append(sorted(int(p) for p, part in parts.items() if "shard_checksum" in part))
        assert all(
            part["desired_checksum"] == part["shard_checksum"] for part in parts.values() if "shard_checksum" in part
        )
    assert recorded == [[p for p in range(cfg.partitions) if p != big_part], []]
    assert shard_as_of(cfg, 299) == {(k, "a", None): 2 * near, (1000, "b", None): 1, (2000, "c", None): 3_000_000_000}
    lines, counts = verify(ledger, cfg, spark)
    assert lines == [], lines
    assert (counts["verified"], counts["partitions"], counts["not_verifiable"]) == (1, cfg.partitions - 1, 1)


def test_a_correction_that_does_not_add_up_fails_the_batch(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """A bug that drops the retractions from the correction: the write fails the batch with one
    line, nothing is staged or committed; without the bug the same batch commits."""
    from pyspark.sql import functions as F

    from reconcile import differential

    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "vbug")
    rows1 = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows1)
    run_stages(spark, ledger, cfg, "run-1", 200)
    rows2 = [{"k": 1, "v": "a2"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows2)
    desc = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    consolidate = differential.consolidate

    def buggy(cfg, updates, *, partitioned=True):
        return consolidate(cfg, updates, partitioned=partitioned).where(F.col("_diff") > 0)

    monkeypatch.setattr(differential, "consolidate", buggy)
    with pytest.raises(checksums.SelfCheckFailed) as err:
        write.run_write(spark, ledger, cfg, desc.batch_id)
    text = str(err.value)
    p = partition_of_row(spark, cfg, 1, "a")
    assert "\n" not in text and f"batch {desc.batch_id} " in text and f"in hash partition {p} " in text, text
    assert "does not add up" in text and "nothing was staged or committed" in text
    assert ledger.get_batch(desc.batch_id).state == MINTED
    assert files.list_files(ShardTable(cfg).staging_path(desc.batch_id)) == {}
    assert ShardTable(cfg).latest_version() == 1

    monkeypatch.setattr(differential, "consolidate", consolidate)
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"


def test_the_shard_side_is_carried_from_the_previous_batch(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """A batch whose table only the sink changed since the previous batch read it takes the
    shard's checksums from that batch's record instead of observing the whole shard (the real
    observation runs; a spy notes which frames it saw); a compaction keeps the record valid, a
    foreign commit does not."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "vcarry")
    seen: list[str] = []
    observe = checksums.BatchChecks.observe_hashed

    def spy(self, df, role, into):
        seen.append(role)
        return observe(self, df, role, into)

    monkeypatch.setattr(checksums.BatchChecks, "observe_hashed", spy)
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    run_stages(spark, ledger, cfg, "run-1", 200)
    # the first batch has nothing to carry; its correction is the desired side as it comes, so
    # the staged write's observation counts into both sides (the desired frame is not observed apart)
    assert seen == ["persist"]
    (first,) = ledger.batches(cfg.name, (COMMITTED,))
    parts = json.loads(first.manifest)["parts"].values()
    assert all(p["desired_checksum"] == p["shard_checksum"] for p in parts)
    assert {p["desired_checksum"] for p in parts} != {"0" * 16}  # observed, not zero

    def recorded(upper: int) -> dict[int, int]:
        (b,) = [b for b in ledger.batches(cfg.name, (COMMITTED,)) if b.upper == upper]
        parts = json.loads(b.manifest)["parts"]
        return {int(p): int(part["shard_checksum"], 16) for p, part in parts.items()}

    assert write.carried_checksums(ledger, ShardTable(cfg), 200, ShardTable(cfg).latest_version()) == recorded(200)
    rows = [{"k": 1, "v": "a2"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows)
    seen.clear()
    _, w, a = run_stages(spark, ledger, cfg, "run-2", 300)
    assert a.outcome == "committed" and seen == ["desired"], (a.message, seen)
    assert shard_as_of(cfg, 299) == model_query(rows, cfg)

    # the sink's own compaction keeps the shard's checksums as of any time at or after since
    assert compact.run_compact(spark, ledger, cfg, since=299, vacuum_files=False).outcome == "compacted"
    assert write.carried_checksums(ledger, ShardTable(cfg), 300, ShardTable(cfg).latest_version()) == recorded(300)
    seen.clear()
    assert run_stages(spark, ledger, cfg, "run-3", 400)[2].outcome == "committed"
    assert seen == ["desired"]

    # a foreign commit since: nothing is carried, the shard is observed and the drift repaired
    foreign_update(cfg, 3, "c", 350, -1)
    assert write.carried_checksums(ledger, ShardTable(cfg), 400, ShardTable(cfg).latest_version()) is None
    seen.clear()
    _, w, a = run_stages(spark, ledger, cfg, "run-4", 500)
    assert a.outcome == "committed" and w.drift_rows == 1 and seen == ["desired", "persist"], (a.message, seen)
    assert shard_as_of(cfg, 499) == model_query(rows, cfg)
    assert_self_checked(ledger, cfg)
    lines, counts = verify(ledger, cfg, spark)
    assert len(lines) == 1 and f"[{iso(300)}, {iso(400)})" in lines[0], lines


def test_a_damaged_record_is_not_carried_into_the_next_batch(spark, warehouse, tmp_path, sqlite_ledger, caplog):
    """The previous batch's recorded checksums were damaged in the ledger: the next batch does not
    add up with them, is computed again with the shard observed in full, commits, and warns."""
    from sqlalchemy import text

    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "vdamaged")
    write_json_rows(tmp_path / "src", [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}])
    _, w1, _ = run_stages(spark, ledger, cfg, "run-1", 200)
    manifest = json.loads(ledger.get_batch(w1.batch_id).manifest)
    p = partition_of_row(spark, cfg, 2, "b")
    manifest["parts"][str(p)]["shard_checksum"] = "00000000000000ff"
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE reconcile_batches SET manifest = :m WHERE batch_id = :b"),
            {"m": json.dumps(manifest), "b": w1.batch_id},
        )
    rows = [{"k": 2, "v": "b"}, {"k": 3, "v": "c"}]
    write_json_rows(tmp_path / "src", rows)
    caplog.clear()
    _, w2, a2 = run_stages(spark, ledger, cfg, "run-2", 300)
    assert a2.outcome == "committed", a2.message
    assert shard_as_of(cfg, 299) == model_query(rows, cfg)
    warned = [
        r.getMessage() for r in caplog.records if "does not have the checksums the previous batch" in r.getMessage()
    ]
    assert len(warned) == 1 and w2.batch_id in warned[0], warned
    assert_self_checked(ledger, cfg, skip=1)  # batch 2 recorded its own, batch 1 keeps the damage

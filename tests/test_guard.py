"""The correction guard: a batch that would change too much of the shard stops before append,
with nothing committed, until someone approves it (CLI or run param) or fixes the source.

The expected shard is computed with plain Python (Counters of the source rows).
"""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import make_sink, run_stages, shard_as_of, write_json_rows
from reconcile import cli
from reconcile.errors import CorrectionBlocked
from reconcile.manifest import Manifest
from reconcile.storage.delta import ShardTable

GUARD = {"max_share": 0.2, "min_rows": 5}
QUERY = {"sources": {"src": {"format": "json", "path": "src"}}, "sql": "SELECT k, v FROM src WHERE k >= 0"}
EMPTY = [{"k": -1, "v": "filtered out"}]  # the desired collection is empty (the source keeps a schema)


def rows(n: int, tag: str = "v") -> list[dict]:
    return [{"k": i, "v": f"{tag}{i}"} for i in range(n)]


def model(source: list[dict]) -> Counter:
    return Counter((r["k"], r["v"], None) for r in source)


@pytest.fixture
def guarded(spark, warehouse, tmp_path, ledger, monkeypatch):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, "guarded", correction_guard=GUARD, query=QUERY)
    source = rows(20)
    write_json_rows(tmp_path / "src", source)
    _, _, a = run_stages(spark, ledger, cfg, "run-1", 200)  # the first batch fills an empty shard: no guard
    assert a.outcome == "committed"
    return cfg


def test_a_small_change_passes_and_a_truncation_stops_with_nothing_committed(spark, guarded, tmp_path, ledger):
    cfg = guarded
    changed = rows(20)
    changed[0]["v"] = "new"
    changed[1]["v"] = "new"  # 2 of 20 rows updated: 10% inserted, 10% retracted
    write_json_rows(tmp_path / "src", changed)
    _, _, a = run_stages(spark, ledger, cfg, "run-2", 300)
    assert a.outcome == "committed"

    write_json_rows(tmp_path / "src", changed[:3])  # upstream truncated: 17 of 20 rows retracted
    version, upper = ShardTable(cfg).latest_version(), ledger.get_shard(cfg.name).upper
    with pytest.raises(CorrectionBlocked) as info:
        run_stages(spark, ledger, cfg, "run-3", 400)
    text = str(info.value)
    assert "\n" not in text and "guarded" in text
    assert "retract 17 of the shard's 20 rows (85.0%" in text and "max_share 20.0%" in text
    assert "python -m reconcile approve guarded" in text
    assert ShardTable(cfg).latest_version() == version and ledger.get_shard(cfg.name).upper == upper
    assert shard_as_of(cfg, 399) == model(changed)
    blocked = ledger.batch_of_run(cfg.name, "run-3")
    assert blocked.state == "staged" and blocked.approved is None
    assert Manifest.from_json(blocked.manifest).change() == (0, 17)


def test_approval_by_the_cli_lets_the_append_through(spark, guarded, tmp_path, ledger, capsys):
    cfg = guarded
    write_json_rows(tmp_path / "src", rows(4))
    with pytest.raises(CorrectionBlocked):
        run_stages(spark, ledger, cfg, "run-2", 300)
    batch = ledger.batch_of_run(cfg.name, "run-2")
    assert cli.main(["append", cfg.name, "--run-id", "run-2"]) == 2  # still blocked: one line, no traceback
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "correction guard" in err and "Traceback" not in err

    assert cli.main(["approve", cfg.name, batch.batch_id, "--by", "oncall"]) == 0
    assert "approved batch" in capsys.readouterr().out
    assert cli.main(["append", cfg.name, "--run-id", "run-2"]) == 0
    assert ledger.get_shard(cfg.name).upper == 300
    assert shard_as_of(cfg, 299) == model(rows(4))
    assert ledger.get_batch(batch.batch_id).approved.startswith("oncall at ")
    assert cli.main(["approve", cfg.name, batch.batch_id]) == 2  # committed: nothing left to approve
    assert "only a minted or staged batch" in capsys.readouterr().err


def test_a_run_approved_up_front_passes(spark, guarded, tmp_path, ledger):
    from reconcile.sink.run import run_batch as pipeline_run

    write_json_rows(tmp_path / "src", EMPTY)
    r = pipeline_run(spark, ledger, guarded, "run-2", 300, approve="run-2 (param approve_correction)")
    assert r.append.outcome == "committed"
    assert shard_as_of(guarded, 299) == Counter()


def test_rejection_fixing_the_source_recomputes_the_batch(spark, guarded, tmp_path, ledger):
    cfg = guarded
    write_json_rows(tmp_path / "src", EMPTY)  # an empty upstream would wipe the shard
    with pytest.raises(CorrectionBlocked):
        run_stages(spark, ledger, cfg, "run-2", 300)
    fixed = rows(21)  # the source is fixed: one new row
    write_json_rows(tmp_path / "src", fixed)
    _, _, a = run_stages(spark, ledger, cfg, "run-3", 400)  # the next run supersedes the blocked batch
    assert a.outcome == "committed"
    assert ledger.batch_of_run(cfg.name, "run-2").state == "superseded"
    assert shard_as_of(cfg, 399) == model(fixed)
    assert shard_as_of(cfg, 299) == model(rows(20))  # the blocked wipe never reached the shard


def test_the_guard_waits_for_min_rows(spark, warehouse, tmp_path, ledger):
    cfg = make_sink(tmp_path, "small", correction_guard={"max_share": 0.1, "min_rows": 10}, query=QUERY)
    write_json_rows(tmp_path / "src", rows(3))
    run_stages(spark, ledger, cfg, "run-1", 200)
    write_json_rows(tmp_path / "src", EMPTY)
    _, _, a = run_stages(spark, ledger, cfg, "run-2", 300)  # 3 rows < min_rows 10: not guarded
    assert a.outcome == "committed" and shard_as_of(cfg, 299) == Counter()


def test_dry_run_says_whether_the_guard_would_stop_the_batch_it_shows(guarded, tmp_path, ledger, capsys):
    """``dry-run`` (DuckDB, then with ``--spark``) ends its totals with the guard's verdict: the
    share against ``max_share``, before anything runs."""
    cfg = guarded
    changed = rows(20)
    changed[0]["v"] = "new"
    write_json_rows(tmp_path / "src", changed)  # 1 of 20 rows: 5%
    capsys.readouterr()
    assert cli.main(["dry-run", cfg.name, "--frontier", "300"]) == 0
    out = capsys.readouterr().out
    assert "would let this batch through: it inserts 1 and retracts 1 of the shard's 20 rows (5.0%" in out, out

    write_json_rows(tmp_path / "src", changed[:3])  # truncated: 18 of the shard's 20 rows retracted (row 0 changed)
    for extra in ([], ["--spark"]):
        assert cli.main(["dry-run", cfg.name, "--frontier", "300", *extra]) == 0
        out = capsys.readouterr().out
        assert "the correction guard would STOP this batch before its append" in out, out
        assert "inserts 1 and retracts 18 of the shard's 20 rows (90.0%; correction_guard.max_share 20.0%" in out, out

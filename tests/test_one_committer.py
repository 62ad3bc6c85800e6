"""One committer: every Delta commit the sink makes is delta-rs's put-if-absent commit (table
creation, batches, compaction's rewrite, vacuum's log entries); Spark only writes data files.

The log is read here as plain JSON lines, the shard through delta-rs and the expectations come
from the plain-Python changelog model (helpers.changelog_model), never from the code under test.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers import CHANGELOG_NEW, changelog_model, committed_run, make_sink, shard_as_of, update_log, write_json_rows
from reconcile.sink import append, check, compact, mint, sync, write
from reconcile.storage.delta import ShardTable


def _commit_infos(cfg) -> list[tuple[int, dict]]:
    """(version, commitInfo) of every commit file in the shard's Delta log."""
    log = Path(ShardTable(cfg).log_path)
    out = []
    for f in sorted(log.glob("*.json")):
        if f.stem.isdigit():
            actions = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
            out.append((int(f.stem), next(a["commitInfo"] for a in actions if "commitInfo" in a)))
    return out


def _table_files(cfg) -> set[str]:
    """Every data file under the table's directory (not the log, not hidden files)."""
    root = Path(ShardTable(cfg).path)
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(("_", ".")) and p.relative_to(root).parts[0] != "_delta_log"
    }


def _referenced(cfg) -> set[str]:
    """The data files the shard's latest snapshot names (delta-rs)."""
    from deltalake import DeltaTable

    return set(DeltaTable(ShardTable(cfg).path).get_add_actions(flatten=True).column("path").to_pylist())


def _aged(path: Path, hours: float = 2) -> None:
    old = time.time() - hours * 3600
    os.utime(path, (old, old))


def test_a_written_compacted_vacuumed_shard_has_only_delta_rs_commits(spark, warehouse, tmp_path, sqlite_ledger):
    """Changelog sink, vacuum retention 0 h: two batches, a third staged but not yet appended,
    compaction to since 250 with vacuum, the third appended, compaction again. Every commit in
    the log is delta-rs's; the shard reads as the model as of every time >= since; vacuum deleted
    the replaced files and an old stray file but not the staged batch an append still committed."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "one_committer", kind="changelog", retention={"history_hours": 0, "vacuum_hours": 0})
    source: list[dict] = []
    for i, (frontier, new) in enumerate(CHANGELOG_NEW[:2]):
        source += new
        write_json_rows(tmp_path / "log", source)
        committed_run(spark, ledger, cfg, f"run-{i}", frontier)
    replaced = _table_files(cfg)
    stray = Path(ShardTable(cfg).path) / "stray.parquet"  # a dead foreign writer's file, past the retention
    pq.write_table(pa.table({"k": [1]}), stray)
    _aged(stray)

    # the third batch is staged (and its files past the retention) while compaction and vacuum run
    source += CHANGELOG_NEW[2][1]
    write_json_rows(tmp_path / "log", source)
    desc = mint.run_mint(ledger, cfg, "run-2", 1, CHANGELOG_NEW[2][0]).description
    assert desc is not None
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    staged = {f for f in _table_files(cfg) if f.startswith(f"batches/{desc.batch_id}/")}
    assert staged
    for f in staged:
        _aged(Path(ShardTable(cfg).path) / f)

    first = compact.run_compact(spark, ledger, cfg, since=250)
    assert first.outcome == "compacted", first.message
    assert not replaced & _table_files(cfg), "the replaced batch files were vacuumed"
    assert not stray.exists()
    assert staged <= _table_files(cfg), "vacuum deleted a staged batch an append may still commit"
    assert append.run_append(ledger, cfg, desc.batch_id).outcome == "committed"

    second = compact.run_compact(spark, ledger, cfg, since=350)
    assert second.outcome == "compacted", second.message
    for t in range(350, 450):
        assert shard_as_of(cfg, t) == changelog_model(CHANGELOG_NEW, t), f"as of {t}"
    assert {u["_time"] for u in update_log(cfg)} <= set(range(350, 400))
    # only the files of the last rewrite are left, all in its directory
    referenced = _referenced(cfg)
    assert _table_files(cfg) == referenced
    assert len({f.split("/")[1] for f in referenced}) == 1 and all(f.startswith("compactions/") for f in referenced)
    assert check.violations(ledger, cfg, spark=spark) == []

    infos = _commit_infos(cfg)
    assert [v for v, _ in infos] == list(range(len(infos)))
    made_by = {(i.get("engineInfo", ""), i.get("clientVersion", "")) for _, i in infos}
    assert all(e.startswith("delta-rs:") and c.startswith("delta-rs.") for e, c in made_by), made_by
    ops = [i["operation"] for _, i in infos]
    assert ops[0] == "CREATE TABLE" and ops.count("WRITE") == 5, ops  # 3 batches, 2 rewrites
    assert not any(op.startswith("VACUUM") for op in ops), ops  # vacuum deletes files, commits nothing
    sink_ops = [json.loads(i["userMetadata"])["reconcile"] for _, i in infos if "userMetadata" in i]
    assert [m["op"] for m in sink_ops] == ["batch", "batch", "compact", "batch", "compact"]
    assert [m["since"] for m in sink_ops if m["op"] == "compact"] == [250, 350]


@pytest.mark.slow  # the quick tier keeps this module's lighter tests
def test_a_compaction_that_lost_or_died_leaves_no_files(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """A compaction that loses to a batch deletes its rewrite; the directory of one that died
    before its commit stays while it could still commit (the log ends at the version it read)
    and is deleted once another commit took the version after it."""
    ledger = sqlite_ledger
    cfg = make_sink(tmp_path, "lost_compactions", kind="changelog", retention={"history_hours": 0})
    source: list[dict] = []
    runs = iter(enumerate(CHANGELOG_NEW))

    def next_run() -> None:
        i, (frontier, new) = next(runs)
        source.extend(new)
        write_json_rows(tmp_path / "log", source)
        committed_run(spark, ledger, cfg, f"run-{i}", frontier)

    next_run()
    next_run()
    table = ShardTable(cfg)
    real = compact.compacted

    def batch_sneaks_in(cfg_, updates, since):
        next_run()
        return real(cfg_, updates, since)

    monkeypatch.setattr(compact, "compacted", batch_sneaks_in)
    raced = compact.run_compact(spark, ledger, cfg)
    monkeypatch.setattr(compact, "compacted", real)
    assert raced.outcome == "raced", raced.message
    assert table.compaction_dirs() == []
    for t in range(100, 450):
        assert shard_as_of(cfg, t) == changelog_model(CHANGELOG_NEW, t), f"as of {t}"

    # what a compaction killed between its files and its commit leaves behind
    latest = table.latest_version()
    dead = Path(table.compaction_path(f"{latest}-{'d' * 32}"))
    dead.mkdir(parents=True)
    pq.write_table(pa.table({"k": [1]}), dead / "part-00000.parquet")
    foreign = Path(table.compaction_path("notes"))  # not a compaction's name: not the sink's
    foreign.mkdir()
    assert sync.stale_compactions(table) == []  # it may still commit as version latest + 1
    done = compact.run_compact(spark, ledger, cfg, since=399)  # takes version latest + 1
    assert done.outcome == "compacted", done.message
    assert not dead.exists() and foreign.exists()
    assert table.compaction_dirs() == sorted([foreign.name, f"{latest}-{done_token(table, done.delta_version)}"])
    assert check.violations(ledger, cfg, spark=spark) == []


def done_token(table: ShardTable, version: int | None) -> str:
    """The token a compaction commit records (its directory's name ends with it)."""
    assert version is not None
    return json.loads(table.commit_info(version)["userMetadata"])["reconcile"]["token"]

"""The ledger database is rebuildable from the Delta log (issue 17.5), on SQLite and PostgreSQL.

- **lost** (the SQLite file deleted, the PostgreSQL schema dropped): ``check`` and the next run
  rebuild the shard row and every committed batch from the log, ``since`` from the compaction
  commits; nothing is lost or applied twice.
- **behind** (restored from an older backup holding staged batches that were committed or
  superseded meanwhile): ``recover`` and the next run roll it forward; no committed lower is
  appended again.
- **ahead** (the Delta table put back from an older copy): every stage refuses with one line
  naming the versions and the remedy, nothing is written; ``recover`` refuses to drop batches
  without ``--force``, and with it the next run recomputes the shard from the log's upper.

Every expectation comes from the plain-Python model of the source (``helpers.model_kv``) and
from the Delta log read directly, never from the code under test.
"""

from __future__ import annotations

import gc
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable
from sqlalchemy import create_engine, delete, insert, select, text

from helpers import make_sink, model_kv, run_stages, write_json_rows
from reconcile import cli
from reconcile.errors import MetadataAheadOfLog, SinkError
from reconcile.model import COMMITTED, SUPERSEDED
from reconcile.sink import append, check, compact, mint, write
from reconcile.sink.sync import sync
from reconcile.storage import files
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.ledger import Ledger
from reconcile.storage.ledger_rows import Batch, Shard


def _rows(version: int) -> list[dict]:
    """A source that changes each version: updates, inserts, deletes, a duplicate."""
    rows = [{"k": k, "v": f"v{(k * 7 + version) % 3}"} for k in range(version % 3, 5 + version)]
    return rows + rows[:1]


def _log_batches(cfg) -> list[tuple[int, int, int, str]]:
    """(version, lower, upper, batch id) of every batch commit, read from the Delta log itself."""
    return [(c.version, c.lower, c.upper, c.batch_id) for c in batch_commits(ShardTable(cfg).history_since(-1)[1])]


def _ledger(ledger, cfg) -> list[tuple]:
    return [
        (b.batch_id, b.lower, b.upper, b.delta_version, b.rows_ok, b.rows_err, b.stage_id)
        for b in ledger.batches(cfg.name, (COMMITTED,))
    ]


def _converged(spark, ledger, cfg, history: list[tuple[int, list[dict]]]) -> None:
    """The shard as of each batch's upper - 1 is the model's; every lower was committed once and
    lowers chain (from the log); the ledger agrees with the log (check's invariants)."""
    commits = _log_batches(cfg)
    lowers = [lo for _, lo, _, _ in commits]
    assert lowers == sorted(set(lowers)), f"a lower committed twice or out of order: {commits}"
    assert all(a[2] == b[1] for a, b in zip(commits, commits[1:])), commits
    from reconcile.storage import frames

    updates = [u.asDict() for u in frames.read_updates(spark, ShardTable(cfg)).collect()]  # read once with plain Spark
    for upper, rows in history:
        got: Counter = Counter()
        for u in updates:
            if u["_time"] <= upper - 1:
                got[tuple(u[c] for c in cfg.column_names) + (u["_error"],)] += u["_diff"]
        assert +got == model_kv(rows), f"as of {upper - 1}"
    assert check.violations(ledger, cfg) == []


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _sink(tmp_path, monkeypatch, name):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    return make_sink(tmp_path, name)


def _batch(spark, ledger, cfg, tmp_path, run_id: str, upper: int, version: int, history: list) -> None:
    rows = _rows(version)
    write_json_rows(tmp_path / "src", rows)
    _, _, a = run_stages(spark, ledger, cfg, run_id, upper)
    assert a is not None and a.outcome == "committed", a
    history.append((upper, rows))


# -- losing the database and backing it up, on either backend ---------------------------------


def _lose(url: str) -> None:
    """The ledger database is gone: the SQLite file deleted, the PostgreSQL schema dropped
    (and provisioned again empty, as a replacement database would be)."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
        return
    schema = url.rsplit("search_path%3D", 1)[1]
    base = url.split("?")[0]
    engine = create_engine(base)
    with engine.begin() as c:
        c.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        c.execute(text(f"CREATE SCHEMA {schema}"))
    engine.dispose()


def _backup(url: str, tmp_path: Path, tag: str):
    """A backup of the ledger: SQLite's online backup of the file; PostgreSQL's rows of the
    shard and batch tables."""
    if url.startswith("sqlite"):
        dest = tmp_path / f"backup-{tag}.db"
        src, dst = sqlite3.connect(url.removeprefix("sqlite:///")), sqlite3.connect(dest)
        src.backup(dst)
        src.close()
        dst.close()
        return dest
    engine = create_engine(url)
    with engine.connect() as c:
        rows = {t: [dict(r._mapping) for r in c.execute(select(t.__table__))] for t in (Shard, Batch)}
    engine.dispose()
    return rows


def _restore(url: str, backup) -> None:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(backup, path)
        return
    engine = create_engine(url)
    with engine.begin() as c:
        for t in (Batch, Shard):
            c.execute(delete(t.__table__))
        for t in (Shard, Batch):
            if backup[t]:
                c.execute(insert(t.__table__), backup[t])
    engine.dispose()


@pytest.fixture
def reopen(request):
    """``reopen(ledger, url, change)``: close every connection to the ledger, ``change`` it
    (lose it, restore a backup), and open the ledger the next process would."""

    def call(ledger: Ledger, url: str, change) -> Ledger:
        ledger.dispose()
        gc.collect()  # ledgers the CLI opened: no SQLite connection may outlive the file it opened
        change()
        new = Ledger(url)
        request.addfinalizer(new.dispose)
        return new

    return call


# -- (a) a lost database ---------------------------------------------------------------------


def test_a_lost_database_is_rebuilt_by_check_and_by_the_next_run(
    spark, warehouse, tmp_path, metadata_url, ledger, monkeypatch, capsys, reopen
):
    cfg = _sink(tmp_path, monkeypatch, "lost_db")
    history: list = []
    _batch(spark, ledger, cfg, tmp_path, "run-1", 200, 1, history)
    _batch(spark, ledger, cfg, tmp_path, "run-2", 300, 2, history)
    assert compact.run_compact(spark, ledger, cfg, since=250, vacuum_files=False).outcome == "compacted"
    _batch(spark, ledger, cfg, tmp_path, "run-3", 400, 3, history)
    ledger.set_read_only(cfg.name, True)  # lives only in the ledger
    before = _ledger(ledger, cfg)
    shard_before = ledger.get_shard(cfg.name)
    assert (shard_before.upper, shard_before.since) == (400, 250)

    # lost: `check` (no JVM) rebuilds the row and the committed batches from the log
    ledger = reopen(ledger, metadata_url, lambda: _lose(metadata_url))
    rc, out, _ = _cli(capsys, "check", cfg.name)
    assert rc == 0 and "0 invariant violation(s)" in out, out
    shard = ledger.get_shard(cfg.name)
    assert (shard.upper, shard.since, shard.as_of) == (400, 250, cfg.as_of)
    assert shard.read_only is False  # documented: the switch lived only in the lost database
    assert _ledger(ledger, cfg) == before
    assert [(b[3], b[1], b[2], b[0]) for b in before] == _log_batches(cfg)
    rc, out, _ = _cli(capsys, "recover", cfg.name)
    assert rc == 0 and "already agrees" in out, out

    # lost again: the next run's mint rebuilds it first, and its batch starts where the table ends
    ledger = reopen(ledger, metadata_url, lambda: _lose(metadata_url))
    versions = ShardTable(cfg).log_versions()
    rows = _rows(4)
    write_json_rows(tmp_path / "src", rows)
    m, w, a = run_stages(spark, ledger, cfg, "run-4", 500)
    assert m.description is not None and (m.description.lower, m.description.upper) == (400, 500), m.message
    assert w is not None and w.outcome == "staged" and a is not None and a.outcome == "committed", a
    assert ShardTable(cfg).log_versions() == versions + [versions[-1] + 1]  # one new version: run-4's batch
    assert [b.lower for b in ledger.batches(cfg.name) if b.run_id == "run-4"] == [400]  # minted once, after the rebuild
    history.append((500, rows))
    assert _ledger(ledger, cfg)[:3] == before
    assert ledger.get_shard(cfg.name).since == 250
    _converged(spark, ledger, cfg, [h for h in history if h[0] > 250])

    # Delta's log cleanup removes the commit files before a checkpoint (after 30 days by
    # default; here at once): a lost ledger is rebuilt from the first batch still there, and
    # since is raised to it (the compaction's commit is gone: a narrower promise)
    path = ShardTable(cfg).path
    DeltaTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"})
    DeltaTable(path).create_checkpoint()
    _batch(spark, ledger, cfg, tmp_path, "run-5", 600, 5, history)
    DeltaTable(path).cleanup_metadata()
    assert ShardTable(cfg).log_versions()[0] > 0 and [lo for _, lo, _, _ in _log_batches(cfg)] == [500]
    ledger = reopen(ledger, metadata_url, lambda: _lose(metadata_url))
    rc, out, _ = _cli(capsys, "recover", cfg.name)
    assert rc == 0 and "rebuilt the lost shard row" in out and "read_only=False" in out, out
    shard = ledger.get_shard(cfg.name)
    assert (shard.upper, shard.since) == (600, 500)
    assert [(lo, hi) for _, lo, hi, *_ in _ledger(ledger, cfg)] == [(500, 600)]
    _converged(spark, ledger, cfg, history[-1:])

    # once no batch commit is left in the log, it no longer says where the shard ends: an intact
    # ledger goes on (its last batch's commit file was cleaned up, not lost), a lost one cannot
    # be rebuilt and every stage says so
    DeltaTable(path).alter.set_table_properties({"delta.checkpointInterval": "10"})
    DeltaTable(path).create_checkpoint()
    DeltaTable(path).cleanup_metadata()
    assert _log_batches(cfg) == []
    assert sync(ledger, ShardTable(cfg)).upper == 600
    ledger = reopen(ledger, metadata_url, lambda: _lose(metadata_url))
    rc, _, err = _cli(capsys, "recover", cfg.name)
    assert rc == 2 and err.count("\n") == 1, err
    assert "cannot rebuild the shard's metadata" in err and "last committed lower is" in err, err
    with pytest.raises(SinkError, match="cannot rebuild"):
        run_stages(spark, ledger, cfg, "run-6", 700)
    assert _log_batches(cfg) == []  # nothing was written


# -- (b) a database restored from an older backup --------------------------------------------


def test_a_database_restored_from_an_older_backup_rolls_forward(
    spark, warehouse, tmp_path, metadata_url, ledger, monkeypatch, capsys, reopen
):
    cfg = _sink(tmp_path, monkeypatch, "restored_db")
    history: list = []
    _batch(spark, ledger, cfg, tmp_path, "run-1", 200, 1, history)

    # backup 1 holds run-2's batch staged; it is committed afterwards
    write_json_rows(tmp_path / "src", _rows(2))
    b2 = mint.run_mint(ledger, cfg, "run-2", 1, 300).description
    assert write.run_write(spark, ledger, cfg, b2.batch_id).outcome == "staged"
    backup1 = _backup(metadata_url, tmp_path, "1")
    assert append.run_append(ledger, cfg, b2.batch_id).outcome == "committed"
    history.append((300, _rows(2)))

    # backup 2 holds run-3's batch staged; a backfill's narrower batch supersedes and commits first
    write_json_rows(tmp_path / "src", _rows(3))
    b3 = mint.run_mint(ledger, cfg, "run-3", 1, 400).description
    assert write.run_write(spark, ledger, cfg, b3.batch_id).outcome == "staged"
    backup2 = _backup(metadata_url, tmp_path, "2")
    _batch(spark, ledger, cfg, tmp_path, "backfill-3", 350, 3, history)
    truth = _ledger(ledger, cfg)
    assert ledger.get_batch(b3.batch_id).state == SUPERSEDED

    # restored to backup 2: `recover` rolls it forward; run-3's staged batch stays superseded
    ledger = reopen(ledger, metadata_url, lambda: _restore(metadata_url, backup2))
    assert ledger.get_shard(cfg.name).upper == 300 and ledger.get_batch(b3.batch_id).state == "staged"
    rc, out, _ = _cli(capsys, "recover", cfg.name)
    assert rc == 0 and "rolled the metadata forward" in out, out
    assert ledger.get_shard(cfg.name).upper == 350
    assert ledger.get_batch(b3.batch_id).state == SUPERSEDED
    assert [t[:4] for t in _ledger(ledger, cfg)] == [t[:4] for t in truth]
    assert check.violations(ledger, cfg) == []

    # restored to backup 1: clearing run-2's append finds it committed (no new Delta version),
    # and the next run appends after the log's end
    ledger = reopen(ledger, metadata_url, lambda: _restore(metadata_url, backup1))
    assert ledger.get_shard(cfg.name).upper == 200 and ledger.get_batch(b2.batch_id).state == "staged"
    versions = ShardTable(cfg).log_versions()
    assert append.run_append(ledger, cfg, b2.batch_id).outcome == "recovered"
    assert ShardTable(cfg).log_versions() == versions
    assert [t[:4] for t in _ledger(ledger, cfg)] == [t[:4] for t in truth]
    _batch(spark, ledger, cfg, tmp_path, "run-5", 450, 5, history)
    assert [lo for _, lo, _, _ in _log_batches(cfg)] == [100, 200, 300, 350]
    _converged(spark, ledger, cfg, history)


# -- (c) a database ahead of a Delta table restored from an older copy ------------------------


def test_a_delta_table_restored_from_an_older_copy_is_refused_until_recovered(
    spark, warehouse, tmp_path, metadata_url, ledger, monkeypatch, capsys, reopen
):
    cfg = _sink(tmp_path, monkeypatch, "restored_table")
    history: list = []
    _batch(spark, ledger, cfg, tmp_path, "run-1", 200, 1, history)
    _batch(spark, ledger, cfg, tmp_path, "run-2", 300, 2, history)
    table = Path(ShardTable(cfg).path)
    shutil.copytree(table, tmp_path / "table-copy")  # the table's backup, at upper 300
    _batch(spark, ledger, cfg, tmp_path, "run-3", 400, 3, history)
    ledger_version = ledger.get_shard(cfg.name).delta_version
    run3 = ledger.batch_of_run(cfg.name, "run-3")
    assert run3 is not None

    shutil.rmtree(table)
    shutil.copytree(tmp_path / "table-copy", table)  # ... put back
    versions = ShardTable(cfg).log_versions()
    assert versions[-1] < ledger_version

    # the next run refuses before writing anything, in one line that says what to do
    write_json_rows(tmp_path / "src", _rows(5))
    with pytest.raises(MetadataAheadOfLog) as info:
        run_stages(spark, ledger, cfg, "run-5", 500)
    msg = str(info.value)
    assert "\n" not in msg
    assert "upper=1970-01-01T00:00:00.400Z (400)" in msg and f"Delta version {run3.delta_version}" in msg, msg
    assert f"ends at version {versions[-1]} with upper=1970-01-01T00:00:00.300Z (300)" in msg, msg
    assert f"python -m reconcile recover {cfg.name} --force" in msg, msg
    assert ShardTable(cfg).log_versions() == versions
    assert files.list_dirs(ShardTable(cfg).staging_root) == sorted(
        b for _, _, _, b in _log_batches(cfg)
    )  # nothing staged either

    # foreign commits that push the log past the ledger's version do not hide it: the version
    # of the ledger's last batch is now something else
    while ShardTable(cfg).log_versions()[-1] < ledger_version:
        DeltaTable(str(table)).alter.set_table_properties({"delta.checkpointInterval": "10"})
    with pytest.raises(MetadataAheadOfLog, match=f"its version {run3.delta_version} is maintenance"):
        sync(ledger, ShardTable(cfg))
    rc, _, err = _cli(capsys, "check", cfg.name)
    assert rc == 2 and err.count("\n") == 1 and "restored from an older copy" in err, err

    # recover refuses to drop batches without --force, and changes nothing
    before = _ledger(ledger, cfg)
    rc, _, err = _cli(capsys, "recover", cfg.name)
    assert rc == 2 and "1 committed batch(es)" in err and "--force" in err, err
    assert _ledger(ledger, cfg) == before

    rc, out, _ = _cli(capsys, "recover", cfg.name, "--force")
    assert rc == 0 and "reset the metadata to the Delta log" in out, out
    shard = ledger.get_shard(cfg.name)
    assert shard.upper == 300
    lost = [ledger.get_batch(b[0]) for b in before[2:]]
    assert [(b.lower, b.state) for b in lost] == [(300, SUPERSEDED)]
    assert all(b.message.startswith("lost: ") for b in lost)
    assert check.violations(ledger, cfg) == []

    # the next run recomputes the shard from the log's upper: [300, 500) in one batch
    history = history[:2]
    m, _, a = run_stages(spark, ledger, cfg, "run-5", 500)
    assert (m.description.lower, m.description.upper) == (300, 500) and a.outcome == "committed", a
    history.append((500, _rows(5)))
    assert [lo for _, lo, _, _ in _log_batches(cfg)] == [100, 200, 300]
    _converged(spark, ledger, cfg, history)

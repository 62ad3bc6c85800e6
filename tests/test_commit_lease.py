"""The shard's commit lease: the ledger serializes the sink's own Delta commits.

Writers take turns on SQLite and PostgreSQL, from several processes, with epochs that only
increase; a writer paused past its TTL (a stopped process) whose lease another append took
cannot commit when it resumes (its fence fails, nothing committed), and the batch is committed
once, by the other; a writer killed while holding the lease blocks the next one until its TTL
and no longer. The appends run as separate processes (``python -m reconcile append``); the
batches are staged by the write (Spark, in-process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text

from helpers import assert_one_line, make_sink, until, write_json_rows
from reconcile.model import COMMITTED
from reconcile.sink import mint, write
from reconcile.storage import commits
from reconcile.storage.delta import ShardTable
from reconcile.storage.engine import downgrade, make_engine, upgrade
from reconcile.storage.lease import CommitLeaseBusy, CommitLeaseLost
from reconcile.storage.ledger_rows import Shard

AS_OF = 100


def lease_row(ledger, name: str) -> tuple[int, str | None, int | None, int]:
    """(epoch, holder, until, the database's clock now) of the shard's commit lease."""
    q = select(Shard.commit_epoch, Shard.commit_holder, Shard.commit_until, ledger._clock_ms())
    with ledger.engine.connect() as c:
        epoch, holder, until, now = c.execute(q.where(Shard.name == name)).one()
    return epoch, holder, until, now


def wait_for(what: str, check, timeout: float = 90.0, every: float = 0.02):
    return until(what, check, timeout, every)


# --- the lease in the ledger ------------------------------------------------------------------

TAKER = """
import os, sys, time
from pathlib import Path
from reconcile.storage.ledger import Ledger

url, name, me, turns, journal, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], Path(sys.argv[6])
ledger = Ledger(url)
fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
while not go.exists():
    time.sleep(0.005)
for _ in range(turns):
    with ledger.commit_lease(name, me, ttl=20, wait=120) as lease:
        os.write(fd, f"enter {lease.epoch} {me}\\n".encode())
        lease.fence()
        time.sleep(0.01)  # a commit's worth of holding it
        os.write(fd, f"exit {lease.epoch} {me}\\n".encode())
"""


def test_writers_in_several_processes_take_turns_with_increasing_epochs(ledger, tmp_path):
    ledger.ensure_shard("turns", AS_OF)
    journal, go = tmp_path / "journal", tmp_path / "go"
    n, turns = 4, 5
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TAKER, ledger.url, "turns", f"p{i}", str(turns), str(journal), str(go)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    go.touch()
    for p in procs:
        assert p.wait(timeout=180) == 0, p.stderr.read() if p.stderr else ""
    lines = [line.split() for line in journal.read_text().splitlines()]
    assert len(lines) == 2 * n * turns
    # never two holders at once: every enter is followed by its own exit, before the next enter
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter[0] == "enter" and leave == ["exit", *enter[1:]], (enter, leave)
    # every taking got the next epoch (distinct, increasing in the order the lease was held)
    assert [int(e[1]) for e in lines[::2]] == list(range(1, n * turns + 1))
    assert {e[2] for e in lines[::2]} == {f"p{i}" for i in range(n)}
    epoch, holder, until, _ = lease_row(ledger, "turns")
    assert (epoch, holder, until) == (n * turns, None, None)  # let go by the last holder


def test_a_lapsed_lease_is_taken_with_a_higher_epoch_and_fences_its_old_holder_out(ledger):
    ledger.ensure_shard("lapse", AS_OF)
    a = ledger.take_commit_lease("lapse", "writer A", ttl=0.4)
    a.fence()  # holds: renewed for another 0.4 s

    with pytest.raises(CommitLeaseBusy) as busy:
        ledger.take_commit_lease("lapse", "writer B", ttl=10, wait=0.1)
    assert "writer A" in assert_one_line(busy.value, "lapse")

    time.sleep(0.6)  # A pauses past its TTL
    with pytest.raises(CommitLeaseLost) as lapsed:
        a.fence()  # nobody took it yet: lapsed is lost all the same
    assert "lapsed" in assert_one_line(lapsed.value, "lapse")

    b = ledger.take_commit_lease("lapse", "writer B", ttl=10, wait=0)
    assert b.epoch == a.epoch + 1
    with pytest.raises(CommitLeaseLost) as taken:
        a.fence()
    text_ = assert_one_line(taken.value, "lapse")
    assert "writer B" in text_ and f"epoch {b.epoch}" in text_ and "nothing was committed" in text_
    assert ledger.release_commit_lease(a) is False  # A cannot let go of B's lease
    b.fence()  # B still holds it
    assert ledger.release_commit_lease(b) is True
    c = ledger.take_commit_lease("lapse", "writer C", ttl=10, wait=0)
    assert c.epoch == b.epoch + 1


def test_a_waiting_writer_takes_the_lease_as_soon_as_it_is_let_go(ledger):
    ledger.ensure_shard("handover", AS_OF)
    taken: dict = {}

    def second():
        with ledger.commit_lease("handover", "writer B", ttl=30, wait=60) as lease:
            taken["at"], taken["epoch"] = time.monotonic(), lease.epoch

    with ledger.commit_lease("handover", "writer A", ttl=30) as first:
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.5)
        assert "at" not in taken  # B waits while A holds it
        released = time.monotonic()
    thread.join(timeout=30)
    assert taken["epoch"] == first.epoch + 1
    assert taken["at"] - released < 10.0  # at its next poll, not after the 30 s TTL (a busy machine: seconds)


def test_migration_0006_gives_existing_shards_a_free_lease_and_downgrades(metadata_url):
    engine = make_engine(metadata_url)
    try:
        upgrade(engine, "0005")
        with engine.begin() as c:
            c.execute(
                text(
                    "INSERT INTO reconcile_shards (name, upper, since, as_of, read_only, delta_version, created_at, updated_at) "
                    "VALUES ('old', 500, 0, 100, false, 3, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        upgrade(engine)
        with engine.connect() as c:
            row = c.execute(text("SELECT upper, commit_epoch, commit_holder, commit_until FROM reconcile_shards")).one()
        assert tuple(row) == (500, 0, None, None)
        downgrade(engine, "0005")
        with engine.connect() as c:
            assert c.execute(text("SELECT name, upper FROM reconcile_shards")).all() == [("old", 500)]
            cols = {col["name"] for col in inspect(c).get_columns("reconcile_shards")}
        assert not cols & {"commit_epoch", "commit_holder", "commit_until"}
    finally:
        engine.dispose()


# --- the fence in the Delta commit ------------------------------------------------------------


def test_a_failing_fence_commits_nothing(warehouse, tmp_path, sqlite_ledger):
    """``commit_files`` calls the fence right before putting the commit file: what it raises
    ends the commit, and the log is unchanged; a fence that holds lets the commit through."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = make_sink(tmp_path, "fenced")
    table = ShardTable(cfg)
    table.ensure()
    rel = "part-0.parquet"
    cols = {
        "k": pa.array([1], pa.int64()),
        "v": ["a"],
        "_time": [150],
        "_diff": [1],
        "_error": pa.array([None], pa.string()),
    }
    pq.write_table(pa.table(cols), f"{table.path}/{rel}")
    staged = [(rel, os.path.getsize(f"{table.path}/{rel}"), {"numRecords": 1})]
    before = table.latest_version()
    sqlite_ledger.ensure_shard("fenced", AS_OF)
    held = sqlite_ledger.take_commit_lease("fenced", "writer A", ttl=0.2)
    time.sleep(0.4)  # lapsed
    with pytest.raises(CommitLeaseLost):
        table.commit_files(staged, {"batch_id": "b1", "lower": 100, "upper": 200}, 100, fence=held.fence)
    assert table.latest_version() == before

    calls = []
    ok = sqlite_ledger.take_commit_lease("fenced", "writer B", ttl=10)
    version = table.commit_files(
        staged, {"batch_id": "b1", "lower": 100, "upper": 200}, 100, fence=lambda: calls.append(ok.fence())
    )
    assert version == before + 1 and len(calls) == 1


def test_the_write_creates_the_shard_s_table_under_the_lease_and_only_after_its_holder_let_go(
    spark, warehouse, tmp_path, ledger
):
    """Version 0 is a commit like any other: the write that creates the table waits while
    another writer holds the shard's commit lease, and takes the next epoch; a creator whose
    lease another writer has taken creates nothing."""
    name = "created_in_turn"
    ledger.ensure_shard(name, AS_OF)
    with ledger.commit_lease(name, "another writer", ttl=30) as other:
        done: dict = {}
        thread = threading.Thread(target=lambda: done.update(result=staged_batch(spark, ledger, tmp_path, name)))
        thread.start()
        time.sleep(2.0)
        assert not ShardTable(make_sink(tmp_path, name)).exists(), "created while another writer held the lease"
        released = time.time()
    thread.join(timeout=120)
    cfg, _ = done["result"]
    table = ShardTable(cfg)
    assert table.commit_info(0)["operation"] == "CREATE TABLE"
    assert table.commit_info(0)["timestamp"] >= int(released * 1000) - 5
    epoch, holder, _, _ = lease_row(ledger, name)
    assert (epoch, holder) == (other.epoch + 1, None)  # taken once more (the creation), let go

    stale = ShardTable(make_sink(tmp_path, "fenced_creation"))
    ledger.ensure_shard("fenced_creation", AS_OF)

    def lease_taken_over():
        lease = ledger.take_commit_lease("fenced_creation", "creator A", ttl=0.2)
        time.sleep(0.4)
        ledger.take_commit_lease("fenced_creation", "writer B", ttl=30, wait=0)
        return _held(lease)

    with pytest.raises(CommitLeaseLost):
        stale.ensure(lease_taken_over)
    assert not stale.exists()


class _held:
    """A lease already taken, as the context manager ``ShardTable.ensure`` holds."""

    def __init__(self, lease):
        self.lease = lease

    def __enter__(self):
        return self.lease

    def __exit__(self, *exc):
        return False


# --- appends holding the lease ----------------------------------------------------------------


def staged_batch(spark, ledger, tmp_path, name: str):
    cfg = make_sink(tmp_path, name)
    write_json_rows(tmp_path / "src", [{"k": i, "v": f"v{i}"} for i in range(10)])
    desc = mint.run_mint(ledger, cfg, "run-1", 1, 200).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    return cfg, desc


def start_append(tmp_path: Path, cfg, *, ttl: float, failpoints: str | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_GATEWAY_PORT", "RECONCILE_FAILPOINTS")}
    env.update(RECONCILE_SINKS_DIR=str(tmp_path), RECONCILE_COMMIT_LEASE_SECONDS=str(ttl))
    if failpoints:
        env["RECONCILE_FAILPOINTS"] = failpoints
    cmd = [sys.executable, "-m", "reconcile", "append", cfg.name, "--run-id", "run-1"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def batch_commits(cfg) -> list[dict]:
    """The sink's batch commits in the Delta log (its commit metadata)."""
    table = ShardTable(cfg)
    metas = [commits.reconcile_meta(table.commit_info(v)) for v in table.log_versions()]
    return [m for m in metas if m and m.get("op") == "batch"]


def test_a_paused_append_whose_lease_was_taken_cannot_commit(spark, warehouse, tmp_path, ledger):
    """Append A takes the lease (TTL 1 s) and stops (SIGSTOP, before its fence); its lease lapses
    and append B of the same batch takes it, then stops too. A resumes: its fence fails, it
    commits nothing. B resumes and commits the batch, once, with its own epoch."""
    cfg, desc = staged_batch(spark, ledger, tmp_path, "paused")
    a = start_append(tmp_path, cfg, ttl=1, failpoints="append.inside_lease=sleep:4")
    try:
        epoch_a, holder_a, *_ = wait_for("A to take the lease", lambda: (r := lease_row(ledger, cfg.name))[1] and r)
        os.kill(a.pid, signal.SIGSTOP)  # A is paused inside its lease, before the fence
        a_stopped = time.monotonic()
        wait_for("A's lease to lapse", lambda: (r := lease_row(ledger, cfg.name))[2] < r[3])
        b = start_append(tmp_path, cfg, ttl=60, failpoints="append.inside_lease=sleep:4")
        try:
            epoch_b, holder_b, *_ = wait_for(
                "B to take the lease", lambda: (r := lease_row(ledger, cfg.name))[0] > epoch_a and r
            )
            os.kill(b.pid, signal.SIGSTOP)
            assert epoch_b == epoch_a + 1 and holder_b != holder_a
            time.sleep(max(0.0, 4.5 - (time.monotonic() - a_stopped)))  # A's own pause is over when it resumes
            os.kill(a.pid, signal.SIGCONT)
            out_a, err_a = a.communicate(timeout=120)
            assert batch_commits(cfg) == []  # A committed nothing
            os.kill(b.pid, signal.SIGCONT)
            out_b, err_b = b.communicate(timeout=120)
        finally:
            b.kill()
    finally:
        a.kill()
    assert a.returncode == 75, (out_a, err_a)  # retryable
    lost = err_a.strip().splitlines()[-1]
    assert "lost the shard's commit lease" in lost and f"epoch {epoch_a}" in lost and "nothing was committed" in lost
    assert b.returncode == 0 and "appended batch" in out_b, (out_b, err_b)

    (only,) = batch_commits(cfg)
    assert only["batch_id"] == desc.batch_id and only["commit_epoch"] == epoch_b
    assert ledger.get_batch(desc.batch_id).state == COMMITTED
    # A's retry finds what B committed
    again = start_append(tmp_path, cfg, ttl=30)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and "already committed" in out, (out, err)
    assert len(batch_commits(cfg)) == 1


def test_a_writer_killed_holding_the_lease_blocks_the_next_no_longer_than_its_ttl(spark, warehouse, tmp_path, ledger):
    ttl = 6.0
    cfg, desc = staged_batch(spark, ledger, tmp_path, "killed")
    a = start_append(tmp_path, cfg, ttl=ttl, failpoints="append.inside_lease=kill")
    out, err = a.communicate(timeout=120)
    assert a.returncode == 137, (out, err)
    epoch_a, holder_a, until_a, now = lease_row(ledger, cfg.name)
    assert holder_a is not None and until_a > now  # the dead writer still holds it

    b = start_append(tmp_path, cfg, ttl=30)
    out, err = b.communicate(timeout=120)
    assert b.returncode == 0 and "appended batch" in out, (out, err)
    assert "took over a commit lease that lapsed" in err
    (only,) = batch_commits(cfg)
    assert only["batch_id"] == desc.batch_id and only["commit_epoch"] == epoch_a + 1
    version = ledger.get_batch(desc.batch_id).delta_version
    committed_at = ShardTable(cfg).commit_info(version)["timestamp"]
    # B committed once A's lease lapsed, and soon after (it polls at most every 0.25 s)
    assert until_a <= committed_at < until_a + 5000, (until_a, committed_at)
    epoch, holder, until, _ = lease_row(ledger, cfg.name)
    assert (epoch, holder, until) == (epoch_a + 1, None, None)

"""Racing writers: several processes run batches of one sink at once, on SQLite and PostgreSQL.

Each process is a real ``python -m reconcile run`` (its own metadata connections; its own local
Spark JVM in one test, a client of the session's Spark Connect server in the others). Whatever the interleaving: at most one commit per lower, the losers clean up and
say which batch superseded them, and after one more run the shard equals the model.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import make_sink, run_stages, shard_as_of, write_json_rows
from reconcile.model import Outcome
from reconcile.sink import check
from reconcile.storage import files
from reconcile.storage.commits import batch_commits
from reconcile.storage.delta import ShardTable


def _causes(stderr: str) -> str:
    """The lines of a crashed racer's stderr that say why (a JVM stack trace is mostly noise)."""
    keys = ("Error", "Exception", "Caused by", "error:")
    lines = [line for line in stderr.splitlines() if any(k in line for k in keys) and not line.startswith("\tat ")]
    return "\n".join(lines[:15]) + "\n...\n" + stderr[-800:]


@pytest.fixture(scope="module")
def s3_connect_url(s3_server_running, tmp_path_factory):
    """A Spark Connect server that reads the test S3 server's credentials from its environment,
    as a deployment's server does (the shared one started without them): the S3 racers' Spark."""
    from conftest import _stop_connect, start_connect_server

    home = tmp_path_factory.mktemp("s3-connect")
    url = start_connect_server(home, s3_server_running.storage_options())
    yield url
    _stop_connect(home)


def _env(remote: str) -> dict:
    """The racers' environment: clients of the Spark Connect server at ``remote`` (the races are
    on the ledger and the Delta log, which every process reaches on its own; a batch's append
    needs no JVM; tests/test_crash.py kills a write in a JVM of its own, spark-submit's form)."""
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    env["RECONCILE_SPARK_REMOTE"] = remote
    return env


def _racers(cfg, frontiers: list[int], env: dict) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "reconcile", "run", cfg.name, "--frontier", str(f), "--run-id", f"racer-{i}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, f in enumerate(frontiers)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("racers", [3])
def test_racing_processes_commit_each_lower_once(spark, warehouse, tmp_path, ledger, monkeypatch, racers, connect_url):
    # clients of one Connect server (the races are on the ledger and the Delta log)
    race_runs(spark, tmp_path, ledger, monkeypatch, racers, connect_url)


def test_racing_processes_commit_each_lower_once_on_s3(
    spark, s3_warehouse, tmp_path, sqlite_ledger, monkeypatch, s3_connect_url
):
    """The same with the warehouse on S3 (the racers' appends and the server's writes on S3)."""
    race_runs(spark, tmp_path, sqlite_ledger, monkeypatch, 3, s3_connect_url)


def race_runs(spark, tmp_path, ledger, monkeypatch, racers: int, remote: str) -> None:
    """``racers`` runs with different frontiers at once (clients of ``remote``); then each lower is committed once, ``check`` right after them is clean, and one more
    run agrees with the model."""
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    env = _env(remote)
    cfg = make_sink(tmp_path, f"race_{ledger.engine.dialect.name}")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    frontiers = [300] * (racers - 1) + [400]
    results = _racers(cfg, frontiers, env)
    for r in results:
        assert r.returncode in (0, 3), f"racer crashed: {r.returncode}\n{r.stdout[-1500:]}\n{_causes(r.stderr)}"
        if r.returncode == 3:  # a loser says who won
            assert "superseded by batch" in r.stdout or "lost the race" in r.stdout or "committed lower" in r.stdout, (
                r.stdout
            )
    commits = batch_commits(ShardTable(cfg).history_since(-1)[1])
    lowers = [c.lower for c in commits]
    assert lowers and len(lowers) == len(set(lowers)), lowers
    # `check` at once: a loser's leftovers, which the next append deletes, are pending cleanup, not a violation
    checked = subprocess.run(
        [sys.executable, "-m", "reconcile", "check", cfg.name], env=env, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr[-2000:]
    assert "0 invariant violation(s)" in checked.stdout, checked.stdout
    # One more run settles whatever the race left; then everything agrees with the model.
    run_stages(spark, ledger, cfg, "settle", 500)
    assert shard_as_of(cfg, 499) == Counter({(1, "a", None): 1, (2, "b", None): 2})
    assert check.violations(ledger, cfg, spark=spark) == []


def test_racing_processes_on_an_upsert_sink_apply_every_command_once(
    spark, warehouse, tmp_path, ledger, monkeypatch, connect_url
):
    from upsert_model import UpsertModel, feed_rows, ok_rows, upsert_sink

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, name=f"race_upsert_{ledger.engine.dialect.name}")
    feed = [
        {"k": k, "v": v, "ts": ts, "off": i}
        for i, (k, v, ts) in enumerate(
            [
                (1, "a", 150),
                (2, "b", 160),
                (1, "a2", 250),
                (2, None, 260),
                (3, "c", 350),
                (1, "a3", 360),
                (3, "c2", 450),
                (2, "b2", 460),
            ]
        )
    ]
    feed_rows(tmp_path, feed)
    env = _env(connect_url)
    for r in _racers(cfg, [300, 300, 400], env):
        assert r.returncode in (0, 3), f"racer crashed: {r.returncode}\n{r.stdout[-1500:]}\n{_causes(r.stderr)}"
    run_stages(spark, ledger, cfg, "settle", 500)
    commits = batch_commits(ShardTable(cfg).history_since(-1)[1])
    assert len({c.lower for c in commits}) == len(commits)
    # Whichever racer won each lower, every command was applied once, in time order.
    model = UpsertModel()
    model.batch(feed, cfg.as_of, 500)
    for c in commits:
        assert ok_rows(shard_as_of(cfg, c.upper - 1)) == model.as_of(c.upper - 1), c
    assert check.violations(ledger, cfg, spark=spark) == []


# -- attempts of the *same* run at once: a zombie task and its retries ----------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPEAT = int(os.environ.get("RECONCILE_RACE_REPEAT", "1"))  # rounds; 5+ to show a rare interleaving


def _changelog(n_per_batch: int, bounds: list[int], seed: int) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for lo, hi in zip(bounds, bounds[1:]):
        for _ in range(n_per_batch):
            rows.append({"k": rng.randrange(50), "v": rng.choice("abcd"), "ts": rng.randrange(lo, hi), "diff": 1})
    return rows


def _log_as_of(rows: list[dict], t: int) -> Counter:
    """Plain-Python model of a change-log sink as of ``t``."""
    out: Counter = Counter()
    for r in rows:
        if r["ts"] <= t:
            out[(r["k"], r["v"], None)] += r["diff"]
    return +out


def _attempts(cfg, runs: list[tuple[str, int]], attempts: int, env: dict) -> tuple[list[str], list[str]]:
    """``attempts`` processes, each running every run of ``runs`` in order (same run ids):
    (their RESULT lines, one line per process that crashed)."""
    script = os.path.join(ROOT, "tests", "racer.py")
    specs = [f"{r}:{f}" for r, f in runs]
    procs = [
        subprocess.Popen(
            [sys.executable, script, cfg.name, str(a + 1), *specs],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for a in range(attempts)
    ]
    lines, crashes = [], []
    for p in procs:
        out, err = p.communicate(timeout=900)
        lines += [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0:
            tail = [ln for ln in err.splitlines() if ln.strip()][-3:]
            crashes.append(f"attempt process crashed ({p.returncode}): {' | '.join(tail)[-600:]}")
    return lines, crashes


@pytest.mark.parametrize("round_", range(REPEAT))
def test_attempts_of_one_run_racing_commit_the_batch_once(
    spark, warehouse, tmp_path, ledger, monkeypatch, round_, connect_url
):
    """Three processes run the same three runs (same run ids, so the same batches): a new shard,
    then an existing one. Every committed batch holds exactly its correction: as of each
    committed ``upper - 1`` the shard equals the model, each batch matches its manifest, no
    process crashes and no loser is told to clear ``write``."""
    race_attempts(spark, tmp_path, ledger, monkeypatch, round_, connect_url)


def test_attempts_of_one_run_racing_commit_the_batch_once_on_s3(
    spark, s3_warehouse, tmp_path, sqlite_ledger, monkeypatch, s3_connect_url
):
    """The same with the warehouse on S3 (the attempts' appends and the server's writes on S3)."""
    race_attempts(spark, tmp_path, sqlite_ledger, monkeypatch, 0, s3_connect_url)


def race_attempts(spark, tmp_path, ledger, monkeypatch, round_: int, remote: str) -> None:
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    env = _env(remote)
    cfg = make_sink(tmp_path, f"zombie_{ledger.engine.dialect.name}_{round_}", "changelog")
    bounds = [100, 300, 400, 500]
    rows = _changelog(200, bounds, seed=round_)
    write_json_rows(tmp_path / "log", rows)
    lines, problems = _attempts(cfg, [(f"sched__{u}", u) for u in bounds[1:]], 3, env)
    problems += [f"a loser was told to stage anew: {ln}" for ln in lines if "stage the batch anew" in ln]
    problems += [
        f"unexpected failure: {ln}"
        for ln in lines
        if ln.split(":")[0].split()[-1]
        not in (
            *Outcome,  # every stage outcome is a true ending, said so
            "nothing",  # mint: nothing to do
            # a process behind the others mints the next run's wider batch over a lower
            # still open: runs racing each other, told so truthfully
            "DescriptionOutdated",
            "LostRace",
        )
    ]
    commits = batch_commits(ShardTable(cfg).history_since(-1)[1])
    lowers = [c.lower for c in commits]
    if len(set(lowers)) != len(lowers) or not set(lowers) <= set(bounds[:-1]):
        problems.append(f"committed lowers {lowers}, want each of {bounds[:-1]} at most once")
    for c in commits:
        got, want = shard_as_of(cfg, c.upper - 1), _log_as_of(rows, c.upper - 1)
        if got != want:
            problems.append(
                f"as of {c.upper - 1} (batch {c.batch_id}): the shard holds {sum(got.values())} "
                f"rows, the model {sum(want.values())}"
            )
    problems += [f"check: {v}" for v in check.violations(ledger, cfg, spark=spark)]
    assert problems == [], "\n".join(problems)


# -- the same interleavings, made deterministic in one process --------------------------------------


def _paused_write(spark, ledger, cfg, batch_id: str, monkeypatch):
    """Start a write of ``batch_id`` in a thread that stops right after staging its files (the
    fail point ``write.after_partition_staged``); returns (release, join -> WriteResult)."""
    import threading

    from reconcile.sink import write

    staged, release, result = threading.Event(), threading.Event(), {}
    me = threading.current_thread

    real = write.failpoint

    def hook(name):
        if name == "write.after_partition_staged" and me().name == "zombie":
            staged.set()
            assert release.wait(300)
        return real(name)

    monkeypatch.setattr(write, "failpoint", hook)
    t = threading.Thread(target=lambda: result.update(w=write.run_write(spark, ledger, cfg, batch_id)), name="zombie")
    t.start()
    assert staged.wait(300), "the paused write never staged"

    def join():
        release.set()
        t.join(300)
        return result["w"]

    return join


def _query_sink(tmp_path, name, rows):
    cfg = make_sink(tmp_path, name)
    write_json_rows(tmp_path / "src", rows)
    return cfg


ROWS = [{"k": k, "v": v} for k, v in [(1, "a"), (2, "b"), (3, "c"), (3, "c"), (4, "d")]]
MODEL = Counter({(1, "a", None): 1, (2, "b", None): 1, (3, "c", None): 2, (4, "d", None): 1})


def test_a_zombie_write_that_loses_the_manifest_deletes_its_own_files(spark, warehouse, tmp_path, ledger, monkeypatch):
    """The zombie stages first but records last: the retry's files are the batch, the zombie
    deletes its own and says so; the append commits exactly one copy."""
    from reconcile.sink import append, mint, write

    cfg = _query_sink(tmp_path, "zombie_loses", ROWS)
    desc = mint.run_mint(ledger, cfg, "sched__1", 1, 300).description
    join = _paused_write(spark, ledger, cfg, desc.batch_id, monkeypatch)
    retry = write.run_write(spark, ledger, cfg, desc.batch_id)  # the retry (a second attempt)
    assert retry.outcome == "staged", retry.message
    zombie = join()
    assert zombie.outcome == "already_staged", zombie.message
    assert "another attempt" in zombie.message and "recorded its staged files first" in zombie.message
    assert "clear" not in zombie.message
    b = ledger.get_batch(desc.batch_id)
    assert files.list_dirs(ShardTable(cfg).staging_path(desc.batch_id)) == [b.stage_id]
    a = append.run_append(ledger, cfg, desc.batch_id)
    assert a.outcome == "committed", a.message
    assert shard_as_of(cfg, 299) == MODEL
    assert check.violations(ledger, cfg, spark=spark) == []


def test_a_zombie_write_finishing_after_the_commit_says_so(spark, warehouse, tmp_path, sqlite_ledger, monkeypatch):
    """The retry writes and appends while the zombie is still writing: the zombie finds the
    batch committed, deletes its files and says so, and nothing is left staged."""
    from reconcile.sink import append, mint, write

    ledger = sqlite_ledger
    cfg = _query_sink(tmp_path, "zombie_late", ROWS)
    desc = mint.run_mint(ledger, cfg, "sched__1", 1, 300).description
    join = _paused_write(spark, ledger, cfg, desc.batch_id, monkeypatch)
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    assert append.run_append(ledger, cfg, desc.batch_id).outcome == "committed"
    zombie = join()
    assert zombie.outcome == "skipped", zombie.message
    assert "another attempt of this batch committed it" in zombie.message
    again = append.run_append(ledger, cfg, desc.batch_id)  # the zombie's own append
    assert again.outcome == "already_committed", again.message
    assert shard_as_of(cfg, 299) == MODEL
    assert check.violations(ledger, cfg, spark=spark) == []  # includes: no staged files left


def test_a_committed_batch_that_differs_from_its_manifest_is_reported(
    spark, warehouse, tmp_path, sqlite_ledger, monkeypatch
):
    """What the old race committed (the union of two attempts' files) is caught twice: by the
    append's post-commit check and by ``check``, each naming the batch."""
    from reconcile.errors import InconsistentState
    from reconcile.sink import append, mint, write

    ledger = sqlite_ledger
    cfg = _query_sink(tmp_path, "union", ROWS)
    desc = mint.run_mint(ledger, cfg, "sched__1", 1, 300).description
    assert write.run_write(spark, ledger, cfg, desc.batch_id).outcome == "staged"
    real = append.inspect_staged

    def union(*args):  # every staged file twice: a second attempt's copy beside the first's
        files = real(*args)
        root = Path(ShardTable(cfg).path)
        copies = []
        for path, size, stats in files:
            copy = path.rsplit("/", 1)[0] + "/other-attempt-" + path.rsplit("/", 1)[1]
            shutil.copyfile(root / path, root / copy)
            copies.append((copy, size, stats))
        return files + copies

    monkeypatch.setattr(append, "inspect_staged", union)
    with pytest.raises(InconsistentState) as info:
        append.run_append(ledger, cfg, desc.batch_id)
    text = str(info.value)
    assert "\n" not in text and desc.batch_id in text and "does not match the batch's manifest" in text
    assert shard_as_of(cfg, 299) == MODEL + MODEL  # committed twice over: the broken promise
    problems = check.violations(ledger, cfg, spark=spark)
    assert len(problems) >= 1 and all(desc.batch_id in p and "the manifest says" in p for p in problems), problems
    monkeypatch.setattr(append, "inspect_staged", real)
    # the next batch repairs the contents; the broken batch stays reported (the log keeps it)
    from helpers import run_stages

    run_stages(spark, ledger, cfg, "sched__2", 400)
    assert shard_as_of(cfg, 399) == MODEL
    assert [p for p in check.violations(ledger, cfg, spark=spark) if desc.batch_id not in p] == []

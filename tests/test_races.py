"""Racing writers: several processes run batches of one sink at once, on SQLite and PostgreSQL.

Each process is a real ``python -m reconcile run`` (its own Spark, its own metadata
connections). Whatever the interleaving: at most one commit per lower, the losers clean up and
say which batch superseded them, and after one more run the shard equals the model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from helpers import make_sink, run_batch, shard_as_of, write_json_rows
from reconcile import check
from reconcile import shard as storage


def _racers(cfg, frontiers: list[int], env: dict) -> list[subprocess.CompletedProcess]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "reconcile", "run", cfg.name, "--frontier", str(f), "--run-id", f"racer-{i}"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i, f in enumerate(frontiers)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=900)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("racers", [3])
def test_racing_processes_commit_each_lower_once(spark, warehouse, tmp_path, store, monkeypatch, racers):
    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = make_sink(tmp_path, f"race_{store.engine.dialect.name}")
    rows = [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}, {"k": 2, "v": "b"}]
    write_json_rows(tmp_path / "src", rows)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    frontiers = [300] * (racers - 1) + [400]
    results = _racers(cfg, frontiers, env)
    for r in results:
        assert r.returncode in (0, 3), f"racer crashed: {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        if r.returncode == 3:  # a loser says who won
            assert "superseded by batch" in r.stdout or "lost the race" in r.stdout or "committed lower" in r.stdout, r.stdout
    commits = storage.batch_commits(storage.history_since(spark, cfg, -1)[1])
    lowers = [c.lower for c in commits]
    assert lowers and len(lowers) == len(set(lowers)), lowers
    # One more run settles whatever the race left; then everything agrees with the model.
    run_batch(spark, store, cfg, "settle", 500)
    assert shard_as_of(spark, cfg, 499) == Counter({(1, "a", None): 1, (2, "b", None): 2})
    assert check.violations(spark, store, cfg) == []


def test_racing_processes_on_an_upsert_sink(spark, warehouse, tmp_path, store, monkeypatch):
    from test_upsert import feed_rows, ok_rows, upsert_sink
    from upsert_model import UpsertModel

    monkeypatch.setenv("RECONCILE_SINKS_DIR", str(tmp_path))
    cfg = upsert_sink(tmp_path, name=f"race_upsert_{store.engine.dialect.name}")
    feed = [
        {"k": k, "v": v, "ts": ts, "off": i}
        for i, (k, v, ts) in enumerate([(1, "a", 150), (2, "b", 160), (1, "a2", 250), (2, None, 260),
                                        (3, "c", 350), (1, "a3", 360), (3, "c2", 450), (2, "b2", 460)])
    ]
    feed_rows(tmp_path, feed)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_GATEWAY_PORT"}
    for r in _racers(cfg, [300, 300, 400], env):
        assert r.returncode in (0, 3), f"racer crashed: {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    run_batch(spark, store, cfg, "settle", 500)
    commits = storage.batch_commits(storage.history_since(spark, cfg, -1)[1])
    assert len({c.lower for c in commits}) == len(commits)
    # Whichever racer won each lower, every command was applied once, in time order.
    model = UpsertModel()
    model.batch(feed, cfg.as_of, 500)
    for c in commits:
        assert ok_rows(shard_as_of(spark, cfg, c.upper - 1)) == model.as_of(c.upper - 1), c
    assert check.violations(spark, store, cfg) == []

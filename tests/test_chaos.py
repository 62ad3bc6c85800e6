"""Randomized schedules (a small count in CI; `python tests/chaos.py --schedules 1000` for more)."""

from __future__ import annotations

import os

from chaos import run_schedules

SEED = int(os.environ.get("RECONCILE_CHAOS_SEED", "20261121"))


def test_random_schedules_never_diverge_sqlite(spark):
    """The sinks keep a current-state table: it holds the shard's collection whenever it reflects
    the shard's latest version, and after the settling run (crashes at its fail points too)."""
    count = int(os.environ.get("RECONCILE_CHAOS_SCHEDULES", "2"))
    stats = run_schedules(spark, None, count=count, seed=SEED, steps=6, current=True)
    assert stats.steps >= 12 and stats.runs > 0
    assert stats.divergences == [], "\n".join(stats.divergences)


def test_random_schedule_never_diverges_postgres(spark, pg_url):
    stats = run_schedules(spark, pg_url, count=1, seed=SEED + 1, steps=6)
    assert stats.runs > 0
    assert stats.divergences == [], "\n".join(stats.divergences)


# This seed's schedule on S3: a zombie (two attempts of one run), a crash before the append's
# Delta commit recovered by the next run, a foreign duplicate (tampering), a compaction crashed
# after its commit, then the settling run.
S3_SEED = 20264042


def test_random_schedule_never_diverges_on_s3(spark, s3_warehouse):
    """The warehouse on the test S3 server (versitygw on 127.0.0.1): every step's commits go
    through put-if-absent on S3, Spark writes through S3A; the model agrees after every step."""
    stats = run_schedules(spark, None, count=1, seed=S3_SEED, steps=5, warehouse=s3_warehouse, current=True)
    assert stats.zombies and stats.crashes and stats.tampers and stats.compactions
    assert stats.divergences == [], "\n".join(stats.divergences)


# Upsert schedules: a command feed (new, late, replayed and conflicting commands, deletes), the
# shard checked against tests/upsert_model.py; foreign writes are repaired by key. A tamper is one
# step in 16 and does nothing before the first commit, so seeds were tried from SEED up:
# 20261124, -25, -29, -32, -34 to -37 and -39 to -41 tamper; this one tampers in both schedules
# and is quick. Schedule 0 compacts, changes the feed, runs, races, runs, then a key is deleted
# (delta-spark); schedule 1 compacts, runs, compacts, crashes, then delta-rs appends a key the
# feed never had, and a run repairs it.
UPSERT_SEED = 20261141


def test_random_upsert_schedules_with_foreign_writes_never_diverge_sqlite(spark):
    stats = run_schedules(spark, None, count=2, seed=UPSERT_SEED, steps=6, kind="upsert", current=True)
    assert stats.tampers >= 2 and stats.runs > 0
    assert stats.divergences == [], "\n".join(stats.divergences)


# On S3 (a seed whose schedule has a tamper): two crashes, a run, a key deleted by delta-rs
# behind the sink's back, a crash and its recovery, the settling run.
UPSERT_S3_SEED = 20261125


def test_random_upsert_schedule_never_diverges_on_s3(spark, s3_warehouse):
    stats = run_schedules(
        spark, None, count=1, seed=UPSERT_S3_SEED, steps=5, warehouse=s3_warehouse, kind="upsert", current=True
    )
    assert stats.tampers and stats.crashes
    assert stats.divergences == [], "\n".join(stats.divergences)

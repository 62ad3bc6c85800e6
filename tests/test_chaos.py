"""Randomized schedules (a small count in CI; `python tests/chaos.py --schedules 1000` for more)."""

from __future__ import annotations

import os

from chaos import run_schedules

SEED = int(os.environ.get("RECONCILE_CHAOS_SEED", "20261121"))


def test_random_schedules_never_diverge_sqlite(spark):
    stats = run_schedules(spark, None, count=int(os.environ.get("RECONCILE_CHAOS_SCHEDULES", "2")), seed=SEED, steps=6)
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
    stats = run_schedules(spark, None, count=1, seed=S3_SEED, steps=5, warehouse=s3_warehouse)
    assert stats.zombies and stats.crashes and stats.tampers and stats.compactions
    assert stats.divergences == [], "\n".join(stats.divergences)


# Upsert schedules (a command feed; foreign writes repaired by key). This seed's two schedules
# (the first seed from SEED on whose schedules a tamper happens): a race, a foreign key appended
# with delta-rs, a zombie, feed changes; then a crash, a rerun, a zombie, a duplicated row.
UPSERT_SEED = 20261124


def test_random_upsert_schedules_with_foreign_writes_never_diverge_sqlite(spark):
    stats = run_schedules(spark, None, count=2, seed=UPSERT_SEED, steps=6, kind="upsert")
    assert stats.tampers and stats.runs > 0
    assert stats.divergences == [], "\n".join(stats.divergences)


# On S3: crashes, then a key deleted by delta-rs behind the sink's back, repaired by the next
# (recovering) run, then a crash, the settling run.
UPSERT_S3_SEED = 20261125


def test_random_upsert_schedule_never_diverges_on_s3(spark, s3_warehouse):
    stats = run_schedules(spark, None, count=1, seed=UPSERT_S3_SEED, steps=5, warehouse=s3_warehouse, kind="upsert")
    assert stats.tampers and stats.crashes
    assert stats.divergences == [], "\n".join(stats.divergences)

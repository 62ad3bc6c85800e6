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

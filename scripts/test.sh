#!/usr/bin/env bash
# README's second command: run the whole test suite (real Spark, Delta, SQLite, PostgreSQL, Airflow).
# PostgreSQL: RECONCILE_TEST_POSTGRES_URL, default the local server set up by .ci/run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
[ -x .venv/bin/python ] && [ -d .jars ] || bash scripts/setup.sh
export RECONCILE_TEST_POSTGRES_URL="${RECONCILE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/reconcile_test}"
exec .venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# README's second command: run the whole test suite (real Spark, Delta, SQLite, PostgreSQL, Airflow).
# PostgreSQL: RECONCILE_TEST_POSTGRES_URL, default the local server set up by .ci/run.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh --test   # the test tools and servers too (idempotent: quick once installed)
export RECONCILE_TEST_POSTGRES_URL="${RECONCILE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/reconcile_test}"
# The short-lived Spark JVMs of the tests start from a class-data-sharing archive (built once per
# JDK and jars, ~25 s): tests/jvm_archive.py.
if [ -z "${RECONCILE_TEST_JVM_ARCHIVE+x}" ]; then
  export RECONCILE_TEST_JVM_ARCHIVE="$(.venv/bin/python tests/jvm_archive.py)"
fi
# Test files run on two workers (pytest-xdist; a file stays on one worker: its fixtures, servers
# and ports are its own). Most of the suite's time is spent waiting on JVMs and servers, so two
# workers help even on 2 cores. RECONCILE_TEST_WORKERS=0 runs everything in this process.
workers="${RECONCILE_TEST_WORKERS:-2}"
case " $* " in *" -n "*|*" --numprocesses"*|*" -p no:xdist "*) workers=0 ;; esac
if [ "$workers" != "0" ]; then
  set -- -n "$workers" --dist loadfile --no-loadscope-reorder "$@"   # tests/conftest.py orders the files
fi
# --quick: the quick tier (tests/conftest.py: no server, Airflow-stack or slow suite), for iteration.
exec .venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Install what the project needs into .venv (Python packages) and .jars (Delta's and S3A's JVM
# jars): the runtime set (requirements.txt), all the demo needs.
#   bash scripts/setup.sh          # the demo: needs python3.11, Java 17, Maven
#   bash scripts/setup.sh --test   # also the test tools (requirements-dev.txt), the tests' servers
#                                  # in .tools: an S3 server (Go >= 1.25) and an Azure Blob emulator
#                                  # (Node.js and npm), and the tests' JVM archive
# Versions are those of requirements-lock.txt either way. Idempotent: a second run is quick.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if [ ! -x .venv/bin/uv ]; then
  .venv/bin/python -m pip --version >/dev/null 2>&1 || .venv/bin/python -m ensurepip >/dev/null
  .venv/bin/python -m pip install -q --disable-pip-version-check uv
fi
wanted=requirements.txt
[ "${1:-}" = "--test" ] && wanted=requirements-dev.txt
.venv/bin/uv pip install -q -p .venv/bin/python -r "$wanted" -c requirements-lock.txt
.venv/bin/uv pip install -q -p .venv/bin/python --no-deps -e .
# The steps below are independent of each other: they run side by side (a fresh clone's setup
# --test: 91 s one after the other).
pids=()
# Bytecode once, here: with PYTHONDONTWRITEBYTECODE set (as on our CI machine) every process
# would otherwise compile Airflow from source at each start (`airflow version` 4.8 s -> 2.7 s).
# Only what changed since the last run is compiled.
(.venv/bin/python -m compileall -q -j 0 .venv/lib/python3.11/site-packages include >/dev/null 2>&1 || true) &
pids+=($!)
if [ "${1:-}" = "--test" ]; then
  bash scripts/fetch_s3_server.sh >/dev/null & pids+=($!)   # the tests' S3 server (.tools/)
  bash scripts/fetch_azurite.sh >/dev/null & pids+=($!)     # the tests' Azure Blob emulator (.tools/azurite)
fi
bash scripts/fetch_jars.sh >/dev/null
if [ "${1:-}" = "--test" ]; then
  # the tests' class-data-sharing archive for Spark's JVMs (tests/jvm_archive.py: ~25 s once per
  # JDK and jars), recorded while the servers install
  .venv/bin/python tests/jvm_archive.py >/dev/null & pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid"; done   # set -e: the first failed step stops setup
echo "setup${1:+ $1} done: $(.venv/bin/python --version), $(ls .jars | wc -l) jars in .jars"

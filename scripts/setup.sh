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
# pyspark and pyspark-client are published as source only, and a package mirror that answers each
# revalidation as modified (this machine's) makes uv download and build them again at every setup
# (15 s): their wheels are built once per version into the user's cache and offered from there.
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/reconcile-sink/wheels"
mkdir -p "$wheels"
for pin in $(grep -E '^pyspark(-client)?==' requirements-lock.txt); do
  if ! ls "$wheels/$(echo "${pin%%==*}" | tr - _)-${pin#*==}-"*.whl >/dev/null 2>&1; then
    tmp="$(mktemp -d)"
    .venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps -w "$tmp" "$pin"
    mv "$tmp"/*.whl "$wheels/" && rm -rf "$tmp"
  fi
done
.venv/bin/uv pip install -q -p .venv/bin/python --find-links "$wheels" -r "$wanted" -c requirements-lock.txt
.venv/bin/uv pip install -q -p .venv/bin/python --no-deps -e .
# The test servers' installs run beside the rest; compiling and recording the JVM archive use
# both cores, one after the other (side by side they took as long).
pids=()
if [ "${1:-}" = "--test" ]; then
  bash scripts/fetch_s3_server.sh >/dev/null & pids+=($!)   # the tests' S3 server (.tools/)
  bash scripts/fetch_azurite.sh >/dev/null & pids+=($!)     # the tests' Azure Blob emulator (.tools/azurite)
fi
bash scripts/fetch_jars.sh >/dev/null
# Bytecode once, here: with PYTHONDONTWRITEBYTECODE set (as on our CI machine) every process
# would otherwise compile Airflow from source at each start (`airflow version` 4.8 s -> 2.7 s).
# Only what changed since the last run is compiled; packages' own test suites are never imported.
.venv/bin/python -m compileall -q -j 0 -x '/tests?/' .venv/lib/python3.11/site-packages include >/dev/null 2>&1 || true
if [ "${1:-}" = "--test" ]; then
  # the tests' class-data-sharing archive for Spark's JVMs (tests/jvm_archive.py: ~25 s once per
  # JDK and jars)
  .venv/bin/python tests/jvm_archive.py >/dev/null
fi
for pid in "${pids[@]}"; do wait "$pid"; done   # set -e: a failed install stops setup
echo "setup${1:+ $1} done: $(.venv/bin/python --version), $(ls .jars | wc -l) jars in .jars"

#!/usr/bin/env bash
# Install everything the project needs into .venv (Python packages), .jars (Delta's and S3A's JVM
# jars) and .tools (the tests' S3 server and Azure Blob emulator).
# Needs: python3.11, Java 17, Maven (for the jars), Go >= 1.25 (for the S3 server), Node.js and npm
# (for Azurite). Idempotent: a second run is quick.
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
.venv/bin/uv pip install -q -p .venv/bin/python -r requirements-lock.txt
.venv/bin/uv pip install -q -p .venv/bin/python --no-deps -e .
# Bytecode once, here: with PYTHONDONTWRITEBYTECODE set (as on our CI machine) every process
# would otherwise compile Airflow from source at each start (`airflow version` 4.8 s -> 2.7 s).
.venv/bin/python -m compileall -q -j 0 .venv/lib/python3.11/site-packages include >/dev/null 2>&1 || true
bash scripts/fetch_jars.sh >/dev/null
bash scripts/fetch_s3_server.sh >/dev/null   # the tests' S3 server (.tools/)
bash scripts/fetch_azurite.sh >/dev/null     # the tests' Azure Blob emulator (.tools/azurite)
echo "setup done: $(.venv/bin/python --version), $(ls .jars | tr '\n' ' ')"

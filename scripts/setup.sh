#!/usr/bin/env bash
# Install everything the project needs into .venv (Python packages) and .jars (Delta's JVM jars).
# Needs: python3.11, Java 17, Maven (for the jars). Idempotent: a second run is quick.
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
bash scripts/fetch_jars.sh >/dev/null
echo "setup done: $(.venv/bin/python --version), $(ls .jars | tr '\n' ' ')"

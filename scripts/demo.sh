#!/usr/bin/env bash
# README's first command: install, then run the demo sink for three daily intervals through
# Airflow on the embedded default (local Spark, local Delta folder, SQLite) and print the shard.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
. "$root/scripts/env.sh"
exec python -m reconcile demo "$@"

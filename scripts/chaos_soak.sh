#!/usr/bin/env bash
# The long randomized-schedule run (issue 3), resumable and split across worker processes.
#   bash scripts/chaos_soak.sh [SCHEDULES=1000] [SEED=1] [WORKERS=2] [CHUNK=25]
#   bash scripts/chaos_soak.sh --summary [SEED=1]
#   RECONCILE_CHAOS_S3=1 bash scripts/chaos_soak.sh ...   # the warehouse on S3: each chunk starts
#     its own S3 server (versitygw on 127.0.0.1, harness/s3_server.py); results in chaos-results/s3-seed<S>
#   RECONCILE_CHAOS_KIND=upsert bash scripts/chaos_soak.sh ...   # upsert sinks (`--kind upsert`):
#     results in chaos-results/upsert-seed<S> (with RECONCILE_CHAOS_S3=1: upsert-s3-seed<S>)
#   RECONCILE_CHAOS_CURRENT=1 bash scripts/chaos_soak.sh ...   # the sinks keep a current-state
#     table (`--current`), checked too: the results' directory name gains a current- prefix
# Each chunk of schedules runs as `python tests/chaos.py --first I --schedules CHUNK` and
# keeps its output in chaos-results/seed<S>/first-<I>.txt; finished chunks are skipped, so a
# stopped soak continues where it was. The summary adds up every finished chunk and lists
# each divergence with the command that reproduces it. Each chunk's file starts with the commit
# it ran (a soak may span sessions); the summary counts chunks per commit.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
summary() {
  # A chunk counts (and its commit with it) only once its `chaos:` line is there.
  local files=("$1"/first-*.txt)
  [ -e "${files[0]}" ] || { echo "chunks=0"; return; }
  awk '
    FNR == 1 { commit = "unrecorded" }
    /^commit:/ { commit = $2 }
    /^chaos:/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[2] ~ /^[0-9]+$/) s[kv[1]] += kv[2] } n++; c[commit]++ }
    /^DIVERGENCE/ { print }
    END {
      printf "chunks=%d", n; for (k in s) printf " %s=%d", k, s[k]; print ""
      for (k in c) printf "commit %s: %d chunks\n", k, c[k]
    }' "${files[@]}"
}
chaos_args=() prefix=""
case "${RECONCILE_CHAOS_KIND:-query}" in
  query) ;;
  upsert) chaos_args=(--kind upsert) prefix="upsert-" ;;
  *) echo "RECONCILE_CHAOS_KIND must be query or upsert, not ${RECONCILE_CHAOS_KIND}" >&2; exit 2 ;;
esac
if [ -n "${RECONCILE_CHAOS_S3:-}" ]; then chaos_args+=(--s3) prefix="${prefix}s3-"; fi
if [ -n "${RECONCILE_CHAOS_CURRENT:-}" ]; then chaos_args+=(--current) prefix="current-${prefix}"; fi
if [ "${1:-}" = "--summary" ]; then summary "chaos-results/${prefix}seed${2:-1}"; exit 0; fi
. scripts/env.sh
total="${1:-1000}" seed="${2:-1}" workers="${3:-2}" chunk="${4:-25}"
dir="chaos-results/${prefix}seed${seed}"
mkdir -p "$dir"
worker() {
  local w="$1" first
  for ((first = w * chunk; first < total; first += workers * chunk)); do
    f="$dir/first-$first.txt"
    grep -q '^chaos:' "$f" 2>/dev/null && continue
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$f.tmp"
    python tests/chaos.py --seed "$seed" --first "$first" --schedules "$chunk" "${chaos_args[@]}" 2>"$dir/first-$first.log" \
      | grep -E '^(chaos:|DIVERGENCE)' >>"$f.tmp"
    mv "$f.tmp" "$f"
  done
}
for ((w = 0; w < workers; w++)); do worker "$w" & done
wait
summary "$dir"

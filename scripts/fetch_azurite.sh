#!/usr/bin/env bash
# Install the tests' Azure Blob Storage emulator, Azurite (Microsoft, MIT), from npm into
# .tools/azurite. Needs Node.js and npm. 3.37.0 is the first release whose List Blobs honours
# `startFrom` (earlier ones ignore it and list from the start, which breaks delta-rs's incremental
# log reads: "Invalid table version"). It declares Node >= 22 and runs on this machine's Node 20
# (the tests pass). Idempotent: quick when that version is there.
# What it serves and what not (no ADLS Gen2 dfs API, so no Spark ABFS): docs/object-stores.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
AZURITE_VERSION="${AZURITE_VERSION:-3.37.0}"
dir="$root/.tools/azurite"
installed="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$dir/node_modules/azurite/package.json" 2>/dev/null || true)"
if [ "$installed" != "$AZURITE_VERSION" ] || [ ! -x "$dir/node_modules/.bin/azurite-blob" ]; then
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --omit=dev --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
fi
echo "$dir/node_modules/.bin/azurite-blob $AZURITE_VERSION"

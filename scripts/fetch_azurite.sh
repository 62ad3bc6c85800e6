#!/usr/bin/env bash
# Install the tests' Azure Blob Storage emulator, Azurite (Microsoft, MIT), from npm, linked as
# .tools/azurite. Needs Node.js and npm. 3.37.0 is the first release whose List Blobs honours
# `startFrom` (earlier ones ignore it and list from the start, which breaks delta-rs's incremental
# log reads: "Invalid table version"). It declares Node >= 22 and runs on this machine's Node 20
# (the tests pass). Idempotent: quick when that version is there.
# What it serves and what not (no ADLS Gen2 dfs API, so no Spark ABFS): docs/object-stores.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
AZURITE_VERSION="${AZURITE_VERSION:-3.37.0}"
# npm's install of Azurite writes ~10k files (33 s on a fresh clone, most of it in the kernel):
# it is installed once per machine and version, under the user's cache like npm's own cache, and
# linked into this checkout.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/reconcile-sink/azurite-$AZURITE_VERSION"
dir="$root/.tools/azurite"
installed="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$cache/node_modules/azurite/package.json" 2>/dev/null || true)"
if [ "$installed" != "$AZURITE_VERSION" ] || [ ! -x "$cache/node_modules/.bin/azurite-blob" ]; then
  rm -rf "$cache.part" && mkdir -p "$cache.part"
  npm install --prefix "$cache.part" --no-audit --no-fund --omit=dev --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
  rm -rf "$cache" && mv "$cache.part" "$cache"
fi
if [ "$(readlink "$dir" 2>/dev/null)" != "$cache" ]; then
  mkdir -p "$root/.tools" && rm -rf "$dir" && ln -s "$cache" "$dir"
fi
echo "$dir/node_modules/.bin/azurite-blob $AZURITE_VERSION"

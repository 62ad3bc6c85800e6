#!/usr/bin/env bash
# Build the tests' S3 API server, Versity S3 Gateway (versitygw, Apache-2.0), from the Go module
# proxy into .tools/versitygw. Needs Go >= 1.25. Idempotent: quick when that version is there.
# Why versitygw: docs/object-stores.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
VERSITYGW_VERSION="${VERSITYGW_VERSION:-v1.8.0}"
GO="$(command -v go || echo /usr/local/go/bin/go)"
bin="$root/.tools/versitygw"
mkdir -p "$root/.tools"
if [ ! -x "$bin" ] || ! "$GO" version -m "$bin" 2>/dev/null | grep -q "mod	github.com/versity/versitygw	$VERSITYGW_VERSION	"; then
  GOBIN="$root/.tools" GOFLAGS=-mod=mod "$GO" install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
fi
echo "$bin $VERSITYGW_VERSION"

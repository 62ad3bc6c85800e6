#!/usr/bin/env bash
# Fetch the tests' S3 API server, S3Proxy (Apache-2.0, one self-contained jar from Maven Central),
# into .tools/ (not .jars: Spark loads every jar there). Needs Java 17 and Maven. Idempotent.
# Why S3Proxy: docs/object-stores.md.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
S3PROXY_VERSION="${S3PROXY_VERSION:-4.0.0}"
name="s3proxy-$S3PROXY_VERSION-jar-with-dependencies.jar"
mkdir -p "$root/.tools"
if [ ! -s "$root/.tools/$name" ]; then
  find "$root/.tools" -maxdepth 1 -name 's3proxy-*.jar' -delete
  mvn -q -B dependency:copy -Dartifact="org.gaul:s3proxy:$S3PROXY_VERSION:jar:jar-with-dependencies" \
    -DoutputDirectory="$root/.tools"
fi
ls "$root/.tools/$name"

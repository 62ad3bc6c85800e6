#!/usr/bin/env bash
# Fetch Spark's extra JVM artifacts from Maven Central into .jars/: Delta Lake's (delta-spark,
# delta-storage; the pip package delta-spark holds no jars), PostgreSQL's JDBC driver (for
# docker-compose.yaml's Hive metastore service) and S3A's for s3a:// (hadoop-aws and
# the AWS SDK v2 modules it uses, listed in scripts/s3a-jars.pom.xml). Spark gets them through
# spark.jars. Idempotent: a second run starts no Maven.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
DELTA_VERSION="${DELTA_VERSION:-4.4.0}"
mkdir -p "$root/.jars"
# Spark loads every jar in .jars: drop Delta jars of any other version (left by an older setup).
find "$root/.jars" -maxdepth 1 -name 'delta-*.jar' ! -name "*-$DELTA_VERSION.jar" -delete
PGJDBC_VERSION="${PGJDBC_VERSION:-42.7.14}"  # docker-compose.yaml's Hive metastore service, over PostgreSQL
find "$root/.jars" -maxdepth 1 -name 'postgresql-*.jar' ! -name "postgresql-$PGJDBC_VERSION.jar" -delete
for artifact in "io.delta:delta-spark_2.13:$DELTA_VERSION" "io.delta:delta-storage:$DELTA_VERSION" \
  "org.postgresql:postgresql:$PGJDBC_VERSION"; do
  name="$(echo "$artifact" | cut -d: -f2)-$(echo "$artifact" | cut -d: -f3).jar"
  if [ ! -s "$root/.jars/$name" ]; then
    mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$root/.jars"
  fi
done

# S3A: hadoop-aws and the AWS SDK v2 modules with their dependencies, less the groups Spark ships.
# .jars/s3a-jars.txt lists what was copied, keyed by the pom's hash: when the pom changes, the
# jars of the old list go first (two SDK versions on one class path do not mix).
pom="$root/scripts/s3a-jars.pom.xml"
list="$root/.jars/s3a-jars.txt"
key="$(sha256sum "$pom" | cut -c1-16)"
complete=1
if [ -f "$list" ] && [ "$(head -1 "$list")" = "$key" ]; then
  while read -r jar; do [ -s "$root/.jars/$jar" ] || complete=0; done < <(tail -n +2 "$list")
else
  complete=0
fi
if [ "$complete" = 0 ]; then
  if [ -f "$list" ]; then
    tail -n +2 "$list" | while read -r jar; do rm -f "$root/.jars/$jar"; done
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  mvn -q -B -f "$pom" dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
    -DexcludeGroupIds=io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j
  { echo "$key"; (cd "$tmp" && ls -1 -- *.jar); } > "$tmp/s3a-jars.txt"
  mv "$tmp"/*.jar "$root/.jars/"
  mv "$tmp/s3a-jars.txt" "$list"
fi
ls "$root/.jars"

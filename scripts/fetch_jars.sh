#!/usr/bin/env bash
# Fetch Delta Lake's JVM artifacts (delta-spark, delta-storage) from Maven Central into .jars/.
# The pip package delta-spark holds no jars; Spark gets these through spark.jars.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
DELTA_VERSION="${DELTA_VERSION:-4.4.0}"
mkdir -p "$root/.jars"
# Spark loads every jar in .jars: drop Delta jars of any other version (left by an older setup).
find "$root/.jars" -maxdepth 1 -name 'delta-*.jar' ! -name "*-$DELTA_VERSION.jar" -delete
for artifact in "io.delta:delta-spark_2.13:$DELTA_VERSION" "io.delta:delta-storage:$DELTA_VERSION"; do
  name="$(echo "$artifact" | cut -d: -f2)-$DELTA_VERSION.jar"
  if [ ! -s "$root/.jars/$name" ]; then
    mvn -q -B dependency:copy -Dartifact="$artifact" -DoutputDirectory="$root/.jars"
  fi
done
ls "$root/.jars"

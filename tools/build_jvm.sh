#!/usr/bin/env bash
# Build lockgate's JVM classes (jvm/src: the exactly-once Kafka sink's transactional writer)
# into build/jvm/lockgate-kafka.jar, against pyspark's bundled jars and the kafka-clients jar
# that tools/fetch_kafka.sh resolved (build/kafka/*.classpath). Without javac or
# kafka-clients it says so and exits 0: the sink then writes with librdkafka (Python).
# Does nothing when the jar is newer than every source.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
out="build/jvm"
jar_path="$out/lockgate-kafka.jar"
kafka_dir="${LOCKGATE_KAFKA_DIR:-build/kafka}"

sources=$(find jvm/src -name '*.java' | sort)
if [ -f "$jar_path" ]; then
  stale=0
  for src in $sources; do
    [ "$src" -nt "$jar_path" ] && stale=1
  done
  [ "$stale" = 0 ] && exit 0
fi
if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then
  echo "tools/build_jvm.sh: javac not found (a JDK, e.g. openjdk-17-jdk-headless); the" \
    "exactly-once Kafka sink writes with librdkafka instead of its JVM writer." >&2
  exit 0
fi
clients=""
for file in "$kafka_dir/spark-connector.classpath" "$kafka_dir/broker.classpath"; do
  [ -s "$file" ] || continue
  clients=$(tr ':' '\n' < "$file" | grep -m1 '/kafka-clients-[^/]*\.jar$' || true)
  [ -n "$clients" ] && [ -f "$clients" ] && break
  clients=""
done
if [ -z "$clients" ]; then
  echo "tools/build_jvm.sh: no kafka-clients jar in $kafka_dir/*.classpath (run" \
    "tools/fetch_kafka.sh); the exactly-once Kafka sink writes with librdkafka." >&2
  exit 0
fi
spark_jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')
classes=$(mktemp -d)
trap 'rm -rf "$classes"' EXIT
# shellcheck disable=SC2086
javac -nowarn --release 17 -d "$classes" -cp "$spark_jars/*:$clients" $sources
mkdir -p "$out"
jar cf "$jar_path.tmp" -C "$classes" .
mv "$jar_path.tmp" "$jar_path"
echo "tools/build_jvm.sh: wrote $jar_path" >&2

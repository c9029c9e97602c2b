#!/usr/bin/env bash
# Fetch what the Kafka tests (tests/kafka) need into the local Maven repository and
# write their classpaths:
#   build/kafka/broker.classpath           Apache Kafka's broker (kafka_2.13, KRaft mode)
#   build/kafka/spark-connector.classpath  Spark's Kafka connector for the native oracle
#                                          session (jars pyspark already bundles left out)
# Uses the poms in tools/kafka/ with `mvn dependency:build-classpath`; Maven resolves from
# the repositories configured on the machine (~/.m2/settings.xml), nothing else is named
# here. Does nothing when both files exist and every jar they list is present.
# Without mvn (Debian: apt-get install maven) it says so and exits 0: the Kafka tests then
# skip (and fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${LOCKGATE_KAFKA_DIR:-build/kafka}"
python="${PYTHON:-python3}"
mkdir -p "$out"

complete() {
  local file="$1"
  [ -s "$file" ] || return 1
  local jar
  while IFS= read -r jar; do
    [ -f "$jar" ] || return 1
  done < <(tr ':' '\n' < "$file")
}

if complete "$out/broker.classpath" && complete "$out/spark-connector.classpath"; then
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "tools/fetch_kafka.sh: mvn not found; the Kafka tests need it to fetch Apache Kafka" \
    "and Spark's Kafka connector (Debian/Ubuntu: sudo apt-get install -y maven)." >&2
  exit 0
fi

resolve() {  # pom, output file
  local raw
  raw="$(mktemp)"
  echo "tools/fetch_kafka.sh: resolving $1 (may take a few minutes the first time)" >&2
  mvn -B -q -Dstyle.color=never -f "$1" dependency:build-classpath \
    -Dmdep.outputFile="$raw" -Dmdep.pathSeparator=: >&2
  cat "$raw"
  rm -f "$raw"
}

broker="$(resolve tools/kafka/broker-pom.xml)"
printf '%s' "$broker" > "$out/broker.classpath.tmp"
mv "$out/broker.classpath.tmp" "$out/broker.classpath"

connector="$(resolve tools/kafka/spark-connector-pom.xml)"
# Leave out the jars whose artifact pyspark bundles (scala-library, hadoop-client-*, ...):
# two versions of one library on the driver's classpath is asking for trouble.
printf '%s' "$connector" | "$python" -c '
import os, re, sys
try:
    import pyspark
    bundled = os.listdir(os.path.join(os.path.dirname(pyspark.__file__), "jars"))
except Exception:
    bundled = []
def artifact(name):
    return re.sub(r"-\d[\w.\-]*\.jar$", "", os.path.basename(name))
have = {artifact(j) for j in bundled}
jars = [j for j in sys.stdin.read().strip().split(":") if j and artifact(j) not in have]
sys.stdout.write(":".join(jars))
' > "$out/spark-connector.classpath.tmp"
mv "$out/spark-connector.classpath.tmp" "$out/spark-connector.classpath"
echo "tools/fetch_kafka.sh: wrote $out/broker.classpath and $out/spark-connector.classpath"

#!/usr/bin/env bash
# Spark's own Kafka source and sink (issue 20): spark-sql-kafka-0-10 for the pinned pyspark and its
# runtime dependencies, pinned in bench/peers/spark-kafka/pom.xml, copied by Maven into
# .peers/spark-kafka-<version>/jars. The pipeline (`sluice apply --source-format kafka`,
# bench/pipeline.py) and the tests load them from there, so Spark fetches nothing at run time.
# Idempotent (a finished copy is marked .complete and kept); when Maven or Maven Central is
# unreachable it says so and exits 0, so the set-up goes on and the tests that need it say why
# they skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

pom=bench/peers/spark-kafka/pom.xml
version=$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' "$pom")
dest=.peers/spark-kafka-$version
if [[ -f $dest/.complete ]]; then
  echo "spark-kafka: spark-sql-kafka-0-10 $version already in $dest"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "spark-kafka: skipped: mvn not found (scripts/bootstrap.sh installs Maven)"
  exit 0
fi
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
# Runtime scope only: Spark itself (spark-core, spark-sql: "provided") comes with pyspark.
if ! mvn -B -q -f "$pom" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$PWD/$dest.partial/jars" >"$dest.partial/maven.log" 2>&1; then
  echo "spark-kafka: skipped: Maven could not fetch spark-sql-kafka-0-10_2.13 $version" \
       "(is Maven Central reachable?); its log: $dest.partial/maven.log"
  exit 0
fi
touch "$dest.partial/.complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "spark-kafka: spark-sql-kafka-0-10 $version in $dest ($(ls "$dest/jars" | wc -l) jars)"

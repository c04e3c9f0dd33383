#!/usr/bin/env bash
# The JVM peers for the side-by-side benchmarks and tests (issue 20), each pinned in a small pom
# under bench/peers/ and copied by Maven into .peers/<name>-<version>/libs:
#
#   bench/peers/pom.xml         Apache Kafka 3.9.1's broker (ZooKeeper mode), `sluice peer up kafka`
#   bench/peers/kafka4/pom.xml  Apache Kafka 4.x's broker (KRaft), `sluice peer up kafka --kraft`
#   bench/peers/spark-kafka/pom.xml  Spark's Kafka source and sink (spark-sql-kafka-0-10 for the
#                               pinned pyspark) into .peers/spark-kafka-<version>/jars: the pipeline
#                               (`sluice apply --source-format kafka`) loads them from there, so
#                               Spark fetches nothing at run time
#   bench/peers/delta/pom.xml   Delta Lake's jars for the pinned pyspark into .peers/delta-<version>/jars:
#                               every Spark session loads them (the Delta target, sync/targets/delta.py)
#   bench/peers/connect/pom.xml Kafka Connect (distributed worker) and Debezium's MySQL connector
#                               (deploy/debezium/, tests/integration/test_connect_debezium.py)
#   bench/peers/connect-jdbc/pom.xml Debezium's JDBC sink connector and the PostgreSQL driver, a
#                               second plugin directory of the same worker: the peer pipeline
#                               MariaDB -> Debezium -> Kafka -> JDBC sink -> PostgreSQL (bench/e2e.py)
#
# Idempotent (a finished copy is marked .complete and kept); when Maven or Maven Central is
# unreachable it says so and goes on (exit 0), so the set-up goes on and the tests that need a
# peer say why they skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# fetch POM NAME LABEL [PROFILE=SUBDIR ...]: copy POM's runtime dependencies (what is "provided",
# e.g. Spark itself for the connector, stays out) into .peers/NAME-<version>/libs, or, one Maven
# profile each, into the SUBDIRs given; <version> is the pom's first <kafka.version>,
# <spark.version>, <connect.version> or <peer.version> property.
fetch() {
  local pom=$1 name=$2 label=$3 version dest part profile sub stamp
  shift 3
  (($#)) || set -- "=libs"
  version=$(sed -n 's:.*<\(kafka\|spark\|connect\|peer\)\.version>\([^<]*\)<.*:\2:p' "$pom" | head -1)
  dest=.peers/$name-$version
  # a copy made from another version of the pom (its dependencies changed) is fetched again
  stamp=$(sha256sum "$pom" | cut -d' ' -f1)
  if [[ -f $dest/.complete && ( ! -s $dest/.complete || $(cat "$dest/.complete") == "$stamp" ) ]]; then
    echo "peers: $label $version already in $dest"
    return 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "peers: skipped: $label $version: mvn not found (scripts/bootstrap.sh installs Maven)"
    return 0
  fi
  rm -rf "$dest.partial"
  mkdir -p "$dest.partial"
  for part in "$@"; do
    profile=${part%%=*} sub=${part#*=}
    if ! mvn -B -q -f "$pom" ${profile:+-P "$profile"} \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$PWD/$dest.partial/$sub" >>"$dest.partial/maven.log" 2>&1; then
      echo "peers: skipped: Maven could not fetch $label $version (is Maven Central reachable?);" \
           "its log: $dest.partial/maven.log"
      return 0
    fi
  done
  echo "$stamp" > "$dest.partial/.complete"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  echo "peers: $label $version in $dest ($(find "$dest" -name '*.jar' | wc -l) jars)"
}

fetch bench/peers/pom.xml kafka "kafka_2.13 (ZooKeeper mode)"
fetch bench/peers/kafka4/pom.xml kafka "kafka_2.13 (KRaft)"
fetch bench/peers/spark-kafka/pom.xml spark-kafka "spark-sql-kafka-0-10_2.13" =jars
# Delta Lake for the pinned pyspark (the Delta target; pipeline/session.py loads them)
fetch bench/peers/delta/pom.xml delta "delta-spark_4.2_2.13" =jars
# Kafka Connect's distributed worker into libs/, Debezium's MySQL connector into its own plugin
# directory (the worker's plugin.path)
fetch bench/peers/connect/pom.xml connect "connect-runtime with Debezium's MySQL connector" \
  worker=libs debezium=plugins/debezium-connector-mysql
# Debezium's JDBC sink connector, its own plugin directory (the peer pipeline's sink)
fetch bench/peers/connect-jdbc/pom.xml connect-jdbc "Debezium's JDBC sink connector" \
  =plugins/debezium-connector-jdbc

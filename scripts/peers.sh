#!/usr/bin/env bash
# The JVM peers for the side-by-side benchmarks and tests (issue 20): Apache Kafka's broker jars,
# pinned in bench/peers/pom.xml, copied by Maven into .peers/kafka-<version>/libs. Idempotent
# (a finished copy is marked .complete and kept); when Maven or Maven Central is unreachable it
# says so and exits 0, so the set-up goes on and the Kafka side of the tests says why it skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- Kafka Connect + Debezium (issue 20, the Connect part) -------------------------------------
# The distributed worker (connect-runtime) into .peers/connect-<version>/libs and Debezium's MySQL
# connector, its own plugin directory, into .peers/connect-<version>/plugins/debezium-connector-mysql
# (versions pinned in bench/peers/connect/pom.xml). Runs in a subshell of its own: whatever it
# says or skips, the Kafka block below still runs.
(
  cpom=bench/peers/connect/pom.xml
  cversion=$(sed -n 's:.*<connect.version>\(.*\)</connect.version>.*:\1:p' "$cpom")
  cdest=.peers/connect-$cversion
  if [[ -f $cdest/.complete ]]; then
    echo "peers: connect $cversion (with debezium) already in $cdest"
    exit 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "peers: skipped connect: mvn not found (scripts/bootstrap.sh installs Maven)"
    exit 0
  fi
  rm -rf "$cdest.partial"
  mkdir -p "$cdest.partial"
  copy() {  # profile, output directory
    mvn -B -q -f "$cpom" -P "$1" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$PWD/$2" >>"$cdest.partial/maven.log" 2>&1
  }
  if ! copy worker "$cdest.partial/libs" || ! copy debezium "$cdest.partial/plugins/debezium-connector-mysql"; then
    echo "peers: skipped connect: Maven could not fetch connect-runtime $cversion or Debezium" \
         "(is Maven Central reachable?); its log: $cdest.partial/maven.log"
    exit 0
  fi
  touch "$cdest.partial/.complete"
  rm -rf "$cdest"
  mv "$cdest.partial" "$cdest"
  echo "peers: connect $cversion in $cdest ($(ls "$cdest/libs" | wc -l) jars," \
       "$(ls "$cdest/plugins/debezium-connector-mysql" | wc -l) in the Debezium plugin)"
)
# --- end of the Connect block --------------------------------------------------------------------

pom=bench/peers/pom.xml
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
dest=.peers/kafka-$version
if [[ -f $dest/.complete ]]; then
  echo "peers: kafka $version already in $dest"
  exit 0
fi
if ! command -v mvn >/dev/null 2>&1; then
  echo "peers: skipped: mvn not found (scripts/bootstrap.sh installs Maven)"
  exit 0
fi
rm -rf "$dest.partial"
mkdir -p "$dest.partial"
if ! mvn -B -q -f "$pom" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$PWD/$dest.partial/libs" >"$dest.partial/maven.log" 2>&1; then
  echo "peers: skipped: Maven could not fetch kafka_2.13 $version (is Maven Central reachable?);" \
       "its log: $dest.partial/maven.log"
  exit 0
fi
touch "$dest.partial/.complete"
rm -rf "$dest"
mv "$dest.partial" "$dest"
echo "peers: kafka $version in $dest ($(ls "$dest/libs" | wc -l) jars)"

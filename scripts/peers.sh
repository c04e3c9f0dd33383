#!/usr/bin/env bash
# The JVM peers for the side-by-side benchmarks and tests (issue 20): Apache Kafka's broker jars,
# pinned in bench/peers/pom.xml, copied by Maven into .peers/kafka-<version>/libs. Idempotent
# (a finished copy is marked .complete and kept); when Maven or Maven Central is unreachable it
# says so and exits 0, so the set-up goes on and the Kafka side of the tests says why it skips.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# --- KRaft peer (Kafka 4.x, `sluice peer up kafka --kraft`): bench/peers/kafka4/pom.xml ----------
# Self-contained and run first (the ZooKeeper-mode block below ends the script with exit 0).
fetch_kafka4() {
  local pom=bench/peers/kafka4/pom.xml version dest
  version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom")
  dest=.peers/kafka-$version
  if [[ -f $dest/.complete ]]; then
    echo "peers: kafka $version (KRaft) already in $dest"
    return 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "peers: skipped: kafka $version (KRaft): mvn not found (scripts/bootstrap.sh installs Maven)"
    return 0
  fi
  rm -rf "$dest.partial"
  mkdir -p "$dest.partial"
  if ! mvn -B -q -f "$pom" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$PWD/$dest.partial/libs" >"$dest.partial/maven.log" 2>&1; then
    echo "peers: skipped: Maven could not fetch kafka_2.13 $version (KRaft; is Maven Central" \
         "reachable?); its log: $dest.partial/maven.log"
    return 0
  fi
  touch "$dest.partial/.complete"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  echo "peers: kafka $version (KRaft) in $dest ($(ls "$dest/libs" | wc -l) jars)"
}
fetch_kafka4
# --- end of the KRaft peer block ------------------------------------------------------------------

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

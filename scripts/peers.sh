#!/usr/bin/env bash
# The JVM peers for the side-by-side benchmarks and tests (issue 20), each pinned in a small pom
# under bench/peers/ and copied by Maven into .peers/<name>-<version>/libs:
#
#   bench/peers/pom.xml         Apache Kafka 3.9.1's broker (ZooKeeper mode), `sluice peer up kafka`
#   bench/peers/kafka4/pom.xml  Apache Kafka 4.x's broker (KRaft), `sluice peer up kafka --kraft`
#
# Idempotent (a finished copy is marked .complete and kept); when Maven or Maven Central is
# unreachable it says so and goes on (exit 0), so the set-up goes on and the tests that need a
# peer say why they skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# fetch POM NAME LABEL: copy POM's runtime dependencies into .peers/NAME-<version>/libs, where
# <version> is the pom's <kafka.version> property (or <peer.version> if it has none).
fetch() {
  local pom=$1 name=$2 label=$3 version dest
  version=$(sed -n 's:.*<\(kafka\|peer\)\.version>\(.*\)</\(kafka\|peer\)\.version>.*:\2:p' "$pom" | head -1)
  dest=.peers/$name-$version
  if [[ -f $dest/.complete ]]; then
    echo "peers: $label $version already in $dest"
    return 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "peers: skipped: $label $version: mvn not found (scripts/bootstrap.sh installs Maven)"
    return 0
  fi
  rm -rf "$dest.partial"
  mkdir -p "$dest.partial"
  if ! mvn -B -q -f "$pom" org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$PWD/$dest.partial/libs" >"$dest.partial/maven.log" 2>&1; then
    echo "peers: skipped: Maven could not fetch $label $version (is Maven Central reachable?);" \
         "its log: $dest.partial/maven.log"
    return 0
  fi
  touch "$dest.partial/.complete"
  rm -rf "$dest"
  mv "$dest.partial" "$dest"
  echo "peers: $label $version in $dest ($(ls "$dest/libs" | wc -l) jars)"
}

fetch bench/peers/pom.xml kafka "kafka_2.13 (ZooKeeper mode)"
fetch bench/peers/kafka4/pom.xml kafka "kafka_2.13 (KRaft)"

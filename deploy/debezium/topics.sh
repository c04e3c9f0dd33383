#!/usr/bin/env bash
# The topics Kafka Connect and Debezium need, created in Sluice before the first worker starts.
# Connect would create its three itself (compacted); creating them here fixes their partitions
# and replication, and makes a wrong cleanup.policy impossible to miss.
set -euo pipefail
b=${BOOTSTRAP:-h1:9092}
topic() { sluice topic create "$1" --partitions "$2" --replication-factor 3 --bootstrap-server "$b" "${@:3}"; }
topic connect-configs 1  --config cleanup.policy=compact --config min.insync.replicas=2
topic connect-offsets 25 --config cleanup.policy=compact --config min.insync.replicas=2
topic connect-status  5  --config cleanup.policy=compact --config min.insync.replicas=2
# Debezium's schema history: one partition, kept for ever (never compacted, never expired)
topic dbz.history 1 --config cleanup.policy=delete --config retention.ms=-1 --config retention.bytes=-1
# The table topics (dbz.<db>.<table>) are created by the worker (topic.creation.* above).

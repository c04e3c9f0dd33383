"""What legitimately differs between a Kafka cluster and a Sluice cluster, removed in one place
before two observations are compared. Everything not named here is compared exactly."""

from __future__ import annotations

import json
from typing import Any

from tests.conformance.differential.scenarios import T0

#: Keys dropped wherever they occur in an observation, each with why.
DROPPED_KEYS = {
    # Throttling depends on quotas and load of the moment, not on the protocol.
    "throttle_time_ms",
    # A client exception's free-text message (class name, wording, host:port in it): the error
    # *name* next to it is compared exactly.
    "detail",
    # Node ids, hosts and ports of brokers are the clusters' own (Kafka peer brokers are 1..N,
    # Sluice's 0..N-1; ports come from free_ports).
    "node_endpoints",
    "leader_id",
    "host",
    "port",
    # Each cluster makes its own cluster id and topic ids (random UUIDs).
    "cluster_id",
    "topic_id",
    # Broker-chosen member ids (the client id plus a random UUID) differ run to run.
    "member_id",
    # Producer ids come from each cluster's own id block.
    "producer_id",
    # Free text beside an error code: Sluice's say what happened and what to do next where
    # Kafka's are often null (docs/COMPATIBILITY.md); the code next to it is compared exactly.
    "error_message",
}

#: Lists of broker ids replaced by their length: which brokers hold a partition is each
#: cluster's own placement (Kafka starts its round-robin at a random broker), how many is not.
BROKER_ID_LISTS = {"replica_nodes", "isr_nodes", "offline_replicas", "replicas", "isr"}


def normalize(observation: Any) -> Any:
    """``observation`` with every DROPPED_KEYS key removed, recursively (dicts, lists)."""
    if isinstance(observation, dict):
        return {
            k: len(v) if k in BROKER_ID_LISTS and isinstance(v, list) else normalize(v)
            for k, v in observation.items()
            if k not in DROPPED_KEYS
        }
    if isinstance(observation, list | tuple):
        items = [normalize(v) for v in observation]
        # Kafka lists a topic's partitions in its own map order (0, 1, 4, 2, 3 after partitions
        # were added), Sluice by index: partition lists are compared in index order.
        if items and all(isinstance(v, dict) and "partition_index" in v for v in items):
            items.sort(key=lambda v: v["partition_index"])
        # A group's members are listed in the coordinator's order of their (random) member ids:
        # compared as a sorted list.
        if items and all(isinstance(v, dict) and "member_assignment" in v for v in items):
            items.sort(key=lambda v: json.dumps(v, sort_keys=True, default=repr))
        return items
    return observation


#: The differences that stay, each listed in docs/COMPATIBILITY.md with its reason, by
#: (scenario, client, step): the normalized (Kafka, Sluice) observations exactly as they are. A
#: listed step must still show exactly this pair: if Sluice's answer changes, the suite says so.
KNOWN_DIFFERENCES: dict[tuple[str, str, str], tuple[Any, Any]] = {
    # A topic auto-created by a Metadata request: Kafka answers LEADER_NOT_AVAILABLE (the topic
    # is created, its leaders not yet elected) and clients ask again; Sluice waits for the
    # leaders (up to 5 s) and answers the topic. confluent-kafka's list_topics(topic) shows it.
    ("metadata_and_admin", "confluent", "metadata-unknown"): (
        {"error": "LEADER_NOT_AVAILABLE"},
        {"ok": {"partitions": [{"partition": 0, "replicas": 1, "isr": 1}]}},
    ),
    # A duplicate idempotent batch: Kafka answers its log_append_time_ms with the batch's max
    # timestamp even under CreateTime; Sluice with -1, as for the original append.
    ("idempotent_sequences", "raw", "seq-0-again"): (
        {
            "index": 0,
            "error_code": 0,
            "base_offset": 0,
            "log_append_time_ms": T0,
            "log_start_offset": 0,
            "record_errors": [],
            "current_leader": {"leader_epoch": -1},
        },
        {
            "index": 0,
            "error_code": 0,
            "base_offset": 0,
            "log_append_time_ms": -1,
            "log_start_offset": 0,
            "record_errors": [],
            "current_leader": {"leader_epoch": -1},
        },
    ),
}

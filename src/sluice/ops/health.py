"""Which partitions are offline or under-replicated, and why, read from ZooKeeper (classified by
the one classifier, `sluice.cluster.health.classify_partition`)."""

from __future__ import annotations

from sluice.cluster.health import PartitionHealth, classify_partition
from sluice.cluster.zkstore import ZkStore

__all__ = ["PartitionHealth", "partition_health"]


def partition_health(store: ZkStore) -> list[PartitionHealth]:
    live = set(store.live_brokers())
    result = []
    for name in store.topics():
        assignment = store.topic(name)
        if assignment is None:
            continue
        for p, replicas in sorted(assignment.replicas.items()):
            current = store.partition_state(name, p)
            result.append(classify_partition(name, p, current[0] if current else None, replicas, live))
    return result

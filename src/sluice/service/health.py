"""Which partitions are offline or under-replicated, and why, read from ZooKeeper (classified by
the one classifier, `sluice.cluster.health.classify_partition`)."""

from __future__ import annotations

from sluice.cluster import layout
from sluice.cluster.health import PartitionHealth, classify_partition
from sluice.cluster.layout import PartitionState, TopicAssignment
from sluice.cluster.zkstore import ZkStore

__all__ = ["PartitionHealth", "partition_health"]


def partition_health(
    store: ZkStore, topics: dict[str, TopicAssignment] | None = None
) -> list[PartitionHealth]:
    """Every partition's health; the states are read in one pipelined batch (thousands of
    partitions cost one round trip's latency, not one each)."""
    live = set(store.live_brokers())
    assignments = store.all_topics() if topics is None else topics
    paths = {
        (name, p): layout.partition_state_path(name, p) for name, a in assignments.items() for p in a.replicas
    }
    states = store.read_many(paths.values())
    result = []
    for name in sorted(assignments):
        for p, replicas in sorted(assignments[name].replicas.items()):
            path = paths[(name, p)]
            got = states.get(path)
            state = PartitionState.decode(got[0], path) if got is not None else None
            result.append(classify_partition(name, p, state, replicas, live))
    return result

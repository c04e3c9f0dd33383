"""Replica assignment for new topics: a pure function over broker ids.

Kafka's rack-unaware rule: start at a broker chosen by position, place each partition's
first replica round-robin, and shift followers so that leaders and followers spread evenly.
"""

from __future__ import annotations


class AssignmentError(ValueError):
    """The requested replication cannot be placed on the live brokers."""


def assign_replicas(
    broker_ids: list[int], partitions: int, replication_factor: int, *, start_index: int = 0
) -> dict[int, tuple[int, ...]]:
    """Return partition -> replicas (the first replica is the preferred leader)."""
    if partitions <= 0:
        raise AssignmentError(f"number of partitions must be at least 1, got {partitions}")
    if replication_factor <= 0:
        raise AssignmentError(f"replication factor must be at least 1, got {replication_factor}")
    brokers = sorted(set(broker_ids))
    if replication_factor > len(brokers):
        raise AssignmentError(
            f"replication factor {replication_factor} is larger than the {len(brokers)} live "
            f"broker(s) {brokers}; start more brokers or lower the replication factor"
        )
    n = len(brokers)
    start = start_index % n
    shift = start
    result: dict[int, tuple[int, ...]] = {}
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            # Followers are offset from the leader by a per-round shift so that two partitions
            # with the same leader do not also share all their followers.
            offset = 1 + (shift + j) % (n - 1) if n > 1 else 0
            replicas.append(brokers[(first + offset) % n])
        assert len(set(replicas)) == replication_factor, replicas
        result[p] = tuple(replicas)
    return result

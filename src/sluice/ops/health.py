"""Which partitions are offline or under-replicated, and why, read from ZooKeeper."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.cluster.state_machine import offline_reason
from sluice.cluster.zkstore import ZkStore


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    status: str  # "ok" | "under-replicated" | "offline"
    reason: str


def partition_health(store: ZkStore) -> list[PartitionHealth]:
    live = set(store.live_brokers())
    result = []
    for name in store.topics():
        assignment = store.topic(name)
        if assignment is None:
            continue
        for p, replicas in sorted(assignment.replicas.items()):
            current = store.partition_state(name, p)
            state = current[0] if current else None
            why = offline_reason(state, replicas, live)
            if why is not None or state is None:
                result.append(
                    PartitionHealth(
                        name, p, -1, replicas, state.isr if state else (), "offline", why or "no state"
                    )
                )
                continue
            missing = [r for r in replicas if r not in state.isr]
            if missing:
                down = [r for r in missing if r not in live]
                reason = f"replica(s) {missing} out of sync" + (
                    f"; broker(s) {down} down" if down else "; catching up"
                )
                result.append(
                    PartitionHealth(name, p, state.leader, replicas, state.isr, "under-replicated", reason)
                )
            else:
                result.append(PartitionHealth(name, p, state.leader, replicas, state.isr, "ok", ""))
    return result

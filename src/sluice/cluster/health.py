"""The one partition-health classifier: ok, under-replicated or offline, and why, in words an
operator can act on. Pure: plain data in, plain data out. Every view of partition health (the
controller's and leaders' metrics, `sluice cluster status`, `sluice topic describe`, the manager's
API, console and alarms) asks this function, so no two of them can disagree."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sluice.cluster.layout import PartitionState
from sluice.cluster.state_machine import offline_reason

OK = "ok"
UNDER_REPLICATED = "under-replicated"
OFFLINE = "offline"


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    status: str  # OK | UNDER_REPLICATED | OFFLINE
    reason: str


def classify_partition(
    topic: str,
    partition: int,
    state: PartitionState | None,
    replicas: Collection[int],
    live: Collection[int],
) -> PartitionHealth:
    """`state` is the partition's leader/ISR record (None if the controller has not written it);
    `live` the brokers registered now. Offline: no live leader. Under-replicated: a live leader
    but a replica out of the ISR (down, or alive and catching up)."""
    replicas_t = tuple(replicas)
    why = offline_reason(state, replicas_t, live)
    if why is not None or state is None:
        return PartitionHealth(
            topic, partition, -1, replicas_t, state.isr if state else (), OFFLINE, why or "no state"
        )
    missing = [r for r in replicas_t if r not in state.isr]
    if not missing:
        return PartitionHealth(topic, partition, state.leader, replicas_t, state.isr, OK, "")
    down = [r for r in missing if r not in live]
    reason = f"replica(s) {missing} out of sync" + (f"; broker(s) {down} down" if down else "; catching up")
    return PartitionHealth(topic, partition, state.leader, replicas_t, state.isr, UNDER_REPLICATED, reason)

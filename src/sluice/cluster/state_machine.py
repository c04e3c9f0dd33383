"""Partition and replica states as the controller sees them, with every allowed transition in
one table each (Kafka's PartitionStateMachine and ReplicaStateMachine). Pure.

The controller classifies each partition from ZooKeeper's state and the live brokers, and
checks every change it writes against ``PARTITION_TRANSITIONS``; reassignment moves replicas
through ``REPLICA_TRANSITIONS``.
"""

from __future__ import annotations

import enum
from collections.abc import Collection

from sluice.cluster.layout import PartitionState


class IllegalStateTransition(AssertionError):
    pass


class PartitionPhase(enum.Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


P = PartitionPhase

PARTITION_TRANSITIONS: dict[PartitionPhase, frozenset[PartitionPhase]] = {
    P.NON_EXISTENT: frozenset({P.NEW}),
    P.NEW: frozenset({P.ONLINE, P.OFFLINE, P.NON_EXISTENT}),
    P.ONLINE: frozenset({P.ONLINE, P.OFFLINE, P.NON_EXISTENT}),
    P.OFFLINE: frozenset({P.ONLINE, P.OFFLINE, P.NON_EXISTENT}),
}


class ReplicaPhase(enum.Enum):
    NON_EXISTENT = "NonExistentReplica"
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"


R = ReplicaPhase

REPLICA_TRANSITIONS: dict[ReplicaPhase, frozenset[ReplicaPhase]] = {
    R.NON_EXISTENT: frozenset({R.NEW}),
    R.NEW: frozenset({R.ONLINE, R.OFFLINE, R.DELETION_STARTED}),
    R.ONLINE: frozenset({R.ONLINE, R.OFFLINE, R.DELETION_STARTED}),
    R.OFFLINE: frozenset({R.ONLINE, R.OFFLINE, R.DELETION_STARTED}),
    R.DELETION_STARTED: frozenset({R.NON_EXISTENT}),
}


def partition_phase(state: PartitionState | None, live: Collection[int]) -> PartitionPhase:
    if state is None:
        return P.NON_EXISTENT
    if state.leader >= 0 and state.leader in live:
        return P.ONLINE
    return P.OFFLINE


def check_partition_transition(old: PartitionPhase, new: PartitionPhase, what: str) -> None:
    if new not in PARTITION_TRANSITIONS[old]:
        raise IllegalStateTransition(
            f"{what}: {old.value} -> {new.value} is not an allowed partition transition"
        )


def check_replica_transition(old: ReplicaPhase, new: ReplicaPhase, what: str) -> None:
    if new not in REPLICA_TRANSITIONS[old]:
        raise IllegalStateTransition(
            f"{what}: {old.value} -> {new.value} is not an allowed replica transition"
        )


def offline_reason(
    state: PartitionState | None, replicas: Collection[int], live: Collection[int]
) -> str | None:
    """Why a partition is offline, in words an operator can act on; None when it is online."""
    if state is None:
        return "the controller has not created its state yet"
    if state.leader >= 0 and state.leader in live:
        return None
    isr = list(state.isr)
    if len(replicas) == 1:
        only = next(iter(replicas))
        return (
            f"its only replica, broker {only}, is down; no data was lost on the other brokers because "
            f"there are none: bring broker {only} back (drain single-replica partitions before stopping "
            "a broker)"
        )
    return (
        f"no in-sync replica is alive (in-sync replicas {isr} are down, live brokers {sorted(live)}); "
        f"it comes back when one of {isr} does"
    )

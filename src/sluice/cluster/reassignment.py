"""Partition reassignments asked for over the wire (KIP-455): pure functions over the pending
moves of ``/admin/reassign_partitions`` and the topics' assignments.

``merge_reassignments`` decides what AlterPartitionReassignments changes in the pending list (a
new move, a new target for a move under way, a cancellation, which returns a move to the
replicas it started from); the controller writes the list with a fenced compare-and-set and
carries the moves out in phases as it does for ``sluice broker drain``
(``Controller._reassign``). ``ongoing_reassignments`` is ListPartitionReassignments' answer.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sluice.cluster.layout import Reassignment, TopicAssignment
from sluice.protocol.errors import ErrorCode

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ReassignmentRequest:
    """One partition of AlterPartitionReassignments: its target replicas, None to cancel."""

    topic: str
    partition: int
    replicas: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class MergedReassignments:
    """The pending moves after a request, and each requested partition's answer."""

    moves: list[Reassignment]
    results: dict[Key, tuple[ErrorCode, str | None]]


def merge_reassignments(
    pending: Sequence[Reassignment],
    requests: Sequence[ReassignmentRequest],
    topics: Mapping[str, TopicAssignment],
    live: Collection[int],
    *,
    allow_replication_factor_change: bool = True,
) -> MergedReassignments:
    """Apply ``requests`` to the ``pending`` moves; a refused request changes nothing."""
    moves: dict[Key, Reassignment] = {(m.topic, m.partition): m for m in pending}
    results: dict[Key, tuple[ErrorCode, str | None]] = {}
    for req in requests:
        key = (req.topic, req.partition)
        assignment = topics.get(req.topic)
        if assignment is None or req.partition not in assignment.replicas:
            results[key] = (
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{req.topic}-{req.partition} does not exist",
            )
            continue
        current = assignment.replicas[req.partition]
        under_way = moves.get(key)
        if req.replicas is None:
            if under_way is None:
                results[key] = (
                    ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                    f"{req.topic}-{req.partition} is not being reassigned",
                )
                continue
            back = under_way.original
            if back is None or back == current:
                del moves[key]  # not started (or nothing recorded to return to): just dropped
            else:
                moves[key] = Reassignment(req.topic, req.partition, back, back)
            results[key] = (ErrorCode.NONE, None)
            continue
        target = req.replicas
        problem = _target_problem(target, live)
        if problem is not None:
            results[key] = (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{req.topic}-{req.partition}: {problem}")
            continue
        original = under_way.original if under_way is not None and under_way.original else current
        if not allow_replication_factor_change and len(target) != len(original):
            results[key] = (
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"{req.topic}-{req.partition}: {len(target)} replicas asked for, it has {len(original)}, "
                "and the request does not allow the replication factor to change",
            )
            continue
        if target == current and under_way is None:
            results[key] = (ErrorCode.NONE, None)  # already there: nothing to move
            continue
        moves[key] = Reassignment(req.topic, req.partition, target, original)
        results[key] = (ErrorCode.NONE, None)
    return MergedReassignments(list(moves.values()), results)


def _target_problem(target: tuple[int, ...], live: Collection[int]) -> str | None:
    if not target:
        return "the replica list is empty"
    if len(set(target)) != len(target):
        return f"replicas {list(target)} name a broker twice"
    gone = sorted(set(target) - set(live))
    if gone:
        return f"broker(s) {gone} are not live (live: {sorted(live)})"
    return None


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    """ListPartitionReassignments' entry for one partition."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]


def ongoing_reassignments(
    pending: Sequence[Reassignment], topics: Mapping[str, TopicAssignment]
) -> list[OngoingReassignment]:
    """Each pending move of a partition that exists: its replicas now (during a move, the old
    and new together), the replicas being added and those being removed."""
    out = []
    for m in pending:
        assignment = topics.get(m.topic)
        if assignment is None or m.partition not in assignment.replicas:
            continue
        current = assignment.replicas[m.partition]
        # A move written without its starting replicas (before they were recorded) is
        # described from the replicas the partition has now.
        before = m.original if m.original is not None else current
        adding = tuple(r for r in m.replicas if r not in before)
        removing = tuple(r for r in before if r not in m.replicas)
        out.append(OngoingReassignment(m.topic, m.partition, current, adding, removing))
    return sorted(out, key=lambda o: (o.topic, o.partition))

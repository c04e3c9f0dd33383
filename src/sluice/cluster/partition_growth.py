"""Adding partitions to a topic (CreatePartitions, KIP-195): the decision as a pure function.

The controller carries it out (``cluster/admin_requests.py``): it reads the topic's assignment,
asks :func:`plan_growth` for the new partitions' replicas, and writes the grown assignment in a
fenced multi-op conditional on the topic znode's version; its next pass gives the new
partitions their first states (``election.initial_partition_state``), as for a new topic.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sluice.cluster.assignment import AssignmentError, assign_replicas
from sluice.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Growth:
    """The partitions to add (index -> replicas), or the refusal: Kafka's code and a message
    that names what is wrong and what to do."""

    added: dict[int, tuple[int, ...]]
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None


def _refused(error: ErrorCode, message: str) -> Growth:
    return Growth({}, error, message)


def plan_growth(
    topic: str,
    current: Mapping[int, tuple[int, ...]],
    count: int,
    assignments: Sequence[Sequence[int]] | None,
    live: Collection[int],
    *,
    start_index: int,
) -> Growth:
    """The partitions ``current.len() .. count-1`` of ``topic``, on the brokers
    ``assignments`` names (one replica list per new partition) or, without them, spread over the
    ``live`` brokers as a new topic's would be (``assign_replicas``, continuing its round robin
    from ``start_index``), with the topic's replication factor.

    Refused: a count not above today's (INVALID_PARTITIONS: partitions are never removed, since
    records and committed offsets live in them); an assignment of the wrong length, with
    duplicate or non-live brokers, or with another replication factor (INVALID_REPLICA_ASSIGNMENT)."""
    existing = len(current)
    if count <= existing:
        return _refused(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {topic!r} has {existing} partition(s) and {count} were asked for: the count can "
            "only grow (partitions are never removed, their records and offsets live in them); "
            "nothing was changed",
        )
    factor = len(current[min(current)]) if current else 1
    wanted = count - existing
    if assignments is not None:
        if len(assignments) != wanted:
            return _refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"{wanted} new partition(s) need {wanted} replica list(s), {len(assignments)} were given",
            )
        added: dict[int, tuple[int, ...]] = {}
        for i, replicas in enumerate(assignments):
            index = existing + i
            if len(set(replicas)) != len(replicas):
                return _refused(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {index}: replicas {list(replicas)} name a broker twice",
                )
            if len(replicas) != factor:
                return _refused(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {index}: {len(replicas)} replica(s) given, the topic's replication "
                    f"factor is {factor}",
                )
            gone = sorted(set(replicas) - set(live))
            if gone:
                return _refused(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"partition {index}: broker(s) {gone} are not live (live: {sorted(live)})",
                )
            added[index] = tuple(replicas)
        return Growth(added)
    try:
        spread = assign_replicas(sorted(live), count, factor, start_index=start_index)
    except AssignmentError as exc:
        return _refused(ErrorCode.INVALID_REPLICATION_FACTOR, str(exc))
    return Growth({p: spread[p] for p in range(existing, count)})


def growth_start_index(current: Mapping[int, tuple[int, ...]], live: Collection[int], fallback: int) -> int:
    """Where the round robin of a topic's new partitions starts: at partition 0's preferred
    replica among the live brokers (Kafka's rule), so they continue its spread."""
    brokers = sorted(live)
    first = current.get(0, ())
    if first and first[0] in brokers:
        return brokers.index(first[0])
    return fallback

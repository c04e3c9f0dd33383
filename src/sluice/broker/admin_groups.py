"""OffsetDelete (KIP-496): a group's committed offsets for partitions it no longer consumes.

The decision is pure (``offset_deletion``): a consumer group's offsets of a topic its members
subscribe to are refused per partition with GROUP_SUBSCRIBED_TO_TOPIC, and a group that runs
another protocol must be empty; the coordinator writes tombstones for the rest
(``GroupCoordinator.delete_offsets``), so a coordinator that loads the partition later finds
them gone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.broker.group import Group, GroupState
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.protocol.primitives import DecodeError, Reader

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

Body = dict[str, Any]
Key = tuple[str, int]
CONSUMER_PROTOCOL = "consumer"


def subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a consumer's subscription (Kafka's ConsumerProtocolSubscription: version,
    then the topic names, in every version); None when the bytes are not one."""
    try:
        r = Reader(metadata)
        r.int16()
        return frozenset(r.string() for _ in range(r.array_length(2)))
    except (DecodeError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class OffsetDeletion:
    """The group-level answer, each partition's, and the offsets to delete."""

    error: ErrorCode
    partitions: dict[Key, ErrorCode]
    delete: tuple[Key, ...]


def offset_deletion(group: Group | None, requested: Iterable[Key]) -> OffsetDeletion:
    """Kafka's rule: an unknown or dead group is GROUP_ID_NOT_FOUND; a group of the consumer
    protocol (or any empty group) loses the offsets of topics no member subscribes to, and the
    others are answered GROUP_SUBSCRIBED_TO_TOPIC; a non-empty group of another protocol is
    NON_EMPTY_GROUP. A member whose subscription cannot be read counts as subscribed to every
    topic, so its offsets are never deleted under it."""
    keys = list(dict.fromkeys(requested))
    if group is None or group.state is GroupState.DEAD:
        return OffsetDeletion(ErrorCode.GROUP_ID_NOT_FOUND, {}, ())
    empty = group.state is GroupState.EMPTY or not group.members
    if not empty and group.protocol_type != CONSUMER_PROTOCOL:
        return OffsetDeletion(ErrorCode.NON_EMPTY_GROUP, {}, ())
    subscribed: set[str] = set()
    everything = False
    if not empty:
        for member in group.members.values():
            topics = subscribed_topics(member.metadata_for(group.protocol or ""))
            if topics is None:
                everything = True
            else:
                subscribed |= topics
    answers = {
        k: ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC if everything or k[0] in subscribed else ErrorCode.NONE
        for k in keys
    }
    return OffsetDeletion(ErrorCode.NONE, answers, tuple(k for k in keys if answers[k] is ErrorCode.NONE))


async def offset_delete(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    group_id = req["group_id"]
    requested = [(t["name"], p["partition_index"]) for t in req["topics"] for p in t["partitions"]]
    coordinator = broker.coordinator
    error = coordinator.check(group_id)
    decision = (
        offset_deletion(coordinator.groups.get(group_id), requested)
        if error is ErrorCode.NONE
        else OffsetDeletion(error, {}, ())
    )
    error = decision.error
    if error is ErrorCode.NONE and decision.delete:
        error = await coordinator.delete_offsets(group_id, decision.delete)
    answers = decision.partitions if error is ErrorCode.NONE else {}
    return {
        "error_code": error,
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": answers.get((t["name"], p["partition_index"]), error),
                    }
                    for p in t["partitions"]
                ],
            }
            for t in req["topics"]
        ],
    }

"""Which committed offsets expire (Kafka's ``offsets.retention.minutes``, KIP-211). Pure.

- A group that is **empty** (no member) keeps its offsets for the retention after it became
  empty (its state timestamp), whatever their commit time; then all of them expire, and the
  group itself goes once it has none.
- A group **without a protocol** (offsets committed from outside the group protocol: assign()
  consumers, tools) keeps each offset for the retention after its commit.
- A **stable consumer group** (protocol type ``consumer``) keeps the offsets of the topics its
  members subscribe to; an offset of a topic none subscribes to any more expires the retention
  after its commit.
- Any other group (rebalancing, or a protocol whose subscriptions Sluice cannot read) keeps all.
- Whatever the above, a partition with a **transactional commit awaiting its marker**
  (TxnOffsetCommit written, COMMIT or ABORT not yet) keeps its offset, and a group with one is
  not removed, as Kafka's OffsetMetadataManager.cleanupExpiredOffsets. A tombstone written
  between the transactional record and its marker is the newest record of its key, so the
  cleaner would keep it and drop the record the COMMIT marker makes the committed offset: a
  coordinator loading the cleaned log would find no offset, and the consumers would reset. The
  expiry waits for the next pass: after an ABORT the old offset expires then.

The coordinator writes what expires as tombstones to ``__consumer_offsets``
(``GroupCoordinator.expire_offsets``), so the log cleaner removes the history of dead groups
and a new coordinator loads only live ones.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["ExpiryFacts", "consumer_subscribed_topics", "expired_offsets", "group_expires"]

CONSUMER_PROTOCOL_TYPE: Final = "consumer"
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class ExpiryFacts:
    """A group as the rule sees it."""

    #: "Empty", "Stable", ... (``GroupState.value``)
    state: str
    #: None or "": committed outside the group protocol only
    protocol_type: str | None
    #: when the group entered its state (ms; when it became empty, for an empty group)
    state_timestamp_ms: int
    #: (topic, partition) -> commit timestamp (ms)
    offsets: Mapping[tuple[str, int], int]
    #: the topics a stable consumer group's members subscribe to; None when not known
    subscribed: frozenset[str] | None
    #: the partitions with a transactional offset commit awaiting its marker
    pending_txn: frozenset[tuple[str, int]]


def expired_offsets(group: ExpiryFacts, now_ms: int, retention_ms: int) -> list[tuple[str, int]]:
    """The group's offsets that have expired at ``now_ms`` (sorted); never one of a partition
    with a transactional commit pending."""
    return [tp for tp in _expired(group, now_ms, retention_ms) if tp not in group.pending_txn]


def _expired(group: ExpiryFacts, now_ms: int, retention_ms: int) -> list[tuple[str, int]]:
    if group.state == "Empty" and group.protocol_type:
        if group.state_timestamp_ms + retention_ms <= now_ms:
            return sorted(group.offsets)
        return []
    if group.state == "Empty" or not group.protocol_type:
        # No protocol: each offset by its own commit time.
        return sorted(tp for tp, ts in group.offsets.items() if ts + retention_ms <= now_ms)
    consumer = group.protocol_type == CONSUMER_PROTOCOL_TYPE
    if group.state == "Stable" and consumer and group.subscribed is not None:
        return sorted(
            tp
            for tp, ts in group.offsets.items()
            if tp[0] not in group.subscribed and ts + retention_ms <= now_ms
        )
    return []


def group_expires(
    group: ExpiryFacts, expired: Iterable[tuple[str, int]], now_ms: int, retention_ms: int
) -> bool:
    """Whether the group itself goes with ``expired``: it is empty, none of its offsets is left,
    no transactional commit of it is pending (its marker would find no group to apply to), and
    it has been empty for the retention (a group that just became empty without offsets is kept
    that long too, as its members may come back)."""
    left = set(group.offsets) - set(expired)
    return (
        group.state == "Empty"
        and not left
        and not group.pending_txn
        and group.state_timestamp_ms + retention_ms <= now_ms
    )


def consumer_subscribed_topics(metadata: bytes) -> frozenset[str] | None:
    """The topics of a ``consumer`` protocol member's subscription (Kafka's
    ConsumerProtocolSubscription: version int16, then topics as an int32 count of int16-length
    strings; later fields unread). None when it cannot be read."""
    try:
        (version,) = _INT16.unpack_from(metadata, 0)
        if version < 0:
            return None
        (count,) = _INT32.unpack_from(metadata, 2)
        if count < 0 or count > len(metadata):
            return None
        pos, topics = 6, []
        for _ in range(count):
            (n,) = _INT16.unpack_from(metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.append(metadata[pos : pos + n].decode("utf-8"))
            pos += n
        return frozenset(topics)
    except (struct.error, UnicodeDecodeError):
        return None

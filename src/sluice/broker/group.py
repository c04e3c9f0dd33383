"""A consumer group as plain data, and its state machine.

The states and every allowed transition are in ``TRANSITIONS``, one table (Kafka's classic
group protocol). The coordinator does the I/O; this module decides nothing by itself except
what the table allows, and a few pure rules (protocol selection, membership checks). The rules
of static membership (KIP-345) are in ``static_membership``.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState

#: state -> the states it may move to.
TRANSITIONS: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.PREPARING_REBALANCE: frozenset({S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE, S.STABLE, S.DEAD}),
    S.STABLE: frozenset({S.PREPARING_REBALANCE, S.DEAD}),
    S.DEAD: frozenset(),
}


class IllegalTransition(AssertionError):
    pass


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat: float = 0.0
    join_future: asyncio.Future[dict[str, Any]] | None = None
    sync_future: asyncio.Future[dict[str, Any]] | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    @property
    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    def to_record(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "group_instance_id": self.group_instance_id,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "protocols": [[name, bytes(md).hex()] for name, md in self.protocols],
            "assignment": bytes(self.assignment).hex(),
        }

    @classmethod
    def from_record(cls, obj: dict[str, Any], protocol_type: str, now: float) -> Member:
        return cls(
            member_id=obj["member_id"],
            group_instance_id=obj.get("group_instance_id"),
            client_id=obj.get("client_id", ""),
            client_host=obj.get("client_host", ""),
            session_timeout_ms=int(obj["session_timeout_ms"]),
            rebalance_timeout_ms=int(obj["rebalance_timeout_ms"]),
            protocol_type=protocol_type,
            protocols=[(name, bytes.fromhex(md)) for name, md in obj.get("protocols", [])],
            assignment=bytes.fromhex(obj.get("assignment", "")),
            last_heartbeat=now,
        )


@dataclass
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int
    #: the offset in ``__consumer_offsets`` of the record that committed it (-1: not written)
    record_offset: int = -1


K = TypeVar("K")


def supersedes(record_offset: int, current_record_offset: int | None) -> bool:
    """Whether the record of a partition's offset at ``record_offset`` in ``__consumer_offsets``
    overrides the commit of that partition by the record at ``current_record_offset`` (None: no
    commit): only if it is newer in the log. The log cleaner keeps the newest record of a key, so
    it is the only order a coordinator loading the cleaned log can know: memory follows it too.
    It matters for a transactional commit, applied at its COMMIT marker, not where its record is
    (Kafka's OffsetMetadataManager.replayEndTransactionMarker, KAFKA-14505)."""
    return current_record_offset is None or record_offset > current_record_offset


def commit_offset(offsets: dict[K, OffsetAndMetadata], key: K, om: OffsetAndMetadata) -> bool:
    """``om`` becomes the committed offset of ``key`` unless a newer record committed it;
    returns whether it did."""
    current = offsets.get(key)
    if not supersedes(om.record_offset, None if current is None else current.record_offset):
        return False
    offsets[key] = om
    return True


def delete_offset(
    offsets: dict[K, OffsetAndMetadata],
    pending: dict[int, dict[K, OffsetAndMetadata]],
    key: K,
    record_offset: int,
) -> None:
    """A tombstone of ``key`` at ``record_offset``: the committed offset and the pending
    transactional ones written before it go (their marker will find nothing to apply: the
    cleaner keeps the tombstone over their records); those written after it stay (Kafka's
    OffsetMetadataManager.replay of a tombstone)."""
    current = offsets.get(key)
    if current is not None and supersedes(record_offset, current.record_offset):
        del offsets[key]
    for producer_id in list(pending):
        om = pending[producer_id].get(key)
        if om is not None and supersedes(record_offset, om.record_offset):
            del pending[producer_id][key]
            if not pending[producer_id]:
                del pending[producer_id]


def complete_txn(
    offsets: dict[K, OffsetAndMetadata],
    pending: dict[int, dict[K, OffsetAndMetadata]],
    producer_id: int,
    committed: bool,
) -> int:
    """The transaction of ``producer_id`` ended: on COMMIT each of its pending offsets becomes
    the committed one unless a newer record committed or deleted that key (``commit_offset``;
    a tombstone dropped it already), on ABORT they are dropped. Returns how many were pending."""
    done = pending.pop(producer_id, {})
    if committed:
        for key, om in done.items():
            commit_offset(offsets, key, om)
    return len(done)


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    #: member ids handed out by a MEMBER_ID_REQUIRED answer, not yet joined (KIP-394), with the
    #: time each expires if its member does not join with it.
    pending_members: dict[str, float] = field(default_factory=dict)
    offsets: dict[tuple[str, int], OffsetAndMetadata] = field(default_factory=dict)
    #: offsets committed in a transaction, by producer id, until its marker reaches the group's
    #: partition (TxnOffsetCommit): applied to ``offsets`` on COMMIT, dropped on ABORT
    pending_txn_offsets: dict[int, dict[tuple[str, int], OffsetAndMetadata]] = field(default_factory=dict)
    rebalance_deadline: float = 0.0
    #: no earlier than this, the first rebalance of an empty group completes (initial delay).
    initial_delay_until: float = 0.0
    #: the rebalance under way is the first of an empty group (it waits for no pending member)
    initial_join: bool = False
    #: when the group entered its state (wall-clock ms): for an empty group, when it became
    #: empty, which its offsets' expiry counts from (KIP-211; broker/offset_expiry.py)
    state_timestamp_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)

    def transition(self, new: GroupState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise IllegalTransition(
                f"group {self.group_id}: {self.state.value} -> {new.value} is not allowed"
            )
        self.state = new
        self.state_timestamp_ms = time.time_ns() // 1_000_000

    @property
    def is_empty(self) -> bool:
        return not self.members

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Can a member with these protocols join? (Kafka: same type, a protocol in common.)"""
        if not protocol_type or not protocols:
            return False
        if not self.members:
            return True  # an empty group takes any protocol type, as Kafka's does
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """Each member votes for its most preferred candidate; the most votes wins (ties: the
        first member's preference order), as Kafka does."""
        candidates = self.candidate_protocols()
        assert candidates, f"group {self.group_id} has no protocol in common"
        votes: dict[str, int] = {}
        for m in self.members.values():
            for name, _ in m.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        best = max(votes.values())
        first = next(iter(self.members.values()))
        for name, _ in first.protocols:
            if votes.get(name) == best:
                return name
        return sorted(votes)[0]

    def instance_ids(self) -> dict[str, str | None]:
        """Each member id to its group.instance.id (None: a dynamic member), for the static
        membership rules (``static_membership``)."""
        return {member_id: m.group_instance_id for member_id, m in self.members.items()}

    def rename_member(self, old_id: str, new_id: str) -> Member:
        """Give member ``old_id`` the id ``new_id`` in its place (a static member replaced,
        KIP-345), keeping the members' order (protocol votes and the leader's fallback read it)
        and the leadership with it."""
        assert old_id in self.members and new_id not in self.members, (old_id, new_id)
        member = self.members[old_id]
        member.member_id = new_id
        self.members = {(new_id if k == old_id else k): m for k, m in self.members.items()}
        if self.leader == old_id:
            self.leader = new_id
        return member

    def has_pending_txn_offset(self, tp: tuple[str, int]) -> bool:
        return any(tp in pending for pending in self.pending_txn_offsets.values())

    def complete_txn_offsets(self, producer_id: int, committed: bool) -> int:
        """The transaction of ``producer_id`` ended: its offsets become the committed ones
        unless newer records committed or deleted them (COMMIT) or are dropped (ABORT). Returns
        how many were pending."""
        return complete_txn(self.offsets, self.pending_txn_offsets, producer_id, committed)

    def all_members_joined(self) -> bool:
        """Every member is waiting in a JoinGroup and, but in the first rebalance of an empty
        group, no member id handed out is still to join with it (Kafka's
        ``GroupMetadata.hasAllMembersJoined``; its first rebalance, ``InitialDelayedJoin``,
        completes once group.initial.rebalance.delay.ms has passed, whoever is pending). A member
        that was told MEMBER_ID_REQUIRED joins a moment later, and completing the join without it
        would only start another rebalance, which the members already in the group learn of at
        their next heartbeat (and with cooperative assignors one more after it). A pending id that
        is not used expires after its session timeout."""
        if self.pending_members and not self.initial_join:
            return False
        return all(m.awaiting_join for m in self.members.values())

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def to_record(self) -> dict[str, Any]:
        return {
            "protocol_type": self.protocol_type,
            "protocol": self.protocol,
            "generation": self.generation,
            "leader": self.leader,
            "members": [m.to_record() for m in self.members.values()],
            "state_ts": self.state_timestamp_ms,
        }

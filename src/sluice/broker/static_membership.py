"""Static group membership (KIP-345) as pure rules over plain data.

A member that joins with a ``group.instance.id`` is static: the instance id, not the member id,
names it across restarts. The coordinator (``coordinator.py``) keeps the instance id on the
member (persisted with the group) and asks these rules what a request means; they look only at
``instance_ids`` (each member id to its instance id, None for a dynamic member), the group's
state and protocols, and never change anything.

The rules, as Kafka's classic group coordinator applies them:

- A JoinGroup with an unknown member id and an instance id the group already has *replaces* that
  member: the new member id takes the old one's place, keeps its assignment, and the old member
  id is fenced (whatever it was waiting on, and anything it sends after, is answered
  FENCED_INSTANCE_ID). In a Stable group whose protocol would not change, that is all: the
  member gets the current generation back and syncs its old assignment, and no other member
  rebalances (``rejoin_outcome``). This is what lets a consumer restart within its session
  timeout without moving any partition.
- A request from a member id that is not the instance's current one is FENCED_INSTANCE_ID
  (``member_error``): two live processes with one instance id, and the older one stops.
- A new static member joins at once: KIP-394's MEMBER_ID_REQUIRED round trip is for dynamic
  members only.
- LeaveGroup (v3+) may name a member by instance id alone (``leave_ruling``), which removes it and
  starts a rebalance: an operator's way to move a static member's partitions at once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.broker.group import GroupState
from sluice.protocol.errors import ErrorCode

__all__ = [
    "JoinAction",
    "JoinRuling",
    "LeaveRuling",
    "RejoinOutcome",
    "join_ruling",
    "leave_ruling",
    "member_error",
    "owner_of",
    "rejoin_outcome",
]

S = GroupState

#: member id -> its group.instance.id (None: a dynamic member)
InstanceIds = Mapping[str, "str | None"]


class JoinAction(enum.Enum):
    DYNAMIC = "dynamic"  # no instance id: the classic rules
    NEW_STATIC = "new-static"  # a new member id for an instance the group does not have
    KNOWN = "known"  # the instance's current member id rejoining
    REPLACE = "replace"  # an unknown member id for an instance the group has
    REFUSED = "refused"  # answered with ``error``


@dataclass(frozen=True, slots=True)
class JoinRuling:
    action: JoinAction
    error: ErrorCode = ErrorCode.NONE
    #: for REPLACE: the member id being replaced
    replaces: str | None = None


class RejoinOutcome(enum.Enum):
    KEEP_ASSIGNMENT = "keep-assignment"  # Stable, protocol unchanged: answer now, nobody rebalances
    REBALANCE = "rebalance"  # the group must rebalance for the new member id
    JOIN_REBALANCE = "join-rebalance"  # a rebalance is under way: wait for it like every member


@dataclass(frozen=True, slots=True)
class LeaveRuling:
    error: ErrorCode
    #: the member id to remove (None: nothing to remove)
    remove: str | None = None
    #: a KIP-394 pending member id to forget
    forget_pending: str | None = None


def owner_of(instance_ids: InstanceIds, instance_id: str) -> str | None:
    """The member id that currently holds ``instance_id``, None if no member does."""
    for member_id, held in instance_ids.items():
        if held == instance_id:
            return member_id
    return None


def is_fenced(instance_ids: InstanceIds, member_id: str, instance_id: str | None) -> bool:
    """Whether ``member_id`` speaks for an instance another member id now holds."""
    if instance_id is None:
        return False
    owner = owner_of(instance_ids, instance_id)
    return owner is not None and owner != member_id


def member_error(instance_ids: InstanceIds, member_id: str, instance_id: str | None) -> ErrorCode:
    """SyncGroup, Heartbeat and OffsetCommit from a member: FENCED_INSTANCE_ID for a member id an
    instance's newer member replaced, UNKNOWN_MEMBER_ID for one the group does not have."""
    if is_fenced(instance_ids, member_id, instance_id):
        return ErrorCode.FENCED_INSTANCE_ID
    if member_id not in instance_ids:
        return ErrorCode.UNKNOWN_MEMBER_ID
    return ErrorCode.NONE


def join_ruling(
    instance_ids: InstanceIds, pending: frozenset[str] | set[str], member_id: str, instance_id: str | None
) -> JoinRuling:
    """What a JoinGroup is, before the classic rules (protocols, group size) apply to it."""
    if instance_id is None:
        return JoinRuling(JoinAction.DYNAMIC)
    owner = owner_of(instance_ids, instance_id)
    if not member_id:
        if owner is None:
            return JoinRuling(JoinAction.NEW_STATIC)
        return JoinRuling(JoinAction.REPLACE, replaces=owner)
    if owner is not None and owner != member_id:
        return JoinRuling(JoinAction.REFUSED, ErrorCode.FENCED_INSTANCE_ID)
    if owner is None or member_id in pending:
        # a member id for an instance the group does not know (it expired, or was removed)
        return JoinRuling(JoinAction.REFUSED, ErrorCode.UNKNOWN_MEMBER_ID)
    return JoinRuling(JoinAction.KNOWN)


def rejoin_outcome(
    state: GroupState, current_protocol: str | None, next_protocol: str | None
) -> RejoinOutcome:
    """After a static member was replaced: a Stable group whose selected protocol stays the same
    keeps every assignment (the new member id syncs the old one's); a group that was completing a
    rebalance must rebalance again (the leader may be assigning to the old member id); a group
    preparing one takes the member into it."""
    if state is S.STABLE:
        if next_protocol is not None and next_protocol == current_protocol:
            return RejoinOutcome.KEEP_ASSIGNMENT
        return RejoinOutcome.REBALANCE
    if state is S.COMPLETING_REBALANCE:
        return RejoinOutcome.REBALANCE
    if state is S.PREPARING_REBALANCE:
        return RejoinOutcome.JOIN_REBALANCE
    raise AssertionError(f"a group in state {state.value} has no static member to replace")


def leave_ruling(
    instance_ids: InstanceIds, pending: frozenset[str] | set[str], member_id: str, instance_id: str | None
) -> LeaveRuling:
    """One member of a LeaveGroup: by member id, or (v3+, member id empty) by instance id alone."""
    if not member_id:
        owner = owner_of(instance_ids, instance_id) if instance_id is not None else None
        if owner is None:
            return LeaveRuling(ErrorCode.UNKNOWN_MEMBER_ID)
        return LeaveRuling(ErrorCode.NONE, remove=owner)
    if member_id in pending:
        return LeaveRuling(ErrorCode.NONE, forget_pending=member_id)
    if is_fenced(instance_ids, member_id, instance_id):
        return LeaveRuling(ErrorCode.FENCED_INSTANCE_ID)
    if member_id in instance_ids:
        return LeaveRuling(ErrorCode.NONE, remove=member_id)
    return LeaveRuling(ErrorCode.UNKNOWN_MEMBER_ID)

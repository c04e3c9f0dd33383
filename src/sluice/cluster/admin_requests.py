"""The admin requests the controller carries out on its own thread, under its term (I4):
adding partitions (CreatePartitions), electing leaders (ElectLeaders and the automatic
rebalance to preferred replicas) and changing the pending reassignments
(AlterPartitionReassignments).

A broker hands each request to ``Controller.run_admin``; each function here reads what it needs,
asks a pure rule what to do (``partition_growth.plan_growth``, ``election.requested_election``,
``election.imbalanced_partitions``, ``reassignment.merge_reassignments``) and writes through
the controller's fenced gate (``ZkStore.commit_fenced`` / ``commit_fenced_many``), every write
conditional on the version it was decided from. A deposed controller's write fails its epoch
check and changes nothing (ControllerDeposedError: the request is answered NOT_CONTROLLER).
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import orjson
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from sluice import metrics
from sluice.cluster import layout
from sluice.cluster.election import (
    PREFERRED,
    UNCLEAN,
    PartitionLeadership,
    imbalanced_partitions,
    requested_election,
)
from sluice.cluster.layout import PartitionState, StateWrite, TopicAssignment
from sluice.cluster.partition_growth import Growth, growth_start_index, plan_growth
from sluice.cluster.reassignment import ReassignmentRequest, merge_reassignments
from sluice.cluster.zkstore import ControllerTerm, FencedOp
from sluice.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from sluice.cluster.view import ClusterView
    from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.controller")

Key = tuple[str, int]
Outcome = tuple[ErrorCode, str | None]
#: rounds of an election whose conditional write lost to another writer (the state is read again)
ELECTION_ROUNDS_MAX = 3


class Controller(Protocol):
    """What the admin requests need of the controller (controller.py ``Controller``): its store
    (the fenced gate), its view of the cluster, and the partitions it keeps out of elections."""

    store: ZkStore
    view: ClusterView
    broker_id: int
    reassigning: bool

    def excluded_from(self, key: tuple[str, int]) -> frozenset[int]: ...


def unclean_audit_op(topic: str, p: int, elected: PartitionState, replaced: PartitionState) -> FencedOp:
    """The audit record of an unclean election, written in the same multi-op as the election.

    Records from the new leader's log end offset on (``lost_from_offset``, filled in by the
    new leader when it takes over) that the old in-sync replicas had may be lost.
    """
    log.warning(
        "event=unclean_leader_election partition=%s-%d leader=%d leader_epoch=%d isr_was=%s",
        topic,
        p,
        elected.leader,
        elected.leader_epoch,
        list(replaced.isr),
    )
    record = orjson.dumps(
        {
            "version": 1,
            "topic": topic,
            "partition": p,
            "new_leader": elected.leader,
            "leader_epoch": elected.leader_epoch,
            "previous_leader": replaced.leader,
            "previous_isr": list(replaced.isr),
            "time_ms": int(time.time() * 1000),
            "lost_from_offset": None,
            "note": "records at or after lost_from_offset that the previous ISR held may be lost",
        }
    )
    return FencedOp("create", layout.unclean_election_path(topic, p, elected.leader_epoch), record)


def _live(controller: Controller) -> set[int]:
    """Registered brokers that are not in controlled shutdown: the ones that may lead."""
    view = controller.view
    return set(view.brokers()) - set(view.shutting_down())


# -- CreatePartitions --------------------------------------------------------------------------


def add_partitions(
    controller: Controller,
    term: ControllerTerm,
    topic: str,
    count: int,
    assignments: Sequence[Sequence[int]] | None,
    *,
    validate_only: bool,
) -> Growth:
    """Grow ``topic`` to ``count`` partitions: the new assignment is written conditional on the
    topic znode's version as read, so a concurrent write (a config change, a move) is never lost:
    the topic is read and decided again. The next pass creates the new partitions' states."""
    for _round in range(ELECTION_ROUNDS_MAX):
        found = controller.store.topic_with_version(topic)
        if found is None or topic in controller.store.topics_marked_for_deletion():
            return Growth({}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist")
        assignment, version = found
        if topic in layout.INTERNAL_TOPICS:
            return Growth(
                {},
                ErrorCode.INVALID_REQUEST,
                f"{topic} is an internal topic: every group's place in it follows its partition count, "
                "so it cannot grow; nothing was changed",
            )
        live = _live(controller)
        fallback = zlib.crc32(topic.encode()) % max(1, len(live))
        start = growth_start_index(assignment.replicas, live, fallback)
        growth = plan_growth(topic, assignment.replicas, count, assignments, live, start_index=start)
        if growth.error is not ErrorCode.NONE or validate_only:
            return growth
        grown = TopicAssignment(
            topic, assignment.topic_id, {**assignment.replicas, **growth.added}, assignment.config
        )
        try:
            controller.store.commit_fenced(
                term.epoch_zk_version, [FencedOp("set", layout.topic_path(topic), grown.encode(), version)]
            )
        except (BadVersionError, NoNodeError):
            continue  # the topic changed meanwhile: read it and decide again
        log.info(
            "event=partitions_added controller_epoch=%d topic=%s partitions=%d->%d added=%s",
            term.epoch,
            topic,
            len(assignment.replicas),
            count,
            {p: list(r) for p, r in sorted(growth.added.items())},
        )
        return growth
    return Growth(
        {},
        ErrorCode.UNKNOWN_SERVER_ERROR,
        f"topic {topic!r} kept changing while its partitions were being added; nothing was changed, "
        "ask again",
    )


# -- ElectLeaders and the automatic rebalance ---------------------------------------------------


def elect_leaders(
    controller: Controller, term: ControllerTerm, partitions: Sequence[Key], election_type: int
) -> dict[Key, Outcome]:
    """Elect ``partitions``' leaders by ``election_type`` (PREFERRED or UNCLEAN). Each partition
    is answered NONE once its new state is written, or with the rule's refusal."""
    view = controller.view
    results: dict[Key, Outcome] = {}
    todo = list(dict.fromkeys(partitions))
    for _round in range(ELECTION_ROUNDS_MAX):
        if not todo:
            break
        live = _live(controller)
        groups: list[tuple[list[FencedOp], list[StateWrite]]] = []
        changes: dict[Key, str] = {}
        for key in todo:
            topic, p = key
            assignment = view.topic(topic)
            held = view.partition_state(topic, p)
            if assignment is None or p not in assignment.replicas:
                results[key] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{topic}-{p} does not exist")
                continue
            if held is None:
                results[key] = (ErrorCode.LEADER_NOT_AVAILABLE, f"{topic}-{p} is being created")
                continue
            state, version = held
            replicas = assignment.replicas[p]
            eligible = live - controller.excluded_from(key)
            answer = requested_election(state, replicas, eligible, election_type, controller_epoch=term.epoch)
            if answer.decision is None:
                results[key] = (answer.error, answer.message)
                continue
            new = answer.decision.state
            ops = [FencedOp("set", layout.partition_state_path(topic, p), new.encode(), version)]
            if answer.decision.unclean:
                ops.append(unclean_audit_op(topic, p, new, state))
            groups.append((ops, [StateWrite(topic, assignment.topic_id, p, new, version + 1)]))
            kind = (
                "preferred"
                if election_type == PREFERRED
                else "unclean"
                if answer.decision.unclean
                else "clean"
            )
            changes[key] = (
                f"{topic}-{p}:leader {state.leader}->{new.leader} epoch={new.leader_epoch} "
                f"isr={list(new.isr)} reason={kind}_election"
            )
        todo = []
        if not groups:
            break
        outcomes = controller.store.commit_fenced_many(
            term.epoch_zk_version, groups, writer=f"controller {controller.broker_id} epoch {term.epoch}"
        )
        for outcome in outcomes:
            keys = [(w.topic, w.partition) for w in outcome.writes]
            if outcome.error is not None:
                # Someone wrote the state meanwhile (a leader's ISR change): read it again and
                # decide again from what it is now.
                for topic in {k[0] for k in keys}:
                    view.read_states(topic, [k[1] for k in keys if k[0] == topic])
                todo.extend(keys)
                continue
            view.apply_writes(outcome.writes, notice=outcome.notice)
            for key in keys:
                results[key] = (ErrorCode.NONE, None)
                metrics.LEADER_ELECTIONS.inc()
                log.info("event=partition_state_changed controller_epoch=%d %s", term.epoch, changes[key])
    for key in todo:
        results[key] = (
            ErrorCode.UNKNOWN_SERVER_ERROR,
            f"{key[0]}-{key[1]}'s state kept changing while the election was written; ask again",
        )
    return results


def all_partitions(controller: Controller) -> list[Key]:
    """Every partition the controller knows (ElectLeaders without a list of partitions)."""
    return [(name, p) for name, t in sorted(controller.view.topics().items()) for p in sorted(t.replicas)]


def rebalance_leaders(controller: Controller, term: ControllerTerm, imbalance_percentage: int) -> int:
    """One check of the automatic rebalance: preferred elections for the partitions
    ``imbalanced_partitions`` picks, leaving out those being moved or deleted. Returns how many
    leaderships moved."""
    view = controller.view
    pending = controller.store.reassignment_request()
    moving = {(m.topic, m.partition) for m in pending[0]} if pending else set()
    deleting = set(controller.store.topics_marked_for_deletion())
    leaderships = []
    for name, assignment in view.topics().items():
        if name in deleting:
            continue
        for p, replicas in assignment.replicas.items():
            held = view.partition_state(name, p)
            if held is not None and (name, p) not in moving:
                leaderships.append(PartitionLeadership(name, p, replicas, held[0]))
    chosen = imbalanced_partitions(leaderships, _live(controller), imbalance_percentage)
    if not chosen:
        return 0
    results = elect_leaders(controller, term, chosen, PREFERRED)
    moved = sum(1 for error, _ in results.values() if error is ErrorCode.NONE)
    log.info(
        "event=leader_rebalance controller_epoch=%d candidates=%d moved=%d", term.epoch, len(chosen), moved
    )
    return moved


# -- AlterPartitionReassignments ------------------------------------------------------------------


def alter_reassignments(
    controller: Controller,
    term: ControllerTerm,
    requests: Sequence[ReassignmentRequest],
    *,
    allow_replication_factor_change: bool,
) -> dict[Key, Outcome]:
    """Merge ``requests`` into ``/admin/reassign_partitions`` with one fenced write conditional
    on the znode's version; the controller's passes then move the partitions in phases, as for
    a drain (``Controller._reassign``)."""
    topics: Mapping[str, TopicAssignment] = controller.view.topics()
    live = _live(controller)
    for _round in range(ELECTION_ROUNDS_MAX):
        current = controller.store.reassignment_request()
        pending, version = current if current is not None else ([], -1)
        merged = merge_reassignments(
            pending, requests, topics, live, allow_replication_factor_change=allow_replication_factor_change
        )
        if merged.moves == pending:
            return merged.results
        path = layout.REASSIGN_PARTITIONS
        if not merged.moves:
            op = FencedOp("delete", path, version=version)
        elif current is None:
            op = FencedOp("create", path, layout.encode_reassignments(merged.moves))
        else:
            op = FencedOp("set", path, layout.encode_reassignments(merged.moves), version)
        try:
            controller.store.commit_fenced(term.epoch_zk_version, [op])
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue  # the controller's own pass (or a drain) changed the list: merge again
        for m in merged.moves:
            if m not in pending:
                log.info(
                    "event=reassignment_requested controller_epoch=%d partition=%s-%d from=%s to=%s",
                    term.epoch,
                    m.topic,
                    m.partition,
                    list(m.original or ()),
                    list(m.replicas),
                )
        controller.reassigning = True
        return merged.results
    return {
        (r.topic, r.partition): (
            ErrorCode.UNKNOWN_SERVER_ERROR,
            "the pending reassignments kept changing while this request was merged; ask again",
        )
        for r in requests
    }


__all__ = [
    "PREFERRED",
    "UNCLEAN",
    "add_partitions",
    "all_partitions",
    "alter_reassignments",
    "elect_leaders",
    "rebalance_leaders",
]

"""Leader election rules: small pure functions over plain data, as Kafka's controller has them.

Each rule answers one question for one partition and returns the new leader and ISR, or
``None`` when no leader can be chosen by that rule. The controller does the I/O around them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from sluice.cluster.layout import PartitionState
from sluice.protocol.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class Election:
    leader: int
    isr: tuple[int, ...]


def offline_partition_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> Election | None:
    """Clean election: the first live replica that is in the ISR, in assignment order.

    The new ISR keeps only live members; it is never empty because the leader is in it.
    """
    for replica in assignment:
        if replica in isr and replica in live:
            new_isr = tuple(r for r in isr if r in live)
            return Election(replica, new_isr)
    return None


def unclean_partition_leader(assignment: Sequence[int], live: Collection[int]) -> Election | None:
    """Unclean election: any live replica, used only when the topic allows it (may lose data)."""
    for replica in assignment:
        if replica in live:
            return Election(replica, (replica,))
    return None


def controlled_shutdown_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int], shutting_down: Collection[int]
) -> Election | None:
    """Move leadership off brokers that are shutting down, to a live ISR member that is not."""
    for replica in assignment:
        if replica in isr and replica in live and replica not in shutting_down:
            new_isr = tuple(r for r in isr if r not in shutting_down)
            return Election(replica, new_isr)
    return None


def preferred_replica_leader(
    assignment: Sequence[int], isr: Sequence[int], live: Collection[int]
) -> Election | None:
    """Give leadership back to the first assigned replica when it is live and in sync."""
    if not assignment:
        return None
    preferred = assignment[0]
    if preferred in live and preferred in isr:
        return Election(preferred, tuple(isr))
    return None


def offline_state_isr(isr: Sequence[int], live: Collection[int]) -> tuple[int, ...]:
    """The ISR to record when a partition loses its leader and no live ISR member remains.

    The ISR is never written empty (I6): the dead members stay, so the partition comes back
    when one of them does, and no out-of-sync replica can become leader by accident.
    """
    kept = tuple(r for r in isr if r in live)
    return kept if kept else tuple(isr)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the controller writes for one partition: the new state, and whether it came from
    an unclean election (then an audit record is written with it)."""

    state: PartitionState
    unclean: bool = False


def next_partition_state(
    state: PartitionState,
    replicas: Sequence[int],
    live: Collection[int],
    shutting_down: Collection[int],
    *,
    unclean_allowed: bool,
    controller_epoch: int,
) -> Decision | None:
    """The one place that decides a partition's next state from its current one (None: leave
    it). `live` excludes brokers in controlled shutdown and brokers that re-registered since the
    controller last looked (a new broker epoch: their partitions are handled as if they had died,
    so leadership and leader epochs move on and followers truncate again)."""
    if state.leader in shutting_down:
        # Controlled shutdown: hand leadership to another live ISR member before the broker
        # stops; with none (replication factor 1, the rest out of sync) it stays, and goes
        # offline when the broker stops unless it was drained first.
        election = controlled_shutdown_leader(
            replicas, state.isr, set(live) | set(shutting_down), shutting_down
        )
        if election is None:
            return None
        return Decision(
            PartitionState(election.leader, state.leader_epoch + 1, election.isr, controller_epoch)
        )
    if state.leader != -1 and state.leader in live:
        # Followers that died or are shutting down leave the ISR, so acks=all writes stop
        # waiting for them (OnlineReplica -> OfflineReplica); the leader stays, and so does its
        # epoch. The leader is never removed here, so the ISR is never empty (I6).
        leaving = {r for r in state.isr if r not in live and r != state.leader}
        if not leaving:
            return None
        isr = tuple(r for r in state.isr if r not in leaving)
        return Decision(PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch))
    election = offline_partition_leader(replicas, state.isr, live)
    if election is not None:
        return Decision(
            PartitionState(election.leader, state.leader_epoch + 1, election.isr, controller_epoch)
        )
    if unclean_allowed:
        election = unclean_partition_leader(replicas, live)
        if election is not None:
            return Decision(
                PartitionState(election.leader, state.leader_epoch + 1, election.isr, controller_epoch),
                unclean=True,
            )
    if state.leader == -1:
        return None
    return Decision(
        PartitionState(-1, state.leader_epoch + 1, offline_state_isr(state.isr, live), controller_epoch)
    )


def initial_partition_state(
    replicas: Sequence[int], live: Collection[int], controller_epoch: int
) -> PartitionState:
    """A new partition's first state: the first live replica leads; with none live, it starts
    offline with every replica in the ISR (none has data yet, so each is in sync)."""
    live_replicas = tuple(r for r in replicas if r in live)
    if live_replicas:
        return PartitionState(live_replicas[0], 0, live_replicas, controller_epoch)
    return PartitionState(-1, 0, tuple(replicas), controller_epoch)


# -- elections on request (ElectLeaders, KIP-460) and the automatic rebalance --------------------

#: ElectLeaders' election types (Kafka's ElectionType).
PREFERRED = 0
UNCLEAN = 1


@dataclass(frozen=True, slots=True)
class RequestedElection:
    """The answer to a requested election of one partition: the state to write (None: nothing
    to write) and Kafka's error code with a message naming why not."""

    decision: Decision | None
    error: ErrorCode = ErrorCode.NONE
    message: str | None = None


def requested_election(
    state: PartitionState,
    replicas: Sequence[int],
    live: Collection[int],
    election_type: int,
    *,
    controller_epoch: int,
) -> RequestedElection:
    """ElectLeaders for one partition (``live`` excludes brokers in controlled shutdown).

    PREFERRED gives leadership to the first assigned replica when it is live and in the ISR;
    the ISR stays as it is and the leader epoch moves on, so the old leader becomes a follower
    that truncates by epoch (I2) and nothing committed is lost. UNCLEAN elects only for a
    partition without a live leader: an in-sync replica if one is live, else any live replica
    (which may lose the records only the dead in-sync replicas had)."""
    if election_type == PREFERRED:
        if not replicas:
            return RequestedElection(
                None, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the partition has no replicas"
            )
        preferred = replicas[0]
        if state.leader == preferred:
            return RequestedElection(
                None, ErrorCode.ELECTION_NOT_NEEDED, f"the preferred replica {preferred} already leads"
            )
        election = preferred_replica_leader(replicas, state.isr, live)
        if election is None:
            where = "not live" if preferred not in live else f"not in the ISR {list(state.isr)}"
            return RequestedElection(
                None,
                ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                f"the preferred replica {preferred} is {where}; leadership stays with {state.leader}",
            )
        new = PartitionState(preferred, state.leader_epoch + 1, state.isr, controller_epoch)
        return RequestedElection(Decision(new))
    if election_type == UNCLEAN:
        if state.leader >= 0 and state.leader in live:
            return RequestedElection(
                None, ErrorCode.ELECTION_NOT_NEEDED, f"broker {state.leader} leads; no election is needed"
            )
        clean = offline_partition_leader(replicas, state.isr, live)
        if clean is not None:
            new = PartitionState(clean.leader, state.leader_epoch + 1, clean.isr, controller_epoch)
            return RequestedElection(Decision(new))
        unclean = unclean_partition_leader(replicas, live)
        if unclean is None:
            return RequestedElection(
                None,
                ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"no replica of {list(replicas)} is live; bring one back",
            )
        new = PartitionState(unclean.leader, state.leader_epoch + 1, unclean.isr, controller_epoch)
        return RequestedElection(Decision(new, unclean=True))
    return RequestedElection(None, ErrorCode.INVALID_REQUEST, f"unknown election type {election_type}")


@dataclass(frozen=True, slots=True)
class PartitionLeadership:
    """What the automatic rebalance looks at for one partition."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    state: PartitionState


def imbalanced_partitions(
    partitions: Iterable[PartitionLeadership], live: Collection[int], imbalance_percentage: int
) -> list[tuple[str, int]]:
    """The partitions the automatic rebalance gives back to their preferred replica (Kafka's
    ``auto.leader.rebalance.enable``): for each broker, the share of the partitions it is
    preferred for that another broker leads; past ``imbalance_percentage`` percent, each such
    partition whose preferred replica is live and in the ISR is elected back."""
    by_preferred: dict[int, list[PartitionLeadership]] = {}
    for p in partitions:
        if p.replicas:
            by_preferred.setdefault(p.replicas[0], []).append(p)
    moves: list[tuple[str, int]] = []
    for broker, preferred_for in sorted(by_preferred.items()):
        if broker not in live:
            continue
        elsewhere = [p for p in preferred_for if p.state.leader != broker]
        if not elsewhere or len(elsewhere) * 100 <= imbalance_percentage * len(preferred_for):
            continue
        moves.extend((p.topic, p.partition) for p in elsewhere if broker in p.state.isr)
    return sorted(moves)

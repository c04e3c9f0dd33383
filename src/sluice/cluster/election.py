"""Leader election rules: small pure functions over plain data, as Kafka's controller has them.

Each rule answers one question for one partition and returns the new leader and ISR, or
``None`` when no leader can be chosen by that rule. The controller does the I/O around them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


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

"""The rules of replication as pure functions over plain data (I1-I3, I6).

- ``high_watermark_for``: the high watermark a leader may expose.
- ``followers_out_of_sync``: which ISR members the leader removes.
- ``can_join_isr``: when a follower is back in sync (KAFKA-7128).
- ``isr_eligible``: which brokers may be in an ISR at all (KIP-841).
- ``truncation_step``: where a new follower cuts its log before fetching, or which epoch it
  asks the leader about next (KIP-101, KIP-279).
- ``preferred_read_replica``: which replica a consumer in a rack should read from (KIP-392).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


def high_watermark_for(
    current_hw: int,
    leader_leo: int,
    isr: Sequence[int],
    follower_leos: Mapping[int, int],
    leader_id: int,
    min_isr: int,
    joining: Collection[int] = (),
) -> int:
    """The smallest end offset among ISR members and members joining it (I3).

    It never moves backwards, never passes any ISR member's end offset, and does not advance
    while the ISR is smaller than ``min_isr`` (a record on fewer replicas is not safe to expose).
    ``joining`` are followers whose addition to the ISR is being written (KIP-497's maximal ISR):
    they count for the minimum at once, so that the high watermark cannot pass a replica that is
    about to be in the ISR; ``min_isr`` is checked against the written ISR only.
    """
    if len(isr) < min_isr:
        return current_hw
    candidate = leader_leo
    for replica in (*isr, *joining):
        if replica != leader_id:
            candidate = min(candidate, follower_leos.get(replica, current_hw))
    return max(current_hw, candidate)


def followers_out_of_sync(
    isr: Sequence[int],
    leader_id: int,
    last_caught_up_ms: Mapping[int, float],
    now_ms: float,
    lag_max_ms: float,
) -> list[int]:
    """ISR followers that have not caught up for longer than ``replica.lag.time.max.ms``.

    The leader is never removed, so the ISR is never written empty (I6).
    """
    return [
        r for r in isr if r != leader_id and now_ms - last_caught_up_ms.get(r, -float("inf")) > lag_max_ms
    ]


def can_join_isr(follower_leo: int, high_watermark: int, leader_epoch_start_offset: int) -> bool:
    """A follower rejoins the ISR once it has everything committed *and* everything of the current
    leader epoch up to now started (KAFKA-7128: otherwise a replica that missed the start of the
    epoch could become leader and lose records the old ISR acknowledged)."""
    return follower_leo >= high_watermark and follower_leo >= leader_epoch_start_offset


def isr_eligible(replica: int, live: Collection[int], shutting_down: Collection[int]) -> bool:
    """Whether a leader may add ``replica`` to an ISR: a broker registered in ``/brokers/ids``
    (``live``) and not in controlled shutdown (KIP-841: a fenced or shutting-down broker is not
    ISR-eligible). The controller drops such brokers from every ISR; a leader that added them
    back on the strength of a fetch would undo its shrink, and an acks=all record would count a
    copy on a broker that is gone or leaving."""
    return replica in live and replica not in shutting_down


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Truncation is decided: cut the log at ``offset``, then fetch from there."""

    offset: int


@dataclass(frozen=True, slots=True)
class AskAgain:
    """The leader answered with an epoch this follower does not have: ask the leader for the end
    of ``epoch``, the largest epoch this follower has below that answer (KIP-279)."""

    epoch: int


def local_epoch_end(epochs: Sequence[tuple[int, int]], log_end_offset: int, epoch: int) -> tuple[int, int]:
    """(largest local epoch <= ``epoch``, the offset where it ends here), from ascending
    (epoch, start offset) entries: it ends where the next epoch starts, or at the log end.
    (-1, -1) when every local epoch is above ``epoch``."""
    found = (-1, -1)
    for i, (e, _start) in enumerate(epochs):
        if e > epoch:
            break
        found = (e, epochs[i + 1][1] if i + 1 < len(epochs) else log_end_offset)
    return found


def truncation_step(
    asked_epoch: int,
    local_epochs: Sequence[tuple[int, int]],
    local_leo: int,
    local_hw: int,
    leader_reply_epoch: int,
    leader_reply_end_offset: int,
) -> TruncateTo | AskAgain:
    """One round of truncation by leader epoch (I2).

    The follower asked the leader for the end of ``asked_epoch``; the leader answered with the
    largest epoch it has at or below it (``leader_reply_epoch``) and where that epoch ends on the
    leader. ``local_epochs`` are the follower's (epoch, start offset) entries, ascending.

    - The follower has the leader's epoch: both logs agree up to where the shorter copy of that
      epoch ends; keep exactly that.
    - The follower lacks that epoch: its own records from the largest epoch below it may already
      differ from the leader's, so it asks again for that epoch (KIP-279) rather than trusting
      the end of an epoch it never saw. Each question is about a smaller epoch than the last, so
      a follower asks at most once per local epoch.
    - The follower has no epoch at or below the leader's answer: every record it has is from a
      later epoch than any the leader has up to the answered end; keep nothing from there.
    - The leader cannot answer (no epoch information): fall back to the high watermark, which
      every ISR member has.
    """
    if local_leo == 0 or not local_epochs:
        return TruncateTo(local_leo)
    if leader_reply_epoch < 0 or leader_reply_end_offset < 0 or leader_reply_epoch > asked_epoch:
        # No usable answer (a leader never answers with an epoch above the one asked about).
        return TruncateTo(min(local_hw, local_leo))
    own_epoch, own_end = local_epoch_end(local_epochs, local_leo, leader_reply_epoch)
    if own_epoch == leader_reply_epoch:
        return TruncateTo(min(leader_reply_end_offset, own_end, local_leo))
    if own_epoch < 0:
        return TruncateTo(min(leader_reply_end_offset, local_epochs[0][1], local_leo))
    assert own_epoch < asked_epoch, "each question is about a smaller epoch, so the rounds are bounded"
    return AskAgain(own_epoch)


@dataclass(frozen=True, slots=True)
class ReadReplica:
    """What a leader knows of one replica when a consumer asks it for records (KIP-392)."""

    broker_id: int
    rack: str | None
    log_start_offset: int
    log_end_offset: int
    #: how long ago the replica last had everything the leader had (0 for the leader)
    since_caught_up_ms: float = 0.0


def preferred_read_replica(
    client_rack: str | None, leader: ReadReplica, followers: Sequence[ReadReplica], isr: Collection[int],
    fetch_offset: int,
) -> int | None:  # fmt: skip
    """The follower a consumer in ``client_rack`` should fetch from, or None for the leader:
    Kafka's RackAwareReplicaSelector over the candidates of ReplicaManager.findPreferredReadReplica.
    Candidates are the leader and the in-sync followers that hold ``fetch_offset``; among those
    in the consumer's rack the leader is kept if it is one, else the follower with the largest
    log end, then the most recently caught up, then the largest id."""
    if not client_rack:
        return None
    candidates = [
        f for f in followers if f.broker_id in isr and f.log_start_offset <= fetch_offset <= f.log_end_offset
    ]
    same_rack = [r for r in candidates if r.rack == client_rack]
    if leader.rack == client_rack or not same_rack:
        return None
    best = max(same_rack, key=lambda r: (r.log_end_offset, -r.since_caught_up_ms, r.broker_id))
    return best.broker_id

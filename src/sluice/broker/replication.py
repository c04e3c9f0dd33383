"""The rules of replication as pure functions over plain data (I1-I3, I6).

- ``high_watermark_for``: the high watermark a leader may expose.
- ``followers_out_of_sync``: which ISR members the leader removes.
- ``can_join_isr``: when a follower is back in sync (KAFKA-7128).
- ``truncation_offset``: where a new follower cuts its log before fetching (KIP-101, KIP-279).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence


def high_watermark_for(
    current_hw: int,
    leader_leo: int,
    isr: Sequence[int],
    follower_leos: Mapping[int, int],
    leader_id: int,
    min_isr: int,
) -> int:
    """The smallest end offset among ISR members (I3).

    It never moves backwards, never passes any ISR member's end offset, and does not advance
    while the ISR is smaller than ``min_isr`` (a record on fewer replicas is not safe to expose).
    """
    if len(isr) < min_isr:
        return current_hw
    candidate = leader_leo
    for replica in isr:
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


def truncation_offset(
    local_epoch: int,
    local_leo: int,
    local_hw: int,
    leader_reply_epoch: int,
    leader_reply_end_offset: int,
    local_end_offset_for: Callable[[int], int],
) -> int:
    """Where a follower truncates before it fetches from a new leader (I2).

    The follower asked the leader for the end offset of its own latest epoch ``local_epoch``.
    - The leader knows that epoch: keep up to where the leader's copy of it ends.
    - The leader's latest epoch at or below ours is older: our later epochs diverged; keep up
      to where both the leader's and our own copy of the leader's epoch end (KIP-279).
    - The leader cannot answer (no epoch information): fall back to the high watermark, which
      every ISR member has.
    """
    if local_epoch < 0 or local_leo == 0:
        return local_leo
    if leader_reply_epoch < 0 or leader_reply_end_offset < 0:
        return min(local_hw, local_leo)
    if leader_reply_epoch == local_epoch:
        return min(leader_reply_end_offset, local_leo)
    return min(leader_reply_end_offset, local_end_offset_for(leader_reply_epoch), local_leo)

"""The replication and election rules as pure functions (I1-I6)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.broker.replication import (
    AskAgain,
    ReadReplica,
    TruncateTo,
    can_join_isr,
    followers_out_of_sync,
    high_watermark_for,
    preferred_read_replica,
    truncation_step,
)
from sluice.cluster.election import (
    controlled_shutdown_leader,
    offline_partition_leader,
    offline_state_isr,
    preferred_replica_leader,
    unclean_partition_leader,
)

brokers = st.lists(st.integers(1, 6), min_size=1, max_size=5, unique=True)


def test_offline_election_takes_first_live_isr_member_in_assignment_order() -> None:
    e = offline_partition_leader([3, 1, 2], [1, 2], live={1, 2})
    assert e is not None and e.leader == 1 and e.isr == (1, 2)
    assert offline_partition_leader([3, 1, 2], [3], live={1, 2}) is None


def test_unclean_election_takes_any_live_replica() -> None:
    e = unclean_partition_leader([3, 1, 2], live={2})
    assert e is not None and (e.leader, e.isr) == (2, (2,))


def test_controlled_shutdown_moves_leadership_off_the_stopping_broker() -> None:
    e = controlled_shutdown_leader([1, 2, 3], [1, 2, 3], live={1, 2, 3}, shutting_down={1})
    assert e is not None and e.leader == 2 and 1 not in e.isr
    assert controlled_shutdown_leader([1], [1], live={1}, shutting_down={1}) is None


def test_preferred_leader_only_when_live_and_in_sync() -> None:
    assert preferred_replica_leader([1, 2, 3], [2, 3], live={1, 2, 3}) is None
    e = preferred_replica_leader([1, 2, 3], [1, 2, 3], live={1, 2, 3})
    assert e is not None and e.leader == 1


@given(assignment=brokers, data=st.data())
def test_election_never_picks_a_replica_outside_the_isr_or_dead(
    assignment: list[int], data: st.DataObject
) -> None:
    isr = data.draw(st.lists(st.sampled_from(assignment), min_size=1, unique=True))
    live = set(data.draw(st.lists(st.sampled_from(assignment), unique=True)))
    e = offline_partition_leader(assignment, isr, live)
    if e is None:
        assert not (set(isr) & live)
    else:
        assert e.leader in isr and e.leader in live
        assert e.isr and e.leader in e.isr and set(e.isr) <= set(isr) & live


@given(isr=brokers, data=st.data())
def test_isr_is_never_written_empty(isr: list[int], data: st.DataObject) -> None:
    live = set(data.draw(st.lists(st.integers(1, 6), unique=True)))
    assert offline_state_isr(isr, live)


@given(
    hw=st.integers(0, 100),
    leo_extra=st.integers(0, 100),
    isr=brokers,
    min_isr=st.integers(1, 4),
    data=st.data(),
)
def test_high_watermark_never_moves_back_nor_passes_an_isr_member(
    hw: int, leo_extra: int, isr: list[int], min_isr: int, data: st.DataObject
) -> None:
    leader = isr[0]
    leo = hw + leo_extra
    follower_leos = {r: data.draw(st.integers(hw, leo)) for r in isr[1:]}
    new = high_watermark_for(hw, leo, isr, follower_leos, leader, min_isr)
    assert new >= hw
    assert new <= leo
    if len(isr) < min_isr:
        assert new == hw
    else:
        assert all(new <= follower_leos[r] for r in isr[1:]) or new == hw


@given(
    hw=st.integers(0, 100),
    leo_extra=st.integers(0, 100),
    members=st.lists(st.integers(1, 6), min_size=2, max_size=6, unique=True),
    min_isr=st.integers(1, 4),
    data=st.data(),
)
def test_high_watermark_never_passes_an_isr_member_including_one_that_is_joining(
    hw: int, leo_extra: int, members: list[int], min_isr: int, data: st.DataObject
) -> None:
    """KIP-497: while a follower's addition to the ISR is being written, it counts for the high
    watermark (a joining follower has everything below the current one)."""
    leader = members[0]
    leo = hw + leo_extra
    split = data.draw(st.integers(1, len(members) - 1))
    isr, joining = members[:split], members[split:]
    follower_leos = {r: data.draw(st.integers(hw, leo)) for r in members[1:]}
    new = high_watermark_for(hw, leo, isr, follower_leos, leader, min_isr, joining)
    assert new >= hw
    assert new <= leo
    if len(isr) < min_isr:
        assert new == hw, "min.insync.replicas counts the written ISR, not the joining members"
    else:
        assert all(new <= follower_leos[r] for r in members[1:]), "I3, joining members included"


def test_joining_members_do_not_count_for_min_insync_replicas() -> None:
    assert high_watermark_for(5, 20, [1], {2: 20}, 1, 2, joining=[2]) == 5
    assert high_watermark_for(5, 20, [1, 2], {2: 20, 3: 8}, 1, 2, joining=[3]) == 8
    assert high_watermark_for(5, 20, [1, 2], {2: 20}, 1, 2) == 20


@given(now=st.floats(0, 1e9), lag=st.floats(1, 1e5), isr=brokers, data=st.data())
def test_leader_never_removes_itself(now: float, lag: float, isr: list[int], data: st.DataObject) -> None:
    caught_up = {r: data.draw(st.floats(0, 1e9)) for r in isr}
    out = followers_out_of_sync(isr, isr[0], caught_up, now, lag)
    assert isr[0] not in out


def test_rejoin_requires_the_current_epoch_start_kafka_7128() -> None:
    assert not can_join_isr(follower_leo=100, high_watermark=100, leader_epoch_start_offset=120)
    assert can_join_isr(follower_leo=120, high_watermark=100, leader_epoch_start_offset=120)
    assert not can_join_isr(follower_leo=90, high_watermark=100, leader_epoch_start_offset=0)


def test_truncation_same_epoch_keeps_what_the_leader_has() -> None:
    assert truncation_step(3, [(3, 0)], 150, 100, 3, 120) == TruncateTo(120)
    assert truncation_step(3, [(3, 0)], 110, 100, 3, 120) == TruncateTo(110)


def test_truncation_diverged_epoch_cuts_to_the_leaders_end_of_the_common_epoch_kip_279() -> None:
    # We have epoch 4 (a leader that never committed); the leader only knows up to epoch 3,
    # which ends at 105 on the leader and at 108 here: cut at 105.
    assert truncation_step(4, [(3, 0), (4, 108)], 130, 100, 3, 105) == TruncateTo(105)


def test_truncation_without_epoch_information_falls_back_to_the_high_watermark() -> None:
    assert truncation_step(2, [(2, 0)], 130, 100, -1, -1) == TruncateTo(100)


@given(
    epochs=st.lists(st.integers(0, 10), min_size=1, max_size=5, unique=True),
    leo=st.integers(1, 1000),
    hw_frac=st.floats(0, 1),
    reply_epoch=st.integers(-1, 10),
    reply_end=st.integers(-1, 1200),
    data=st.data(),
)
def test_truncation_never_extends_the_log(
    epochs: list[int], leo: int, hw_frac: float, reply_epoch: int, reply_end: int, data: st.DataObject
) -> None:
    hw = int(leo * hw_frac)
    starts = sorted(data.draw(st.lists(st.integers(0, leo), min_size=len(epochs), max_size=len(epochs))))
    local = list(zip(sorted(epochs), starts, strict=True))
    asked = data.draw(st.sampled_from(sorted(epochs)))
    step = truncation_step(asked, local, leo, hw, min(reply_epoch, asked), reply_end)
    if isinstance(step, TruncateTo):
        cut = step.offset
        assert 0 <= cut <= leo
    else:
        assert isinstance(step, AskAgain) and step.epoch < asked and step.epoch in epochs


# -- KIP-392: the replica a consumer in a rack reads from --------------------------------------------


def _replica(
    broker_id: int, rack: str | None, start: int = 0, end: int = 100, since_ms: float = 0.0
) -> ReadReplica:
    return ReadReplica(broker_id, rack, start, end, since_ms)


def test_a_consumer_reads_from_the_leader_without_a_rack_or_when_the_leader_shares_it() -> None:
    leader = _replica(1, "a")
    followers = [_replica(2, "b"), _replica(3, "c")]
    assert preferred_read_replica(None, leader, followers, {1, 2, 3}, 10) is None
    assert preferred_read_replica("", leader, followers, {1, 2, 3}, 10) is None
    assert preferred_read_replica("a", leader, followers, {1, 2, 3}, 10) is None
    assert preferred_read_replica("z", leader, followers, {1, 2, 3}, 10) is None  # nobody in its rack


def test_a_consumer_is_pointed_at_the_most_caught_up_in_sync_follower_of_its_rack() -> None:
    leader = _replica(1, "a")
    followers = [_replica(2, "b", end=90), _replica(3, "b", end=100), _replica(4, "b", end=100, since_ms=50)]
    assert preferred_read_replica("b", leader, followers, {1, 2, 3, 4}, 10) == 3
    # out of the ISR, or without the offset asked for (behind it, or already deleted), it is no candidate
    assert preferred_read_replica("b", leader, followers, {1, 2, 4}, 10) == 4
    assert preferred_read_replica("b", leader, followers, {1, 2, 3, 4}, 95) == 3
    assert preferred_read_replica("b", leader, [_replica(2, "b", start=20)], {1, 2}, 10) is None
    assert preferred_read_replica("b", leader, [_replica(2, "b", end=5)], {1, 2}, 10) is None

"""The follower's side of a fetch session: what each request names, and how it starts over.

Where a test says what fails without a rule of ``fetch_session_client``, that was checked by
taking the rule out; the last test runs the follower's side against the leader's cache.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.fetch_session_client import FetchSessionClient
from sluice.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    FetchSessionCache,
    Key,
    PartitionRequest,
    PartitionResult,
)
from sluice.protocol.errors import ErrorCode

A0, A1, A2 = ("a", 0), ("a", 1), ("a", 2)


def req(offset: int = 0, epoch: int = 3) -> PartitionRequest:
    return PartitionRequest(offset, 1 << 20, epoch, 0)


def established(wanted: dict[Key, PartitionRequest], session_id: int = 77) -> FetchSessionClient:
    client = FetchSessionClient(1)
    plan = client.build(wanted)
    assert client.on_answer(plan, ErrorCode.NONE, session_id)
    return client


def test_first_request_is_full_with_epoch_0_then_incremental_from_epoch_1() -> None:
    client = FetchSessionClient(1)
    plan = client.build({A0: req(), A1: req()})
    assert (plan.session_id, plan.epoch, plan.full) == (INVALID_SESSION_ID, INITIAL_EPOCH, True)
    assert list(plan.to_send) == [A0, A1] and plan.forgotten == []
    assert client.on_answer(plan, ErrorCode.NONE, 77)
    plan = client.build({A0: req(), A1: req()})
    assert (plan.session_id, plan.epoch, plan.full) == (77, 1, False)
    assert client.on_answer(plan, ErrorCode.NONE, 77)
    assert client.build({A0: req(), A1: req()}).epoch == 2


def test_idle_request_names_nothing() -> None:
    """Fails if the incremental request names unchanged partitions (the sessionless cost)."""
    client = established({A0: req(), A1: req()})
    plan = client.build({A0: req(), A1: req()})
    assert plan.to_send == {} and plan.forgotten == []
    assert list(plan.fetching) == [A0, A1], "the leader still reads both"


def test_changed_added_and_removed_partitions() -> None:
    client = established({A0: req(), A1: req()})
    plan = client.build({A0: req(5), A2: req()})
    assert plan.to_send == {A0: req(5), A2: req()}
    assert plan.forgotten == [A1]
    assert client.on_answer(plan, ErrorCode.NONE, 77)
    # a new leader epoch alone is a change: the leader must check the new one
    assert client.build({A0: req(5, epoch=4), A2: req()}).to_send == {A0: req(5, epoch=4)}


def test_unknown_session_starts_a_new_one() -> None:
    client = established({A0: req()})
    plan = client.build({A0: req()})
    assert not client.on_answer(plan, ErrorCode.FETCH_SESSION_ID_NOT_FOUND, INVALID_SESSION_ID)
    plan = client.build({A0: req()})
    assert (plan.session_id, plan.epoch, list(plan.to_send)) == (INVALID_SESSION_ID, INITIAL_EPOCH, [A0])


def test_epoch_error_closes_the_session_as_it_starts_again() -> None:
    client = established({A0: req()})
    plan = client.build({A0: req()})
    assert not client.on_answer(plan, ErrorCode.INVALID_FETCH_SESSION_EPOCH, INVALID_SESSION_ID)
    plan = client.build({A0: req()})
    assert (plan.session_id, plan.epoch, list(plan.to_send)) == (77, INITIAL_EPOCH, [A0])


def test_lost_answer_or_new_connection_starts_again_with_a_full_request() -> None:
    """Fails if ``reset`` keeps the epoch: the leader may or may not have applied the request
    whose answer was lost, so neither epoch is safe to send."""
    client = established({A0: req(), A1: req()})
    client.build({A0: req(4), A1: req()})
    client.reset()
    plan = client.build({A0: req(4), A1: req()})
    assert plan.full and plan.session_id == 77 and list(plan.to_send) == [A0, A1]


def test_no_session_from_the_leader_means_full_requests() -> None:
    client = FetchSessionClient(1)
    plan = client.build({A0: req()})
    assert client.on_answer(plan, ErrorCode.NONE, INVALID_SESSION_ID)
    assert client.build({A0: req()}).full


def test_session_closed_by_the_leader_means_full_requests() -> None:
    client = established({A0: req()})
    plan = client.build({A0: req()})
    assert client.on_answer(plan, ErrorCode.NONE, INVALID_SESSION_ID)
    plan = client.build({A0: req()})
    assert plan.full and plan.session_id == INVALID_SESSION_ID


def test_partition_whose_answer_was_not_used_is_named_again() -> None:
    """Fails if ``name_again`` is ignored: the leader believes its last answer was taken and
    would not send the partition's high watermark again until it next changes."""
    client = established({A0: req(), A1: req()})
    plan = client.build({A0: req(), A1: req()})
    assert client.on_answer(plan, ErrorCode.NONE, 77)
    client.name_again(A1)
    assert list(client.build({A0: req(), A1: req()}).to_send) == [A1]


def test_disabled_sessions_send_every_partition_every_time() -> None:
    client = FetchSessionClient(1, enabled=False)
    for _ in range(3):
        plan = client.build({A0: req(), A1: req()})
        assert (plan.session_id, plan.epoch, list(plan.to_send)) == (
            INVALID_SESSION_ID,
            FINAL_EPOCH,
            [A0, A1],
        )
        assert client.on_answer(plan, ErrorCode.NONE, INVALID_SESSION_ID)


# -- the follower against the leader's cache ------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "leader_hw", "remove", "add", "lost", "evict", "drop"]),
            st.sampled_from([A0, A1, A2]),
        ),
        max_size=40,
    )
)
def test_follower_high_watermarks_track_the_leader_through_sessions(steps: list[tuple[str, Key]]) -> None:
    """A follower that applies only what answers include keeps, for every partition it fetches,
    the leader's current high watermark, through lost answers, evicted sessions and answers it
    had to drop. Fails with ``name_again`` ignored (a dropped answer's HW is never sent again)."""
    cache = FetchSessionCache(10, 1000, clock_ms=lambda: 0.0)
    client = FetchSessionClient(1)
    leader_hw = {A0: 5, A1: 5, A2: 5}
    follower_leo = {A0: 0, A1: 0, A2: 0}
    follower_hw: dict[Key, int] = {}
    wanted = {A0, A1}

    def fetch_once(drop: Key | None = None, lose: bool = False) -> None:
        plan = client.build({k: req(follower_leo[k]) for k in sorted(wanted)})
        forgotten = plan.forgotten if not plan.full else []
        ctx = cache.open(plan.session_id, plan.epoch, plan.to_send, forgotten, privileged=True)
        results = {k: PartitionResult(0, leader_hw[k], leader_hw[k], 0, False) for k, _ in ctx.partitions}
        answer = ctx.answer(results)
        if lose:
            client.reset()
            return
        if not client.on_answer(plan, answer.error, answer.session_id):
            return
        for k in answer.partitions:
            if k == drop:
                client.name_again(k)
                continue
            follower_hw[k] = results[k].high_watermark

    fetch_once()
    for action, key in steps:
        drop: Key | None = None
        lose = False
        if action == "append":
            follower_leo[key] += 1
        elif action == "leader_hw":
            leader_hw[key] += 1
        elif action == "remove" and len(wanted) > 1:
            wanted.discard(key)
            follower_hw.pop(key, None)
        elif action == "add":
            wanted.add(key)
        elif action == "lost":
            leader_hw[key] += 1
            lose = True
        elif action == "evict":
            for sid in list(cache._sessions):
                cache._remove(sid)
        elif action == "drop":
            leader_hw[key] += 1
            drop = key
        fetch_once(drop, lose)
        fetch_once()  # one more round: whatever was lost or dropped is sent again
        fetch_once()
        for k in wanted:
            assert follower_hw.get(k) == leader_hw[k], (k, steps)

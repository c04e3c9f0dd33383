"""The leader's fetch-session cache (KIP-227): what an incremental request reads and what its
answer includes.

The guarantee that makes omitting partitions safe is that an answer leaves out only partitions
with nothing new for the fetcher. Where a test says what fails without a rule of
``fetch_sessions``, that was checked by taking the rule out.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.fetch_sessions import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_EPOCH,
    FetchSessionCache,
    Key,
    Kind,
    PartitionRequest,
    PartitionResult,
    SessionOwner,
    next_epoch,
)
from sluice.protocol.errors import ErrorCode

A0, A1, A2, B0 = ("a", 0), ("a", 1), ("a", 2), ("b", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def req(offset: int = 0) -> PartitionRequest:
    return PartitionRequest(offset, 1 << 20)


def res(hw: int = 10, *, records: bool = False, log_start: int = 0, error: int = 0) -> PartitionResult:
    return PartitionResult(error, hw, hw, log_start, records)


def cache(slots: int = 10, clock: Clock | None = None) -> FetchSessionCache:
    ids = iter(range(100, 10_000))
    return FetchSessionCache(slots, 1000, clock_ms=clock or Clock(), new_id=lambda: next(ids))


def open_session(c: FetchSessionCache, keys: list[Key], *, privileged: bool = True, hw: int = 10) -> int:
    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {k: req() for k in keys}, [], privileged=privileged)
    answer = ctx.answer({k: res(hw) for k in keys})
    assert answer.partitions == keys, "a full answer has every partition"
    return answer.session_id


def test_full_request_with_epoch_0_creates_a_session_that_expects_epoch_1() -> None:
    c = cache()
    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {A0: req(), A1: req()}, [], privileged=True)
    assert ctx.kind is Kind.FULL and [k for k, _ in ctx.partitions] == [A0, A1]
    answer = ctx.answer({A0: res(), A1: res()})
    assert answer.session_id > 0 and answer.partitions == [A0, A1]
    session = c.get(answer.session_id)
    assert session is not None and session.epoch == 1 and list(session.partitions) == [A0, A1]


def test_sessionless_request_creates_nothing_and_closes_the_session_it_names() -> None:
    c = cache()
    sid = open_session(c, [A0])
    ctx = c.open(INVALID_SESSION_ID, FINAL_EPOCH, {A0: req()}, [], privileged=True)
    assert ctx.kind is Kind.SESSIONLESS
    assert ctx.answer({A0: res()}).session_id == INVALID_SESSION_ID
    assert len(c) == 1
    c.open(sid, FINAL_EPOCH, {A0: req()}, [], privileged=True)
    assert c.get(sid) is None


def test_full_request_naming_a_session_replaces_it() -> None:
    c = cache()
    old = open_session(c, [A0])
    new = open_session_after(c, old, [A1])
    assert c.get(old) is None and c.get(new) is not None and len(c) == 1


def open_session_after(c: FetchSessionCache, old: int, keys: list[Key]) -> int:
    ctx = c.open(old, INITIAL_EPOCH, {k: req() for k in keys}, [], privileged=True)
    return ctx.answer({k: res() for k in keys}).session_id


def test_idle_incremental_request_reads_every_partition_and_answers_none() -> None:
    """Fails if the answer filter is skipped (every partition answered every time)."""
    c = cache()
    sid = open_session(c, [A0, A1, B0])
    ctx = c.open(sid, 1, {}, [], privileged=True)
    assert ctx.kind is Kind.INCREMENTAL
    assert [k for k, _ in ctx.partitions] == [A0, A1, B0], "every session partition is read"
    assert ctx.answer({A0: res(), A1: res(), B0: res()}).partitions == []
    assert c.get(sid).epoch == 2  # type: ignore[union-attr]


def test_answer_includes_only_partitions_with_records() -> None:
    c = cache()
    sid = open_session(c, [A0, A1, B0])
    ctx = c.open(sid, 1, {}, [], privileged=True)
    assert ctx.answer({A0: res(), A1: res(records=True), B0: res()}).partitions == [A1]


def test_high_watermark_change_counts_as_a_change() -> None:
    """A follower learns its high watermark only from answers: leaving out a partition whose
    HW moved would leave the follower's HW behind for as long as the partition stays idle.
    Fails if ``CachedPartition.must_answer`` ignores the high watermark."""
    c = cache()
    sid = open_session(c, [A0, A1], hw=10)
    moved = PartitionResult(0, 12, 10, 0, False)  # the HW alone moved (LSO as before)
    assert c.open(sid, 1, {}, [], privileged=True).answer({A0: res(10), A1: moved}).partitions == [A1]
    assert c.open(sid, 2, {}, [], privileged=True).answer({A0: res(10), A1: moved}).partitions == []


def test_has_news_is_what_the_answer_would_include_besides_named_partitions_and_records_nothing() -> None:
    """A follower's long poll ends on news (handlers.fetch), so the high watermark its own fetch
    moved reaches it at once. Fails if ``has_news`` ignores a moved watermark, or if it records
    what it saw (the answer would then leave the partition out)."""
    c = cache()
    sid = open_session(c, [A0, A1], hw=10)
    ctx = c.open(sid, 1, {A0: req(5)}, [], privileged=True)
    assert not ctx.has_news({A0: res(10), A1: res(10)}), "a named partition alone is not news"
    for news in (res(12), res(10, records=True), res(10, log_start=3), res(10, error=6)):
        assert ctx.has_news({A0: res(10), A1: news}), news
    assert ctx.has_news({A0: res(10), A1: res(12)})
    assert ctx.answer({A0: res(10), A1: res(12)}).partitions == [A0, A1]
    full = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {A0: req()}, [], privileged=True)
    assert not full.has_news({A0: res(12)}), "a full request keeps min_bytes' rule"


def test_log_start_change_counts_as_a_change() -> None:
    c = cache()
    sid = open_session(c, [A0])
    answer = c.open(sid, 1, {}, [], privileged=True).answer({A0: res(log_start=5)})
    assert answer.partitions == [A0]


def test_last_stable_offset_change_counts_as_a_change() -> None:
    c = cache()
    sid = open_session(c, [A0])
    answer = c.open(sid, 1, {}, [], privileged=True).answer({A0: PartitionResult(0, 10, 7, 0, False)})
    assert answer.partitions == [A0]


def test_error_is_always_answered_and_the_partition_again_once_it_clears() -> None:
    c = cache()
    sid = open_session(c, [A0])
    err = ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert c.open(sid, 1, {}, [], privileged=True).answer({A0: res(error=err)}).partitions == [A0]
    assert c.open(sid, 2, {}, [], privileged=True).answer({A0: res(error=err)}).partitions == [A0]
    # Same HW as before the error: still answered, so the fetcher sees the error is gone.
    assert c.open(sid, 3, {}, [], privileged=True).answer({A0: res()}).partitions == [A0]
    assert c.open(sid, 4, {}, [], privileged=True).answer({A0: res()}).partitions == []


def test_named_partition_is_answered_and_its_new_offset_cached() -> None:
    """The follower names a partition again when it could not use its last answer; it must get
    an answer though nothing changed. Fails if ``named`` is not honoured."""
    c = cache()
    sid = open_session(c, [A0, A1])
    ctx = c.open(sid, 1, {A1: req(7)}, [], privileged=True)
    assert dict(ctx.partitions)[A1].fetch_offset == 7
    assert dict(ctx.partitions)[A0].fetch_offset == 0
    assert ctx.answer({A0: res(), A1: res()}).partitions == [A1]
    ctx = c.open(sid, 2, {}, [], privileged=True)
    assert dict(ctx.partitions)[A1].fetch_offset == 7, "the session keeps the last named offset"
    assert ctx.answer({A0: res(), A1: res()}).partitions == []


def test_incremental_request_adds_and_forgets_partitions() -> None:
    """Fails if forgotten partitions stay in the session (they would still be read, and the
    leader would count the follower at a stale offset)."""
    c = cache()
    sid = open_session(c, [A0, A1])
    ctx = c.open(sid, 1, {A2: req(3)}, [A0], privileged=True)
    assert [k for k, _ in ctx.partitions] == [A1, A2]
    assert ctx.answer({A1: res(), A2: res()}).partitions == [A2], "an added partition is answered"
    assert list(c.get(sid).partitions) == [A1, A2]  # type: ignore[union-attr]


def test_forgetting_every_partition_closes_the_session() -> None:
    c = cache()
    sid = open_session(c, [A0])
    ctx = c.open(sid, 1, {}, [A0], privileged=True)
    assert ctx.kind is Kind.SESSIONLESS and ctx.partitions == []
    assert ctx.answer({}).session_id == INVALID_SESSION_ID
    assert c.get(sid) is None


def test_wrong_epoch_is_invalid_fetch_session_epoch_and_changes_nothing() -> None:
    c = cache()
    sid = open_session(c, [A0])
    for epoch in (2, 5, -2):
        ctx = c.open(sid, epoch, {A1: req()}, [A0], privileged=True)
        expected = (
            ErrorCode.FETCH_SESSION_ID_NOT_FOUND if epoch < 0 else ErrorCode.INVALID_FETCH_SESSION_EPOCH
        )
        assert ctx.kind is Kind.ERROR and ctx.error is expected and ctx.partitions == []
    session = c.get(sid)
    assert session is not None and session.epoch == 1 and list(session.partitions) == [A0]
    assert c.open(sid, 1, {}, [], privileged=True).error is ErrorCode.NONE


def test_unknown_session_is_fetch_session_id_not_found() -> None:
    c = cache()
    ctx = c.open(12345, 1, {A0: req()}, [], privileged=True)
    assert ctx.kind is Kind.ERROR and ctx.error is ErrorCode.FETCH_SESSION_ID_NOT_FOUND


ALICE = SessionOwner("User:alice", "SASL_SSL")
BOB = SessionOwner("User:bob", "SASL_SSL")


def test_a_session_answers_only_its_owner_and_anyone_else_is_told_it_does_not_exist() -> None:
    """Issue 33, finding 3: a session stored no owner, so bob, sending alice's session id at the
    epoch it expected, was served her session's partitions (and moved its epoch, so her own next
    request failed). Now anyone but the principal, listener and replica that opened it is told
    FETCH_SESSION_ID_NOT_FOUND, and the session is as it was."""
    c = cache()
    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {A0: req()}, [], privileged=False, owner=ALICE)
    sid = ctx.answer({A0: res()}).session_id
    for stranger in (
        BOB,
        SessionOwner("User:alice", "PLAINTEXT"),  # the same name on another listener
        SessionOwner("User:alice", "SASL_SSL", replica_id=2),  # her session, claimed as a follower's
    ):
        hijack = c.open(sid, 1, {}, [], privileged=False, owner=stranger)
        assert (hijack.kind, hijack.error) == (Kind.ERROR, ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
    assert c.stats.foreign_session_requests == 3
    own = c.open(sid, 1, {}, [], privileged=False, owner=ALICE)
    assert own.kind is Kind.INCREMENTAL and own.partitions == [(A0, req())]


def test_a_full_request_of_another_principal_does_not_close_a_session() -> None:
    c = cache()
    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {A0: req()}, [], privileged=False, owner=ALICE)
    sid = ctx.answer({A0: res()}).session_id
    for epoch in (INITIAL_EPOCH, FINAL_EPOCH):
        other = c.open(sid, epoch, {B0: req()}, [], privileged=False, owner=BOB)
        assert other.kind in (Kind.FULL, Kind.SESSIONLESS)
        assert other.answer({B0: res()}).session_id != sid
    assert c.get(sid) is not None and c.get(sid).owner == ALICE  # type: ignore[union-attr]
    c.open(sid, FINAL_EPOCH, {}, [], privileged=False, owner=ALICE)  # her own closes it
    assert c.get(sid) is None


def test_session_ids_come_from_the_secrets_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ids are unpredictable (they were ``random.Random``'s, whose next values follow from the
    ones a client sees): the cache's default id source is ``secrets``."""
    import sluice.broker.fetch_sessions as fs

    drawn: list[int] = []

    def randbelow(n: int) -> int:
        assert n == MAX_EPOCH
        drawn.append(41)
        return 41

    monkeypatch.setattr(fs.secrets, "randbelow", randbelow)
    c = FetchSessionCache(10, 1000)
    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, {A0: req()}, [], privileged=False)
    assert ctx.answer({A0: res()}).session_id == 42 and drawn == [41]


def test_request_accepted_while_another_waited_makes_the_waiting_one_an_epoch_error() -> None:
    c = cache()
    sid = open_session(c, [A0])
    first = c.open(sid, 1, {}, [], privileged=True)
    second = c.open(sid, 2, {}, [], privileged=True)
    assert second.answer({A0: res(records=True)}).partitions == [A0]
    late = first.answer({A0: res(records=True)})
    assert late.error is ErrorCode.INVALID_FETCH_SESSION_EPOCH and late.partitions == []


def test_answered_partitions_move_to_the_end_of_the_read_order() -> None:
    """A request's byte limit is spent in read order: without rotation the first partitions of
    a busy session would be served every time and the last ones never."""
    c = cache()
    sid = open_session(c, [A0, A1, A2])
    c.open(sid, 1, {}, [], privileged=True).answer({A0: res(records=True), A1: res(), A2: res()})
    assert [k for k, _ in c.open(sid, 2, {}, [], privileged=True).partitions] == [A1, A2, A0]


def test_epochs_wrap_to_1_never_to_a_full_request_epoch() -> None:
    assert next_epoch(0) == 1 and next_epoch(41) == 42 and next_epoch(MAX_EPOCH) == 1


def test_full_cache_refuses_a_consumer_but_a_follower_evicts_the_smallest_consumer_session() -> None:
    clock = Clock()
    c = cache(slots=2, clock=clock)
    small = open_session(c, [A0], privileged=False)
    big = open_session(c, [A0, A1], privileged=False)
    assert open_session(c, [A0, A1, A2], privileged=False) == INVALID_SESSION_ID, (
        "new sessions do not evict each other"
    )
    follower = open_session(c, [A0])
    assert follower != INVALID_SESSION_ID
    assert c.get(small) is None and c.get(big) is not None and c.stats.sessions_evicted == 1


def test_follower_sessions_are_not_evicted_by_consumers() -> None:
    clock = Clock()
    c = cache(slots=1, clock=clock)
    follower = open_session(c, [A0])
    clock.now = 900  # used recently, created long enough ago to be evictable by size
    c.open(follower, 1, {}, [], privileged=True).answer({A0: res()})
    clock.now = 1500
    assert open_session(c, [A0, A1, A2], privileged=False) == INVALID_SESSION_ID
    assert c.get(follower) is not None


def test_larger_session_evicts_a_smaller_one_once_it_is_no_longer_new() -> None:
    clock = Clock()
    c = cache(slots=1, clock=clock)
    small = open_session(c, [A0], privileged=False)
    clock.now = 500
    c.open(small, 1, {}, [], privileged=False).answer({A0: res()})
    assert open_session(c, [A0, A1], privileged=False) == INVALID_SESSION_ID, "still new"
    clock.now = 1400
    c.open(small, 2, {}, [], privileged=False).answer({A0: res()})
    assert open_session(c, [A0], privileged=False) == INVALID_SESSION_ID, "not larger"
    assert open_session(c, [A0, A1], privileged=False) != INVALID_SESSION_ID
    assert c.get(small) is None


def test_idle_sessions_expire_and_free_their_slot() -> None:
    """Fails if idle sessions are kept: a follower that went away would hold its slot, and its
    partitions' cached state, for ever."""
    clock = Clock()
    c = cache(slots=1, clock=clock)
    gone = open_session(c, [A0])
    clock.now = 1001
    ctx = c.open(gone, 1, {}, [], privileged=True)
    assert ctx.error is ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert len(c) == 0 and c.stats.sessions_expired == 1
    assert open_session(c, [A1], privileged=False) != INVALID_SESSION_ID


# -- the whole protocol, against what full fetches would have said ----------------------------------

KEYS = [A0, A1, A2, B0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["hw", "records", "log_start", "error", "clear", "forget", "add", "epoch"]),
            st.sampled_from(KEYS),
        ),
        max_size=40,
    )
)
def test_fetcher_view_always_equals_the_leaders_state(steps: list[tuple[str, Key]]) -> None:
    """After each answer, what the fetcher knows of every session partition (the last values it
    was sent) equals what a full fetch would say now: an omitted partition is one whose state the
    fetcher already has. Fails with the log start check of ``must_answer`` removed, with the
    high watermark and last stable offset checks removed (the broker sends LSO = HW), or with
    forgotten partitions kept."""
    c = cache()
    state = {k: [10, 0, 0] for k in KEYS}  # hw, log start, error
    wanted = {A0: req(), A1: req()}
    known: dict[Key, tuple[int, int, int]] = {}

    def result(k: Key, records: set[Key]) -> PartitionResult:
        hw, log_start, error = state[k]
        if error:
            return PartitionResult(error, -1, -1, -1, False)
        return PartitionResult(0, hw, hw, log_start, k in records)

    def check(answer_keys: list[Key], results: dict[Key, PartitionResult]) -> None:
        for k in answer_keys:
            r = results[k]
            known[k] = (r.high_watermark, r.log_start_offset, r.error)
        for k in wanted:
            r = results[k]
            assert known[k] == (r.high_watermark, r.log_start_offset, r.error), (k, steps)

    ctx = c.open(INVALID_SESSION_ID, INITIAL_EPOCH, wanted, [], privileged=True)
    results = {k: result(k, set()) for k, _ in ctx.partitions}
    answer = ctx.answer(results)
    check(answer.partitions, results)
    sid, epoch = answer.session_id, 1
    for action, key in steps:
        named: dict[Key, PartitionRequest] = {}
        forgotten: list[Key] = []
        records: set[Key] = set()
        if action == "hw":
            state[key][0] += 1
        elif action == "records":
            records.add(key)
        elif action == "log_start":
            state[key][1] += 1
        elif action == "error":
            state[key][2] = ErrorCode.NOT_LEADER_OR_FOLLOWER
        elif action == "clear":
            state[key][2] = 0
        elif action == "forget" and key in wanted and len(wanted) > 1:
            del wanted[key]
            known.pop(key, None)
            forgotten.append(key)
        elif action == "add" and key not in wanted:
            wanted[key] = named[key] = req()
        elif action == "epoch" and key in wanted:
            wanted[key] = named[key] = req(wanted[key].fetch_offset + 1)
        ctx = c.open(sid, epoch, named, forgotten, privileged=True)
        assert ctx.kind is Kind.INCREMENTAL
        assert {k for k, _ in ctx.partitions} == set(wanted)
        results = {k: result(k, records) for k, _ in ctx.partitions}
        answer = ctx.answer(results)
        check(answer.partitions, results)
        epoch = next_epoch(epoch)

"""The transaction coordinator's state machine (broker/txn_state.py): the table, each decision,
and a hypothesis run of two producers sharing a transactional id in which the older one never
gets a commit through once the newer one has initialised."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker import txn_records
from sluice.broker import txn_state as ts
from sluice.broker.txn_state import TRANSITIONS, Decision, IllegalTransition, TxnMetadata
from sluice.broker.txn_state import TxnState as S
from sluice.protocol.errors import ErrorCode

NOW = 1_000_000
TID = "t"


def _init(meta: TxnMetadata, expected: tuple[int, int] | None = None, fresh: int | None = None) -> Decision:
    return ts.init_producer_id(
        meta, timeout_ms=60_000, expected=expected, pending=False, now_ms=NOW, fresh_producer_id=fresh
    )


def _ready(epoch: int = 0, pid: int = 10) -> TxnMetadata:
    """An id initialised at ``epoch``."""
    meta = ts.new_metadata(TID, pid, 60_000, NOW)
    while meta.producer_epoch < epoch:
        write = _init(meta).write
        assert write is not None
        meta = write
    return meta


def _ongoing(meta: TxnMetadata, *partitions: tuple[str, int]) -> TxnMetadata:
    d = ts.add_partitions(
        meta, meta.producer_id, meta.producer_epoch, partitions or [("a", 0)], pending=False, now_ms=NOW
    )
    assert d.write is not None, d
    return d.write


def test_the_table_has_every_state_and_prints() -> None:
    assert set(TRANSITIONS) == set(S)
    assert all(dst in TRANSITIONS for edges in TRANSITIONS.values() for dst in edges)
    assert TRANSITIONS[S.DEAD] == {}
    table = ts.transitions_table()
    assert "Ongoing -> PrepareEpochFence" in " ".join(table.split())
    print(table)


def test_every_edge_of_the_table_is_taken_by_some_decision() -> None:
    """No transition in the table is dead text: each one is what some decision writes."""
    taken: set[tuple[S, S]] = set()

    def note(before: TxnMetadata, after: TxnMetadata | None) -> None:
        if after is not None:
            taken.add((before.state, after.state))

    empty = _ready()
    note(empty, _init(empty).write)  # Empty -> Empty
    ongoing = _ongoing(empty)
    taken.add((S.EMPTY, S.ONGOING))
    note(ongoing, _ongoing(ongoing, ("b", 0)))  # Ongoing -> Ongoing
    fenced = ts.fence(ongoing, now_ms=NOW)
    taken |= {(S.ONGOING, S.PREPARE_EPOCH_FENCE), (S.PREPARE_EPOCH_FENCE, S.PREPARE_ABORT)}
    for commit in (True, False):
        prepared = ts.end_txn(ongoing, 10, 0, commit, pending=False, now_ms=NOW).write
        assert prepared is not None
        note(ongoing, prepared)
        done = ts.complete(prepared, now_ms=NOW)
        note(prepared, done)
        note(done, _init(done).write)  # Complete -> Empty
        note(done, _ongoing(done))  # Complete -> Ongoing
        done.to(S.DEAD)
        taken.add((done.state, S.DEAD))
    empty.to(S.DEAD)
    taken.add((S.EMPTY, S.DEAD))
    assert fenced.state is S.PREPARE_ABORT
    table = {(src, dst) for src, edges in TRANSITIONS.items() for dst in edges}
    assert taken == table


def test_a_transition_the_table_lacks_is_refused() -> None:
    with pytest.raises(IllegalTransition):
        _ready().to(S.PREPARE_COMMIT)
    with pytest.raises(IllegalTransition):
        ts.complete(_ready(), now_ms=NOW)


def test_each_init_bumps_the_epoch_and_a_spent_epoch_takes_a_new_producer_id() -> None:
    meta = ts.new_metadata(TID, 10, 60_000, NOW)
    first = _init(meta).write
    assert first is not None and (first.producer_id, first.producer_epoch) == (10, 0)
    second = _init(first).write
    assert second is not None and second.producer_epoch == 1
    spent = TxnMetadata(TID, 10, -1, ts.EPOCH_EXHAUSTED, -1, 60_000, S.EMPTY, frozenset(), -1, NOW)
    assert _init(spent).needs_producer_id
    rotated = _init(spent, fresh=11).write
    assert rotated is not None and (
        rotated.producer_id,
        rotated.producer_epoch,
        rotated.last_producer_id,
    ) == (11, 0, 10)


def test_a_new_producer_fences_an_open_transaction_first() -> None:
    ongoing = _ongoing(_ready(epoch=3))
    d = _init(ongoing)
    assert d.fence_first and d.write is None
    aborting = ts.fence(ongoing, now_ms=NOW)
    assert (aborting.state, aborting.producer_epoch) == (S.PREPARE_ABORT, 4)
    # The old producer, at epoch 3, can do nothing more with the transaction.
    assert ts.end_txn(aborting, 10, 3, True, pending=False, now_ms=NOW).error is ErrorCode.PRODUCER_FENCED
    assert (
        ts.add_partitions(aborting, 10, 3, [("b", 0)], pending=False, now_ms=NOW).error
        is ErrorCode.PRODUCER_FENCED
    )
    # While its markers are written, a retried InitProducerId waits; then it bumps to 5.
    assert _init(aborting).error is ErrorCode.CONCURRENT_TRANSACTIONS
    done = ts.complete(aborting, now_ms=NOW)
    again = _init(done).write
    assert again is not None and again.producer_epoch == 5


def test_kip360_bumps_by_the_producer_and_recognises_its_retry() -> None:
    meta = _ready(epoch=2)
    bumped = _init(meta, expected=(10, 2)).write
    assert bumped is not None and (bumped.producer_epoch, bumped.last_producer_epoch) == (3, 2)
    retry = _init(bumped, expected=(10, 2))
    assert retry.error is ErrorCode.NONE and retry.write is None  # answered with epoch 3 again
    assert _init(bumped, expected=(10, 1)).error is ErrorCode.PRODUCER_FENCED
    assert _init(bumped, expected=(99, 3)).error is ErrorCode.PRODUCER_FENCED
    # A new producer's InitProducerId (no expected epoch) forgets the last epoch: the old one's
    # retry is then fenced.
    taken = _init(bumped).write
    assert taken is not None and taken.last_producer_epoch == ts.NO_EPOCH
    assert _init(taken, expected=(10, 3)).error is ErrorCode.PRODUCER_FENCED


def test_requests_check_the_producer_and_the_state() -> None:
    meta = _ready(epoch=1)
    assert (
        ts.add_partitions(meta, 11, 1, [("a", 0)], pending=False, now_ms=NOW).error
        is ErrorCode.INVALID_PRODUCER_ID_MAPPING
    )
    assert (
        ts.add_partitions(meta, 10, 0, [("a", 0)], pending=False, now_ms=NOW).error
        is ErrorCode.PRODUCER_FENCED
    )
    assert (
        ts.add_partitions(meta, 10, 1, [("a", 0)], pending=True, now_ms=NOW).error
        is ErrorCode.CONCURRENT_TRANSACTIONS
    )
    assert ts.end_txn(meta, 10, 1, True, pending=False, now_ms=NOW).error is ErrorCode.INVALID_TXN_STATE
    ongoing = _ongoing(meta, ("a", 0))
    assert ongoing.start_ms == NOW
    again = ts.add_partitions(ongoing, 10, 1, [("a", 0)], pending=False, now_ms=NOW + 5)
    assert again == Decision()  # already in the transaction: nothing to write
    committing = ts.end_txn(ongoing, 10, 1, True, pending=False, now_ms=NOW).write
    assert committing is not None and committing.state is S.PREPARE_COMMIT
    assert (
        ts.end_txn(committing, 10, 1, True, pending=False, now_ms=NOW).error
        is ErrorCode.CONCURRENT_TRANSACTIONS
    )
    assert (
        ts.end_txn(committing, 10, 1, False, pending=False, now_ms=NOW).error is ErrorCode.INVALID_TXN_STATE
    )
    assert (
        ts.add_partitions(committing, 10, 1, [("b", 0)], pending=False, now_ms=NOW).error
        is ErrorCode.CONCURRENT_TRANSACTIONS
    )
    done = ts.complete(committing, now_ms=NOW)
    assert done.partitions == frozenset()
    assert ts.end_txn(done, 10, 1, True, pending=False, now_ms=NOW) == Decision()  # a retried commit
    assert ts.end_txn(done, 10, 1, False, pending=False, now_ms=NOW).error is ErrorCode.INVALID_TXN_STATE


def test_verification_answers_each_partition_of_the_ongoing_transaction_only() -> None:
    """KIP-890 part 1, the coordinator's side of a leader's question (Kafka 3.9's answers): a
    partition the ongoing transaction added is NONE; any other TRANSACTION_ABORTABLE; no such
    id, another producer id INVALID_PRODUCER_ID_MAPPING; another epoch PRODUCER_FENCED; a
    transaction being ended CONCURRENT_TRANSACTIONS; ended and forgotten: nothing is added."""
    a, b = ("a", 0), ("b", 1)
    ready = _ready()
    pid, epoch = ready.producer_id, ready.producer_epoch

    def verify(
        meta: TxnMetadata | None, *, producer: int = pid, at: int = epoch
    ) -> dict[tuple[str, int], ErrorCode]:
        return ts.verify_partitions(meta, producer, at, [a, b])

    E = ErrorCode
    assert verify(None) == {a: E.INVALID_PRODUCER_ID_MAPPING, b: E.INVALID_PRODUCER_ID_MAPPING}
    assert verify(ready) == {a: E.TRANSACTION_ABORTABLE, b: E.TRANSACTION_ABORTABLE}  # Empty: none open
    ongoing = _ongoing(ready, a)
    assert verify(ongoing) == {a: E.NONE, b: E.TRANSACTION_ABORTABLE}
    assert verify(ongoing, producer=pid + 1) == dict.fromkeys([a, b], E.INVALID_PRODUCER_ID_MAPPING)
    assert verify(ongoing, at=epoch + 1) == dict.fromkeys([a, b], E.PRODUCER_FENCED)
    assert verify(ongoing, at=epoch - 1) == dict.fromkeys([a, b], E.PRODUCER_FENCED)
    ending = ts.end_txn(ongoing, pid, epoch, False, pending=False, now_ms=NOW).write
    assert ending is not None and ending.state is S.PREPARE_ABORT
    assert verify(ending) == dict.fromkeys([a, b], E.CONCURRENT_TRANSACTIONS)
    ended = ts.complete(ending, now_ms=NOW)
    assert verify(ended) == dict.fromkeys([a, b], E.TRANSACTION_ABORTABLE)
    fenced = ts.fence(ongoing, now_ms=NOW)  # a new producer took the id: the old epoch is fenced
    assert verify(fenced) == dict.fromkeys([a, b], E.PRODUCER_FENCED)


def test_timeouts_expiry_and_what_a_new_coordinator_owes() -> None:
    ongoing = _ongoing(_ready())
    assert not ts.timed_out(ongoing, NOW + 60_000)
    assert ts.timed_out(ongoing, NOW + 60_001)
    assert not ts.timed_out(_ready(), NOW + 10**9)
    assert ts.expired(_ready(), NOW + 1001, 1000) and not ts.expired(ongoing, NOW + 10**9, 1000)
    assert ts.on_load(ongoing) == "watch"
    assert ts.on_load(ts.fence(ongoing, now_ms=NOW)) == "markers"
    assert ts.on_load(_ready()) == "none"


def test_records_round_trip() -> None:
    meta = _ongoing(_ready(epoch=4), ("a", 1), ("b", 0))
    key = txn_records.encode_key(TID)
    assert txn_records.decode_key(key) == TID
    assert txn_records.decode_value(TID, txn_records.encode_value(meta)) == meta
    assert txn_records.decode_value(TID, txn_records.encode_value(None)) is None
    assert txn_records.decode_key(b"not json") is None


# -- a zombie never commits --------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["init", "add", "commit", "abort", "complete", "timeout", "fence-retry"]),
            st.sampled_from(["old", "new"]),
        ),
        max_size=40,
    )
)
def test_an_older_producer_never_commits_after_a_newer_one_initialised(steps: list[tuple[str, str]]) -> None:
    """Two producers share a transactional id, the coordinator applying every decision it makes
    (and completing prepared transactions when told). Once ``new`` has been answered an epoch,
    nothing ``old`` sends with its own epoch is accepted: no transaction of ``old``'s is ever
    prepared for commit after that, and epochs never go back."""
    meta = ts.new_metadata(TID, 10, 60_000, NOW)
    held: dict[str, tuple[int, int]] = {}  # producer -> (pid, epoch) it was answered
    new_answered_at: int | None = None
    for action, who in steps:
        before = meta
        if action == "init":
            d = _init(meta, expected=held.get(who), fresh=meta.producer_id + 1)
            if d.fence_first:
                meta = ts.fence(meta, now_ms=NOW)
            elif d.error is ErrorCode.NONE:
                meta = d.write or meta
                held[who] = (meta.producer_id, meta.producer_epoch)
                if who == "new":
                    new_answered_at = meta.producer_epoch
        elif who in held:
            pid, epoch = held[who]
            if action == "add":
                d = ts.add_partitions(meta, pid, epoch, [("a", 0)], pending=False, now_ms=NOW)
            elif action in ("commit", "abort"):
                d = ts.end_txn(meta, pid, epoch, action == "commit", pending=False, now_ms=NOW)
                if d.write is not None and d.write.state is S.PREPARE_COMMIT and who == "old":
                    assert new_answered_at is None or epoch > new_answered_at, (steps, meta)
            else:
                d = Decision()
            meta = d.write or meta
        if action == "complete" and meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            meta = ts.complete(meta, now_ms=NOW)
        if action == "timeout" and meta.state is S.ONGOING:
            meta = ts.fence(meta, now_ms=NOW)
        assert (meta.producer_id, meta.producer_epoch) >= (before.producer_id, before.producer_epoch)
        if new_answered_at is not None and "old" in held and held["old"][1] < new_answered_at:
            assert held["old"][1] < meta.producer_epoch  # the old one's epoch is fenced for good

"""The partition side of transactions: open transactions, markers, the last stable offset, the
aborted-transaction index, and what a read_committed reader sees, across reopen (clean and
after a crash), truncation and replication; a hypothesis property against a model."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.records import build_batch, decode_records, iter_batches, read_control_marker
from sluice.storage import InvalidProducerEpochError, PartitionLog
from sluice.storage.errors import InvalidTxnStateError, TransactionCoordinatorFencedError
from sluice.storage.txn_index import AbortedTxn, TransactionIndex, collect_aborted
from tests.unit._storage_helpers import Clock, append_verified, open_log


def _txn(pid: int, seq: int, n: int = 1, *, epoch: int = 0, tag: str = "") -> bytes:
    return build_batch(
        [(None, f"{pid}:{tag}{seq + i}".encode()) for i in range(n)],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
        timestamp_ms=1000,
    )


def _plain(value: str) -> bytes:
    return build_batch([(None, value.encode())], timestamp_ms=1000)


def _marker(
    log: PartitionLog, pid: int, committed: bool, *, epoch: int = 0, coordinator_epoch: int = 0
) -> int:
    info = log.append_marker(
        producer_id=pid,
        producer_epoch=epoch,
        committed=committed,
        coordinator_epoch=coordinator_epoch,
        leader_epoch=0,
    )
    return info.first_offset


def committed_values(log: PartitionLog, high_watermark: int) -> list[str]:
    """What a read_committed consumer reads from the log start: batches below the last stable
    offset, less control batches and the aborted transactions' records (the clients' rule: a
    producer's transactional records from an aborted transaction's first offset up to its ABORT
    marker are dropped)."""
    lso = log.last_stable_offset(high_watermark)
    offset = log.log_start_offset
    out: list[str] = []
    aborted_producers: set[int] = set()
    while offset < lso:
        r = log.read(offset, max_bytes=1 << 20, max_offset=lso)
        if not r.records:
            break
        pending = sorted(
            log.collect_aborted(offset, lso), key=lambda a: a.first_offset
        )  # the Fetch answer's list
        for pos, h in iter_batches(r.records):
            while pending and pending[0].first_offset <= h.last_offset:
                aborted_producers.add(pending.pop(0).producer_id)
            if h.is_control:
                marker = read_control_marker(r.records, pos, h)
                if marker is not None and not marker.committed:
                    aborted_producers.discard(h.producer_id)
            elif not (h.is_transactional and h.producer_id in aborted_producers):
                out.extend(
                    rec.value.decode() for rec in decode_records(r.records, pos, h) if rec.value is not None
                )
            offset = h.next_offset
    return out


# -- examples ----------------------------------------------------------------------------------


def test_an_open_transaction_holds_the_last_stable_offset_at_its_first_offset(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append_as_leader(_plain("a"), leader_epoch=0)
    append_verified(log, _txn(7, 0))
    log.append_as_leader(_plain("b"), leader_epoch=0)
    assert log.open_transactions == {7: 1}
    assert log.last_stable_offset(3) == 1
    assert log.last_stable_offset(0) == 0  # never above the high watermark
    assert committed_values(log, 3) == ["a"]
    marker = _marker(log, 7, committed=True)
    assert marker == 3 and log.open_transactions == {}
    # Ended, but the marker is not below the high watermark: a failover could lose it.
    assert log.last_stable_offset(3) == 1
    assert log.last_stable_offset(4) == 4
    assert committed_values(log, 4) == ["a", "7:0", "b"]


def test_an_aborted_transaction_is_indexed_and_hidden_from_read_committed(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append_verified(log, _txn(1, 0, 2))  # 0-1
    append_verified(log, _txn(2, 0))  # 2
    append_verified(log, _txn(1, 2))  # 3
    abort = _marker(log, 1, committed=False)  # 4
    assert log.collect_aborted(0, 5) == [AbortedTxn(1, 0, 4, 2)]  # producer 2 still open at 2
    commit = _marker(log, 2, committed=True)  # 5
    end = log.log_end_offset
    assert (abort, commit, end) == (4, 5, 6)
    assert log.last_stable_offset(end) == end
    assert committed_values(log, end) == ["2:0"]
    assert log.collect_aborted(5, 6) == []  # ended before the fetch offset
    assert log.collect_aborted(0, 0) == []  # begun at the bound


def test_a_producer_with_an_open_transaction_may_not_write_outside_it(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append_verified(log, _txn(3, 0))
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(
            build_batch([(None, b"x")], producer_id=3, producer_epoch=0, base_sequence=1), leader_epoch=0
        )
    _marker(log, 3, committed=False)
    log.append_as_leader(
        build_batch([(None, b"x")], producer_id=3, producer_epoch=0, base_sequence=1), leader_epoch=0
    )


def test_a_transactional_batch_opens_a_transaction_only_with_its_verification_guard(tmp_path: Path) -> None:
    """KIP-890 part 1 at the log: before, any transactional batch a leader was handed opened a
    transaction (issue 33 finding 2: one no coordinator knew, the last stable offset stuck at its
    first offset for good). Now the batch that opens its producer's transaction needs the guard
    the log gave before the coordinator was asked; the transaction's later batches need none."""
    log = open_log(tmp_path / "p")
    with pytest.raises(InvalidTxnStateError, match="not part of an ongoing transaction"):
        log.append_as_leader(_txn(7, 0), leader_epoch=0)
    assert (log.log_end_offset, log.open_transactions) == (0, {})
    other = log.begin_verification(8)
    with pytest.raises(InvalidTxnStateError):  # another producer's guard opens nothing
        log.append_as_leader(_txn(7, 0), leader_epoch=0, verification=other)
    guard = log.begin_verification(7)
    assert guard is not None and log.begin_verification(7) is guard  # one per producer, shared
    log.append_as_leader(_txn(7, 0), leader_epoch=0, verification=guard)
    assert log.open_transactions == {7: 0}
    assert log.begin_verification(7) is None  # open here: nothing to verify
    log.append_as_leader(_txn(7, 1), leader_epoch=0)
    assert log.last_stable_offset(2) == 0
    _marker(log, 7, committed=True)
    # A retry of an appended batch is still recognised as the duplicate it is.
    assert log.append_as_leader(_txn(7, 1), leader_epoch=0).duplicate
    with pytest.raises(InvalidTxnStateError):  # the next transaction is verified again
        log.append_as_leader(_txn(7, 2), leader_epoch=0, verification=guard)
    assert log.last_stable_offset(log.log_end_offset) == log.log_end_offset


def test_a_marker_between_the_question_and_the_append_voids_the_answer(tmp_path: Path) -> None:
    """The ABA case: the leader took a guard and asked; meanwhile the transaction's batch (from
    a retry) and its ABORT marker were appended. The coordinator's yes was about the transaction
    that ended; appended now, the batch would open one nobody knows. Refused."""
    log = open_log(tmp_path / "p")
    asked = log.begin_verification(7)
    append_verified(log, _txn(7, 0))  # the retry, verified with the same (shared) guard
    _marker(log, 7, committed=False)
    with pytest.raises(InvalidTxnStateError, match="ended, or another began"):
        log.append_as_leader(_txn(7, 1), leader_epoch=0, verification=asked)
    end = log.log_end_offset
    assert log.open_transactions == {} and log.last_stable_offset(end) == end
    # a marker for a transaction that never wrote here voids a guard just the same
    asked = log.begin_verification(9)
    _marker(log, 9, committed=False)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(_txn(9, 0), leader_epoch=0, verification=asked)


def test_verification_guards_are_bounded_and_a_lost_one_refuses(tmp_path: Path) -> None:
    """Producers with a question in flight are bounded per partition; the oldest guard goes
    first, and its append is then refused (the producer retries), never accepted unverified."""
    from sluice.storage.producer_state import VERIFICATIONS_MAX

    log = open_log(tmp_path / "p")
    first = log.begin_verification(0)
    for pid in range(1, VERIFICATIONS_MAX + 1):
        log.begin_verification(pid)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(_txn(0, 0), leader_epoch=0, verification=first)
    append_verified(log, _txn(VERIFICATIONS_MAX, 0))


def test_markers_from_a_fenced_epoch_or_an_older_coordinator_are_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    append_verified(log, _txn(5, 0, epoch=3))
    _marker(log, 5, committed=False, epoch=4, coordinator_epoch=2)  # a fence: the epoch bumped
    with pytest.raises(InvalidProducerEpochError):
        append_verified(log, _txn(5, 1, epoch=3))  # the zombie's late write
    with pytest.raises(InvalidProducerEpochError):
        _marker(log, 5, committed=True, epoch=3, coordinator_epoch=2)
    with pytest.raises(TransactionCoordinatorFencedError):
        _marker(log, 5, committed=True, epoch=4, coordinator_epoch=1)
    assert log.collect_aborted(0, 10) == [AbortedTxn(5, 0, 1, 2)]


def test_state_and_index_survive_reopen_crash_truncation_and_replication(tmp_path: Path) -> None:
    clock = Clock()
    log = open_log(tmp_path / "p", clock, segment_bytes=200)
    append_verified(log, _txn(1, 0))  # 0
    append_verified(log, _txn(2, 0))  # 1
    log.append_as_leader(_plain("p"), leader_epoch=0)  # 2
    _marker(log, 1, committed=False)  # 3
    append_verified(log, _txn(3, 0))  # 4
    _marker(log, 2, committed=True)  # 5
    append_verified(log, _txn(1, 1, tag="x"))  # 6: a new transaction of 1
    assert log.segment_count > 2
    end = log.log_end_offset
    expected = (log.open_transactions, log.collect_aborted(0, end), log.last_stable_offset(end))
    assert expected == ({3: 4, 1: 6}, [AbortedTxn(1, 0, 3, 1)], 4)
    # A follower appending the leader's batches rebuilds the same state.
    follower = open_log(tmp_path / "f", clock, segment_bytes=200)
    offset = 0
    while offset < end:
        r = log.read(offset, max_bytes=1 << 20)
        follower.append_as_follower(r.records)
        offset = follower.log_end_offset
    assert (
        follower.open_transactions,
        follower.collect_aborted(0, end),
        follower.last_stable_offset(end),
    ) == expected
    # A clean reopen, and a crash (no marker, no snapshots, no indexes) rebuild it too.
    log.close()
    log = PartitionLog.open(tmp_path / "p", log.config, now_ms=clock)
    assert (log.open_transactions, log.collect_aborted(0, end), log.last_stable_offset(end)) == expected
    log.abandon()
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "p", crashed)
    for p in (
        list(crashed.glob("*.snapshot"))
        + list(crashed.glob("*.txnindex"))
        + [crashed / ".sluice-clean-shutdown"]
    ):
        p.unlink(missing_ok=True)
    (crashed / "recovery-point").write_text("0\n")
    log = PartitionLog.open(crashed, log.config, now_ms=clock)
    assert (log.open_transactions, log.collect_aborted(0, end), log.last_stable_offset(end)) == expected
    # Truncating below the abort marker drops its entry and reopens the transaction.
    log.truncate_to(3)
    assert log.open_transactions == {1: 0, 2: 1}
    assert log.collect_aborted(0, 10) == []
    assert log.last_stable_offset(3) == 0


def test_the_index_file_cuts_a_torn_entry_and_collects_by_kafkas_rule(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "0.txnindex")
    idx.append(AbortedTxn(1, 0, 5, 6))
    idx.append(AbortedTxn(2, 3, 9, 10))
    with open(idx.path, "ab") as f:
        f.write(b"\x00\x00\x01")  # a crash mid-append
    again = TransactionIndex(idx.path)
    assert again.entries == [AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10)]
    assert idx.path.stat().st_size == 68
    # Transaction 2 (3..9) was open when 1 ended at 5: 1's last stable offset is 3.
    entries = [AbortedTxn(1, 0, 5, 3), AbortedTxn(2, 3, 9, 10), AbortedTxn(4, 12, 20, 21)]
    assert collect_aborted(entries, 0, 6) == (entries[:2], True)
    assert collect_aborted(entries, 6, 8) == ([entries[1]], True)
    # Only an entry whose last stable offset reached the bound ends the search.
    assert collect_aborted(entries[:1], 6, 8) == ([], False)
    assert collect_aborted(entries, 10, 13) == ([entries[2]], True)


# -- a property against a model ----------------------------------------------------------------


@dataclass
class Model:
    """The log as a list of (offset, kind, producer, payload), and the high watermark."""

    entries: list[tuple[int, str, int, str]]
    hw: int = 0

    def end(self) -> int:
        return len(self.entries)

    def ended(self) -> tuple[dict[int, int], list[tuple[int, int, int, bool]]]:
        """Open transactions (producer -> first offset) and ended ones (producer, first, marker
        offset, aborted), walking the log from its start."""
        open_: dict[int, int] = {}
        done = []
        for offset, kind, pid, _ in self.entries:
            if kind == "txn" and pid not in open_:
                open_[pid] = offset
            elif kind in ("commit", "abort") and pid in open_:
                done.append((pid, open_.pop(pid), offset, kind == "abort"))
        return open_, done

    def lso(self) -> int:
        open_, done = self.ended()
        firsts = list(open_.values()) + [first for _, first, last, _ in done if last >= self.hw]
        return min([*firsts, self.hw])

    def committed(self) -> list[str]:
        lso = self.lso()
        _, done = self.ended()
        aborted = {(pid, o) for pid, first, last, ab in done if ab for o in range(first, last)}
        return [
            payload
            for offset, kind, pid, payload in self.entries
            if offset < lso and kind in ("plain", "txn") and (pid, offset) not in aborted
        ]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("txn"), st.integers(1, 2)),
        st.tuples(st.just("commit"), st.integers(1, 2)),
        st.tuples(st.just("abort"), st.integers(1, 2)),
        st.tuples(st.just("plain"), st.just(0)),
        st.tuples(st.just("hw"), st.integers(0, 100)),
        st.tuples(st.just("reopen"), st.sampled_from(["clean", "crash", "crash-without-files"])),
        st.tuples(st.just("truncate"), st.integers(0, 100)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_last_stable_offset_and_committed_reads_match_the_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]]
) -> None:
    """Any sequence of transactional and plain writes, markers, high-watermark moves, reopens
    (clean, or after a crash with the snapshots and indexes gone) and truncations (never below
    the high watermark: I2) leaves the last stable offset, the open transactions and what a
    read_committed reader sees as the model says."""
    directory = tmp_path_factory.mktemp("txn")
    clock = Clock()
    log = open_log(directory, clock, segment_bytes=250)
    model = Model([])
    seqs: dict[int, int] = {}
    for op, arg in ops:
        if op == "reopen":
            if arg == "clean":
                log.close()
            else:
                # A crash: no clean-shutdown marker, everything from the start recovered; the
                # snapshots (and, in the worst case, the indexes) did not make it to disk.
                log.abandon()
                lost = [*directory.glob("*.snapshot")]
                if arg == "crash-without-files":
                    lost += directory.glob("*.txnindex")
                for p in lost:
                    p.unlink()
                (directory / "recovery-point").write_text("0\n")
            log = PartitionLog.open(directory, log.config, now_ms=clock)
        if op == "txn":
            assert isinstance(arg, int)
            seq = seqs.get(arg, 0)
            append_verified(log, _txn(arg, seq))
            seqs[arg] = seq + 1
            model.entries.append((model.end(), "txn", arg, f"{arg}:{seq}"))
        elif op in ("commit", "abort"):
            assert isinstance(arg, int)
            _marker(log, arg, committed=op == "commit")
            model.entries.append((model.end(), op, arg, ""))
        elif op == "plain":
            log.append_as_leader(_plain(f"p{model.end()}"), leader_epoch=0)
            model.entries.append((model.end(), "plain", 0, f"p{model.end()}"))
        elif op == "hw":
            assert isinstance(arg, int)
            model.hw = max(model.hw, min(arg, model.end()))
        elif op == "truncate":
            assert isinstance(arg, int)
            to = max(model.hw, min(arg, model.end()))
            log.truncate_to(to)
            del model.entries[to:]
            seqs = {}  # a truncated producer starts over as the test writes it
            for _, kind, pid, payload in model.entries:
                if kind == "txn":
                    seqs[pid] = int(payload.split(":")[1]) + 1
        assert log.log_end_offset == model.end()
        assert log.last_stable_offset(model.hw) == model.lso(), (ops, model.entries)
        assert log.open_transactions == model.ended()[0]
    assert committed_values(log, model.hw) == model.committed()
    log.close()

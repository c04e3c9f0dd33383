"""The log cleaner on a log with transactions (storage/compaction.py R4, R7; storage/cleaner.py):
what a read_committed reader sees is the same before and after a clean, after a reopen, and after
a crash at any step of the swap; aborted records go and never hide a committed value; a
transaction still open is not cleaned; the aborted-transaction index moves with the rewritten
segments; and a hypothesis property against a model of committed reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.records import build_batch, decode_records, iter_batches, read_control_marker
from sluice.storage import LogConfig, PartitionLog
from sluice.storage.cleaner import CLEANED_SUFFIX, Throttler, run_clean
from tests.unit._storage_helpers import Clock, append_verified, clean_now, crash_clean_at

T0 = 1_000_000
COMPACT = {"cleanup_policy": "compact", "delete_retention_ms": 1_000, "min_cleanable_dirty_ratio": 0.0}
View = dict[bytes, tuple[int, bytes | None]]


def _open(path: Path, clock: Clock, segment_bytes: int = 500) -> PartitionLog:
    return PartitionLog.open(path, LogConfig(segment_bytes=segment_bytes, **COMPACT), now_ms=clock)  # type: ignore[arg-type]


class Writer:
    """Plain and transactional writes to one log, with the sequences a producer keeps."""

    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.seq: dict[int, int] = {}

    def plain(self, key: bytes, value: bytes | None) -> int:
        return self.log.append_as_leader(
            build_batch([(key, value)], timestamp_ms=T0), leader_epoch=0
        ).first_offset

    def txn(self, pid: int, records: list[tuple[bytes, bytes | None]]) -> int:
        seq = self.seq.get(pid, 0)
        self.seq[pid] = seq + len(records)
        data = build_batch(
            records, producer_id=pid, producer_epoch=0, base_sequence=seq, transactional=True, timestamp_ms=T0
        )
        return append_verified(self.log, data).first_offset

    def end(self, pid: int, committed: bool) -> int:
        return self.log.append_marker(
            producer_id=pid, producer_epoch=0, committed=committed, coordinator_epoch=0, leader_epoch=0
        ).first_offset


def committed_view(log: PartitionLog) -> View:
    """key -> (offset, value) of each key's last record a read_committed consumer reads from the
    log start to the last stable offset (the clients' rule: a producer's transactional records
    from an aborted transaction's first offset up to its ABORT marker are dropped)."""
    lso = log.last_stable_offset(log.log_end_offset)
    offset = log.log_start_offset
    out: View = {}
    aborted_producers: set[int] = set()
    while offset < lso:
        r = log.read(offset, max_bytes=1 << 20, max_offset=lso)
        if not r.records:
            break
        pending = sorted(log.collect_aborted(offset, lso), key=lambda a: a.first_offset)
        for pos, h in iter_batches(r.records):
            if h.next_offset <= offset:
                continue
            while pending and pending[0].first_offset <= h.last_offset:
                aborted_producers.add(pending.pop(0).producer_id)
            if h.is_control:
                marker = read_control_marker(r.records, pos, h)
                if marker is not None and not marker.committed:
                    aborted_producers.discard(h.producer_id)
            elif not (h.is_transactional and h.producer_id in aborted_producers):
                for rec in decode_records(r.records, pos, h):
                    assert rec.key is not None
                    out[rec.key] = (rec.offset, rec.value)
            offset = h.next_offset
    return {k: v for k, v in out.items() if v[1] is not None}


def aborted_entries(log: PartitionLog) -> list[tuple[int, int]]:
    """(producer, marker offset) of every aborted transaction the index holds. (Not its first
    offset: a replay of a cleaned log, a crash's recovery, finds a transaction begin at its
    first record left, which may be later than where it began.)"""
    return [(e.producer_id, e.last_offset) for e in log.collect_aborted(0, log.log_end_offset)]


def all_values(log: PartitionLog) -> set[bytes]:
    """Every value still stored in the log, whatever reads it."""
    out: set[bytes] = set()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        r = log.read(offset, max_bytes=1 << 20)
        if not r.records:
            break
        for pos, h in iter_batches(r.records):
            if not h.is_control:
                out.update(rec.value for rec in decode_records(r.records, pos, h) if rec.value is not None)
            offset = max(offset, h.next_offset)
    return out


def _roll(w: Writer, n: int = 10) -> None:
    for i in range(n):
        w.plain(b"filler", f"{i:060d}".encode())


def _history(w: Writer) -> None:
    """Committed values, then aborted newer values of the same keys (which must never win), and
    an aborted transaction interleaved with another producer's committed one."""
    for v in range(3):
        for k in range(4):
            w.plain(b"k%d" % k, b"plain-%d-%d" % (k, v))
    w.txn(7, [(b"k0", b"committed-0"), (b"k1", b"committed-1")])
    w.end(7, True)
    w.txn(8, [(b"k0", b"aborted-0")])
    w.txn(9, [(b"k2", b"committed-2")])
    w.txn(8, [(b"k1", b"aborted-1"), (b"k3", None)])
    w.end(8, False)
    w.end(9, True)
    w.txn(7, [(b"k3", b"aborted-3")])
    w.end(7, False)


def test_aborted_records_go_and_never_hide_a_committed_value(tmp_path: Path) -> None:
    """With the aborted records in the offset map, the committed values of k0, k1 and k3 were
    cleaned away for their aborted newer records: the committed view lost them."""
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    w = Writer(log)
    _history(w)
    _roll(w)
    before = committed_view(log)
    assert {k: v for k, (_o, v) in before.items() if k != b"filler"} == {
        b"k0": b"committed-0",
        b"k1": b"committed-1",
        b"k2": b"committed-2",
        b"k3": b"plain-3-2",
    }
    assert clean_now(log, T0, force=True) is not None
    assert committed_view(log) == before
    assert not {v for v in all_values(log) if v.startswith(b"aborted")}, "aborted records are removed"
    assert [pid for pid, _last in aborted_entries(log)] == [8, 7], "the index moved with the segments"
    log.close()
    reopened = _open(tmp_path / "p", clock)
    assert committed_view(reopened) == before
    assert len(reopened.collect_aborted(0, reopened.log_end_offset)) == 2
    reopened.close()


def test_a_transaction_still_open_is_not_cleaned(tmp_path: Path) -> None:
    """The clean point stays below the last stable offset: a transaction whose outcome is unknown
    keeps its records (and hides nothing). Without the LSO bound its newer value of k0 removed
    the committed one while it could still abort."""
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    w = Writer(log)
    w.plain(b"k0", b"committed")
    w.txn(5, [(b"k0", b"open")])
    _roll(w, 20)
    assert log.last_stable_offset(log.log_end_offset) == 1
    clean_now(log, T0, force=True)
    assert b"committed" in all_values(log) and b"open" in all_values(log)
    w.end(5, False)
    _roll(w)
    assert clean_now(log, T0, force=True) is not None
    assert committed_view(log)[b"k0"] == (0, b"committed")
    assert b"open" not in all_values(log)
    log.close()


def _log_to_clean(path: Path, clock: Clock) -> tuple[PartitionLog, Writer]:
    """Cleaned once and written over again, so that the next clean merges segments whose
    aborted-transaction indexes both hold entries."""
    log = _open(path, clock)
    w = Writer(log)
    _history(w)
    _roll(w)
    assert clean_now(log, T0, force=True) is not None
    w.txn(11, [(b"k2", b"aborted-again")])
    w.end(11, False)
    w.txn(12, [(b"k1", b"committed-again")])
    w.end(12, True)
    _roll(w)
    return log, w


def test_a_crash_at_any_step_of_a_clean_keeps_the_committed_view(tmp_path: Path) -> None:
    """kill -9 after the rewrite, after the commit in memory, and after each step of the swaps:
    the recovered log reads committed as before, and its aborted-transaction index still has an
    entry for every ABORT marker (R4 keeps them all). A recovery that dropped
    ``.txnindex.cleaned`` like the other ``.cleaned`` files lost the entries of the merged
    segments after a crash between the commit point and the renames ('assert [(11, 34)] ==
    [(8, 19), (7, 22), (11, 34)]'), and so did renaming the log before the indexes (a crash
    between the two)."""
    dry, _w = _log_to_clean(tmp_path / "dry", Clock(T0))
    job = dry.clean_job(T0, stable_end=dry.log_end_offset, map_entries_max=10_000, force=True)
    assert job is not None
    result = run_clean(job, Throttler(0))
    assert result is not None and dry.commit_clean(result)
    assert any(g.last > g.first for g in result.groups), "a group of several segments"
    steps: list[str] = []
    dry.finish_swaps(fault=steps.append)
    dry.close()
    for at in [-2, -1, *range(len(steps))]:
        clock = Clock(T0)
        path = tmp_path / f"crash-{at + 2}"
        log, _w = _log_to_clean(path, clock)
        log.flush()  # the recovery point at the end: recovery replays nothing it need not
        before = committed_view(log)
        entries = aborted_entries(log)
        assert len(entries) == 3
        crash_clean_at(log, at, T0)
        what = f"crash at step {at} ({steps[at] if at >= 0 else 'before the swap'})"
        recovered = _open(path, clock)
        assert committed_view(recovered) == before, what
        assert aborted_entries(recovered) == entries, what
        assert not [p.name for p in path.iterdir() if p.name.endswith((CLEANED_SUFFIX, ".swap"))], what
        assert clean_now(recovered, T0, force=True) is not None, what
        assert committed_view(recovered) == before, what
        recovered.close()


keys = st.sampled_from([b"a", b"b", b"c"])
# One step: a plain record, a transactional batch of producer 1 or 2, or the end of a producer's
# transaction (commit or abort).
steps = st.one_of(
    st.tuples(st.just("plain"), keys, st.booleans()),
    st.tuples(
        st.just("txn"),
        st.sampled_from([1, 2]),
        st.lists(st.tuples(keys, st.booleans()), min_size=1, max_size=3),
    ),
    st.tuples(st.just("end"), st.sampled_from([1, 2]), st.booleans()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(steps, min_size=1, max_size=40), st.integers(200, 700), st.integers(1, 3))
def test_cleans_keep_the_committed_view_of_any_history(
    tmp_path_factory: pytest.TempPathFactory,
    history: list[tuple[object, ...]],
    segment_bytes: int,
    cleans: int,
) -> None:
    """Any mix of plain writes, transactions committed, aborted or left open, cleaned one to
    three times with writes between: each clean leaves the committed view as the model has it
    (the last committed record of each key, tombstones as absent), and a reopen too."""
    path = tmp_path_factory.mktemp("prop") / "p"
    clock = Clock(T0)
    log = _open(path, clock, segment_bytes=segment_bytes)
    w = Writer(log)
    model: dict[bytes, tuple[int, bytes | None]] = {}  # key -> its last committed (offset, value)
    pending: dict[int, list[tuple[int, bytes, bytes | None]]] = {}
    chunk = max(1, len(history) // cleans)

    def take(offset: int, key: bytes, value: bytes | None) -> None:
        if key not in model or model[key][0] < offset:
            model[key] = (offset, value)

    for i, step in enumerate(history):
        value = b"v%d" % i
        if step[0] == "plain":
            _, key, tomb = step
            take(w.plain(key, None if tomb else value), key, None if tomb else value)  # type: ignore[arg-type]
        elif step[0] == "txn":
            _, pid, records = step
            batch = [(k, None if t else b"%s-%d" % (value, j)) for j, (k, t) in enumerate(records)]  # type: ignore[attr-defined]
            first = w.txn(pid, batch)  # type: ignore[arg-type]
            pending.setdefault(pid, []).extend((first + j, k, v) for j, (k, v) in enumerate(batch))  # type: ignore[arg-type]
        elif step[1] in pending:
            _, pid, commit = step
            w.end(pid, commit)  # type: ignore[arg-type]
            done = pending.pop(pid)  # type: ignore[arg-type]
            if commit:
                for offset, key, v in done:
                    take(offset, key, v)
        if (i + 1) % chunk == 0:
            _roll(w, 3)
            clean_now(log, T0, force=True)
            # An open transaction hides everything from its first offset on (the LSO), so the
            # view is compared with the model only when none is open.
            if not pending:
                want = {k: v for k, v in model.items() if v[1] is not None}
                got = {k: v for k, v in committed_view(log).items() if k != b"filler"}
                assert got == want
    lso_view = committed_view(log)
    log.close()
    reopened = _open(path, clock, segment_bytes=segment_bytes)
    assert committed_view(reopened) == lso_view
    reopened.close()

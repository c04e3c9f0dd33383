"""The log cleaner's I/O (storage/cleaner.py and PartitionLog's clean steps): the rewrite, the
commit, the durable swap and recovery from a crash at every step, producer state, leader epochs,
indexes, followers, and a hypothesis property of cleans against the model of what a compacted
log must read as."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.protocol.records import BatchHeader, build_batch, iter_batches
from sluice.storage import LogConfig, PartitionLog
from sluice.storage.cleaner import CLEANED_SUFFIX, Throttler, run_clean
from sluice.storage.errors import KeylessRecordError
from sluice.storage.producer_state import list_snapshots
from tests.unit._compaction_model import check_compacted
from tests.unit._storage_helpers import Clock, clean_now, crash_clean_at, records_of

T0 = 1_000_000
RETENTION = 1_000
COMPACT = {"cleanup_policy": "compact", "delete_retention_ms": RETENTION, "min_cleanable_dirty_ratio": 0.0}


def _open(path: Path, clock: Clock, segment_bytes: int = 600, **cfg: object) -> PartitionLog:
    config = LogConfig(segment_bytes=segment_bytes, **{**COMPACT, **cfg})  # type: ignore[arg-type]
    return PartitionLog.open(path, config, now_ms=clock)


def _put(log: PartitionLog, key: bytes, value: bytes | None, *, epoch: int = 0, **kw: int) -> int:
    return log.append_as_leader(
        build_batch([(key, value)], timestamp_ms=T0, **kw), leader_epoch=epoch
    ).first_offset


def _write_versions(log: PartitionLog, keys: int = 10, versions: int = 10) -> dict[bytes, tuple[int, bytes]]:
    last: dict[bytes, tuple[int, bytes]] = {}
    for v in range(versions):
        for k in range(keys):
            key, value = f"k{k}".encode(), f"{k}:{v}".encode()
            last[key] = (_put(log, key, value), value)
    return last


def _files(log: PartitionLog) -> list[str]:
    return sorted(p.name for p in log.directory.iterdir())


def _roll(log: PartitionLog, n: int = 8) -> None:
    """Records of one key after the rest, so that every segment before them rolls."""
    for i in range(n):
        _put(log, b"filler", f"{i:060d}".encode())


def test_a_clean_keeps_each_keys_last_value_at_its_offset_and_the_log_shrinks(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    last = _write_versions(log)
    _roll(log)
    size, end = log.size_bytes, log.log_end_offset
    result = clean_now(log, T0)
    assert result is not None and result.groups
    got = {k: (o, v) for o, k, v in records_of(log) if k != b"filler"}
    assert got == last
    assert log.size_bytes < size / 3 and log.log_end_offset == end
    assert not [n for n in _files(log) if n.endswith((CLEANED_SUFFIX, ".swap"))]
    log.close()
    reopened = _open(tmp_path / "p", clock)
    assert {k: (o, v) for o, k, v in records_of(reopened) if k != b"filler"} == last


def _log_to_clean(path: Path, clock: Clock) -> tuple[PartitionLog, dict[bytes, tuple[int, bytes]]]:
    """A log cleaned once, then written over again: its next clean merges the small cleaned
    segments into groups, so a swap replaces several segment files."""
    log = _open(path, clock)
    last = _write_versions(log)
    _roll(log)
    assert clean_now(log, T0) is not None
    last.update(_write_versions(log, keys=5, versions=3))  # half the keys: the rest stay where they are
    _roll(log)
    return log, last


def _fault_steps(tmp_path: Path) -> list[str]:
    steps: list[str] = []
    log, _last = _log_to_clean(tmp_path / "dry", Clock(T0))
    job = log.clean_job(T0, stable_end=log.log_end_offset, map_entries_max=10_000, force=True)
    assert job is not None
    result = run_clean(job, Throttler(0))
    assert result is not None and log.commit_clean(result)
    assert any(g.last > g.first for g in result.groups), "a group of several segments"
    log.finish_swaps(fault=steps.append)
    log.close()
    return steps


def test_a_crash_at_any_step_of_a_clean_recovers_with_nothing_lost(tmp_path: Path) -> None:
    """kill -9 at every step: after the rewrite, after the commit in memory, and after each
    rename and unlink of the swap. Recovery gives either the log as it was or the cleaned one,
    both reading as every key's last value; never an overlap, a lost record or a leftover file.
    A recovery that dropped a .swap as unfinished work, as it drops .cleaned files, lost the
    records of the segments its swap replaces: ``AssertionError: crash at step 0 (swap) ...
    Right contains 1 more item: {b'k5': (95, b'5:9')}``."""
    steps = _fault_steps(tmp_path)
    # Every step of the first swap (each unlink), and each group's rename steps after it.
    first_done = steps.index("renamed")
    chosen = [(i, n) for i, n in enumerate(steps) if i <= first_done or not n.startswith("unlinked")]
    points = [(-2, "after rewrite"), (-1, "after commit"), *chosen]
    assert any(name.startswith("unlinked") and name.endswith(".log") for _i, name in points), steps
    for at, name in points:
        clock = Clock(T0)
        path = tmp_path / f"crash-{at + 2}"
        log, last = _log_to_clean(path, clock)
        before = records_of(log)
        crash_clean_at(log, at, T0)
        what = f"crash at step {at} ({name})"
        recovered = _open(path, clock)
        got = records_of(recovered)
        assert {k: (o, v) for o, k, v in got if k != b"filler"} == last, what
        assert {k: (o, v) for o, k, v in got} == {k: (o, v) for o, k, v in before}, what
        assert set(got) <= set(before), what
        assert not [f for f in _files(recovered) if f.endswith((CLEANED_SUFFIX, ".swap"))], what
        assert clean_now(recovered, T0, force=True) is not None, what
        assert {k: (o, v) for o, k, v in records_of(recovered) if k != b"filler"} == last, what
        recovered.close()


def test_a_clean_is_dropped_when_its_segments_changed_meanwhile(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    _write_versions(log)
    _roll(log)
    job = log.clean_job(T0, stable_end=log.log_end_offset, map_entries_max=10_000)
    assert job is not None
    result = run_clean(job, Throttler(0))
    assert result is not None
    cut = job.sources[1].base_offset + 1
    log.truncate_to(cut)  # a follower truncating between the rewrite and the commit
    before = records_of(log)
    assert not log.commit_clean(result)
    assert records_of(log) == before
    assert not [n for n in _files(log) if n.endswith(CLEANED_SUFFIX)]


def test_tombstones_go_only_after_delete_retention_ms_from_the_clean_that_kept_them(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    _write_versions(log)
    tomb = _put(log, b"k3", None)
    _roll(log)
    clean_now(log, T0)
    assert (tomb, b"k3", None) in records_of(log), "kept by the first clean"
    assert clean_now(log, T0 + RETENTION - 1, force=True) is not None
    assert (tomb, b"k3", None) in records_of(log), "kept until its horizon"
    assert log.clean_due(T0 + RETENTION, stable_end=log.log_end_offset) is not None, (
        "the horizon makes it due"
    )
    clean_now(log, T0 + RETENTION)
    assert not [r for r in records_of(log) if r[1] == b"k3"], "gone with every older record of its key"


def test_a_compacted_log_refuses_a_record_without_a_key(tmp_path: Path) -> None:
    log = _open(tmp_path / "p", Clock(T0))
    with pytest.raises(KeylessRecordError, match="record 1 has no key"):
        log.append_as_leader(build_batch([(b"k", b"v"), (None, b"v")]), leader_epoch=0)
    assert log.log_end_offset == 0
    plain = PartitionLog.open(tmp_path / "q", LogConfig(), now_ms=Clock(T0))
    plain.append_as_leader(build_batch([(None, b"v")]), leader_epoch=0)


def test_retention_does_not_delete_from_a_log_that_is_only_compacted(tmp_path: Path) -> None:
    clock = Clock(T0 + 10**9)
    log = _open(tmp_path / "p", clock, retention_ms=1)
    _write_versions(log, 3, 5)
    _roll(log)
    assert log.delete_old_segments(clock.now) == 0
    both = _open(tmp_path / "q", clock, retention_ms=1, cleanup_policy="compact,delete")
    _write_versions(both, 3, 5)
    _roll(both)
    assert both.delete_old_segments(clock.now) > 0


def test_the_last_batch_of_a_producer_survives_so_its_state_does(tmp_path: Path) -> None:
    """Every record of producer 7 is superseded by later writes of another producer; its last
    batch stays (empty), so a replica rebuilding producer state from the cleaned log (a new
    follower, or a recovery without snapshots) still takes the producer's next sequence. Without
    R5 the follower refused it: OutOfOrderSequenceError, unknown producer 7 must start at 0."""
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    for seq in range(3):
        log.append_as_leader(
            build_batch([(b"a", b"x")], timestamp_ms=T0, producer_id=7, producer_epoch=0, base_sequence=seq),
            leader_epoch=0,
        )
    _write_versions(log, 2, 5)
    _put(log, b"a", b"y")
    _roll(log)
    clean_now(log, T0)
    assert not [r for r in records_of(log) if r[2] == b"x"], "its records are gone"

    follower = _open(tmp_path / "f", clock)
    offset = 0
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes=1 << 20).records
        follower.append_as_follower(data)
        offset = follower.log_end_offset
    nxt = build_batch([(b"b", b"z")], timestamp_ms=T0, producer_id=7, producer_epoch=0, base_sequence=3)
    follower.append_as_leader(nxt, leader_epoch=1)  # in sequence: the state knows producer 7

    log.close()
    for _offset, snapshot in list_snapshots(tmp_path / "p"):
        snapshot.unlink()
    (tmp_path / "p" / ".sluice-clean-shutdown").unlink()
    rebuilt = _open(tmp_path / "p", clock)
    rebuilt.append_as_leader(nxt, leader_epoch=1)


def test_cleaning_keeps_leader_epochs_and_batches_keep_theirs(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    for epoch in range(3):
        for k in range(6):
            _put(log, f"k{k}".encode(), f"e{epoch}".encode(), epoch=epoch)
        log.assign_epoch(epoch + 1, log.log_end_offset)
    _roll(log)
    epochs = log.epoch_entries
    epoch_of = {h.base_offset: h.partition_leader_epoch for _o, h in _batches(log)}
    clean_now(log, T0)
    assert log.epoch_entries == epochs
    for _o, h in _batches(log):
        assert h.partition_leader_epoch == epoch_of[h.base_offset]


def _batches(log: PartitionLog) -> list[tuple[int, BatchHeader]]:
    out: list[tuple[int, BatchHeader]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes=1 << 20).records
        if not data:
            break
        for _pos, h in iter_batches(data):
            out.append((h.base_offset, h))
            offset = h.last_offset + 1
    return out


def test_indexes_are_rebuilt_so_every_offset_and_timestamp_is_found(tmp_path: Path) -> None:
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock, index_interval_bytes=0)
    for v in range(10):
        for k in range(10):
            log.append_as_leader(build_batch([(f"k{k}".encode(), b"v")], timestamp_ms=T0 + v), leader_epoch=0)
    _roll(log)
    clean_now(log, T0 + 100)
    for reopened in (False, True):
        if reopened:
            log.close()
            log = _open(tmp_path / "p", clock, index_interval_bytes=0)
        kept = [o for o, _k, _v in records_of(log)]
        for o in range(log.log_end_offset):
            r = log.read(o, max_bytes=100)
            first = next(h for _p, h in iter_batches(r.records))
            assert first.last_offset >= o and not [k for k in kept if o <= k < first.base_offset]
        hit = log.offset_for_timestamp(T0 + 9)
        assert hit is not None and hit.offset == kept[0]


def test_a_corrupt_batch_stops_the_clean_and_changes_nothing(tmp_path: Path) -> None:
    """Rewriting a corrupt batch would give it a fresh, valid CRC: the clean refuses instead."""
    clock = Clock(T0)
    log = _open(tmp_path / "p", clock)
    _write_versions(log)
    _roll(log)
    before = records_of(log)
    job = log.clean_job(T0, stable_end=log.log_end_offset, map_entries_max=10_000)
    assert job is not None
    first = log.directory / "00000000000000000000.log"
    data = bytearray(first.read_bytes())
    data[70] ^= 0xFF  # a byte of the first record
    first.write_bytes(bytes(data))
    with pytest.raises(Exception, match="CRC"):
        run_clean(job, Throttler(0))
    log.abandon_clean(job)
    assert not [n for n in _files(log) if n.endswith(CLEANED_SUFFIX)]
    first.write_bytes(bytes(data[:70]) + bytes([data[70] ^ 0xFF]) + bytes(data[71:]))
    assert records_of(log) == before


def test_the_throttler_holds_the_rate() -> None:
    import time

    throttler = Throttler(1_000_000)
    started = time.monotonic()
    for _ in range(10):
        throttler.take(50_000)
    assert time.monotonic() - started >= 0.45


keys = st.sampled_from([b"a", b"b", b"c", b"d", None])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.lists(st.tuples(keys, st.booleans()), min_size=1, max_size=3), min_size=1, max_size=30),
    st.lists(st.integers(0, 1500), min_size=1, max_size=3),
    st.integers(150, 800),
)
def test_cleans_on_disk_keep_what_a_compacted_log_must_read_as(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list,
    steps: list[int],
    segment_bytes: int,  # type: ignore[type-arg]
) -> None:
    """Batches written through the log (keyless ones as a client would write them to a topic
    compacted later: a plain log, opened again as compacted), cleaned at later and later times,
    read back as the model says. Keys: the strategy's; tombstones: None values."""
    path = tmp_path_factory.mktemp("prop") / "p"
    clock = Clock(T0)
    plain = PartitionLog.open(path, LogConfig(segment_bytes=segment_bytes), now_ms=clock)
    history: list[tuple[int, bytes | None, bool]] = []
    for batch in batches:
        records = [(k, None if t else b"v" * 10) for k, t in batch]
        first = plain.append_as_leader(build_batch(records, timestamp_ms=T0), leader_epoch=0).first_offset
        history.extend((first + i, k, t) for i, (k, t) in enumerate(batch))
    plain.close()
    log = _open(path, clock, segment_bytes=segment_bytes)
    first_cleaned_at: dict[int, int] = {}
    now = T0
    for step in steps:
        now += step
        clock.now = now
        clean_now(log, now, force=True)
        end = log.first_dirty_offset
        for o, _k, t in history:
            if t and o < end:
                first_cleaned_at.setdefault(o, now)
        got = [(o, k, v is None) for o, k, v in records_of(log)]
        check_compacted(
            got,
            history,
            end=end,
            now_ms=now,
            first_cleaned_at=first_cleaned_at,
            delete_retention_ms=RETENTION,
        )
    log.close()

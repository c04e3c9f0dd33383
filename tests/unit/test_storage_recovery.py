"""Crash recovery: torn tails, flipped bytes, broken indexes, and a model-based property test."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.storage import PartitionLog
from tests.unit._storage_helpers import Clock, batch, found_at, open_log, read_all


def _fill(path: Path, n: int, **cfg: object) -> tuple[list[int], int]:
    """Append ``n`` batches of varying sizes, abandon (crash). Returns batch end offsets and LEO."""
    log = open_log(path, **cfg)
    ends = []
    for i in range(n):
        info = log.append_as_leader(batch(1 + i % 3, value=b"x" * (10 + i)), leader_epoch=i // 4)
        ends.append(info.last_offset + 1)
    leo = log.log_end_offset
    log.abandon()
    return ends, leo


def _active_log_file(path: Path) -> Path:
    return sorted(path.glob("*.log"))[-1]


def test_truncate_at_every_byte_of_last_batch(tmp_path: Path) -> None:
    src = tmp_path / "src"
    ends, leo = _fill(src, 12, segment_bytes=700, index_interval_bytes=50)
    active = _active_log_file(src)
    size = active.stat().st_size
    last = len(batch(1 + 11 % 3, value=b"x" * 21))
    for cut in range(size - last, size):
        d = tmp_path / f"cut{cut}"
        shutil.copytree(src, d)
        with open(d / active.name, "r+b") as f:
            f.truncate(cut)
        log = PartitionLog.open(d, src_config())
        assert log.log_end_offset == ends[-2], cut
        assert read_all(log) == list(range(ends[-2]))
        info = log.append_as_leader(batch(2), leader_epoch=9)
        assert info.first_offset == ends[-2]
        assert read_all(log) == list(range(ends[-2] + 2))
        log.close()
        reopened = PartitionLog.open(d, src_config())
        assert reopened.log_end_offset == ends[-2] + 2
        reopened.close()
        shutil.rmtree(d)
    # The full file survives intact.
    log = PartitionLog.open(src, src_config())
    assert log.log_end_offset == leo and read_all(log) == list(range(leo))


def src_config() -> object:
    from sluice.storage import LogConfig

    return LogConfig(segment_bytes=700, index_interval_bytes=50)


def test_flipped_byte_truncates_last_batch(tmp_path: Path) -> None:
    ends, _leo = _fill(tmp_path / "p", 8, segment_bytes=10_000, index_interval_bytes=0)
    active = _active_log_file(tmp_path / "p")
    data = bytearray(active.read_bytes())
    last = len(batch(1 + 7 % 3, value=b"x" * 17))
    data[len(data) - last // 2] ^= 0xFF
    active.write_bytes(bytes(data))
    log = open_log(tmp_path / "p", segment_bytes=10_000, index_interval_bytes=0)
    assert log.log_end_offset == ends[-2]
    assert active.stat().st_size == len(data) - last
    # index rebuilt and consistent: every offset readable
    assert read_all(log) == list(range(ends[-2]))


def test_corrupt_index_files_rebuilt_on_clean_open(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=600, index_interval_bytes=0)
    for i in range(20):
        log.append_as_leader(batch(2, ts=100 + i), leader_epoch=0)
    log.close()
    indexes = sorted((tmp_path / "p").glob("*.index"))
    times = sorted((tmp_path / "p").glob("*.timeindex"))
    indexes[0].write_bytes(indexes[0].read_bytes()[:-3])  # size not a multiple of 8
    indexes[1].write_bytes(b"\x7f\xff\xff\xff\x00\x00\x00\x01")  # points past the log
    times[0].write_bytes(b"garbage!" * 3)
    indexes[-1].unlink()
    log = open_log(tmp_path / "p", segment_bytes=600, index_interval_bytes=0)
    assert read_all(log) == list(range(40))
    assert found_at(log.offset_for_timestamp(105)) == (10, 105)
    for o in range(40):
        r = log.read(o, max_bytes=1)
        assert r.first_offset <= o < r.first_offset + 2


def test_unclean_open_rebuilds_producer_state_and_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=400)
    for seq in range(0, 30, 3):
        data = batch(3, producer_id=7, producer_epoch=0, base_sequence=seq)
        log.append_as_leader(data, leader_epoch=seq // 10)
    entries = log.epoch_entries
    log.abandon()
    (tmp_path / "p" / "recovery-point").unlink()
    log = open_log(tmp_path / "p", segment_bytes=400)
    assert log.epoch_entries == entries
    dup = log.append_as_leader(batch(3, producer_id=7, producer_epoch=0, base_sequence=27), leader_epoch=2)
    assert dup.duplicate and dup.first_offset == 27
    assert (
        log.append_as_leader(
            batch(1, producer_id=7, producer_epoch=0, base_sequence=30), leader_epoch=2
        ).first_offset
        == 30
    )


def test_lost_segment_tail_after_crash_deletes_later_segments(tmp_path: Path) -> None:
    """A corrupt batch in a non-last unflushed segment cuts the log there."""
    _fill(tmp_path / "p", 20, segment_bytes=300, index_interval_bytes=0)
    logs = sorted((tmp_path / "p").glob("*.log"))
    assert len(logs) >= 3
    victim = logs[1]
    data = bytearray(victim.read_bytes())
    data[-5] ^= 1
    victim.write_bytes(bytes(data))
    log = open_log(tmp_path / "p", segment_bytes=300, index_interval_bytes=0)
    assert sorted((tmp_path / "p").glob("*.log")) == logs[:2]
    leo = log.log_end_offset
    assert leo < int(logs[2].stem)
    assert read_all(log) == list(range(leo))
    assert log.append_as_leader(batch(1), leader_epoch=99).first_offset == leo


def test_flushed_prefix_not_rescanned(tmp_path: Path) -> None:
    """Segments below the recovery point are trusted (only indexes are validated)."""
    log = open_log(tmp_path / "p", segment_bytes=300, index_interval_bytes=0)
    for _ in range(10):
        log.append_as_leader(batch(1), leader_epoch=0)
    log.flush()
    rp = log.recovery_point
    assert rp == 10
    log.append_as_leader(batch(1), leader_epoch=0)
    log.abandon()
    log = open_log(tmp_path / "p", segment_bytes=300, index_interval_bytes=0)
    assert log.log_end_offset == 11 and read_all(log) == list(range(11))


# --- model-based property test ----------------------------------------------------------------

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.integers(1, 4), min_size=1, max_size=3)),
        st.tuples(st.just("truncate"), st.integers(0, 60)),
        st.tuples(st.just("reopen"), st.booleans()),
        st.tuples(st.just("retain"), st.integers(0, 3)),
        st.tuples(st.just("tear"), st.integers(1, 200)),
    ),
    max_size=25,
)


@settings(max_examples=100, deadline=None)
@given(ops=_ops)
def test_model(ops: list[tuple[str, object]]) -> None:
    d = Path(tempfile.mkdtemp()) / "p"
    clock = Clock(1000)
    cfg = {"segment_bytes": 1000, "index_interval_bytes": 64, "retention_bytes": -1}
    log = open_log(d, clock, **cfg)
    model: list[int] = []  # batch sizes (record counts) in order, with their base offsets
    bases: list[int] = []
    start = 0
    try:
        for op, arg in ops:
            if op == "append":
                assert isinstance(arg, list)
                data = b"".join(batch(n, ts=clock.now) for n in arg)
                info = log.append_as_leader(data, leader_epoch=1)
                nxt = bases[-1] + model[-1] if bases else start
                assert info.first_offset == nxt
                for n in arg:
                    bases.append(nxt)
                    model.append(n)
                    nxt += n
            elif op == "truncate":
                assert isinstance(arg, int)
                log.truncate_to(arg)
                if arg < start:
                    bases, model, start = [], [], arg
                else:
                    keep = [i for i, b in enumerate(bases) if b + model[i] <= arg]
                    bases, model = [bases[i] for i in keep], [model[i] for i in keep]
            elif op == "reopen":
                if arg:
                    log.close()
                else:
                    if len(bases) % 2:
                        log.flush()
                    log.abandon()
                log = open_log(d, clock, **cfg)
            elif op == "retain":
                assert isinstance(arg, int)
                seg_bases = sorted(int(p.stem) for p in d.glob("*.log"))
                log.delete_old_segments(clock.now)  # no limits -> no-op
                if arg and len(seg_bases) > 1:
                    new_cfg = dict(cfg, retention_bytes=0)
                    log.close()
                    log = open_log(d, clock, **new_cfg)
                    log.delete_old_segments(clock.now)
                    new_start = log.log_start_offset
                    log.close()
                    log = open_log(d, clock, **cfg)
                    keep = [i for i, b in enumerate(bases) if b >= new_start]
                    bases, model = [bases[i] for i in keep], [model[i] for i in keep]
                    start = new_start
            elif op == "tear":
                # crash, then lose the tail of the active segment: the model keeps whole batches only
                assert isinstance(arg, int)
                log.abandon()
                active = sorted(d.glob("*.log"))[-1]
                size = active.stat().st_size
                cut = max(0, size - arg)
                with open(active, "r+b") as f:
                    f.truncate(cut)
                seg_base = int(active.stem)
                (d / "recovery-point").write_text(str(seg_base))
                log = open_log(d, clock, **cfg)
                pos = 0
                keep_n = 0
                for i, b in enumerate(bases):
                    if b < seg_base:
                        keep_n = i + 1
                        continue
                    sz = len(batch(model[i], ts=clock.now))
                    if pos + sz <= cut:
                        keep_n = i + 1
                        pos += sz
                    else:
                        break
                bases, model = bases[:keep_n], model[:keep_n]
            expected_leo = bases[-1] + model[-1] if bases else max(start, log.log_start_offset)
            assert log.log_end_offset == expected_leo, (op, arg)
            assert read_all(log) == [o for b, n in zip(bases, model, strict=True) for o in range(b, b + n)]
            for i, b in enumerate(bases):
                r = log.read(b + model[i] - 1, max_bytes=1)
                assert r.first_offset == b
    finally:
        log.abandon()
        shutil.rmtree(d.parent, ignore_errors=True)


def test_recovery_point_file_garbage_means_full_recovery(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=300)
    for _ in range(5):
        log.append_as_leader(batch(1), leader_epoch=0)
    log.abandon()
    (tmp_path / "p" / "recovery-point").write_bytes(b"\x00\xff")
    log = open_log(tmp_path / "p", segment_bytes=300)
    assert read_all(log) == list(range(5))
    assert os.path.exists(tmp_path / "p" / "recovery-point")

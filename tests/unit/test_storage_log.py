"""PartitionLog: appends, reads, rolls, timestamps, retention, truncation, follower appends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sluice.protocol.records import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    parse_header,
    validate_batch,
)
from sluice.storage import (
    CorruptRecordError,
    InvalidRecordError,
    LogClosedError,
    LogConfig,
    OffsetOutOfRangeError,
    PartitionLog,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
    known_topic_configs,
)
from sluice.storage.segment import TimestampOffset
from tests.unit._storage_helpers import Clock, batch, found_at, offsets_in, open_log, read_all


def test_append_assigns_offsets_and_stamps(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    info = log.append_as_leader(batch(3), leader_epoch=5)
    assert (info.first_offset, info.last_offset, info.record_count, info.duplicate) == (0, 2, 3, False)
    info = log.append_as_leader(batch(2) + batch(4), leader_epoch=5)
    assert (info.first_offset, info.last_offset, info.record_count) == (3, 8, 6)
    assert log.log_end_offset == 9
    r = log.read(0, max_bytes=1 << 20)
    heads = [h for _, h in iter_batches(r.records)]
    assert [h.base_offset for h in heads] == [0, 3, 5]
    assert all(h.partition_leader_epoch == 5 for h in heads)
    for pos, h in iter_batches(r.records):
        validate_batch(r.records, pos, h)
    assert [rec.offset for rec in decode_records(r.records, 0, heads[0])] == [0, 1, 2]
    assert r.log_end_offset == 9 and r.log_start_offset == 0 and r.first_offset == 0
    log.close()
    with pytest.raises(LogClosedError):
        log.read(0, max_bytes=10)


def test_segments_roll_and_read_across(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=1000, index_interval_bytes=100)
    for _ in range(100):
        log.append_as_leader(batch(2), leader_epoch=0)
    assert log.segment_count > 10
    names = sorted(p.name for p in (tmp_path / "p").glob("*.log"))
    assert all(len(n) == len("00000000000000000000.log") for n in names)
    assert names[0] == "00000000000000000000.log"
    assert read_all(log) == list(range(200))
    # every segment respects the size limit (each holds at least one batch)
    for p in (tmp_path / "p").glob("*.log"):
        assert p.stat().st_size <= 1000
    log.close()
    log = open_log(tmp_path / "p", segment_bytes=1000, index_interval_bytes=100)
    assert read_all(log) == list(range(200))
    assert log.append_as_leader(batch(1), leader_epoch=0).first_offset == 200


def test_read_from_middle_of_batch_and_limits(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", index_interval_bytes=0)
    for _ in range(10):
        log.append_as_leader(batch(5), leader_epoch=0)
    size = len(batch(5))
    r = log.read(12, max_bytes=1)  # min_one_batch: the containing batch, whole
    assert r.first_offset == 10 and len(r.records) == size
    assert log.read(12, max_bytes=1, min_one_batch=False).records == b""
    r = log.read(12, max_bytes=size * 3 + 5)
    assert offsets_in(r.records)[0] == 10 and len(r.records) == size * 3
    r = log.read(12, max_bytes=1 << 20, max_offset=25)
    assert [h.base_offset for _, h in iter_batches(r.records)] == [10, 15, 20]
    assert log.read(25, max_bytes=1 << 20, max_offset=25).records == b""
    assert log.read(50, max_bytes=1 << 20).records == b""  # == LEO
    with pytest.raises(OffsetOutOfRangeError):
        log.read(51, max_bytes=100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, max_bytes=100)


def test_offset_for_timestamp(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=600, index_interval_bytes=0)
    ts = [100, 200, 150, 300, 300, 400, 250, 500]
    for t in ts:
        log.append_as_leader(batch(2, ts=t), leader_epoch=0)
    assert log.segment_count > 1
    assert found_at(log.offset_for_timestamp(0)) == (0, 100)
    assert found_at(log.offset_for_timestamp(100)) == (0, 100)
    assert found_at(log.offset_for_timestamp(101)) == (2, 200)
    assert found_at(log.offset_for_timestamp(201)) == (6, 300)
    assert found_at(log.offset_for_timestamp(301)) == (10, 400)
    assert found_at(log.offset_for_timestamp(450)) == (14, 500)
    assert log.offset_for_timestamp(501) is None
    log.close()
    log = open_log(tmp_path / "p", segment_bytes=600, index_interval_bytes=0)
    assert found_at(log.offset_for_timestamp(301)) == (10, 400)
    assert found_at(log.offset_for_timestamp(450)) == (14, 500)


def records_at(times: list[int], *, compression: int = 0) -> bytes:
    """One batch of records with these timestamps, in this order."""
    return build_batch(
        [Record(0, t, f"k{i}".encode(), b"v") for i, t in enumerate(times)], compression=compression
    )


@pytest.mark.parametrize("compression", [COMPRESSION_NONE, COMPRESSION_ZSTD])
def test_offset_for_timestamp_finds_the_record_inside_a_batch(tmp_path: Path, compression: int) -> None:
    """Kafka answers with the first record at or after the time, not the batch holding it."""
    log = open_log(tmp_path / "p", segment_bytes=600, index_interval_bytes=0)
    log.append_as_leader(records_at([1234, 999_999_999_999], compression=compression), leader_epoch=3)
    log.append_as_leader(records_at([50, 2000, 40, 3000], compression=compression), leader_epoch=4)
    assert found_at(log.offset_for_timestamp(999_999_999_999)) == (1, 999_999_999_999)
    assert found_at(log.offset_for_timestamp(1235)) == (1, 999_999_999_999)
    assert found_at(log.offset_for_timestamp(1234)) == (0, 1234)
    assert log.offset_for_timestamp(10**12) is None
    # the first record in log order at or after the time, though a later one (3000) is closer
    assert log.offset_for_timestamp(2500) == TimestampOffset(1, 999_999_999_999, 3)
    hit = log.max_timestamp_offset()
    assert hit == TimestampOffset(1, 999_999_999_999, 3)


def test_max_timestamp_offset_is_the_first_record_with_the_largest_time(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=300, index_interval_bytes=0)
    assert log.max_timestamp_offset() is None
    log.append_as_leader(records_at([10, 20]), leader_epoch=0)
    log.append_as_leader(records_at([5, 70, 30, 70]), leader_epoch=1)  # offsets 2..5
    log.append_as_leader(records_at([70, 60]), leader_epoch=2)  # the same max again, later
    log.append_as_leader(records_at([1]), leader_epoch=2)
    assert log.segment_count > 1
    assert log.max_timestamp_offset() == TimestampOffset(3, 70, 1)
    log.close()
    log = open_log(tmp_path / "p", segment_bytes=300, index_interval_bytes=0)
    assert log.max_timestamp_offset() == TimestampOffset(3, 70, 1)
    assert found_at(log.offset_for_timestamp(21)) == (3, 70)


def test_log_append_time_lookups_answer_the_first_record_of_the_batch(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", Clock(777), message_timestamp_type="LogAppendTime")
    log.append_as_leader(records_at([1, 2, 3]), leader_epoch=0)
    assert found_at(log.offset_for_timestamp(777)) == (0, 777)
    assert found_at(log.max_timestamp_offset()) == (0, 777)


def test_log_append_time(tmp_path: Path) -> None:
    clock = Clock(777)
    log = open_log(tmp_path / "p", clock, message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(batch(2, ts=5), leader_epoch=0)
    assert info.log_append_time == 777
    r = log.read(0, max_bytes=1000)
    h = parse_header(r.records, 0)
    validate_batch(r.records, 0, h)
    assert h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == 777
    assert log.append_as_leader(batch(1), leader_epoch=0, now_ms=900).log_append_time == 900


def test_validation_appends_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", max_message_bytes=500)
    good = batch(1)
    bad_crc = bytearray(batch(1))
    bad_crc[-1] ^= 1
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good + bytes(bad_crc), leader_epoch=0)
    with pytest.raises(CorruptRecordError):
        log.append_as_leader(good + good[:30], leader_epoch=0)
    magic1 = bytearray(good)
    magic1[16] = 1
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(good + bytes(magic1), leader_epoch=0)
    with pytest.raises(RecordTooLargeError):
        log.append_as_leader(good + batch(1, value=b"x" * 600), leader_epoch=0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(b"", leader_epoch=0)
    assert log.log_end_offset == 0 and log.size_bytes == 0


def test_retention_by_time_and_size(tmp_path: Path) -> None:
    clock = Clock(10_000)
    one = len(batch(1)) + 10  # one batch per segment
    log = open_log(tmp_path / "p", clock, segment_bytes=one, retention_ms=1000)
    for t in range(10):
        log.append_as_leader(batch(1, ts=1000 + t * 1000), leader_epoch=0)
    segs = log.segment_count
    assert segs == 10
    assert log.delete_old_segments(5_500) == 4  # ts 1000..4000 are older than 4500
    assert log.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, max_bytes=100)
    assert read_all(log) == list(range(4, 10))
    # only segments wholly below the high watermark; never the active segment
    assert log.delete_old_segments(10**9, high_watermark=8) == 4
    assert log.delete_old_segments(10**9) == 1
    assert log.segment_count == 1 and log.log_start_offset == 9
    log.close()
    log = open_log(tmp_path / "p", clock, segment_bytes=one, retention_ms=1000)
    assert log.log_start_offset == 9 and log.log_end_offset == 10

    log2 = open_log(tmp_path / "q", clock, segment_bytes=one, retention_bytes=3 * len(batch(1)))
    for _ in range(10):
        log2.append_as_leader(batch(1, ts=clock.now), leader_epoch=0)
    assert log2.delete_old_segments(clock.now) == 7
    assert log2.size_bytes == 3 * len(batch(1))


def test_truncate_to(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=500, index_interval_bytes=0)
    for e in range(6):
        log.append_as_leader(batch(3, ts=100 + e), leader_epoch=e // 2)
    assert log.epoch_entries == [(0, 0), (1, 6), (2, 12)]
    log.truncate_to(10)  # inside batch 9..11 -> rounds down to 9
    assert log.log_end_offset == 9
    assert read_all(log) == list(range(9))
    assert log.epoch_entries == [(0, 0), (1, 6)]
    assert log.offset_for_timestamp(104) is None
    assert log.append_as_leader(batch(1), leader_epoch=3).first_offset == 9
    assert log.end_offset_for_epoch(1) == (1, 9)
    log.truncate_to(100)  # beyond LEO: no-op
    assert log.log_end_offset == 10
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.size_bytes == 0 and log.epoch_entries == []
    log.truncate_fully_and_start_at(42)
    assert (log.log_start_offset, log.log_end_offset) == (42, 42)
    assert log.append_as_leader(batch(2), leader_epoch=7).first_offset == 42
    log.close()
    log = open_log(tmp_path / "p", segment_bytes=500, index_interval_bytes=0)
    assert (log.log_start_offset, log.log_end_offset) == (42, 44)
    assert sorted(p.name for p in (tmp_path / "p").glob("*.log")) == ["00000000000000000042.log"]


def test_follower_append(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "l", segment_bytes=400)
    for e in (1, 1, 2, 2, 4):
        leader.append_as_leader(batch(2), leader_epoch=e)
    follower = open_log(tmp_path / "f", segment_bytes=400)
    offset = 0
    while offset < leader.log_end_offset:
        data = leader.read(offset, max_bytes=1 << 20).records
        info = follower.append_as_follower(data)
        offset = info.last_offset + 1
    assert follower.log_end_offset == 10
    assert follower.epoch_entries == leader.epoch_entries == [(1, 0), (2, 4), (4, 8)]
    assert read_all(follower) == list(range(10))
    with pytest.raises(UnexpectedAppendOffsetError):
        follower.append_as_follower(leader.read(8, max_bytes=1 << 20).records)
    assert follower.append_as_follower(b"").record_count == 0


def test_flush_policy(tmp_path: Path) -> None:
    clock = Clock(0)
    log = open_log(tmp_path / "p", clock, flush_messages=3)
    log.append_as_leader(batch(2), leader_epoch=0)
    assert log.recovery_point == 0
    log.append_as_leader(batch(1), leader_epoch=0)
    assert log.recovery_point == 3  # fsynced before returning
    log2 = open_log(tmp_path / "q", clock, flush_ms=100)
    log2.append_as_leader(batch(1), leader_epoch=0)
    assert not log2.needs_flush_by_time(50)
    assert log2.needs_flush_by_time(100)
    log2.flush()
    assert not log2.needs_flush_by_time(1000) and log2.recovery_point == 1
    log3 = open_log(tmp_path / "r", clock)
    log3.append_as_leader(batch(1), leader_epoch=0)
    assert not log3.needs_flush_by_time(10**12) and log3.recovery_point == 0


def test_delete(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append_as_leader(batch(1), leader_epoch=0)
    log.delete()
    assert not (tmp_path / "p").exists()


def test_leader_epoch_cache(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    assert log.latest_epoch() == -1 and log.end_offset_for_epoch(0) == (-1, -1)
    log.append_as_leader(batch(5), leader_epoch=1)
    log.append_as_leader(batch(5), leader_epoch=3)
    log.append_as_leader(batch(5), leader_epoch=3)
    log.append_as_leader(batch(5), leader_epoch=6)
    assert log.epoch_entries == [(1, 0), (3, 5), (6, 15)]
    assert log.end_offset_for_epoch(6) == (6, 20)  # latest -> LEO
    assert log.end_offset_for_epoch(3) == (3, 15)
    assert log.end_offset_for_epoch(4) == (3, 15)  # hole: floor epoch, next start
    assert log.end_offset_for_epoch(0) == (0, 0)  # older than all: Kafka answers (requested, first start)
    assert log.end_offset_for_epoch(7) == (-1, -1)
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    text = (tmp_path / "p" / "leader-epoch-checkpoint").read_text()
    assert text == "0\n3\n1 0\n3 5\n6 15\n"
    log.assign_epoch(4, 10)  # non-monotonic: removes entries with epoch >= 4 or start >= 10
    assert log.epoch_entries == [(1, 0), (3, 5), (4, 10)]
    log.close()
    log = open_log(tmp_path / "p")
    assert log.epoch_entries == [(1, 0), (3, 5), (4, 10)]


def test_config_parsing() -> None:
    cfg = LogConfig.from_topic_config(
        {
            "segment.bytes": "1024",
            "retention.ms": "-1",
            "message.timestamp.type": "LogAppendTime",
            "flush.messages": "1",
            "min.insync.replicas": "2",
            "unclean.leader.election.enable": "true",
        }
    )
    assert cfg.segment_bytes == 1024 and cfg.retention_ms == -1 and cfg.log_append_time
    assert cfg.flush_messages == 1 and cfg.min_insync_replicas == 2 and cfg.unclean_leader_election_enable
    assert cfg.to_topic_config()["segment.bytes"] == "1024"
    for key, value in [
        ("segment.bytes", "abc"),
        ("segment.bytes", "1"),
        ("cleanup.policy", "compress"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("message.timestamp.type", "Now"),
        ("no.such.key", "1"),
        ("flush.messages", "0"),
        ("unclean.leader.election.enable", "yes"),
    ]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")) as exc:
            LogConfig.from_topic_config({key: value})
        assert value in str(exc.value)
    known = known_topic_configs()
    assert known["retention.ms"][0] == str(7 * 24 * 3600 * 1000)
    assert known["max.message.bytes"][0] == "1048588"
    assert "cleanup.policy" in known and "min.insync.replicas" in known


def test_read_throughput_sanity(tmp_path: Path) -> None:
    """Reads are one pread per call: 1 MiB reads over 16 KiB batches stay fast."""
    import time

    log = open_log(tmp_path / "p")
    payload = build_batch([(None, os.urandom(16 * 1024))], timestamp_ms=1)
    for _ in range(256):
        log.append_as_leader(payload, leader_epoch=0)
    t0 = time.perf_counter()
    total = 0
    for _ in range(20):
        offset = 0
        while offset < log.log_end_offset:
            r = log.read(offset, max_bytes=1 << 20)
            total += len(r.records)
            offset = parse_header(r.records, 0).base_offset + len(r.records) // len(payload)
    elapsed = time.perf_counter() - t0
    assert total >= 20 * 256 * len(payload) * 0.99
    assert total / elapsed > 100e6, f"{total / elapsed / 1e6:.0f} MB/s"


def test_open_wrong_dir_contents_are_ignored(tmp_path: Path) -> None:
    d = tmp_path / "p"
    d.mkdir()
    (d / "junk.txt").write_text("x")
    (d / "00000000000000000077.index").write_bytes(b"\0" * 8)  # orphan index
    log = PartitionLog.open(d, LogConfig())
    assert log.log_end_offset == 0
    assert not (d / "00000000000000000077.index").exists()

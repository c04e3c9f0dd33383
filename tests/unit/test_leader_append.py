"""What a leader appends under its topic's config (storage/leader_append.py, through
PartitionLog.append_as_leader): compression.type, the timestamp bounds, and the rolls of
segment.jitter.ms and segment.index.bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.protocol.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    TIMESTAMP_LOG_APPEND_TIME,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    validate_batch,
)
from sluice.storage import InvalidRecordError, LogConfig, RecordTooLargeError
from sluice.storage.errors import InvalidTimestampError, KeylessRecordError, RecordError
from sluice.storage.leader_append import check_records, encode_for_topic, timestamp_in_bounds
from sluice.storage.segment import roll_jitter_ms
from tests.unit._storage_helpers import Clock, open_log

NOW = 1_700_000_000_000
HOUR = 3_600_000


def records(times: list[int], value: bytes = b"v" * 50) -> list[Record]:
    return [Record(0, t, f"k{i}".encode(), value) for i, t in enumerate(times)]


def stored(log: object) -> list[tuple[int, int, int, int]]:
    """(base offset, codec, records, producer id) of every batch of a one-segment log."""
    data = log.read(0, max_bytes=1 << 20).records  # type: ignore[attr-defined]
    out = []
    for pos, h in iter_batches(data):
        validate_batch(data, pos, h)
        out.append((h.base_offset, h.compression, h.records_count, h.producer_id))
    return out


# -- the timestamp bounds ---------------------------------------------------------------------------


def test_timestamp_in_bounds_is_kafkas_rule() -> None:
    assert timestamp_in_bounds(NOW - HOUR, NOW, HOUR, 0)
    assert not timestamp_in_bounds(NOW - HOUR - 1, NOW, HOUR, 0)
    assert timestamp_in_bounds(NOW + 10, NOW, 0, 10)
    assert not timestamp_in_bounds(NOW + 11, NOW, 0, 10)
    assert timestamp_in_bounds(-1, NOW, 0, 0)  # no timestamp: never refused


def test_a_record_older_than_the_first_of_its_batch_is_found() -> None:
    """A batch's header holds its first and largest timestamps only: every record is read."""
    config = LogConfig(message_timestamp_before_max_ms=HOUR)
    buf = build_batch(records([NOW, NOW - 2 * HOUR, NOW]))
    batches = list(iter_batches(buf))
    with pytest.raises(InvalidTimestampError, match=r"1 of the 3 records of batch 0 were refused") as raised:
        check_records(buf, batches, config, NOW)
    assert [e.batch_index for e in raised.value.record_errors] == [1]
    check_records(buf, batches, LogConfig(message_timestamp_before_max_ms=3 * HOUR), NOW)


def test_the_deprecated_difference_bounds_each_side_that_is_unset() -> None:
    config = LogConfig(message_timestamp_difference_max_ms=HOUR, message_timestamp_after_max_ms=10 * HOUR)
    assert (config.timestamp_before_max_ms, config.timestamp_after_max_ms) == (HOUR, 10 * HOUR)
    buf = build_batch(records([NOW + 5 * HOUR]))
    check_records(buf, list(iter_batches(buf)), config, NOW)
    buf = build_batch(records([NOW - 2 * HOUR]))
    with pytest.raises(InvalidTimestampError):
        check_records(buf, list(iter_batches(buf)), config, NOW)


# -- refused records, one by one (KIP-467) ---------------------------------------------------------


def keyed(keys: list[bytes | None], times: list[int]) -> bytes:
    return build_batch([Record(0, t, k, b"v") for k, t in zip(keys, times, strict=True)])


def test_every_refused_record_is_named_by_its_index_in_the_batch() -> None:
    """Kafka 3.9.1 answered a batch of four records to a compacted topic, records 1 and 3
    without keys, INVALID_RECORD with record_errors [1, 3] (tests/conformance: record_errors);
    before, Sluice stopped at the first keyless record and named none: librdkafka failed all
    four with INVALID_RECORD where Kafka fails 1 and 3 with it and 0 and 2 with
    _INVALID_DIFFERENT_RECORD."""
    buf = keyed([b"k", None, b"k", None], [NOW] * 4)
    with pytest.raises(KeylessRecordError) as raised:
        check_records(buf, list(iter_batches(buf)), LogConfig(cleanup_policy="compact"), NOW)
    assert [e.batch_index for e in raised.value.record_errors] == [1, 3]
    assert all("has no key" in e.message for e in raised.value.record_errors)


def test_a_timestamp_refusal_makes_the_batch_invalid_timestamp_with_keyless_records_named_too() -> None:
    """Kafka's rule: a record is checked for its key first, then its timestamp; if any record
    of the batch was refused for its timestamp the batch is INVALID_TIMESTAMP, and every
    refused record is listed (Kafka: record_errors [0, 1], INVALID_TIMESTAMP)."""
    config = LogConfig(cleanup_policy="compact", message_timestamp_before_max_ms=HOUR)
    buf = keyed([None, b"k", b"k"], [NOW, NOW - 2 * HOUR, NOW])
    with pytest.raises(InvalidTimestampError) as raised:
        check_records(buf, list(iter_batches(buf)), config, NOW)
    assert [e.batch_index for e in raised.value.record_errors] == [0, 1]


def test_a_batch_the_producer_stamped_log_append_time_is_refused_where_the_broker_would_stamp_it() -> None:
    buf = build_batch([Record(0, NOW, b"k", b"v")], log_append_time=True)
    with pytest.raises(InvalidTimestampError) as raised:
        check_records(buf, list(iter_batches(buf)), LogConfig(message_timestamp_type="LogAppendTime"), NOW)
    assert raised.value.record_errors == (RecordError(0, raised.value.record_errors[0].message),)
    # a CreateTime topic keeps the records' own timestamps (Kafka's first branch): accepted
    check_records(buf, list(iter_batches(buf)), LogConfig(), NOW)


def test_only_the_first_batch_with_refused_records_is_reported() -> None:
    config = LogConfig(cleanup_policy="compact")
    buf = keyed([b"a"], [NOW]) + keyed([b"b", None], [NOW, NOW]) + keyed([None], [NOW])
    with pytest.raises(KeylessRecordError, match="of batch 1") as raised:
        check_records(buf, list(iter_batches(buf)), config, NOW)
    assert [e.batch_index for e in raised.value.record_errors] == [1]


def test_a_log_refuses_the_whole_request_and_appends_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", Clock(NOW), message_timestamp_after_max_ms=HOUR)
    good, bad = build_batch(records([NOW])), build_batch(records([NOW + 2 * HOUR]))
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(good + bad, leader_epoch=0)
    assert log.log_end_offset == 0
    assert log.append_as_leader(good, leader_epoch=0).last_offset == 0


def test_log_append_time_topics_take_any_timestamp(tmp_path: Path) -> None:
    log = open_log(
        tmp_path / "p", Clock(NOW), message_timestamp_type="LogAppendTime", message_timestamp_before_max_ms=0
    )
    log.append_as_leader(build_batch(records([1])), leader_epoch=0)
    assert log.log_end_offset == 1


# -- compression.type ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "codec"),
    [
        ("zstd", COMPRESSION_ZSTD),
        ("gzip", COMPRESSION_GZIP),
        ("uncompressed", COMPRESSION_NONE),
        ("lz4", COMPRESSION_LZ4),
    ],
)
def test_the_leader_stores_every_batch_in_the_topics_codec(tmp_path: Path, topic: str, codec: int) -> None:
    log = open_log(tmp_path / "p", Clock(NOW), compression_type=topic)
    codecs = (COMPRESSION_NONE, COMPRESSION_SNAPPY, COMPRESSION_ZSTD)
    sent = [
        build_batch(
            records([NOW, NOW + 1]), compression=c, producer_id=9, producer_epoch=0, base_sequence=2 * i
        )
        for i, c in enumerate(codecs)
    ]
    info = log.append_as_leader(b"".join(sent), leader_epoch=1)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 5, 6)
    assert stored(log) == [(0, codec, 2, 9), (2, codec, 2, 9), (4, codec, 2, 9)]
    data = log.read(0, max_bytes=1 << 20).records
    values = [r.value for pos, h in iter_batches(data) for r in decode_records(data, pos, h)]
    assert values == [b"v" * 50] * 6


def test_producer_keeps_each_batch_as_sent(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", Clock(NOW))
    batch = build_batch(records([NOW]), compression=COMPRESSION_SNAPPY)
    log.append_as_leader(batch, leader_epoch=0)
    assert log.read(0, max_bytes=1 << 20).records[16:] == batch[16:]  # all but the stamped offset and epoch


def test_a_retried_batch_is_found_a_duplicate_after_re_encoding(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", Clock(NOW), compression_type="zstd")
    batch = build_batch(records([NOW]), producer_id=3, producer_epoch=0, base_sequence=0)
    first = log.append_as_leader(batch, leader_epoch=0)
    again = log.append_as_leader(batch, leader_epoch=0)
    assert again.duplicate and again.first_offset == first.first_offset
    assert log.log_end_offset == 1


def test_log_append_time_is_stamped_on_the_re_encoded_batch(tmp_path: Path) -> None:
    log = open_log(
        tmp_path / "p", Clock(NOW), compression_type="gzip", message_timestamp_type="LogAppendTime"
    )
    log.append_as_leader(build_batch(records([5, 6])), leader_epoch=0)
    data = log.read(0, max_bytes=1 << 20).records
    ((pos, h),) = list(iter_batches(data))
    validate_batch(data, pos, h)
    assert h.compression == COMPRESSION_GZIP and h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    assert [r.timestamp for r in decode_records(data, pos, h)] == [NOW, NOW]


def test_a_batch_too_large_once_re_encoded_is_refused(tmp_path: Path) -> None:
    batch = build_batch(records([NOW], value=b"x" * 5000), compression=COMPRESSION_ZSTD)
    assert len(batch) < 500
    log = open_log(tmp_path / "p", Clock(NOW), compression_type="uncompressed", max_message_bytes=1000)
    with pytest.raises(RecordTooLargeError, match="once stored as uncompressed"):
        log.append_as_leader(batch, leader_epoch=0)
    assert log.log_end_offset == 0


def test_encode_for_topic_leaves_batches_already_in_the_codec_untouched() -> None:
    config = LogConfig(compression_type="zstd")
    buf = build_batch(records([NOW]), compression=COMPRESSION_ZSTD)
    batches = list(iter_batches(buf))
    assert encode_for_topic(buf, batches, config) == (buf, batches)


def test_unknown_compression_types_and_levels_are_refused() -> None:
    with pytest.raises(ValueError, match=r"compression\.type"):
        LogConfig.from_topic_config({"compression.type": "brotli"})
    with pytest.raises(ValueError, match=r"compression\.lz4\.level"):
        LogConfig.from_topic_config({"compression.lz4.level": "18"})
    assert LogConfig.from_topic_config({"compression.gzip.level": "-1"}).compression_gzip_level == -1


def test_a_clients_control_batch_is_refused_before_anything_is_re_encoded(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", Clock(NOW), compression_type="zstd")
    with pytest.raises(InvalidRecordError, match="control"):
        log.append_as_leader(build_batch(records([NOW]), control=True), leader_epoch=0)
    assert log.log_end_offset == 0


# -- rolls ------------------------------------------------------------------------------------------


def test_roll_jitter_is_drawn_below_the_smaller_of_jitter_and_segment_ms() -> None:
    assert roll_jitter_ms(0, 1000) == 0
    assert roll_jitter_ms(500, 1000, draw=lambda n: n - 1) == 499
    assert roll_jitter_ms(5000, 1000, draw=lambda n: n - 1) == 999


def test_a_segment_rolls_segment_jitter_ms_earlier(tmp_path: Path) -> None:
    clock = Clock(NOW)
    log = open_log(tmp_path / "p", clock, segment_ms=10_000, segment_jitter_ms=4_000)
    log._segments[-1].roll_jitter_ms = 3_000  # the draw for this segment
    log.append_as_leader(build_batch(records([NOW])), leader_epoch=0)
    log.append_as_leader(build_batch(records([NOW + 7_001])), leader_epoch=0)
    assert log.segment_count == 2


def test_a_segment_rolls_when_its_index_would_pass_segment_index_bytes(tmp_path: Path) -> None:
    # an offset index entry for every batch (index.interval.bytes 0); room for 2 entries
    log = open_log(tmp_path / "p", Clock(NOW), index_interval_bytes=0, segment_index_bytes=16)
    for i in range(4):
        log.append_as_leader(build_batch(records([NOW + i])), leader_epoch=0)
    assert log.segment_count == 2

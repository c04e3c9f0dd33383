"""Tests for sluice.protocol.records: the v2 record batch codec."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.protocol import records as R
from sluice.protocol.records import (
    BatchHeader,
    CorruptRecordError,
    InvalidRecordError,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    parse_header,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)

CODECS = [R.COMPRESSION_NONE, R.COMPRESSION_GZIP, R.COMPRESSION_SNAPPY, R.COMPRESSION_LZ4, R.COMPRESSION_ZSTD]


def _sample() -> list[Record]:
    return [
        Record(0, 1000, b"k0", b"v0" * 50, ()),
        Record(1, 1005, None, b"value-only", (("h", b"x"), ("null", None))),
        Record(2, 999, b"key-only", None, ()),
        Record(3, 2000, b"", b"", (("", b""),)),
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_round_trip_all_codecs(codec: int) -> None:
    recs = _sample()
    big = [(f"k{i}".encode(), b"x" * 1000 + str(i).encode()) for i in range(100)]  # > 32 KiB for snappy
    for inputs in (recs, big):
        buf = build_batch(
            inputs,
            base_offset=42,
            compression=codec,
            timestamp_ms=7,
            producer_id=9,
            producer_epoch=1,
            base_sequence=5,
            partition_leader_epoch=3,
        )
        h = parse_header(buf, 0)
        assert h.compression == codec
        assert h.size_bytes == len(buf)
        assert h.base_offset == 42 and h.partition_leader_epoch == 3
        assert h.records_count == len(inputs) and h.last_offset_delta == len(inputs) - 1
        assert h.producer_id == 9 and h.producer_epoch == 1 and h.base_sequence == 5
        assert h.last_sequence == 5 + len(inputs) - 1
        validate_batch(buf, 0, h)
        out = decode_records(buf, 0, h)
        assert [r.offset for r in out] == list(range(42, 42 + len(inputs)))
        if inputs is recs:
            assert [(r.timestamp, r.key, r.value, r.headers) for r in out] == [
                (r.timestamp, r.key, r.value, r.headers) for r in recs
            ]
            assert h.base_timestamp == 1000 and h.max_timestamp == 2000
        else:
            assert [(r.key, r.value) for r in out] == big
            assert all(r.timestamp == 7 for r in out)


def test_header_flags_and_layout() -> None:
    buf = build_batch([(b"a", b"b")], transactional=True, producer_id=1, producer_epoch=0, base_sequence=0)
    h = parse_header(buf, 0)
    assert h.is_transactional and not h.is_control and h.has_producer_id
    assert h.magic == 2 and h.timestamp_type == R.TIMESTAMP_CREATE_TIME
    assert struct.unpack_from(">I", buf, 17)[0] == h.crc
    assert R.HEADER_SIZE == 61


def test_last_sequence_wraps() -> None:
    h = BatchHeader(0, 49, -1, 2, 0, 0, 4, 0, 0, 1, 0, 2**31 - 2, 5)
    assert h.last_sequence == 2  # 2**31-2, 2**31-1, 0, 1, 2
    assert R.increment_sequence(2**31 - 1, 1) == 0
    assert R.increment_sequence(2**31 - 2, 4) == 2
    h2 = BatchHeader(0, 49, -1, 2, 0, 0, 4, 0, 0, -1, -1, -1, 5)
    assert h2.last_sequence == -1


@pytest.mark.parametrize("codec", CODECS)
def test_crc_detects_every_flipped_byte(codec: int) -> None:
    buf = build_batch(_sample(), compression=codec, timestamp_ms=1)
    for i in range(R.CRC_START, len(buf)):
        b = bytearray(buf)
        b[i] ^= 0x40
        with pytest.raises(CorruptRecordError):
            validate_batch(b, 0, parse_header(b, 0))


def test_stamping_keeps_crc_valid() -> None:
    buf = bytearray(build_batch(_sample(), timestamp_ms=1))
    set_base_offset(buf, 0, 12345)
    set_partition_leader_epoch(buf, 0, 77)
    h = parse_header(buf, 0)
    validate_batch(buf, 0, h)
    assert h.base_offset == 12345 and h.partition_leader_epoch == 77
    set_log_append_time(buf, 0, 99999)
    h = parse_header(buf, 0)
    validate_batch(buf, 0, h)
    assert h.timestamp_type == R.TIMESTAMP_LOG_APPEND_TIME and h.max_timestamp == 99999
    assert all(r.timestamp == 99999 for r in decode_records(buf, 0, h))
    # On a memoryview slice of a larger buffer, too.
    two = bytearray(build_batch([(b"a", b"b")]) + build_batch([(b"c", b"d")]))
    mv = memoryview(two)
    pos2 = parse_header(two, 0).size_bytes
    set_log_append_time(mv, pos2, 5)
    validate_batch(two, pos2, parse_header(two, pos2))


def test_iter_batches_and_truncation() -> None:
    a, b = (
        build_batch([(b"a", b"1")], base_offset=0),
        build_batch([(b"b", b"2"), (b"c", b"3")], base_offset=1),
    )
    buf = a + b
    got = [(pos, h.base_offset) for pos, h in iter_batches(buf)]
    assert got == [(0, 0), (len(a), 1)]
    for cut in range(len(a) + 1, len(buf)):
        seen = []
        with pytest.raises(CorruptRecordError):
            for _pos, h in iter_batches(buf[:cut]):
                seen.append(h.base_offset)
        assert seen == [0]
    bad = bytearray(buf)
    bad[16] = 1
    with pytest.raises(CorruptRecordError, match="magic"):
        list(iter_batches(bad))
    short = bytearray(a)
    struct.pack_into(">i", short, 8, 10)
    with pytest.raises(CorruptRecordError, match="batchLength"):
        list(iter_batches(short))


def test_validate_counts() -> None:
    buf = bytearray(build_batch([(b"a", b"1"), (b"b", b"2")]))
    struct.pack_into(">i", buf, 23, 5)  # lastOffsetDelta
    struct.pack_into(">I", buf, 17, R.compute_crc(buf, 0, len(buf)))
    with pytest.raises(InvalidRecordError, match="inconsistent"):
        validate_batch(buf, 0, parse_header(buf, 0))
    validate_batch(buf, 0, parse_header(buf, 0), strict_counts=False)
    buf2 = bytearray(build_batch([(b"a", b"1")]))
    buf2[16] = 1
    with pytest.raises(InvalidRecordError, match="magic"):
        validate_batch(buf2, 0, parse_header(buf2, 0))


def test_decode_bounds_checked() -> None:
    buf = build_batch([(b"key", b"value" * 10)])
    # Corrupt the record length varint (first byte after the header) and fix the CRC.
    for v in (0x7F, 0x01, 0xFF):
        b = bytearray(buf)
        b[R.HEADER_SIZE] = v
        with pytest.raises(CorruptRecordError):
            decode_records(b, 0, parse_header(b, 0))
    b = bytearray(buf)
    struct.pack_into(">i", b, 57, 3)  # more records claimed than present
    with pytest.raises(CorruptRecordError):
        decode_records(b, 0, parse_header(b, 0))


def test_snappy_raw_accepted() -> None:
    import cramjam

    body_batch = build_batch([(b"k", b"v" * 100)], compression=R.COMPRESSION_NONE)
    h = parse_header(body_batch, 0)
    body = body_batch[R.HEADER_SIZE :]
    raw = bytes(cramjam.snappy.compress_raw(body))
    out = bytearray(body_batch[: R.HEADER_SIZE]) + raw
    struct.pack_into(">i", out, 8, len(out) - 12)
    struct.pack_into(">h", out, 21, R.COMPRESSION_SNAPPY)
    struct.pack_into(">I", out, 17, R.compute_crc(out, 0, len(out)))
    h = parse_header(out, 0)
    validate_batch(out, 0, h)
    assert decode_records(out, 0, h)[0].value == b"v" * 100


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=40)),
            st.one_of(st.none(), st.binary(max_size=300)),
            st.lists(st.tuples(st.text(max_size=5), st.one_of(st.none(), st.binary(max_size=5))), max_size=3),
            st.integers(min_value=0, max_value=2**40),
        ),
        min_size=1,
        max_size=20,
    ),
    st.sampled_from(CODECS),
)
def test_round_trip_property(
    items: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]], codec: int
) -> None:
    recs = [Record(0, ts, k, v, tuple(h)) for k, v, h, ts in items]
    buf = build_batch(recs, compression=codec, base_offset=10)
    h = parse_header(buf, 0)
    validate_batch(buf, 0, h)
    out = decode_records(buf, 0, h)
    assert [(r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (r.timestamp, r.key, r.value, r.headers) for r in recs
    ]


# --- golden checks against independent implementations ----------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_builds_we_parse(codec: int) -> None:
    dr = pytest.importorskip("kafka.record.default_records")
    builder = dr.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=123,
        producer_epoch=4,
        base_sequence=10,
        batch_size=1 << 20,
    )
    for i in range(50):
        builder.append(i, timestamp=1000 + i, key=f"k{i}".encode(), value=b"v" * i, headers=[("h", b"1")])
    buf = bytes(builder.build())
    h = parse_header(buf, 0)
    validate_batch(buf, 0, h)
    assert h.producer_id == 123 and h.producer_epoch == 4 and h.base_sequence == 10 and h.records_count == 50
    out = decode_records(buf, 0, h)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out] == [
        (i, 1000 + i, f"k{i}".encode(), b"v" * i, (("h", b"1"),)) for i in range(50)
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_we_build_kafka_python_parses(codec: int) -> None:
    dr = pytest.importorskip("kafka.record.default_records")
    recs = [Record(0, 1000 + i, f"k{i}".encode(), b"v" * (i * 700), (("h", b"1"),)) for i in range(50)]
    buf = build_batch(
        recs, compression=codec, base_offset=7, producer_id=5, producer_epoch=2, base_sequence=0
    )
    batch = dr.DefaultRecordBatch(bytes(buf))
    assert batch.validate_crc()
    assert batch.base_offset == 7 and batch.compression_type == codec
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(7 + i, 1000 + i, f"k{i}".encode(), b"v" * (i * 700), [("h", b"1")]) for i in range(50)]


@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_round_trip(codec: int) -> None:
    ar = pytest.importorskip("aiokafka.record.default_records")
    builder = ar.DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(10):
        builder.append(i, timestamp=5 + i, key=None, value=f"v{i}".encode(), headers=[])
    buf = bytes(builder.build())
    h = parse_header(buf, 0)
    validate_batch(buf, 0, h)
    assert [r.value for r in decode_records(buf, 0, h)] == [f"v{i}".encode() for i in range(10)]
    ours = build_batch([(None, f"v{i}".encode()) for i in range(10)], compression=codec, timestamp_ms=5)
    batch = ar.DefaultRecordBatch(bytearray(ours))
    assert batch.validate_crc()
    assert [r.value for r in batch] == [f"v{i}".encode() for i in range(10)]


# --- re-encoding (broker-side compression.type) ------------------------------------------------

_HEADER_FIELDS_KEPT = (
    "base_offset",
    "partition_leader_epoch",
    "last_offset_delta",
    "base_timestamp",
    "max_timestamp",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "records_count",
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=40)), st.binary(max_size=400), st.integers(0, 2**40)
        ),
        min_size=1,
        max_size=15,
    ),
    st.sampled_from(CODECS),
    st.sampled_from(CODECS),
    st.booleans(),
)
def test_recompress_keeps_every_record_and_header_field_but_the_codec(
    items: list[tuple[bytes | None, bytes, int]], sent: int, stored: int, transactional: bool
) -> None:
    recs = [Record(0, ts, k, v, (("h", v[:3]),)) for k, v, ts in items]
    buf = build_batch(
        recs, compression=sent, base_offset=7, producer_id=42, producer_epoch=3, base_sequence=11,
        partition_leader_epoch=5, transactional=transactional,
    )  # fmt: skip
    before = parse_header(buf, 0)
    out = R.recompress_batch(buf, 0, before, stored)
    after = parse_header(out, 0)
    validate_batch(out, 0, after)  # the CRC is computed anew
    assert after.compression == stored and after.size_bytes == len(out)
    assert after.is_transactional == transactional and after.timestamp_type == before.timestamp_type
    assert [getattr(after, f) for f in _HEADER_FIELDS_KEPT] == [
        getattr(before, f) for f in _HEADER_FIELDS_KEPT
    ]
    assert decode_records(out, 0, after) == decode_records(buf, 0, before)


@pytest.mark.parametrize(
    ("codec", "level"), [(R.COMPRESSION_GZIP, 1), (R.COMPRESSION_LZ4, 17), (R.COMPRESSION_ZSTD, -5)]
)
def test_recompress_at_a_level(codec: int, level: int) -> None:
    buf = build_batch([(b"k", b"abc" * 1000)])
    out = R.recompress_batch(buf, 0, parse_header(buf, 0), codec, level)
    h = parse_header(out, 0)
    validate_batch(out, 0, h)
    assert h.compression == codec and len(out) < len(buf)
    assert decode_records(out, 0, h)[0].value == b"abc" * 1000


def test_recompress_refuses_records_that_do_not_decompress() -> None:
    buf = bytearray(build_batch([(b"k", b"v" * 200)], compression=R.COMPRESSION_ZSTD))
    buf[R.HEADER_SIZE + 4 : R.HEADER_SIZE + 8] = b"\xff\xff\xff\xff"  # garbage inside the frame
    with pytest.raises(CorruptRecordError):
        R.recompress_batch(buf, 0, parse_header(buf, 0), R.COMPRESSION_GZIP)


@pytest.mark.parametrize("codec", CODECS)
def test_rebuild_keeps_the_header_and_each_kept_records_offset_and_timestamp(codec: int) -> None:
    """What the log cleaner writes: the kept records at their offsets and timestamps, under the
    original base offset, last offset delta, leader epoch, producer id/epoch/base sequence and
    codec; kafka-python (the Java client's rules) reads it back the same."""
    original = build_batch(
        _sample(),
        base_offset=100,
        compression=codec,
        producer_id=9,
        producer_epoch=3,
        base_sequence=40,
        partition_leader_epoch=5,
    )
    h = parse_header(original, 0)
    kept = [r for r in decode_records(original, 0, h) if r.offset in (101, 103)]
    rebuilt = R.rebuild_batch(h, kept)
    n = parse_header(rebuilt, 0)
    validate_batch(rebuilt, 0, n, strict_counts=False)
    same = ("base_offset", "last_offset_delta", "partition_leader_epoch", "producer_id", "producer_epoch")
    assert all(getattr(n, f) == getattr(h, f) for f in (*same, "base_sequence", "compression"))
    assert (n.records_count, n.last_sequence, n.delete_horizon_ms) == (2, h.last_sequence, -1)
    assert decode_records(rebuilt, 0, n) == kept
    assert n.max_timestamp == 2000
    dr = pytest.importorskip("kafka.record.default_records")
    batch = dr.DefaultRecordBatch(bytes(rebuilt))
    assert batch.validate_crc()
    assert [(r.offset, r.timestamp, r.key) for r in batch] == [(r.offset, r.timestamp, r.key) for r in kept]


def test_rebuild_with_a_delete_horizon_and_empty() -> None:
    original = build_batch([(b"k", None), (b"j", b"v")], base_offset=10, timestamp_ms=500)
    h = parse_header(original, 0)
    tomb = decode_records(original, 0, h)[:1]
    rebuilt = R.rebuild_batch(h, tomb, delete_horizon_ms=9_000)
    n = parse_header(rebuilt, 0)
    assert n.delete_horizon_ms == 9_000 and n.base_timestamp == 9_000
    assert decode_records(rebuilt, 0, n) == tomb, "record timestamps stay their own under a horizon"
    cleared = R.rebuild_batch(n, decode_records(rebuilt, 0, n)[:0])
    c = parse_header(cleared, 0)
    validate_batch(cleared, 0, c, strict_counts=False)
    assert (c.records_count, c.last_offset, c.delete_horizon_ms) == (0, h.last_offset, -1)
    assert decode_records(cleared, 0, c) == []
    assert len(cleared) == R.HEADER_SIZE

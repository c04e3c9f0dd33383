"""Kafka's v2 record batch format (magic 2): header parsing, CRC-32C, in-place stamping,
building and decoding.

The on-disk format of a segment *is* this wire format, so this module is the single codec
shared by ``protocol`` (Produce/Fetch bodies) and ``storage`` (segments).

Batch header layout (61 bytes, big-endian)::

    baseOffset            int64  @0
    batchLength           int32  @8    bytes after this field (total size = batchLength + 12)
    partitionLeaderEpoch  int32  @12
    magic                 int8   @16   must be 2
    crc                   uint32 @17   CRC-32C of bytes [21, end of batch)
    attributes            int16  @21   bits 0-2 codec, bit 3 timestampType, bit 4 transactional,
                                       bit 5 control, bit 6 baseTimestamp is the delete horizon
    lastOffsetDelta       int32  @23
    baseTimestamp         int64  @27
    maxTimestamp          int64  @35
    producerId            int64  @43
    producerEpoch         int16  @51
    baseSequence          int32  @53
    recordsCount          int32  @57

``baseOffset`` and ``partitionLeaderEpoch`` lie outside the CRC, which is what lets a broker
assign offsets and stamp the epoch without recomputing it.

The log cleaner rewrites a batch with ``rebuild_batch``: the records it keeps, at their own
offsets and timestamps, under the original header (base offset, last offset delta, producer id,
epoch and base sequence kept, so the producer state read from the batch is unchanged). A batch
whose tombstones the cleaner keeps carries their delete horizon in ``baseTimestamp`` with
attribute bit 6 set (Kafka's KIP-534); record timestamps stay right because their deltas are
relative to the base timestamp, whatever it holds.

Snappy: ``build_batch`` writes the xerial framing (``\\x82SNAPPY\\x00`` header, 32 KiB blocks
each prefixed by a big-endian int32 length), as the Java client's ``SnappyOutputStream`` does,
so Java consumers (which require it) can read our batches. ``decode_records`` accepts both that
framing and raw snappy. LZ4 uses the LZ4 *frame* format with independent blocks (Kafka's
``KafkaLZ4BlockInputStream`` decompresses each block on its own).
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

import cramjam
import crc32c

__all__ = [
    "ATTR_CONTROL_MASK",
    "ATTR_DELETE_HORIZON_MASK",
    "ATTR_TIMESTAMP_TYPE_MASK",
    "ATTR_TRANSACTIONAL_MASK",
    "CODEC_NAMES",
    "COMPRESSION_GZIP",
    "COMPRESSION_LZ4",
    "COMPRESSION_MASK",
    "COMPRESSION_NONE",
    "COMPRESSION_SNAPPY",
    "COMPRESSION_ZSTD",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CRC_OFFSET",
    "CRC_START",
    "HEADER_SIZE",
    "LOG_OVERHEAD",
    "MAGIC",
    "MIN_BATCH_LENGTH",
    "NO_PARTITION_LEADER_EPOCH",
    "NO_PRODUCER_EPOCH",
    "NO_PRODUCER_ID",
    "NO_SEQUENCE",
    "NO_TIMESTAMP",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "BatchHeader",
    "ControlMarker",
    "CorruptRecordError",
    "InvalidRecordError",
    "Record",
    "RecordInput",
    "build_batch",
    "build_control_batch",
    "compute_crc",
    "decode_records",
    "increment_sequence",
    "iter_batches",
    "parse_header",
    "read_control_marker",
    "rebuild_batch",
    "recompress_batch",
    "set_base_offset",
    "set_log_append_time",
    "set_partition_leader_epoch",
    "validate_batch",
]

# --- layout constants -----------------------------------------------------------------------

HEADER_SIZE: Final = 61
#: baseOffset + batchLength: the bytes not counted by batchLength.
LOG_OVERHEAD: Final = 12
#: Smallest legal batchLength: the header minus LOG_OVERHEAD (a batch with no records).
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC: Final = 2

BASE_OFFSET_OFFSET: Final = 0
LENGTH_OFFSET: Final = 8
PARTITION_LEADER_EPOCH_OFFSET: Final = 12
MAGIC_OFFSET: Final = 16
CRC_OFFSET: Final = 17
#: First byte covered by the CRC (the attributes field).
CRC_START: Final = 21
ATTRIBUTES_OFFSET: Final = 21
MAX_TIMESTAMP_OFFSET: Final = 35

COMPRESSION_MASK: Final = 0x07
ATTR_TIMESTAMP_TYPE_MASK: Final = 0x08
ATTR_TRANSACTIONAL_MASK: Final = 0x10
ATTR_CONTROL_MASK: Final = 0x20
#: KIP-534: the batch's baseTimestamp is the delete horizon of its tombstones.
ATTR_DELETE_HORIZON_MASK: Final = 0x40

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_SNAPPY: Final = 2
COMPRESSION_LZ4: Final = 3
COMPRESSION_ZSTD: Final = 4
_CODEC_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
#: Codec ids by the names Kafka's ``compression.type`` uses ("uncompressed" for none).
CODEC_NAMES: Final = {"uncompressed": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

TIMESTAMP_CREATE_TIME: Final = 0
TIMESTAMP_LOG_APPEND_TIME: Final = 1

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
NO_PARTITION_LEADER_EPOCH: Final = -1
NO_TIMESTAMP: Final = -1

_INT32_MAX: Final = 2**31 - 1

_HEADER: Final = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_PREFIX: Final = struct.Struct(">qi")  # baseOffset, batchLength
_INT64: Final = struct.Struct(">q")
_INT32: Final = struct.Struct(">i")
_UINT32: Final = struct.Struct(">I")
_INT16: Final = struct.Struct(">h")

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK: Final = 32 * 1024

Buffer: TypeAlias = bytes | bytearray | memoryview


class CorruptRecordError(ValueError):
    """A batch is truncated, malformed or fails its CRC (Kafka: CORRUPT_MESSAGE)."""


class InvalidRecordError(ValueError):
    """A batch is well-formed but not acceptable (wrong magic, inconsistent counts;
    Kafka: INVALID_RECORD / UNSUPPORTED_FOR_MESSAGE_FORMAT)."""


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's ``DefaultRecordBatch.incrementSequence``: add with wrap past int32 max to 0."""
    if sequence > _INT32_MAX - increment:
        return increment - (_INT32_MAX - sequence) - 1
    return sequence + increment


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The 61-byte header of a v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        """Codec id: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd."""
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        """0 = CreateTime, 1 = LogAppendTime."""
        return 1 if self.attributes & ATTR_TIMESTAMP_TYPE_MASK else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL_MASK)

    @property
    def delete_horizon_ms(self) -> int:
        """When the cleaner may remove the batch's tombstones (KIP-534); -1 when not set."""
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON_MASK else -1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def size_bytes(self) -> int:
        """Total size of the batch in bytes, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping past int32 max to 0; -1 without a sequence."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def parse_header(buf: Buffer, pos: int) -> BatchHeader:
    """Parse the header at ``pos``. Raises CorruptRecordError if fewer than 61 bytes remain.

    Only the header is checked for length here; see ``iter_batches``/``validate_batch``.
    """
    if pos < 0 or pos + HEADER_SIZE > len(buf):
        raise CorruptRecordError(
            f"truncated batch header at position {pos}: need {HEADER_SIZE} bytes, "
            f"{max(0, len(buf) - pos)} available"
        )
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def iter_batches(buf: Buffer, start: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Walk concatenated batches in ``buf[start:end]``, yielding ``(position, header)``.

    Checks framing only (length, magic, bounds), not CRC. Raises CorruptRecordError on a
    truncated or malformed batch (the batches before it have already been yielded).
    """
    limit = len(buf) if end is None else end
    pos = start
    while pos < limit:
        if pos + HEADER_SIZE > limit:
            raise CorruptRecordError(
                f"truncated batch at position {pos}: {limit - pos} bytes left, header needs {HEADER_SIZE}"
            )
        header = BatchHeader(*_HEADER.unpack_from(buf, pos))
        if header.batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at position {pos} has batchLength {header.batch_length} < {MIN_BATCH_LENGTH}"
            )
        if header.magic != MAGIC:
            raise CorruptRecordError(f"batch at position {pos} has magic {header.magic}, expected {MAGIC}")
        size = header.batch_length + LOG_OVERHEAD
        if pos + size > limit:
            raise CorruptRecordError(
                f"truncated batch at position {pos}: size {size} but only {limit - pos} bytes left"
            )
        yield pos, header
        pos += size


def compute_crc(buf: Buffer, pos: int, size: int) -> int:
    """CRC-32C of the CRC-covered part of the batch at ``pos`` of total ``size`` (no copy)."""
    with memoryview(buf) as mv:
        return int(crc32c.crc32c(mv[pos + CRC_START : pos + size]))


def validate_batch(buf: Buffer, pos: int, header: BatchHeader, *, strict_counts: bool = True) -> None:
    """Check bounds, magic, CRC and record-count sanity of the batch at ``pos``.

    With ``strict_counts`` (batches from producers) Kafka's rule applies: recordsCount >= 1 and
    lastOffsetDelta == recordsCount - 1. Without it (replicated or recovered batches, which may
    have been compacted) only non-negative counts are required.
    """
    size = header.batch_length + LOG_OVERHEAD
    if header.batch_length < MIN_BATCH_LENGTH or pos < 0 or pos + size > len(buf):
        raise CorruptRecordError(
            f"batch at position {pos} with batchLength {header.batch_length} does not fit "
            f"in a buffer of {len(buf)} bytes"
        )
    if header.magic != MAGIC:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset} has magic {header.magic}; only 2 is supported"
        )
    actual = compute_crc(buf, pos, size)
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} (position {pos}) failed its CRC: "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )
    if header.compression > COMPRESSION_ZSTD:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset} uses unknown codec {header.compression}"
        )
    if strict_counts:
        if header.records_count <= 0:
            raise InvalidRecordError(
                f"batch at offset {header.base_offset} reports {header.records_count} records; need >= 1"
            )
        if header.last_offset_delta != header.records_count - 1:
            raise InvalidRecordError(
                f"batch at offset {header.base_offset}: lastOffsetDelta {header.last_offset_delta} is "
                f"inconsistent with recordsCount {header.records_count}"
            )
    elif header.records_count < 0 or header.last_offset_delta < 0:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset}: negative recordsCount {header.records_count} "
            f"or lastOffsetDelta {header.last_offset_delta}"
        )


# --- in-place stamping --------------------------------------------------------------------------


def set_base_offset(buf: bytearray | memoryview, pos: int, offset: int) -> None:
    """Overwrite baseOffset (not CRC-covered)."""
    _INT64.pack_into(buf, pos + BASE_OFFSET_OFFSET, offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Overwrite partitionLeaderEpoch (not CRC-covered)."""
    _INT32.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, ts_ms: int) -> None:
    """Mark the batch LogAppendTime with maxTimestamp ``ts_ms`` and recompute the CRC."""
    (attributes,) = _INT16.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    (max_ts,) = _INT64.unpack_from(buf, pos + MAX_TIMESTAMP_OFFSET)
    if attributes & ATTR_TIMESTAMP_TYPE_MASK and max_ts == ts_ms:
        return
    _INT16.pack_into(buf, pos + ATTRIBUTES_OFFSET, attributes | ATTR_TIMESTAMP_TYPE_MASK)
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, ts_ms)
    (length,) = _INT32.unpack_from(buf, pos + LENGTH_OFFSET)
    _UINT32.pack_into(buf, pos + CRC_OFFSET, compute_crc(buf, pos, length + LOG_OVERHEAD))


# --- records ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record. ``offset`` and ``timestamp`` are absolute."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


RecordInput: TypeAlias = (
    Record
    | tuple[bytes | None, bytes | None]
    | tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
)


def _zigzag_varint(out: bytearray, value: int) -> None:
    """Append the zigzag + LEB128 encoding of a signed 64-bit value."""
    v = (value << 1) ^ (value >> 63)
    v &= 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _read_varint(buf: Buffer, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    """Decode a zigzag varint at ``pos`` (not past ``end``). Returns (value, new_pos)."""
    result = 0
    shift = 0
    for i in range(max_bytes):
        if pos >= end:
            raise CorruptRecordError(f"truncated varint at position {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        del i
    raise CorruptRecordError(f"varint longer than {max_bytes} bytes ending at position {pos}")


def _encode_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _zigzag_varint(out, -1)
    else:
        _zigzag_varint(out, len(data))
        out += data


def _compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    """``level``: the codec's own level (gzip 1-9, lz4 1-17, zstd -131072-22); None: its default.
    Snappy has none."""
    if codec == COMPRESSION_GZIP:
        return bytes(
            cramjam.gzip.compress(data) if level is None else cramjam.gzip.compress(data, level=level)
        )
    if codec == COMPRESSION_SNAPPY:
        out = bytearray(_XERIAL_HEADER)
        with memoryview(data) as mv:
            for start in range(0, len(data), _XERIAL_BLOCK):
                block = bytes(cramjam.snappy.compress_raw(bytes(mv[start : start + _XERIAL_BLOCK])))
                out += _INT32.pack(len(block))
                out += block
        return bytes(out)
    if codec == COMPRESSION_LZ4:
        compressor = cramjam.lz4.Compressor(level=level, content_checksum=False, block_linked=False)
        compressor.compress(data)
        return bytes(compressor.finish())
    if codec == COMPRESSION_ZSTD:
        return bytes(
            cramjam.zstd.compress(data) if level is None else cramjam.zstd.compress(data, level=level)
        )
    raise InvalidRecordError(f"unknown compression codec {codec}")


def _decompress(codec: int, data: bytes | memoryview) -> bytes:
    try:
        if codec == COMPRESSION_GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if codec == COMPRESSION_SNAPPY:
            return _snappy_decompress(data)
        if codec == COMPRESSION_LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == COMPRESSION_ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CorruptRecordError(f"cannot decompress {_CODEC_NAMES[codec]} records: {exc}") from exc
    raise InvalidRecordError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes | memoryview) -> bytes:
    if bytes(data[:8]) != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(data))
    if len(data) < 16:
        raise CorruptRecordError("truncated xerial snappy header")
    out = bytearray()
    pos, end = 16, len(data)
    while pos < end:
        if pos + 4 > end:
            raise CorruptRecordError(f"truncated xerial snappy block length at {pos}")
        (n,) = _INT32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"xerial snappy block of {n} bytes at {pos} overruns {end}")
        out += cramjam.snappy.decompress_raw(bytes(data[pos : pos + n]))
        pos += n
    return bytes(out)


def build_batch(
    records: Sequence[RecordInput],
    *,
    base_offset: int = 0,
    compression: int = COMPRESSION_NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_ms: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
) -> bytes:
    """Build one CRC'd v2 batch.

    ``records`` items are ``(key, value)``, ``(key, value, headers)`` or ``Record`` (whose
    ``timestamp`` is used; its ``offset`` is ignored: offset deltas are 0, 1, 2, ...). Tuples get
    ``timestamp_ms`` (default: wall clock).
    """
    if not records:
        raise InvalidRecordError("a batch needs at least one record")
    if not 0 <= compression <= COMPRESSION_ZSTD:
        raise InvalidRecordError(f"unknown compression codec {compression}")
    default_ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    items: list[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]] = []
    for r in records:
        if isinstance(r, Record):
            items.append((r.timestamp, r.key, r.value, r.headers))
        elif len(r) == 2:
            items.append((default_ts, r[0], r[1], ()))
        else:
            items.append((default_ts, r[0], r[1], r[2]))
    base_ts = items[0][0]
    max_ts = max(it[0] for it in items)
    body = _encode_body([(delta, *item) for delta, item in enumerate(items)], base_ts)
    attributes = compression
    if log_append_time:
        attributes |= ATTR_TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= ATTR_TRANSACTIONAL_MASK
    if control:
        attributes |= ATTR_CONTROL_MASK
    return _pack_batch(
        body,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=len(items) - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(items),
    )


def _encode_body(
    items: Sequence[tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]],
    base_ts: int,
) -> bytes:
    """The records part of a batch: (offset delta, timestamp, key, value, headers) each."""
    body = bytearray()
    rec = bytearray()
    for delta, ts, key, value, headers in items:
        rec.clear()
        rec.append(0)  # attributes (unused)
        _zigzag_varint(rec, ts - base_ts)
        _zigzag_varint(rec, delta)
        _encode_bytes(rec, key)
        _encode_bytes(rec, value)
        _zigzag_varint(rec, len(headers))
        for hkey, hvalue in headers:
            _encode_bytes(rec, hkey.encode("utf-8"))
            _encode_bytes(rec, hvalue)
        _zigzag_varint(body, len(rec))
        body += rec
    return bytes(body)


def _pack_batch(
    body: bytes,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records_count: int,
) -> bytes:
    """Header + (compressed, by ``attributes``' codec) body, with its CRC."""
    compression = attributes & COMPRESSION_MASK
    payload = body if compression == COMPRESSION_NONE or not records_count else _compress(compression, body)
    out = bytearray(HEADER_SIZE + len(payload))
    _HEADER.pack_into(
        out,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD + len(payload),
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )
    out[HEADER_SIZE:] = payload
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


def recompress_batch(
    buf: Buffer, pos: int, header: BatchHeader, codec: int, level: int | None = None
) -> bytes:
    """The batch at ``pos`` with its records encoded by ``codec`` (COMPRESSION_NONE: stored
    uncompressed) at ``level``, every other field as it was: offsets and their deltas,
    timestamps, producer id, epoch and sequence, the transactional and control bits, the
    records themselves byte for byte. Only batchLength, the codec bits and the CRC change, and
    the CRC is computed over the new bytes. Raises CorruptRecordError if the records cannot be
    decompressed."""
    size = header.batch_length + LOG_OVERHEAD
    if header.batch_length < MIN_BATCH_LENGTH or pos + size > len(buf):
        raise CorruptRecordError(f"batch at position {pos} of size {size} overruns buffer of {len(buf)}")
    if not 0 <= codec <= COMPRESSION_ZSTD:
        raise InvalidRecordError(f"unknown compression codec {codec}")
    with memoryview(buf) as mv:
        raw = mv[pos + HEADER_SIZE : pos + size]
        try:
            body = (
                bytes(raw) if header.compression == COMPRESSION_NONE else _decompress(header.compression, raw)
            )
        finally:
            raw.release()
        payload = body if codec == COMPRESSION_NONE else _compress(codec, body, level)
        out = bytearray(HEADER_SIZE + len(payload))
        out[:HEADER_SIZE] = mv[pos : pos + HEADER_SIZE]
    out[HEADER_SIZE:] = payload
    _INT32.pack_into(out, LENGTH_OFFSET, HEADER_SIZE - LOG_OVERHEAD + len(payload))
    _INT16.pack_into(out, ATTRIBUTES_OFFSET, (header.attributes & ~COMPRESSION_MASK) | codec)
    _UINT32.pack_into(out, CRC_OFFSET, compute_crc(out, 0, len(out)))
    return bytes(out)


def rebuild_batch(header: BatchHeader, records: Sequence[Record], *, delete_horizon_ms: int = -1) -> bytes:
    """The batch ``header`` heads, holding only ``records`` (some of its own, decoded, in order):
    what the log cleaner writes in its place.

    Kept from the original: base offset, last offset delta, partition leader epoch, codec,
    timestamp type, the transactional and control flags, producer id, epoch and base sequence,
    so the batch covers the same offsets and sequences (the producer state read from it is the
    same) and reads as the same leader epoch. Each record keeps its offset, timestamp, key,
    value and headers. With no record the batch is empty (a header alone, as Kafka writes for the
    last batch of a producer). ``delete_horizon_ms`` >= 0 sets it in the base timestamp
    (KIP-534), -1 clears it. With CreateTime the max timestamp is the records' (the header's when
    empty); with LogAppendTime it is the append time, which is every record's timestamp."""
    last = header.base_offset + header.last_offset_delta
    assert all(header.base_offset <= r.offset <= last for r in records), "records outside the batch"
    assert all(a.offset < b.offset for a, b in itertools.pairwise(records)), "records not ascending"
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    if delete_horizon_ms >= 0:
        base_ts = delete_horizon_ms
    elif records:
        base_ts = records[0].timestamp
    else:
        base_ts = header.base_timestamp if header.delete_horizon_ms < 0 else header.max_timestamp
    max_ts = header.max_timestamp if log_append or not records else max(r.timestamp for r in records)
    body = _encode_body(
        [(r.offset - header.base_offset, r.timestamp, r.key, r.value, r.headers) for r in records], base_ts
    )
    attributes = header.attributes & ~ATTR_DELETE_HORIZON_MASK
    if delete_horizon_ms >= 0:
        attributes |= ATTR_DELETE_HORIZON_MASK
    return _pack_batch(
        body,
        base_offset=header.base_offset,
        partition_leader_epoch=header.partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=header.last_offset_delta,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        records_count=len(records),
    )


def decode_records(buf: Buffer, pos: int, header: BatchHeader) -> list[Record]:
    """Decompress and decode the records of the batch at ``pos``. Every length is bounds-checked.

    With LogAppendTime every record's timestamp is the batch's maxTimestamp, as in Kafka.
    """
    size = header.batch_length + LOG_OVERHEAD
    if header.batch_length < MIN_BATCH_LENGTH or pos + size > len(buf):
        raise CorruptRecordError(f"batch at position {pos} of size {size} overruns buffer of {len(buf)}")
    if header.records_count == 0 and header.batch_length == MIN_BATCH_LENGTH:
        return []  # a header alone: the empty batch the log cleaner keeps for a producer
    with memoryview(buf) as mv:
        raw = mv[pos + HEADER_SIZE : pos + size]
        data: Buffer = raw if header.compression == COMPRESSION_NONE else _decompress(header.compression, raw)
        try:
            return _decode_body(data, header)
        finally:
            if isinstance(data, memoryview):
                data.release()
            raw.release()


def _decode_body(data: Buffer, header: BatchHeader) -> list[Record]:
    end = len(data)
    pos = 0
    out: list[Record] = []
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    for _ in range(header.records_count):
        length, pos = _read_varint(data, pos, end, 5)
        if length < 0 or pos + length > end:
            raise CorruptRecordError(f"record length {length} at {pos} overruns {end}")
        rec_end = pos + length
        pos += 1  # attributes
        if pos > rec_end:
            raise CorruptRecordError("record shorter than its attributes")
        ts_delta, pos = _read_varint(data, pos, rec_end, 10)
        offset_delta, pos = _read_varint(data, pos, rec_end, 5)
        key, pos = _read_bytes(data, pos, rec_end)
        value, pos = _read_bytes(data, pos, rec_end)
        n_headers, pos = _read_varint(data, pos, rec_end, 5)
        if n_headers < 0 or n_headers > length:
            raise CorruptRecordError(f"invalid header count {n_headers}")
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(n_headers):
            hkey, pos = _read_bytes(data, pos, rec_end)
            if hkey is None:
                raise CorruptRecordError("record header with null key")
            hvalue, pos = _read_bytes(data, pos, rec_end)
            try:
                headers.append((hkey.decode("utf-8"), hvalue))
            except UnicodeDecodeError as exc:
                raise CorruptRecordError(f"record header key is not UTF-8: {exc}") from exc
        if pos != rec_end:
            raise CorruptRecordError(
                f"record declared {length} bytes but fields used {length - (rec_end - pos)}"
            )
        ts = header.max_timestamp if log_append else header.base_timestamp + ts_delta
        out.append(Record(header.base_offset + offset_delta, ts, key, value, tuple(headers)))
    if pos != end:
        raise CorruptRecordError(f"{end - pos} trailing bytes after {header.records_count} records")
    return out


def _read_bytes(data: Buffer, pos: int, end: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(data, pos, end, 5)
    if n < 0:
        if n != -1:
            raise CorruptRecordError(f"invalid length {n} at {pos}")
        return None, pos
    if pos + n > end:
        raise CorruptRecordError(f"field of {n} bytes at {pos} overruns record end {end}")
    return bytes(data[pos : pos + n]), pos + n


# --- control batches (KIP-98 transaction markers) -------------------------------------------------

#: Control record types (the key's second int16): an aborted or a committed transaction's end.
CONTROL_ABORT: Final = 0
CONTROL_COMMIT: Final = 1
_CONTROL_KEY: Final = struct.Struct(">hh")  # version, type
_END_TXN_VALUE: Final = struct.Struct(">hi")  # version, coordinator epoch


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """The end of a transaction, as a partition holds it: one control record in a control batch
    carrying the producer id and epoch of the transaction it ends."""

    committed: bool
    coordinator_epoch: int


def build_control_batch(
    *,
    producer_id: int,
    producer_epoch: int,
    committed: bool,
    coordinator_epoch: int,
    timestamp_ms: int | None = None,
) -> bytes:
    """A COMMIT or ABORT marker for the producer's transaction (Kafka's EndTransactionMarker:
    key = version 0 and the control type, value = version 0 and the coordinator epoch), as one
    transactional control batch without a sequence."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if committed else CONTROL_ABORT)
    value = _END_TXN_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        timestamp_ms=timestamp_ms,
        transactional=True,
        control=True,
    )


def read_control_marker(buf: Buffer, pos: int, header: BatchHeader) -> ControlMarker | None:
    """The transaction marker the control batch at ``pos`` holds; None for a control record of
    another type (none exists in the v2 format but Kafka reserves them: skipped, not fatal).

    Raises CorruptRecordError for a control batch whose record is not a well-formed marker."""
    assert header.is_control
    records = decode_records(buf, pos, header)
    if len(records) != 1 or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control batch at offset {header.base_offset} holds no control record key")
    _version, kind = _CONTROL_KEY.unpack_from(records[0].key, 0)
    if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    value = records[0].value
    if value is None or len(value) < _END_TXN_VALUE.size:
        raise CorruptRecordError(f"transaction marker at offset {header.base_offset} has no value")
    _vversion, coordinator_epoch = _END_TXN_VALUE.unpack_from(value, 0)
    return ControlMarker(kind == CONTROL_COMMIT, coordinator_epoch)

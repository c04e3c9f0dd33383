"""What a leader appends for a producer's batches, under its topic's configuration.

Two topic configs change what a leader stores (Kafka's LogValidator does the same, before the
idempotent-producer check and before offsets are assigned):

- ``message.timestamp.before.max.ms`` / ``after.max.ms`` (CreateTime topics): a record whose
  timestamp lies further from the broker's clock is refused with INVALID_TIMESTAMP, and nothing
  of the request is appended.
- ``compression.type``: ``producer`` keeps every batch as it was sent; a codec's name makes the
  leader re-encode each batch sent with another codec (``records.recompress_batch``: the records,
  offsets, timestamps, producer id, epoch and sequence unchanged, a new CRC). Followers copy what
  the leader stored, byte for byte, so every replica holds the same batches.

The decisions are pure functions of the config, the batches and the clock; nothing here touches
a file.
"""

from __future__ import annotations

from typing import Final

from sluice.protocol.records import (
    CODEC_NAMES,
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    NO_TIMESTAMP,
    BatchHeader,
    Buffer,
    decode_records,
    parse_header,
    recompress_batch,
)
from sluice.storage.config import LONG_MAX, LogConfig
from sluice.storage.errors import InvalidTimestampError, RecordTooLargeError

__all__ = ["check_timestamps", "encode_for_topic", "target_codec", "timestamp_in_bounds"]

Batches = list[tuple[int, BatchHeader]]

_PRODUCER: Final = "producer"


def target_codec(config: LogConfig) -> int | None:
    """The codec the leader stores batches with; None: each as the producer sent it."""
    if config.compression_type == _PRODUCER:
        return None
    return CODEC_NAMES[config.compression_type]


def _level(config: LogConfig, codec: int) -> int | None:
    if codec == COMPRESSION_GZIP:
        return None if config.compression_gzip_level == -1 else config.compression_gzip_level
    if codec == COMPRESSION_LZ4:
        return config.compression_lz4_level
    if codec == COMPRESSION_ZSTD:
        return config.compression_zstd_level
    return None


def timestamp_in_bounds(timestamp: int, now_ms: int, before_max_ms: int, after_max_ms: int) -> bool:
    """Kafka's rule for a CreateTime record: at most ``before_max_ms`` behind the broker's clock
    and at most ``after_max_ms`` ahead of it; a record without a timestamp (-1) always passes."""
    if timestamp == NO_TIMESTAMP:
        return True
    return now_ms - timestamp <= before_max_ms and timestamp - now_ms <= after_max_ms


def check_timestamps(data: Buffer, batches: Batches, config: LogConfig, now_ms: int) -> None:
    """Raise InvalidTimestampError at the first record outside the topic's bounds. Costs nothing
    while both bounds are unset (the default) or the topic uses LogAppendTime; otherwise every
    record's timestamp is read (a batch header holds only its first and largest)."""
    before, after = config.timestamp_before_max_ms, config.timestamp_after_max_ms
    if config.log_append_time or (before == LONG_MAX and after == LONG_MAX):
        return
    for n, (pos, header) in enumerate(batches):
        for r in decode_records(data, pos, header):
            if not timestamp_in_bounds(r.timestamp, now_ms, before, after):
                raise InvalidTimestampError(
                    f"record {r.offset - header.base_offset} of batch {n} has timestamp {r.timestamp}, "
                    f"outside [{now_ms - before}, {now_ms + after}] (the broker's clock {now_ms} with "
                    f"message.timestamp.before.max.ms={before}, after.max.ms={after}); nothing of this "
                    "request was appended: correct the producer's timestamps or clock, or widen the bounds"
                )


def encode_for_topic(data: Buffer, batches: Batches, config: LogConfig) -> tuple[Buffer, Batches]:
    """The batches re-encoded to the topic's ``compression.type`` (those already in its codec,
    and all of them under ``producer``, stay as they are), with their new positions. Raises
    RecordTooLargeError when a re-encoded batch passes max.message.bytes, CorruptRecordError when
    a batch's records cannot be decompressed."""
    codec = target_codec(config)
    if codec is None or all(h.compression == codec for _, h in batches):
        return data, batches
    level = _level(config, codec)
    out = bytearray()
    placed: Batches = []
    for pos, header in batches:
        if header.compression == codec:
            placed.append((len(out), header))
            out += data[pos : pos + header.size_bytes]
            continue
        batch = recompress_batch(data, pos, header, codec, level)
        if len(batch) > config.max_message_bytes:
            raise RecordTooLargeError(
                f"batch of {len(batch)} bytes once stored as {config.compression_type} exceeds "
                f"max.message.bytes {config.max_message_bytes}"
            )
        placed.append((len(out), parse_header(batch, 0)))
        out += batch
    if len(out) > config.segment_bytes:
        raise RecordTooLargeError(
            f"append of {len(out)} bytes once stored as {config.compression_type} exceeds segment.bytes "
            f"{config.segment_bytes}"
        )
    return out, placed

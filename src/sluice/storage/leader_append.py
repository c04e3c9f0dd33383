"""What a leader appends for a producer's batches, under its topic's configuration.

Two topic configs change what a leader stores (Kafka's LogValidator does the same, before the
idempotent-producer check and before offsets are assigned):

- every record on its own (``check_records``, Kafka's LogValidator.validateRecord): a compacted
  topic refuses a record without a key (INVALID_RECORD); a CreateTime topic's
  ``message.timestamp.before.max.ms`` / ``after.max.ms`` refuse a record whose timestamp lies
  further from the broker's clock (INVALID_TIMESTAMP), and a producer may not stamp a batch
  LogAppendTime itself. A batch with refused records is refused whole, nothing of the request
  is appended, and each refused record is named by its index in the batch (KIP-467's
  RecordErrors), so a client fails those and can send the others again.
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
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    Buffer,
    decode_records,
    parse_header,
    recompress_batch,
)
from sluice.storage.config import LONG_MAX, LogConfig
from sluice.storage.errors import InvalidTimestampError, KeylessRecordError, RecordError, RecordTooLargeError

__all__ = ["check_records", "encode_for_topic", "target_codec", "timestamp_in_bounds"]

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


def _bound(now_ms: int, delta_ms: int) -> str:
    """One end of the accepted timestamps, or ``...`` when that side is unbounded."""
    return "..." if abs(delta_ms) == LONG_MAX else str(now_ms + delta_ms)


def check_records(data: Buffer, batches: Batches, config: LogConfig, now_ms: int) -> None:
    """Kafka's per-record rules (LogValidator.validateRecord), batch by batch: every record of a
    batch is checked, and at the end of the first batch with refused records this raises
    InvalidTimestampError if any of them was refused for its timestamp, else KeylessRecordError,
    naming each refused record by its index in the batch (KIP-467). Per record: a compacted
    topic needs a key; otherwise a CreateTime record's timestamp must lie within the topic's
    bounds of the broker's clock, and a batch the producer stamped LogAppendTime is refused
    where the broker would use that stamp (a LogAppendTime topic, or a record without a
    timestamp). Costs nothing for a batch none of these can refuse (a delete topic without
    bounds, the default): only the rules that apply read the records."""
    before, after = config.timestamp_before_max_ms, config.timestamp_after_max_ms
    create_time = not config.log_append_time
    bounded = create_time and (before != LONG_MAX or after != LONG_MAX)
    for n, (pos, header) in enumerate(batches):
        producer_stamped = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
        if not (config.compact or bounded or producer_stamped):
            continue
        errors: list[RecordError] = []
        timestamps = 0
        for i, r in enumerate(decode_records(data, pos, header)):
            if config.compact and r.key is None:
                errors.append(
                    RecordError(
                        i,
                        f"record {i} has no key, and the topic is compacted (cleanup.policy="
                        f"{config.cleanup_policy}): compaction keeps the last record of each key",
                    )
                )
            elif create_time and r.timestamp != NO_TIMESTAMP:
                if not timestamp_in_bounds(r.timestamp, now_ms, before, after):
                    timestamps += 1
                    errors.append(
                        RecordError(
                            i,
                            f"record {i} has timestamp {r.timestamp}, outside "
                            f"[{_bound(now_ms, -before)}, {_bound(now_ms, after)}] (the broker's clock "
                            f"{now_ms} with message.timestamp.before.max.ms={before}, "
                            f"after.max.ms={after})",
                        )
                    )
            elif producer_stamped:
                timestamps += 1
                errors.append(
                    RecordError(
                        i,
                        f"record {i} is in a batch the producer stamped LogAppendTime: only "
                        "the broker sets that timestamp type",
                    )
                )
        if not errors:
            continue
        shown = "; ".join(e.message for e in errors[:3]) + ("; ..." if len(errors) > 3 else "")
        what = f"{len(errors)} of the {header.records_count} records of batch {n} were refused ({shown})"
        if timestamps:
            raise InvalidTimestampError(
                f"{what}; nothing of this request was appended: correct the producer's timestamps or "
                "clock, or widen the topic's message.timestamp bounds, and send the other records again",
                errors,
            )
        raise KeylessRecordError(
            f"{what}; nothing of this request was appended: give the records keys and send them "
            "again, or use a topic with cleanup.policy=delete",
            errors,
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

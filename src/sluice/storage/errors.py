"""Storage-layer exceptions. The broker maps each to a Kafka error code (noted per class).

``CorruptRecordError`` and ``InvalidRecordError`` come from ``sluice.protocol.records`` and are
re-exported here so callers can catch every storage failure from one module.
"""

from __future__ import annotations

from sluice.protocol.records import CorruptRecordError, InvalidRecordError

__all__ = [
    "CorruptRecordError",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "InvalidTxnStateError",
    "KeylessRecordError",
    "LogClosedError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "RecordTooLargeError",
    "StorageError",
    "TransactionCoordinatorFencedError",
    "UnexpectedAppendOffsetError",
]


class StorageError(Exception):
    """Base class of errors raised by the storage layer itself."""


class RecordTooLargeError(StorageError):
    """A batch exceeds ``max.message.bytes`` or ``segment.bytes`` (Kafka: MESSAGE_TOO_LARGE /
    RECORD_LIST_TOO_LARGE)."""


class OffsetOutOfRangeError(StorageError):
    """A read or truncation names an offset outside [log start, log end] (Kafka:
    OFFSET_OUT_OF_RANGE)."""


class OutOfOrderSequenceError(StorageError):
    """An idempotent batch's sequence does not follow the producer's last one (Kafka:
    OUT_OF_ORDER_SEQUENCE_NUMBER)."""


class InvalidProducerEpochError(StorageError):
    """An idempotent batch carries an epoch older than the producer's current one (Kafka:
    INVALID_PRODUCER_EPOCH)."""


class KeylessRecordError(StorageError):
    """A record without a key was sent to a compacted log (Kafka: INVALID_RECORD)."""


class InvalidTxnStateError(StorageError):
    """A producer with a transaction open on the partition wrote outside it (Kafka:
    INVALID_TXN_STATE)."""


class TransactionCoordinatorFencedError(StorageError):
    """A transaction marker comes from a coordinator older than one that already wrote a marker
    for the producer here (Kafka: TRANSACTION_COORDINATOR_FENCED)."""


class LogClosedError(StorageError):
    """An operation was attempted on a closed or deleted PartitionLog (Kafka: KAFKA_STORAGE_ERROR
    / NOT_LEADER_OR_FOLLOWER, depending on why it was closed)."""


class UnexpectedAppendOffsetError(StorageError):
    """A follower append's first offset is below the log end offset, or its batches are not in
    ascending offset order (Kafka: UnexpectedAppendOffsetException; the replica fetcher should
    truncate and refetch)."""


class InvalidTimestampError(StorageError):
    """A CreateTime record's timestamp lies outside the topic's message.timestamp.before.max.ms /
    after.max.ms bounds of the broker's clock (Kafka: INVALID_TIMESTAMP)."""

"""Storage-layer exceptions. The broker maps each to a Kafka error code (noted per class).

``CorruptRecordError`` and ``InvalidRecordError`` come from ``sluice.protocol.records`` and are
re-exported here so callers can catch every storage failure from one module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
    "RecordError",
    "RecordTooLargeError",
    "RecordValidationError",
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


@dataclass(frozen=True, slots=True)
class RecordError:
    """One record a leader refused (KIP-467): its index in its batch, and why."""

    batch_index: int
    message: str


class RecordValidationError(StorageError):
    """Records of a produced batch refused one by one (Kafka's RecordValidationException): the
    batch is refused whole, and ``record_errors`` names every refused record by its index in
    the batch, so a client can fail those and tell the others apart (KIP-467's RecordErrors)."""

    def __init__(self, message: str, record_errors: Sequence[RecordError] = ()) -> None:
        super().__init__(message)
        self.record_errors = tuple(record_errors)


class KeylessRecordError(RecordValidationError):
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


class InvalidTimestampError(RecordValidationError):
    """A CreateTime record's timestamp lies outside the topic's message.timestamp.before.max.ms /
    after.max.ms bounds of the broker's clock, or a producer set LogAppendTime itself (Kafka:
    INVALID_TIMESTAMP; with a keyless record of a compacted log in the same batch too)."""

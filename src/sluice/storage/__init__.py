"""A partition's log on disk: segments, indexes, recovery, retention, leader epochs and
idempotent-producer state. Imports nothing of Sluice except ``sluice.protocol.records`` and
``sluice.protocol.primitives.FileRegion`` (what a zero-copy read returns)."""

from sluice.storage.config import LogConfig, known_topic_configs
from sluice.storage.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    LogClosedError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from sluice.storage.log import AppendInfo, PartitionLog, ReadResult

__all__ = [
    "AppendInfo",
    "CorruptRecordError",
    "InvalidProducerEpochError",
    "InvalidRecordError",
    "LogClosedError",
    "LogConfig",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionLog",
    "ReadResult",
    "RecordTooLargeError",
    "StorageError",
    "UnexpectedAppendOffsetError",
    "known_topic_configs",
]

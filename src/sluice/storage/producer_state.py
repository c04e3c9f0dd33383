"""Idempotent-producer state: per producer id, its epoch and its last five batches.

Rules (from Kafka's ``ProducerStateManager``/``ProducerAppendInfo``), for a leader append of a
batch with producer id >= 0 and base sequence >= 0:

- same epoch, (first_seq, last_seq) equal to one of the five cached batches -> duplicate: the
  log appends nothing and answers with the cached offsets;
- older epoch -> ``InvalidProducerEpochError``;
- newer epoch -> the batch must start at sequence 0, else ``OutOfOrderSequenceError``;
- same epoch -> first_seq must be last_seq + 1 (wrapping past int32 max to 0), else
  ``OutOfOrderSequenceError``;
- unknown producer id -> first_seq must be 0, else ``OutOfOrderSequenceError``. (Kafka >= 2.5
  accepts any sequence here, and older versions answered UNKNOWN_PRODUCER_ID; Sluice keeps the
  stricter, simpler rule. Producer entries are never expired, so a live producer is not
  forgotten when retention deletes its batches.)

Replicated and recovered batches update the state without any of these checks.

Snapshot files are named ``<offset>.snapshot`` (20 digits): the state after every batch below
``offset``. Content: 4-byte magic ``SLPS``, uint32 CRC-32C of the body, then a JSON body.
"""

from __future__ import annotations

import json
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c

from sluice.protocol.records import BatchHeader, increment_sequence
from sluice.storage.errors import InvalidProducerEpochError, OutOfOrderSequenceError
from sluice.storage.fsutil import atomic_write

__all__ = [
    "BatchMetadata",
    "ProducerEntry",
    "ProducerStateManager",
    "list_snapshots",
    "snapshot_path",
]

NUM_BATCHES_TO_RETAIN: Final = 5
_INT32_MAX: Final = 2**31 - 1
_MAGIC: Final = b"SLPS"
_PREFIX: Final = struct.Struct(">4sI")
SNAPSHOT_SUFFIX: Final = ".snapshot"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Sequence range and offsets of one appended batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """What is known about one producer id."""

    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT32_MAX)


def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshots(directory: Path) -> list[tuple[int, Path]]:
    """(offset, path) of every snapshot file, ascending."""
    out = []
    for p in directory.glob(f"*{SNAPSHOT_SUFFIX}"):
        stem = p.name[: -len(SNAPSHOT_SUFFIX)]
        if len(stem) == 20 and stem.isdigit():
            out.append((int(stem), p))
    return sorted(out)


class ProducerStateManager:
    """Producer entries of one partition, with validation for leader appends."""

    def __init__(self) -> None:
        self.producers: dict[int, ProducerEntry] = {}

    # --- leader-side validation -----------------------------------------------------------------

    def check(self, headers: list[BatchHeader]) -> BatchMetadata | None:
        """Validate the idempotent batches of one append without changing state.

        Returns the cached metadata if a batch is a duplicate (the caller then appends nothing);
        raises OutOfOrderSequenceError / InvalidProducerEpochError. Several batches of the same
        producer in one append are checked against each other.
        """
        staged: dict[int, tuple[int, int]] = {}  # pid -> (epoch, last_seq) after earlier batches here
        for h in headers:
            if h.producer_id < 0 or h.base_sequence < 0:
                continue
            pid, epoch = h.producer_id, h.producer_epoch
            first_seq, last_seq = h.base_sequence, h.last_sequence
            entry = self.producers.get(pid)
            if pid not in staged and entry is not None:
                dup = entry.find_duplicate(epoch, first_seq, last_seq)
                if dup is not None:
                    return dup
            if pid in staged:
                cur_epoch, cur_last = staged[pid]
            elif entry is not None:
                cur_epoch, cur_last = entry.epoch, entry.last_seq
            else:
                cur_epoch, cur_last = -1, -1
            if cur_epoch >= 0 and epoch < cur_epoch:
                raise InvalidProducerEpochError(
                    f"producer {pid}: epoch {epoch} is older than the current epoch {cur_epoch}"
                )
            if epoch != cur_epoch or cur_last < 0:
                if first_seq != 0:
                    what = "unknown producer" if cur_epoch < 0 else f"new epoch {epoch} (was {cur_epoch})"
                    raise OutOfOrderSequenceError(
                        f"producer {pid}: {what} must start at sequence 0, got {first_seq}"
                    )
            elif not _in_sequence(cur_last, first_seq):
                raise OutOfOrderSequenceError(
                    f"producer {pid} epoch {epoch}: expected sequence {increment_sequence(cur_last, 1)}, "
                    f"got {first_seq} (batch {first_seq}..{last_seq})"
                )
            staged[pid] = (epoch, last_seq)
        return None

    # --- state updates --------------------------------------------------------------------------

    def update(self, header: BatchHeader) -> None:
        """Record an appended batch (offsets assigned). Skips batches without producer id."""
        if header.producer_id < 0:
            return
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch != entry.epoch:
            if entry is not None and header.producer_epoch < entry.epoch:
                return  # a stale batch from replication/recovery never rolls the epoch back
            entry = ProducerEntry(pid, header.producer_epoch)
            self.producers[pid] = entry
        if header.base_sequence >= 0:
            entry.batches.append(
                BatchMetadata(
                    header.base_sequence,
                    header.last_sequence,
                    header.base_offset,
                    header.base_offset + header.last_offset_delta,
                    header.max_timestamp,
                )
            )

    def clear(self) -> None:
        self.producers.clear()

    # --- snapshots ------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = json.dumps(
            [
                [
                    e.producer_id,
                    e.epoch,
                    [
                        [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                        for b in e.batches
                    ],
                ]
                for e in self.producers.values()
            ],
            separators=(",", ":"),
        ).encode("ascii")
        return _PREFIX.pack(_MAGIC, crc32c.crc32c(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes) -> ProducerStateManager:
        """Parse a snapshot; raises ValueError if it is torn or corrupt."""
        if len(data) < _PREFIX.size:
            raise ValueError("snapshot shorter than its header")
        magic, crc = _PREFIX.unpack_from(data, 0)
        body = data[_PREFIX.size :]
        if magic != _MAGIC or crc32c.crc32c(body) != crc:
            raise ValueError("snapshot magic or CRC mismatch")
        mgr = cls()
        try:
            for pid, epoch, batches in json.loads(body):
                entry = ProducerEntry(int(pid), int(epoch))
                for fs, ls, fo, lo, ts in batches:
                    entry.batches.append(BatchMetadata(int(fs), int(ls), int(fo), int(lo), int(ts)))
                mgr.producers[entry.producer_id] = entry
        except (TypeError, ValueError) as exc:
            raise ValueError(f"malformed snapshot body: {exc}") from exc
        return mgr

    def write_snapshot(self, directory: Path, offset: int, *, durable: bool) -> None:
        atomic_write(snapshot_path(directory, offset), self.to_bytes(), durable=durable)

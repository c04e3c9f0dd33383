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

Transaction verification (KIP-890 part 1, Kafka's answer to its hanging transactions,
KAFKA-14402): a leader appends a transactional batch that would open a transaction for its
producer here only with the ``VerificationGuard`` that ``begin_verification`` gave out for that
producer before the leader asked the transaction coordinator whether the transaction is ongoing
and has added this partition. Any transactional batch or marker of the producer appended in
between (the coordinator's ABORT marker, say) drops the guard, so a verification answered before
the transaction ended cannot open a new one after it (the ABA case). A batch of a transaction
already open here needs no guard: the coordinator knows it, and its marker will end it. Without
this, any client with WRITE on a topic could open a transaction no coordinator knows of, which
nothing ever ends: the last stable offset stays there, and every read_committed reader with it.
Guards are in memory only and bounded (``VERIFICATIONS_MAX``): a guard lost to a restart, a
leader change or the bound makes the append refused and the producer retry, never accepted.

Transactions (KIP-98): a producer's first transactional batch on the partition opens its
transaction there at that batch's base offset; the transaction marker (a control batch the
coordinator writes) closes it. While open, a non-transactional batch from the same producer is
refused (``InvalidTxnStateError``). A marker with an epoch older than the producer's is refused
(``InvalidProducerEpochError``: a fenced producer's coordinator), and one from a coordinator
epoch older than the last marker's (``TransactionCoordinatorFencedError``). The first unstable
offset is the first offset of the oldest transaction still open, or of one ended by a marker
not yet below the high watermark (a marker above it may still be lost in a failover, which
would reopen the transaction); the partition's last stable offset is that, or the high
watermark when there is none (``first_unstable_offset``).

Snapshot files are named ``<offset>.snapshot`` (20 digits): the state after every batch below
``offset``. Content: 4-byte magic ``SLPS``, uint32 CRC-32C of the body, then a JSON body: an
object with ``producers`` ([id, epoch, batches, open transaction's first offset, coordinator
epoch] each) and ``completed`` (transactions ended by a marker possibly above the high
watermark); a body that is a bare list is the format before transactions (no transaction open).
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import crc32c

from sluice.protocol.records import (
    ATTR_CONTROL_MASK,
    ATTR_TRANSACTIONAL_MASK,
    BatchHeader,
    ControlMarker,
    increment_sequence,
)
from sluice.storage.errors import (
    InvalidProducerEpochError,
    InvalidTxnStateError,
    OutOfOrderSequenceError,
    TransactionCoordinatorFencedError,
)
from sluice.storage.fsutil import atomic_write

__all__ = [
    "BatchMetadata",
    "CompletedTxn",
    "ProducerEntry",
    "ProducerStateManager",
    "VerificationGuard",
    "list_snapshots",
    "snapshot_path",
]

NUM_BATCHES_TO_RETAIN: Final = 5
_INT32_MAX: Final = 2**31 - 1
_MAGIC: Final = b"SLPS"
_PREFIX: Final = struct.Struct(">4sI")
SNAPSHOT_SUFFIX: Final = ".snapshot"
#: Producers with a verification in flight on one partition, at most (the oldest guard goes
#: first: its request is then refused INVALID_TXN_STATE and retried).
VERIFICATIONS_MAX: Final = 1000


class VerificationGuard:
    """One verification of one producer's transaction on one partition: an identity, nothing
    more. The append that carries it is accepted only while it is still the producer's guard."""

    __slots__ = ("producer_id",)

    def __init__(self, producer_id: int) -> None:
        self.producer_id = producer_id

    def __repr__(self) -> str:
        return f"VerificationGuard(producer_id={self.producer_id}, id={id(self):#x})"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """Sequence range and offsets of one appended batch."""

    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction a marker ended: its first offset and the marker's offset. For an aborted one
    ``last_stable_offset`` is what the aborted-transaction index records (the first offset of the
    oldest other transaction still open, or the marker's offset + 1)."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool
    last_stable_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """What is known about one producer id."""

    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    #: the first offset of its transaction open on this partition (-1: none)
    txn_first_offset: int = -1
    #: the coordinator epoch of the last marker written for it here (-1: none yet)
    coordinator_epoch: int = -1

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
        #: producer id -> first offset of its open transaction (mirrors the entries, for the LSO)
        self._open: dict[int, int] = {}
        #: transactions ended by a marker that may still be above the high watermark
        self._completed: list[CompletedTxn] = []
        #: producer id -> the guard of its transaction's verification in flight (KIP-890)
        self._verifications: OrderedDict[int, VerificationGuard] = OrderedDict()

    # --- transaction verification (KIP-890 part 1) ------------------------------------------------

    def has_open_transaction(self, producer_id: int) -> bool:
        return producer_id in self._open

    def begin_verification(self, producer_id: int) -> VerificationGuard | None:
        """The guard an append of ``producer_id``'s transactional batch must carry, once the
        transaction coordinator has said the transaction is ongoing and has added this
        partition; None when the producer's transaction is already open here (no verification
        needed). A verification already in flight for the producer shares its guard."""
        if producer_id in self._open:
            return None
        guard = self._verifications.get(producer_id)
        if guard is None:
            while len(self._verifications) >= VERIFICATIONS_MAX:
                self._verifications.popitem(last=False)
            guard = self._verifications[producer_id] = VerificationGuard(producer_id)
        return guard

    def verification(self, producer_id: int) -> VerificationGuard | None:
        return self._verifications.get(producer_id)

    # --- leader-side validation -----------------------------------------------------------------

    def check(
        self, headers: list[BatchHeader], verification: VerificationGuard | None = None
    ) -> BatchMetadata | None:
        """Validate the idempotent and transactional batches of one append without changing
        state.

        Returns the cached metadata if a batch is a duplicate (the caller then appends nothing);
        raises OutOfOrderSequenceError / InvalidProducerEpochError, and InvalidTxnStateError for
        a transactional batch that would open a transaction here without ``verification``, the
        producer's current guard (``begin_verification``). Several batches of the same producer
        in one append are checked against each other.
        """
        staged: dict[int, tuple[int, int]] = {}  # pid -> (epoch, last_seq) after earlier batches here
        opened: set[int] = set()  # pids whose transaction an earlier batch of this append opens
        for h in headers:
            pid = h.producer_id
            if pid < 0:
                continue
            entry = self.producers.get(pid)
            if entry is not None:
                if h.producer_epoch < entry.epoch:
                    raise InvalidProducerEpochError(
                        f"producer {pid}: epoch {h.producer_epoch} is older than the current "
                        f"epoch {entry.epoch}"
                    )
                if entry.txn_first_offset >= 0 and not h.attributes & ATTR_TRANSACTIONAL_MASK:
                    raise InvalidTxnStateError(
                        f"producer {pid} has a transaction open here since offset "
                        f"{entry.txn_first_offset}; a non-transactional write is refused until it ends"
                    )
            if h.base_sequence >= 0 and pid not in staged and entry is not None:
                dup = entry.find_duplicate(h.producer_epoch, h.base_sequence, h.last_sequence)
                if dup is not None:
                    return dup
            if h.attributes & ATTR_TRANSACTIONAL_MASK and not h.attributes & ATTR_CONTROL_MASK:
                if pid not in self._open and pid not in opened:
                    self._check_verified(pid, verification)
                opened.add(pid)
            if h.base_sequence < 0:
                continue
            epoch = h.producer_epoch
            first_seq, last_seq = h.base_sequence, h.last_sequence
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

    def _check_verified(self, producer_id: int, verification: VerificationGuard | None) -> None:
        current = self._verifications.get(producer_id)
        if verification is None or current is not verification:
            raise InvalidTxnStateError(
                f"producer {producer_id}: the transactional batch was not part of an ongoing transaction "
                "the transaction coordinator has verified for this partition"
                + (
                    ""
                    if verification is None
                    else " (its transaction ended, or another began, while it was being verified)"
                )
                + "; nothing was appended: add the partition to the transaction (AddPartitionsToTxn) "
                "and send the batch again"
            )

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> None:
        """May the coordinator write this producer's transaction marker here? Raises
        InvalidProducerEpochError (the marker's epoch is older than the producer's: only a
        fenced producer's coordinator could send it) or TransactionCoordinatorFencedError."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpochError(
                f"marker for producer {producer_id} at epoch {producer_epoch}, older than its "
                f"current epoch {entry.epoch}"
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFencedError(
                f"marker for producer {producer_id} from coordinator epoch {coordinator_epoch}; "
                f"epoch {entry.coordinator_epoch} already wrote one"
            )

    # --- state updates --------------------------------------------------------------------------

    def update(self, header: BatchHeader, marker: ControlMarker | None = None) -> CompletedTxn | None:
        """Record an appended batch (offsets assigned); ``marker``: the transaction marker a
        control batch holds. Skips batches without producer id. Returns the transaction a
        marker ended here, if one was open."""
        if header.producer_id < 0:
            return None
        pid = header.producer_id
        entry = self.producers.get(pid)
        if entry is None or header.producer_epoch != entry.epoch:
            if entry is not None and header.producer_epoch < entry.epoch:
                return None  # a stale batch from replication/recovery never rolls the epoch back
            new = ProducerEntry(pid, header.producer_epoch)
            if entry is not None:  # a new epoch starts its sequences over, not its transaction
                new.txn_first_offset, new.coordinator_epoch = entry.txn_first_offset, entry.coordinator_epoch
            entry = new
            self.producers[pid] = entry
        attributes = header.attributes
        if attributes & (ATTR_CONTROL_MASK | ATTR_TRANSACTIONAL_MASK):
            # A marker ended the transaction, or a batch opened it: either way the verification
            # answered before this is spent (Kafka's rule).
            self._verifications.pop(pid, None)
        if attributes & ATTR_CONTROL_MASK:
            return self._end_txn(entry, header.base_offset, marker) if marker is not None else None
        if attributes & ATTR_TRANSACTIONAL_MASK and entry.txn_first_offset < 0:
            entry.txn_first_offset = header.base_offset
            self._open[pid] = header.base_offset
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

        return None

    def _end_txn(
        self, entry: ProducerEntry, marker_offset: int, marker: ControlMarker
    ) -> CompletedTxn | None:
        entry.coordinator_epoch = max(entry.coordinator_epoch, marker.coordinator_epoch)
        first = entry.txn_first_offset
        if first < 0:
            return None  # a marker for a partition the transaction wrote nothing to
        entry.txn_first_offset = -1
        del self._open[entry.producer_id]
        others = min(self._open.values(), default=marker_offset + 1)
        done = CompletedTxn(entry.producer_id, first, marker_offset, not marker.committed, others)
        self._completed.append(done)
        return done

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """The first offset of the oldest transaction open, or ended by a marker at or above
        ``high_watermark`` (forgotten once the high watermark passes its marker); None if none.
        The partition's last stable offset is min(this, high watermark)."""
        if not self._completed and not self._open:
            return None  # no transaction here: the common case, on every fetch
        if self._completed and self._completed[0].last_offset < high_watermark:
            # In marker order: those below the high watermark are a prefix.
            self._completed = [t for t in self._completed if t.last_offset >= high_watermark]
        firsts = [t.first_offset for t in self._completed]
        if self._open:
            firsts.append(min(self._open.values()))
        return min(firsts, default=None)

    @property
    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of each transaction open here (a copy)."""
        return dict(self._open)

    def clear(self) -> None:
        self.producers.clear()
        self._open.clear()
        self._completed.clear()
        self._verifications.clear()

    # --- snapshots ------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        body = json.dumps(
            {
                "producers": [
                    [
                        e.producer_id,
                        e.epoch,
                        [
                            [b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp]
                            for b in e.batches
                        ],
                        e.txn_first_offset,
                        e.coordinator_epoch,
                    ]
                    for e in self.producers.values()
                ],
                "completed": [
                    [t.producer_id, t.first_offset, t.last_offset, t.aborted, t.last_stable_offset]
                    for t in self._completed
                ],
            },
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
            parsed = json.loads(body)
            producers = parsed if isinstance(parsed, list) else parsed["producers"]
            for item in producers:
                pid, epoch, batches = item[:3]
                entry = ProducerEntry(int(pid), int(epoch))
                for fs, ls, fo, lo, ts in batches:
                    entry.batches.append(BatchMetadata(int(fs), int(ls), int(fo), int(lo), int(ts)))
                if len(item) >= 5:
                    entry.txn_first_offset, entry.coordinator_epoch = int(item[3]), int(item[4])
                mgr.producers[entry.producer_id] = entry
                if entry.txn_first_offset >= 0:
                    mgr._open[entry.producer_id] = entry.txn_first_offset
            for pid, first, last, aborted, lso in [] if isinstance(parsed, list) else parsed["completed"]:
                mgr._completed.append(CompletedTxn(int(pid), int(first), int(last), bool(aborted), int(lso)))
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"malformed snapshot body: {exc}") from exc
        return mgr

    def write_snapshot(self, directory: Path, offset: int, *, durable: bool) -> None:
        atomic_write(snapshot_path(directory, offset), self.to_bytes(), durable=durable)

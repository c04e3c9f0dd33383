"""``PartitionLog``: one partition's log in one directory, in Kafka's on-disk layout.

Directory contents::

    00000000000000000000.log         concatenated v2 record batches, exactly as served
    00000000000000000000.index       sparse offset index (see index.py)
    00000000000000000000.timeindex   sparse time index
    00000000000000000000.txnindex    transactions aborted by a marker in the segment (txn_index.py)
    leader-epoch-checkpoint          Kafka's text format (see leader_epoch.py)
    00000000000000001234.snapshot    producer state after every batch below offset 1234
    recovery-point                   text: every batch below this offset was fsynced
    log-start-offset                 text: the log start DeleteRecords moved the log to (absent
                                     while it is the first segment's base offset)
    cleaner-checkpoint               compacted logs: where the last clean stopped (cleaner.py)
    00000000000000000000.log.cleaned a clean's new segment before its commit point, and
    00000000000000000000.log.swap    after it (cleaner.py: what recovery does with each)
    .sluice-clean-shutdown           written by close(), removed by open(), for a log used on
                                     its own; a broker keeps one marker for its whole data
                                     directory instead (``clean`` and ``marker`` below)

The log start offset is the first segment's base offset, or further on where DeleteRecords
(KIP-107) moved it (``advance_log_start``), which may be inside a segment: that offset is kept
in ``log-start-offset``, written durably before any segment below it is deleted, so a crash
never brings deleted records back.

Threading: every method is meant to be called from one thread (the broker's event loop),
except ``flush`` and ``finish_swaps``, which may run concurrently on a worker thread. A lock
guards the state that ``flush`` reads; segment-level locks make sure a file is never fsynced
after being closed. ``finish_swaps`` (the durable half of a clean) holds ``_swap_lock``; every
method that removes or cuts segments (truncation, retention, close, delete) takes it first and
finishes any pending swap itself, so segment files are never renamed and removed at once.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sluice.protocol.primitives import FileRegion
from sluice.protocol.records import (
    ATTR_CONTROL_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    ControlMarker,
    CorruptRecordError,
    InvalidRecordError,
    build_control_batch,
    parse_header,
    read_control_marker,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)
from sluice.storage import cleaner
from sluice.storage.cleaner import CLEANED_SUFFIX, SWAP_SUFFIX, CleanJob, CleanResult, SourceSegment
from sluice.storage.compaction import CleanableRange, SegmentFacts, clean_due, cleanable_range
from sluice.storage.config import LONG_MAX, LogConfig
from sluice.storage.errors import (
    LogClosedError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    UnexpectedAppendOffsetError,
)
from sluice.storage.fsutil import atomic_write, fsync_dir, fsync_file
from sluice.storage.leader_append import check_records, encode_for_topic
from sluice.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT, LeaderEpochCache
from sluice.storage.producer_state import (
    CompletedTxn,
    ProducerEntry,
    ProducerStateManager,
    VerificationGuard,
    list_snapshots,
)
from sluice.storage.segment import LogSegment, TimestampOffset, roll_jitter_ms, segment_file_name
from sluice.storage.txn_index import AbortedTxn

__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LOG_START_OFFSET_FILE",
    "RECOVERY_POINT_FILE",
    "AppendInfo",
    "PartitionLog",
    "ReadResult",
]

log = logging.getLogger("sluice.storage")

CLEAN_SHUTDOWN_FILE: Final = ".sluice-clean-shutdown"
RECOVERY_POINT_FILE: Final = "recovery-point"
LOG_START_OFFSET_FILE: Final = "log-start-offset"
_LOG_SUFFIX: Final = ".log"


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Outcome of an append. ``log_append_time`` is -1 unless the topic uses LogAppendTime.

    For a duplicate idempotent batch nothing was appended and the offsets are the original ones.
    For an empty follower append ``record_count`` is 0 and ``last_offset`` = ``first_offset`` - 1.
    """

    first_offset: int
    last_offset: int
    log_append_time: int
    log_start_offset: int
    duplicate: bool
    record_count: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches read from one segment. ``first_offset`` is the base offset of the first
    batch returned (-1 when ``records`` is empty). ``records`` is their bytes, or, from a
    ``zero_copy`` read, the region of the segment file that holds them (sent from the file by
    the connection; ``data()`` reads it)."""

    records: bytes | FileRegion
    first_offset: int
    log_start_offset: int
    log_end_offset: int

    @property
    def size_bytes(self) -> int:
        return len(self.records)

    def data(self) -> bytes:
        """The records' bytes (read from the file for a region)."""
        return self.records.read() if isinstance(self.records, FileRegion) else self.records


@dataclass(frozen=True, slots=True)
class _PendingSwap:
    """A committed clean's new segment (still ``.cleaned`` on disk) and the base offsets of the
    segments it replaces, whose files are still there."""

    segment: LogSegment
    replaced: tuple[int, ...]


class PartitionLog:
    """One partition's log. Create with ``PartitionLog.open``."""

    def __init__(self, directory: Path, config: LogConfig, now_ms: Callable[[], int]) -> None:
        self._dir = directory
        self.config = config
        self._now_ms = now_ms
        self._lock = threading.RLock()
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._leo = 0
        self._recovery_point = 0
        #: where DeleteRecords moved the log start (0: never); see ``log_start_offset``
        self._deleted_below = 0
        self._unflushed_messages = 0
        self._last_flush_ms = now_ms()
        self._closed = False
        #: What a new log writes into its directory with its first record (see ``open``);
        #: None once written, and for a log that was not new.
        self._deferred_files: dict[str, bytes] | None = None
        #: False for a new log until its first flush (see ``open``).
        self._durable = True
        #: the offset of the newest producer-state snapshot on disk (-1: none)
        self._snapshot_offset = -1
        self._epochs: LeaderEpochCache
        self._producers = ProducerStateManager()
        #: Compaction (storage/cleaner.py): where the last clean stopped, the earliest delete
        #: horizon it left, the clean planned and not committed yet (its job and the segments
        #: it reads), and the committed cleans whose files are not in place yet.
        self._first_dirty = 0
        self._earliest_horizon_ms = -1
        self._planned: tuple[CleanJob, list[LogSegment]] | None = None
        self._pending_swaps: list[_PendingSwap] = []
        self._swap_lock = threading.Lock()
        self._abandoned = False

    # --- opening and recovery ---------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        config: LogConfig,
        *,
        now_ms: Callable[[], int] = _wall_clock_ms,
        new: bool = False,
        clean: bool | None = None,
        deferred_files: Mapping[str, bytes] | None = None,
    ) -> PartitionLog:
        """Open (creating if needed) the log in ``directory``, recovering after an unclean stop.

        ``new``: the caller created ``directory`` just now (``Partition.open``). A new log has
        nothing to recover, and nothing in it is fsynced yet, not even the directory: creating
        thousands of partitions is bound by fsyncs, and an empty log has nothing to keep. Its
        files (the caller's among them), its directory and the directory's entry in its parent
        become durable at its first flush, before any of its data does (``_make_durable``).
        Until then it is in the page cache like any record written without a flush: a process
        crash keeps it, a power loss may take it, and a replica that lost it is an empty
        replica, which copies its leader.

        A new log writes nothing into its directory until its first record
        (``_write_deferred``): not its first segment file (``LogSegment(lazy=True)``), not its
        leader-epoch checkpoint, and not ``deferred_files`` (name to content; the caller's
        metadata). A log found with no segment file and no record is what the new log was:
        empty at offset 0. Creating partitions on this machine is bound by file creation.

        ``clean``: whether the log was closed cleanly, as its owner knows it (a broker's one
        marker for its data directory); None: this log's own marker says."""
        directory.mkdir(parents=True, exist_ok=True)
        log = cls(directory, config, now_ms)
        log._durable = not new
        log._load(new=new, clean=clean)
        if new:
            log._deferred_files = dict(deferred_files or {})
        else:
            assert not deferred_files, "only a new log defers its files"
        return log

    def _write_deferred(self) -> None:
        """Write what a new log kept in memory (the caller's files, the epoch checkpoint), before
        the first record or any other file goes into its directory; once."""
        if self._deferred_files is None:
            return
        for name, content in self._deferred_files.items():
            # Nothing to replace in a new directory: a torn file reads as absent, and the log
            # it describes holds no record yet.
            (self._dir / name).write_bytes(content)
        self._epochs.write_deferred()
        self._deferred_files = None

    def _make_durable(self) -> None:
        """fsync every file of a new log's directory but its segments (the flush that calls
        this fsyncs them next), the directory and its parent; once."""
        self._epochs.make_durable()
        for p in self._dir.iterdir():
            try:
                if p.is_file() and p.suffix not in (_LOG_SUFFIX, ".index", ".timeindex"):
                    fsync_file(p)
            except FileNotFoundError:
                pass  # a temporary file renamed meanwhile: the directory fsync covers the rename
        fsync_dir(self._dir)
        fsync_dir(self._dir.parent)
        self._durable = True

    def _new_segment(self, base_offset: int, *, lazy: bool = False) -> LogSegment:
        seg = LogSegment(
            self._dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            created_ms=self._now_ms(),
            lazy=lazy,
        )
        seg.roll_jitter_ms = roll_jitter_ms(self.config.segment_jitter_ms, self.config.segment_ms)
        return seg

    def _load(self, *, new: bool = False, clean: bool | None = None) -> None:
        d = self._dir
        if new:
            # A directory created just now holds no log: nothing to scan, recover or rebuild,
            # and no segment file until the first record (a log without one loads as this).
            self._segments = [self._new_segment(0, lazy=True)]
            self._bases = [0]
            self._epochs = LeaderEpochCache(d, durable=False, deferred=True)
            return
        for p in d.iterdir():
            if p.name.endswith(".tmp") or p.name.endswith(".deleted"):
                p.unlink()
        swapped = cleaner.recover_swaps(d)  # before anything reads the segment files
        self._first_dirty, self._earliest_horizon_ms = cleaner.read_checkpoint(d)
        marker = d / CLEAN_SHUTDOWN_FILE
        own_marker = clean is None
        if clean is None:
            clean = marker.exists()
        bases = sorted(
            int(p.stem) for p in d.glob("*" + _LOG_SUFFIX) if len(p.stem) == 20 and p.stem.isdigit()
        )
        for suffix in (".index", ".timeindex", ".txnindex"):
            for p in d.glob("*" + suffix):
                if p.stem.isdigit() and int(p.stem) not in bases:
                    p.unlink()  # orphan index
        self._segments = [self._new_segment(b) for b in bases] or [self._new_segment(0)]
        self._bases = [s.base_offset for s in self._segments]

        rebuild_epochs = False
        try:
            self._epochs = LeaderEpochCache(d, durable=self._durable)
        except ValueError:
            (d / LEADER_EPOCH_CHECKPOINT).unlink()
            self._epochs = LeaderEpochCache(d, durable=self._durable)
            rebuild_epochs = True

        first_recover = len(self._segments)
        if not clean:
            rp = self._read_recovery_point()
            first_recover = max(0, bisect_right(self._bases, rp) - 1)
        for seg in self._segments[:first_recover]:
            # A segment a clean swapped in has no index of its own yet (recover_swaps).
            if seg.base_offset in swapped or not seg.load_indexes():
                seg.rebuild(validate=False)
        i = first_recover
        while i < len(self._segments):
            seg = self._segments[i]
            if i > 0 and seg.base_offset < self._segments[i - 1].next_offset:
                self._drop_segments_from(i)  # overlaps its predecessor: cannot be trusted
                break
            if seg.rebuild(validate=True, on_batch=self._recover_epoch):
                self._drop_segments_from(i + 1)  # torn or corrupt batch: nothing after it survives
                break
            i += 1

        self._leo = self._segments[-1].next_offset
        self._deleted_below = self._read_log_start_offset()
        self._epochs.truncate_from_end(self._leo)
        self._epochs.truncate_from_start(self.log_start_offset)
        if rebuild_epochs:
            for h in self._iter_headers(self.log_start_offset):
                self._recover_epoch(h)
        # After a crash the recovered segments' aborted-transaction indexes are rebuilt: the
        # producer state is replayed from a snapshot no later than the first of them.
        recovered_from = (
            self._segments[first_recover].base_offset if first_recover < len(self._segments) else self._leo
        )
        self._load_producer_state(limit=recovered_from)
        if clean:
            self._recovery_point = self._leo
        else:
            for seg in self._segments[first_recover:]:
                seg.flush()
            self._recovery_point = self._leo
            self._write_recovery_point()
        if own_marker:
            try:
                marker.unlink()
            except FileNotFoundError:
                pass
        if self._deleted_below > self._leo:
            # Everything below the recorded log start was deleted, and the log ends before it
            # (a follower that had not fetched that far): it starts there, empty, as Kafka's
            # does, and fetches the rest from its leader.
            self.truncate_fully_and_start_at(self._deleted_below)

    def _recover_epoch(self, header: BatchHeader) -> None:
        if header.partition_leader_epoch > self._epochs.latest_epoch():
            self._epochs.assign(header.partition_leader_epoch, header.base_offset)

    def _read_recovery_point(self) -> int:
        try:
            return int((self._dir / RECOVERY_POINT_FILE).read_text(encoding="ascii").strip())
        except (FileNotFoundError, ValueError):
            return 0

    def _read_log_start_offset(self) -> int:
        try:
            return max(0, int((self._dir / LOG_START_OFFSET_FILE).read_text(encoding="ascii").strip()))
        except (FileNotFoundError, ValueError):
            return 0

    def _write_log_start_offset(self) -> None:
        atomic_write(
            self._dir / LOG_START_OFFSET_FILE, f"{self._deleted_below}\n".encode("ascii"), durable=True
        )

    def _write_recovery_point(self, *, durable: bool = False) -> None:
        atomic_write(
            self._dir / RECOVERY_POINT_FILE, f"{self._recovery_point}\n".encode("ascii"), durable=durable
        )

    def _load_producer_state(self, *, limit: int | None = None) -> None:
        """Rebuild producer state: the newest valid snapshot at or below ``limit`` (default: the
        LEO), then a replay of every batch from there to the LEO. The aborted-transaction
        entries of the markers replayed are dropped first and written again by the replay, so
        the indexes agree with the log wherever it was cut, torn or truncated."""
        limit = self._leo if limit is None else min(limit, self._leo)
        mgr: ProducerStateManager | None = None
        start = self.log_start_offset
        for offset, path in reversed(list_snapshots(self._dir)):
            if offset > self._leo:
                path.unlink()
                continue
            if mgr is None and offset <= limit:
                try:
                    mgr = ProducerStateManager.from_bytes(path.read_bytes())
                    start = max(offset, self.log_start_offset)
                except (OSError, ValueError):
                    path.unlink()
        self._producers = mgr if mgr is not None else ProducerStateManager()
        self._snapshot_offset = start if mgr is not None else -1
        for seg in self._segments:
            if seg.next_offset > start:  # a segment wholly below holds no marker at or above it
                seg.txn_index.truncate_to(start)
        for seg, pos, h in self._iter_batches(start):
            marker = None
            if h.is_control:
                try:
                    marker = read_control_marker(seg.read(pos, h.batch_length + LOG_OVERHEAD), 0, h)
                except CorruptRecordError:
                    marker = None  # passed its CRC yet holds no marker: ends nothing, as Kafka skips it
            self._apply_batch(seg, h, marker)

    def _apply_batch(
        self, seg: LogSegment, header: BatchHeader, marker: ControlMarker | None
    ) -> CompletedTxn | None:
        """Producer state after a batch now in ``seg``; an aborted transaction's entry goes to
        the index of the segment holding its marker."""
        done = self._producers.update(header, marker)
        if done is not None and done.aborted:
            seg.txn_index.append(
                AbortedTxn(done.producer_id, done.first_offset, done.last_offset, done.last_stable_offset)
            )
        return done

    def _iter_batches(self, start_offset: int) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """(segment, position, header) of every batch whose last offset >= ``start_offset``."""
        i = max(0, bisect_right(self._bases, start_offset) - 1)
        for seg in self._segments[i:]:
            pos = 0
            if seg.base_offset <= start_offset:
                found = seg.translate(start_offset)
                if found is None:
                    continue
                pos = found[0]
            for p, h in seg.scan(pos):
                yield seg, p, h

    def _iter_headers(self, start_offset: int) -> Iterator[BatchHeader]:
        """Headers of every batch whose last offset >= ``start_offset``, across segments."""
        for _seg, _pos, h in self._iter_batches(start_offset):
            yield h

    def _drop_segments_from(self, i: int) -> None:
        """Delete segments[i:] (files included)."""
        with self._lock:
            for seg in self._segments[i:]:
                seg.delete()
            del self._segments[i:]
            del self._bases[i:]

    # --- properties -------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def log_start_offset(self) -> int:
        """The first offset a reader may ask for: the first segment's base, or past it where
        DeleteRecords moved it (``advance_log_start``)."""
        return max(self._segments[0].base_offset, self._deleted_below)

    @property
    def log_end_offset(self) -> int:
        """The next offset to be assigned."""
        return self._leo

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def recovery_point(self) -> int:
        """Every batch below this offset has been fsynced."""
        return self._recovery_point

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self._dir} is closed")

    # --- appends ----------------------------------------------------------------------------------

    def _parse_batches(
        self, data: bytes | bytearray | memoryview, *, leader: bool, control_ok: bool = False
    ) -> list[tuple[int, BatchHeader]]:
        """Parse and validate every batch; raise before anything is written. ``control_ok``:
        the batches are the broker's own transaction markers, the only control batches a leader
        appends."""
        out: list[tuple[int, BatchHeader]] = []
        pos, end = 0, len(data)
        cfg = self.config
        while pos < end:
            if pos + HEADER_SIZE > end:
                raise CorruptRecordError(f"truncated batch header at position {pos} ({end - pos} bytes left)")
            h = parse_header(data, pos)
            if h.magic != MAGIC:
                raise InvalidRecordError(
                    f"batch at position {pos} has magic {h.magic}; only magic 2 is supported"
                )
            if h.batch_length < MIN_BATCH_LENGTH or pos + h.batch_length + LOG_OVERHEAD > end:
                raise CorruptRecordError(
                    f"batch at position {pos} has batchLength {h.batch_length} but {end - pos} bytes remain"
                )
            size = h.batch_length + LOG_OVERHEAD
            if leader and size > cfg.max_message_bytes:
                raise RecordTooLargeError(
                    f"batch of {size} bytes exceeds max.message.bytes {cfg.max_message_bytes}"
                )
            validate_batch(data, pos, h, strict_counts=leader)
            if leader and h.is_control and not control_ok:
                raise InvalidRecordError("clients may not append control batches")
            out.append((pos, h))
            pos += size
        if end > self.config.segment_bytes:
            raise RecordTooLargeError(
                f"append of {end} bytes exceeds segment.bytes {self.config.segment_bytes}"
            )
        return out

    def _maybe_roll(
        self, add_bytes: int, max_timestamp: int, first_offset: int, last_offset: int, now: int
    ) -> None:
        active = self._segments[-1]
        cfg = self.config
        # A compacted log's records older than max.compaction.lag.ms must become cleanable, so
        # its active segment rolls at that age too (KIP-354); segment.jitter.ms is drawn per segment.
        segment_ms = min(cfg.segment_ms, cfg.max_compaction_lag_ms) if cfg.compact else cfg.segment_ms
        segment_ms -= active.roll_jitter_ms
        if not active.should_roll(
            add_bytes, max_timestamp, last_offset, now, cfg.segment_bytes, segment_ms
        ) and not (active.size > 0 and active.indexes_full(cfg.segment_index_bytes)):
            return
        assert first_offset >= active.next_offset
        with self._lock:
            active.on_roll()
            seg = self._new_segment(first_offset)
            self._segments.append(seg)
            self._bases.append(first_offset)
        # State after every batch below the new segment: lets retention and recovery start here.
        self._producers.write_snapshot(self._dir, first_offset, durable=False)
        self._snapshot_offset = first_offset

    def append_marker(
        self,
        *,
        producer_id: int,
        producer_epoch: int,
        committed: bool,
        coordinator_epoch: int,
        leader_epoch: int,
        now_ms: int | None = None,
    ) -> AppendInfo:
        """Append a transaction's COMMIT or ABORT marker (the coordinator's WriteTxnMarkers),
        which ends its transaction here. Raises InvalidProducerEpochError or
        TransactionCoordinatorFencedError (see ``ProducerStateManager.check_marker``), having
        appended nothing."""
        self._check_open()
        self._producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        now = self._now_ms() if now_ms is None else now_ms
        batch = build_control_batch(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            committed=committed,
            coordinator_epoch=coordinator_epoch,
            timestamp_ms=now,
        )
        return self._stamp_and_append(
            batch, self._parse_batches(batch, leader=True, control_ok=True), leader_epoch, now
        )

    def begin_verification(self, producer_id: int) -> VerificationGuard | None:
        """Before asking the transaction coordinator about ``producer_id``'s transaction: the
        guard its transactional batch must be appended with, or None if its transaction is
        already open here (see ``ProducerStateManager.begin_verification``)."""
        self._check_open()
        return self._producers.begin_verification(producer_id)

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        *,
        leader_epoch: int,
        now_ms: int | None = None,
        verification: VerificationGuard | None = None,
    ) -> AppendInfo:
        """Validate, assign offsets, stamp and append ``records`` (one or more batches).
        ``verification``: the guard a transactional batch that opens its producer's transaction
        here must carry (``begin_verification``, then the coordinator's yes).

        Raises CorruptRecordError, InvalidRecordError, RecordTooLargeError, KeylessRecordError or
        InvalidTimestampError (naming each refused record), OutOfOrderSequenceError,
        InvalidProducerEpochError or InvalidTxnStateError, having appended nothing.
        """
        self._check_open()
        if len(records) == 0:
            raise InvalidRecordError("produce request carries no record batches")
        batches = self._parse_batches(records, leader=True)
        now = self._now_ms() if now_ms is None else now_ms
        # every record's key and timestamp, then compression.type, before the idempotence check
        # (Kafka's order); refused records are named by their index (KIP-467)
        check_records(records, batches, self.config, now)
        records, batches = encode_for_topic(records, batches, self.config)
        dup = self._producers.check([h for _, h in batches], verification)
        if dup is not None:
            return AppendInfo(
                dup.first_offset,
                dup.last_offset,
                -1,
                self.log_start_offset,
                True,
                dup.last_offset - dup.first_offset + 1,
            )
        return self._stamp_and_append(records, batches, leader_epoch, now)

    def _stamp_and_append(
        self,
        records: bytes | bytearray | memoryview,
        batches: list[tuple[int, BatchHeader]],
        leader_epoch: int,
        now: int,
    ) -> AppendInfo:
        """Assign offsets from the log end, stamp the leader epoch (and LogAppendTime) and
        append validated batches."""
        log_append = self.config.log_append_time
        buf = bytearray(records)
        first_offset = offset = self._leo
        stamped: list[tuple[int, BatchHeader]] = []
        count = 0
        max_ts = -1
        for pos, _h in batches:
            set_base_offset(buf, pos, offset)
            set_partition_leader_epoch(buf, pos, leader_epoch)
            if log_append:
                set_log_append_time(buf, pos, now)
            h = parse_header(buf, pos)
            stamped.append((pos, h))
            offset += h.last_offset_delta + 1
            count += h.records_count
            max_ts = max(max_ts, h.max_timestamp)
        last_offset = offset - 1
        self._write_deferred()
        self._maybe_roll(len(buf), max_ts, first_offset, last_offset, now)
        self._segments[-1].append(buf, stamped)
        with self._lock:
            assert offset > self._leo, "log end offset must grow"
            self._leo = offset
            self._unflushed_messages += count
        if leader_epoch >= 0 and leader_epoch > self._epochs.latest_epoch():
            self._epochs.assign(leader_epoch, first_offset)
        active = self._segments[-1]
        update = self._producers.update
        for pos, h in stamped:
            if h.attributes & ATTR_CONTROL_MASK:
                self._apply_batch(active, h, read_control_marker(buf, pos, h))
            elif h.producer_id >= 0:
                update(h)  # ends no transaction: only a control batch does
        self._maybe_flush_by_messages()
        return AppendInfo(
            first_offset, last_offset, now if log_append else -1, self.log_start_offset, False, count
        )

    def append_as_follower(self, records: bytes | bytearray | memoryview) -> AppendInfo:
        """Append batches that already carry offsets (from the leader), as they are.

        Offsets must start at or above the log end offset and ascend. Updates the leader-epoch
        cache from the batches' partitionLeaderEpoch and the producer state (unchecked).
        """
        self._check_open()
        batches = self._parse_batches(records, leader=False)
        if not batches:
            return AppendInfo(self._leo, self._leo - 1, -1, self.log_start_offset, False, 0)
        expected = self._leo
        count = 0
        max_ts = -1
        # Markers are read before anything is written: a malformed one refuses the append whole.
        markers = {pos: read_control_marker(records, pos, h) for pos, h in batches if h.is_control}
        for _pos, h in batches:
            if h.base_offset < expected:
                raise UnexpectedAppendOffsetError(
                    f"follower batch at offset {h.base_offset} is below the expected offset {expected} "
                    f"(log end offset {self._leo})"
                )
            expected = h.base_offset + h.last_offset_delta + 1
            count += h.records_count
            max_ts = max(max_ts, h.max_timestamp)
        first_offset = batches[0][1].base_offset
        self._write_deferred()
        self._maybe_roll(len(records), max_ts, first_offset, expected - 1, self._now_ms())
        active = self._segments[-1]
        if expected - 1 - active.base_offset > 2**31 - 1 or first_offset < active.base_offset:
            raise UnexpectedAppendOffsetError(
                f"follower batches {first_offset}..{expected - 1} do not fit segment {active.base_offset}"
            )
        active.append(records, batches)
        with self._lock:
            self._leo = expected
            self._unflushed_messages += count
        for pos, h in batches:
            self._recover_epoch(h)
            self._apply_batch(active, h, markers.get(pos))
        self._maybe_flush_by_messages()
        return AppendInfo(first_offset, expected - 1, -1, self.log_start_offset, False, count)

    def _maybe_flush_by_messages(self) -> None:
        fm = self.config.flush_messages
        if fm != LONG_MAX and self._unflushed_messages >= fm:
            self.flush()

    def needs_flush_by_time(self, now_ms: int) -> bool:
        """True when unflushed data is older than ``flush.ms`` (for the broker's periodic flusher)."""
        fms = self.config.flush_ms
        return fms != LONG_MAX and self._unflushed_messages > 0 and now_ms - self._last_flush_ms >= fms

    # --- reads ------------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        *,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
        zero_copy: bool = False,
    ) -> ReadResult:
        """Whole batches from the one containing ``offset``, within one segment.

        Stops before exceeding ``max_bytes`` (but returns the first batch whole if
        ``min_one_batch``) and before any batch whose base offset >= ``max_offset``. With
        ``zero_copy`` the records are not read: ``records`` is the region of the segment file
        that holds them, on a descriptor of its own (valid after the segment is deleted or
        replaced), for the connection to send from the file.
        """
        self._check_open()
        leo, lso = self._leo, self.log_start_offset
        if offset < lso or offset > leo:
            raise OffsetOutOfRangeError(f"offset {offset} is outside the log range [{lso}, {leo}]")
        limit_offset = leo if max_offset is None else min(max_offset, leo)
        empty = ReadResult(b"", -1, lso, leo)
        if offset >= limit_offset:
            return empty
        i = max(0, bisect_right(self._bases, offset) - 1)
        for seg in self._segments[i:]:
            found = seg.translate(offset) if seg.base_offset <= offset else seg.translate(seg.base_offset)
            if found is None:
                continue
            start, header = found
            if header.base_offset >= limit_offset:
                return empty
            end = seg.size
            if limit_offset < seg.next_offset:
                end = seg.position_of_base_at_least(limit_offset, start)
            first_size = header.batch_length + LOG_OVERHEAD
            if end - start > max_bytes:
                if first_size > max_bytes:
                    if not min_one_batch:
                        return empty
                    end = start + first_size
                else:
                    end = seg.boundary_at_or_below(start + max_bytes, start)
            assert end > start
            if zero_copy:
                region = seg.region(start, end - start)
                if region is not None:
                    return ReadResult(region, header.base_offset, lso, leo)
            data = seg.read(start, end - start)
            assert len(data) == end - start, f"short read of {seg.path.name} at {start}"
            assert parse_header(data, 0).base_offset == header.base_offset
            return ReadResult(data, header.base_offset, lso, leo)
        return empty

    def offset_for_timestamp(self, ts_ms: int) -> TimestampOffset | None:
        """The first record (not batch) whose timestamp is >= ``ts_ms``, as Kafka's ListOffsets
        answers; None if no record reaches it."""
        self._check_open()
        start = self.log_start_offset
        for seg in self._segments:
            if seg.max_timestamp >= ts_ms:
                found = seg.find_timestamp(ts_ms, start)
                if found is not None:
                    return found
        return None

    def max_timestamp_offset(self) -> TimestampOffset | None:
        """The first record carrying the log's largest timestamp (ListOffsets MAX_TIMESTAMP,
        KIP-734): in the first segment that reached it, the first record of the first batch that
        did, as Kafka answers; None for a log without timestamps."""
        self._check_open()
        best: LogSegment | None = None
        for seg in self._segments:
            if seg.max_timestamp >= 0 and (best is None or seg.max_timestamp > best.max_timestamp):
                best = seg
        if best is None:
            return None
        return best.find_timestamp(best.max_timestamp, self.log_start_offset)

    # --- transactions ---------------------------------------------------------------------------------

    def last_stable_offset(self, high_watermark: int) -> int:
        """The offset below which every transaction has ended by a marker below
        ``high_watermark``: the first unstable offset, or the high watermark when lower. A
        read_committed reader sees nothing at or above it."""
        first = self._producers.first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    def collect_aborted(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Transactions aborted by a marker that overlap [fetch_offset, upper_bound): what a
        read_committed Fetch returning those offsets tells the consumer to drop."""
        self._check_open()
        out: list[AbortedTxn] = []
        i = max(0, bisect_right(self._bases, fetch_offset) - 1)
        for seg in self._segments[i:]:
            found, complete = seg.txn_index.collect(fetch_offset, upper_bound)
            out.extend(found)
            if complete:
                break
        return out

    @property
    def open_transactions(self) -> dict[int, int]:
        """producer id -> first offset of each transaction open on this partition."""
        return self._producers.open_transactions

    # --- truncation and retention -------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at and after ``offset`` (rounding down to the containing batch)."""
        self._check_open()
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate to negative offset {offset}")
        if offset >= self._leo:
            return
        if offset < self.log_start_offset:
            self.truncate_fully_and_start_at(offset)
            return
        self.finish_swaps()
        with self._lock:
            i = bisect_right(self._bases, offset) - 1
            self._drop_segments_from(i + 1)
            seg = self._segments[i]
            seg.truncate_to(offset)
            self._leo = seg.next_offset
            assert self._leo <= offset
            self._recovery_point = min(self._recovery_point, self._leo)
        if self._deleted_below > self._leo:
            # The batch holding the log start went with the truncation: the log starts at its
            # end, and its leader's answer (its own log start) says where records begin.
            self._deleted_below = self._leo
            self._write_log_start_offset()
        self._write_recovery_point()
        self._epochs.truncate_from_end(self._leo)
        self._load_producer_state()
        if self._first_dirty > self._leo:  # what is appended from here on is dirty
            self._set_first_dirty(self._leo)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete everything and restart the log, empty, at ``offset``."""
        self._check_open()
        self._write_deferred()  # its segment at ``offset`` is a file, so its directory is no longer new
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot start the log at negative offset {offset}")
        self.finish_swaps()
        with self._lock:
            for seg in self._segments:
                seg.delete()
            for _off, path in list_snapshots(self._dir):
                path.unlink()
            self._segments = [self._new_segment(offset)]
            self._bases = [offset]
            self._leo = offset
            self._recovery_point = offset
            self._unflushed_messages = 0
            moved = self._deleted_below != 0
            self._deleted_below = 0
        if moved:
            self._write_log_start_offset()
        self._write_recovery_point()
        self._epochs.clear()
        self._producers = ProducerStateManager()
        self._earliest_horizon_ms = -1
        self._set_first_dirty(offset)

    def delete_old_segments(self, now_ms: int, *, high_watermark: int | None = None) -> int:
        """Apply retention.ms / retention.bytes; returns the number of segments deleted.

        Deletes a prefix of segments, never the active one, and (if given) only segments lying
        wholly below ``high_watermark``. A segment expires when its largest timestamp (or file
        mtime if it has none) is older than retention.ms.
        """
        self._check_open()
        cfg = self.config
        if not cfg.delete or (cfg.retention_ms < 0 and cfg.retention_bytes < 0):
            return 0  # cleanup.policy=compact alone: nothing is deleted by age or size
        total = self.size_bytes
        n = 0
        for i, seg in enumerate(self._segments[:-1]):
            next_base = self._bases[i + 1]
            if high_watermark is not None and next_base > high_watermark:
                break
            largest = seg.max_timestamp if seg.max_timestamp >= 0 else seg.modified_ms
            by_time = cfg.retention_ms >= 0 and now_ms - largest > cfg.retention_ms
            by_size = cfg.retention_bytes >= 0 and total - seg.size >= cfg.retention_bytes
            if not (by_time or by_size):
                break
            total -= seg.size
            n += 1
        if n == 0:
            return 0
        self.finish_swaps()
        with self._lock:
            doomed = self._segments[:n]
            del self._segments[:n]
            del self._bases[:n]
        for seg in doomed:
            seg.delete()
        lso = self.log_start_offset
        self._recovery_point = max(self._recovery_point, lso)
        self._epochs.truncate_from_start(lso)
        snaps = list_snapshots(self._dir)
        below = [p for off, p in snaps if off < lso]
        for p in below[:-1]:  # keep the newest snapshot below the log start
            p.unlink()
        return n

    def advance_log_start(self, offset: int) -> bool:
        """Move the log start to ``offset`` (DeleteRecords, KIP-107, or a follower following its
        leader's log start): records below it are gone for readers at once, and segments wholly
        below it are deleted (never the active one). False when the log already starts there or
        later. ``offset`` must not pass the log end; callers keep it at or below the high
        watermark, so nothing uncommitted is ever deleted.

        The new start is written durably before any segment goes: a crash in between leaves the
        segments with the start past them, never deleted records readable again."""
        self._check_open()
        if offset <= self.log_start_offset:
            return False
        if offset > self._leo:
            raise OffsetOutOfRangeError(f"cannot start the log at {offset}, past its end {self._leo}")
        self._deleted_below = offset
        self._write_log_start_offset()
        n = 0
        while n + 1 < len(self._segments) and self._bases[n + 1] <= offset:
            n += 1
        if n:
            self.finish_swaps()  # as retention does: a committed clean's files go in place first
            with self._lock:
                doomed = self._segments[:n]
                del self._segments[:n]
                del self._bases[:n]
            for seg in doomed:
                seg.delete()
        lso = self.log_start_offset
        assert lso == offset, (lso, offset)
        self._recovery_point = max(self._recovery_point, lso)
        self._epochs.truncate_from_start(lso)
        snaps = list_snapshots(self._dir)
        for p in [p for off, p in snaps if off < lso][:-1]:  # keep the newest snapshot below the start
            p.unlink()
        return True

    def producer_entries(self) -> list[ProducerEntry]:
        """The idempotent producers this log knows (DescribeProducers), as copies."""
        return [
            ProducerEntry(e.producer_id, e.epoch, deque(e.batches, maxlen=e.batches.maxlen))
            for e in self._producers.producers.values()
        ]

    # --- compaction (storage/cleaner.py has the protocol) ------------------------------------------

    def cleanable(self, now_ms: int, *, stable_end: int) -> CleanableRange:
        """Where a clean could act now and how dirty the log is (``compaction.cleanable_range``).
        ``stable_end`` (the high watermark) is lowered to the last stable offset: the records of a
        transaction still open, or whose marker is not yet committed, are never cleaned."""
        stable_end = self.last_stable_offset(stable_end)
        facts = [
            SegmentFacts(s.base_offset, s.next_offset, s.size, s.first_batch_timestamp, s.max_timestamp)
            for s in self._segments
        ]
        return cleanable_range(
            facts,
            first_dirty=self._first_dirty,
            stable_end=stable_end,
            now_ms=now_ms,
            min_compaction_lag_ms=self.config.min_compaction_lag_ms,
        )

    def clean_due(self, now_ms: int, *, stable_end: int) -> CleanableRange | None:
        """The cleanable range when a clean is due (``compaction.clean_due``, or a delete horizon
        left by the last clean has passed, so tombstones are to be removed); None otherwise, and
        for a log that is not compacted, is closed, or has a clean in progress."""
        if not self.config.compact or self._closed or self._planned is not None or self._pending_swaps:
            return None
        cfg = self.config
        rng = self.cleanable(now_ms, stable_end=stable_end)
        if rng.end_index == 0:
            return None
        due = clean_due(
            rng,
            min_cleanable_dirty_ratio=cfg.min_cleanable_dirty_ratio,
            max_compaction_lag_ms=cfg.max_compaction_lag_ms,
            now_ms=now_ms,
        )
        horizon = self._earliest_horizon_ms
        return rng if due or 0 <= horizon <= now_ms else None

    def clean_job(
        self, now_ms: int, *, stable_end: int, map_entries_max: int, force: bool = False
    ) -> CleanJob | None:
        """Plan a clean (step 1's input): None unless one is due (``force``: whenever there is
        something below the clean point). The log remembers the segments the job reads, which
        ``commit_clean`` checks are still there, unchanged."""
        rng = self.clean_due(now_ms, stable_end=stable_end)
        if rng is None and force and self.config.compact and not (self._planned or self._pending_swaps):
            rng = self.cleanable(now_ms, stable_end=stable_end)
        if rng is None or rng.end_index == 0 or self._closed:
            return None
        segments = self._segments[: rng.end_index]
        producers = {
            pid: entry.batches[-1].last_offset
            for pid, entry in self._producers.producers.items()
            if entry.batches
        }
        job = CleanJob(
            directory=self._dir,
            sources=tuple(
                SourceSegment(s.base_offset, s.next_offset, s.size, tuple(s.txn_index.entries))
                for s in segments
            ),
            first_dirty=rng.first_dirty,
            end=rng.end,
            now_ms=now_ms,
            delete_retention_ms=self.config.delete_retention_ms,
            segment_bytes=self.config.segment_bytes,
            index_interval_bytes=self.config.index_interval_bytes,
            producer_last_offsets=producers,
            map_entries_max=map_entries_max,
            token=uuid.uuid4().hex,
            aborted=tuple(
                e for seg in self._segments for e in seg.txn_index.entries if e.first_offset < rng.end
            ),
        )
        self._planned = (job, list(segments))
        return job

    def abandon_clean(self, job: CleanJob) -> None:
        """The planned clean ``job`` will not be committed (it failed or was stopped): forget it
        and delete what it wrote."""
        if self._planned is not None and self._planned[0].token == job.token:
            self._planned = None
        cleaner.discard(self._dir, [s.base_offset for s in job.sources])

    def commit_clean(self, result: CleanResult) -> bool:
        """Step 2: put the cleaned segments in place in memory, if every segment the clean read
        is still in the log, unchanged (else drop the clean and its files; False). The files are
        put in place by ``finish_swaps`` next."""
        job = result.job
        planned, self._planned = self._planned, None
        if planned is None or planned[0].token != job.token or self._closed:
            cleaner.discard(self._dir, [g.base_offset for g in result.groups])
            return False
        read = planned[1]
        now_here = self._segments[: len(read)]
        unchanged = (
            len(self._segments) > len(read)
            and all(a is b for a, b in zip(now_here, read, strict=True))
            and all(seg.size == src.size for seg, src in zip(read, job.sources, strict=True))
        )
        if not unchanged:
            log.info("event=clean_dropped dir=%s reason=segments_changed_meanwhile", self._dir.name)
            cleaner.discard(self._dir, [g.base_offset for g in result.groups])
            return False
        new: list[LogSegment] = []
        try:
            for g in result.groups:
                seg = LogSegment(
                    self._dir,
                    g.base_offset,
                    index_interval_bytes=self.config.index_interval_bytes,
                    created_ms=self._now_ms(),
                    suffix=CLEANED_SUFFIX,
                )
                new.append(seg)
                assert seg.size == g.size, f"cleaned segment {seg.path.name}: {seg.size} bytes, not {g.size}"
                if not seg.load_indexes():
                    seg.rebuild(validate=False)
        except BaseException:
            for seg in new:
                seg.close()
            cleaner.discard(self._dir, [g.base_offset for g in result.groups])
            raise
        replaced: list[LogSegment] = []
        kept: list[LogSegment] = []
        i = 0
        groups = iter(zip(result.groups, new, strict=True))
        nxt = next(groups, None)
        while i < len(read):
            if nxt is not None and nxt[0].first == i:
                kept.append(nxt[1])
                replaced.extend(read[i : nxt[0].last + 1])
                self._pending_swaps.append(
                    _PendingSwap(nxt[1], tuple(s.base_offset for s in read[i : nxt[0].last + 1]))
                )
                i = nxt[0].last + 1
                nxt = next(groups, None)
            else:
                kept.append(read[i])
                i += 1
        with self._lock:
            self._segments = kept + self._segments[len(read) :]
            self._bases = [s.base_offset for s in self._segments]
        for seg in replaced:
            seg.close()  # their files go in finish_swaps, once the new ones are committed
        segs = self._segments
        assert all(segs[i].next_offset <= segs[i + 1].base_offset for i in range(len(segs) - 1)), (
            f"segments of {self._dir.name} overlap after a clean"
        )
        self._first_dirty = result.end
        self._earliest_horizon_ms = result.earliest_horizon_ms
        if not self._pending_swaps:
            self._set_first_dirty(result.end)
        return True

    def finish_swaps(self, *, fault: Callable[[str], None] | None = None) -> None:
        """Step 3: put the files of committed cleans in place, durably (cleaner.py's protocol),
        then write the cleaner checkpoint. Thread-safe; a no-op when nothing is pending.
        ``fault`` (tests) is called after each step with its name, to stop there as a crash would."""
        with self._swap_lock:
            if self._abandoned or not self._pending_swaps:
                return
            d = self._dir
            while self._pending_swaps:
                swap = self._pending_swaps[0]
                seg = swap.segment
                base = seg.base_offset
                seg.move_log_file(d / (segment_file_name(base, ".log") + SWAP_SUFFIX))
                fsync_dir(d)  # the commit point: from here on recovery completes this swap
                if fault is not None:
                    fault("swap")
                for old in swap.replaced:
                    names = [".index", ".timeindex", ".txnindex"]
                    if old != base:
                        names.append(".log")
                    for suffix in names:
                        try:
                            (d / segment_file_name(old, suffix)).unlink()
                        except FileNotFoundError:
                            pass
                        if fault is not None:
                            fault(f"unlinked {segment_file_name(old, suffix)}")
                fsync_dir(d)  # no replaced file may outlive the swap's rename below
                if fault is not None:
                    fault("deleted")
                # The indexes first: recovery takes a ``.txnindex.cleaned`` beside a ``.log.swap``
                # as the swap's, and drops every ``.cleaned`` file once no ``.log.swap`` is left.
                seg.rename_indexes("")
                if fault is not None:
                    fault("indexes renamed")
                seg.move_log_file(d / segment_file_name(base, ".log"))
                self._pending_swaps.pop(0)
                if fault is not None:
                    fault("renamed")
            self._set_first_dirty(self._first_dirty)

    def _set_first_dirty(self, offset: int) -> None:
        self._first_dirty = offset
        if self._dir.exists():
            cleaner.write_checkpoint(self._dir, offset, self._earliest_horizon_ms)

    @property
    def first_dirty_offset(self) -> int:
        """Where the last clean stopped: below it the log holds one record per key."""
        return self._first_dirty

    # --- leader epochs ----------------------------------------------------------------------------

    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch: see ``LeaderEpochCache.end_offset_for``."""
        return self._epochs.end_offset_for(epoch, self._leo)

    def assign_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (e.g. on becoming leader)."""
        self._epochs.assign(epoch, start_offset)

    @property
    def epoch_entries(self) -> list[tuple[int, int]]:
        return self._epochs.entries

    # --- durability and lifecycle -----------------------------------------------------------------

    def flush(self) -> None:
        """fsync every dirty segment and index, then advance the recovery point. Thread-safe."""
        with self._lock:
            if self._closed:
                return
            if not self._durable and self._leo > 0:
                # A new log becomes durable once it holds something: one that never did has
                # nothing to keep, and closing thousands of them must not fsync each.
                self._make_durable()
            segs = [s for s in self._segments if s.is_dirty or s is self._segments[-1]]
            leo = self._leo
            msgs = self._unflushed_messages
        for s in segs:
            s.flush()
        with self._lock:
            self._unflushed_messages -= msgs
            self._last_flush_ms = self._now_ms()
            if leo > self._recovery_point and not self._closed:
                self._recovery_point = leo
                self._write_recovery_point()

    def close(self, *, marker: bool = True) -> None:
        """Flush, snapshot producer state, close files, and with ``marker`` write this log's
        clean-shutdown marker. A broker passes ``marker=False`` and writes one marker for its data
        directory once every log is closed; a log then costs nothing to close when nothing
        changed since its last flush and snapshot (the recovery point is written by the flush,
        a producer snapshot only if batches came after the last one; both are checked when
        read, and neither is needed once the data directory's marker says clean)."""
        if self._closed:
            return
        self.finish_swaps()
        self._segments[-1].on_roll()  # persist the active segment's max timestamp
        self.flush()
        if marker or (self._leo > 0 and self._snapshot_offset != self._leo):
            self._producers.write_snapshot(self._dir, self._leo, durable=marker)
            self._snapshot_offset = self._leo
        with self._lock:
            if marker:
                self._recovery_point = self._leo
                self._write_recovery_point(durable=True)
            for seg in self._segments:
                seg.close()
            self._closed = True
        if marker:
            atomic_write(self._dir / CLEAN_SHUTDOWN_FILE, b"", durable=True)

    def abandon(self) -> None:
        """Close file handles without flushing or writing the clean-shutdown marker.

        Simulates a crash of the process (for tests and fault injection): a clean's swap not
        finished yet stays as the crash left it on disk.
        """
        with self._swap_lock, self._lock:
            self._abandoned = True
            for seg in self._segments:
                seg.close()
            self._closed = True

    def delete(self) -> None:
        """Close and remove the whole directory (topic deletion)."""
        self.abandon()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __repr__(self) -> str:
        return (
            f"PartitionLog({str(self._dir)!r}, start={self.log_start_offset}, end={self._leo}, "
            f"segments={len(self._segments)})"
        )

"""One log segment: ``<base>.log`` (concatenated v2 batches) plus its ``.index`` and ``.timeindex``.

Writes go through ``os.pwrite`` at the end of the file, reads through ``os.pread``; neither
fsyncs. ``flush`` fsyncs the log and both indexes. A per-segment lock serialises ``flush``
(which may run on a worker thread) with ``close``/``delete``/``truncate`` so an fd is never
fsynced after it was closed (and possibly reused).

The first segment of a new log is created without its file (``lazy``): the file appears at the
first write. A log with no segment file loads as one empty segment at offset 0, which is exactly
what a lazy segment is, so nothing about it needs to be on disk. Creating 10,000 partitions was
bound by file creation on this machine (0.5-1 ms each), and a broker creates one log per replica.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from sluice.protocol.primitives import FileRegion
from sluice.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    CorruptRecordError,
    decode_records,
    parse_header,
    validate_batch,
)
from sluice.storage.fsutil import pread_exact, write_all
from sluice.storage.index import IndexCorruptError, OffsetIndex, TimeIndex
from sluice.storage.txn_index import TransactionIndex

__all__ = ["LogSegment", "TimestampOffset", "first_record_at_or_after", "roll_jitter_ms", "segment_file_name"]

INT32_MAX: Final = 2**31 - 1
_SCAN_CHUNK: Final = 1 << 20
_SHORT_CHUNK: Final = 16 << 10


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's file name: base offset zero-padded to 20 digits, then the suffix (``.log``...)."""
    return f"{base_offset:020d}{suffix}"


def roll_jitter_ms(jitter_ms: int, segment_ms: int, draw: Callable[[int], int] = random.randrange) -> int:
    """How much earlier than segment.ms a new segment rolls: drawn from [0, min(jitter, segment.ms)),
    so that segments created together do not all roll together (Kafka's segment.jitter.ms)."""
    span = min(jitter_ms, segment_ms)
    return draw(span) if span > 0 else 0


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A record found by its timestamp (ListOffsets): its offset, its own timestamp, and the
    leader epoch of the batch holding it (-1 when the batch carries none)."""

    offset: int
    timestamp: int
    leader_epoch: int


def first_record_at_or_after(
    batch: bytes, header: BatchHeader, timestamp: int, start_offset: int = 0
) -> TimestampOffset | None:
    """The first record of one whole ``batch`` whose timestamp is >= ``timestamp`` and whose
    offset is >= ``start_offset``; None if it has none. Kafka answers a lookup by time with a
    record, not a batch: a batch's base offset would make a consumer seeking by time re-read the
    batch's earlier records. With LogAppendTime every record carries the batch's max timestamp."""
    if header.max_timestamp < timestamp or header.last_offset < start_offset:
        return None
    for record in decode_records(batch, 0, header):
        if record.timestamp >= timestamp and record.offset >= start_offset:
            epoch = header.partition_leader_epoch if header.partition_leader_epoch >= 0 else -1
            return TimestampOffset(record.offset, record.timestamp, epoch)
    return None


class LogSegment:
    """A segment's files and the in-memory facts needed to append and read quickly."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        created_ms: int,
        lazy: bool = False,
        suffix: str = "",
    ) -> None:
        """``lazy``: a new, empty segment at offset 0 whose file is created at its first write
        (only a new log's first segment: one at another offset must be on disk to say where the
        log starts). ``suffix``: appended to all three file names (the log cleaner writes a
        segment as ``<base>.log.cleaned`` ..., renamed by ``rename_suffix`` once it is in place)."""
        assert base_offset >= 0, f"negative segment base offset {base_offset}"
        assert not lazy or base_offset == 0, f"a lazy segment at offset {base_offset}"
        self.base_offset = base_offset
        self.suffix = suffix
        self.path = directory / (segment_file_name(base_offset, ".log") + suffix)
        self._closed = False
        self._fd: int | None = None
        self.size = 0
        if not lazy:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            self.size = os.fstat(self._fd).st_size
        self.offset_index = OffsetIndex(
            directory / (segment_file_name(base_offset, ".index") + suffix), base_offset
        )
        self.time_index = TimeIndex(
            directory / (segment_file_name(base_offset, ".timeindex") + suffix), base_offset
        )
        #: transactions aborted by a marker in this segment (read lazily, written rarely)
        self.txn_index = TransactionIndex(directory / (segment_file_name(base_offset, ".txnindex") + suffix))
        self.index_interval_bytes = index_interval_bytes
        #: Offset after the last batch (== base_offset while empty).
        self.next_offset = base_offset
        #: Largest batch maxTimestamp in the segment and the base offset of the batch that first reached it.
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        #: maxTimestamp of the first batch (for segment.ms); -1 while empty.
        self.first_batch_timestamp = -1
        self.created_ms = created_ms
        self._bytes_since_index = 0
        self._dirty = False
        self._lock = threading.Lock()
        #: taken off segment.ms for this segment (segment.jitter.ms; see ``roll_jitter_ms``)
        self.roll_jitter_ms = 0

    # --- loading ------------------------------------------------------------------------------

    def load_indexes(self) -> bool:
        """Load and validate both indexes, then derive the tail state from the last indexed batch.

        Returns False (and leaves the indexes unusable) when an index is corrupt; the caller must
        then call ``rebuild``.
        """
        try:
            self.offset_index.load(self.size)
            start_offset, start_pos = self.offset_index.lookup(2**63 - 1)
            if start_pos:
                header = parse_header(self.read(start_pos, HEADER_SIZE), 0)
                if header.base_offset != start_offset:
                    raise IndexCorruptError(
                        f"{self.offset_index.path.name}: last entry points at offset {header.base_offset}, "
                        f"expected {start_offset}"
                    )
            self._tail_scan(start_pos)
            self.time_index.load(self.next_offset - 1 if self.size else self.base_offset)
        except (IndexCorruptError, CorruptRecordError):
            return False
        last = self.time_index.last_entry()
        if last is not None and last[0] >= self.max_timestamp:
            self.max_timestamp, self.offset_of_max_timestamp = last
        if self.size:
            first = parse_header(self.read(0, HEADER_SIZE), 0)
            self.first_batch_timestamp = first.max_timestamp
        return True

    def _tail_scan(self, start_pos: int) -> None:
        """Walk headers from ``start_pos`` to the end to find next_offset and the tail's max timestamp."""
        self._bytes_since_index = 0
        for _pos, header in self.scan(start_pos):
            self.next_offset = header.base_offset + header.last_offset_delta + 1
            self._bytes_since_index += header.batch_length + LOG_OVERHEAD
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.offset_of_max_timestamp = header.base_offset

    def rebuild(self, *, validate: bool, on_batch: Callable[[BatchHeader], None] | None = None) -> bool:
        """Rescan the whole log file, rebuilding both indexes and the in-memory state.

        With ``validate`` every batch's CRC is checked too. At the first torn, corrupt or
        non-monotonic batch the file is truncated there. Returns True if bytes were cut.
        ``on_batch`` sees every surviving batch header in order.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self.first_batch_timestamp = -1
        self._bytes_since_index = 0
        valid_end = 0
        try:
            for pos, header in self.scan(0, validate=validate):
                if header.base_offset < self.next_offset or header.last_offset_delta < 0:
                    raise CorruptRecordError(
                        f"{self.path.name}: batch at {pos} has offset {header.base_offset} "
                        f"below {self.next_offset}"
                    )
                if header.base_offset + header.last_offset_delta - self.base_offset > INT32_MAX:
                    raise CorruptRecordError(
                        f"{self.path.name}: batch at {pos} is beyond int32 relative range"
                    )
                self._index_batch(pos, header)
                valid_end = pos + header.batch_length + LOG_OVERHEAD
                if on_batch is not None:
                    on_batch(header)
        except CorruptRecordError:
            pass
        if valid_end < self.size:
            self.truncate_file(valid_end)
            return True
        return False

    # --- appending --------------------------------------------------------------------------------

    def _index_batch(self, pos: int, header: BatchHeader) -> None:
        """Update in-memory state and indexes for a batch now at ``pos``."""
        if self.first_batch_timestamp < 0 and pos == 0:
            self.first_batch_timestamp = header.max_timestamp
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.base_offset
        if self._bytes_since_index > self.index_interval_bytes:
            self.offset_index.append(header.base_offset, pos)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index = 0
        self._bytes_since_index += header.batch_length + LOG_OVERHEAD
        self.next_offset = header.base_offset + header.last_offset_delta + 1

    def append(self, data: bytes | bytearray | memoryview, batches: list[tuple[int, BatchHeader]]) -> None:
        """Write ``data`` (whole batches, offsets already assigned) at the end of the file.

        ``batches`` holds (position within ``data``, header) of each batch in ``data``.
        """
        if self._fd is None:
            with self._lock:  # against a close on another thread: never open after it
                assert not self._closed, f"{self.path} is closed"
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        assert not self._closed, f"{self.path} is closed"
        assert batches and batches[0][1].base_offset >= self.next_offset, (
            f"append at offset {batches[0][1].base_offset} below segment next offset {self.next_offset}"
        )
        assert batches[-1][1].base_offset + batches[-1][1].last_offset_delta - self.base_offset <= INT32_MAX
        start = self.size
        write_all(self._fd, data, start)
        self.size = start + len(data)
        self._dirty = True
        for pos, header in batches:
            self._index_batch(start + pos, header)

    def should_roll(
        self,
        add_bytes: int,
        max_timestamp: int,
        last_offset: int,
        now_ms: int,
        segment_bytes: int,
        segment_ms: int,
    ) -> bool:
        """Kafka's rule: never roll an empty segment; roll when full, old, or offsets overflow."""
        if self.size == 0:
            return False
        if self.size > segment_bytes - add_bytes:
            return True
        waited = (
            (max_timestamp - self.first_batch_timestamp)
            if self.first_batch_timestamp >= 0
            else (now_ms - self.created_ms)
        )
        if waited > segment_ms:
            return True
        return last_offset - self.base_offset > INT32_MAX

    def indexes_full(self, index_bytes_max: int) -> bool:
        """Whether either index holds as many entries as ``segment.index.bytes`` has room for
        (8 bytes an offset entry, 12 a time entry): Kafka rolls the segment then."""
        return (
            len(self.offset_index.offsets) >= index_bytes_max // 8
            or len(self.time_index.timestamps) >= index_bytes_max // 12
        )

    def on_roll(self) -> None:
        """Called when the segment stops being active: record its final max timestamp."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    # --- reading ------------------------------------------------------------------------------------

    def read(self, position: int, size: int) -> bytes:
        """Bytes [position, position + size) of the log file (shorter at EOF)."""
        assert not self._closed, f"{self.path} is closed"
        assert position >= 0 and size >= 0
        if self._fd is None:
            return b""  # a lazy segment, still without its file: empty
        return pread_exact(self._fd, size, position)

    def region(self, position: int, size: int) -> FileRegion | None:
        """Bytes [position, position + size) of the log file as a region on a descriptor of its
        own (``os.dup``: the bytes stay readable if this segment is closed, deleted or replaced
        by a compacted one before the region is sent); None for a lazy segment without a file."""
        assert not self._closed, f"{self.path} is closed"
        assert position >= 0 and size >= 0
        if self._fd is None:
            return None
        return FileRegion(os.dup(self._fd), position, size)

    def scan(
        self, start: int = 0, end: int | None = None, *, validate: bool = False, chunk_size: int = _SCAN_CHUNK
    ) -> Iterator[tuple[int, BatchHeader]]:
        """Yield (position, header) of each batch in [start, end), reading in chunks.

        Raises CorruptRecordError at a torn or malformed batch (or, with ``validate``, a CRC
        mismatch); batches before it have been yielded.
        """
        end = self.size if end is None else end
        pos = start
        chunk = b""
        chunk_start = pos
        while pos < end:
            off = pos - chunk_start
            if off + HEADER_SIZE > len(chunk):
                chunk = self.read(pos, min(chunk_size, end - pos))
                chunk_start, off = pos, 0
                if len(chunk) < HEADER_SIZE:
                    raise CorruptRecordError(f"{self.path.name}: truncated batch header at position {pos}")
            header = parse_header(chunk, off)
            size = header.batch_length + LOG_OVERHEAD
            if header.batch_length < MIN_BATCH_LENGTH or header.magic != MAGIC or pos + size > end:
                raise CorruptRecordError(
                    f"{self.path.name}: malformed or torn batch at position {pos} "
                    f"(batchLength {header.batch_length}, magic {header.magic}, file end {end})"
                )
            if validate:
                if off + size <= len(chunk):
                    validate_batch(chunk, off, header, strict_counts=False)
                else:
                    validate_batch(self.read(pos, size), 0, header, strict_counts=False)
            yield pos, header
            pos += size

    def translate(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset >= ``offset``; None if none."""
        _, start = self.offset_index.lookup(offset)
        for pos, header in self.scan(start, chunk_size=_SHORT_CHUNK):
            if header.base_offset + header.last_offset_delta >= offset:
                return pos, header
        return None

    def position_of_base_at_least(self, offset: int, from_pos: int) -> int:
        """Position of the first batch at or after ``from_pos`` whose base offset >= ``offset``."""
        _, start = self.offset_index.lookup(offset)
        for pos, header in self.scan(max(start, from_pos), chunk_size=_SHORT_CHUNK):
            if header.base_offset >= offset:
                return pos
        return self.size

    def boundary_at_or_below(self, limit: int, from_pos: int) -> int:
        """Largest batch end position <= ``limit``, scanning from batch boundary ``from_pos``.

        Returns ``from_pos`` if even the first batch does not fit.
        """
        _, start = self.offset_index.lookup_position(limit)
        best = first = max(start, from_pos)
        for pos, header in self.scan(first, chunk_size=_SHORT_CHUNK):
            stop = pos + header.batch_length + LOG_OVERHEAD
            if stop > limit:
                break
            best = stop
        return best

    def find_timestamp(self, timestamp: int, start_offset: int = 0) -> TimestampOffset | None:
        """The first record at or above ``start_offset`` whose timestamp is >= ``timestamp``.

        The time index names the batch where the segment's max timestamp first reached each
        value, so every batch before the entry found lies below ``timestamp``; from there the
        batches are scanned by their headers and only a batch whose max timestamp reaches it is
        decoded (a header's max could be reached by none of its records only if a client lied:
        the scan then goes on)."""
        offset = self.time_index.lookup(timestamp)
        _, start = self.offset_index.lookup(max(offset, start_offset))
        for pos, header in self.scan(start, chunk_size=_SHORT_CHUNK):
            if header.max_timestamp >= timestamp and header.last_offset >= start_offset:
                whole = self.read(pos, header.size_bytes)
                found = first_record_at_or_after(whole, header, timestamp, start_offset)
                if found is not None:
                    return found
        return None

    # --- truncation, flush, close -------------------------------------------------------------------

    def truncate_file(self, size: int) -> None:
        """Cut the log file to ``size`` bytes (a batch boundary) and the indexes to match."""
        assert 0 <= size <= self.size
        with self._lock:
            assert not self._closed, f"{self.path} is closed"
            if self._fd is not None:
                os.ftruncate(self._fd, size)
        self.size = size
        self._dirty = True

    def truncate_to(self, offset: int) -> None:
        """Drop every batch whose last offset >= ``offset`` (whole batches).

        Keeps indexes consistent without a full rescan: entries past the cut are dropped and the
        max timestamp is recomputed from the last surviving time-index entry plus a short scan.
        """
        found = self.translate(offset)
        if found is None:
            return
        pos, header = found
        self.truncate_file(pos)
        cut = header.base_offset
        self.offset_index.truncate_to_offset(cut)
        self.time_index.truncate_to_offset(cut)
        self.txn_index.truncate_to(cut)
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        last = self.time_index.last_entry()
        if last is not None:
            self.max_timestamp, self.offset_of_max_timestamp = last
        if self.size == 0:
            self.first_batch_timestamp = -1
        _, start = self.offset_index.lookup(cut)
        self._tail_scan(start)

    def flush(self) -> None:
        """fsync the log file and both indexes."""
        with self._lock:
            if self._fd is not None and self._dirty:
                self._dirty = False
                os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
        self.offset_index.close()
        self.time_index.close()

    def move_log_file(self, target: Path) -> None:
        """Rename the log file to ``target`` (the open descriptor follows the file)."""
        os.rename(self.path, target)
        self.path = target

    def rename_indexes(self, suffix: str) -> None:
        """Rename the index files (offsets, times, aborted transactions) to end in ``suffix``
        instead of the current ``self.suffix`` (the log cleaner's new segment, ``.cleaned`` to
        none; storage/cleaner.py). An index without entries may have no file yet: only its name
        changes."""
        old = self.suffix
        for index in (self.offset_index, self.time_index, self.txn_index):
            name = index.path.name
            target = index.path.with_name(name[: len(name) - len(old)] + suffix)
            try:
                os.rename(index.path, target)
            except FileNotFoundError:
                pass
            index.path = target
        self.suffix = suffix

    def delete(self) -> None:
        """Close and remove its files (the log, its two indexes and its aborted transactions)."""
        self.close()
        self.txn_index.delete()
        for path in (self.path, self.offset_index.path, self.time_index.path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    @property
    def is_dirty(self) -> bool:
        return self._dirty

    @property
    def modified_ms(self) -> int:
        """When the file was last written (its creation if it has none yet)."""
        if self._fd is None:
            return self.created_ms
        return int(os.fstat(self._fd).st_mtime * 1000)

"""Sparse offset and time indexes of a segment, in Kafka's on-disk entry formats.

``.index``: entries of (relative offset int32, file position int32), big-endian, ascending in
both. Sluice writes one entry per batch start whenever ``index.interval.bytes`` have been
written since the previous entry, so an entry's offset is always the base offset of the batch
starting at that position.

``.timeindex``: entries of (timestamp int64, relative offset int32), both strictly ascending in
timestamp: an entry is added only when the segment's max timestamp so far grows. The offset is
that of the batch where the max timestamp was first reached, so every batch before it has a
smaller max timestamp.

Unlike Kafka, files are not preallocated or memory-mapped: entries live in ``array``s in
memory and are appended to the file with ``os.write``. Both are rebuilt from the log whenever
they fail validation. A file is created, and a descriptor held, only from its first entry on: an
index is sparse (an entry per ``index.interval.bytes``), so the many small or empty logs of a
broker with thousands of partitions hold one descriptor each (the log file), not three. A
missing index file reads as an index without entries, which is valid for any segment (lookups
start at the segment's beginning), so it needs no durability of its own.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from bisect import bisect_right
from pathlib import Path
from typing import Final

__all__ = ["IndexCorruptError", "OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY: Final = struct.Struct(">ii")
_TIME_ENTRY: Final = struct.Struct(">qi")


class IndexCorruptError(Exception):
    """An index file does not pass validation; the caller rebuilds it from the log."""


class _IndexFile:
    """An append-only file of fixed-size entries."""

    entry_size: int

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None  # opened at the first write
        self._closed = False
        self._dirty = False
        self._lock = threading.Lock()

    def _open(self) -> int:
        assert not self._closed, f"{self.path} is closed"
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def _raw(self) -> bytes:
        try:
            raw = (
                self.path.read_bytes()
                if self._fd is None
                else os.pread(self._fd, os.fstat(self._fd).st_size, 0)
            )
        except FileNotFoundError:
            return b""  # never written: no entries
        if len(raw) % self.entry_size:
            raise IndexCorruptError(
                f"{self.path.name}: size {len(raw)} is not a multiple of {self.entry_size}"
            )
        return raw

    def _write(self, data: bytes) -> None:
        n = os.write(self._open(), data)
        assert n == len(data), f"short write to {self.path}"
        self._dirty = True

    def _truncate_file(self, entries: int) -> None:
        if self._fd is None and not self.path.exists():
            return  # no file: no entries to cut
        os.ftruncate(self._open(), entries * self.entry_size)
        self._dirty = True

    def flush(self) -> None:
        """fsync the file if entries were written since the last flush."""
        with self._lock:
            if self._fd is not None and self._dirty:
                self._dirty = False
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def rename_deleted(self) -> None:
        """Close and unlink."""
        self.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass


class OffsetIndex(_IndexFile):
    """Sparse map from offset to file position within one segment."""

    entry_size = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path)
        self.base_offset = base_offset
        self.offsets = array("q")  # absolute offsets
        self.positions = array("q")

    def load(self, log_size: int) -> None:
        """Read and validate the file against a log of ``log_size`` bytes."""
        raw = self._raw()
        offsets, positions = array("q"), array("q")
        last_rel, last_pos = -1, -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(raw):
            if rel <= last_rel or pos <= last_pos or rel < 0 or pos >= log_size:
                raise IndexCorruptError(
                    f"{self.path.name}: entry ({rel}, {pos}) after ({last_rel}, {last_pos}) "
                    f"is not ascending or beyond log size {log_size}"
                )
            offsets.append(self.base_offset + rel)
            positions.append(pos)
            last_rel, last_pos = rel, pos
        self.offsets, self.positions = offsets, positions

    def reset(self) -> None:
        """Drop every entry (before a rebuild)."""
        self.offsets, self.positions = array("q"), array("q")
        self._truncate_file(0)

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        assert 0 <= rel <= 2**31 - 1, f"relative offset {rel} out of range"
        assert not self.offsets or (offset > self.offsets[-1] and position > self.positions[-1]), (
            f"index entry ({offset}, {position}) not above last ({self.offsets[-1]}, {self.positions[-1]})"
        )
        self._write(_OFFSET_ENTRY.pack(rel, position))
        self.offsets.append(offset)
        self.positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= ``offset``; (base, 0) if none."""
        i = bisect_right(self.offsets, offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.offsets[i], self.positions[i]

    def lookup_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the last entry with position <= ``position``; (base, 0) if none."""
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return self.base_offset, 0
        return self.offsets[i], self.positions[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        n = bisect_right(self.offsets, offset - 1)
        if n < len(self.offsets):
            del self.offsets[n:]
            del self.positions[n:]
            self._truncate_file(n)

    @property
    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0


class TimeIndex(_IndexFile):
    """Sparse map from timestamp to offset within one segment."""

    entry_size = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path)
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.offsets = array("q")

    def load(self, max_offset: int) -> None:
        """Read and validate; offsets must not exceed ``max_offset`` (the segment's last)."""
        raw = self._raw()
        timestamps, offsets = array("q"), array("q")
        last_ts, last_rel = -(2**63), -1
        for ts, rel in _TIME_ENTRY.iter_unpack(raw):
            if ts <= last_ts or rel < last_rel or rel < 0 or self.base_offset + rel > max_offset:
                raise IndexCorruptError(
                    f"{self.path.name}: entry ({ts}, {rel}) after ({last_ts}, {last_rel}) "
                    f"is not ascending or beyond offset {max_offset}"
                )
            timestamps.append(ts)
            offsets.append(self.base_offset + rel)
            last_ts, last_rel = ts, rel
        self.timestamps, self.offsets = timestamps, offsets

    def reset(self) -> None:
        self.timestamps, self.offsets = array("q"), array("q")
        self._truncate_file(0)

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append (timestamp, offset) if ``timestamp`` is above the last entry's."""
        if self.timestamps and timestamp <= self.timestamps[-1]:
            return
        rel = offset - self.base_offset
        assert 0 <= rel <= 2**31 - 1, f"relative offset {rel} out of range"
        assert not self.offsets or offset >= self.offsets[-1], "time index offsets must not decrease"
        self._write(_TIME_ENTRY.pack(timestamp, rel))
        self.timestamps.append(timestamp)
        self.offsets.append(offset)

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry with timestamp <= ``timestamp``; the base offset if none."""
        i = bisect_right(self.timestamps, timestamp) - 1
        return self.base_offset if i < 0 else self.offsets[i]

    def truncate_to_offset(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        n = bisect_right(self.offsets, offset - 1)
        if n < len(self.offsets):
            del self.timestamps[n:]
            del self.offsets[n:]
            self._truncate_file(n)

    def last_entry(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the last entry."""
        if not self.timestamps:
            return None
        return self.timestamps[-1], self.offsets[-1]

"""The aborted-transaction index of one segment: ``<base>.txnindex``, Kafka's layout.

One entry per transaction aborted by an ABORT marker in the segment, in marker order: the
producer id, the transaction's first offset, its last offset (the marker's) and the log's last
stable offset once the transaction ended (the first offset of the oldest transaction still open
then, or the marker's offset + 1). A read_committed Fetch returns the entries that overlap what
it returns, and the consumer drops that producer's records between the first offset and the
marker (``collect``).

Entry layout (34 bytes, big-endian): version int16 (0), producer id int64, first offset int64,
last offset int64, last stable offset int64. A torn tail (a crash mid-append) is cut at load;
the log rebuilds the entries of every batch it replays (``PartitionLog._load_producer_state``),
so an index can only lose what the replay gives back.

The file is opened only to append, truncate or fsync: aborts are rare, and a replica must not
hold a descriptor per segment for them. Entries are kept in memory once read (a few per
segment).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "ENTRY_SIZE",
    "AbortedTxn",
    "TransactionIndex",
    "collect_aborted",
    "decode_entries",
    "encode_entry",
]

_ENTRY: Final = struct.Struct(">hqqqq")
ENTRY_SIZE: Final = _ENTRY.size
VERSION: Final = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def encode_entry(entry: AbortedTxn) -> bytes:
    return _ENTRY.pack(
        VERSION, entry.producer_id, entry.first_offset, entry.last_offset, entry.last_stable_offset
    )


def decode_entries(data: bytes) -> tuple[list[AbortedTxn], int]:
    """The whole entries of an index file and the length they span (a torn tail is left out).
    Raises ValueError for an entry of an unknown version (the file is not an index)."""
    out: list[AbortedTxn] = []
    whole = len(data) - len(data) % ENTRY_SIZE
    for pos in range(0, whole, ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != VERSION or first > last:
            raise ValueError(f"not an aborted-transaction entry at byte {pos}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out, whole


def collect_aborted(
    entries: list[AbortedTxn], fetch_offset: int, upper_bound: int
) -> tuple[list[AbortedTxn], bool]:
    """Entries overlapping [fetch_offset, upper_bound): ended at or after the fetch offset and
    begun below the bound. The second value says the search may stop here: once an entry's last
    stable offset reaches the bound, every transaction begun below the bound had ended by that
    entry's marker, so no later entry can overlap (Kafka's rule)."""
    found = []
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
            found.append(e)
        if e.last_stable_offset >= upper_bound:
            return found, True
    return found, False


class TransactionIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries: list[AbortedTxn] | None = None
        self._dirty = False

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            self._entries = self._load()
        return self._entries

    def _load(self) -> list[AbortedTxn]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            entries, whole = decode_entries(data)
        except ValueError:
            # Not an index Sluice wrote: rebuilt by the replay only if it covers this segment,
            # so say so loudly rather than answer read_committed fetches without its aborts.
            raise ValueError(f"{self.path} is not an aborted-transaction index") from None
        if whole != len(data):
            os.truncate(self.path, whole)  # a torn entry from a crash mid-append
        return entries

    def append(self, entry: AbortedTxn) -> None:
        entries = self.entries
        assert not entries or entries[-1].last_offset < entry.last_offset, (
            f"{self.path.name}: aborted transaction ending at {entry.last_offset} appended after "
            f"one ending at {entries[-1].last_offset}"
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, encode_entry(entry))
        finally:
            os.close(fd)
        entries.append(entry)
        self._dirty = True

    def write_all(self, entries: list[AbortedTxn]) -> None:
        """Create the file (empty if there are no entries) holding ``entries``, fsynced: the index
        of a segment the log cleaner rewrote (storage/cleaner.py), which must exist even empty,
        since recovery reads its presence."""
        data = b"".join(encode_entry(e) for e in entries)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._entries = list(entries)
        self._dirty = False

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of markers at or after ``offset``."""
        entries = self.entries
        keep = [e for e in entries if e.last_offset < offset]
        if len(keep) == len(entries):
            return
        if self.path.exists():
            os.truncate(self.path, len(keep) * ENTRY_SIZE)
        self._entries = keep
        self._dirty = True

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        return collect_aborted(self.entries, fetch_offset, upper_bound)

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self) -> None:
        self._entries = []
        self._dirty = False
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

"""The leader-epoch cache and its ``leader-epoch-checkpoint`` file (Kafka's text format).

File format::

    0              <- version
    2              <- number of entries
    0 0            <- "epoch start_offset", ascending in both
    3 1200

Semantics follow Kafka's ``LeaderEpochFileCache``: ``assign`` removes entries that would break
monotonicity, ``end_offset_for`` answers OffsetsForLeaderEpoch.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from pathlib import Path
from typing import Final

from sluice.storage.fsutil import atomic_write, fsync_file

__all__ = ["LEADER_EPOCH_CHECKPOINT", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "LeaderEpochCache"]

LEADER_EPOCH_CHECKPOINT: Final = "leader-epoch-checkpoint"
UNDEFINED_EPOCH: Final = -1
UNDEFINED_EPOCH_OFFSET: Final = -1
_VERSION: Final = 0


class LeaderEpochCache:
    """(epoch, start offset) entries, strictly ascending in both, persisted on every change."""

    def __init__(self, directory: Path, *, durable: bool = True, deferred: bool = False) -> None:
        self.path = directory / LEADER_EPOCH_CHECKPOINT
        #: False while the log's directory is new and not durable yet (``make_durable``): a
        #: checkpoint fsynced into a directory that may vanish keeps nothing.
        self.durable = durable
        #: True while the log is new and holds no record (``write_deferred``): entries are kept
        #: in memory only. An entry says where an epoch's records start; with no record on disk
        #: there is nothing for it to describe, and a log found without a checkpoint is an empty
        #: log without epochs, which truncates to nothing and takes its epochs from its leader.
        self.deferred = deferred
        self._entries: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        if self.path.exists():
            self._entries = _parse(self.path.read_text(encoding="ascii"), self.path)

    @property
    def entries(self) -> list[tuple[int, int]]:
        """A copy of the (epoch, start offset) entries."""
        return list(self._entries)

    def latest_epoch(self) -> int:
        return self._entries[-1][0] if self._entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns True if the cache changed.

        No-op if ``epoch`` is already the latest with a start offset <= ``start_offset``.
        Otherwise entries with epoch >= ``epoch`` or start offset >= ``start_offset`` are
        removed first, as in Kafka.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        with self._lock:
            if self._entries:
                last_epoch, last_start = self._entries[-1]
                if epoch == last_epoch and start_offset >= last_start:
                    return False
            self._entries = [(e, s) for e, s in self._entries if e < epoch and s < start_offset]
            self._entries.append((epoch, start_offset))
            self._persist()
            return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's ``endOffsetFor``: (largest known epoch <= requested, start offset of the next
        known epoch, or the log end offset if requested is the latest).

        (-1, -1) if the requested epoch is undefined or above every known epoch. If it is below
        every known epoch: (requested_epoch, start offset of the first known epoch).
        """
        with self._lock:
            entries = self._entries
            if requested_epoch == UNDEFINED_EPOCH or not entries:
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            if entries[-1][0] == requested_epoch:
                return requested_epoch, log_end_offset
            i = bisect_right(entries, (requested_epoch, 2**63))  # first entry with epoch > requested
            if i >= len(entries):
                return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
            higher_start = entries[i][1]
            if i == 0:
                return requested_epoch, higher_start
            return entries[i - 1][0], higher_start

    def truncate_from_end(self, end_offset: int) -> None:
        """Remove entries whose start offset >= ``end_offset`` (after the log was truncated)."""
        with self._lock:
            kept = [(e, s) for e, s in self._entries if s < end_offset]
            if len(kept) != len(self._entries):
                self._entries = kept
                self._persist()

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop entries wholly below ``start_offset``; the last such entry is kept, moved to it."""
        with self._lock:
            below = [(e, s) for e, s in self._entries if s <= start_offset]
            if not below or (len(below) == 1 and below[0][1] == start_offset):
                return
            rest = self._entries[len(below) :]
            self._entries = [(below[-1][0], start_offset), *rest]
            self._persist()

    def clear(self) -> None:
        with self._lock:
            if self._entries or not self.path.exists():
                self._entries = []
                self._persist()

    def write_deferred(self) -> None:
        """Start persisting: write the entries kept in memory so far (before the log's first
        record is written)."""
        with self._lock:
            if self.deferred:
                self.deferred = False
                if self._entries:
                    self._persist()

    def make_durable(self) -> None:
        """From now on every change is fsynced; the checkpoint as it is now is fsynced first
        (under the lock, so that no change can slip between the two)."""
        with self._lock:
            self.durable = True
            if self.path.exists():
                fsync_file(self.path)

    def _persist(self) -> None:
        if self.deferred:
            return
        lines = [str(_VERSION), str(len(self._entries))]
        lines += [f"{e} {s}" for e, s in self._entries]
        atomic_write(self.path, ("\n".join(lines) + "\n").encode("ascii"), durable=self.durable)


def _parse(text: str, path: Path) -> list[tuple[int, int]]:
    lines = text.splitlines()
    try:
        if not lines or int(lines[0]) != _VERSION:
            raise ValueError(f"unsupported version line {lines[:1]!r}")
        count = int(lines[1])
        if count < 0 or len(lines) < 2 + count:
            raise ValueError(f"declares {count} entries but has {len(lines) - 2}")
        entries: list[tuple[int, int]] = []
        for line in lines[2 : 2 + count]:
            epoch_s, offset_s = line.split()
            epoch, offset = int(epoch_s), int(offset_s)
            if entries and (epoch <= entries[-1][0] or offset < entries[-1][1]):
                raise ValueError(f"entry {line!r} is not ascending")
            entries.append((epoch, offset))
    except (ValueError, IndexError) as exc:
        raise ValueError(f"malformed {path}: {exc}") from exc
    return entries

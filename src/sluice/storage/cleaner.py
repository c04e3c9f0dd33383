"""Log compaction's I/O: rewrite the segments below a compacted log's clean point, keeping what
``storage/compaction.py`` decides, and put the result in place so that a crash at any moment
leaves a log that recovers with nothing lost.

One clean of one log, in three steps (``PartitionLog.clean_job`` / ``commit_clean`` /
``finish_swaps`` drive them; the broker's ``LogCleaner`` schedules them):

1. ``run_clean(job)`` (off the broker's event loop: in a cleaner process, see
   broker/log_cleaner.py) reads the segments [log start, clean point) through descriptors of
   its own, checking every batch's CRC (a corrupt batch stops the clean: rewriting it would give
   it a fresh, valid CRC), builds the offset map of the dirty part, and writes each group of
   segments (``compaction.group_segments``) as a new segment ``<base>.log.cleaned`` (with
   ``.index.cleaned``, ``.timeindex.cleaned`` and ``.txnindex.cleaned``, the aborted-transaction
   entries of the group's segments, always written, even empty), fsynced. Batches are rewritten with
   ``protocol/records.py``'s ``rebuild_batch``, or copied as they are when nothing in them
   changes; a group in which nothing changes is not rewritten at all. Its I/O goes through a
   ``Throttler`` (bytes read and written per second).
2. ``PartitionLog.commit_clean`` (on the event loop) checks that every segment the clean read is
   still in the log, unchanged (retention, truncation or a close may have come in between; then
   the clean is dropped and its files deleted), and puts the new segments in their place in
   memory. Reads see the cleaned log from then on. On disk nothing has changed yet: a crash now
   leaves the old segments and ``.cleaned`` files, which recovery deletes.
3. ``PartitionLog.finish_swaps`` (on a thread) makes it durable, per group, Kafka's way:
   rename ``<base>.log.cleaned`` to ``<base>.log.swap`` and fsync the directory (**the commit
   point**); delete the replaced segments' files (every index, and every log file but
   ``<base>.log``) and fsync the directory; rename the new indexes to their names, then
   ``<base>.log.swap`` over ``<base>.log``. Then the cleaner checkpoint records the clean point.

Recovery (``recover_swaps``, first thing ``PartitionLog.open`` does): ``.cleaned`` files are
deleted (their clean never reached its commit point: the old segments are all there); a
``<base>.log.swap`` means the commit point was passed: every segment whose base offset lies in
the swap's offsets [base, its next offset) is deleted with its indexes, and the swap becomes
``<base>.log`` (its offset and time indexes are rebuilt). The aborted-transaction index cannot be
rebuilt from the segment alone (an entry names where its transaction began), so the swap's
``<base>.txnindex.cleaned`` is kept: if it is there it was not renamed yet, and it replaces the
base segment's index; if not, the index in place is already the new one (the indexes are renamed
before the log). **Why nothing is lost**: before the commit point every
old file exists; after it the swap holds every record the old segments of its group kept (and
recovery deletes only segments inside the swap's offsets, all of which belong to its group). An
old segment of the group past the swap's last offset (its records were all removed) may survive a
crash in step 3: it is then an uncleaned segment, in offset order, holding only records that are
superseded later in the log or tombstones, so reading the log still gives every key its last
value, and the next clean removes it.

The cleaner checkpoint (``cleaner-checkpoint``, text ``first_dirty earliest_delete_horizon``)
is written after the swaps; a crash before it only makes the next clean read more as dirty.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from sluice.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    BatchHeader,
    CorruptRecordError,
    decode_records,
    parse_header,
    rebuild_batch,
    validate_batch,
)
from sluice.storage.compaction import (
    AbortedRanges,
    BatchFacts,
    OffsetMap,
    RecordFacts,
    batch_outcome,
    group_segments,
)
from sluice.storage.fsutil import atomic_write, fsync_dir, pread_exact
from sluice.storage.segment import LogSegment, segment_file_name
from sluice.storage.txn_index import AbortedTxn

__all__ = [
    "CHECKPOINT_FILE",
    "CLEANED_SUFFIX",
    "SWAP_SUFFIX",
    "CleanJob",
    "CleanResult",
    "CleanedGroup",
    "CleanerStopped",
    "SourceSegment",
    "StopFlag",
    "Throttler",
    "read_checkpoint",
    "recover_swaps",
    "run_clean",
    "write_checkpoint",
]

log = logging.getLogger("sluice.cleaner")

CLEANED_SUFFIX: Final = ".cleaned"
SWAP_SUFFIX: Final = ".swap"
CHECKPOINT_FILE: Final = "cleaner-checkpoint"
#: Bytes read from a segment file at a time, and written to a new segment at a time.
CHUNK_BYTES: Final = 1 << 20


class StopFlag(Protocol):
    """A ``threading.Event`` or a ``multiprocessing`` one (a cleaner process's)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class CleanerStopped(Exception):
    """The cleaner is stopping (the broker shuts down): the clean in progress is dropped."""


class Throttler:
    """Holds the cleaner's I/O to ``bytes_per_s`` (Kafka's ``log.cleaner.io.max.bytes.per.second``),
    counting bytes read and written, by sleeping whenever it is ahead; checks ``stop`` while
    sleeping. A rate of 0 or less: unbounded."""

    #: Over this long the rate is measured, then measuring starts again (Kafka's is 300 ms).
    WINDOW_S: Final = 0.3

    def __init__(self, bytes_per_s: float, stop: StopFlag | None = None) -> None:
        self.bytes_per_s = bytes_per_s
        self.stop = stop
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._bytes = 0
        self.slept_s = 0.0

    def take(self, n: int) -> None:
        if self.stop is not None and self.stop.is_set():
            raise CleanerStopped
        if self.bytes_per_s <= 0:
            return
        with self._lock:
            self._bytes += n
            elapsed = time.monotonic() - self._start
            wait = self._bytes / self.bytes_per_s - elapsed
            if wait <= 0 and elapsed > self.WINDOW_S:
                self._start, self._bytes = time.monotonic(), 0
        if wait > 0:
            self.slept_s += wait
            if self.stop is not None:
                if self.stop.wait(wait):
                    raise CleanerStopped
            else:
                time.sleep(wait)


@dataclass(frozen=True, slots=True)
class SourceSegment:
    """A segment a clean reads, as it was when the clean was planned."""

    base_offset: int
    next_offset: int
    size: int
    #: its aborted-transaction index entries (a rewritten group's index holds its segments')
    aborted: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class CleanJob:
    """Everything a clean needs, as plain data (it crosses to the cleaner process)."""

    directory: Path
    #: the segments [log start, clean point), in order
    sources: tuple[SourceSegment, ...]
    first_dirty: int
    end: int
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    index_interval_bytes: int
    #: producer id -> last offset of its last batch (R5)
    producer_last_offsets: Mapping[int, int]
    #: bound of the offset map (``log.cleaner.dedupe.buffer.size`` / the entry size)
    map_entries_max: int
    #: names this plan (``PartitionLog.commit_clean`` commits only the clean it planned last)
    token: str
    #: every aborted transaction of the log that began below ``end`` (R7)
    aborted: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """Segments [``first``, ``last``] of the job's sources, rewritten as one at ``base_offset``
    (``.cleaned`` files of ``size`` bytes)."""

    first: int
    last: int
    base_offset: int
    size: int


@dataclass(frozen=True, slots=True)
class CleanResult:
    job: CleanJob
    #: the clean point actually reached (the map may have held only part of the dirty part)
    end: int
    groups: tuple[CleanedGroup, ...]
    #: the earliest delete horizon of a batch left below ``end`` (-1: none)
    earliest_horizon_ms: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_kept: int
    map_entries: int
    throttled_s: float = 0.0
    took_s: float = field(default=0.0, compare=False)

    @property
    def bytes_removed(self) -> int:
        """What the rewritten groups gave back on disk."""
        sources = self.job.sources
        return sum(sum(s.size for s in sources[g.first : g.last + 1]) - g.size for g in self.groups)


def read_checkpoint(directory: Path) -> tuple[int, int]:
    """(first dirty offset, earliest delete horizon) of the last clean; (0, -1) if none."""
    try:
        first_dirty, horizon = (directory / CHECKPOINT_FILE).read_text(encoding="ascii").split()
        return int(first_dirty), int(horizon)
    except (OSError, ValueError):
        return 0, -1


def write_checkpoint(directory: Path, first_dirty: int, earliest_horizon_ms: int) -> None:
    atomic_write(
        directory / CHECKPOINT_FILE, f"{first_dirty} {earliest_horizon_ms}\n".encode("ascii"), durable=False
    )


# --- reading source segments --------------------------------------------------------------------


def _read_batches(
    directory: Path, source: SourceSegment, throttler: Throttler
) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every batch of a source segment, CRC checked, read through a descriptor of its own (the
    broker may delete or replace the file meanwhile: then the clean fails here or at commit)."""
    path = directory / segment_file_name(source.base_offset, ".log")
    fd = os.open(path, os.O_RDONLY)
    try:
        pos = 0
        while pos < source.size:
            chunk = pread_exact(fd, min(CHUNK_BYTES, source.size - pos), pos)
            throttler.take(len(chunk))
            off = 0
            while off + HEADER_SIZE <= len(chunk):
                header = parse_header(chunk, off)
                size = header.batch_length + LOG_OVERHEAD
                if header.batch_length < MIN_BATCH_LENGTH or header.magic != MAGIC:
                    raise CorruptRecordError(f"{path.name}: malformed batch at position {pos + off}")
                if off + size > len(chunk):
                    if off == 0:  # one batch larger than a chunk: read it whole
                        chunk = pread_exact(fd, size, pos)
                        throttler.take(size)
                        if len(chunk) < size:
                            raise CorruptRecordError(f"{path.name}: torn batch at position {pos}")
                    else:
                        break
                validate_batch(chunk, off, header, strict_counts=False)
                yield header, chunk[off : off + size]
                off += size
            if off == 0:
                raise CorruptRecordError(f"{path.name}: truncated batch at position {pos}")
            pos += off
    finally:
        os.close(fd)


def _aborted(header: BatchHeader, aborted: AbortedRanges) -> bool:
    return (
        header.is_transactional
        and not header.is_control
        and aborted.covers(header.producer_id, header.base_offset)
    )


def _facts(header: BatchHeader, data: bytes, keep_if_empty: bool, aborted: bool) -> BatchFacts:
    records = tuple(RecordFacts(r.offset, r.key, r.value is None) for r in decode_records(data, 0, header))
    return BatchFacts(
        header.base_offset,
        header.last_offset,
        records,
        header.delete_horizon_ms,
        header.is_control,
        keep_if_empty,
        aborted,
    )


# --- one clean ------------------------------------------------------------------------------------


def run_clean(job: CleanJob, throttler: Throttler) -> CleanResult | None:
    """Step 1 (module docstring): write the ``.cleaned`` segments of ``job``. None when there is
    nothing to do (the map could not hold a single dirty segment, or nothing would change).
    Raises CleanerStopped, CorruptRecordError or OSError (the caller deletes what was written
    through ``discard``)."""
    started = time.monotonic()
    sources = job.sources
    if not sources:
        return None
    stats = {"read": 0, "written": 0, "records": 0, "kept": 0}
    aborted = AbortedRanges((e.producer_id, e.first_offset, e.last_offset) for e in job.aborted)

    # The offset map, segment by segment over the dirty part; the clean point moves back to
    # the first segment that does not fit.
    omap = OffsetMap(job.map_entries_max)
    end_index = len(sources)
    for i, src in enumerate(sources):
        if src.next_offset <= job.first_dirty:
            continue
        pairs: list[tuple[bytes | None, int]] = []
        for header, data in _read_batches(job.directory, src, throttler):
            stats["read"] += len(data)
            if header.is_control or _aborted(header, aborted):
                continue  # R4, R7
            pairs.extend((r.key, r.offset) for r in decode_records(data, 0, header))
        if not omap.add_segment(pairs):
            end_index = i
            break
    if end_index < len(sources) and sources[end_index].base_offset <= job.first_dirty:
        # Not one dirty segment fits: only the clean part is cleaned (its expired tombstones).
        log.warning(
            "event=cleaner_map_full dir=%s entries_max=%d action='raise log.cleaner.dedupe.buffer.size'",
            job.directory.name,
            job.map_entries_max,
        )
    if end_index == 0:
        return None
    end = sources[end_index].base_offset if end_index < len(sources) else job.end
    cleaned = sources[:end_index]

    groups: list[CleanedGroup] = []
    earliest_horizon = -1
    for group in group_segments([(s.base_offset, s.next_offset, s.size) for s in cleaned], job.segment_bytes):
        out, horizon = _clean_group(job, [cleaned[i] for i in group], omap, aborted, throttler, stats)
        if horizon >= 0:
            earliest_horizon = horizon if earliest_horizon < 0 else min(earliest_horizon, horizon)
        if out is not None:
            groups.append(CleanedGroup(group.start, group.stop - 1, cleaned[group.start].base_offset, out))
    return CleanResult(
        job,
        end,
        tuple(groups),
        earliest_horizon,
        stats["read"],
        stats["written"],
        stats["records"],
        stats["kept"],
        len(omap),
        throttler.slept_s,
        time.monotonic() - started,
    )


def _clean_group(
    job: CleanJob,
    group: list[SourceSegment],
    omap: OffsetMap,
    aborted: AbortedRanges,
    throttler: Throttler,
    stats: dict[str, int],
) -> tuple[int | None, int]:
    """Write one group's ``.cleaned`` segment; (its size, or None when nothing in the group
    changes, so it stays as it is; the earliest delete horizon left in it, -1 if none)."""
    base = group[0].base_offset
    directory = job.directory
    discard(directory, [base])  # what an earlier clean stopped by a crash left
    writer = _SegmentWriter(job, base, throttler, stats)
    # A group of one segment is rewritten only from its first change on: until then its batches
    # are only counted (``unchanged_bytes``), and copied from the file at the first change.
    changed = len(group) > 1
    unchanged_bytes = 0
    horizon_min = -1
    try:
        for src in group:
            for header, data in _read_batches(directory, src, throttler):
                stats["read"] += len(data)
                last_of_producer = job.producer_last_offsets.get(header.producer_id) == header.last_offset
                facts = _facts(
                    header, data, header.producer_id >= 0 and last_of_producer, _aborted(header, aborted)
                )
                stats["records"] += len(facts.records)
                outcome = batch_outcome(
                    facts, omap.latest, now_ms=job.now_ms, delete_retention_ms=job.delete_retention_ms
                )
                if outcome.keep:
                    stats["kept"] += len(outcome.retained)
                if outcome.delete_horizon_ms >= 0:
                    h = outcome.delete_horizon_ms
                    horizon_min = h if horizon_min < 0 else min(horizon_min, h)
                if not changed:
                    if outcome.keep and outcome.unchanged:
                        unchanged_bytes += len(data)
                        continue
                    changed = True
                    writer.copy_from(src, unchanged_bytes)
                if not outcome.keep:
                    continue
                if outcome.unchanged:
                    writer.add(data)
                else:
                    wanted = set(outcome.retained)
                    kept = [r for r in decode_records(data, 0, header) if r.offset in wanted]
                    writer.add(rebuild_batch(header, kept, delete_horizon_ms=outcome.delete_horizon_ms))
        if not changed:
            return None, horizon_min
        return writer.finish([e for src in group for e in src.aborted]), horizon_min
    finally:
        writer.close()


class _SegmentWriter:
    """A new ``<base>.log.cleaned`` segment (created at the first write, or empty at ``finish``),
    written in chunks through the throttler."""

    def __init__(self, job: CleanJob, base: int, throttler: Throttler, stats: dict[str, int]) -> None:
        self.job, self.base, self.throttler, self.stats = job, base, throttler, stats
        self.segment: LogSegment | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0

    def _open(self) -> LogSegment:
        if self.segment is None:
            self.segment = LogSegment(
                self.job.directory,
                self.base,
                index_interval_bytes=self.job.index_interval_bytes,
                created_ms=self.job.now_ms,
                suffix=CLEANED_SUFFIX,
            )
        return self.segment

    def add(self, data: bytes) -> None:
        self.pending.append(data)
        self.pending_bytes += len(data)
        if self.pending_bytes >= CHUNK_BYTES:
            self.flush_pending()

    def flush_pending(self) -> None:
        if not self.pending:
            return
        buf = b"".join(self.pending)
        batches: list[tuple[int, BatchHeader]] = []
        pos = 0
        for data in self.pending:
            batches.append((pos, parse_header(data, 0)))
            pos += len(data)
        self._open().append(buf, batches)
        self.throttler.take(len(buf))
        self.stats["written"] += len(buf)
        self.pending.clear()
        self.pending_bytes = 0

    def copy_from(self, src: SourceSegment, nbytes: int) -> None:
        """Copy the first ``nbytes`` of ``src`` (whole batches, read again from its file)."""
        if nbytes == 0:
            return
        copied = 0
        for _header, data in _read_batches(self.job.directory, src, self.throttler):
            if copied >= nbytes:
                break
            self.stats["read"] += len(data)
            self.add(data)
            copied += len(data)
        assert copied == nbytes, f"copied {copied} of {nbytes} unchanged bytes of segment {src.base_offset}"

    def finish(self, aborted: list[AbortedTxn]) -> int:
        """Write what is pending and the aborted-transaction index (``aborted``: the group's
        segments' entries; their markers are all kept, R4), fsync; the segment's size."""
        self.flush_pending()
        segment = self._open()
        segment.on_roll()
        segment.flush()
        segment.txn_index.write_all(aborted)
        return segment.size

    def close(self) -> None:
        if self.segment is not None:
            self.segment.close()


def discard(directory: Path, bases: list[int]) -> None:
    """Delete the ``.cleaned`` files of a clean that will not be committed."""
    for base in bases:
        for suffix in (".log", ".index", ".timeindex", ".txnindex"):
            try:
                (directory / (segment_file_name(base, suffix) + CLEANED_SUFFIX)).unlink()
            except FileNotFoundError:
                pass


# --- recovery ---------------------------------------------------------------------------------------


def _swap_next_offset(path: Path, base: int) -> int:
    """The offset after the last whole batch of a swap file (its base when it holds none)."""
    next_offset = base
    with path.open("rb") as f:
        data = f.read()
    pos = 0
    while pos + HEADER_SIZE <= len(data):
        header = parse_header(data, pos)
        size = header.batch_length + LOG_OVERHEAD
        if header.batch_length < MIN_BATCH_LENGTH or pos + size > len(data):
            break
        next_offset = header.next_offset
        pos += size
    return next_offset


def _swap_base(swap: Path) -> int:
    stem = swap.name[: -len(".log" + SWAP_SUFFIX)]
    return int(stem) if len(stem) == 20 and stem.isdigit() else -1


def recover_swaps(directory: Path) -> set[int]:
    """Finish or undo what a crash left of a clean (module docstring, "Recovery"); returns the
    base offsets of the segments that were swapped in, whose indexes must be rebuilt."""
    swaps = sorted(directory.glob("*.log" + SWAP_SUFFIX))
    # A swap's aborted-transaction index is kept: unlike the other indexes it cannot be rebuilt
    # from the segment alone (its entries name where each transaction began).
    keep = {
        directory / (segment_file_name(base, ".txnindex") + CLEANED_SUFFIX)
        for base in map(_swap_base, swaps)
        if base >= 0
    }
    for p in directory.glob("*" + CLEANED_SUFFIX):
        if p not in keep:
            p.unlink()
    swapped: set[int] = set()
    for swap in swaps:
        stem = swap.name[: -len(".log" + SWAP_SUFFIX)]
        if len(stem) != 20 or not stem.isdigit():
            continue
        base = int(stem)
        end = _swap_next_offset(swap, base)
        for p in directory.glob("*.log"):
            if p.stem.isdigit() and len(p.stem) == 20 and base < int(p.stem) < end:
                p.unlink()
        for p in [*directory.glob("*.index"), *directory.glob("*.timeindex"), *directory.glob("*.txnindex")]:
            if p.stem.isdigit() and len(p.stem) == 20 and base < int(p.stem) < end:
                p.unlink()
        for suffix in (".index", ".timeindex"):
            try:
                (directory / segment_file_name(base, suffix)).unlink()
            except FileNotFoundError:
                pass
        new_txn = directory / (segment_file_name(base, ".txnindex") + CLEANED_SUFFIX)
        if new_txn.exists():
            # Not renamed yet (the rename comes before the log's): the old index of the base
            # segment is replaced. Renamed already: the file in place is the new one.
            os.replace(new_txn, directory / segment_file_name(base, ".txnindex"))
        fsync_dir(directory)
        os.replace(swap, directory / segment_file_name(base, ".log"))
        swapped.add(base)
        log.info("event=clean_swap_completed dir=%s base=%d end=%d", directory.name, base, end)
    if swaps:
        fsync_dir(directory)
    return swapped

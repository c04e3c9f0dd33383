"""Log compaction's rules, as pure functions over plain data (no files).

What the cleaner (storage/cleaner.py, the I/O) does with one compacted log, decided here:

- **Where it may clean** (``cleanable_range``): from the log start up to the *clean point*, a
  segment boundary below which everything is old enough and settled: never the active segment,
  never a segment reaching the stable end (the high watermark: records not yet committed may still
  be truncated; transactions will lower it to the last stable offset), never a segment holding a
  record younger than ``min.compaction.lag.ms`` (by the segment's largest timestamp, as Kafka).
  The *dirty* part is what lies between the last clean's point (``first_dirty``) and this one.
- **When** (``clean_due``): the dirty part is more than ``min.cleanable.dirty.ratio`` of the
  cleanable bytes, or its oldest record is older than ``max.compaction.lag.ms``.
- **What survives** (``OffsetMap``, ``batch_outcome``), batch by batch below the clean point:

  R1 a record without a key does not (a compacted log refuses them on produce; ones written
     before the topic was compacted are dropped, as Kafka's cleaner does);
  R2 a record survives only if no newer record of its key lies in the dirty part (the offset map
     holds each dirty key's newest offset; the clean part already holds one record per key);
  R3 a tombstone (null value) that survives R2 is kept until its batch's delete horizon: the first
     clean that keeps it sets the horizon to now + ``delete.retention.ms`` (KIP-534, stored in
     the batch); a clean at or after the horizon removes it;
  R4 a control batch (a transaction marker) is kept whole: a replica rebuilding its producer
     state from the cleaned log must still see every transaction end and every epoch a marker
     carries, and a read_committed reader must still meet each ABORT marker (Kafka removes a
     marker once no record of its transaction is left and ``delete.retention.ms`` has passed;
     Sluice keeps them, a few dozen bytes per transaction);
  R7 a record of an aborted transaction (a transactional batch of a producer inside one of the
     log's aborted-transaction index entries, ``AbortedRanges``) does not survive and is never in
     the offset map, so a key's committed value is never removed for an aborted newer one;
     transactions still open never reach the cleaner (the clean point is below the last stable
     offset, ``PartitionLog.cleanable``);
  R5 a batch none of whose records survives is removed, unless it is the last batch of its
     producer, which is kept empty (its offsets and sequences intact) so that the producer state
     rebuilt from the log, a new follower's or a recovery's, still knows the producer (I7);
  R6 nothing at or above the clean point is touched, and every kept record keeps its offset.

- **How the rewritten segments are grouped** (``group_segments``): consecutive segments whose
  sizes add up to at most ``segment.bytes`` (and whose offsets fit a segment) become one.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "AbortedRanges",
    "BatchFacts",
    "BatchOutcome",
    "CleanableRange",
    "OffsetMap",
    "RecordFacts",
    "SegmentFacts",
    "batch_outcome",
    "clean_due",
    "cleanable_range",
    "group_segments",
]

LONG_MAX: Final = 2**63 - 1
_INT32_MAX: Final = 2**31 - 1
#: What one offset-map entry is counted as: a Python dict entry with a bytes key and an int, for
#: ``log.cleaner.dedupe.buffer.size`` (Kafka counts 24 bytes: an MD5 and a long).
MAP_ENTRY_OVERHEAD_BYTES: Final = 120


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """One segment as the rules see it."""

    base_offset: int
    next_offset: int
    size_bytes: int
    #: the first batch's max timestamp (-1: empty)
    first_batch_timestamp: int
    #: the largest timestamp in the segment (-1: empty)
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class CleanableRange:
    """Segments [0, ``end_index``) of a log may be cleaned: offsets [log start, ``end``), of which
    [``first_dirty``, ``end``) were written since the last clean."""

    first_dirty: int
    end: int
    end_index: int
    clean_bytes: int
    dirty_bytes: int
    #: the first dirty segment's first batch timestamp (-1: no dirty segment)
    first_dirty_timestamp: int

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_range(
    segments: Sequence[SegmentFacts],
    *,
    first_dirty: int,
    stable_end: int,
    now_ms: int,
    min_compaction_lag_ms: int,
) -> CleanableRange:
    """Where a clean may act (the module's "where"). ``segments`` in order, the active one last;
    ``first_dirty``: where the last clean stopped (the log start when it never ran);
    ``stable_end``: no segment reaching it is cleaned (the high watermark)."""
    assert segments, "a log has at least its active segment"
    end_index = 0
    for i, seg in enumerate(segments[:-1]):
        if seg.next_offset > stable_end:
            break
        if min_compaction_lag_ms > 0 and seg.max_timestamp > now_ms - min_compaction_lag_ms:
            break
        end_index = i + 1
    end = segments[end_index].base_offset
    start = segments[0].base_offset
    first_dirty = min(max(first_dirty, start), end)
    clean_bytes = dirty_bytes = 0
    first_dirty_ts = -1
    for seg in segments[:end_index]:
        if seg.next_offset > first_dirty:
            if first_dirty_ts < 0:
                first_dirty_ts = seg.first_batch_timestamp
            dirty_bytes += seg.size_bytes
        else:
            clean_bytes += seg.size_bytes
    return CleanableRange(first_dirty, end, end_index, clean_bytes, dirty_bytes, first_dirty_ts)


def clean_due(
    cleanable: CleanableRange, *, min_cleanable_dirty_ratio: float, max_compaction_lag_ms: int, now_ms: int
) -> bool:
    """Whether to clean now (the module's "when"): something is dirty, and it is either more
    than the ratio of the cleanable bytes or older than the max lag (by its first timestamp)."""
    if cleanable.dirty_bytes == 0:
        return False
    if cleanable.dirty_ratio > min_cleanable_dirty_ratio:
        return True
    ts = cleanable.first_dirty_timestamp
    return max_compaction_lag_ms < LONG_MAX and ts >= 0 and now_ms - ts > max_compaction_lag_ms


class OffsetMap:
    """Each key's newest offset in the dirty part (R2), bounded: ``add_segment`` refuses a segment
    whose new keys would pass ``entries_max``, leaving the map as it was, so that the map always
    covers whole segments."""

    def __init__(self, entries_max: int) -> None:
        assert entries_max > 0
        self.entries_max = entries_max
        self.latest: dict[bytes, int] = {}

    def add_segment(self, records: Iterable[tuple[bytes | None, int]]) -> bool:
        """Take one segment's (key, offset) pairs, in offset order; False (and nothing taken) if
        its new keys do not fit."""
        seen: dict[bytes, int] = {}
        for key, offset in records:
            if key is not None:
                seen[key] = offset
        new_keys = sum(1 for k in seen if k not in self.latest)
        if len(self.latest) + new_keys > self.entries_max:
            return False
        self.latest.update(seen)
        return True

    def __len__(self) -> int:
        return len(self.latest)


class AbortedRanges:
    """The log's aborted transactions as offset ranges per producer (R7): a transactional batch
    of producer P at offset O is aborted if some entry of P has first offset <= O <= its marker's
    offset (a producer has one transaction open at a time, so its ranges do not overlap)."""

    def __init__(self, entries: Iterable[tuple[int, int, int]]) -> None:
        """``entries``: (producer id, first offset, marker offset) of each aborted transaction."""
        self._ranges: dict[int, list[tuple[int, int]]] = {}
        for pid, first, last in entries:
            self._ranges.setdefault(pid, []).append((first, last))
        for ranges in self._ranges.values():
            ranges.sort()

    def covers(self, producer_id: int, offset: int) -> bool:
        ranges = self._ranges.get(producer_id)
        if not ranges:
            return False
        i = bisect_right(ranges, (offset, LONG_MAX)) - 1
        return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]


@dataclass(frozen=True, slots=True)
class RecordFacts:
    offset: int
    key: bytes | None
    tombstone: bool


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """One batch below the clean point."""

    base_offset: int
    last_offset: int
    records: tuple[RecordFacts, ...]
    #: the batch's delete horizon (KIP-534), -1 when it has none
    delete_horizon_ms: int = -1
    is_control: bool = False
    #: the last batch of its producer (R5): kept, empty if need be
    keep_if_empty: bool = False
    #: a transactional batch of an aborted transaction (R7)
    aborted: bool = False


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What becomes of one batch: ``keep`` it holding the records at ``retained`` with
    ``delete_horizon_ms`` (-1: none), or drop it. ``unchanged``: it can be copied as it is."""

    keep: bool
    retained: tuple[int, ...]
    delete_horizon_ms: int
    unchanged: bool


def batch_outcome(
    batch: BatchFacts, latest: Mapping[bytes, int], *, now_ms: int, delete_retention_ms: int
) -> BatchOutcome:
    """R1-R5 and R7 for one batch. ``latest``: the offset map (each dirty key's newest offset)."""
    if batch.is_control:
        offsets = tuple(r.offset for r in batch.records)
        return BatchOutcome(True, offsets, batch.delete_horizon_ms, True)  # R4
    if batch.aborted:
        unchanged = not batch.records and batch.delete_horizon_ms < 0
        return BatchOutcome(batch.keep_if_empty, (), -1, unchanged)  # R7 (R5: kept empty)
    horizon = batch.delete_horizon_ms
    expired = 0 <= horizon <= now_ms
    kept: list[int] = []
    tombstones = False
    for r in batch.records:
        if r.key is None:
            continue  # R1
        newest = latest.get(r.key)
        if newest is not None and r.offset < newest:
            continue  # R2
        if r.tombstone:
            if expired:
                continue  # R3: its horizon has passed
            tombstones = True
        kept.append(r.offset)
    if tombstones:
        new_horizon = horizon if horizon >= 0 else min(LONG_MAX, now_ms + delete_retention_ms)
    else:
        new_horizon = -1
    unchanged = len(kept) == len(batch.records) and new_horizon == horizon
    return BatchOutcome(bool(kept) or batch.keep_if_empty, tuple(kept), new_horizon, unchanged)


def group_segments(sizes: Sequence[tuple[int, int, int]], max_bytes: int) -> list[range]:
    """Consecutive segments (base offset, next offset, size) that become one segment when
    rewritten: their sizes add up to at most ``max_bytes`` and their offsets fit a segment
    (int32 relative offsets). Every segment is in exactly one group; a group holds one or more."""
    groups: list[range] = []
    i = 0
    while i < len(sizes):
        base, _next, total = sizes[i]
        j = i + 1
        while j < len(sizes):
            _b, nxt, size = sizes[j]
            if total + size > max_bytes or nxt - 1 - base > _INT32_MAX:
                break
            total += size
            j += 1
        groups.append(range(i, j))
        i = j
    return groups

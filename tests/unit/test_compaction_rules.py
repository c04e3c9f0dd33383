"""Log compaction's rules (storage/compaction.py): one test per rule, and a hypothesis property
of whole cleans against a model of what a compacted log must read as."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.storage.compaction import (
    LONG_MAX,
    BatchFacts,
    OffsetMap,
    RecordFacts,
    SegmentFacts,
    batch_outcome,
    clean_due,
    cleanable_range,
    group_segments,
)
from tests.unit._compaction_model import check_compacted

NOW = 1_000_000
RETENTION = 500


def _batch(*records: tuple[int, bytes | None, bool], horizon: int = -1, **kw: bool) -> BatchFacts:
    recs = tuple(RecordFacts(o, k, t) for o, k, t in records)
    return BatchFacts(recs[0].offset, recs[-1].offset, recs, horizon, **kw)


def _outcome(
    batch: BatchFacts, latest: dict[bytes, int], now: int = NOW
) -> tuple[bool, tuple[int, ...], int]:
    o = batch_outcome(batch, latest, now_ms=now, delete_retention_ms=RETENTION)
    return o.keep, o.retained, o.delete_horizon_ms


# --- where and when ------------------------------------------------------------------------------


def _seg(base: int, nxt: int, size: int = 100, first_ts: int = 0, max_ts: int = 0) -> SegmentFacts:
    return SegmentFacts(base, nxt, size, first_ts, max_ts)


SEGMENTS = [_seg(0, 10), _seg(10, 20), _seg(20, 30), _seg(30, 35)]  # the last one is active


def test_the_active_segment_is_never_cleanable() -> None:
    rng = cleanable_range(SEGMENTS, first_dirty=0, stable_end=35, now_ms=NOW, min_compaction_lag_ms=0)
    assert (rng.end, rng.end_index) == (30, 3)


def test_nothing_reaching_the_stable_end_is_cleanable() -> None:
    """The high watermark: a segment with a record not yet committed stays as it is."""
    rng = cleanable_range(SEGMENTS, first_dirty=0, stable_end=19, now_ms=NOW, min_compaction_lag_ms=0)
    assert (rng.end, rng.end_index) == (10, 1)


def test_records_younger_than_min_compaction_lag_are_not_cleanable() -> None:
    segs = [_seg(0, 10, max_ts=NOW - 1000), _seg(10, 20, max_ts=NOW - 100), _seg(20, 30, max_ts=NOW)]
    rng = cleanable_range(segs, first_dirty=0, stable_end=30, now_ms=NOW, min_compaction_lag_ms=500)
    assert rng.end == 10


def test_dirty_ratio_counts_the_bytes_since_the_last_clean() -> None:
    segs = [_seg(0, 10, 300), _seg(10, 20, 100), _seg(20, 30, 100), _seg(30, 31)]
    rng = cleanable_range(segs, first_dirty=10, stable_end=31, now_ms=NOW, min_compaction_lag_ms=0)
    assert (rng.clean_bytes, rng.dirty_bytes, rng.first_dirty) == (300, 200, 10)
    assert rng.dirty_ratio == 0.4
    assert not clean_due(rng, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=LONG_MAX, now_ms=NOW)
    assert clean_due(rng, min_cleanable_dirty_ratio=0.3, max_compaction_lag_ms=LONG_MAX, now_ms=NOW)


def test_max_compaction_lag_makes_a_clean_due_whatever_the_ratio() -> None:
    segs = [_seg(0, 10, 900), _seg(10, 20, 100, first_ts=NOW - 5000), _seg(20, 21)]
    rng = cleanable_range(segs, first_dirty=10, stable_end=21, now_ms=NOW, min_compaction_lag_ms=0)
    assert not clean_due(rng, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=10_000, now_ms=NOW)
    assert clean_due(rng, min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=4_000, now_ms=NOW)


def test_nothing_dirty_is_never_due() -> None:
    segs = [_seg(0, 10, 900), _seg(10, 11)]
    rng = cleanable_range(segs, first_dirty=10, stable_end=11, now_ms=NOW, min_compaction_lag_ms=0)
    assert rng.dirty_bytes == 0
    assert not clean_due(rng, min_cleanable_dirty_ratio=0.0, max_compaction_lag_ms=1, now_ms=NOW)


def test_segments_are_grouped_up_to_segment_bytes() -> None:
    sizes = [(0, 10, 40), (10, 20, 40), (20, 30, 40), (30, 40, 200), (40, 50, 10)]
    assert group_segments(sizes, 100) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert group_segments(sizes, 1000) == [range(0, 5)]
    # Offsets must fit a segment's int32 relative offsets.
    assert group_segments([(0, 10, 1), (2**31 + 5, 2**31 + 6, 1)], 1000) == [range(0, 1), range(1, 2)]


# --- what survives -------------------------------------------------------------------------------


def test_r1_a_record_without_a_key_does_not_survive() -> None:
    assert _outcome(_batch((0, None, False), (1, b"a", False)), {}) == (True, (1,), -1)


def test_r2_a_record_superseded_in_the_dirty_part_does_not_survive() -> None:
    batch = _batch((0, b"a", False), (1, b"b", False), (2, b"a", False))
    assert _outcome(batch, {b"a": 2, b"b": 1}) == (True, (1, 2), -1)
    # b is not in the map: its newest record lies in the clean part, and is this one.
    assert _outcome(batch, {b"a": 7}) == (True, (1,), -1)


def test_r3_a_tombstone_is_kept_until_its_delete_horizon() -> None:
    fresh = _batch((5, b"a", True))
    assert _outcome(fresh, {b"a": 5}) == (True, (5,), NOW + RETENTION), "the first clean sets the horizon"
    horizoned = _batch((5, b"a", True), horizon=NOW + RETENTION)
    assert _outcome(horizoned, {}, now=NOW + RETENTION - 1) == (True, (5,), NOW + RETENTION)
    assert _outcome(horizoned, {}, now=NOW + RETENTION) == (False, (), -1), "removed at its horizon"
    # A value in a batch with a passed horizon is kept; the horizon goes with the tombstones.
    mixed = _batch((5, b"a", True), (6, b"b", False), horizon=NOW)
    assert _outcome(mixed, {}) == (True, (6,), -1)


def test_r4_a_control_batch_is_kept_whole() -> None:
    marker = _batch((9, b"\x00\x00\x00\x00", False), is_control=True)
    assert _outcome(marker, {b"\x00\x00\x00\x00": 50}) == (True, (9,), -1)


def test_r5_the_last_batch_of_a_producer_is_kept_empty() -> None:
    batch = _batch((3, b"a", False), keep_if_empty=True)
    o = batch_outcome(batch, {b"a": 8}, now_ms=NOW, delete_retention_ms=RETENTION)
    assert (o.keep, o.retained, o.unchanged) == (True, (), False)
    assert not batch_outcome(
        _batch((3, b"a", False)), {b"a": 8}, now_ms=NOW, delete_retention_ms=RETENTION
    ).keep


def test_an_unchanged_batch_is_copied_as_it_is() -> None:
    o = batch_outcome(
        _batch((3, b"a", False), (4, b"b", False)), {}, now_ms=NOW, delete_retention_ms=RETENTION
    )
    assert o.unchanged
    o = batch_outcome(_batch((3, b"a", True), horizon=NOW + 1), {}, now_ms=NOW, delete_retention_ms=RETENTION)
    assert o.unchanged, "a tombstone batch whose horizon is set and not passed stays as it is"


def test_the_offset_map_takes_whole_segments_within_its_bound() -> None:
    omap = OffsetMap(3)
    assert omap.add_segment([(b"a", 0), (b"b", 1), (b"a", 2), (None, 3)])
    assert omap.latest == {b"a": 2, b"b": 1}
    assert not omap.add_segment([(b"c", 4), (b"d", 5)]), "two new keys do not fit"
    assert omap.latest == {b"a": 2, b"b": 1}, "a refused segment leaves the map as it was"
    assert omap.add_segment([(b"a", 6), (b"c", 7)])
    assert omap.latest == {b"a": 6, b"b": 1, b"c": 7}


# --- the property --------------------------------------------------------------------------------

KEYS = [b"a", b"b", b"c", b"d", b"e", None]


@dataclass
class _Batch:
    records: list[tuple[int, bytes | None, bool]]  # (offset, key, tombstone)
    producer: int
    horizon: int = -1

    @property
    def base(self) -> int:
        return self.origin[0]

    origin: tuple[int, int] = (0, 0)  # (base offset, last offset) as appended


@dataclass
class _Model:
    """What a compacted log must read as: every record ever appended (``history``), and for each
    tombstone the time of the first clean that covered it."""

    history: list[tuple[int, bytes | None, bool]] = field(default_factory=list)
    first_cleaned_at: dict[int, int] = field(default_factory=dict)


def _clean_pass(
    log: list[_Batch], first_dirty: int, end: int, now: int, map_max: int, producer_last: dict[int, int]
) -> tuple[list[_Batch], int]:
    """One clean over batches as the cleaner (storage/cleaner.py run_clean) does it, each batch a
    segment: the map over the dirty part within its bound (the clean point moves back to the
    first batch that does not fit), then each batch below the clean point by batch_outcome."""
    omap = OffsetMap(map_max)
    for b in log:
        if b.origin[1] < first_dirty or b.base >= end:
            continue
        if not omap.add_segment([(k, o) for o, k, _t in b.records]):
            end = b.base  # (at worst the clean part alone, for its tombstones)
            break
    if not log or end <= log[0].base:
        return log, first_dirty
    out: list[_Batch] = []
    for b in log:
        if b.base >= end:
            out.append(b)
            continue
        facts = BatchFacts(
            b.origin[0],
            b.origin[1],
            tuple(RecordFacts(o, k, t) for o, k, t in b.records),
            b.horizon,
            False,
            producer_last.get(b.producer) == b.origin[1],
        )
        o = batch_outcome(facts, omap.latest, now_ms=now, delete_retention_ms=RETENTION)
        if o.keep:
            kept = set(o.retained)
            out.append(
                _Batch([r for r in b.records if r[0] in kept], b.producer, o.delete_horizon_ms, b.origin)
            )
    return out, end


operation = st.one_of(
    st.tuples(
        st.just("append"),
        st.lists(st.tuples(st.sampled_from(KEYS), st.booleans()), min_size=1, max_size=4),
        st.integers(0, 2),
    ),
    st.tuples(st.just("clean"), st.integers(0, 400), st.floats(0, 1), st.integers(1, 6)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(operation, min_size=1, max_size=40))
def test_cleaning_keeps_what_a_compacted_log_must_read_as(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    log: list[_Batch] = []
    model = _Model()
    next_offset, now, clean_point = 0, NOW, 0
    producer_last: dict[int, int] = {}
    for op in ops:
        if op[0] == "append":
            records = [(next_offset + i, k, t) for i, (k, t) in enumerate(op[1])]
            log.append(_Batch(records, op[2], -1, (next_offset, records[-1][0])))
            model.history.extend(records)
            producer_last[op[2]] = records[-1][0]
            next_offset = records[-1][0] + 1
            continue
        _, advance, fraction, map_max = op
        now += advance
        # The clean point: a batch boundary (each batch a segment), never backwards, never the
        # last batch (the active segment).
        bases = [b.base for b in log] + [next_offset]
        candidates = [x for x in bases[:-1] if x >= clean_point] or [clean_point]
        end = max(clean_point, candidates[int(fraction * (len(candidates) - 1))])
        before = {b.base: b for b in log}
        log, end = _clean_pass(log, clean_point, end, now, map_max, producer_last)
        for o, _k, t in model.history:
            if t and o < end:
                model.first_cleaned_at.setdefault(o, now)
        clean_point = end
        _check(log, before, model, clean_point, now, producer_last)


def _check(
    log: list[_Batch],
    before: dict[int, _Batch],
    model: _Model,
    end: int,
    now: int,
    producer_last: dict[int, int],
) -> None:
    check_compacted(
        [r for b in log for r in b.records],
        model.history,
        end=end,
        now_ms=now,
        first_cleaned_at=model.first_cleaned_at,
        delete_retention_ms=RETENTION,
    )
    assert [b for b in log if b.base >= end] == [b for base, b in before.items() if base >= end], (
        "R6: no batch at or above the clean point changes"
    )
    for producer, last in producer_last.items():
        if last < end:
            assert any(b.origin[1] == last for b in log), f"R5: producer {producer}'s last batch is gone"

"""How the sluice source cuts a micro-batch into Spark tasks (pipeline/source.py plan_ranges,
pack_ranges): large ranges split, small ones gathered, every offset read by exactly one task."""

from __future__ import annotations

import random

import pytest

from sluice.pipeline.source import Range, Ranges, pack_ranges, plan_ranges, task_ranges


def _shape(parts: list) -> list[list[tuple[str, int, int, int]]]:
    return [[(r.topic, r.partition, r.start, r.end) for r in task_ranges(p)] for p in parts]


def test_a_small_batch_is_one_task_reading_every_partition() -> None:
    parts = plan_ranges({"t": {"0": 10}}, {"t": {"0": 1010, "1": 900, "2": 1200}}, 200_000, 20_000)
    assert _shape(parts) == [[("t", 0, 10, 1010), ("t", 1, 0, 900), ("t", 2, 0, 1200)]]
    assert isinstance(parts[0], Ranges)


def test_large_ranges_stay_tasks_of_their_own_and_split() -> None:
    parts = plan_ranges({}, {"t": {"0": 50_000, "1": 300, "2": 45_000}}, 30_000, 20_000)
    assert _shape(parts) == [
        [("t", 0, 0, 30_000)],
        [("t", 0, 30_000, 50_000)],
        [("t", 2, 0, 30_000)],
        [("t", 1, 0, 300), ("t", 2, 30_000, 45_000)],  # the small ones share a task
    ]


def test_packing_never_joins_pieces_larger_than_the_split() -> None:
    # maxRecordsPerPartition below minRecordsPerPartition: the split wins, only the tails share
    parts = plan_ranges({}, {"t": {"0": 1667, "1": 1667}}, 700, 20_000)
    assert _shape(parts) == [
        [("t", 0, 0, 700)],
        [("t", 0, 700, 1400)],
        [("t", 1, 0, 700)],
        [("t", 1, 700, 1400)],
        [("t", 0, 1400, 1667), ("t", 1, 1400, 1667)],
    ]


def test_no_packing_without_a_minimum() -> None:
    parts = plan_ranges({}, {"t": {"0": 5, "1": 5}}, 200_000)
    assert all(isinstance(p, Range) for p in parts) and len(parts) == 2


@pytest.mark.parametrize("seed", range(40))
def test_every_offset_is_read_by_exactly_one_task(seed: int) -> None:
    rng = random.Random(seed)
    topics = {f"t{i}": rng.randint(1, 6) for i in range(rng.randint(1, 3))}
    start = {
        t: {str(p): rng.randint(0, 50) for p in range(n) if rng.random() < 0.7} for t, n in topics.items()
    }
    end = {t: {str(p): rng.randint(0, 5000) for p in range(n)} for t, n in topics.items()}
    split, pack = rng.choice([50, 700, 200_000]), rng.choice([10, 1000, 20_000])
    parts = plan_ranges(start, end, split, pack)
    seen: dict[tuple[str, int], list[int]] = {}
    for part in parts:
        ranges = task_ranges(part)
        assert ranges, "no empty task"
        if isinstance(part, Ranges):
            assert len(ranges) > 1 and all(r.end - r.start < min(pack, split) for r in ranges)
        for r in ranges:
            assert 0 < r.end - r.start <= split
            seen.setdefault((r.topic, r.partition), []).extend(range(r.start, r.end))
    for t, parts_end in end.items():
        for p, stop in parts_end.items():
            begin = start.get(t, {}).get(p, 0)
            assert seen.get((t, int(p)), []) == list(range(begin, stop))  # in order, once each


def test_pack_ranges_keeps_the_order_and_closes_a_task_once_it_holds_enough() -> None:
    small = [Range("t", p, 0, 400) for p in range(5)]
    assert _shape(pack_ranges(small, 1000)) == [
        [("t", 0, 0, 400), ("t", 1, 0, 400), ("t", 2, 0, 400)],
        [("t", 3, 0, 400), ("t", 4, 0, 400)],
    ]


def test_with_task_slots_three_partitions_on_two_slots_are_an_even_number_of_equal_tasks() -> None:
    parts = plan_ranges({}, {"t": {"0": 300_000, "1": 300_000, "2": 300_000}}, 200_000, 20_000, 2)
    sizes = [sum(r.end - r.start for r in task_ranges(p)) for p in parts]
    assert sizes == [150_000] * 6  # six of 150,000, not 3 x (200,000 + 100,000)
    assert _shape(parts)[1] == [("t", 0, 150_000, 300_000)]
    assert _shape(parts)[2] == [("t", 1, 0, 150_000)]
    # a batch too small for one task per slot: one task
    assert _shape(plan_ranges({}, {"t": {"0": 900, "1": 900}}, 200_000, 20_000, 2)) == [
        [("t", 0, 0, 900), ("t", 1, 0, 900)]
    ]
    # a task may read the end of one partition and the start of the next
    assert _shape(plan_ranges({}, {"t": {"0": 30_000, "1": 30_000, "2": 30_000}}, 200_000, 20_000, 2)) == [
        [("t", 0, 0, 30_000), ("t", 1, 0, 15_000)],
        [("t", 1, 15_000, 30_000), ("t", 2, 0, 30_000)],
    ]


@pytest.mark.parametrize("seed", range(60))
def test_with_task_slots_every_offset_is_read_once_in_tasks_of_even_size(seed: int) -> None:
    rng = random.Random(seed)
    end = {f"t{i}": {str(p): rng.randint(0, 60_000) for p in range(rng.randint(1, 5))} for i in range(2)}
    start = {t: {p: rng.randint(0, min(50, o)) for p, o in parts.items()} for t, parts in end.items()}
    split, pack, slots = (
        rng.choice([5_000, 30_000, 200_000]),
        rng.choice([1, 2_000, 20_000]),
        rng.randint(1, 4),
    )
    parts = plan_ranges(start, end, split, pack, slots)
    total = sum(o - start[t][p] for t, ps in end.items() for p, o in ps.items())
    sizes = [sum(r.end - r.start for r in task_ranges(p)) for p in parts]
    assert sum(sizes) == total
    if total:
        assert max(sizes) - min(sizes) <= 1 and max(sizes) <= split
        fewest, least = -(-total // split), min(pack, split)
        # a multiple of the slots unless fewer than the slots or forced by the split; every task
        # at least minRecordsPerPartition unless there is one, or the split forces more
        assert len(parts) % slots == 0 or len(parts) < slots or len(parts) == fewest
        assert min(sizes) >= least or len(parts) in (1, fewest)
    seen: dict[tuple[str, int], list[int]] = {}
    for part in parts:
        for r in task_ranges(part):
            assert r.end > r.start
            seen.setdefault((r.topic, r.partition), []).extend(range(r.start, r.end))
    for t, ps in end.items():
        for p, stop in ps.items():
            assert seen.get((t, int(p)), []) == list(range(start[t][p], stop))

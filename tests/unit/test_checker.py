"""The checker reports exactly the lost, duplicated and out-of-order records it is fed."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sluice.chaos.checker import Ack, LostRecord, Read, check


def v(seq: int, partition: int = 0, writer: str = "w1") -> str:
    return f"{writer}:{partition}:{seq}"


def test_known_lost_and_duplicate_are_reported_exactly() -> None:
    acks = [Ack("t", 0, i, v(i), broker=2) for i in range(10)]
    reads = [Read("t", 0, i, v(i)) for i in range(10) if i != 4]  # seq 4 lost
    reads.append(Read("t", 0, 10, v(7)))  # seq 7 appended a second time
    verdict = check(acks, reads)["t"]
    assert verdict.acknowledged == 10
    assert verdict.read == 10
    assert verdict.lost == [LostRecord(v(4), 0, 4, 2)]
    assert verdict.duplicated == {v(7): [(0, 7), (0, 10)]}
    assert verdict.out_of_order == []
    assert not verdict.ok


def test_rereading_the_same_offset_is_not_a_duplicate() -> None:
    acks = [Ack("t", 0, 0, v(0), 1)]
    reads = [Read("t", 0, 0, v(0)), Read("t", 0, 0, v(0))]
    verdict = check(acks, reads)["t"]
    assert verdict.ok and verdict.read == 2


def test_out_of_order_within_a_partition_is_reported() -> None:
    reads = [Read("t", 0, 0, v(1)), Read("t", 0, 1, v(0)), Read("t", 0, 2, v(2))]
    verdict = check([], reads)["t"]
    assert verdict.out_of_order == [(0, 1, v(0), v(1))]


def test_unacknowledged_records_that_were_read_are_fine() -> None:
    # acks=1 style: written and readable although the ack never arrived.
    verdict = check([], [Read("t", 0, 0, v(0))])["t"]
    assert verdict.ok


@given(n=st.integers(1, 200), lost=st.sets(st.integers(0, 199)), dups=st.sets(st.integers(0, 199)))
def test_checker_finds_every_injected_fault(n: int, lost: set[int], dups: set[int]) -> None:
    lost = {i for i in lost if i < n}
    dups = {i for i in dups if i < n and i not in lost}
    acks = [Ack("t", 0, i, v(i), 1) for i in range(n)]
    reads = [Read("t", 0, i, v(i)) for i in range(n) if i not in lost]
    reads += [Read("t", 0, n + k, v(i)) for k, i in enumerate(sorted(dups))]
    verdict = check(acks, reads)["t"]
    assert {r.value for r in verdict.lost} == {v(i) for i in lost}
    assert set(verdict.duplicated) == {v(i) for i in dups}
    assert verdict.out_of_order == []

"""Source positions of MySQL/MariaDB changes: strictly increasing per row change, never spilling
from a large offset into the file number."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.sync.sources.mysql import _unwrap, row_changes
from sluice.sync.sources.mysql_base import (
    FILE_BITS,
    OFFSET_BITS,
    BinlogPosition,
    CaptureError,
    encode_position,
)

files = st.integers(0, 2**FILE_BITS - 1)
offsets = st.integers(0, 2**OFFSET_BITS - 1)


@given(a=st.tuples(files, offsets), b=st.tuples(files, offsets))
def test_encoded_positions_order_as_file_then_offset(a: tuple[int, int], b: tuple[int, int]) -> None:
    assert (encode_position(*a) < encode_position(*b)) == (a < b)
    assert 0 <= encode_position(*a) < 2**63


def test_an_offset_past_4_gib_does_not_reach_the_next_file() -> None:
    """With 32 bits of offset, (file 1, offset 2**32) encoded as (file 2, offset 0)."""
    assert encode_position(1, 2**32) < encode_position(2, 0)
    late, next_file = BinlogPosition("mysql-bin.000001", 2**32 + 5), BinlogPosition("mysql-bin.000002", 4)
    assert late.encode() < next_file.encode()
    with pytest.raises(CaptureError, match="does not fit"):
        encode_position(1, 2**OFFSET_BITS)


def test_log_pos_wrapping_past_4_gib_is_unwrapped() -> None:
    assert _unwrap(100, 50) == 100
    assert _unwrap(10, 2**32 - 20) == 2**32 + 10  # the 32-bit header wrapped
    assert _unwrap(2**32 - 1, 2**32 + 10) == 2 * 2**32 - 1


def upd(before: dict[str, int], after: dict[str, int]) -> dict[str, dict[str, int]]:
    return {"before_values": before, "after_values": after}


@given(n=st.integers(1, 60), kind=st.sampled_from(["insert", "update", "delete"]), key_change=st.booleans())
def test_every_row_change_of_an_event_has_its_own_position_inside_the_event(
    n: int, kind: str, key_change: bool
) -> None:
    if kind == "update":
        rows = [upd({"id": i, "v": 0}, {"id": i + 1000 * key_change, "v": 1}) for i in range(n)]
        size = 19 + 10 + 2 * n  # the header, the post-header, two bytes at least per updated row
    else:
        rows = [{"values": {"id": i, "v": 0}} for i in range(n)]
        size = 19 + 10 + n
    start = encode_position(3, 1000)
    changes = row_changes(kind, rows, ["id"], start, size)
    positions = [c.pos for c in changes]
    assert positions == sorted(set(positions)), "strictly increasing"
    assert start <= positions[0] and positions[-1] < start + size
    if kind == "update" and key_change:
        assert [c.op for c in changes[:2]] == ["d", "c"]
        assert changes[0].before == {"id": 0, "v": 0} and changes[1].after == {"id": 1000, "v": 1}
        assert len(changes) == 2 * n
    else:
        assert len(changes) == n


def test_the_same_row_changed_twice_in_one_event_keeps_its_order() -> None:
    rows = [upd({"id": 1, "v": 1}, {"id": 1, "v": 2}), upd({"id": 1, "v": 2}, {"id": 1, "v": 3})]
    first, second = row_changes("update", rows, ["id"], 5000, 60)
    assert first.pos < second.pos and second.after == {"id": 1, "v": 3}


def test_an_event_too_short_for_its_rows_is_refused() -> None:
    with pytest.raises(CaptureError, match="log_bin_compress"):
        row_changes("insert", [{"values": {"id": i}} for i in range(100)], ["id"], 0, 40)


def test_the_switch_gives_every_row_the_events_end_as_before() -> None:
    rows = [upd({"id": 1, "v": 1}, {"id": 1, "v": 2}), upd({"id": 1, "v": 2}, {"id": 1, "v": 3})]
    assert {c.pos for c in row_changes("update", rows, ["id"], 5000, 60, shared=True)} == {5060}

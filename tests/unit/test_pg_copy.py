"""COPY payloads cut by size (sync/targets/pg_copy.py): the same text as one payload, in order,
each piece within its bound, so a staged range above 2 GiB is built in pieces Arrow can hold."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sluice.sync.targets.pg_copy import copy_payloads, copy_text


def table(n: int) -> pa.Table:
    return pa.table({
        "key": pa.array([f'{{"id":{i}}}' for i in range(n)], pa.string()),
        "pos": pa.array(range(n), pa.int64()),
        "after": pa.array([None if i % 5 == 0 else "x\t" * (i % 17) + "\\\n" for i in range(n)], pa.string()),
    })  # fmt: skip


@pytest.mark.parametrize("limit", [1, 40, 333, 10_000, 1 << 30])
def test_payloads_cut_by_size_join_to_the_one_payload(limit: int) -> None:
    rows = table(500)
    whole = bytes(copy_text(rows, ["key", "pos", "after"]))
    parts = [bytes(p) for p in copy_payloads(rows, ["key", "pos", "after"], max_bytes=limit)]
    assert b"".join(parts) == whole
    assert all(p.endswith(b"\n") for p in parts)
    if limit >= 1 << 30:
        assert len(parts) == 1
    else:
        # no piece holds more than the bound of string data, unless a single row does
        sizes = [len(p) for p in parts]
        assert len(parts) > 1 and max(sizes) <= max(
            2 * limit + 64, max(len(line) for line in whole.split(b"\n")) + 1
        )


def test_no_rows_no_payload() -> None:
    assert list(copy_payloads(table(0), ["key", "pos", "after"])) == []


@pytest.mark.slow
def test_a_range_above_two_gib_of_text_is_copied_in_pieces() -> None:
    """One task's staged range of 2.3 GiB of text: copy_text alone fails with Arrow's 32-bit
    offsets (`ArrowInvalid: offset overflow`, the fault that failed every retry), the payloads
    are built."""
    value = "v" * (1 << 20)  # 1 MiB per row
    rows = pa.Table.from_batches(
        [pa.record_batch({"key": pa.array([f"{i}" for i in range(b * 256, b * 256 + 256)]),
                          "after": pa.array([value] * 256, pa.string())}) for b in range(9)]
    )  # fmt: skip
    with pytest.raises((pa.ArrowInvalid, pa.ArrowCapacityError)):
        copy_text(rows, ["key", "after"])
    total = sum(len(p) for p in copy_payloads(rows, ["key", "after"]))
    assert total == sum(len(f"{i}") + 1 + len(value) + 1 for i in range(9 * 256))

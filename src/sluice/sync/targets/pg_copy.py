"""The text PostgreSQL's COPY FROM STDIN reads, built in Arrow (column-wise, never row by row in
Python), and what PostgreSQL's text cannot hold (U+0000). Used by the target's driver-side
apply (postgres.py) and by the executors' staging (staging.py).

A batch's COPY text is cut into payloads of at most `COPY_PAYLOAD_BYTES` of row data each: an
Arrow string array's offsets are 32-bit, so a task's staged range above 2 GiB of text could not
be built at all (and failed again on every retry), and one payload the size of the whole range
would sit in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from sluice.sync.envelope import BadEventError

#: Row data per COPY payload (before escaping, which at most doubles it): well below the 2 GiB
#: an Arrow string array holds, and few enough payloads that each write is worth it.
COPY_PAYLOAD_BYTES = 256 * 1024 * 1024


def strip_nul(rows: pa.Table, *, check_keys: bool = True) -> tuple[pa.Table, int]:
    """`rows` with U+0000 removed from every string in `after` (PostgreSQL's text and jsonb
    cannot hold it), and how many rows had one. Such rows are rare: only they are re-encoded, in
    Python. A key holding U+0000 is refused instead: without it, 'a\\0b' and 'ab' would be one
    row in the target, and one of two source rows would be lost. (Staged rows keep the key's
    JSON escape, which text holds; the driver refuses it before merging: `check_keys=False`.)"""
    if check_keys:
        in_key = pc.fill_null(pc.match_substring(rows["key"], NUL_ESCAPE), False)
        if pc.any(in_key).as_py():
            raise nul_key_error(rows.filter(in_key).slice(0, 1).to_pylist()[0])
    hit = pc.fill_null(pc.match_substring(rows["after"], NUL_ESCAPE), False)
    count = int(pc.sum(hit).as_py() or 0)
    if not count:
        return rows, 0
    flags = hit.to_pylist()
    for col in ("after",):
        values = rows[col].to_pylist()
        fixed = [
            orjson.dumps(_without_nul(orjson.loads(v))).decode() if f and v is not None else v
            for v, f in zip(values, flags, strict=True)
        ]
        rows = rows.set_column(rows.column_names.index(col), col, pa.array(fixed, pa.string()))
    return rows, count


#: U+0000 as JSON text writes it (a key's canonical text, `envelope.key_text`).
NUL_ESCAPE = "\\u0000"


def nul_key_error(first: Mapping[str, Any]) -> BadEventError:
    return BadEventError(
        f"record at {first['topic']}[{first['partition']}]@{first['offset']} has U+0000 in its "
        f"primary key {first['key']} (table {first['table']!r}): PostgreSQL text cannot hold it, "
        "and without it two different keys would become one row. Nothing of the batch was "
        "written; change the key at the source, or apply this table to a target that keeps U+0000"
    )


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    return value


def _escape(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """COPY text format: backslash, newline, carriage return and tab escaped; nulls kept null."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        return pc.cast(arr, pa.string())
    for raw, esc in (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        arr = pc.replace_substring(arr, raw, esc)
    return arr


def copy_payloads(
    table: pa.Table, columns: list[str], max_bytes: int = COPY_PAYLOAD_BYTES
) -> Iterator[memoryview]:
    """The rows of `columns` as COPY FROM STDIN (text format) payloads, in order, each built from
    rows holding at most `max_bytes` of string data (a single larger row alone)."""
    if not table.num_rows:
        return
    sizes = [pc.fill_null(pc.binary_length(table.column(c)), 0) for c in columns if _is_text(table.column(c))]
    if not sizes:
        yield copy_text(table, columns)
        return
    per_row = sizes[0] if len(sizes) == 1 else pc.add_checked(sizes[0], sizes[1])
    for more in sizes[2:]:
        per_row = pc.add_checked(per_row, more)
    ends_array = pc.cumulative_sum_checked(pc.cast(per_row, pa.int64()))
    if ends_array[-1].as_py() <= max_bytes:  # the usual batch: one payload
        yield copy_text(table, columns)
        return
    ends = ends_array.to_pylist()
    start, base = 0, 0
    for i, end in enumerate(ends):
        if end - base > max_bytes and i > start:
            yield copy_text(table.slice(start, i - start), columns)
            start, base = i, ends[i - 1]
    yield copy_text(table.slice(start), columns)


def _is_text(column: pa.ChunkedArray) -> bool:
    return pa.types.is_string(column.type) or pa.types.is_large_string(column.type)


def copy_text(table: pa.Table, columns: list[str]) -> memoryview:
    """The rows of `columns` as one COPY FROM STDIN (text format) payload, built in Arrow: for
    a table whose string data stays well below 2 GiB (`copy_payloads` cuts one that does not)."""
    parts = [_escape(table.column(c)) for c in columns]
    lines = pc.binary_join_element_wise(
        *parts, pa.scalar("\t"), null_handling="replace", null_replacement="\\N"
    )
    lines = pc.binary_join_element_wise(lines, pa.scalar("\n"), pa.scalar(""))
    size = pc.sum(pc.binary_length(lines)).as_py() or 0
    return memoryview(lines.buffers()[2])[:size]

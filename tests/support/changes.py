"""Helpers for pipeline tests: change events as the log records a target receives."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from sluice.sync.envelope import ChangeEvent


def event(op: str, pos: int, key: int | dict[str, Any] = 1, table: str = "acct", **after: Any) -> ChangeEvent:
    """A change of one row (op c, u, d, r), or with op t a truncate of `table` (no row)."""
    k = {} if op == "t" else key if isinstance(key, dict) else {"id": key}
    return ChangeEvent(
        op=op,
        table=table,
        key=k,
        before=None,
        after=None if op in ("d", "t") else {**k, **after},
        pos=pos,
        commit_ts_ms=1_700_000_000_000 + pos,
    )


def records(
    events: Sequence[ChangeEvent | bytes], start: int = 0, topic: str = "t", partition: int = 0
) -> pa.Table:
    """Log records for `events` at consecutive offsets from `start` in one partition."""
    values = [e if isinstance(e, bytes) else e.to_json() for e in events]
    n = len(values)
    return pa.table(
        {
            "topic": pa.array([topic] * n, pa.string()),
            "partition": pa.array([partition] * n, pa.int32()),
            "offset": pa.array(range(start, start + n), pa.int64()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array([1_700_000_000_000] * n, pa.int64()),
        }
    )

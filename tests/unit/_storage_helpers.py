"""Shared helpers for the storage tests."""

from __future__ import annotations

from pathlib import Path

from sluice.protocol.records import build_batch, iter_batches
from sluice.storage import LogConfig, PartitionLog
from sluice.storage.segment import TimestampOffset


class Clock:
    """A settable clock for deterministic tests."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(n: int = 1, *, ts: int = 1000, value: bytes = b"v" * 40, **kw: int) -> bytes:
    return build_batch([(f"k{i}".encode(), value) for i in range(n)], timestamp_ms=ts, **kw)  # type: ignore[arg-type]


def offsets_in(data: bytes) -> list[int]:
    """Every offset covered by the batches in ``data``."""
    out: list[int] = []
    for _pos, h in iter_batches(data):
        out.extend(range(h.base_offset, h.last_offset + 1))
    return out


def read_all(log: PartitionLog, start: int | None = None) -> list[int]:
    """Offsets of every batch from ``start`` to the end, following segment boundaries."""
    offset = log.log_start_offset if start is None else start
    out: list[int] = []
    while offset < log.log_end_offset:
        r = log.read(offset, max_bytes=1 << 20)
        got = offsets_in(r.records)
        assert got, f"empty read at {offset} < {log.log_end_offset}"
        out.extend(o for o in got if o >= offset)
        offset = got[-1] + 1
    return out


def open_log(path: Path, clock: Clock | None = None, **cfg: object) -> PartitionLog:
    return PartitionLog.open(path, LogConfig(**cfg), now_ms=clock or Clock())  # type: ignore[arg-type]


def found_at(hit: TimestampOffset | None) -> tuple[int, int] | None:
    """(offset, timestamp) of a record found by time, None if none was."""
    return None if hit is None else (hit.offset, hit.timestamp)

"""Shared helpers for the storage tests."""

from __future__ import annotations

from pathlib import Path

from sluice.protocol.records import build_batch, decode_records, iter_batches, parse_header
from sluice.storage import AppendInfo, LogConfig, PartitionLog
from sluice.storage.cleaner import CleanResult, Throttler, run_clean
from sluice.storage.segment import TimestampOffset


class Clock:
    """A settable clock for deterministic tests."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def batch(n: int = 1, *, ts: int = 1000, value: bytes = b"v" * 40, **kw: int) -> bytes:
    return build_batch([(f"k{i}".encode(), value) for i in range(n)], timestamp_ms=ts, **kw)  # type: ignore[arg-type]


def append_verified(log: PartitionLog, records: bytes, *, leader_epoch: int = 0) -> AppendInfo:
    """Append a producer's transactional batch as a leader does once the transaction
    coordinator said its transaction added the partition (KIP-890): with the guard the log gave
    before the question (``PartitionLog.begin_verification``)."""
    guard = log.begin_verification(parse_header(records, 0).producer_id)
    return log.append_as_leader(records, leader_epoch=leader_epoch, verification=guard)


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


def clean_now(
    log: PartitionLog,
    now_ms: int,
    *,
    stable_end: int | None = None,
    map_entries_max: int = 1_000_000,
    force: bool = False,
) -> CleanResult | None:
    """One whole clean of ``log``, in this thread, as the broker's cleaner runs it in three
    places (plan, rewrite, commit, swap); the result, None when no clean was due or committed."""
    job = log.clean_job(
        now_ms,
        stable_end=log.log_end_offset if stable_end is None else stable_end,
        map_entries_max=map_entries_max,
        force=force,
    )
    if job is None:
        return None
    result = run_clean(job, Throttler(0))
    if result is None:
        log.abandon_clean(job)
        return None
    if not log.commit_clean(result):
        return None
    log.finish_swaps()
    return result


def records_of(log: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of the log, in order, read as a consumer would."""
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        r = log.read(offset, max_bytes=1 << 20)
        if not r.records:
            break
        for pos, h in iter_batches(r.records):
            out.extend(
                (rec.offset, rec.key, rec.value)
                for rec in decode_records(r.records, pos, h)
                if rec.offset >= offset
            )
            offset = h.last_offset + 1
    return out


class CrashedClean(Exception):
    """Raised by :func:`crash_clean_at`'s fault hook: the process "dies" at that step."""


def crash_clean_at(log: PartitionLog, at: int, now_ms: int) -> None:
    """Cleans ``log`` (forced, up to its end) and "kills" the process at step ``at``: -2 right
    after the rewrite (nothing committed), -1 after the commit in memory (no swap step done),
    ``n >= 0`` at the n-th step of ``finish_swaps`` (each rename and unlink, in order). Nothing
    more is written afterwards (``abandon``): what is on disk is what a kill -9 leaves."""
    job = log.clean_job(now_ms, stable_end=log.log_end_offset, map_entries_max=10_000, force=True)
    assert job is not None
    result = run_clean(job, Throttler(0))
    assert result is not None
    if at >= -1:
        assert log.commit_clean(result)
    if at >= 0:
        calls = iter(range(1 << 30))

        def fault(step: str) -> None:
            if next(calls) == at:
                raise CrashedClean(step)

        try:
            log.finish_swaps(fault=fault)
        except CrashedClean:
            pass
        else:
            raise AssertionError(f"finish_swaps has fewer than {at + 1} steps: no crash happened")
    log.abandon()

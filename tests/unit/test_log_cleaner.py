"""The broker's cleaner scheduler (broker/log_cleaner.py): which replicas it cleans, in what
order, how many at once; the rewrite here runs on a thread pool instead of cleaner processes
(tests/integration/test_compaction.py runs the processes)."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

from sluice.broker.log_cleaner import CleanerSettings, LogCleaner
from sluice.broker.partition import Partition
from sluice.protocol.records import build_batch
from tests.unit._storage_helpers import clean_now

COMPACT = {"cleanup.policy": "compact", "segment.bytes": "700", "min.cleanable.dirty.ratio": "0.1"}


def _replica(root: Path, topic: str, versions: int, config: dict[str, str] = COMPACT) -> Partition:
    part = Partition.open(root, topic, 0, uuid.uuid4(), config, 1)
    part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
    for v in range(versions):
        for k in range(5):
            part.append(build_batch([(f"k{k}".encode(), f"{v}".encode())]))
    for i in range(10):
        part.append(build_batch([(b"filler", b"x" * 60 + str(i).encode())]))
    return part


def test_due_replicas_are_cleaned_dirtiest_first_one_per_process() -> None:
    async def run(root: Path) -> None:
        dirty = _replica(root, "dirty", 40)
        assert clean_now(dirty.log, int(time.time() * 1000)) is not None  # a clean part of its own
        for v in range(10):
            for k in range(5):
                dirty.append(build_batch([(f"k{k}".encode(), f"again{v}".encode())]))
        for i in range(10):
            dirty.append(build_batch([(b"filler", b"y" * 60 + str(i).encode())]))
        dirtier = _replica(root, "dirtier", 40)  # never cleaned: all of it is dirty
        plain = _replica(root, "plain", 40, {"segment.bytes": "700"})
        replicas = SimpleNamespace(
            partitions={(p.topic, 0): p for p in (dirty, dirtier, plain)}  # type: ignore[attr-defined]
        )
        with ThreadPoolExecutor(1) as pool:
            cleaner = LogCleaner(replicas, CleanerSettings(processes=1, io_bytes_per_s=0), executor=pool)  # type: ignore[arg-type]
            started = cleaner.schedule()
            assert [p.topic for p in started] == ["dirtier"], "the dirtiest first, one process"
            assert cleaner.schedule() == [], "no second clean while the process is busy"
            while cleaner.cleans < 1:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            assert [p.topic for p in cleaner.schedule()] == ["dirty"]
            while cleaner.cleans < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0)
            assert cleaner.schedule() == [], "nothing due; a topic that is not compacted is never cleaned"
            assert cleaner.bytes_removed > 0
            await cleaner.stop()
        for p in (dirty, dirtier, plain):
            p.close()

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        asyncio.run(run(Path(d)))

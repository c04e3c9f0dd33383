"""The snapshot of large source tables as a Spark batch job: one task per key range, each
reading its range in a consistent snapshot and producing its rows to the log
(`sluice.sync.sources.mysql_snapshot.read_chunk`; a PostgreSQL source's under the slot's
exported snapshot, `sluice.sync.sources.pg_snapshot.read_pg_chunk`). On `local[*]` the ranges run on this
machine's cores; with a cluster master they run on the executors, which reach the source
database and the brokers themselves.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

from sluice.sync.sources.mysql_snapshot import ChunkResult, read_chunk


def run_snapshot_chunks(
    spark: Any,
    chunks: list[Any],
    *,
    stop: threading.Event | None = None,
    read: Callable[[Any], ChunkResult] = read_chunk,
) -> list[ChunkResult]:
    """Run every chunk as a Spark task and return their results; setting `stop` cancels the
    job (what was produced stays in the log, harmless: a restart snapshots again)."""
    if not chunks:
        return []
    sc = spark.sparkContext
    group = f"sluice-snapshot-{uuid.uuid4().hex[:8]}"
    tables = sorted({c.table for c in chunks})
    sc.setJobGroup(group, f"snapshot of {', '.join(tables)} in {len(chunks)} key ranges", True)
    done = threading.Event()

    def cancel_on_stop() -> None:
        while not done.wait(0.5):
            if stop is not None and stop.is_set():
                sc.cancelJobGroup(group)
                return

    watcher = threading.Thread(target=cancel_on_stop, name=f"{group}-cancel", daemon=True)
    watcher.start()
    try:
        results: list[ChunkResult] = sc.parallelize(chunks, len(chunks)).map(read).collect()
    finally:
        done.set()
        watcher.join(timeout=5)
        sc.setLocalProperty("spark.jobGroup.id", None)
    return results

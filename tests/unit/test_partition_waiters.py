"""A partition's long-poll waiters: an idle partition does not collect finished ones.

Every fetch that waits on a partition leaves a future in its list; a partition with no new
data is never notified, so before pruning the list grew by one future per idle fetch for as long
as the partition stayed idle (1,000 idle fetches beside 40 pending: ``assert 1040 <= 96``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from sluice.broker.partition import WAITERS_PRUNE_MIN, Partition
from sluice.protocol.records import build_batch


def test_timed_out_waiters_do_not_pile_up_and_pending_ones_are_all_woken(tmp_path: Path) -> None:
    part = Partition.open(tmp_path, "t", 0, uuid.uuid4(), {}, 1)
    part.become_leader(0, (1,), (1,), 0.0)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        pending = [loop.create_future() for _ in range(40)]
        for fut in pending:
            part.add_waiter(fut)
        for _ in range(1000):  # idle long polls: each waits, times out, and leaves its future
            fut: asyncio.Future[None] = loop.create_future()
            part.add_waiter(fut)
            fut.cancel()
        assert len(part._waiters) <= 2 * len(pending) + WAITERS_PRUNE_MIN
        part.append(build_batch([(None, b"v")]))
        assert all(f.done() and not f.cancelled() for f in pending), "every pending waiter wakes"

    asyncio.run(run())
    part.close()

"""Producer ids for idempotent producers: unique cluster-wide, handed out from blocks that
each broker claims in ZooKeeper with a conditional write."""

from __future__ import annotations

import asyncio

from sluice.cluster.zkstore import ZkStore


class ProducerIdManager:
    def __init__(self, store: ZkStore, broker_id: int):
        self._store = store
        self._broker_id = broker_id
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                block = await asyncio.to_thread(self._store.allocate_producer_id_block, self._broker_id)
                self._next, self._end = block.first, block.next_first
            pid = self._next
            self._next += 1
            return pid

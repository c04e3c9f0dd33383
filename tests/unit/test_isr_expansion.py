"""ISR expansion never lets the high watermark pass a joining follower (I3, KIP-497).

The leader decides that a follower may rejoin, then writes the new ISR to ZooKeeper; the write
completes later. Before the joining member counted for the high watermark, the other followers
moved it past the joining one's log end meanwhile, and the replica entered the ISR missing
committed records (this test failed with ``assert 20 <= 10`` at the first check).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.cluster import layout
from sluice.cluster.layout import PartitionState, StateWrite
from sluice.protocol.records import build_batch


def _fetch(broker: Broker, replica: int, offset: int) -> None:
    result = broker.replicas.read("t", 0, offset, 1 << 20, -1, True, replica_id=replica)
    assert result.error == 0, result


async def _until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_joining_follower_holds_the_high_watermark_while_its_isr_write_is_in_flight(tmp_path: Path) -> None:
    async def run() -> None:
        broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        topic_id = uuid.uuid4()
        part = Partition.open(tmp_path / "b1", "t", 0, topic_id, {"min.insync.replicas": "2"}, 1)
        broker.replicas.partitions[("t", 0)] = part
        part.become_leader(0, (1, 2), (1, 2, 3), time.monotonic() * 1000)
        broker.metadata.partition_state = lambda t, p: (PartitionState(1, 0, part.isr, 0), 7)  # type: ignore[method-assign]
        release = threading.Event()
        writes: list[tuple[str, int]] = []

        broker.metadata.topic = lambda t: SimpleNamespace(topic_id=topic_id)  # type: ignore[method-assign]

        def slow_write(items: list[tuple[StateWrite, int]], writer: str) -> list[str]:
            # ZooKeeper answering slowly: the leader keeps serving fetches meanwhile.
            assert release.wait(10)
            for write, version in items:
                writes.append((layout.partition_state_path(write.topic, write.partition), version))
            return [f"{layout.STATE_CHANGES}/change-0000000001"] * len(items)

        broker.store.write_partition_states = slow_write  # type: ignore[method-assign]

        part.append(build_batch([(b"k", b"v")] * 10))
        _fetch(broker, 2, 10)
        assert part.high_watermark == 10
        part.append(build_batch([(b"k", b"v")] * 10))
        _fetch(broker, 3, 10)  # replica 3 has 0..9 and may join: the ISR write starts
        await _until(lambda: ("t", 0) in broker._isr_writes, 5, "the ISR write to start")
        _fetch(broker, 2, 20)
        assert part.high_watermark <= 10, "I3: the HW never passes a joining member's log end"

        release.set()
        await _until(lambda: part.isr == (1, 2, 3), 5, "the ISR write to complete")
        assert writes == [("/brokers/topics/t/partitions/0/state", 7)]
        assert all(part.follower_leos[r] >= part.high_watermark for r in (2, 3))
        await _until(lambda: not broker._isr_writes, 5, "the ISR write to finish")
        _fetch(broker, 3, 20)
        assert part.high_watermark == 20
        part.close()

    asyncio.run(run())


def test_set_isr_asserts_no_member_joins_behind_the_high_watermark(tmp_path: Path) -> None:
    part = Partition.open(tmp_path, "t", 0, uuid.uuid4(), {"min.insync.replicas": "2"}, 1)
    now_ms = time.monotonic() * 1000
    part.become_leader(0, (1, 2), (1, 2, 3), now_ms)
    part.append(build_batch([(b"k", b"v")] * 10))
    part.record_follower_fetch(2, 10, now_ms)
    part.record_follower_fetch(3, 4, now_ms)
    assert part.high_watermark == 10
    with pytest.raises(AssertionError, match="I3"):
        part.set_isr((1, 2, 3), 1)
    part.close()

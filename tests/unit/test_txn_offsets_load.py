"""A group coordinator loading ``__consumer_offsets`` applies transactional offset commits at
their COMMIT marker, drops them at an ABORT marker, and keeps those whose marker has not come
yet apart (answered as unstable) until it does."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

from sluice.broker import group_records as gr
from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch


def _commit(part: Partition, partition: int, offset: int, producer_id: int = -1) -> None:
    key = gr.encode_key(gr.OffsetKey("g", "orders", partition))
    value = gr.encode_value(gr.offset_value(offset, -1, None, 0))
    batch = build_batch(
        [(key, value)], producer_id=producer_id, producer_epoch=0, transactional=producer_id >= 0
    )
    # as a leader appends once the coordinator verified the transaction (KIP-890)
    part.append(batch, part.log.begin_verification(producer_id) if producer_id >= 0 else None)


def test_transactional_offsets_apply_at_their_commit_marker_only(tmp_path: Path) -> None:
    async def run() -> None:
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), {}, 1)
        part.become_leader(1, (1,), (1,), time.monotonic() * 1000)
        _commit(part, 0, 1)
        _commit(part, 0, 5, producer_id=7)
        _commit(part, 1, 6, producer_id=7)
        _commit(part, 0, 9, producer_id=8)
        part.append_marker(7, 0, True, 0)
        _commit(part, 1, 12, producer_id=9)  # its marker comes after the load
        part.append_marker(8, 0, False, 0)
        broker = SimpleNamespace(
            config=SimpleNamespace(offsets_topic_partitions=1, group_initial_rebalance_delay_ms=0),
            replicas=SimpleNamespace(partitions={(OFFSETS_TOPIC, 0): part}),
        )
        coordinator = GroupCoordinator(broker)  # type: ignore[arg-type]
        coordinator.on_became_leader(0)
        deadline = time.monotonic() + 5
        while coordinator.check("g") is not ErrorCode.NONE:
            assert time.monotonic() < deadline, "the load did not finish"
            await asyncio.sleep(0.01)

        def committed() -> dict[int, int]:
            _error, found = coordinator.fetch_offsets("g", None)
            return {p: om.offset for p, om in found["orders"] if om is not None}

        assert committed() == {0: 5, 1: 6}  # 7's commit applied, 8's abort dropped
        assert coordinator.unstable_offsets("g") == {("orders", 1)}  # 9's still pending
        coordinator.on_txn_marker(0, 9, True)
        assert committed() == {0: 5, 1: 12}
        assert coordinator.unstable_offsets("g") == set()
        await coordinator.stop()
        part.close()

    asyncio.run(run())


def test_a_marker_committed_while_the_partition_loads_applies_once_it_has(tmp_path: Path) -> None:
    """The load replays up to the log end found at election, waiting for the high watermark to
    reach it; a marker written meanwhile lies past that end, and its offsets are applied once the
    replay is done (before, they stayed pending for good: the marker was not replayed and the
    groups were not there yet to apply it to)."""

    async def run() -> None:
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), {"min.insync.replicas": "2"}, 1)
        now_ms = time.monotonic() * 1000
        part.become_leader(1, (1, 2), (1, 2), now_ms)
        _commit(part, 0, 3, producer_id=9)  # above the high watermark: the load waits for it
        broker = SimpleNamespace(
            config=SimpleNamespace(offsets_topic_partitions=1, group_initial_rebalance_delay_ms=0),
            replicas=SimpleNamespace(partitions={(OFFSETS_TOPIC, 0): part}),
        )
        coordinator = GroupCoordinator(broker)  # type: ignore[arg-type]
        coordinator.on_became_leader(0)
        for _ in range(20):
            await asyncio.sleep(0)
        assert coordinator.check("g") is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        part.append_marker(9, 0, True, 0)
        part.record_follower_fetch(2, part.log.log_end_offset, now_ms)  # everything committed
        coordinator.on_txn_marker(0, 9, True)  # as txn_markers.write_local does once committed
        deadline = time.monotonic() + 5
        while coordinator.check("g") is not ErrorCode.NONE:
            assert time.monotonic() < deadline, "the load did not finish"
            await asyncio.sleep(0.01)
        _error, found = coordinator.fetch_offsets("g", None)
        assert [(p, om.offset if om else None) for p, om in found.get("orders", [])] == [(0, 3)]
        assert coordinator.unstable_offsets("g") == set()
        await coordinator.stop()
        part.close()

    asyncio.run(run())

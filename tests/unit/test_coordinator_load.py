"""A new group coordinator loads ``__consumer_offsets`` to the log end it found on becoming
leader, once the high watermark has reached it, and answers COORDINATOR_LOAD_IN_PROGRESS until
then (as Kafka's coordinator does).

A new leader's high watermark trails its log end until its followers fetch again. Loading only
to the high watermark missed the newest acknowledged commits: this test failed with
``AssertionError: the coordinator went active at the high watermark 1 of log end 2 (offset 1)``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sluice.broker import group_records as gr
from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch


def _commit(part: Partition, group: str, offset: int) -> None:
    key = gr.encode_key(gr.OffsetKey(group, "orders", 0))
    value = gr.encode_value(gr.offset_value(offset, -1, None, 0))
    part.append(build_batch([(key, value)]))


async def _until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_coordinator_loads_to_the_log_end_once_the_high_watermark_reaches_it(tmp_path: Path) -> None:
    async def run() -> None:
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), {"min.insync.replicas": "2"}, 1)
        now_ms = time.monotonic() * 1000
        part.become_leader(3, (1, 2), (1, 2), now_ms)
        _commit(part, "g", 1)
        part.record_follower_fetch(2, 1, now_ms)
        _commit(part, "g", 2)  # acknowledged by the previous leader; here above the HW
        assert (part.high_watermark, part.log.log_end_offset) == (1, 2)
        broker = SimpleNamespace(
            config=SimpleNamespace(offsets_topic_partitions=1, group_initial_rebalance_delay_ms=0),
            replicas=SimpleNamespace(partitions={(OFFSETS_TOPIC, 0): part}),
        )
        coordinator = GroupCoordinator(broker)  # type: ignore[arg-type]

        coordinator.on_became_leader(0)
        for _ in range(50):  # give the load every chance to run as far as it can
            await asyncio.sleep(0)
        status = coordinator.check("g")
        if status is ErrorCode.NONE:
            _error, offsets = coordinator.fetch_offsets("g", None)
            raise AssertionError(
                f"the coordinator went active at the high watermark {part.high_watermark} of log end "
                f"{part.log.log_end_offset} (offset {offsets['orders'][0][1].offset})"  # type: ignore[union-attr]
            )
        assert status is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

        part.record_follower_fetch(2, 2, now_ms)  # the follower catches up: HW = LEO
        await _until(lambda: coordinator.check("g") is ErrorCode.NONE, 5, "the load to finish")
        _error, offsets = coordinator.fetch_offsets("g", None)
        assert offsets == {"orders": [(0, offsets["orders"][0][1])]}
        assert offsets["orders"][0][1] is not None and offsets["orders"][0][1].offset == 2
        await coordinator.stop()
        part.close()

    asyncio.run(run())


def test_group_max_size_counts_pending_members_and_group_max_count_bounds_groups(tmp_path: Path) -> None:
    """group.max.size: members and members-to-be (KIP-394's pending ids) both count, so a client
    asking for ids in a loop cannot make the coordinator hold more; group.max.count bounds the
    groups one coordinator keeps. A member already in the group may always rejoin."""

    async def run() -> None:
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), {}, 1)
        part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
        broker = SimpleNamespace(
            config=SimpleNamespace(
                offsets_topic_partitions=1, group_initial_rebalance_delay_ms=0, group_max_size=2,
                group_max_count=1,
            ),
            replicas=SimpleNamespace(partitions={(OFFSETS_TOPIC, 0): part}),
        )  # fmt: skip
        coordinator = GroupCoordinator(broker)  # type: ignore[arg-type]
        coordinator.on_became_leader(0)
        await _until(lambda: coordinator.check("g") is ErrorCode.NONE, 5, "the coordinator to load")

        async def join(group: str, member: str = "") -> dict[str, Any]:
            req = {"group_id": group, "member_id": member, "session_timeout_ms": 10_000,
                   "rebalance_timeout_ms": 10_000, "protocol_type": "consumer",
                   "protocols": [{"name": "range", "metadata": b""}]}  # fmt: skip
            return await coordinator.join(req, 5, "c", "/127.0.0.1")

        ids = []
        for _ in range(2):
            answer = await join("g")
            assert answer["error_code"] == ErrorCode.MEMBER_ID_REQUIRED, answer
            ids.append(answer["member_id"])
        assert (await join("g"))["error_code"] == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert (await join("h"))["error_code"] == ErrorCode.GROUP_MAX_SIZE_REACHED
        rejoin = asyncio.ensure_future(join("g", ids[0]))  # a pending member may complete its join
        await asyncio.sleep(0.05)
        assert not rejoin.done() or rejoin.result()["error_code"] != ErrorCode.GROUP_MAX_SIZE_REACHED
        rejoin.cancel()
        part.close()

    asyncio.run(run())

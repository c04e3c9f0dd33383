"""A group coordinator over a real, compacted ``__consumer_offsets``-0 (the partition log, the
real cleaner), for tests that compare what it answers from memory with what a coordinator
loading the log (cleaned or not) answers: a coordinator failover must not move an offset."""

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
from tests.unit._storage_helpers import clean_now

#: offsets.retention.ms of the coordinators made here
RETENTION_MS = 1_000


class Replicas:
    def __init__(self, part: Partition) -> None:
        self.partitions = {(OFFSETS_TOPIC, 0): part}
        #: an error to refuse appends with, before they reach the log (as ReplicaManager's)
        self.refuse: ErrorCode | None = None

    def begin_txn_verification(self, topic: str, index: int, producer_id: int) -> tuple[Any, ErrorCode]:
        return self.partitions[(topic, index)].log.begin_verification(producer_id), ErrorCode.NONE

    def append(self, topic: str, index: int, records: bytes, *, verification: Any = None) -> Any:
        if self.refuse is not None:
            return SimpleNamespace(error=self.refuse, base_offset=-1)
        info = self.partitions[(topic, index)].append(records, verification)
        return SimpleNamespace(error=ErrorCode.NONE, base_offset=info.first_offset)


class AddedEverywhere:
    """A transaction coordinator's answer to every verification (KIP-890): the transaction
    added the partition. These tests are about what the offsets do, not who may write them."""

    async def verify(self, tid: str, pid: int, epoch: int, partitions: list[Any]) -> dict[Any, ErrorCode]:
        return dict.fromkeys(partitions, ErrorCode.NONE)


def new_coordinator(part: Partition) -> GroupCoordinator:
    broker = SimpleNamespace(
        config=SimpleNamespace(
            offsets_topic_partitions=1,
            group_initial_rebalance_delay_ms=0,
            offsets_retention_ms=RETENTION_MS,
            offsets_retention_check_interval_ms=60_000,
        ),
        replicas=Replicas(part),
        txn_verifier=AddedEverywhere(),
    )
    return GroupCoordinator(broker)  # type: ignore[arg-type]


async def loaded(c: GroupCoordinator) -> None:
    c.on_became_leader(0)
    await until(lambda: c.check("g") is ErrorCode.NONE, "the coordinator loaded")


def offsets_partition(tmp_path: Path, followers: tuple[int, ...] = ()) -> Partition:
    """A compacted ``__consumer_offsets``-0 led by broker 1; with ``followers``, a write is
    committed only once :func:`follow` says they have it."""
    config = {"cleanup.policy": "compact", "segment.bytes": "4096", "delete.retention.ms": "0"}
    part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), config, 1)
    replicas = (1, *followers)
    part.become_leader(0, replicas, replicas, time.monotonic() * 1000)
    return part


def follow(part: Partition) -> None:
    """Every follower fetches the whole log: everything written so far is committed."""
    for replica in part.isr:
        if replica != 1:
            part.record_follower_fetch(replica, part.log.log_end_offset, time.monotonic() * 1000)


async def until(done: Any, what: str) -> None:
    deadline = time.monotonic() + 5
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.001)


async def replicated(part: Partition, write: Any) -> Any:
    """Run the coordinator write ``write`` (a coroutine) to its end on a partition whose
    followers fetch only when told: once it has appended, they fetch."""
    end = part.log.log_end_offset
    task = asyncio.ensure_future(write)
    await until(lambda: task.done() or part.log.log_end_offset > end, "the write appended")
    follow(part)
    return await task


async def commit(c: GroupCoordinator, group: str, topic: str, offset: int) -> None:
    """An OffsetCommit of ``group``'s ``topic``-0 from outside the group protocol."""
    req = {
        "group_id": group,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset}]}],
    }
    assert set((await c.commit_offsets(req)).values()) == {ErrorCode.NONE}


def txn_commit(group: str, offset: int, producer_id: int) -> dict[str, Any]:
    """A TxnOffsetCommit of ``group``'s orders-0 from outside the group protocol."""
    return {
        "group_id": group,
        "transactional_id": f"txn-{producer_id}",
        "producer_id": producer_id,
        "producer_epoch": 0,
        "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": offset}]}],
    }


def end_txn(c: GroupCoordinator, part: Partition, producer_id: int, committed: bool) -> None:
    """The transaction's marker, written and committed on the partition, as txn_markers does."""
    part.append_marker(producer_id, 0, committed, 0)
    follow(part)
    c.on_txn_marker(0, producer_id, committed)


def orders_0(c: GroupCoordinator, group: str) -> int | None:
    """``group``'s committed offset of orders-0, as an OffsetFetch answers it."""
    error, found = c.fetch_offsets(group, [("orders", [0])])
    assert error is ErrorCode.NONE
    om = found["orders"][0][1]
    return None if om is None else om.offset


def roll(part: Partition) -> None:
    """Write records of other keys, so that what was written before lies below the clean point."""
    for i in range(100):
        key = gr.encode_key(gr.OffsetKey("filler", "filler", i))
        part.append(build_batch([(key, gr.encode_value(gr.offset_value(i, -1, None, 0)))]))
    follow(part)


def compact(part: Partition) -> None:
    """Clean the log twice (the second removes the tombstones: delete.retention.ms is 0)."""
    now_ms = int(time.time() * 1000)
    assert clean_now(part.log, now_ms, stable_end=part.high_watermark, force=True) is not None
    assert clean_now(part.log, now_ms + 1, stable_end=part.high_watermark, force=True) is not None


async def reload(first: GroupCoordinator, part: Partition) -> GroupCoordinator:
    """Stop ``first`` and load a new coordinator from the log as it is (a failover)."""
    await first.stop()
    second = new_coordinator(part)
    await loaded(second)
    return second


async def compact_and_reload(first: GroupCoordinator, part: Partition) -> GroupCoordinator:
    """Roll past what was written, compact the log, stop ``first`` and load a new coordinator
    from the cleaned log."""
    roll(part)
    compact(part)
    return await reload(first, part)

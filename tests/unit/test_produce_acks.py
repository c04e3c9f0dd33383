"""acks=all answers for the replica the batch went into (I1).

A drain moves a partition off its leader: the controller's state names new replicas, and the old
leader removes its replica. A produce request appended just before that, and waiting for its
followers, was acknowledged: the wait looked the partition up again by name, found nothing, and
passed the append's success through. In CI the drained partition's new leader lacked the
acknowledged record 2032, and the idempotent producer failed with ``OUT_OF_ORDER_SEQUENCE_NUMBER
... sequence desynchronization with broker 3``. Before the fix this test failed with
``AssertionError: <ErrorCode.NONE: 0>`` (the unreplicated batch acknowledged).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch


def _leader(broker: Broker, tmp_path: Path, isr: tuple[int, ...] = (1, 2)) -> Partition:
    """A new replica of t-0 (a topic id of its own), led by broker 1 with ``isr``."""
    part = Partition.open(tmp_path / "b1", "t", 0, uuid.uuid4(), {}, 1)
    broker.replicas.partitions[("t", 0)] = part
    part.become_leader(0, isr, isr, time.monotonic() * 1000)
    return part


def test_a_batch_whose_replica_leaves_the_broker_before_the_wait_is_not_acknowledged(tmp_path: Path) -> None:
    async def run() -> None:
        broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        part = _leader(broker, tmp_path)
        appended = broker.replicas.append("t", 0, build_batch([(b"k", b"v")]), required_acks=-1)
        assert appended.error is ErrorCode.NONE
        # The replica moves away before the wait starts (follower 2 never fetched the batch).
        broker.replicas._remove_partition(part, delete=False)
        answer = await broker.replicas.wait_replicated("t", 0, appended, 1.0)
        assert answer.error is ErrorCode.NOT_LEADER_OR_FOLLOWER, answer.error

    asyncio.run(run())


def test_a_replica_created_again_under_the_same_name_does_not_answer_for_the_old_one(tmp_path: Path) -> None:
    async def run() -> None:
        broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        old = _leader(broker, tmp_path)
        appended = broker.replicas.append("t", 0, build_batch([(b"k", b"v")] * 3), required_acks=-1)
        broker.replicas._remove_partition(old, delete=True)
        # A new replica under the same key, led here, with a high watermark past the old batch.
        new = _leader(broker, tmp_path, isr=(1,))
        new.append(build_batch([(b"k", b"v")] * 5))
        assert new.high_watermark == 5
        answer = await broker.replicas.wait_replicated("t", 0, appended, 1.0)
        assert answer.error is ErrorCode.NOT_LEADER_OR_FOLLOWER, answer.error
        new.close()

    asyncio.run(run())


def test_a_batch_replicated_by_every_isr_member_is_acknowledged(tmp_path: Path) -> None:
    async def run() -> None:
        broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        part = _leader(broker, tmp_path)
        appended = broker.replicas.append("t", 0, build_batch([(b"k", b"v")] * 2), required_acks=-1)
        waiting = asyncio.ensure_future(broker.replicas.wait_replicated("t", 0, appended, 5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "acknowledged before follower 2 had the batch"
        broker.metadata.brokers = lambda: {1: None, 2: None}  # type: ignore[method-assign,misc]
        result = broker.replicas.read("t", 0, 2, 1 << 20, -1, True, replica=broker.replicas.replica_claim(2))
        assert result.error == 0
        answer = await waiting
        assert answer.error is ErrorCode.NONE and answer.last_offset == 1
        part.close()

    asyncio.run(run())

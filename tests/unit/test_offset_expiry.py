"""Offsets expiry (KIP-211, broker/offset_expiry.py), and a compacted ``__consumer_offsets``:
deleted groups and expired offsets written as tombstones, cleaned away, so a new coordinator
loads the live groups and not their history."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.broker.offset_expiry import (
    ExpiryFacts,
    consumer_subscribed_topics,
    expired_offsets,
    group_expires,
)
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from tests.unit._storage_helpers import clean_now

NOW = 10_000_000
RETENTION = 1_000
OFFSETS = {("orders", 0): NOW - 5_000, ("orders", 1): NOW - 10, ("audit", 0): NOW - 5_000}


def _facts(
    state: str, protocol_type: str | None, state_ts: int, subscribed: set[str] | None = None
) -> ExpiryFacts:
    return ExpiryFacts(
        state, protocol_type, state_ts, OFFSETS, None if subscribed is None else frozenset(subscribed)
    )


def test_an_empty_groups_offsets_expire_together_from_when_it_became_empty() -> None:
    """Not by commit time: ("orders", 1) was committed 10 ms ago and still goes."""
    assert expired_offsets(_facts("Empty", "consumer", NOW - RETENTION + 1), NOW, RETENTION) == []
    became_empty = NOW - RETENTION
    assert expired_offsets(_facts("Empty", "consumer", became_empty), NOW, RETENTION) == sorted(OFFSETS)
    assert group_expires(_facts("Empty", "consumer", became_empty), sorted(OFFSETS), NOW, RETENTION)


def test_offsets_committed_outside_the_group_protocol_expire_by_commit_time() -> None:
    got = expired_offsets(_facts("Empty", None, NOW), NOW, RETENTION)
    assert got == [("audit", 0), ("orders", 0)]
    assert not group_expires(_facts("Empty", None, NOW - RETENTION), got, NOW, RETENTION), "one is left"


def test_a_stable_consumer_group_loses_only_offsets_of_topics_it_no_longer_subscribes_to() -> None:
    facts = _facts("Stable", "consumer", 0, subscribed={"orders"})
    assert expired_offsets(facts, NOW, RETENTION) == [("audit", 0)]
    assert not group_expires(facts, [("audit", 0)], NOW, RETENTION)


def test_a_group_rebalancing_or_of_another_protocol_keeps_every_offset() -> None:
    assert expired_offsets(_facts("PreparingRebalance", "consumer", 0, {"orders"}), NOW, RETENTION) == []
    assert expired_offsets(_facts("Stable", "connect", 0), NOW, RETENTION) == []
    assert expired_offsets(_facts("Stable", "consumer", 0, None), NOW, RETENTION) == [], "unreadable"


def test_a_consumer_subscription_is_read_as_clients_write_it() -> None:
    metadata = ConsumerProtocolMemberMetadata(0, ["orders", "audit"], b"user").encode()
    assert consumer_subscribed_topics(metadata) == frozenset({"orders", "audit"})
    assert consumer_subscribed_topics(metadata[:9]) is None
    assert consumer_subscribed_topics(b"") is None


class _Replicas:
    def __init__(self, part: Partition) -> None:
        self.partitions = {(OFFSETS_TOPIC, 0): part}

    def append(self, topic: str, index: int, records: bytes) -> Any:
        info = self.partitions[(topic, index)].append(records)
        return SimpleNamespace(error=ErrorCode.NONE, base_offset=info.first_offset)


def _coordinator(part: Partition) -> GroupCoordinator:
    broker = SimpleNamespace(
        config=SimpleNamespace(
            offsets_topic_partitions=1,
            group_initial_rebalance_delay_ms=0,
            offsets_retention_ms=RETENTION,
            offsets_retention_check_interval_ms=60_000,
        ),
        replicas=_Replicas(part),
    )
    return GroupCoordinator(broker)  # type: ignore[arg-type]


async def _loaded(coordinator: GroupCoordinator) -> None:
    coordinator.on_became_leader(0)
    deadline = time.monotonic() + 5
    while coordinator.check("g") is not ErrorCode.NONE:
        assert time.monotonic() < deadline, "the coordinator did not load"
        await asyncio.sleep(0.01)


async def _commit(coordinator: GroupCoordinator, group: str, topic: str, offset: int) -> None:
    req = {
        "group_id": group,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": offset}]}],
    }
    assert set((await coordinator.commit_offsets(req)).values()) == {ErrorCode.NONE}


def test_deleted_and_expired_groups_leave_the_offsets_log_and_a_new_coordinator_loads_only_live_ones(
    tmp_path: Path,
) -> None:
    """Three groups commit 300 times each; "gone" is deleted (DeleteGroups), "idle" expires
    (KIP-211), "live" stays. After the cleaner, a new coordinator replays a few records, not the
    900 commits, and finds "live" at its last offset and neither of the others. Without the
    expiry's tombstones "idle" came back: ``AssertionError: loaded groups ['idle', 'live']``."""

    async def run() -> None:
        config = {"cleanup.policy": "compact", "segment.bytes": "4096", "delete.retention.ms": "0"}
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), config, 1)
        part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
        first = _coordinator(part)
        await _loaded(first)
        for i in range(300):
            for group in ("live", "gone", "idle"):
                await _commit(first, group, "orders", i)
        assert await first.delete_group("gone") is ErrorCode.NONE
        # Only "idle" is past the retention: expire as if its commits were old, then commit "live".
        first.groups["idle"].offsets[("orders", 0)].commit_timestamp_ms -= 10 * RETENTION
        first.groups["idle"].state_timestamp_ms -= 10 * RETENTION
        assert await first.expire_offsets() == 1
        assert sorted(first.groups) == ["live"]
        await _commit(first, "live", "orders", 1000)
        for i in range(200):  # roll past the tombstones, so that they are below the clean point
            await _commit(first, "live", "filler", i)
        plog = part.log
        now_ms = int(time.time() * 1000)
        assert clean_now(plog, now_ms, stable_end=part.high_watermark, force=True) is not None
        assert clean_now(plog, now_ms + 1, stable_end=part.high_watermark, force=True) is not None
        await first.stop()

        second = _coordinator(part)
        await _loaded(second)
        assert sorted(second.groups) == ["live"], f"loaded groups {sorted(second.groups)}"
        error, offsets = second.fetch_offsets("live", [("orders", [0])])
        assert error is ErrorCode.NONE and offsets["orders"][0][1] is not None
        assert offsets["orders"][0][1].offset == 1000
        records = sum(1 for _ in _records(part))
        assert records < 150, f"the log still holds {records} records of 1,101 written"
        await second.stop()
        part.close()

    asyncio.run(run())


def _records(part: Partition) -> list[int]:
    from tests.unit._storage_helpers import records_of

    return [o for o, _k, _v in records_of(part.log)]


def test_a_commit_of_many_partitions_fits_a_small_offsets_segment(tmp_path: Path) -> None:
    """offsets.topic.segment.bytes is 100 KiB: a commit of 3,000 partitions (about 400 KB of
    records) is written in batches that fit it. One batch of 3,000 records was refused:
    ``RecordTooLargeError: append of ... bytes exceeds segment.bytes 102400``."""

    async def run() -> None:
        config = {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024)}
        part = Partition.open(tmp_path, OFFSETS_TOPIC, 0, uuid.uuid4(), config, 1)
        part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
        coordinator = _coordinator(part)
        await _loaded(coordinator)
        req = {
            "group_id": "wide",
            "topics": [
                {
                    "name": f"topic-{t}",
                    "partitions": [{"partition_index": p, "committed_offset": 7} for p in range(30)],
                }
                for t in range(100)
            ],
        }
        assert set((await coordinator.commit_offsets(req)).values()) == {ErrorCode.NONE}
        assert len(coordinator.groups["wide"].offsets) == 3000
        assert part.log.segment_count > 3
        await coordinator.stop()
        part.close()

    asyncio.run(run())

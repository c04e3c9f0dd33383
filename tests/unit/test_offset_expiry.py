"""Offsets expiry (KIP-211, broker/offset_expiry.py), and a compacted ``__consumer_offsets``:
deleted groups and expired offsets written as tombstones, cleaned away, so a new coordinator
loads the live groups and not their history."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
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
from tests.unit._offsets_log import (
    RETENTION_MS,
    commit,
    compact_and_reload,
    end_txn,
    follow,
    loaded,
    new_coordinator,
    offsets_partition,
    orders_0,
    replicated,
    txn_commit,
    until,
)
from tests.unit._storage_helpers import clean_now

NOW = 10_000_000
RETENTION = RETENTION_MS
OFFSETS = {("orders", 0): NOW - 5_000, ("orders", 1): NOW - 10, ("audit", 0): NOW - 5_000}


def _facts(
    state: str,
    protocol_type: str | None,
    state_ts: int,
    subscribed: set[str] | None = None,
    pending: frozenset[tuple[str, int]] = frozenset(),
) -> ExpiryFacts:
    return ExpiryFacts(
        state,
        protocol_type,
        state_ts,
        OFFSETS,
        None if subscribed is None else frozenset(subscribed),
        pending,
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


def test_an_offset_with_a_pending_transactional_commit_does_not_expire_nor_does_its_group() -> None:
    """Kafka's rule (OffsetMetadataManager.cleanupExpiredOffsets): a partition with a
    TxnOffsetCommit awaiting its marker keeps its offset, and a group with one is not removed.
    A tombstone written between the transactional record and its COMMIT marker is the newest
    record of its key, so the cleaner keeps it and drops the committed offset."""
    old = {("orders", 0): NOW - 5_000, ("orders", 1): NOW - 5_000}
    pending = frozenset({("orders", 1)})
    for state, protocol_type, subscribed in (
        ("Empty", "consumer", None),  # all of an empty group's offsets expire together
        ("Empty", None, None),  # each by its commit time
        ("Stable", "consumer", frozenset({"audit"})),  # a topic no member subscribes to
    ):
        facts = ExpiryFacts(state, protocol_type, NOW - RETENTION, old, subscribed, pending)
        expired = expired_offsets(facts, NOW, RETENTION)
        assert expired == [("orders", 0)], (state, protocol_type)
        assert not group_expires(facts, expired, NOW, RETENTION), (state, protocol_type)
    # A transaction committing a partition the group has no offset for yet keeps the group too.
    facts = ExpiryFacts("Empty", "consumer", NOW - RETENTION, old, None, frozenset({("payments", 0)}))
    assert expired_offsets(facts, NOW, RETENTION) == sorted(old)
    assert not group_expires(facts, sorted(old), NOW, RETENTION)


def test_a_consumer_subscription_is_read_as_clients_write_it() -> None:
    metadata = ConsumerProtocolMemberMetadata(0, ["orders", "audit"], b"user").encode()
    assert consumer_subscribed_topics(metadata) == frozenset({"orders", "audit"})
    assert consumer_subscribed_topics(metadata[:9]) is None
    assert consumer_subscribed_topics(b"") is None


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
        first = new_coordinator(part)
        await loaded(first)
        for i in range(300):
            for group in ("live", "gone", "idle"):
                await commit(first, group, "orders", i)
        assert await first.delete_group("gone") is ErrorCode.NONE
        # Only "idle" is past the retention: expire as if its commits were old, then commit "live".
        first.groups["idle"].offsets[("orders", 0)].commit_timestamp_ms -= 10 * RETENTION
        first.groups["idle"].state_timestamp_ms -= 10 * RETENTION
        assert await first.expire_offsets() == 1
        assert sorted(first.groups) == ["live"]
        await commit(first, "live", "orders", 1000)
        for i in range(200):  # roll past the tombstones, so that they are below the clean point
            await commit(first, "live", "filler", i)
        plog = part.log
        now_ms = int(time.time() * 1000)
        assert clean_now(plog, now_ms, stable_end=part.high_watermark, force=True) is not None
        assert clean_now(plog, now_ms + 1, stable_end=part.high_watermark, force=True) is not None
        await first.stop()

        second = new_coordinator(part)
        await loaded(second)
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
        coordinator = new_coordinator(part)
        await loaded(coordinator)
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


# -- expiry and transactional offset commits, through the coordinator, the log and the cleaner ---


def _age_past_retention(coordinator: GroupCoordinator, group: str) -> None:
    """As if ``group`` had been empty, and its offsets committed, ten retentions ago."""
    g = coordinator.groups[group]
    g.state_timestamp_ms -= 10 * RETENTION
    for om in g.offsets.values():
        om.commit_timestamp_ms -= 10 * RETENTION


def test_an_expired_offset_with_a_pending_transactional_commit_survives_expiry_compaction_and_reload(
    tmp_path: Path,
) -> None:
    """An empty group's offset is past the retention when a transaction commits a new one for
    it (TxnOffsetCommit, then its COMMIT marker); the expiry pass runs in between. The
    transaction's offset is the committed one, in memory and once the cleaned log is reloaded.

    Before the fix the pass tombstoned the offset and the group between the transactional
    record and its marker; the group left memory, so the marker applied to nothing, and the
    cleaner kept the tombstone over the transactional record, so a reload lost it too:
    ``AssertionError: assert (None, None) == (42, 42)``."""

    async def run() -> None:
        part = offsets_partition(tmp_path)
        first = new_coordinator(part)
        await loaded(first)
        await commit(first, "idle", "orders", 5)
        _age_past_retention(first, "idle")
        assert await first.commit_txn_offsets(txn_commit("idle", 42, 7)) == {("orders", 0): ErrorCode.NONE}
        await first.expire_offsets()
        end_txn(first, part, 7, committed=True)
        in_memory = orders_0(first, "idle") if "idle" in first.groups else None
        second = await compact_and_reload(first, part)
        reloaded = orders_0(second, "idle") if "idle" in second.groups else None
        assert (in_memory, reloaded) == (42, 42)
        await second.stop()
        part.close()

    asyncio.run(run())


def test_a_transactional_commit_appended_but_not_yet_replicated_keeps_its_partition_from_expiring(
    tmp_path: Path,
) -> None:
    """The reverse race: a TxnOffsetCommit's record is in the log, waiting for the follower,
    when the expiry pass decides. The partition is already pending (as Kafka's
    prepareTxnOffsetCommit makes it before the append), so no tombstone follows the record.

    Registered only once the write was committed, the offset was not pending yet: the
    tombstone landed after the transactional record, the group came back in memory with the
    transaction's offset, and a reload of the cleaned log had none:
    ``AssertionError: assert (42, None) == (42, 42)``."""

    async def run() -> None:
        part = offsets_partition(tmp_path, followers=(2,))
        first = new_coordinator(part)
        await loaded(first)
        await replicated(part, commit(first, "idle", "orders", 5))
        _age_past_retention(first, "idle")
        appended = part.log.log_end_offset
        txn = asyncio.ensure_future(first.commit_txn_offsets(txn_commit("idle", 42, 7)))
        await until(lambda: part.log.log_end_offset > appended, "the transactional record is in the log")
        assert not txn.done(), "the follower has not fetched: the write waits to be committed"
        in_log = part.log.log_end_offset
        expiry = asyncio.ensure_future(first.expire_offsets())
        await until(lambda: expiry.done() or part.log.log_end_offset > in_log, "the expiry pass decided")
        follow(part)
        assert await txn == {("orders", 0): ErrorCode.NONE}
        await expiry
        end_txn(first, part, 7, committed=True)
        in_memory = orders_0(first, "idle") if "idle" in first.groups else None
        second = await compact_and_reload(first, part)
        reloaded = orders_0(second, "idle") if "idle" in second.groups else None
        assert (in_memory, reloaded) == (42, 42)
        await second.stop()
        part.close()

    asyncio.run(run())


def test_an_aborted_transactional_commit_lets_the_expired_offset_go_on_the_next_pass(tmp_path: Path) -> None:
    """The pending offset only defers the expiry: once its transaction aborts, the next pass
    tombstones the old offset and the group, and the cleaned log loads without them."""

    async def run() -> None:
        part = offsets_partition(tmp_path)
        first = new_coordinator(part)
        await loaded(first)
        await commit(first, "idle", "orders", 5)
        _age_past_retention(first, "idle")
        assert await first.commit_txn_offsets(txn_commit("idle", 42, 7)) == {("orders", 0): ErrorCode.NONE}
        assert await first.expire_offsets() == 0, "orders-0 is pending in a transaction"
        assert orders_0(first, "idle") == 5
        end_txn(first, part, 7, committed=False)
        assert orders_0(first, "idle") == 5, "the aborted offset is dropped"
        assert await first.expire_offsets() == 1
        assert "idle" not in first.groups
        second = await compact_and_reload(first, part)
        assert "idle" not in second.groups, f"loaded groups {sorted(second.groups)}"
        await second.stop()
        part.close()

    asyncio.run(run())


def test_a_refused_transactional_commit_leaves_nothing_pending(tmp_path: Path) -> None:
    """A TxnOffsetCommit is pending from its append on; one the partition refuses (a fenced
    producer epoch) is undone, as nothing of it is in the log: no offset for a marker to apply,
    none for the expiry to wait for, and no group created for it."""

    async def run() -> None:
        part = offsets_partition(tmp_path)
        first = new_coordinator(part)
        await loaded(first)
        await commit(first, "idle", "orders", 5)
        _age_past_retention(first, "idle")
        first.broker.replicas.refuse = ErrorCode.INVALID_PRODUCER_EPOCH
        fenced = {("orders", 0): ErrorCode.INVALID_PRODUCER_EPOCH}
        assert await first.commit_txn_offsets(txn_commit("idle", 42, 7)) == fenced
        assert await first.commit_txn_offsets(txn_commit("new", 1, 7)) == fenced
        assert first.unstable_offsets("idle") == set()
        assert "new" not in first.groups
        first.broker.replicas.refuse = None
        assert await first.expire_offsets() == 1
        assert "idle" not in first.groups
        await first.stop()
        part.close()

    asyncio.run(run())


def test_a_timed_out_transactional_commit_stays_pending_and_its_marker_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TxnOffsetCommit whose record is in the log but not committed in time is answered
    REQUEST_TIMED_OUT, yet the record stays: it stays pending, so the expiry leaves its
    partition alone and its COMMIT marker applies it, in memory as a reload of the cleaned log
    does (dropped from memory at the timeout, the marker applied nothing while a reload
    applied it, and an expiry pass could tombstone it)."""
    monkeypatch.setattr("sluice.broker.coordinator.WRITE_TIMEOUT_S", 0.05)

    async def run() -> None:
        part = offsets_partition(tmp_path, followers=(2,))
        first = new_coordinator(part)
        await loaded(first)
        await replicated(part, commit(first, "idle", "orders", 5))
        _age_past_retention(first, "idle")
        timed_out = {("orders", 0): ErrorCode.REQUEST_TIMED_OUT}
        assert await first.commit_txn_offsets(txn_commit("idle", 42, 7)) == timed_out
        assert first.unstable_offsets("idle") == {("orders", 0)}
        assert await first.expire_offsets() == 0
        follow(part)
        end_txn(first, part, 7, committed=True)
        assert orders_0(first, "idle") == 42
        second = await compact_and_reload(first, part)
        assert orders_0(second, "idle") == 42
        await second.stop()
        part.close()

    asyncio.run(run())

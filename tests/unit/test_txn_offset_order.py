"""Which commit of a group's partition is its committed offset when a transactional commit
(TxnOffsetCommit, applied at its COMMIT marker) and other records of the same partition are
interleaved in ``__consumer_offsets``: the one whose record is newer in the log, as the log
cleaner keeps the newest record of a key. Kafka's rule (OffsetMetadataManager.replay and
replayEndTransactionMarker, KAFKA-14505): a committed transactional offset replaces the current
one only if its record's offset is higher than the current commit's record offset, and a
tombstone of the partition also drops the pending transactional offsets written before it.

The coordinator's memory, a coordinator loading the log as it is, and one loading the cleaned
log must all give Kafka's answer: a coordinator failover must not move a committed offset. The
answers expected are Apache Kafka 4.1.1's: the same four interleavings, by confluent-kafka and
kafka-python clients on a one-node KRaft cluster, answered 50, none, 44 and 43, before and after
a restart of the broker (its coordinator loading ``__consumer_offsets``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.group import OffsetAndMetadata, complete_txn, delete_offset, supersedes
from sluice.broker.group import commit_offset as apply_commit
from sluice.broker.partition import Partition
from sluice.protocol.errors import ErrorCode
from tests.unit._offsets_log import (
    commit,
    compact_and_reload,
    end_txn,
    loaded,
    new_coordinator,
    offsets_partition,
    orders_0,
    reload,
    txn_commit,
)

# -- the rule, over plain data ---------------------------------------------------------------------


def _om(offset: int, record_offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, -1, None, 0, record_offset)


def test_a_commit_replaces_the_committed_offset_only_if_its_record_is_newer() -> None:
    assert supersedes(7, None), "nothing committed yet"
    assert supersedes(7, 6)
    assert not supersedes(6, 7), "a record older than the current commit's"
    assert not supersedes(7, 7), "the current commit's own record"


def test_a_committed_transaction_keeps_a_plain_commit_written_after_its_record() -> None:
    """Kafka's testReplayTransactionEndMarkerKeepsTheMostRecentCommittedOffset: the
    transactional record at 10, a plain commit at 11, then the COMMIT marker."""
    offsets: dict[str, OffsetAndMetadata] = {}
    pending = {7: {"orders-0": _om(42, 10)}}
    assert apply_commit(offsets, "orders-0", _om(50, 11))
    assert complete_txn(offsets, pending, 7, committed=True) == 1
    assert (offsets["orders-0"].offset, pending) == (50, {})
    # Written before its record, the plain commit is replaced.
    offsets, pending = {"orders-0": _om(5, 9)}, {7: {"orders-0": _om(42, 10)}}
    complete_txn(offsets, pending, 7, committed=True)
    assert offsets["orders-0"].offset == 42


def test_a_tombstone_drops_the_pending_transactional_offsets_written_before_it_only() -> None:
    """Kafka's testReplayWithTombstoneAndPendingTransactionalOffsets, and a transaction that
    writes the partition again after the tombstone (record 13): that one stays."""
    offsets = {"orders-0": _om(5, 9)}
    pending = {7: {"orders-0": _om(42, 10), "orders-1": _om(1, 10)}, 8: {"orders-0": _om(44, 13)}}
    delete_offset(offsets, pending, "orders-0", 12)
    assert offsets == {}
    assert pending == {7: {"orders-1": _om(1, 10)}, 8: {"orders-0": _om(44, 13)}}
    complete_txn(offsets, pending, 8, committed=True)
    complete_txn(offsets, pending, 7, committed=True)
    assert {tp: om.offset for tp, om in offsets.items()} == {"orders-0": 44, "orders-1": 1}


def test_a_tombstone_older_than_the_committed_offset_leaves_it() -> None:
    offsets = {"orders-0": _om(50, 12)}
    delete_offset(offsets, {}, "orders-0", 11)
    assert offsets["orders-0"].offset == 50


# -- through the coordinator, the log, the cleaner and a reload ------------------------------------

Scenario = Callable[[GroupCoordinator, Partition], Awaitable[None]]


def _offset_of_g(c: GroupCoordinator) -> int | None:
    return orders_0(c, "g")


def _answers(
    tmp_path: Path,
    scenario: Scenario,
    cleaned: bool,
    ask: Callable[[GroupCoordinator], object] = _offset_of_g,
) -> tuple[object, object]:
    """What ``ask`` finds after ``scenario`` (by default, group g's committed offset of
    orders-0): in the coordinator's memory, then in a new coordinator loading the log
    (``cleaned``: once the cleaner compacted it)."""

    async def run() -> tuple[object, object]:
        part = offsets_partition(tmp_path)
        first = new_coordinator(part)
        await loaded(first)
        await scenario(first, part)
        in_memory = ask(first)
        second = await (compact_and_reload(first, part) if cleaned else reload(first, part))
        reloaded = ask(second)
        await second.stop()
        part.close()
        return in_memory, reloaded

    return asyncio.run(run())


cleaned_or_not = pytest.mark.parametrize("cleaned", [False, True], ids=["log", "cleaned-log"])


async def _txn(c: GroupCoordinator, offset: int, producer_id: int) -> None:
    assert await c.commit_txn_offsets(txn_commit("g", offset, producer_id)) == {("orders", 0): ErrorCode.NONE}


@cleaned_or_not
def test_a_plain_commit_between_a_transactional_commit_and_its_marker_stays_the_committed_offset(
    tmp_path: Path, cleaned: bool
) -> None:
    """TxnOffsetCommit 42, OffsetCommit 50, COMMIT: the plain commit's record is the newer, so
    50 (the cleaner keeps it and drops the transactional record). Before, the marker applied 42
    over it in memory, and so did a load of the log as it was; a load of the cleaned log gave
    50: ``assert (42, 42) == (50, 50)`` (log), ``assert (42, 50) == (50, 50)`` (cleaned-log)."""

    async def scenario(c: GroupCoordinator, part: Partition) -> None:
        await _txn(c, 42, producer_id=7)
        await commit(c, "g", "orders", 50)
        end_txn(c, part, 7, committed=True)

    assert _answers(tmp_path, scenario, cleaned) == (50, 50)


@cleaned_or_not
def test_an_offset_delete_between_a_transactional_commit_and_its_marker_deletes_it(
    tmp_path: Path, cleaned: bool
) -> None:
    """OffsetCommit 5, TxnOffsetCommit 42, OffsetDelete, COMMIT: the tombstone is newer than the
    transactional record and drops it, so no offset. Before, the marker applied 42 in memory,
    and so did a load of the log as it was; the cleaned log had none:
    ``assert (42, 42) == (None, None)`` (log), ``assert (42, None) == (None, None)``
    (cleaned-log)."""

    async def scenario(c: GroupCoordinator, part: Partition) -> None:
        await commit(c, "g", "orders", 5)
        await _txn(c, 42, producer_id=7)
        assert await c.delete_offsets("g", [("orders", 0)]) is ErrorCode.NONE
        end_txn(c, part, 7, committed=True)

    assert _answers(tmp_path, scenario, cleaned) == (None, None)


@cleaned_or_not
def test_a_transaction_writing_the_partition_after_an_offset_delete_keeps_its_offset(
    tmp_path: Path, cleaned: bool
) -> None:
    """TxnOffsetCommit 42 (producer 7), OffsetDelete, TxnOffsetCommit 44 (producer 8), COMMIT 8,
    COMMIT 7: the tombstone drops 7's offset, not 8's written after it, so 44. Before, 7's marker
    applied 42 last: ``assert (42, 42) == (44, 44)`` (log), ``assert (42, 44) == (44, 44)``
    (cleaned-log)."""

    async def scenario(c: GroupCoordinator, part: Partition) -> None:
        await _txn(c, 42, producer_id=7)
        assert await c.delete_offsets("g", [("orders", 0)]) is ErrorCode.NONE
        await _txn(c, 44, producer_id=8)
        end_txn(c, part, 8, committed=True)
        end_txn(c, part, 7, committed=True)

    assert _answers(tmp_path, scenario, cleaned) == (44, 44)


@cleaned_or_not
def test_of_two_transactions_committing_one_partition_the_later_written_wins_whatever_commits_last(
    tmp_path: Path, cleaned: bool
) -> None:
    """TxnOffsetCommit 42 (producer 7), TxnOffsetCommit 43 (producer 8), COMMIT 8, COMMIT 7:
    8's record is the newer, so 43. Before, the last marker won:
    ``assert (42, 42) == (43, 43)`` (log), ``assert (42, 43) == (43, 43)`` (cleaned-log)."""

    async def scenario(c: GroupCoordinator, part: Partition) -> None:
        await _txn(c, 42, producer_id=7)
        await _txn(c, 43, producer_id=8)
        end_txn(c, part, 8, committed=True)
        end_txn(c, part, 7, committed=True)

    assert _answers(tmp_path, scenario, cleaned) == (43, 43)


@cleaned_or_not
def test_a_group_deleted_while_a_transaction_commits_an_offset_of_it_stays_deleted(
    tmp_path: Path, cleaned: bool
) -> None:
    """OffsetCommit audit-0 5, TxnOffsetCommit orders-0 42, DeleteGroups, COMMIT: the group and
    its offsets are gone, the transaction's too (Kafka's deleteAllOffsets writes a tombstone
    for each partition a pending transaction wrote as well). Kafka 4.1.1 answers so, before and
    after a restart: no group listed, no offset. Before, the tombstones covered the committed
    offsets only: the group left memory, and a load applied the transaction's offset at its
    marker and brought the group back: ``assert ((False, None), (True, 42)) == ((False, None),
    (False, None))`` (log and cleaned-log)."""

    async def scenario(c: GroupCoordinator, part: Partition) -> None:
        await commit(c, "g", "audit", 5)
        await _txn(c, 42, producer_id=7)
        assert await c.delete_group("g") is ErrorCode.NONE
        end_txn(c, part, 7, committed=True)

    def group_and_offset(c: GroupCoordinator) -> tuple[bool, int | None]:
        return "g" in c.groups, orders_0(c, "g")

    assert _answers(tmp_path, scenario, cleaned, group_and_offset) == ((False, None), (False, None))

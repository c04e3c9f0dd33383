"""Leader-epoch truncation (KIP-101, KIP-279): after truncating, a follower's log is a prefix of
the leader's (I2), however many epochs the two histories differ by.

Before the rule asked again, a follower with epochs [(0, 0), (2, 10)] facing a leader with
[(0, 0), (1, 5), (3, 12)] cut at 10, keeping offsets 5..9 of epoch 0 where the leader has epoch
1 (the first test below, on the previous ``truncation_offset``, failed with ``assert 10 == 5``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.partition import Partition
from sluice.broker.replica_fetcher import FetcherManager, LeaderFetcher
from sluice.broker.replication import AskAgain, TruncateTo, local_epoch_end, truncation_step
from sluice.protocol.api import ApiKey
from sluice.protocol.records import build_batch, iter_batches
from sluice.storage import LogConfig, PartitionLog

#: A log as (offset, epoch) pairs, offsets 0, 1, 2, ...
Log = list[tuple[int, int]]


def epoch_entries(log: Log, trailing_epoch: int | None = None) -> list[tuple[int, int]]:
    """The leader-epoch cache of ``log``: where each epoch starts, plus an epoch taken at the log
    end with no record yet (a replica that became leader and wrote nothing)."""
    entries: list[tuple[int, int]] = []
    for offset, epoch in log:
        if not entries or entries[-1][0] != epoch:
            entries.append((epoch, offset))
    if trailing_epoch is not None and (not entries or trailing_epoch > entries[-1][0]):
        entries.append((trailing_epoch, len(log)))
    return entries


def leader_answer(entries: list[tuple[int, int]], leo: int, requested: int) -> tuple[int, int]:
    """What a leader answers to OffsetForLeaderEpoch(requested) (``LeaderEpochCache.end_offset_for``)."""
    if not entries or requested < 0:
        return -1, -1
    if entries[-1][0] == requested:
        return requested, leo
    higher = [i for i, (e, _s) in enumerate(entries) if e > requested]
    if not higher:
        return -1, -1
    i = higher[0]
    return (requested, entries[0][1]) if i == 0 else (entries[i - 1][0], entries[i][1])


def truncate(
    follower: list[tuple[int, int]],
    follower_leo: int,
    hw: int,
    leader: list[tuple[int, int]],
    leader_leo: int,
) -> tuple[int, list[int]]:
    """Run the rule to the end, as the fetcher does: (where the follower cuts, epochs asked)."""
    asked = [follower[-1][0]]
    for _ in range(len(follower)):
        reply = leader_answer(leader, leader_leo, asked[-1])
        step = truncation_step(asked[-1], follower, follower_leo, hw, *reply)
        if isinstance(step, TruncateTo):
            return step.offset, asked
        asked.append(step.epoch)
    raise AssertionError(f"no answer after {len(follower)} rounds: asked {asked}")


def test_follower_missing_the_leaders_epoch_asks_again_kip_279() -> None:
    follower, leader = [(0, 0), (2, 10)], [(0, 0), (1, 5), (3, 12)]
    assert truncation_step(2, follower, 15, 3, 1, 12) == AskAgain(0)
    assert truncation_step(0, follower, 15, 3, 0, 5) == TruncateTo(5)
    assert truncate(follower, 15, 3, leader, 20) == (5, [2, 0])


def test_local_epoch_end_is_the_next_epochs_start_or_the_log_end() -> None:
    entries = [(0, 0), (2, 10), (5, 14)]
    assert local_epoch_end(entries, 20, 1) == (0, 10)
    assert local_epoch_end(entries, 20, 2) == (2, 14)
    assert local_epoch_end(entries, 20, 9) == (5, 20)
    assert local_epoch_end([(3, 4)], 20, 2) == (-1, -1)


def test_follower_whose_every_epoch_is_newer_than_the_leaders_keeps_nothing_past_its_start() -> None:
    # Follower wrote offsets 0..1 as leader of epoch 2; the leader has epoch 1 there.
    assert truncation_step(2, [(2, 0)], 2, 0, 1, 3) == TruncateTo(0)


@st.composite
def diverged_logs(draw: st.DrawFn) -> tuple[Log, int | None, Log, int, int]:
    """A leader's and a follower's log that agree on a common prefix and then differ.

    After the point where they differ no epoch appears in both (one leader per epoch: a replica
    with a record of epoch E has everything the leader of E had before it). At most one of them
    goes on with the last common epoch (the old leader wrote more of it than the new one got).
    The leader's current epoch is above every epoch either of them has.
    Returns (leader log, follower's trailing empty epoch or None, follower log, leader's
    current epoch, high watermark).
    """
    runs = draw(st.lists(st.integers(1, 4), max_size=4))
    common: Log = []
    epoch = draw(st.integers(0, 2))
    for length in runs:
        common += [(len(common) + i, epoch) for i in range(length)]
        epoch += draw(st.integers(1, 2))
    last_common = common[-1][1] if common else -1
    later = draw(st.lists(st.integers(last_common + 1, last_common + 12), unique=True, max_size=6))
    owners = [draw(st.booleans()) for _ in later]
    follower_epochs = sorted(e for e, to_follower in zip(later, owners, strict=True) if to_follower)
    leader_epochs = sorted(e for e, to_follower in zip(later, owners, strict=True) if not to_follower)
    continues = draw(st.sampled_from(["none", "leader", "follower"])) if common else "none"

    def extend(log: Log, go_on: bool, epochs: list[int]) -> Log:
        out = list(log)
        if go_on:
            out += [(len(out) + i, last_common) for i in range(draw(st.integers(1, 3)))]
        for e in epochs:
            out += [(len(out) + i, e) for i in range(draw(st.integers(1, 3)))]
        return out

    follower_epochs_with_records = follower_epochs
    follower_trailing: int | None = None
    if follower_epochs and draw(st.booleans()):
        *follower_epochs_with_records, follower_trailing = follower_epochs
    follower = extend(common, continues == "follower", follower_epochs_with_records)
    leader = extend(common, continues == "leader", leader_epochs)
    current = max([last_common, *later]) + 1
    hw = draw(st.integers(0, len(common)))
    return leader, follower_trailing, follower, current, hw


@settings(max_examples=300)
@given(diverged_logs())
def test_after_truncation_the_follower_is_a_prefix_of_the_leader(
    case: tuple[Log, int | None, Log, int, int],
) -> None:
    leader, follower_trailing, follower, current, hw = case
    if not follower:
        return
    follower_cache = epoch_entries(follower, follower_trailing)
    leader_cache = epoch_entries(leader, current)
    cut, asked = truncate(follower_cache, len(follower), hw, leader_cache, len(leader))
    agreed = 0
    while agreed < min(len(leader), len(follower)) and leader[agreed] == follower[agreed]:
        agreed += 1
    assert follower[:cut] == leader[:cut], "I2: what the follower keeps is the leader's"
    assert cut == agreed, "and nothing the two logs agree on is cut"
    assert cut >= hw, "nothing below the high watermark is cut"
    assert len(asked) <= len(follower_cache), "at most one question per local epoch"
    assert asked == sorted(asked, reverse=True) and len(set(asked)) == len(asked)


# -- the fetcher runs the rounds -------------------------------------------------------------------


def _write(log: PartitionLog, epochs: list[tuple[int, int]], end: int, value: bytes) -> None:
    """Append one record per offset up to ``end``, each batch stamped with its epoch."""
    bounds = [start for _e, start in epochs[1:]] + [end]
    for (epoch, start), stop in zip(epochs, bounds, strict=True):
        for offset in range(start, stop):
            log.append_as_follower(
                build_batch([(b"k", value)], base_offset=offset, partition_leader_epoch=epoch)
            )


class NoBrokers:
    """Metadata with no live broker: the fetcher's own loop stays idle while the test drives it."""

    def brokers(self) -> dict[int, Any]:
        return {}


class LeaderStub:
    """Answers OffsetForLeaderEpoch from a real leader log."""

    def __init__(self, log: PartitionLog):
        self.log = log
        self.asked: list[int] = []

    async def request(self, api: ApiKey, version: int, body: dict[str, Any], timeout_s: float) -> Any:
        assert api is ApiKey.OFFSET_FOR_LEADER_EPOCH
        topics = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                self.asked.append(p["leader_epoch"])
                epoch, end = self.log.end_offset_for_epoch(p["leader_epoch"])
                parts.append(
                    {"partition": p["partition"], "error_code": 0, "leader_epoch": epoch, "end_offset": end}
                )
            topics.append({"topic": t["topic"], "partitions": parts})
        return {"topics": topics}


def test_fetcher_asks_again_until_it_knows_where_the_logs_part(tmp_path: Path) -> None:
    leader_log = PartitionLog.open(tmp_path / "leader", LogConfig())
    _write(leader_log, [(0, 0), (1, 5), (3, 12)], 20, b"leader")
    follower = Partition.open(tmp_path / "follower", "t", 0, uuid.uuid4(), {}, broker_id=2)
    _write(follower.log, [(0, 0), (2, 10)], 15, b"follower")
    follower.become_follower(leader=1, leader_epoch=3, replicas=(1, 2))
    stub = LeaderStub(leader_log)

    async def run() -> None:
        fetcher = LeaderFetcher(FetcherManager(2, NoBrokers()), leader_id=1)  # type: ignore[arg-type]
        fetcher.partitions[("t", 0)] = follower
        try:
            await fetcher._truncate(stub)  # type: ignore[arg-type]
        finally:
            fetcher.stop()

    asyncio.run(run())
    assert stub.asked == [2, 0]
    assert follower.log.log_end_offset == 5 and not follower.needs_truncation
    kept = follower.log.read(0, max_bytes=1 << 20).records
    assert [h.partition_leader_epoch for _pos, h in iter_batches(kept)] == [0] * 5
    follower.close()
    leader_log.close()

"""Retention never deletes what is not yet committed, and LogAppendTime keeps fresh records of
an old source.

Change topics carry the source's commit time as record timestamps: capturing binlog older than
``retention.ms`` made every segment deletable as soon as it rolled. Before the high watermark
bound, the broker's retention deleted such segments while a follower still lacked them: the
first test failed with ``AssertionError: retention deleted up to 12, above the high watermark 3``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.broker.partition import Partition
from sluice.broker.replica_manager import ReplicaManager
from sluice.protocol.records import TIMESTAMP_LOG_APPEND_TIME, iter_batches
from tests.unit._storage_helpers import Clock, batch, found_at, open_log, read_all

DAY_MS = 24 * 3600 * 1000
NOW_MS = 1_800_000_000_000
#: Commit times of a binlog captured ten days late.
OLD_MS = NOW_MS - 10 * DAY_MS
ONE_BATCH = len(batch(3)) + 10  # segment.bytes that rolls after every batch


class NoMetadata:
    def topic(self, name: str) -> None:
        return None

    def brokers(self) -> dict[int, Any]:
        return {}


def _leader(root: Path, config: dict[str, str]) -> Partition:
    part = Partition.open(root, "changes", 0, uuid.uuid4(), config, broker_id=1)
    part.become_leader(0, (1, 2), (1, 2), 0.0)
    return part


def test_broker_retention_never_deletes_at_or_above_the_high_watermark(tmp_path: Path) -> None:
    manager = ReplicaManager(1, tmp_path, NoMetadata())  # type: ignore[arg-type]
    part = _leader(tmp_path, {"retention.ms": "60000", "segment.bytes": str(ONE_BATCH)})
    manager.partitions[("changes", 0)] = part
    for i in range(5):
        part.append(batch(3, ts=OLD_MS + i))
    part.record_follower_fetch(2, 3, 0.0)  # the follower has offsets 0..2 only
    assert (part.high_watermark, part.log.log_end_offset, part.log.segment_count) == (3, 15, 5)

    manager.enforce_retention(NOW_MS)
    if part.log.log_start_offset > part.high_watermark:
        start, hw = part.log.log_start_offset, part.high_watermark
        raise AssertionError(f"retention deleted up to {start}, above the high watermark {hw}")
    assert part.log.log_start_offset == 3, "the segment wholly below the high watermark goes"

    part.record_follower_fetch(2, 10, 0.0)
    manager.enforce_retention(NOW_MS)
    assert part.log.log_start_offset == 9, "segments up to the one holding the HW go, not that one"
    part.record_follower_fetch(2, 15, 0.0)
    manager.enforce_retention(NOW_MS)
    assert part.log.log_start_offset == 12, "never the active segment"
    manager.close_all()


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8),
    hw_frac=st.floats(0, 1),
    retention_ms=st.sampled_from([0, 1000, 60_000]),
)
def test_nothing_at_or_above_the_high_watermark_is_deleted(
    tmp_path_factory: Any, sizes: list[int], hw_frac: float, retention_ms: int
) -> None:
    log = open_log(tmp_path_factory.mktemp("log"), Clock(NOW_MS), segment_bytes=len(batch(4)) + 10,
                   retention_ms=retention_ms)  # fmt: skip
    for n in sizes:
        log.append_as_leader(batch(n, ts=OLD_MS), leader_epoch=0)
    hw = int(log.log_end_offset * hw_frac)
    before = read_all(log)
    log.delete_old_segments(NOW_MS, high_watermark=hw)
    assert log.log_start_offset <= hw or log.log_start_offset == before[0]
    assert read_all(log) == [o for o in before if o >= log.log_start_offset]
    assert [o for o in before if o >= hw] == [o for o in read_all(log) if o >= hw]
    log.close()


def test_log_append_time_keeps_fresh_records_of_an_old_source(tmp_path: Path) -> None:
    for timestamp_type, kept in (("CreateTime", 1), ("LogAppendTime", 5)):
        log = open_log(tmp_path / timestamp_type, Clock(NOW_MS), segment_bytes=ONE_BATCH, retention_ms=60_000,
                       message_timestamp_type=timestamp_type)  # fmt: skip
        for i in range(5):
            log.append_as_leader(batch(3, ts=OLD_MS + i), leader_epoch=0)
        log.delete_old_segments(NOW_MS, high_watermark=log.log_end_offset)
        assert log.segment_count == kept, timestamp_type
        log.close()


def test_follower_keeps_the_leaders_append_time(tmp_path: Path) -> None:
    config = {"message.timestamp.type": "LogAppendTime"}
    leader = open_log(tmp_path / "leader", Clock(NOW_MS), message_timestamp_type="LogAppendTime")
    info = leader.append_as_leader(batch(3, ts=OLD_MS), leader_epoch=0)
    assert info.log_append_time == NOW_MS
    stamped = leader.read(0, max_bytes=1 << 20).records
    ((_pos, header),) = list(iter_batches(stamped))
    assert header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME and header.max_timestamp == NOW_MS
    follower = Partition.open(tmp_path, "changes", 0, uuid.uuid4(), config, broker_id=2)
    follower.become_follower(1, 0, (1, 2))
    follower.log._now_ms = Clock(NOW_MS + DAY_MS)  # its own clock is a day ahead
    follower.append_as_follower(stamped, leader_hw=3)
    assert follower.log.read(0, max_bytes=1 << 20).records == stamped
    assert found_at(follower.log.offset_for_timestamp(NOW_MS)) == (0, NOW_MS)
    assert follower.log.delete_old_segments(NOW_MS + 30_000, high_watermark=3) == 0
    follower.close()
    leader.close()

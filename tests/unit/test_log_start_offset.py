"""DeleteRecords (KIP-107) on one log: ``PartitionLog.advance_log_start`` moves the log start,
possibly inside a segment; reads below it are out of range, segments wholly below it go, and the
start survives a restart and a crash between its checkpoint and the segment deletions."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.storage.errors import OffsetOutOfRangeError
from sluice.storage.log import LOG_START_OFFSET_FILE
from tests.unit._storage_helpers import batch, open_log, read_all

ONE_BATCH = len(batch(3)) + 10  # segment.bytes that rolls after every batch of three records


def test_the_log_start_moves_inside_a_segment_and_survives_a_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=ONE_BATCH)
    for _ in range(5):
        log.append_as_leader(batch(3), leader_epoch=0)
    assert (log.log_start_offset, log.log_end_offset, log.segment_count) == (0, 15, 5)

    assert log.advance_log_start(7)
    assert log.log_start_offset == 7
    assert log.segment_count == 3, "segments 0-2 and 3-5 lie wholly below offset 7 and go"
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, max_bytes=1 << 20)
    assert log.read(7, max_bytes=1 << 20).first_offset == 6, "the batch holding the start, whole (Kafka's)"
    assert read_all(log) == list(range(7, 15))
    assert not log.advance_log_start(5), "the start never moves back"
    log.close()

    again = open_log(tmp_path, segment_bytes=ONE_BATCH)
    assert again.log_start_offset == 7
    with pytest.raises(OffsetOutOfRangeError):
        again.read(6, max_bytes=1 << 20)
    again.close()


def test_a_crash_after_the_checkpoint_and_before_the_deletions_brings_nothing_back(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=ONE_BATCH)
    for _ in range(4):
        log.append_as_leader(batch(3), leader_epoch=0)
    log.flush()
    # The checkpoint is written first; a crash leaves every segment where it was.
    (tmp_path / LOG_START_OFFSET_FILE).write_text("9\n")
    log.abandon()
    reopened = open_log(tmp_path, segment_bytes=ONE_BATCH)
    assert reopened.log_start_offset == 9
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read(3, max_bytes=1 << 20)
    reopened.close()


def test_a_log_that_ends_before_its_recorded_start_starts_there_empty(tmp_path: Path) -> None:
    """A follower that restarts with a checkpointed start past its log end (it had not fetched
    that far): Kafka's rule, the log starts there, empty."""
    log = open_log(tmp_path, segment_bytes=ONE_BATCH)
    log.append_as_leader(batch(3), leader_epoch=0)
    log.close()
    (tmp_path / LOG_START_OFFSET_FILE).write_text("20\n")
    reopened = open_log(tmp_path, segment_bytes=ONE_BATCH)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (20, 20)
    reopened.close()


def test_the_start_cannot_pass_the_log_end(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(3), leader_epoch=0)
    with pytest.raises(OffsetOutOfRangeError):
        log.advance_log_start(4)
    assert log.log_start_offset == 0
    log.close()


def test_truncating_below_a_moved_start_restarts_the_log_there(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=ONE_BATCH)
    for _ in range(3):
        log.append_as_leader(batch(3), leader_epoch=0)
    log.advance_log_start(4)
    log.truncate_to(2)  # below the start: the log restarts, empty, at 2
    assert (log.log_start_offset, log.log_end_offset) == (2, 2)
    log.close()


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.integers(1, 4), min_size=1, max_size=8),
    moves=st.lists(st.integers(0, 40), max_size=5),
)
def test_reads_never_return_a_batch_wholly_below_the_start(
    tmp_path_factory: pytest.TempPathFactory, batches: list[int], moves: list[int]
) -> None:
    path = tmp_path_factory.mktemp("log")
    log = open_log(path, segment_bytes=len(batch(4)) + 10)
    for n in batches:
        log.append_as_leader(batch(n), leader_epoch=0)
    highest = 0
    for move in moves:
        target = min(move, log.log_end_offset)
        log.advance_log_start(target)
        highest = max(highest, target)
        assert log.log_start_offset == highest
        assert read_all(log) == list(range(highest, log.log_end_offset))
        if highest < log.log_end_offset:
            first = log.read(highest, max_bytes=1 << 20).first_offset
            assert highest - 4 < first <= highest, "only the batch holding the start reaches below it"
        if highest > 0:
            with pytest.raises(OffsetOutOfRangeError):
                log.read(highest - 1, max_bytes=1 << 20)
    log.close()
    reopened = open_log(path, segment_bytes=len(batch(4)) + 10)
    assert reopened.log_start_offset == highest
    reopened.close()

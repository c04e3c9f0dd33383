"""Idempotent producer state: duplicates, gaps, epochs, persistence across clean and unclean restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.protocol.records import BatchHeader
from sluice.storage import InvalidProducerEpochError, OutOfOrderSequenceError, PartitionLog
from sluice.storage.producer_state import ProducerStateManager
from tests.unit._storage_helpers import batch, open_log


def _p(n: int, seq: int, *, pid: int = 1, epoch: int = 0) -> bytes:
    return batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def test_duplicate_returns_original_offsets(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    log.append_as_leader(batch(2), leader_epoch=0)
    first = log.append_as_leader(_p(3, 0), leader_epoch=0)
    assert (first.first_offset, first.last_offset) == (2, 4)
    log.append_as_leader(_p(2, 3), leader_epoch=0)
    size = log.size_bytes
    dup = log.append_as_leader(_p(3, 0), leader_epoch=0)
    assert dup.duplicate and (dup.first_offset, dup.last_offset, dup.record_count) == (2, 4, 3)
    assert log.size_bytes == size and log.log_end_offset == 7
    nxt = log.append_as_leader(_p(1, 5), leader_epoch=0)
    assert nxt.first_offset == 7 and not nxt.duplicate


def test_only_last_five_batches_are_remembered(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for seq in range(7):
        log.append_as_leader(_p(1, seq), leader_epoch=0)
    assert log.append_as_leader(_p(1, 2), leader_epoch=0).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(_p(1, 1), leader_epoch=0)  # evicted: no longer recognisable


def test_sequence_gaps_and_epochs(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    with pytest.raises(OutOfOrderSequenceError, match="unknown producer"):
        log.append_as_leader(_p(1, 5), leader_epoch=0)
    log.append_as_leader(_p(2, 0), leader_epoch=0)
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2, got 3"):
        log.append_as_leader(_p(1, 3), leader_epoch=0)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
        log.append_as_leader(_p(1, 2, epoch=1), leader_epoch=0)
    log.append_as_leader(_p(1, 0, epoch=1), leader_epoch=0)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(_p(1, 2, epoch=0), leader_epoch=0)
    # A duplicate of an old-epoch batch is not a duplicate any more: it is fenced.
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(_p(2, 0, epoch=0), leader_epoch=0)
    assert log.log_end_offset == 3
    # Non-idempotent batches and other producers are independent.
    log.append_as_leader(batch(1), leader_epoch=0)
    log.append_as_leader(_p(1, 0, pid=2), leader_epoch=0)
    assert log.log_end_offset == 5


def test_multiple_batches_in_one_append_chain(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    info = log.append_as_leader(_p(2, 0) + _p(3, 2) + _p(1, 0, pid=9), leader_epoch=0)
    assert (info.first_offset, info.last_offset) == (0, 5)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(_p(1, 5) + _p(1, 7), leader_epoch=0)
    assert log.log_end_offset == 6  # nothing appended from the failed request


def test_sequence_wraps_past_int32_max() -> None:
    mgr = ProducerStateManager()
    top = 2**31 - 1

    def header(seq: int, n: int, offset: int) -> BatchHeader:
        return BatchHeader(offset, 100, 0, 2, 0, 0, n - 1, 0, 0, 4, 0, seq, n)

    mgr.update(header(top - 1, 2, 0))  # top-1, top
    assert mgr.check([header(0, 3, 2)]) is None  # wraps to 0
    mgr.update(header(0, 3, 2))
    with pytest.raises(OutOfOrderSequenceError):
        mgr.check([header(4, 1, 5)])
    assert mgr.check([header(top - 1, 2, 99)]) is not None  # still cached: duplicate


@pytest.mark.parametrize("clean", [True, False])
def test_state_survives_restart(tmp_path: Path, clean: bool) -> None:
    log = open_log(tmp_path / "p", segment_bytes=500)
    for seq in range(0, 40, 4):
        log.append_as_leader(_p(4, seq, epoch=3), leader_epoch=0)
    if clean:
        log.close()
    else:
        log.abandon()
    log = open_log(tmp_path / "p", segment_bytes=500)
    dup = log.append_as_leader(_p(4, 36, epoch=3), leader_epoch=0)
    assert dup.duplicate and dup.first_offset == 36
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(_p(1, 41, epoch=3), leader_epoch=0)
    assert log.append_as_leader(_p(1, 40, epoch=3), leader_epoch=0).first_offset == 40


def test_truncation_rebuilds_producer_state(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p", segment_bytes=400)
    for seq in range(10):
        log.append_as_leader(_p(1, seq), leader_epoch=0)
    log.truncate_to(6)
    # sequences 6.. are gone: 6 is next again, and a retry of 8 is out of order
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(_p(1, 8), leader_epoch=0)
    assert log.append_as_leader(_p(1, 6), leader_epoch=0).first_offset == 6


def test_corrupt_snapshot_is_ignored(tmp_path: Path) -> None:
    log = open_log(tmp_path / "p")
    for seq in range(3):
        log.append_as_leader(_p(1, seq), leader_epoch=0)
    log.close()
    snaps = sorted((tmp_path / "p").glob("*.snapshot"))
    assert snaps
    snaps[-1].write_bytes(snaps[-1].read_bytes()[:-2])
    log = PartitionLog.open(tmp_path / "p", log.config)
    assert log.append_as_leader(_p(1, 2), leader_epoch=0).duplicate
    with pytest.raises(ValueError):
        ProducerStateManager.from_bytes(b"SLPS\0\0\0\0[]x")


def test_follower_updates_producer_state(tmp_path: Path) -> None:
    leader = open_log(tmp_path / "l")
    for seq in range(3):
        leader.append_as_leader(_p(1, seq), leader_epoch=2)
    follower = open_log(tmp_path / "f")
    follower.append_as_follower(leader.read(0, max_bytes=1 << 20).records)
    # the follower, once leader, recognises the retry
    assert follower.append_as_leader(_p(1, 2), leader_epoch=3).duplicate

"""A new replica's log is created without a single fsync (creating 10,000 partitions was bound by
them) and becomes durable at its first flush: every file of its directory, the directory and the
directory's entry in the data directory are fsynced before the flush fsyncs its data."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from sluice.broker.partition import METADATA_FILE, Partition
from sluice.protocol.records import build_batch
from sluice.storage.leader_epoch import LEADER_EPOCH_CHECKPOINT


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths fsynced, in order."""
    seen: list[str] = []
    real = os.fsync

    def record(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    return seen


def test_a_new_log_is_fsynced_at_its_first_flush_and_not_before(tmp_path: Path, fsynced: list[str]) -> None:
    part = Partition.open(tmp_path, "t", 0, uuid.uuid4(), {}, 1)
    part.become_leader(3, (1,), (1,), 0.0)
    part.append(build_batch([(b"k", b"v")]))
    assert fsynced == [], "creating a replica and leading it fsyncs nothing"

    part.log.flush()
    d = str(tmp_path / "t-0")
    data = [p for p in fsynced if p.endswith(".log")]
    assert data, fsynced
    first_data = fsynced.index(data[0])
    before = fsynced[:first_data]
    for name in (METADATA_FILE, LEADER_EPOCH_CHECKPOINT):
        assert f"{d}/{name}" in before, (name, fsynced)
    assert d in before and str(tmp_path) in before, fsynced

    fsynced.clear()
    part.become_leader(4, (1,), (1,), 0.0)  # an epoch change of a durable log is fsynced at once
    assert f"{d}/{LEADER_EPOCH_CHECKPOINT}.tmp" in fsynced or f"{d}/{LEADER_EPOCH_CHECKPOINT}" in fsynced
    part.close()


def test_an_existing_log_reopened_is_durable_from_the_start(tmp_path: Path, fsynced: list[str]) -> None:
    tid = uuid.uuid4()
    Partition.open(tmp_path, "t", 0, tid, {}, 1).close()
    fsynced.clear()
    part = Partition.open(tmp_path, "t", 0, tid, {}, 1)
    part.become_leader(1, (1,), (1,), 0.0)
    assert any(p.endswith(LEADER_EPOCH_CHECKPOINT + ".tmp") for p in fsynced), fsynced
    part.close()


def test_a_new_log_writes_nothing_into_its_directory_until_its_first_record(tmp_path: Path) -> None:
    """Creating a replica makes a directory and no file: its metadata, its leader-epoch
    checkpoint and its first segment file are written with its first record, before it. A log
    closed, or left by a crash, before that reopens empty at offset 0, which is what it was."""
    tid = uuid.uuid4()
    d = tmp_path / "t-0"
    part = Partition.open(tmp_path, "t", 0, tid, {}, 1)
    part.become_leader(1, (1,), (1,), 0.0)
    assert sorted(p.name for p in d.iterdir()) == []
    assert part.log.epoch_entries == [(1, 0)]
    assert part.log.read(0, max_bytes=1 << 20).records == b""
    part.close()
    assert not list(d.glob("*.log")) and Partition.read_topic_id(d) is None

    again = Partition.open(tmp_path, "t", 0, tid, {}, 1)
    assert (again.log.log_start_offset, again.log.log_end_offset) == (0, 0)
    again.close()
    shutil.rmtree(d)

    part = Partition.open(tmp_path, "t", 0, tid, {}, 1)
    part.become_leader(2, (1,), (1,), 0.0)
    part.append(build_batch([(b"k", b"v")]))
    assert [p.name for p in d.glob("*.log")] == ["00000000000000000000.log"]
    assert Partition.read_topic_id(d) == tid
    # A crash (no close, no flush): the record, its epoch and the topic id are all found.
    reopened = Partition.open(tmp_path, "t", 0, tid, {}, 1)
    assert reopened.log.log_end_offset == 1
    assert reopened.log.epoch_entries == [(2, 0)]
    reopened.close()
    part.close()

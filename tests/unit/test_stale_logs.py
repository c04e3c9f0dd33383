"""A partition directory left by an earlier topic of the same name is never served as the new
topic's log: its ``partition.metadata`` names another topic id (or none), so it is moved aside.

Before the check, ``Partition.open`` rewrote the metadata with the new id and served the old
records (``assert 5 == 0`` on the new topic's log end), and a broker that missed the deletion
kept serving the old partition under the new topic's state."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from sluice.broker.partition import METADATA_FILE, Partition
from sluice.broker.replica_manager import ReplicaManager
from sluice.cluster.layout import PartitionState, TopicAssignment
from sluice.protocol.records import build_batch


def _with_records(root: Path, topic_id: uuid.UUID, n: int = 5) -> None:
    part = Partition.open(root, "t", 0, topic_id, {}, broker_id=1)
    part.become_leader(0, (1,), (1,), 0.0)
    part.append(build_batch([(b"k", b"old")] * n))
    part.close()


def _new_id_written_with_first_record(part: Partition, new_id: uuid.UUID) -> None:
    """A new log writes its metadata with its first record: an empty directory without an id
    is opened as the current topic's (``local_log_action``), which it is."""
    directory = part.log.directory
    assert Partition.read_topic_id(directory) is None and not list(directory.glob("*.log"))
    part.append(build_batch([(b"k", b"new")]))
    assert Partition.read_topic_id(directory) == new_id


def _left_in(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


def test_open_moves_aside_the_log_of_a_deleted_topic(tmp_path: Path) -> None:
    old_id, new_id = uuid.uuid4(), uuid.uuid4()
    _with_records(tmp_path, old_id)
    part = Partition.open(tmp_path, "t", 0, new_id, {}, broker_id=1)
    assert part.log.log_end_offset == 0 and part.log.log_start_offset == 0
    assert _left_in(tmp_path) == ["t-0"], "the old log is deleted, not kept under another name"
    part.become_leader(1, (1,), (1,), 0.0)
    _new_id_written_with_first_record(part, new_id)
    assert _left_in(tmp_path) == ["t-0"], "the old log is deleted, not kept under another name"
    part.close()


def test_open_keeps_a_log_of_unknown_topic_aside_without_serving_it(tmp_path: Path) -> None:
    _with_records(tmp_path, uuid.uuid4())
    (tmp_path / "t-0" / METADATA_FILE).unlink()
    part = Partition.open(tmp_path, "t", 0, uuid.uuid4(), {}, broker_id=1)
    assert part.log.log_end_offset == 0
    stray = [name for name in _left_in(tmp_path) if name.endswith("-stray")]
    assert len(stray) == 1 and stray[0].startswith("t-0."), _left_in(tmp_path)
    assert any(p.suffix == ".log" and p.stat().st_size > 0 for p in (tmp_path / stray[0]).iterdir())
    part.close()


def test_open_reuses_its_own_log(tmp_path: Path) -> None:
    topic_id = uuid.uuid4()
    _with_records(tmp_path, topic_id)
    part = Partition.open(tmp_path, "t", 0, topic_id, {}, broker_id=1)
    assert part.log.log_end_offset == 5
    part.close()


class Metadata:
    def __init__(self, assignment: TopicAssignment, state: PartitionState):
        self.assignment, self.state = assignment, state

    def topic(self, name: str) -> TopicAssignment | None:
        return self.assignment if name == self.assignment.name else None

    def partition_state(self, topic: str, index: int) -> tuple[PartitionState, int] | None:
        return (self.state, 0) if (topic, index) == ("t", 0) else None

    def brokers(self) -> dict[int, Any]:
        return {}


def test_a_broker_that_missed_the_deletion_replaces_the_old_replica(tmp_path: Path) -> None:
    """The topic was deleted and created again while this broker was paused: it sees the new
    topic (new id) and its partition state without ever seeing the deletion."""
    old_id, new_id = uuid.uuid4(), uuid.uuid4()
    metadata = Metadata(TopicAssignment("t", new_id, {0: (1,)}, {}), PartitionState(1, 0, (1,), 1))
    manager = ReplicaManager(1, tmp_path, metadata)  # type: ignore[arg-type]
    old = Partition.open(tmp_path, "t", 0, old_id, {}, broker_id=1)
    old.become_leader(0, (1,), (1,), 0.0)
    old.append(build_batch([(b"k", b"old")] * 5))
    manager.partitions[("t", 0)] = old

    manager.on_topic_changed("t")

    part = manager.partitions[("t", 0)]
    assert part is not old and part.topic_id == new_id
    assert part.is_leader and part.log.log_end_offset == 0
    _new_id_written_with_first_record(part, new_id)
    assert _left_in(tmp_path) == ["t-0"]
    manager.close_all()


def test_startup_moves_aside_logs_of_deleted_or_unknown_topics(tmp_path: Path) -> None:
    current, deleted = uuid.uuid4(), uuid.uuid4()
    _with_records(tmp_path, deleted)
    (tmp_path / "t-0").rename(tmp_path / "gone-0")
    _with_records(tmp_path, uuid.uuid4())  # t-0, but of an earlier topic t
    (tmp_path / "t-0" / METADATA_FILE).unlink()
    (tmp_path / "t-0.0123456789abcdef0123456789abcdef-delete").mkdir()  # a deletion cut short
    metadata = Metadata(TopicAssignment("t", current, {0: (1,)}, {}), PartitionState(1, 0, (1,), 1))
    manager = ReplicaManager(1, tmp_path, metadata)  # type: ignore[arg-type]

    manager.load_local_logs({"t": metadata.assignment})

    assert not manager.partitions, "nothing of an earlier or unknown topic is opened"
    left = _left_in(tmp_path)
    assert "gone-0" not in left and not any(name.endswith("-delete") for name in left), left
    assert len([name for name in left if name.endswith("-stray")]) == 1, left
    manager.on_topic_changed("t")
    assert manager.partitions[("t", 0)].log.log_end_offset == 0
    manager.close_all()

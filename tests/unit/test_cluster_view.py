"""The pieces that let the controller and brokers follow thousands of partitions by what
changed: the state-change notice codec, multi-op chunking under ZooKeeper's request limit, the
one decision rule per partition, and the view's rule that a state is applied only when newer."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.cluster import layout
from sluice.cluster.election import initial_partition_state, next_partition_state
from sluice.cluster.layout import PartitionState, StateChanges, StateWrite, TopicAssignment, chunk_by_size
from sluice.cluster.view import ClusterView

TOPIC_ID = uuid.uuid4()


def test_state_change_notice_roundtrips() -> None:
    writes = tuple(
        StateWrite("t", TOPIC_ID, p, PartitionState(p % 3 + 1, p, (p % 3 + 1, 2), 7), p + 1) for p in range(5)
    )
    notice = StateChanges("controller 1 epoch 7", 123, writes)
    assert StateChanges.decode(notice.encode()) == notice


@settings(deadline=None)  # what it checks is not timing; a loaded machine is slow
@given(st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=5), max_size=60), st.integers(100, 2000))
def test_chunks_keep_groups_whole_in_order_and_under_the_limit(groups: list[list[int]], limit: int) -> None:
    chunks = chunk_by_size(groups, lambda n: n, limit)
    assert [x for c in chunks for x in c] == [x for g in groups for x in g]
    for chunk in chunks:
        # over the limit only when one group alone is
        assert sum(chunk) <= limit or any(sum(g) > limit and g == chunk for g in groups)
    # a 10,000-partition change stays within a few multi-ops of 512 KB
    many = [[300, 200] for _ in range(10_000)]
    assert len(chunk_by_size(many, lambda n: n)) == 10


def test_next_state_elects_drops_followers_and_moves_off_shutting_down() -> None:
    s = PartitionState(1, 4, (1, 2, 3), 2)
    assert (
        next_partition_state(s, (1, 2, 3), {1, 2, 3}, set(), unclean_allowed=False, controller_epoch=9)
        is None
    )
    dropped = next_partition_state(s, (1, 2, 3), {1, 2}, set(), unclean_allowed=False, controller_epoch=9)
    assert dropped is not None and dropped.state == PartitionState(1, 4, (1, 2), 2)  # leader epoch kept
    elected = next_partition_state(s, (1, 2, 3), {2, 3}, set(), unclean_allowed=False, controller_epoch=9)
    assert elected is not None and elected.state == PartitionState(2, 5, (2, 3), 9)
    moved = next_partition_state(s, (1, 2, 3), {2, 3}, {1}, unclean_allowed=False, controller_epoch=9)
    assert moved is not None and moved.state == PartitionState(2, 5, (2, 3), 9)
    offline = next_partition_state(s, (1, 2, 3), {4}, set(), unclean_allowed=False, controller_epoch=9)
    assert offline is not None and offline.state == PartitionState(-1, 5, (1, 2, 3), 9)  # I6: ISR kept
    unclean = next_partition_state(
        PartitionState(3, 4, (3,), 2), (3, 1), {1}, set(), unclean_allowed=True, controller_epoch=9
    )
    assert unclean is not None and unclean.unclean and unclean.state == PartitionState(1, 5, (1,), 9)
    assert initial_partition_state((3, 1, 2), {1, 2}, 9) == PartitionState(1, 0, (1, 2), 9)
    assert initial_partition_state((3, 1), set(), 9) == PartitionState(-1, 0, (3, 1), 9)


def test_a_restarted_leader_is_replaced_with_a_new_leader_epoch() -> None:
    """A broker that re-registered (new broker epoch) is left out of `live` for the decision:
    leadership moves and the leader epoch grows, so its followers truncate again (KIP-380).
    Comparing broker ids alone, the decision was None: the restarted broker kept leading at the
    same epoch."""
    s = PartitionState(1, 4, (1, 2, 3), 2)
    decided = next_partition_state(s, (1, 2, 3), {2, 3}, set(), unclean_allowed=False, controller_epoch=3)
    assert decided is not None and decided.state.leader == 2 and decided.state.leader_epoch == 5


class FakeStore:
    """Just enough of ZkStore for the view's apply rules (no ZooKeeper)."""

    def __init__(self) -> None:
        self.reads: dict[str, tuple[bytes, Any] | None] = {}
        self.child_names: dict[str, list[str]] = {}

    def add_session_listener(self, _listener: Any) -> None:
        pass

    def read_many(self, paths: Any) -> dict[str, Any]:
        return {p: self.reads.get(p) for p in paths}

    def read(self, path: str) -> tuple[bytes, Any] | None:
        return self.reads.get(path)

    def children(self, path: str) -> list[str] | None:
        return self.child_names.get(path)


def _view_with_topic(topic_id: uuid.UUID = TOPIC_ID) -> tuple[ClusterView, list[tuple[str, str, int]]]:
    told: list[tuple[str, str, int]] = []
    view = ClusterView(FakeStore(), lambda *a: told.append(a))  # type: ignore[arg-type]
    view._topics["t"] = TopicAssignment("t", topic_id, {0: (1, 2), 1: (2, 1)})
    return view, told


@settings(deadline=None)
@given(st.permutations(range(1, 8)))
def test_states_apply_in_any_arrival_order_and_the_newest_version_wins(order: list[int]) -> None:
    view, told = _view_with_topic()
    for v in order:
        view.apply_writes([StateWrite("t", TOPIC_ID, 0, PartitionState(v % 2 + 1, v, (1, 2), 1), v)])
    assert view.partition_state("t", 0) == (PartitionState(7 % 2 + 1, 7, (1, 2), 1), 7)
    # each applied state told once; a late older one is ignored, not told
    assert len(told) == sum(1 for i, v in enumerate(order) if v > max(order[:i], default=0))


def test_a_notice_about_an_earlier_topic_of_the_same_name_is_ignored() -> None:
    view, _ = _view_with_topic()
    old = StateWrite("t", uuid.uuid4(), 0, PartitionState(2, 9, (2,), 1), 50)
    assert view.apply_writes([old]) == []
    assert view.partition_state("t", 0) is None


def test_a_state_read_from_an_earlier_topic_of_the_same_name_is_ignored() -> None:
    view, _ = _view_with_topic()
    view._topic_czxid["t"] = 100
    store: FakeStore = view._store  # type: ignore[assignment]
    path = layout.partition_state_path("t", 0)
    store.reads[path] = (PartitionState(1, 0, (1, 2), 1).encode(), SimpleNamespace(czxid=99, version=3))
    assert view.read_states("t", [0]) == []
    store.reads[path] = (PartitionState(1, 0, (1, 2), 1).encode(), SimpleNamespace(czxid=101, version=0))
    assert view.read_states("t", [0]) == [("t", 0)]


def test_verify_repairs_a_hand_edit_the_notices_did_not_carry() -> None:
    view, _ = _view_with_topic()
    view.apply_writes([StateWrite("t", TOPIC_ID, 0, PartitionState(1, 3, (1, 2), 1), 4)])
    store: FakeStore = view._store  # type: ignore[assignment]
    edited = PartitionState(-1, 4, (2,), 1)
    store.reads[layout.partition_state_path("t", 0)] = (edited.encode(), SimpleNamespace(czxid=1, version=5))
    assert view.read_states("t", [0], repair=True) == [("t", 0)]
    assert view.partition_state("t", 0) == (edited, 5)


def test_a_topic_created_again_unseen_by_the_topic_watches_is_read_when_a_notice_names_it() -> None:
    """The topic was deleted and created again between two looks at the topic list, and its
    watch saw only the deletion: the list never showed it missing, so nothing read the new
    topic, and every broker answered "unknown partition" for it (a CI run's
    test_a_topic_created_again_never_serves_the_old_topics_records). The notice of its new
    partition states names a topic id the view does not hold: the view reads the topic."""
    new_id = uuid.uuid4()
    znodes: dict[str, tuple[bytes, Any]] = {
        layout.topic_path("t"): (TopicAssignment("t", new_id, {0: (1,)}).encode(), SimpleNamespace(czxid=10)),
    }
    state = PartitionState(1, 0, (1,), 1)
    notice = StateChanges("controller 1 epoch 1", 1, (StateWrite("t", new_id, 0, state, 0),))
    znodes[f"{layout.STATE_CHANGES}/change-0000000007"] = (notice.encode(), SimpleNamespace(czxid=11))

    store = FakeStore()
    store.reads = znodes  # type: ignore[assignment]
    store.child_names = {layout.partitions_path("t"): ["0"]}
    store.watch_data = lambda *_a: None  # type: ignore[attr-defined]
    view = ClusterView(store)  # type: ignore[arg-type]
    view._topic_gone("t")  # the old topic's watch saw the deletion, nothing more
    view._notices_changed(["change-0000000007"])
    assert view.topic("t") == TopicAssignment("t", new_id, {0: (1,)})
    assert view.partition_state("t", 0) == (state, 0)

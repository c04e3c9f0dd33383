"""A task's execution history in ZooKeeper (`/tasks/{id}/executions/`): newest last, bounded,
each entry completed in place, and never a reason to bring a deleted task back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.exceptions import NoNodeError

from sluice.cluster.zkstore import ZkStore
from sluice.sync.tasks import EXECUTIONS_KEPT, TaskStore, parse_spec

SPEC = {"id": "hist", "source": {"kind": "generator"}, "target": "sqlite:///t.db"}


@pytest.fixture
def store(zookeeper: str) -> Iterator[TaskStore]:
    zk = ZkStore(f"{zookeeper.split('/')[0]}/t-{uuid.uuid4().hex[:8]}")
    zk.start()
    try:
        yield TaskStore(zk.client)
    finally:
        zk.stop()


def entry(n: int, outcome: str = "running") -> dict[str, object]:
    return {
        "execution": f"x{n}", "epoch": n, "worker": "w1", "started": float(n),
        "ended": None if outcome == "running" else n + 0.5, "outcome": outcome, "error": None,
    }  # fmt: skip


def test_the_history_keeps_the_newest_executions_and_completes_each_in_place(store: TaskStore) -> None:
    store.create(parse_spec(SPEC))
    assert store.executions("hist") == []
    for n in range(1, EXECUTIONS_KEPT + 6):
        node = store.record_execution("hist", entry(n))
        store.record_execution("hist", entry(n, "stopped"), node=node)
    node = store.record_execution("hist", entry(99))
    history = store.executions("hist")
    assert len(history) == EXECUTIONS_KEPT
    assert [h["epoch"] for h in history] == [*range(7, EXECUTIONS_KEPT + 6), 99]  # oldest gone first
    assert history[-1]["outcome"] == "running" and history[-1]["ended"] is None
    store.record_execution("hist", {**entry(99, "failed"), "error": "apply failed: target down"}, node=node)
    assert store.executions("hist")[-1] == {**entry(99, "failed"), "error": "apply failed: target down"}


def test_a_task_created_before_the_history_gets_it_and_a_deleted_task_stays_deleted(store: TaskStore) -> None:
    store.create(parse_spec(SPEC))
    store.zk.delete("/tasks/hist/executions")  # as a task created before execution history
    store.record_execution("hist", entry(1))
    assert [h["execution"] for h in store.executions("hist")] == ["x1"]
    store.delete("hist")
    with pytest.raises(NoNodeError):  # the execution logs it and goes on
        store.record_execution("hist", entry(2))
    assert store.ids() == []
    assert store.executions("hist") == []

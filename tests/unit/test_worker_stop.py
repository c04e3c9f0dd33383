"""A worker's stop ends within its bound whatever ZooKeeper does (issue 32): the pieces.

The whole (a worker process, its ZooKeeper killed, SIGTERM) is
tests/integration/test_stop_without_zookeeper.py; here each rule on its own: the session closed
once ZooKeeper is unreachable, and closed once; the loop leaving quietly when that close ends the
call it was in; the tasks stopped all at once on one deadline; no retry or alarm for a start the
stop cut short; an execution's end left to the session without ZooKeeper; an apply query's stop
letting the batch in flight finish and committing nothing after it.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from kazoo.exceptions import ConnectionClosedError
from kazoo.protocol.states import KazooState

from sluice.cluster.zkstore import ZkStore
from sluice.pipeline import worker as worker_module
from sluice.pipeline.apply import ApplyQuery
from sluice.pipeline.worker import Worker
from tests.unit.test_metrics import FakeTaskStore, _execution

# -- the ZooKeeper session at stop ---------------------------------------------------------------


def never_started_store(monkeypatch: pytest.MonkeyPatch, connected: bool) -> tuple[ZkStore, list[str]]:
    """A ZkStore whose kazoo client never connects, seen as ``connected`` or not; the list
    records each close of its client."""
    store = ZkStore("127.0.0.1:1/t")
    monkeypatch.setattr(ZkStore, "connected", property(lambda self: connected))
    closes: list[str] = []
    monkeypatch.setattr(store.client, "stop", lambda: closes.append("stop"))
    monkeypatch.setattr(store.client, "close", lambda: closes.append("close"))
    return store, closes


def listeners(store: ZkStore) -> list[Any]:
    return list(store.client.state_listeners)


def test_the_session_is_closed_at_once_when_zookeeper_is_unreachable_at_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, closes = never_started_store(monkeypatch, connected=False)
    told: list[str] = []
    store.close_when_unreachable(on_close=lambda: told.append("unreachable"))
    assert store.stop(timeout_s=2.0)  # the close began already; this waits for that one
    assert closes == ["stop", "close"] and told == ["unreachable"]
    for listener in listeners(store):  # a later state change closes nothing again
        listener(KazooState.LOST)
    assert store.stop(timeout_s=2.0) and closes == ["stop", "close"] and told == ["unreachable"]


def test_while_zookeeper_answers_the_session_is_closed_only_once_it_drops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store, closes = never_started_store(monkeypatch, connected=True)
    told: list[str] = []
    store.close_when_unreachable(on_close=lambda: told.append("unreachable"))
    (listener,) = listeners(store)
    assert listener(KazooState.CONNECTED) is False
    assert closes == [] and told == []
    assert listener(KazooState.SUSPENDED) is True  # (kazoo then drops the listener)
    assert store.stop(timeout_s=2.0)
    assert closes == ["stop", "close"] and told == ["unreachable"]


# -- the worker's loop and its tasks -------------------------------------------------------------


class FakeMembership:
    """The group as a single member that leads it; `left` records LeaveGroup."""

    def __init__(self) -> None:
        self.name, self.group = "w1", "g"
        self.member_id = self.leader = "m1"
        self.generation = 1
        self.session_timeout_ms = 400
        self.left: list[float | None] = []

    def join(self, metadata: bytes) -> dict[str, Any]:
        return {"members": [{"member_id": "m1", "metadata": metadata}]}

    def sync(self, assignments: dict[str, bytes] | None) -> tuple[int, bytes]:
        return 0, (assignments or {}).get("m1", b"[]")

    def heartbeat(self) -> int:
        return 0

    def leave(self, timeout_s: float | None = None) -> None:
        self.left.append(timeout_s)


class FakeExecution:
    def __init__(self, stop_takes: threading.Event | None = None) -> None:
        self.error: str | None = None
        self.stopped = threading.Event()
        self.stop_takes = stop_takes

    def tick(self) -> None: ...

    def stop(self) -> None:
        if self.stop_takes is not None:
            self.stop_takes.wait()
        self.stopped.set()


def test_the_loop_leaves_quietly_when_the_stop_closes_zookeeper_under_its_call() -> None:
    """The stop came while the loop waited on ZooKeeper (here: the leader listing the tasks), and
    the session's close ended that call: the run stops its tasks and leaves, raising nothing."""
    membership = FakeMembership()
    stop = threading.Event()
    calls = 0

    def list_tasks() -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return ["t1"]
        stop.set()  # SIGTERM ...
        raise ConnectionClosedError("Connection has been closed")  # ... and the session closed

    started: list[FakeExecution] = []

    def start(task_id: str) -> FakeExecution:
        w._rejoin_requested = True  # the next pass rejoins, and lists the tasks again
        started.append(FakeExecution())
        return started[-1]

    w = Worker(membership, list_tasks, start, stop=stop)  # type: ignore[arg-type]
    w.run()
    assert calls == 2 and len(started) == 1 and started[0].stopped.is_set()
    assert membership.left == [worker_module.LEAVE_GROUP_S]
    assert w.stop_began is not None


class StuckTick(FakeExecution):
    """A task whose status check never returns (kazoo holding a call without ZooKeeper, with
    nothing closing the session)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_tick = threading.Event()
        self.never = threading.Event()

    def tick(self) -> None:
        self.in_tick.set()
        self.never.wait()


def test_the_stop_goes_on_without_a_loop_stuck_in_a_call() -> None:
    """The loop is in a call that never ends when the stop comes: after `loop_exit_s` the run
    stops the tasks and leaves the group without it, and returns."""
    membership = FakeMembership()
    stop = threading.Event()
    stuck = StuckTick()
    zookeeper = SimpleNamespace(session_timeout_s=0.25, close_when_unreachable=lambda on_close: None)
    w = Worker(membership, lambda: ["t1"], lambda task_id: stuck, stop=stop, zookeeper=zookeeper)  # type: ignore[arg-type]
    assert w.loop_exit_s() == 0.5
    run = threading.Thread(target=w.run, daemon=True)
    run.start()
    assert stuck.in_tick.wait(5.0), "the loop never checked the task"
    began = time.monotonic()
    stop.set()
    run.join(5.0)
    took_s = time.monotonic() - began
    stuck.never.set()  # (lets the loop left in its call end)
    assert not run.is_alive(), "the stop waited for the loop's call"
    assert 0.5 <= took_s < 3.0, took_s
    assert stuck.stopped.is_set() and membership.left == [worker_module.LEAVE_GROUP_S]


def test_an_exception_that_ends_the_loop_is_raised_once_the_tasks_are_stopped() -> None:
    membership = FakeMembership()
    started: list[FakeExecution] = []

    def start(task_id: str) -> FakeExecution:
        started.append(FakeExecution())
        started[-1].tick = lambda: (_ for _ in ()).throw(KeyboardInterrupt())  # type: ignore[method-assign]
        return started[-1]

    w = Worker(membership, lambda: ["t1"], start)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        w.run()
    assert started[0].stopped.is_set() and membership.left == [worker_module.LEAVE_GROUP_S]


def test_the_tasks_stop_at_once_and_are_waited_for_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "TASKS_STOP_S", 0.5)
    never = threading.Event()
    w = Worker(FakeMembership(), list, lambda task_id: None)  # type: ignore[arg-type]
    stuck, quick = FakeExecution(stop_takes=never), FakeExecution()
    w.running = {"a-stuck": stuck, "b-quick": quick}
    began = time.monotonic()
    w._stop_all_tasks()
    took_s = time.monotonic() - began
    never.set()  # (lets the thread left stopping it end)
    assert 0.5 <= took_s < 1.5, took_s
    assert quick.stopped.is_set() and w.running == {}


def test_a_start_the_stop_cut_short_is_neither_retried_nor_alarmed() -> None:
    failures: list[tuple[str, str, int, float]] = []
    starts: list[str] = []
    w = Worker(
        FakeMembership(),  # type: ignore[arg-type]
        list,
        lambda task_id: starts.append(task_id),
        on_failure=lambda t, e, n, d: failures.append((t, e, n, d)),
    )
    w.stop.set()
    w._failed("t1", "ConnectionClosedError: Connection has been closed")
    w._start("t2")
    assert failures == [] and w.failed == {} and starts == []


# -- one execution and its apply query -----------------------------------------------------------


def test_without_zookeeper_an_execution_leaves_its_status_and_history_to_the_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No call is made (kazoo would hold it until it reconnects): the status znode goes with the
    session, and the history entry opened at the start still says running."""
    store = FakeTaskStore()
    ex = _execution(monkeypatch, store)
    (entry,) = store.history.values()
    cleared: list[str] = []
    monkeypatch.setattr(store, "clear_status", lambda task_id, execution: cleared.append(execution))
    monkeypatch.setattr(store, "connected", False)
    ex.stop()
    assert cleared == [] and entry["outcome"] == "running" and list(store.history.values()) == [entry]


def bare_query(applied: list[int], batch_takes: threading.Event) -> ApplyQuery:
    """An ApplyQuery without Spark or a target: its batches record their id once `batch_takes`
    is set."""
    q = ApplyQuery.__new__(ApplyQuery)
    q.__dict__.update(pipeline="p", query=None, dead_letters=None, staging=None,
                      target=SimpleNamespace(close=lambda: None))  # fmt: skip
    q._lock = threading.Lock()
    q._batch_state = threading.Condition(q._lock)
    q._in_batch = q._stopping = False

    def apply_one(df: Any, batch_id: int) -> None:
        batch_takes.wait()
        applied.append(batch_id)

    q._apply_one = apply_one  # type: ignore[method-assign]
    return q


def test_an_apply_querys_stop_lets_the_batch_in_flight_commit_and_commits_nothing_after() -> None:
    applied: list[int] = []
    batch_takes = threading.Event()
    q = bare_query(applied, batch_takes)
    batch = threading.Thread(target=q._apply_batch, args=(None, 1))
    batch.start()
    while not q._in_batch:
        time.sleep(0.01)
    stopper = threading.Thread(target=q.stop, kwargs={"batch_wait_s": 5.0})
    stopper.start()
    stopper.join(0.3)
    assert stopper.is_alive(), "the stop did not wait for the batch in flight"
    batch_takes.set()
    stopper.join(5.0)
    batch.join(5.0)
    assert not stopper.is_alive() and applied == [1]
    q._apply_batch(None, 2)  # begun once the stop had: nothing of it is committed
    assert applied == [1]

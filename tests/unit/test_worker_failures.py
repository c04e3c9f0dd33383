"""A task that fails must not take the worker (or its other tasks) down with it.

Before the fix, `Worker._apply_assignment` had no error handling: the first task whose start
raised (unreachable target, stale epoch, task deleted mid-assignment, topic creation during a
failover) ended the worker process, the group moved the task to the next worker, and it killed
that one too. Failing run before the fix:
    ConnectionError: cannot connect to postgresql://sync:hunter2@db:5432/shop ...
    (raised out of _apply_assignment; test_a_task_that_fails_to_start_...)"""

from __future__ import annotations

import random
from typing import Any

import pytest

from sluice.sync import worker as worker_module
from sluice.sync.execution import SUPERSEDED
from sluice.sync.worker import RETRY_MAX_S, Worker, retry_delay_s


class FakeExecution:
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.error: str | None = None
        self.stopped = False
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1

    def stop(self) -> None:
        self.stopped = True

    def relinquish(self) -> None:
        self.stop()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(worker_module.time, "monotonic", c.monotonic)
    return c


def make_worker(start: Any, failures: list[tuple[str, str, int, float]]) -> Worker:
    return Worker(
        membership=None,  # type: ignore[arg-type]  # not used by what these tests call
        list_tasks=lambda: ["bad", "good"],
        start_task=start,
        on_failure=lambda t, e, n, d: failures.append((t, e, n, d)),
        describe_error=lambda _t, error: str(error).replace("hunter2", "***"),
    )


def test_a_task_that_fails_to_start_is_retried_with_backoff_and_the_others_run(clock: Clock) -> None:
    attempts: dict[str, int] = {}
    started: dict[str, FakeExecution] = {}

    def start(task_id: str) -> FakeExecution:
        attempts[task_id] = attempts.get(task_id, 0) + 1
        if task_id == "bad" and attempts[task_id] < 4:
            raise ConnectionError("cannot connect to postgresql://sync:hunter2@db:5432/shop: refused")
        started[task_id] = FakeExecution(task_id)
        return started[task_id]

    failures: list[tuple[str, str, int, float]] = []
    w = make_worker(start, failures)
    w.assigned = ["bad", "good"]
    w._apply_assignment()  # must not raise
    assert set(w.running) == {"good"} and "bad" in w.failed
    assert failures[0][0] == "bad" and failures[0][2] == 1
    assert "hunter2" not in failures[0][1] and "***" in failures[0][1]

    delays = []
    while "bad" in w.failed:  # not before its time; then again, each delay longer
        retry = w.failed["bad"]
        delays.append(retry.at - clock.now)
        w._check_executions()
        assert attempts["bad"] == retry.attempts
        clock.now = retry.at
        w._check_executions()
        assert len(delays) <= 3
    assert attempts["bad"] == 4 and "bad" in w.running and "bad" not in w.failed
    assert [f[2] for f in failures] == [1, 2, 3]
    assert len(delays) == 3 and delays[0] < delays[-1]
    assert started["good"].ticks >= 3 and not started["good"].stopped


def running_good() -> tuple[Worker, list[FakeExecution], list[tuple[str, str, int, float]]]:
    """A worker running task "good"; every execution it starts, and every failure it reports."""
    made: list[FakeExecution] = []

    def start(task_id: str) -> FakeExecution:
        made.append(FakeExecution(task_id))
        return made[-1]

    failures: list[tuple[str, str, int, float]] = []
    w = make_worker(start, failures)
    w.assigned = ["good"]
    w._apply_assignment()
    return w, made, failures


def test_an_execution_that_fails_later_is_stopped_and_started_again(clock: Clock) -> None:
    w, made, failures = running_good()
    made[0].error = "apply failed: postgresql://sync:hunter2@db refused connections"
    w._check_executions()
    assert made[0].stopped and "good" not in w.running and failures[0][1].startswith("apply failed")
    assert "hunter2" not in failures[0][1]
    clock.now += RETRY_MAX_S + 1
    w._check_executions()
    assert len(made) == 2 and w.running["good"] is made[1]


def test_a_superseded_execution_is_not_retried_here_the_worker_rejoins(clock: Clock) -> None:
    w, made, failures = running_good()
    made[0].error = SUPERSEDED
    w._check_executions()
    clock.now += RETRY_MAX_S + 1
    w._check_executions()
    assert made[0].stopped and len(made) == 1 and not failures and w._rejoin_requested


def test_a_failed_task_that_moves_away_is_forgotten(clock: Clock) -> None:
    def start(task_id: str) -> FakeExecution:
        raise KeyError(task_id)  # deleted mid-assignment

    w = make_worker(start, [])
    w.assigned = ["bad"]
    w._apply_assignment()
    assert "bad" in w.failed
    w.assigned = []
    w._apply_assignment()
    assert not w.failed and not w.running


def test_the_retry_delay_doubles_up_to_its_bound() -> None:
    rng = random.Random(1)
    delays = [retry_delay_s(n, rng) for n in range(1, 12)]
    assert all(d <= RETRY_MAX_S for d in delays)
    assert delays[0] < 1.01 and delays[-1] >= RETRY_MAX_S * 0.8

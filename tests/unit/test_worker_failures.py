"""A task that fails must not take the worker (or its other tasks) down with it.

Before the fix, `Worker._apply_assignment` had no error handling: the first task whose start
raised (unreachable target, stale epoch, task deleted mid-assignment, topic creation during a
failover) ended the worker process, the group moved the task to the next worker, and it killed
that one too. Failing run before the fix:
    ConnectionError: cannot connect to postgresql://sync:hunter2@db:5432/shop ...
    (raised out of _apply_assignment; test_a_task_that_fails_to_start_...)"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from sluice.service.tasks import failures_in_a_row
from sluice.sync import worker as worker_module
from sluice.sync.backoff import RETRY_MAX_S, retry_delay_s
from sluice.sync.execution import SUPERSEDED
from sluice.sync.worker import Worker


class FakeExecution:
    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.error: str | None = None
        self.stopped = False
        self.ticks = 0
        self.batches_committed = 0

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


def test_executions_that_start_and_then_fail_count_up_and_wait_longer_until_one_commits(
    clock: Clock,
) -> None:
    """Issue 32: an apply query whose Spark Python worker cannot connect back starts fine and fails
    seconds later. Each such failure is the next attempt (1, 2, 3, ... with the delay doubling),
    not the first again (`attempts=1` and a retry every second, for ever); only an execution that
    commits a batch starts the count again."""
    w, made, failures = running_good()

    def fail_and_retry() -> None:
        made[-1].error = "apply failed: Python worker failed to connect back."
        w._check_executions()
        clock.now = w.failed["good"].at
        w._check_executions()
        assert w.running["good"] is made[-1] and not made[-1].error

    for _ in range(4):
        fail_and_retry()
    assert [f[2] for f in failures] == [1, 2, 3, 4]
    delays = [f[3] for f in failures]
    assert all(later > 1.5 * earlier for earlier, later in itertools.pairwise(delays)), delays
    made[-1].batches_committed = 1  # progress: the next failure is the first of a new run
    w._check_executions()
    fail_and_retry()
    assert failures[-1][2] == 1 and failures[-1][3] <= 1.0


def test_an_operators_change_starts_a_waiting_task_at_once_counting_from_one(clock: Clock) -> None:
    """`sluice task update` (or restart, pause, resume) of a task waiting out a long backoff:
    the worker starts it at its next check, not at the end of the delay, and its next failure
    is the first of a new run."""
    revision = {"bad": (0, False)}
    attempts: list[int] = []

    def start(task_id: str) -> FakeExecution:
        attempts.append(1)
        raise ConnectionError("the target refuses connections")

    failures: list[tuple[str, str, int, float]] = []
    w = Worker(
        membership=None,  # type: ignore[arg-type]  # not used by what this test calls
        list_tasks=lambda: ["bad"], start_task=start, revision=revision.get,
        on_failure=lambda t, e, n, d: failures.append((t, e, n, d)),
    )  # fmt: skip
    w.assigned = ["bad"]
    w._apply_assignment()
    for _ in range(4):
        clock.now = w.failed["bad"].at
        w._check_executions()
    assert [f[2] for f in failures] == [1, 2, 3, 4, 5]
    w._check_executions()  # not due for about 16 s: nothing happens
    assert len(attempts) == 5
    revision["bad"] = (1, False)  # sluice task update
    w._check_executions()
    assert len(attempts) == 6 and failures[-1][2] == 1 and failures[-1][3] <= 1.0


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


def test_task_status_shows_the_newest_run_of_failures_in_a_row() -> None:
    """`sluice task status` (service.tasks.failures_in_a_row): the task-failed alarms from the
    newest attempt 1 on, whatever other alarms came between them."""

    def failed(n: int) -> dict[str, object]:
        return {"kind": "task-failed", "attempts": n, "retry_in_s": float(2 ** (n - 1))}

    other = {"kind": "binlog-purge-risk"}
    events = [failed(1), failed(2), other, failed(1), other, failed(2), failed(3), other]
    assert [e["attempts"] for e in failures_in_a_row(events)] == [1, 2, 3]
    assert failures_in_a_row([other]) == []
    # an older alarm without attempts, or a run whose start was trimmed away, still shows
    trimmed = [{"kind": "task-failed"}, failed(4), failed(5)]
    assert [e["attempts"] for e in failures_in_a_row(trimmed)] == [4, 5]

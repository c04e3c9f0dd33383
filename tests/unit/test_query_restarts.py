"""`sluice apply` and the demo start a failed apply query again with the workers' backoff
(pipeline/restarting.py): the attempts count up, the delay doubles, a committed batch starts the
count again, and a failure a restart would only meet again is raised, not retried."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Any

import pytest

from sluice.pipeline.apply import ApplyConfig
from sluice.pipeline.restarting import QueryFailure, RestartingQuery, describe_failure
from sluice.sync.backoff import Backoff


class StaleEpochError(RuntimeError):
    """Named as the target's: what counts is the name a failure carries (restarting.FATAL)."""


@dataclass
class FakeQuery:
    config: ApplyConfig
    epoch: int
    pipeline: str = "p"
    batches: int = 0
    error: BaseException | None = None
    started: bool = False
    stopped: bool = False
    query: Any = None
    ended_cleanly: bool = False
    notes: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.started = True

    def failure(self) -> BaseException | None:
        if self.ended_cleanly:
            return RuntimeError("the apply query stopped")
        return self.error

    def finished(self) -> bool:
        return self.ended_cleanly

    def stop(self) -> None:
        self.stopped = True


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


Made = tuple[RestartingQuery, list[FakeQuery], list[QueryFailure], Clock]


def runner(config: ApplyConfig | None = None) -> Made:
    made: list[FakeQuery] = []
    failures: list[QueryFailure] = []
    clock = Clock()

    def make(_spark: Any, config: ApplyConfig, **_: Any) -> FakeQuery:
        made.append(FakeQuery(config, epoch=config.epoch or len(made) + 10))
        return made[-1]

    r = RestartingQuery(
        lambda: "spark", config or ApplyConfig(bootstrap="b:1", target="sqlite:///t", topics=["t"], epoch=7),
        on_failure=failures.append, backoff=Backoff(random.Random(3)), clock=clock, make=make,
    )  # fmt: skip
    r.open()
    r.start()
    return r, made, failures, clock


def fail_and_wait(r: RestartingQuery, made: list[FakeQuery], clock: Clock, error: BaseException) -> None:
    made[-1].error = error
    assert r.check() is False
    assert made[-1].stopped and r.query is None and r.retry_at is not None
    clock.now = r.retry_at - 0.01
    r.check()
    assert r.query is None  # not before its time
    clock.now = r.retry_at
    r.check()
    assert r.query is made[-1] and made[-1].started


def test_a_failed_query_is_started_again_counting_up_and_waiting_twice_as_long_each_time() -> None:
    r, made, failures, clock = runner()
    for _ in range(4):
        fail_and_wait(r, made, clock, RuntimeError("Python worker failed to connect back."))
    assert [f.attempt for f in failures] == [1, 2, 3, 4]
    assert all(b.retry_in_s >= 1.5 * a.retry_in_s for a, b in itertools.pairwise(failures)), failures
    assert failures[0].error == "RuntimeError: Python worker failed to connect back."
    # the first query ran under the epoch it was given, every restart claims the next one
    assert made[0].config.epoch == 7 and all(q.config.epoch is None for q in made[1:])
    assert r.restarts == 4


def test_a_committed_batch_starts_the_count_again() -> None:
    r, made, failures, clock = runner()
    fail_and_wait(r, made, clock, RuntimeError("executor lost"))
    fail_and_wait(r, made, clock, RuntimeError("executor lost"))
    made[-1].batches = 1
    r.check()
    fail_and_wait(r, made, clock, RuntimeError("executor lost"))
    assert [f.attempt for f in failures] == [1, 2, 1]


def test_a_failure_a_restart_would_meet_again_is_raised_and_the_query_stopped() -> None:
    r, made, failures, _ = runner()
    made[-1].error = StaleEpochError("pipeline p: epoch 7 refused, the target holds epoch 9")
    with pytest.raises(StaleEpochError):
        r.check()
    assert made[-1].stopped and not failures and r.retry_at is None
    # raised in an executor, the class comes back as a name in Spark's text
    r, made, failures, _ = runner()
    made[-1].error = RuntimeError("Job aborted ... sluice.sync.envelope.BadEventError: t[0]@5: no op")
    with pytest.raises(RuntimeError):
        r.check()
    assert not failures


def test_a_query_that_fails_to_start_again_is_one_more_attempt() -> None:
    r, made, failures, clock = runner()
    made[-1].error = RuntimeError("first")

    def refuse(_spark: Any, config: ApplyConfig, **_: Any) -> FakeQuery:
        raise ConnectionError("the target refused the connection")

    r._make = refuse
    r.check()
    clock.now = r.retry_at or 0
    r.check()
    assert [(f.attempt, f.error) for f in failures] == [
        (1, "RuntimeError: first"), (2, "ConnectionError: the target refused the connection")
    ]  # fmt: skip
    assert r.query is None and r.retry_at is not None


def test_an_available_now_query_that_applied_the_log_is_done_not_failed() -> None:
    config = ApplyConfig(bootstrap="b:1", target="sqlite:///t", topics=["t"], available_now=True)
    r, made, failures, _ = runner(config)
    assert r.check() is False
    made[-1].ended_cleanly = True
    assert r.check() is True and not failures


class CapturedException(Exception):
    """As PySpark captures a JVM exception: its text, and the JVM cause converted (`_cause`)."""

    def __init__(self, text: str, cause: str) -> None:
        super().__init__(text)
        self._cause = Exception(cause)


STREAM_FAILED = "[STREAM_FAILED] Query [id = 5, runId = 6] terminated with exception: {} SQLSTATE: XXKST\n==="


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (
            CapturedException(STREAM_FAILED.format("Python worker failed to connect back."),
                              "org.apache.spark.SparkException: Python worker failed to connect back."),
            "SparkException: Python worker failed to connect back.",
        ),
        (  # the query's Python source runner died: an EOFException, which has no message
            CapturedException(STREAM_FAILED.format(""), "java.io.EOFException"),
            "EOFException",
        ),
        (
            CapturedException(
                STREAM_FAILED.format("Job aborted due to stage failure: ... PythonException: ..."),
                "org.apache.spark.SparkException: Job aborted\n  sluice.pipeline.source.SluiceSourceError: "
                "topic(s) not found\n",
            ),
            "SluiceSourceError: topic(s) not found",
        ),
        (ConnectionError("no target at db:5432"), "ConnectionError: no target at db:5432"),
    ],
)  # fmt: skip
def test_a_failure_is_said_in_one_line(exc: BaseException, said: str) -> None:
    assert describe_failure(exc) == said

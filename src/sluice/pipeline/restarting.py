"""An apply query started again from its checkpoint each time it fails: what `sluice apply` and
the demo run. A worker's task gets the same from its worker (sync.worker); both wait by the same
rule (sync.backoff): the delay doubles with each failure in a row, from 1 s up to 60 s, and a
committed batch starts the count again.

Why a query fails on a healthy cluster: on a starved machine (load 9-18 on 2 cores) the Python
process Spark starts for a query's source at each start must connect back to the JVM within a
fixed 10 s (PythonWorkerFactory.createSimpleWorker: "Python worker failed to connect back"; no
setting changes it); an executor's heartbeat comes late and its tasks are failed; the driver JVM
dies. None of these is the data's fault, and the next start usually works. So `check()` (called
every fraction of a second by the command's loop) stops a failed query and, after the delay,
makes a new ApplyQuery: it claims the next fencing epoch (nothing the failed one still had in
flight can commit) and resumes from the checkpoint, reconciled with the target's offsets (a
replayed batch is skipped by them). `on_failure` hears of each failure with its attempt number
and delay, for the command to print.

A failure that the next start would only meet again is raised instead, for the command to exit
non-zero saying why (FATAL): the target holds a newer epoch (another execution took the
pipeline), a record that is not a valid change event, a mapping the target cannot apply, a
schema change the policy stops at. Such failures reach here as the batch function's own
exception, or, raised in an executor, as Spark's exception quoting its class name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
from sluice.sync.backoff import Backoff

log = logging.getLogger("sluice.apply")

#: failures a restart would meet again: raised to the command (see the module docstring)
FATAL = ("StaleEpochError", "BadEventError", "MappingError", "SchemaChangeStopped")


def is_fatal(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ in FATAL or any(f"{name}: " in text for name in FATAL)


def describe_failure(exc: BaseException) -> str:
    """One line saying why a query failed. A Python error (the batch function's, or one raised in
    an executor, which Spark quotes inside its own text): from its class name on. Spark's own
    failure of the query (StreamingQueryException, whose text is "[STREAM_FAILED] Query [id =
    ...] terminated with exception: <message> SQLSTATE: XXKST" and a plan, and whose message is
    empty when the cause had none): the JVM exception that ended it, as PySpark captured it
    ("SparkException: Python worker failed to connect back.", "EOFException" when the query's
    Python source runner died). Anything else: its class and first line."""
    cause = getattr(exc, "_cause", None)  # PySpark's CapturedException: the JVM cause, converted
    texts = [str(exc), str(cause) if cause is not None else ""]
    for marker in (*(f"{name}: " for name in FATAL), "SluiceSourceError: ", "ValueError: ", "Error: "):
        for text in texts:
            if marker in text:
                return text[text.index(marker) :].splitlines()[0]
    if texts[1].strip():
        jvm_class, sep, message = texts[1].strip().splitlines()[0].partition(": ")
        return f"{jvm_class.rsplit('.', 1)[-1]}{sep}{message}"
    lines = texts[0].strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


@dataclass(frozen=True, slots=True)
class QueryFailure:
    """One failure of the query, as `on_failure` hears of it."""

    attempt: int  # failures in a row, this one included
    retry_in_s: float
    error: str  # describe_failure's line


class RestartingQuery:
    """Runs the apply query of `config` on `spark()` (a DriverSession's `get`: a driver JVM that
    died is replaced), starting it again after each failure. Not thread-safe: one thread calls
    `open`, `start`, `check`, `wait` and `stop`."""

    def __init__(
        self,
        spark: Callable[[], Any],
        config: ApplyConfig,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_failure: Callable[[QueryFailure], None] | None = None,
        on_restart: Callable[[ApplyQuery], None] | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        make: Callable[..., ApplyQuery] = ApplyQuery,
    ) -> None:
        self.spark = spark
        self._make = make  # tests pass their own
        self.config = config
        self.on_batch = on_batch
        self.on_failure = on_failure
        self.on_restart = on_restart
        self.backoff = backoff or Backoff()
        self.clock = clock
        #: the query running now (None while waiting to start it again)
        self.query: ApplyQuery | None = None
        #: when the next start is due (time.monotonic()), while waiting for it
        self.retry_at: float | None = None
        self.restarts = 0

    def open(self) -> ApplyQuery:
        """Make the first query (it claims the pipeline: StaleEpochError, a ConnectionError or a
        ValueError are raised as ApplyQuery raises them, for the command to report); `start`
        starts it."""
        assert self.query is None and not self.restarts
        self.query = self._make(self.spark(), self.config, on_batch=self.on_batch)
        return self.query

    def start(self) -> None:
        """Start the query `open` made. A failure to start is retried like a failure later on."""
        assert self.query is not None
        try:
            self.query.start()
        except Exception as exc:
            self._failed(exc)

    def check(self) -> bool:
        """Restart the query if it failed and its delay is over. True once it ended by itself
        (`available_now`: it applied what the log held). Raises a FATAL failure."""
        query = self.query
        if query is not None:
            if query.batches and self.backoff.attempts:
                self.backoff.progressed()
            failure = query.failure()
            if failure is None:
                return False
            if self.config.available_now and query.finished():
                return True
            self._failed(failure)
            return False
        if self.retry_at is not None and self.clock() >= self.retry_at:
            self.retry_at = None
            self._restart()
        return False

    def wait(self, timeout_s: float) -> None:
        """Up to `timeout_s`: less if the query ends, or the next start falls due, before."""
        query = self.query
        if query is not None and query.query is not None:
            try:
                query.await_termination(timeout_s)
            except Exception:  # it failed: check() says what happens next
                pass
            return
        due = timeout_s if self.retry_at is None else min(timeout_s, self.retry_at - self.clock())
        time.sleep(max(0.0, due))

    def stop(self) -> None:
        query, self.query = self.query, None
        self.retry_at = None
        if query is not None:
            _stop_quietly(query)

    def _restart(self) -> None:
        # The next epoch, whatever the first start was given: the failed query is stopped, and
        # a new epoch makes sure nothing it still had in flight can commit.
        config = replace(self.config, epoch=None)
        query: ApplyQuery | None = None
        try:
            query = self._make(self.spark(), config, on_batch=self.on_batch)
            query.start()
        except Exception as exc:
            if query is not None:
                _stop_quietly(query)
            self.query = None
            self._failed(exc)
            return
        self.query = query
        self.restarts += 1
        log.info("event=apply_restarted pipeline=%s epoch=%d restarts=%d", query.pipeline, query.epoch,
                 self.restarts)  # fmt: skip
        if self.on_restart is not None:
            self.on_restart(query)

    def _failed(self, exc: BaseException) -> None:
        """Stop the failed query; raise the failure if FATAL, else schedule the next start."""
        query, self.query = self.query, None
        if query is not None:
            _stop_quietly(query)
        if is_fatal(exc):
            raise exc
        delay = self.backoff.failed()
        self.retry_at = self.clock() + delay
        failure = QueryFailure(self.backoff.attempts, round(delay, 1), describe_failure(exc))
        log.info("event=apply_failed attempts=%d retry_in_s=%.1f error=%s", failure.attempt, delay,
                 failure.error)  # fmt: skip
        if self.on_failure is not None:
            self.on_failure(failure)


def _stop_quietly(query: ApplyQuery) -> None:
    try:
        query.stop()
    except Exception as exc:  # it failed already; what stopping it left is the next start's to meet
        log.warning("event=apply_stop_failed pipeline=%s error=%r", query.pipeline, exc)

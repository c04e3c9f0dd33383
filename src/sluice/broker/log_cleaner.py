"""The broker's log cleaner: which compacted logs to clean, when, and where the work runs.

Every replica of a compacted topic on this broker is cleaned here, the leader's and the
followers' alike (as in Kafka, each broker cleans its own copy; a follower that fetches below
its leader's clean point, a new replica, gets the leader's cleaned batches as they are, gaps and
all, which ``append_as_follower`` takes). Each replica cleans below its own high watermark, so
only committed records are ever cleaned.

Scheduling (on the event loop, every ``log.cleaner.backoff.ms`` and again at once after a clean):
the logs whose clean is due (``PartitionLog.clean_due``: dirty ratio, max compaction lag, or a
passed delete horizon) are taken dirtiest first, at most ``log.cleaner.threads`` at a time and
one clean per log at a time. A clean runs in three steps (storage/cleaner.py): the rewrite in a
**cleaner process**, the commit on the event loop (a list swap), the durable renames on a thread.

Why processes and not threads: the rewrite decodes and re-encodes records in Python. In a thread
it would hold the GIL in 5 ms slices against the event loop, and every request the loop handles
meanwhile would wait for it; in its own process it competes only for a core, and its I/O is
bounded by ``log.cleaner.io.max.bytes.per.second`` (read and written bytes), so produce latency
holds. ``log.cleaner.threads`` (Kafka's name) is the number of such processes. They are started
at the first clean (a broker with nothing to clean starts none) with the spawn method, die with
the broker (``PR_SET_PDEATHSIG``: a kill -9 of the broker leaves no cleaner writing behind it),
and stop at the next chunk when the broker stops (their half-written ``.cleaned`` files are
deleted when the log is next opened).
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import multiprocessing
import multiprocessing.synchronize
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.storage.cleaner import CleanerStopped, CleanJob, CleanResult, StopFlag, Throttler, run_clean
from sluice.storage.compaction import MAP_ENTRY_OVERHEAD_BYTES

if TYPE_CHECKING:
    from sluice.broker.partition import Partition
    from sluice.broker.replica_manager import ReplicaManager

log = logging.getLogger("sluice.log_cleaner")

#: How long a stopping broker waits for cleans in progress to notice the stop.
STOP_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The broker's cleaner settings (Kafka's ``log.cleaner.*`` names in broker/config.py)."""

    enabled: bool = True
    #: cleaner processes (``log.cleaner.threads``)
    processes: int = 1
    #: bytes read and written per second, all processes together (0: unbounded)
    io_bytes_per_s: float = 50 * 1024 * 1024
    #: how long the cleaner waits when there is nothing to clean (``log.cleaner.backoff.ms``)
    backoff_ms: int = 15_000
    #: memory for the offset maps, all processes together (``log.cleaner.dedupe.buffer.size``)
    dedupe_buffer_bytes: int = 128 * 1024 * 1024

    @property
    def map_entries_max(self) -> int:
        return max(1, self.dedupe_buffer_bytes // self.processes // MAP_ENTRY_OVERHEAD_BYTES)


# --- the cleaner process -------------------------------------------------------------------------

_worker_throttler: Throttler | None = None
_PR_SET_PDEATHSIG = 1


def _worker_init(parent_pid: int, stop: StopFlag, bytes_per_s: float) -> None:
    """In each cleaner process: die with the broker, ignore the terminal's Ctrl-C (the broker
    stops it), and throttle its I/O."""
    global _worker_throttler
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the process ends at its next task once the broker is gone
    if os.getppid() != parent_pid:
        os._exit(1)  # the broker died before prctl took effect
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_throttler = Throttler(bytes_per_s, stop)


def _worker_clean(job: CleanJob) -> CleanResult | None:
    assert _worker_throttler is not None, "a cleaner process runs _worker_init first"
    _worker_throttler.slept_s = 0.0
    return run_clean(job, _worker_throttler)


# --- the scheduler -------------------------------------------------------------------------------


class LogCleaner:
    """Cleans this broker's compacted replicas (module docstring). ``executor`` (tests): run the
    rewrite there instead of in cleaner processes, with this object's own throttler."""

    def __init__(
        self,
        replicas: ReplicaManager,
        settings: CleanerSettings,
        *,
        executor: Executor | None = None,
        now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._replicas = replicas
        self.settings = settings
        self._now_ms = now_ms
        #: set when the broker stops; the processes' own flag is made with them (a
        #: multiprocessing primitive starts multiprocessing's resource tracker process)
        self._stop = threading.Event()
        self._process_stop: multiprocessing.synchronize.Event | None = None
        self._given_executor = executor
        self._executor: Executor | None = executor
        self._throttler = Throttler(settings.io_bytes_per_s, self._stop)
        self._running: dict[Path, asyncio.Task[bool]] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        #: cleans committed since start, and bytes they removed (for logs and tests)
        self.cleans = 0
        self.bytes_removed = 0

    def start(self) -> None:
        if not self.settings.enabled:
            log.info("event=log_cleaner_disabled")
            return
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop scheduling, let cleans in progress stop at their next chunk, stop the processes."""
        self._stop.set()
        if self._process_stop is not None:
            self._process_stop.set()
        if self._task is not None:
            self._task.cancel()
        running = list(self._running.values())
        if running:
            await asyncio.wait(running, timeout=STOP_WAIT_S)
        if self._executor is not None and self._executor is not self._given_executor:
            await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)

    def wake(self) -> None:
        """Look for logs to clean now rather than at the next backoff."""
        if self._wake is not None:
            self._wake.set()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                self.schedule()
            except Exception:
                log.exception("event=log_cleaner_schedule_failed")
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.settings.backoff_ms / 1000.0)
            except TimeoutError:
                pass
            self._wake.clear()

    def schedule(self) -> list[Partition]:
        """Start the cleans that are due, dirtiest first, up to the free processes; returns the
        replicas whose clean started."""
        free = self.settings.processes - len(self._running)
        if free <= 0 or self._stop.is_set():
            return []
        now_ms = self._now_ms()
        due: list[tuple[float, Partition]] = []
        for part in list(self._replicas.partitions.values()):
            plog = part.log
            if not plog.config.compact or plog.directory in self._running:
                continue
            rng = plog.clean_due(now_ms, stable_end=part.high_watermark)
            if rng is not None:
                due.append((rng.dirty_ratio, part))
        due.sort(key=lambda item: item[0], reverse=True)
        started = [part for _ratio, part in due[:free]]
        loop = asyncio.get_running_loop()
        for part in started:
            task = loop.create_task(self.clean(part, now_ms))
            directory = part.log.directory
            self._running[directory] = task
            task.add_done_callback(functools.partial(self._done, directory))
        return started

    def _done(self, directory: Path, _task: asyncio.Task[bool]) -> None:
        self._running.pop(directory, None)
        self.wake()  # more may be due, and a process is free

    def _executor_for_clean(self) -> Executor:
        if self._executor is None:
            ctx = multiprocessing.get_context("spawn")
            if self._process_stop is None:
                self._process_stop = ctx.Event()
            self._executor = ProcessPoolExecutor(
                max_workers=self.settings.processes,
                mp_context=ctx,
                initializer=_worker_init,
                initargs=(
                    os.getpid(),
                    self._process_stop,
                    self.settings.io_bytes_per_s / max(1, self.settings.processes),
                ),
            )
        return self._executor

    async def clean(self, part: Partition, now_ms: int | None = None, *, force: bool = False) -> bool:
        """Clean one replica's log now, if a clean is due (``force``: whenever anything lies
        below its clean point); True if a clean was committed."""
        plog = part.log
        now_ms = self._now_ms() if now_ms is None else now_ms
        job = plog.clean_job(
            now_ms, stable_end=part.high_watermark, map_entries_max=self.settings.map_entries_max, force=force
        )
        if job is None:
            return False
        loop = asyncio.get_running_loop()
        executor = self._executor_for_clean()
        result: CleanResult | None = None
        try:
            if executor is self._given_executor:
                result = await loop.run_in_executor(executor, run_clean, job, self._throttler)
            else:
                result = await loop.run_in_executor(executor, _worker_clean, job)
        except CleanerStopped:
            log.info("event=clean_stopped partition=%s", part.name)
        except BrokenProcessPool:
            log.warning("event=cleaner_process_died partition=%s action=restarting", part.name)
            self._executor = None
        except Exception as exc:
            log.error("event=clean_failed partition=%s error=%r", part.name, exc)
        if result is None:
            plog.abandon_clean(job)
            return False
        try:
            if not plog.commit_clean(result):
                return False
        except Exception as exc:
            log.error("event=clean_commit_failed partition=%s error=%r", part.name, exc)
            plog.abandon_clean(job)
            return False
        try:
            await asyncio.to_thread(plog.finish_swaps)
        except Exception as exc:
            # The swap stays pending: the log's next truncation, retention or close finishes it,
            # and until then the log is not cleaned again (clean_due).
            log.error("event=clean_swap_failed partition=%s error=%r", part.name, exc)
            return False
        removed = result.bytes_removed
        self.cleans += 1
        self.bytes_removed += removed
        log.info(
            "event=log_cleaned partition=%s clean_point=%d groups=%d records_read=%d records_kept=%d "
            "bytes_read=%d bytes_written=%d bytes_removed=%d map_keys=%d throttled_ms=%d took_ms=%d",
            part.name,
            result.end,
            len(result.groups),
            result.records_read,
            result.records_kept,
            result.bytes_read,
            result.bytes_written,
            removed,
            result.map_entries,
            result.throttled_s * 1000,
            result.took_s * 1000,
        )
        return True

    def info(self) -> dict[str, Any]:
        return {"cleans": self.cleans, "bytes_removed": self.bytes_removed, "running": len(self._running)}

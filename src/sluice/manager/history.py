"""Lag over time for the console's charts: every manager samples task lag (from the tasks'
ZooKeeper status) and consumer-group lag (from the brokers) every few seconds into bounded
in-memory rings. A cache, not state: a new manager starts with empty charts that fill as it
samples; Prometheus (`sluice_group_lag_records`, `sluice_task_lag_*`) keeps the long history."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("sluice.manager")

#: one hour at the default 5 s interval
MAX_SAMPLES = 720


class LagHistory:
    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._tasks: dict[str, deque[dict[str, Any]]] = {}
        self._groups: dict[str, deque[dict[str, Any]]] = {}
        #: the last sample's per-partition group lag, exported as sluice_group_lag_records
        self.group_partition_lag: dict[tuple[str, str, int], int] = {}
        self._lock = threading.Lock()

    def add_task(self, task_id: str, t: float, lag_records: int | None, lag_seconds: float | None) -> None:
        with self._lock:
            ring = self._tasks.setdefault(task_id, deque(maxlen=self.max_samples))
            ring.append({"t": t, "lag_records": lag_records, "lag_seconds": lag_seconds})

    def add_groups(self, t: float, lags: dict[tuple[str, str, int], int]) -> None:
        totals: dict[str, int] = {}
        for (group, _topic, _p), lag in lags.items():
            totals[group] = totals.get(group, 0) + lag
        with self._lock:
            self.group_partition_lag = dict(lags)
            for group, total in totals.items():
                self._groups.setdefault(group, deque(maxlen=self.max_samples)).append({"t": t, "lag": total})

    def task(self, task_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._tasks.get(task_id, ()))

    def group(self, group: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._groups.get(group, ()))

    def forget_tasks(self, keep: set[str]) -> None:
        with self._lock:
            for task_id in set(self._tasks) - keep:
                del self._tasks[task_id]


class Sampler:
    """Calls `sample()` every `interval_s` on a daemon thread until stopped; a failed sample is
    logged and the next one tried (ZooKeeper or a broker may be away for a while)."""

    def __init__(self, sample: Callable[[], None], interval_s: float) -> None:
        self.sample = sample
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-manager-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
                failures = 0
            except Exception as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("event=sample_failed failures=%d error=%r", failures, exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

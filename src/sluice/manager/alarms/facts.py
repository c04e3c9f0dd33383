"""The facts alarms are decided on, read from ZooKeeper and the brokers with the same code the CLI
uses: partition health (`service.health`), live brokers (`ZkStore`), tasks' control, status and alarm
events (`TaskStore` and its znodes), and the worker group's members (`service.group_view`: a worker's
client id is its name, `pipeline.worker.Membership`).

Never raises for an unreachable ZooKeeper or broker: what could not be read is named in
`Facts.unavailable`, and the rules neither raise nor resolve what depends on it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson
from kazoo.exceptions import NoNodeError

from sluice.cluster.zkstore import ZkStore
from sluice.manager.alarms.rules import Facts, TaskFacts
from sluice.service.group_view import describe_group
from sluice.service.health import partition_health
from sluice.sync.tasks import TASKS, TaskNotFoundError, TaskStore

log = logging.getLogger("sluice.manager.alarms")

DEFAULT_WORKER_GROUP = "sluice-workers"
#: alarm events kept per task (the newest): more than enough for any quiet period's count
EVENTS_KEPT = 50


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


@dataclass
class _TaskEvents:
    czxid: int  # of the task's alarms znode: a task deleted and created again starts afresh
    last: str = ""  # the newest event znode read (sequential names sort in creation order)
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))


class EventCache:
    """The newest alarm events of each task, read incrementally: the sync layer never removes
    them, so reading them all every few seconds would cost more every day. Each pass lists the
    event znodes' names and reads only the new ones (at most EVENTS_KEPT)."""

    def __init__(self) -> None:
        self._tasks: dict[str, _TaskEvents] = {}

    def read(self, tasks: TaskStore, task_id: str) -> list[dict[str, Any]]:
        path = f"{TASKS}/{task_id}/alarms"
        names, stat = tasks.zk.get_children(path, include_data=True)
        seen = self._tasks.get(task_id)
        if seen is None or seen.czxid != stat.czxid:
            seen = self._tasks[task_id] = _TaskEvents(int(stat.czxid))
        new = sorted(n for n in names if n > seen.last)[-EVENTS_KEPT:]
        pending = [(n, tasks.zk.get_async(f"{path}/{n}")) for n in new]
        for name, result in pending:
            try:
                data, _ = result.get(timeout=10)
            except NoNodeError:
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict):
                seen.events.append(event)
            seen.last = name
        return list(seen.events)

    def forget_others(self, task_ids: set[str]) -> None:
        for gone in set(self._tasks) - task_ids:
            del self._tasks[gone]


def _task_facts(tasks: TaskStore, task_id: str, events: EventCache) -> TaskFacts:
    control = tasks.control(task_id)
    status = tasks.status(task_id)
    running = status is not None
    s = status or {}
    lag_records, lag_seconds = s.get("lag_records"), s.get("lag_seconds")
    return TaskFacts(
        id=task_id,
        paused=bool(control.paused),
        running=running,
        lag_records=int(lag_records) if isinstance(lag_records, (int, float)) else None,
        lag_seconds=float(lag_seconds) if isinstance(lag_seconds, (int, float)) else None,
        error=s.get("error"),
        worker=s.get("worker"),
        execution=s.get("execution"),
        last_seen_running=s.get("updated") if running else None,
        events=events.read(tasks, task_id),
    )


def worker_names(bootstrap: str, group: str) -> list[str]:
    """The workers in the group now (a group that does not exist has none); raises when the
    brokers cannot answer."""
    from sluice.service.admin_client import AdminError

    try:
        view = describe_group(bootstrap, group)
    except AdminError as exc:
        if "does not exist" in str(exc):
            return []
        raise
    return sorted({m.client_id for m in view.members})


def collect_facts(
    zk: ZkStore,
    tasks: TaskStore,
    bootstrap: str,
    worker_group: str = DEFAULT_WORKER_GROUP,
    now: float | None = None,
    *,
    events: EventCache | None = None,
) -> Facts:
    """Everything the rules look at, now. Pass the evaluator's `events` cache to read each task's
    alarm events incrementally."""
    now = time.time() if now is None else now
    events = EventCache() if events is None else events
    unavailable: dict[str, str] = {}
    brokers: list[int] = []
    partitions: list[Any] = []
    task_facts: list[TaskFacts] = []
    if not zk.connected:
        # Each TaskStore call would wait out its retries; say so once instead.
        why = f"ZooKeeper at {zk.hosts} is out of reach"
        unavailable.update(brokers=why, partitions=why, tasks=why)
    else:
        try:
            brokers = sorted(zk.live_brokers())
        except Exception as exc:
            unavailable["brokers"] = _why(exc)
        try:
            partitions = partition_health(zk)
        except Exception as exc:
            unavailable["partitions"] = _why(exc)
        try:
            ids = tasks.ids()
            for task_id in ids:
                try:
                    task_facts.append(_task_facts(tasks, task_id, events))
                except (TaskNotFoundError, NoNodeError):
                    continue  # deleted meanwhile
            events.forget_others(set(ids))
        except Exception as exc:  # stop at the first failure: the next ones would wait as long
            unavailable["tasks"] = _why(exc)
            task_facts = []
    workers: list[str] = []
    try:
        workers = worker_names(bootstrap, worker_group)
    except Exception as exc:
        unavailable["workers"] = _why(exc)
    return Facts(now, task_facts, partitions, workers, brokers, unavailable)

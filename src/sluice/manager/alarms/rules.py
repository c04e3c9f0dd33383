"""Alarm rules: which conditions of a cluster deserve a person's attention. Pure: plain data in
(`Facts`, `Rules`, `since`), plain data out (`Condition`s, then the `Change`s to the stored
alarms); the evaluator does the I/O around it.

Monitors (the alarm's `rule`) and their subjects:

    task-lag                    task:{id}        lag_records >= task_lag_records or lag_seconds >=
                                                 task_lag_seconds (a lag of 0 never alarms);
                                                 critical from LAG_CRITICAL_FACTOR times either
    task-not-running            task:{id}        not paused, and no execution holds it (no status
                                                 znode) or its execution reports an error, for
                                                 task_not_running_seconds
    task-failed                 task:{id}        } an event of that kind under /tasks/{id}/alarms/
    duplicate-execution         task:{id}        } less than event_resolve_seconds old
    stale-commit-refused        task:{id}        }
    dead-letters                task:{id}        }
    source-history-changed      task:{id}        }
    worker-lost                 worker:{name}    a worker seen in the group is gone, for less than
                                                 event_resolve_seconds
    partition-offline           partition:{t}-{p}   offline for partition_offline_seconds
    partition-under-replicated  partition:{t}-{p}   under-replicated for
                                                    partition_under_replicated_seconds

Event monitors (task-failed, duplicate-execution, stale-commit-refused, dead-letters,
source-history-changed, worker-lost)
have no "clear" fact: the chosen rule is that each resolves after a quiet period,
`event_resolve_seconds` (300 s) after its newest event. Acknowledging one only says someone is on it (state
acknowledged); a newer event of the same kind while acknowledged opens it again and notifies
again. A task deleted resolves its alarms; a part of the facts that could not be read
(`Facts.unavailable`) neither raises nor resolves the alarms that depend on it.

`since` maps each condition's key to when it was first seen, so "for longer than" survives
evaluations and (stored by the evaluator) failovers. It also remembers each worker present, under
("worker-present", "worker:{name}"), since worker-lost is the absence of one seen before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.cluster.health import OFFLINE, UNDER_REPLICATED, PartitionHealth

CRITICAL = "critical"
WARNING = "warning"

TASK_LAG = "task-lag"
TASK_NOT_RUNNING = "task-not-running"
TASK_FAILED = "task-failed"
DUPLICATE_EXECUTION = "duplicate-execution"
STALE_COMMIT_REFUSED = "stale-commit-refused"
DEAD_LETTERS = "dead-letters"
SOURCE_HISTORY_CHANGED = "source-history-changed"  # sync.sources.binlog_history.HISTORY_CHANGED
WORKER_LOST = "worker-lost"
PARTITION_OFFLINE = "partition-offline"
PARTITION_UNDER_REPLICATED = "partition-under-replicated"

#: the event kinds the sync layer records under /tasks/{id}/alarms/, each a monitor of its own
EVENT_MONITORS = (
    TASK_FAILED, DUPLICATE_EXECUTION, STALE_COMMIT_REFUSED, DEAD_LETTERS, SOURCE_HISTORY_CHANGED,
)  # fmt: skip
TASK_MONITORS = (TASK_LAG, TASK_NOT_RUNNING, *EVENT_MONITORS)
MONITORS = (*TASK_MONITORS, WORKER_LOST, PARTITION_OFFLINE, PARTITION_UNDER_REPLICATED)

#: a lag this many times either threshold is critical; below it, a warning
LAG_CRITICAL_FACTOR = 10
#: since's bookkeeping key for a worker seen in the group (not a condition)
WORKER_PRESENT = "worker-present"
#: thresholds above this are refused (a typo, not a rule: ten years of seconds)
_THRESHOLD_MAX = 10 * 365 * 86400

Key = tuple[str, str]


# --- facts ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TaskFacts:
    id: str
    paused: bool = False
    running: bool = False  # a status znode exists
    lag_records: int | None = None
    lag_seconds: float | None = None
    error: str | None = None
    worker: str | None = None
    execution: str | None = None
    last_seen_running: float | None = None  # the status's last update, epoch seconds
    #: the task's newest alarm events, oldest first: {"kind": ..., "at": epoch seconds, ...}
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Facts:
    now: float
    tasks: list[TaskFacts] = field(default_factory=list)
    partitions: list[PartitionHealth] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)  # live worker names in the worker group
    brokers: list[int] = field(default_factory=list)  # live broker ids
    #: what could not be read, and why: "tasks", "task:{id}", "partitions", "workers", "brokers"
    unavailable: dict[str, str] = field(default_factory=dict)


# --- rules ----------------------------------------------------------------------------------------
class AlarmConfigError(ValueError):
    """A rules or webhooks document with a bad field; `field` names it, the message says why."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field


class RulesError(AlarmConfigError):
    pass


@dataclass(frozen=True, slots=True)
class TaskRules:
    """One task's overrides; None (or a monitor missing from `enabled`): the cluster default."""

    task_lag_records: int | None = None
    task_lag_seconds: float | None = None
    task_not_running_seconds: float | None = None
    event_resolve_seconds: float | None = None
    enabled: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What applies to one task: its overrides over the cluster defaults."""

    task_lag_records: int
    task_lag_seconds: float
    task_not_running_seconds: float
    event_resolve_seconds: float
    enabled: dict[str, bool]


def _all_enabled() -> dict[str, bool]:
    return dict.fromkeys(MONITORS, True)


@dataclass(frozen=True, slots=True)
class Rules:
    task_lag_records: int = 10_000
    task_lag_seconds: float = 60
    task_not_running_seconds: float = 60
    partition_offline_seconds: float = 0
    partition_under_replicated_seconds: float = 60
    event_resolve_seconds: float = 300
    enabled: dict[str, bool] = field(default_factory=_all_enabled)
    tasks: dict[str, TaskRules] = field(default_factory=dict)

    @property
    def worker_lost(self) -> bool:
        return self.enabled.get(WORKER_LOST, True)

    def for_task(self, task_id: str) -> Thresholds:
        o = self.tasks.get(task_id, TaskRules())

        def pick(name: str) -> Any:
            own = getattr(o, name)
            return getattr(self, name) if own is None else own

        return Thresholds(
            pick("task_lag_records"),
            pick("task_lag_seconds"),
            pick("task_not_running_seconds"),
            pick("event_resolve_seconds"),
            {m: o.enabled.get(m, self.enabled.get(m, True)) for m in TASK_MONITORS},
        )


_RECORDS = ("task_lag_records",)
_SECONDS = (
    "task_lag_seconds",
    "task_not_running_seconds",
    "partition_offline_seconds",
    "partition_under_replicated_seconds",
    "event_resolve_seconds",
)
_TASK_FIELDS = ("task_lag_records", "task_lag_seconds", "task_not_running_seconds", "event_resolve_seconds")


def _records(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**53:
        raise RulesError(where, "must be a non-negative integer")
    return value


def _seconds(value: Any, where: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= _THRESHOLD_MAX:
        raise RulesError(where, f"must be a non-negative number of seconds (at most {_THRESHOLD_MAX})")
    return value


def _enabled(doc: Any, where: str, allowed: tuple[str, ...]) -> dict[str, bool]:
    if not isinstance(doc, dict):
        raise RulesError(where, f"must be a mapping of monitor to true/false ({', '.join(allowed)})")
    out = {}
    for name, value in doc.items():
        if name not in allowed:
            raise RulesError(f"{where}.{name}", f"unknown monitor (known: {', '.join(allowed)})")
        if not isinstance(value, bool):
            raise RulesError(f"{where}.{name}", "must be true or false")
        out[name] = value
    return out


def _unknown(doc: dict[str, Any], known: Iterable[str], where: str) -> None:
    known = tuple(known)
    for name in doc:
        if name not in known:
            raise RulesError(f"{where}.{name}", f"unknown field (known: {', '.join(known)})")


def parse_rules(doc: Any) -> Rules:
    """Validate a rules document (JSON); a missing field takes its default. Errors name the field:
    `rules.tasks.orders.task_lag_records: must be a non-negative integer`."""
    if not isinstance(doc, dict):
        raise RulesError("rules", "must be a mapping")
    _unknown(doc, (*_RECORDS, *_SECONDS, "enabled", "tasks"), "rules")
    defaults = Rules()
    values: dict[str, Any] = {}
    for name in _RECORDS:
        values[name] = _records(doc.get(name, getattr(defaults, name)), f"rules.{name}")
    for name in _SECONDS:
        values[name] = _seconds(doc.get(name, getattr(defaults, name)), f"rules.{name}")
    enabled = {**_all_enabled(), **_enabled(doc.get("enabled", {}), "rules.enabled", MONITORS)}
    tasks_doc = doc.get("tasks", {})
    if not isinstance(tasks_doc, dict):
        raise RulesError("rules.tasks", "must be a mapping of task id to overrides")
    tasks = {}
    for task_id, over in tasks_doc.items():
        where = f"rules.tasks.{task_id}"
        if not task_id or "/" in task_id or len(task_id) > 63:
            raise RulesError(where, "a task id is 1-63 characters without '/'")
        if not isinstance(over, dict):
            raise RulesError(where, "must be a mapping of overrides")
        _unknown(over, (*_TASK_FIELDS, "enabled"), where)
        tasks[task_id] = TaskRules(
            task_lag_records=None
            if over.get("task_lag_records") is None
            else _records(over["task_lag_records"], f"{where}.task_lag_records"),
            **{
                name: None if over.get(name) is None else _seconds(over[name], f"{where}.{name}")
                for name in _TASK_FIELDS[1:]
            },
            enabled=_enabled(over.get("enabled", {}), f"{where}.enabled", TASK_MONITORS),
        )
    return Rules(**values, enabled=enabled, tasks=tasks)


def rules_to_doc(rules: Rules) -> dict[str, Any]:
    """The document `parse_rules` reads back into the same Rules, every default spelled out."""
    doc: dict[str, Any] = {name: getattr(rules, name) for name in (*_RECORDS, *_SECONDS)}
    doc["enabled"] = {m: rules.enabled.get(m, True) for m in MONITORS}
    doc["tasks"] = {}
    for task_id, over in sorted(rules.tasks.items()):
        entry: dict[str, Any] = {n: getattr(over, n) for n in _TASK_FIELDS if getattr(over, n) is not None}
        if over.enabled:
            entry["enabled"] = dict(over.enabled)
        doc["tasks"][task_id] = entry
    return doc


# --- evaluation -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Condition:
    key: Key  # (rule, subject), e.g. ("task-lag", "task:orders")
    severity: str  # CRITICAL | WARNING
    summary: str  # one line an operator can act on
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def rule(self) -> str:
        return self.key[0]

    @property
    def subject(self) -> str:
        return self.key[1]


def _secs(value: float) -> str:
    return f"{value:,.0f} s"


def _lag(t: TaskFacts, th: Thresholds) -> Condition | None:
    records, seconds = t.lag_records, t.lag_seconds
    over_records = records is not None and records > 0 and records >= th.task_lag_records
    over_seconds = seconds is not None and seconds > 0 and seconds >= th.task_lag_seconds
    if not (over_records or over_seconds):
        return None
    factor = LAG_CRITICAL_FACTOR
    critical = (over_records and records is not None and records >= factor * th.task_lag_records) or (
        over_seconds and seconds is not None and seconds >= factor * th.task_lag_seconds
    )
    behind = f"{records:,} records" if records is not None else "an unknown number of records"
    if seconds is not None:
        behind += f" ({_secs(seconds)})"
    summary = (
        f"task {t.id} is {behind} behind; threshold {th.task_lag_records:,} records / "
        f"{_secs(th.task_lag_seconds)}"
    )
    detail = {
        "task": t.id, "lag_records": records, "lag_seconds": seconds, "worker": t.worker,
        "threshold_records": th.task_lag_records, "threshold_seconds": th.task_lag_seconds,
    }  # fmt: skip
    return Condition((TASK_LAG, f"task:{t.id}"), CRITICAL if critical else WARNING, summary, detail)


def _not_running(t: TaskFacts, th: Thresholds, for_s: float) -> Condition:
    if t.running:
        why = f"its execution {t.execution} on worker {t.worker} reports: {t.error}"
    else:
        why = "no worker runs it (no execution status)"
    summary = (
        f"task {t.id} is not running for {_secs(for_s)}: {why}; threshold "
        f"{_secs(th.task_not_running_seconds)}; check `sluice task status {t.id}` and the workers"
    )
    detail = {
        "task": t.id, "running": t.running, "error": t.error, "worker": t.worker,
        "for_seconds": round(for_s, 1), "last_seen_running": t.last_seen_running,
        "threshold_seconds": th.task_not_running_seconds,
    }  # fmt: skip
    return Condition((TASK_NOT_RUNNING, f"task:{t.id}"), CRITICAL, summary, detail)


def _pair(value: Any, i: int) -> Any:
    return value[i] if isinstance(value, list) and len(value) > i else None


def _event_summary(task_id: str, kind: str, e: dict[str, Any], count: int, window_s: float) -> str:
    if kind == DUPLICATE_EXECUTION:
        workers, epochs = e.get("workers"), e.get("epochs")
        text = (
            f"task {task_id} ran twice at once: execution on worker {_pair(workers, 0)} (epoch "
            f"{_pair(epochs, 0)}) and on {_pair(workers, 1)} (epoch {_pair(epochs, 1)}); the target "
            "refuses the older epoch's commits; check that worker's network and ZooKeeper session"
        )
    elif kind == STALE_COMMIT_REFUSED:
        text = (
            f"task {task_id}: the target refused a stale commit from worker {e.get('worker')} "
            f"(epoch {e.get('epoch')}, the target holds {e.get('target_epoch')}); nothing stale was "
            "written, a newer execution owns the task"
        )
    elif kind == DEAD_LETTERS:
        text = (
            f"task {task_id}: the target refused {e.get('count')} change(s) (table {e.get('table')}: "
            f"{e.get('error')}); they are in {e.get('topic')}, the rest committed; fix the target or "
            f"the data, then `sluice dlq replay {task_id}`"
        )
    elif kind == SOURCE_HISTORY_CHANGED:
        text = f"task {task_id}: {e.get('detail')}"
    else:
        retry = e.get("retry_in_s")
        text = (
            f"task {task_id} failed on worker {e.get('worker')}: {e.get('error')} (attempt "
            f"{e.get('attempts')}{f', retrying in {retry} s' if retry is not None else ''})"
        )
    if count > 1:
        text += f"; {count} such events in the last {_secs(window_s)}"
    return text


def _events(t: TaskFacts, th: Thresholds, now: float) -> list[Condition]:
    out = []
    window = th.event_resolve_seconds
    for kind in EVENT_MONITORS:
        if not th.enabled[kind]:
            continue
        recent = [
            e for e in t.events
            if e.get("kind") == kind and isinstance(e.get("at"), (int, float)) and now - e["at"] < window
        ]  # fmt: skip
        if not recent:
            continue
        newest = max(recent, key=lambda e: e["at"])
        severity = CRITICAL if kind == DUPLICATE_EXECUTION else WARNING
        detail = {
            "task": t.id, "events": len(recent), "last_event_at": newest["at"], "last_event": newest,
            "resolves_after_quiet_seconds": window,
        }  # fmt: skip
        summary = _event_summary(t.id, kind, newest, len(recent), window)
        out.append(Condition((kind, f"task:{t.id}"), severity, summary, detail))
    return out


def evaluate(
    facts: Facts, rules: Rules, since: Mapping[Key, float]
) -> tuple[list[Condition], dict[Key, float]]:
    """Every condition that holds now, and `since` brought up to date (a key held for a condition
    pending its "for longer than" threshold, or raised; dropped when the condition clears)."""
    now = facts.now
    new_since: dict[Key, float] = {}
    conditions: list[Condition] = []

    def held_for(key: Key) -> float:
        first = min(since.get(key, now), now)
        new_since[key] = first
        return now - first

    for t in facts.tasks:
        th = rules.for_task(t.id)
        if not t.paused:
            if th.enabled[TASK_LAG] and t.running and t.error is None:
                lag = _lag(t, th)
                if lag is not None:
                    conditions.append(lag)
            if th.enabled[TASK_NOT_RUNNING] and (not t.running or t.error is not None):
                key = (TASK_NOT_RUNNING, f"task:{t.id}")
                down_s = held_for(key)
                if down_s >= th.task_not_running_seconds:
                    conditions.append(_not_running(t, th, down_s))
        conditions.extend(_events(t, th, now))

    for p in facts.partitions:
        name = f"{p.topic}-{p.partition}"
        if p.status == OFFLINE:
            rule, threshold, severity = PARTITION_OFFLINE, rules.partition_offline_seconds, CRITICAL
        elif p.status == UNDER_REPLICATED:
            rule, severity = PARTITION_UNDER_REPLICATED, WARNING
            threshold = rules.partition_under_replicated_seconds
        else:
            continue
        if not rules.enabled.get(rule, True):
            continue
        key = (rule, f"partition:{name}")
        bad_s = held_for(key)
        if bad_s < threshold:
            continue
        if rule == PARTITION_OFFLINE:
            summary = f"partition {name} is offline: {p.reason}"
        else:
            summary = (
                f"partition {name} is under-replicated for {_secs(bad_s)}: {p.reason}; threshold "
                f"{_secs(threshold)}"
            )
        detail = {
            "topic": p.topic, "partition": p.partition, "status": p.status, "reason": p.reason,
            "leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isr),
            "for_seconds": round(bad_s, 1), "threshold_seconds": threshold,
        }  # fmt: skip
        conditions.append(Condition(key, severity, summary, detail))

    if "workers" not in facts.unavailable:
        present = set(facts.workers)
        for w in present:
            held_for((WORKER_PRESENT, f"worker:{w}"))
        known = {k[1][len("worker:") :] for k in since if k[0] in (WORKER_PRESENT, WORKER_LOST)}
        for w in sorted(known - present):
            key = (WORKER_LOST, f"worker:{w}")
            gone_s = held_for(key)
            if gone_s >= rules.event_resolve_seconds:
                del new_since[key]  # quiet long enough: forget this worker
                continue
            if rules.worker_lost:
                summary = (
                    f"worker {w} left the worker group {_secs(gone_s)} ago; its tasks move to the "
                    f"{len(present)} remaining worker(s); restart it or check its host"
                )
                detail = {"worker": w, "for_seconds": round(gone_s, 1), "workers": sorted(present)}
                conditions.append(Condition(key, CRITICAL if not present else WARNING, summary, detail))

    # What could not be read keeps its bookkeeping: a hiccup neither restarts a "for longer than"
    # nor forgets a worker.
    for key, first in since.items():
        if key not in new_since and unknown(key, facts):
            new_since[key] = first
    return conditions, new_since


def unknown(key: Key, facts: Facts) -> bool:
    """Whether the facts a condition with this key depends on could not be read this time."""
    rule, subject = key
    missing = facts.unavailable
    if rule in TASK_MONITORS:
        return "tasks" in missing or subject in missing
    if rule in (WORKER_LOST, WORKER_PRESENT):
        return "workers" in missing
    if rule in (PARTITION_OFFLINE, PARTITION_UNDER_REPLICATED):
        return "partitions" in missing
    return False


# --- the changes to the stored alarms -------------------------------------------------------------
RAISE = "raise"  # a new alarm (notified: raised)
UPDATE = "update"  # severity changed (notified: updated)
REOPEN = "reopen"  # acknowledged, and a newer event came (notified: raised)
REFRESH = "refresh"  # figures changed, same severity (stored quietly)
RESOLVE = "resolve"  # the condition cleared (notified: resolved)


@dataclass(frozen=True, slots=True)
class Change:
    action: str
    key: Key
    condition: Condition | None  # None for RESOLVE
    alarm: dict[str, Any] | None  # the stored alarm it changes; None for RAISE


def plan(active: Iterable[dict[str, Any]], conditions: Iterable[Condition], facts: Facts) -> list[Change]:
    """What to do to the active (open or acknowledged) alarms so that there is exactly one per
    condition holding now: raise the new, update or refresh the held, resolve the cleared (unless
    their facts could not be read)."""
    by_key: dict[Key, dict[str, Any]] = {}
    changes: list[Change] = []
    for alarm in sorted(active, key=lambda a: (a.get("raised_at") or 0, a.get("id", "")), reverse=True):
        key = (alarm["rule"], alarm["subject"])
        if key in by_key:  # never expected (one index entry per key): keep the newest
            changes.append(Change(RESOLVE, key, None, alarm))
        else:
            by_key[key] = alarm
    seen: set[Key] = set()
    for c in conditions:
        if c.key in seen:
            continue
        seen.add(c.key)
        held = by_key.get(c.key)
        if held is None:
            changes.append(Change(RAISE, c.key, c, None))
        elif held.get("severity") != c.severity:
            changes.append(Change(UPDATE, c.key, c, held))
        elif held.get("state") == "acknowledged" and _newer_event(c, held):
            changes.append(Change(REOPEN, c.key, c, held))
        elif held.get("summary") != c.summary or held.get("detail") != c.detail:
            changes.append(Change(REFRESH, c.key, c, held))
    for key, gone in by_key.items():
        if key not in seen and not unknown(key, facts):
            changes.append(Change(RESOLVE, key, None, gone))
    return changes


def _newer_event(c: Condition, alarm: dict[str, Any]) -> bool:
    at = c.detail.get("last_event_at")
    held = (alarm.get("detail") or {}).get("last_event_at")
    return isinstance(at, (int, float)) and isinstance(held, (int, float)) and at > held

"""Alarms, their rules and webhooks in ZooKeeper (a kazoo client on the cluster's chroot).

    /manager/alarms/{id}            one alarm (JSON, below); ids sort by the time raised
    /manager/alarm_rules            the rules document (rules.parse_rules)
    /manager/webhooks               the webhooks list (webhooks.parse_webhooks)
    /manager/alarm_state            the evaluator's bookkeeping: `since` (when each condition was
                                    first seen) and the index of active alarms, (rule, subject) ->
                                    id, so that a new evaluator after a failover neither notifies
                                    again nor forgets
    /manager/alarm_evaluator/contenders/   the evaluators' election (zkstore.LeaderElection)
    /manager/alarm_evaluator/epoch         its fencing counter

An alarm: {"id", "rule", "subject", "severity", "state": "open"|"acknowledged"|"resolved",
"summary", "detail", "raised_at", "updated_at", "acknowledged_by", "acknowledged_at",
"resolved_at", "notifications": [{"webhook", "event", "at", "ok", "attempts", "error"}]}.

The evaluator changes alarms only through :meth:`AlarmStore.commit`: the alarms it raises,
updates and resolves and the new bookkeeping go in one multi-op, conditional on every version
read and on the evaluator's fencing epoch. So there is one active alarm per (rule, subject)
whatever happens (the index changes with the alarms), a concurrent acknowledgement is never lost
(the commit is refused and planned again), and an evaluator that lost its leadership cannot write.
"""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, RolledBackError

from sluice.cluster.zkstore import update_znode
from sluice.manager.alarms.rules import (
    RAISE,
    REFRESH,
    REOPEN,
    RESOLVE,
    UPDATE,
    Change,
    Key,
    Rules,
    parse_rules,
    rules_to_doc,
)
from sluice.manager.alarms.webhooks import parse_webhooks

ROOT = "/manager"
ALARMS = "/manager/alarms"
RULES = "/manager/alarm_rules"
WEBHOOKS = "/manager/webhooks"
STATE = "/manager/alarm_state"
ELECTION = "/manager/alarm_evaluator/contenders"
EPOCH = "/manager/alarm_evaluator/epoch"

OPEN, ACKNOWLEDGED, RESOLVED = "open", "acknowledged", "resolved"
STATES = (OPEN, ACKNOWLEDGED, RESOLVED)
#: resolved alarms kept; beyond, the oldest (by time raised) are removed
RESOLVED_KEPT = 500
#: notification records kept per alarm (the newest)
NOTIFICATIONS_KEPT = 20
#: alarm changes per commit: a multi-op stays far below ZooKeeper's 1 MB request limit; the rest
#: goes in the next evaluation
CHANGES_PER_COMMIT_MAX = 100
#: a read-modify-write of one alarm retries at most this often on conflicting writes
UPDATE_TRIES = 20


class AlarmNotFoundError(KeyError):
    pass


class ConcurrentChangeError(RuntimeError):
    """Something the commit was planned on changed meanwhile (an acknowledgement, a notification
    record): read again and plan again."""


class FencedOutError(RuntimeError):
    """Another evaluator took the fencing epoch: this one no longer leads and wrote nothing."""


@dataclass(frozen=True, slots=True)
class Transition:
    """A change that people hear of: event "raised" | "updated" | "resolved", the alarm after it."""

    event: str
    alarm: dict[str, Any]


@dataclass
class Snapshot:
    """What the evaluator plans on: the bookkeeping and the active alarms, with their versions."""

    since: dict[Key, float] = field(default_factory=dict)
    index: dict[Key, str] = field(default_factory=dict)  # active alarm ids
    state_version: int = -1  # -1: no bookkeeping yet
    alarms: dict[Key, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # alarm id -> znode version


def _new_id(now: float) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"


def _path(alarm_id: str) -> str:
    if not alarm_id or "/" in alarm_id or alarm_id in (".", ".."):
        raise AlarmNotFoundError(alarm_id)
    return f"{ALARMS}/{alarm_id}"


class AlarmStore:
    def __init__(self, client: Any, *, resolved_kept: int = RESOLVED_KEPT) -> None:
        from kazoo.retry import KazooRetry

        assert resolved_kept >= 0
        self.zk = client
        self.resolved_kept = resolved_kept
        # Connection loss is retried briefly: an API request must answer within seconds, and the
        # evaluator tries again on its next pass anyway.
        self._retry = KazooRetry(max_tries=5, delay=0.1, max_delay=1.0, deadline=10.0, ignore_expire=True)
        self._call(self.zk.ensure_path, ALARMS)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._retry.copy()(fn, *args, **kwargs)

    # --- alarms, as the API and the console see them -------------------------------------------------
    def _read(self, ids: Iterable[str]) -> dict[str, tuple[dict[str, Any], int]]:
        """Pipelined reads (one round trip for them all); missing ones are left out."""
        pending = [(i, self.zk.get_async(_path(i))) for i in ids]
        out = {}
        for alarm_id, result in pending:
            try:
                data, stat = result.get(timeout=10)
            except NoNodeError:
                continue
            out[alarm_id] = (orjson.loads(data), int(stat.version))
        return out

    def list(self, state: str | None = None) -> list[dict[str, Any]]:
        """Alarms, newest first; only those in `state` ("open", "acknowledged", "resolved")."""
        if state is not None and state not in STATES:
            raise ValueError(f"state: must be one of {', '.join(STATES)}, not {state!r}")
        ids = self._call(self.zk.get_children, ALARMS)
        alarms = [
            a for a, _ in self._call(self._read, ids).values() if state is None or a.get("state") == state
        ]
        return sorted(alarms, key=lambda a: (a.get("raised_at") or 0, a.get("id", "")), reverse=True)

    def get(self, alarm_id: str) -> dict[str, Any]:
        try:
            data, _ = self._call(self.zk.get, _path(alarm_id))
        except NoNodeError:
            raise AlarmNotFoundError(alarm_id) from None
        alarm: dict[str, Any] = orjson.loads(data)
        return alarm

    def _update(self, alarm_id: str, change: Any) -> dict[str, Any]:
        def apply(data: bytes | None) -> bytes | None:
            if data is None:
                raise AlarmNotFoundError(alarm_id)  # never create an alarm here
            new = change(orjson.loads(data))
            return None if new is None else orjson.dumps(new)

        stored = self._call(update_znode, self.zk, _path(alarm_id), apply, max_tries=UPDATE_TRIES)
        result: dict[str, Any] = orjson.loads(stored)
        return result

    def acknowledge(self, alarm_id: str, user: str) -> dict[str, Any]:
        """open -> acknowledged by `user`. Idempotent: an acknowledged or resolved alarm is
        returned as it is."""
        if not isinstance(user, str) or not user:
            raise ValueError("user: must name who acknowledges")

        def ack(alarm: dict[str, Any]) -> dict[str, Any] | None:
            if alarm.get("state") != OPEN:
                return None
            now = time.time()
            return {**alarm, "state": ACKNOWLEDGED, "acknowledged_by": user, "acknowledged_at": now,
                    "updated_at": now}  # fmt: skip

        return self._update(alarm_id, ack)

    def add_notification(self, alarm_id: str, record: dict[str, Any]) -> None:
        """Append a delivery's outcome to the alarm's notifications (the newest kept); an alarm
        removed meanwhile is left removed."""

        def add(alarm: dict[str, Any]) -> dict[str, Any]:
            notes = [*alarm.get("notifications", []), record][-NOTIFICATIONS_KEPT:]
            return {**alarm, "notifications": notes}

        try:
            self._update(alarm_id, add)
        except AlarmNotFoundError:
            pass

    # --- rules and webhooks -------------------------------------------------------------------------
    def _doc(self, path: str) -> Any:
        try:
            data, _ = self._call(self.zk.get, path)
        except NoNodeError:
            return None
        return orjson.loads(data) if data else None

    def _put(self, path: str, doc: Any) -> None:
        data = orjson.dumps(doc)
        self._call(update_znode, self.zk, path, lambda _: data)

    def rules(self) -> Rules:
        doc = self._doc(RULES)
        return Rules() if doc is None else parse_rules(doc)

    def set_rules(self, doc: Any) -> Rules:
        """Validate (RulesError names the bad field) and store; returns the rules in force."""
        rules = parse_rules(doc)
        self._put(RULES, rules_to_doc(rules))
        return rules

    def webhooks(self) -> builtins.list[dict[str, Any]]:
        doc = self._doc(WEBHOOKS)
        return [] if doc is None else parse_webhooks(doc)

    def set_webhooks(self, doc: Any) -> builtins.list[dict[str, Any]]:
        """Validate (WebhookConfigError names the bad field, `webhooks[1].url`) and store."""
        hooks = parse_webhooks(doc)
        self._put(WEBHOOKS, hooks)
        return hooks

    # --- the evaluator's side -----------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        try:
            data, stat = self._call(self.zk.get, STATE)
            doc = orjson.loads(data) if data else {}
            version = int(stat.version)
        except NoNodeError:
            doc, version = {}, -1
        snap = Snapshot(
            since={(r, s): float(t) for r, s, t in doc.get("since", [])},
            index={(r, s): i for r, s, i in doc.get("active", [])},
            state_version=version,
        )
        read = self._call(self._read, snap.index.values())
        for key, alarm_id in list(snap.index.items()):
            if alarm_id not in read:  # removed by hand: the next commit drops it from the index
                del snap.index[key]
                continue
            alarm, alarm_version = read[alarm_id]
            snap.alarms[key] = alarm
            snap.versions[alarm_id] = alarm_version
        return snap

    def commit(
        self,
        snap: Snapshot,
        changes: builtins.list[Change],
        since: dict[Key, float],
        now: float,
        fence: tuple[str, int] | None = None,
    ) -> builtins.list[Transition]:
        """Apply `changes` (planned on `snap`) and the new `since` in one multi-op, checked
        against every version `snap` read and the evaluator's `fence` (epoch path, znode
        version). ConcurrentChangeError: plan again; FencedOutError: not leading any more."""
        changes = changes[:CHANGES_PER_COMMIT_MAX]
        index = dict(snap.index)
        tx = self.zk.transaction()
        if fence is not None:
            tx.check(fence[0], fence[1])
        out: builtins.list[Transition] = []
        for change in changes:
            alarm, event = self._apply(change, now)
            if change.action == RAISE:
                tx.create(_path(alarm["id"]), orjson.dumps(alarm))
                index[change.key] = alarm["id"]
            else:
                assert change.alarm is not None
                tx.set_data(_path(alarm["id"]), orjson.dumps(alarm), snap.versions[alarm["id"]])
                if change.action == RESOLVE and index.get(change.key) == alarm["id"]:
                    del index[change.key]
            if event is not None:
                out.append(Transition(event, alarm))
        doc = {
            "since": sorted([r, s, t] for (r, s), t in since.items()),
            "active": sorted([r, s, i] for (r, s), i in index.items()),
        }
        if not changes and since == snap.since and index == snap.index and snap.state_version >= 0:
            return []  # nothing to write
        doc["updated_at"] = now
        data = orjson.dumps(doc)
        if snap.state_version < 0:
            tx.create(STATE, data)  # /manager exists: made with ALARMS
        else:
            tx.set_data(STATE, data, snap.state_version)
        # Once, not retried: a transaction object commits once, and a lost reply is found out by
        # the next plan (its version checks refuse what was already written).
        results = tx.commit()
        failures = [r for r in results if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not failures:
            return out
        if fence is not None and isinstance(results[0], (BadVersionError, NoNodeError)):
            raise FencedOutError(f"{fence[0]} moved on: another evaluator leads")
        if all(isinstance(f, (BadVersionError, NodeExistsError, NoNodeError)) for f in failures):
            raise ConcurrentChangeError(", ".join(type(f).__name__ for f in failures))
        raise failures[0]

    @staticmethod
    def _apply(change: Change, now: float) -> tuple[dict[str, Any], str | None]:
        """The alarm after `change`, and the event people hear of (None: stored quietly)."""
        c = change.condition
        if change.action == RAISE:
            assert c is not None
            alarm = {
                "id": _new_id(now), "rule": c.rule, "subject": c.subject, "severity": c.severity,
                "state": OPEN, "summary": c.summary, "detail": c.detail, "raised_at": now, "updated_at": now,
                "acknowledged_by": None, "acknowledged_at": None, "resolved_at": None, "notifications": [],
            }  # fmt: skip
            return alarm, "raised"
        assert change.alarm is not None
        alarm = {**change.alarm, "updated_at": now}
        if change.action == RESOLVE:
            alarm.update(state=RESOLVED, resolved_at=now)
            return alarm, "resolved"
        assert c is not None
        alarm.update(severity=c.severity, summary=c.summary, detail=c.detail)
        if change.action == UPDATE:
            return alarm, "updated"
        if change.action == REOPEN:
            alarm.update(state=OPEN, acknowledged_by=None, acknowledged_at=None)
            return alarm, "raised"
        assert change.action == REFRESH
        return alarm, None

    def prune(self) -> int:
        """Remove the oldest resolved alarms beyond `resolved_kept`; returns how many."""
        index = set(self.snapshot().index.values())
        ids = sorted(self._call(self.zk.get_children, ALARMS))
        resolved = [i for i in ids if i not in index]
        removed = 0
        for alarm_id in resolved[: max(0, len(resolved) - self.resolved_kept)]:
            try:
                data, stat = self._call(self.zk.get, _path(alarm_id))
                if orjson.loads(data).get("state") != RESOLVED:
                    continue  # raised meanwhile (not ours to remove)
                self._call(self.zk.delete, _path(alarm_id), version=stat.version)
                removed += 1
            except (NoNodeError, BadVersionError):
                continue
        return removed

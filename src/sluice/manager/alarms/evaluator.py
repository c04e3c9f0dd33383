"""The alarm evaluator: every `interval_s`, the one manager that leads (a ZooKeeper election
among the managers) reads the facts, decides the conditions with the rules, commits the alarms
that change, and hands each notice to the webhooks. The others wait, ready to take over: the
stored bookkeeping and active alarms are all a successor needs, so it neither notifies again what
is already open nor forgets what was pending.

    evaluator = AlarmEvaluator(zk, tasks, bootstrap, identity="manager-1")
    evaluator.start()   # a daemon thread
    ...
    evaluator.stop()    # leaves the election; a standby takes over within its interval
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sluice.cluster.zkstore import LeaderElection, ZkStore
from sluice.manager.alarms.facts import DEFAULT_WORKER_GROUP, EventCache, collect_facts
from sluice.manager.alarms.rules import evaluate, plan
from sluice.manager.alarms.store import (
    ELECTION,
    EPOCH,
    AlarmStore,
    ConcurrentChangeError,
    FencedOutError,
    Transition,
)
from sluice.manager.alarms.webhooks import Dispatcher
from sluice.sync.tasks import TaskStore

log = logging.getLogger("sluice.manager.alarms")

#: a commit refused because an alarm changed meanwhile (an acknowledgement, a notice recorded) is
#: planned again at most this often per evaluation
COMMIT_TRIES = 5

#: deliver(webhooks, event, alarm): hands one notice to every webhook; must not block for long
Deliver = Callable[[list[dict[str, Any]], str, dict[str, Any]], None]


class AlarmEvaluator:
    def __init__(
        self,
        zk: ZkStore,
        tasks: TaskStore,
        bootstrap: str,
        *,
        identity: str,
        interval_s: float = 5.0,
        worker_group: str = DEFAULT_WORKER_GROUP,
        deliver: Deliver | None = None,
    ) -> None:
        assert interval_s > 0
        self.zk = zk
        self.tasks = tasks
        self.bootstrap = bootstrap
        self.identity = identity
        self.interval_s = interval_s
        self.worker_group = worker_group
        self.store = AlarmStore(zk.client)
        self.election = LeaderElection(zk.client, ELECTION, identity, EPOCH)
        self.dispatcher: Dispatcher | None = None
        if deliver is None:
            self.dispatcher = Dispatcher(self.store.add_notification)
            deliver = self.dispatcher.submit
        self.deliver = deliver
        self._events = EventCache()
        self._leading = False
        #: passes completed while leading, and when the last one ended (for the console, tests)
        self.passes = 0
        self.last_pass_at: float | None = None
        self._missing: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self._leading

    def start(self) -> None:
        assert self._thread is None, "started already"
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"alarm-evaluator-{self.identity}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop evaluating and leave the election (a standby takes over on its next pass)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._set_leading(False)
        self.election.resign()
        if self.dispatcher is not None:
            self.dispatcher.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.evaluate_once()
            except Exception as exc:  # one bad pass must not end evaluation
                log.warning("event=alarm_evaluation_failed identity=%s error=%s", self.identity, exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _set_leading(self, leading: bool) -> None:
        if leading != self._leading:
            log.info(
                "event=alarm_evaluator_%s identity=%s", "leading" if leading else "standby", self.identity
            )
        self._leading = leading

    def evaluate_once(self, now: float | None = None) -> list[Transition]:
        """One pass: nothing unless this evaluator leads; the transitions written and delivered."""
        try:
            fence = self.election.lead()
        except Exception as exc:  # ZooKeeper out of reach: whoever leads, it is not us now
            log.warning("event=alarm_election_failed identity=%s error=%s", self.identity, exc)
            fence = None
        if fence is None:
            self._set_leading(False)
            return []
        self._set_leading(True)
        facts = collect_facts(
            self.zk, self.tasks, self.bootstrap, self.worker_group, now, events=self._events
        )
        missing = frozenset(facts.unavailable)
        if missing != self._missing:
            if missing:
                log.warning("event=alarm_facts_partial missing=%s why=%s", ",".join(sorted(missing)),
                            "; ".join(f"{k}: {v}" for k, v in sorted(facts.unavailable.items())))  # fmt: skip
            else:
                log.info("event=alarm_facts_complete")
            self._missing = missing
        rules = self.store.rules()
        for _ in range(COMMIT_TRIES):
            snap = self.store.snapshot()
            conditions, since = evaluate(facts, rules, snap.since)
            changes = plan(snap.alarms.values(), conditions, facts)
            try:
                transitions = self.store.commit(snap, changes, since, facts.now, fence=(EPOCH, fence[1]))
                break
            except ConcurrentChangeError:
                continue
            except FencedOutError:
                # Another evaluator took the epoch while this one thought it led (paused past its
                # session): nothing was written. Contend again, from the back of the queue.
                log.warning("event=alarm_evaluator_fenced identity=%s", self.identity)
                self._set_leading(False)
                self.election.resign()
                return []
        else:
            log.warning("event=alarm_commit_contended identity=%s tries=%d", self.identity, COMMIT_TRIES)
            return []
        for t in transitions:
            a = t.alarm
            log.info("alarm %s id=%s rule=%s subject=%s severity=%s", t.event, a["id"], a["rule"],
                     a["subject"], a["severity"])  # fmt: skip
        if transitions:
            webhooks = self.store.webhooks()
            for t in transitions:
                if webhooks:
                    self.deliver(webhooks, t.event, t.alarm)
            if any(t.event == "resolved" for t in transitions):
                self.store.prune()
        self.passes += 1
        self.last_pass_at = facts.now
        return transitions

"""The cluster controller: one broker at a time decides partition leadership.

Election is an ephemeral ``/controller`` znode plus an increment of ``/controller_epoch``
(a :class:`FencingCounter`). Every write the controller makes is a multi-op that checks the
version of ``/controller_epoch`` (``ZkStore.commit_fenced``), so a deposed controller cannot
write (I4).

The controller decides from the process's :class:`ClusterView`, which follows every partition
state write through the state-change notices, and does work in proportion to what changed:

- on taking its epoch it catches the view up (lists and unapplied notices only), so it decides
  from every change written before its term began;
- a notice, a new topic or a dead, new or re-registered broker marks the partitions it touches;
  a pass decides those with the pure rules (``election.next_partition_state``) and writes every
  change in as few fenced multi-ops as ZooKeeper's request limit allows, all in flight at once;
- each write is conditional on the state's znode version as held, so a view that is behind can
  only get a write refused (the partitions are then read again and decided next pass), never
  overwrite a newer state;
- the periodic sweep (incident B) catches up (a handful of list reads) and every few passes
  decides every partition from memory, so a leaderless partition with a live in-sync replica
  gets a leader within seconds however it came about.

Events are processed one at a time on the controller's own thread. So are the admin requests
a broker hands it (``run_admin``: CreatePartitions, ElectLeaders, AlterPartitionReassignments,
``cluster/admin_requests.py``), each with the term it acts under, and the automatic rebalance
of leadership to preferred replicas (``auto.leader.rebalance.enable``): every write they make
goes through the same fenced gate.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import NodeExistsError
from kazoo.protocol.states import KazooState

from sluice import metrics, test_switches
from sluice.cluster import admin_requests, layout
from sluice.cluster.election import initial_partition_state, next_partition_state, offline_partition_leader
from sluice.cluster.layout import PartitionState, StateWrite, TopicAssignment
from sluice.cluster.state_machine import check_partition_transition, partition_phase
from sluice.cluster.view import ClusterView
from sluice.cluster.zkstore import (
    ZOOKEEPER_UNREACHABLE,
    ControllerDeposedError,
    ControllerTerm,
    FencedOp,
    ZkStore,
)

log = logging.getLogger("sluice.controller")

REASSIGNMENT_SWEEP_S = 0.25
#: every this many sweeps, decide every partition (not only those marked changed)
FULL_PASS_EVERY = 5
#: state-change notices older than this are deleted; a broker that was away longer than its
#: ZooKeeper session reads every state again, so this only needs to outlast a session
NOTICE_TTL_S = 60.0

Group = tuple[list[FencedOp], list[StateWrite]]


class NotControllerError(RuntimeError):
    """An admin request reached a broker that is not (or no longer) the controller; the client
    asks the controller named in Metadata again (Kafka's NOT_CONTROLLER)."""


@dataclass(frozen=True, slots=True)
class LeaderBalance:
    """``auto.leader.rebalance.enable`` and its two settings (Kafka's names and defaults)."""

    enabled: bool = True
    check_interval_s: float = 300.0
    imbalance_percentage: int = 10


class Controller:
    """Runs inside every broker; acts only while this broker holds ``/controller``."""

    def __init__(
        self,
        store: ZkStore,
        broker_id: int,
        *,
        sweep_interval_s: float = 2.0,
        view: ClusterView | None = None,
        switches: test_switches.Switches = test_switches.OFF,
        leader_balance: LeaderBalance | None = None,
    ):
        self.store = store
        self.broker_id = broker_id
        self.sweep_interval_s = sweep_interval_s
        self.term: ControllerTerm | None = None
        self.reassigning = False
        #: a view of its own when not sharing a broker's (tests, tools); started on first use
        self.view = view if view is not None else ClusterView(store)
        self._view_started = view is not None
        self.view.listeners.append(self._on_view_change)
        #: the live brokers of the previous pass (only the test switch below looks at it)
        self._previously_live: set[int] | None = None
        #: broker epochs as of the last pass: a changed one is a broker that restarted
        self._known_epochs: dict[int, int] | None = None
        #: partitions whose decision must exclude a restarted broker until it is written
        self._bounced: dict[tuple[str, int], frozenset[int]] = {}
        self._sweep_disabled = switches.disable_leaderless_sweep
        self._reassignment_disabled = switches.disable_reassignment
        self._lock = threading.Lock()
        self._dirty: set[tuple[str, int]] = set()
        self._everything = True
        #: topics whose partition znodes are created checking what exists (after a refused create)
        self._careful_topics: set[str] = set()
        self._passes = 0
        self._pending: set[str] = set()
        self._wake = threading.Condition()
        self._stopped = threading.Event()
        #: admin requests waiting for the controller's thread (run_admin)
        self._admin_jobs: list[tuple[Callable[[Controller, ControllerTerm], Any], Future[Any]]] = []
        self.leader_balance = leader_balance or LeaderBalance()
        #: when the next automatic rebalance check is due (monotonic s), set at each term's start
        self._next_balance_check = float("inf")
        self._thread = threading.Thread(target=self._run, name=f"controller-{broker_id}", daemon=True)

    @property
    def is_active(self) -> bool:
        return self.term is not None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._ensure_view()
        self._thread.start()
        self.store.add_session_listener(self._on_session_state)
        self.store.watch_children(layout.DELETE_TOPICS, lambda children: self._post("topics_changed"))
        self.store.watch_data(layout.REASSIGN_PARTITIONS, lambda data, stat: self._post("reassignment"))
        self._post("controller_changed")

    def _ensure_view(self) -> None:
        if not self._view_started:
            self._view_started = True
            self.view.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the controller's thread and resign, within ``timeout_s`` whatever ZooKeeper does.

        While ZooKeeper answers, the thread finishes its pass and ``/controller`` is deleted (the
        brokers elect the next controller at once). While it does not, neither is waited for:
        the thread, blocked in a call, is released by the session's close, and ``/controller``,
        ephemeral, goes with the session (kazoo would hold the delete until it reconnects, and
        it retries forever: a controller's stop waited there for good)."""
        deadline = time.monotonic() + timeout_s
        self._stopped.set()
        self._post("stop")
        # (a broker that failed to start never started the thread)
        if self._thread.ident is not None and self.store.connected:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.term is not None:
            self._resign("broker stopping", timeout_s=max(0.0, deadline - time.monotonic()))
        self._fail_admin_jobs("the broker is stopping")

    def run_admin(self, job: Callable[[Controller, ControllerTerm], Any]) -> Future[Any]:
        """Run ``job(controller, term)`` on the controller's thread, after the pass that follows
        (so it decides from a view that has every change seen so far), while this broker is the
        controller; otherwise the future fails with NotControllerError."""
        future: Future[Any] = Future()
        if self._stopped.is_set():
            future.set_exception(NotControllerError(f"broker {self.broker_id} is stopping"))
            return future
        with self._lock:
            self._admin_jobs.append((job, future))
        self._post("admin")
        return future

    def _run_admin_jobs(self) -> None:
        with self._lock:
            jobs, self._admin_jobs = self._admin_jobs, []
        for job, future in jobs:
            term = self.term
            if term is None:
                future.set_exception(NotControllerError(f"broker {self.broker_id} is not the controller"))
                continue
            try:
                future.set_result(job(self, term))
            except ControllerDeposedError as exc:
                future.set_exception(NotControllerError(str(exc)))
                self._resign(str(exc))
            except ZOOKEEPER_UNREACHABLE as exc:
                log.warning(
                    "event=controller_admin_request_failed broker=%d error=%r reason=zookeeper_unreachable",
                    self.broker_id,
                    exc,
                )
                future.set_exception(exc)
            except Exception as exc:
                log.exception("event=controller_admin_request_failed broker=%d", self.broker_id)
                future.set_exception(exc)

    def _fail_admin_jobs(self, why: str) -> None:
        with self._lock:
            jobs, self._admin_jobs = self._admin_jobs, []
        for _, future in jobs:
            future.set_exception(NotControllerError(why))

    def excluded_from(self, key: tuple[str, int]) -> frozenset[int]:
        """Brokers that restarted since they were last written out of this partition's ISR:
        they may not be elected for it yet (see ``reconcile``)."""
        return self._bounced.get(key, frozenset())

    def _post(self, event: str) -> None:
        with self._wake:
            self._pending.add(event)
            self._wake.notify()

    def _on_view_change(self, kind: str, topic: str, partition: int) -> None:
        """Called by the view (kazoo's thread): remember what changed, wake the loop."""
        with self._lock:
            if kind == "partition":
                self._dirty.add((topic, partition))
            elif kind == "topic":
                assignment = self.view.topic(topic)
                self._dirty.update((topic, p) for p in (assignment.replicas if assignment else ()))
            elif kind in ("brokers", "shutdown"):
                self._everything = True
        if kind == "controller":
            self._post("controller_changed")
        elif kind != "topic_deleted":
            self._post("changed")

    def _on_session_state(self, state: KazooState) -> None:
        if state == KazooState.LOST and self.term is not None:
            log.info("event=controller_session_lost broker=%d epoch=%d", self.broker_id, self.term.epoch)
            self.term = None
        if state == KazooState.CONNECTED:
            self._post("controller_changed")

    # -- the event loop --------------------------------------------------------------------------

    def _run(self) -> None:
        next_sweep = time.monotonic()
        while not self._stopped.is_set():
            with self._wake:
                timeout = max(0.0, next_sweep - time.monotonic())
                if not self._pending:
                    self._wake.wait(timeout)
                events, self._pending = self._pending, set()
            if "stop" in events:
                return
            if not events or time.monotonic() >= next_sweep:
                events.add("sweep")
                # While partitions move, look again soon: each phase waits on a broker's progress.
                interval = REASSIGNMENT_SWEEP_S if self.reassigning else self.sweep_interval_s
                next_sweep = time.monotonic() + interval
            event = (
                "controller_changed"
                if "controller_changed" in events
                else "sweep"
                if "sweep" in events
                else sorted(events)[0]
            )
            self.dispatch(event)

    def dispatch(self, event: str) -> None:
        """Handle one event; a fenced write that fails its epoch check makes this controller resign."""
        try:
            self._handle(event)
        except ControllerDeposedError as exc:
            self._resign(str(exc))
        except ZOOKEEPER_UNREACHABLE as exc:
            # ZooKeeper went away with a call in flight (its outcome unknown): the next pass once
            # the session is back decides again from what ZooKeeper holds. At stop, the session's
            # close ends the call on purpose.
            if not self._stopped.is_set():
                log.warning(
                    "event=controller_zookeeper_unreachable broker=%d event=%s error=%r "
                    "action='deciding again once ZooKeeper answers'",
                    self.broker_id,
                    event,
                    exc,
                )
        except Exception:
            log.exception("event=controller_error broker=%d event=%s", self.broker_id, event)

    def _handle(self, event: str) -> None:
        if self.term is None:
            if event in ("controller_changed", "sweep"):
                self._try_elect()
            if self.term is None:
                self._fail_admin_jobs(f"broker {self.broker_id} is not the controller")
                return
        if event == "sweep":
            self._passes += 1
            if self._passes % FULL_PASS_EVERY == 0:
                with self._lock:
                    self._everything = True
            self._trim_notices()
        self.reconcile()
        self._run_admin_jobs()
        if event == "sweep" and time.monotonic() >= self._next_balance_check:
            self._next_balance_check = time.monotonic() + self.leader_balance.check_interval_s
            self._rebalance_leaders()

    def _rebalance_leaders(self) -> None:
        """Give leadership back to preferred replicas where a broker leads too few of the
        partitions it is preferred for (``auto.leader.rebalance.enable``)."""
        term = self.term
        if term is None or not self.leader_balance.enabled:
            return
        admin_requests.rebalance_leaders(self, term, self.leader_balance.imbalance_percentage)

    def _try_elect(self) -> None:
        self._ensure_view()
        if not self.store.claim_controller(self.broker_id):
            return
        # We hold /controller: take the next epoch with a conditional write.
        self.term = ControllerTerm(*self.store.controller_epoch_counter.take())
        self._next_balance_check = time.monotonic() + self.leader_balance.check_interval_s
        self._previously_live = None
        self._known_epochs = None
        with self._lock:
            self._everything = True
        self.view.catch_up()
        log.info("event=controller_elected broker=%d epoch=%d", self.broker_id, self.term.epoch)

    def _resign(self, why: str, *, timeout_s: float | None = None) -> None:
        """Stop acting as controller and delete ``/controller`` (``timeout_s``: wait at most that
        long for ZooKeeper). At stop, with ZooKeeper unreachable, the znode is left to the
        session: a delete would wait for a reconnection (the broker logs
        ``zookeeper_unreachable_at_stop``). Otherwise it waits: a controller that resigned
        but still held ``/controller`` would keep every broker from taking its place."""
        if self.term is None:
            return
        left_to_session = self._stopped.is_set() and not self.store.connected
        log.info(
            "event=controller_resigned broker=%d epoch=%d reason=%r%s",
            self.broker_id, self.term.epoch, why, " znode=left_to_session" if left_to_session else "",
        )  # fmt: skip
        self.term = None
        if left_to_session:
            return
        try:
            self.store.release_controller(self.broker_id, timeout_s=timeout_s)
        except Exception as exc:
            log.warning("event=controller_release_failed broker=%d error=%r", self.broker_id, exc)

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self, *, catch_up: bool = True) -> None:
        """Bring the partition states that changed (or all, after a broker change) in line with
        the election rules. `catch_up` first brings the view up to ZooKeeper (a direct call)."""
        term = self.term
        if term is None:
            return
        self._ensure_view()
        if catch_up:
            self.view.catch_up()
        view = self.view
        registered = set(view.brokers())
        epochs = view.broker_epochs()
        shutting_down = set(view.shutting_down())
        known = self._known_epochs if self._known_epochs is not None else epochs
        bounced = {b for b in registered if b in known and known[b] != epochs.get(b)}
        for b in sorted(bounced):
            log.info("event=broker_restarted_seen broker=%d broker_epoch=%d->%d", b, known[b], epochs[b])
        # A broker in controlled shutdown is alive but may not be elected.
        live = registered - shutting_down
        previously_live = self._previously_live if self._previously_live is not None else live
        self._previously_live = live
        if live != previously_live:
            log.info(
                "event=live_brokers_changed controller_epoch=%d live=%s gone=%s new=%s",
                term.epoch, sorted(live), sorted(previously_live - live), sorted(live - previously_live),
            )  # fmt: skip
        for name in self.store.topics_marked_for_deletion():
            self._delete_topic(term, name)
        self._reassign(term, live)
        topics = view.topics()
        with self._lock:
            everything, self._everything = self._everything, False
            dirty, self._dirty = self._dirty, set()
        if bounced:
            everything = True
        if everything:
            keys = [(name, p) for name, t in topics.items() for p in t.replicas]
        else:
            keys = sorted(
                k for k in dirty | set(self._bounced) if k[0] in topics and k[1] in topics[k[0]].replicas
            )
        groups: list[Group] = []
        changes: list[str] = []
        #: partitions given a leader by an election, and whether it was unclean (for metrics)
        elections: dict[tuple[str, int], bool] = {}
        new_topics: dict[str, bool] = {}
        for name, p in keys:
            assignment = topics[name]
            replicas = assignment.replicas[p]
            held = view.partition_state(name, p)
            key = (name, p)
            excluded = (bounced & set(replicas)) | self._bounced.get(key, frozenset())
            if excluded:
                self._bounced[key] = frozenset(excluded)
            if held is None:
                if name not in new_topics:
                    new_topics[name] = all(view.partition_state(name, q) is None for q in assignment.replicas)
                state = initial_partition_state(replicas, live, term.epoch)
                ops = self._initial_state_ops(name, p, state, make_parent=new_topics[name])
                if new_topics[name]:
                    new_topics[name] = False  # the parent is created with the first partition
                groups.append((ops, [StateWrite(name, assignment.topic_id, p, state, 0)]))
                changes.append(f"{name}-{p}:new")
                continue
            state, version = held
            needs_election = state.leader not in live and state.leader not in shutting_down
            if self._sweep_disabled and needs_election and state.leader not in previously_live - live:
                continue  # test switch: only partitions whose leader was just seen dying
            unclean = assignment.config.get("unclean.leader.election.enable", "false") == "true"
            decision = next_partition_state(
                state,
                replicas,
                live - excluded,
                shutting_down,
                unclean_allowed=unclean,
                controller_epoch=term.epoch,
            )
            if decision is None or decision.state == state:
                self._bounced.pop(key, None)
                continue
            new_state = decision.state
            check_partition_transition(
                partition_phase(state, live), partition_phase(new_state, live), f"{name}-{p}"
            )
            path = layout.partition_state_path(name, p)
            ops = [FencedOp("set", path, new_state.encode(), version)]
            if decision.unclean:
                ops.append(admin_requests.unclean_audit_op(name, p, new_state, state))
            groups.append((ops, [StateWrite(name, assignment.topic_id, p, new_state, version + 1)]))
            if new_state.leader >= 0 and new_state.leader_epoch > state.leader_epoch:
                elections[key] = decision.unclean
            changes.append(
                f"{name}-{p}:leader {state.leader}->{new_state.leader} epoch={new_state.leader_epoch} "
                f"isr={list(new_state.isr)}"
            )
        self._known_epochs = epochs
        if groups:
            self._write_states(term, groups, changes, elections)

    def _write_states(
        self,
        term: ControllerTerm,
        groups: list[Group],
        changes: list[str],
        elections: dict[tuple[str, int], bool],
    ) -> None:
        """Write decided states in fenced multi-ops; apply what went through to the view, read
        again what was refused (someone wrote meanwhile) and decide it next pass. `elections`:
        the partitions whose state elects a leader (True: an unclean one), counted once written."""
        described = {
            (w.topic, w.partition): c for (_, writes), c in zip(groups, changes, strict=True) for w in writes
        }
        started = time.monotonic()
        results = self.store.commit_fenced_many(
            term.epoch_zk_version, groups, writer=f"controller {self.broker_id} epoch {term.epoch}"
        )
        written = 0
        for result in results:
            keys = [(w.topic, w.partition) for w in result.writes]
            if result.error is not None:
                first = f"{keys[0][0]}-{keys[0][1]}" if keys else "-"
                reason = type(result.error).__name__
                log.info("event=controller_retry partitions=%d first=%s reason=%s", len(keys), first, reason)
                if isinstance(result.error, NodeExistsError):
                    self._careful_topics.update(k[0] for k in keys)
                for topic in {k[0] for k in keys}:
                    self.view.read_states(topic, [k[1] for k in keys if k[0] == topic])
                with self._lock:
                    self._dirty.update(keys)
                self._post("changed")
                continue
            self.view.apply_writes(result.writes, notice=result.notice)
            for key in keys:
                self._bounced.pop(key, None)
                log.info("event=partition_state_changed controller_epoch=%d %s", term.epoch, described[key])
                if key in elections:
                    metrics.LEADER_ELECTIONS.inc()
                    if elections[key]:
                        metrics.UNCLEAN_ELECTIONS.inc()
            written += len(keys)
        if written > 1:
            log.info(
                "event=partition_states_written controller_epoch=%d partitions=%d multi_ops=%d took_ms=%d",
                term.epoch, written, len(results), (time.monotonic() - started) * 1000,
            )  # fmt: skip

    def _initial_state_ops(
        self, topic: str, p: int, state: PartitionState, *, make_parent: bool
    ) -> list[FencedOp]:
        careful = topic in self._careful_topics
        if careful:
            make_parent = not self.store.exists(layout.partitions_path(topic))
        ops = [FencedOp("create", layout.partitions_path(topic))] if make_parent else []
        if not careful or not self.store.exists(layout.partition_path(topic, p)):
            ops.append(FencedOp("create", layout.partition_path(topic, p)))
        ops.append(FencedOp("create", layout.partition_state_path(topic, p), state.encode()))
        return ops

    def _trim_notices(self) -> None:
        """Delete state-change notices every process has had time to apply."""
        term = self.term
        if term is None:
            return
        horizon = (time.time() - NOTICE_TTL_S) * 1000
        old = sorted(n for n, t in self.view.notices().items() if t < horizon)
        if not old:
            return
        groups: list[Group] = [([FencedOp("delete", f"{layout.STATE_CHANGES}/{n}")], []) for n in old]
        results = self.store.commit_fenced_many(term.epoch_zk_version, groups, writer="")
        failed = sum(1 for r in results if r.error is not None)
        log.debug("event=state_change_notices_trimmed count=%d failed_multi_ops=%d", len(old), failed)

    # -- reassignment (drain) ----------------------------------------------------------------------

    def _reassign(self, term: ControllerTerm, live: set[int]) -> None:
        """Move partitions to the replica lists in ``/admin/reassign_partitions``, one phase per
        pass, each phase a fenced write: (1) add the new replicas to the assignment, (2) wait
        until they are in the ISR, (3) move leadership into the new list if needed, (4) shrink
        the assignment and the ISR to the new list. Removed replicas then delete their logs."""
        if self._reassignment_disabled:
            return
        request = self.store.reassignment_request()
        if request is None:
            self.reassigning = False
            return
        moves, request_version = request
        remaining: list[layout.Reassignment] = []
        for move in moves:
            if not self._reassign_one(term, move, live):
                remaining.append(move)
        self.reassigning = bool(remaining)
        if remaining == moves:
            return
        if remaining:
            encoded = layout.encode_reassignments(remaining)
            op = FencedOp("set", layout.REASSIGN_PARTITIONS, encoded, request_version)
        else:
            op = FencedOp("delete", layout.REASSIGN_PARTITIONS, version=request_version)
        self.store.commit_fenced(term.epoch_zk_version, [op])

    def _reassign_one(self, term: ControllerTerm, move: layout.Reassignment, live: set[int]) -> bool:
        """Advance one move by a phase; True when it is finished (or can no longer apply)."""
        name, p, target = move.topic, move.partition, move.replicas
        found = self.store.topic_with_version(name)
        current_state = self.store.partition_state(name, p)
        if found is None or p not in found[0].replicas or current_state is None or not target:
            log.warning("event=reassignment_dropped partition=%s-%d reason=unknown_partition", name, p)
            return True
        assignment, topic_version = found
        state, state_version = current_state
        current = assignment.replicas[p]
        if current == target:
            return True
        union = current + tuple(r for r in target if r not in current)
        if union != current:
            self._write_assignment(term, assignment, topic_version, p, union, [])
            log.info(
                "event=reassignment_started partition=%s-%d from=%s to=%s",
                name,
                p,
                list(current),
                list(target),
            )
            return False
        if not set(target) <= set(state.isr):
            return False  # the new replicas are still catching up
        if state.leader not in target:
            election = offline_partition_leader(target, state.isr, live)
            if election is None:
                return False
            isr = tuple(r for r in state.isr if r in target)
            new_state = PartitionState(election.leader, state.leader_epoch + 1, isr, term.epoch)
            path = layout.partition_state_path(name, p)
            self._commit_one(
                term,
                [FencedOp("set", path, new_state.encode(), state_version)],
                [StateWrite(name, assignment.topic_id, p, new_state, state_version + 1)],
            )
            metrics.LEADER_ELECTIONS.inc()
            log.info(
                "event=partition_state_changed controller_epoch=%d %s-%d:leader %d->%d epoch=%d "
                "reason=reassignment",
                term.epoch,
                name,
                p,
                state.leader,
                new_state.leader,
                new_state.leader_epoch,
            )
            return False
        extra: list[FencedOp] = []
        writes: list[StateWrite] = []
        isr = tuple(r for r in state.isr if r in target)
        if isr != state.isr:
            shrunk = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
            extra.append(
                FencedOp("set", layout.partition_state_path(name, p), shrunk.encode(), state_version)
            )
            writes.append(StateWrite(name, assignment.topic_id, p, shrunk, state_version + 1))
        self._write_assignment(term, assignment, topic_version, p, target, extra, writes)
        log.info("event=reassignment_completed partition=%s-%d replicas=%s", name, p, list(target))
        return True

    def _write_assignment(
        self,
        term: ControllerTerm,
        assignment: TopicAssignment,
        version: int,
        p: int,
        replicas: tuple[int, ...],
        extra: list[FencedOp],
        writes: list[StateWrite] | None = None,
    ) -> None:
        updated = TopicAssignment(
            assignment.name, assignment.topic_id, {**assignment.replicas, p: replicas}, assignment.config
        )
        ops = [FencedOp("set", layout.topic_path(assignment.name), updated.encode(), version), *extra]
        self._commit_one(term, ops, writes or [])

    def _commit_one(self, term: ControllerTerm, ops: list[FencedOp], writes: list[StateWrite]) -> None:
        """One fenced multi-op with the notice of the states it writes; raises what refused it."""
        (result,) = self.store.commit_fenced_many(
            term.epoch_zk_version, [(ops, writes)], writer=f"controller {self.broker_id} epoch {term.epoch}"
        )
        if result.error is not None:
            raise result.error
        if writes:
            self.view.apply_writes(writes, notice=result.notice)

    def _delete_topic(self, term: ControllerTerm, name: str) -> None:
        if name in layout.INTERNAL_TOPICS:
            # A request written to ZooKeeper by hand: brokers refuse it over the wire already.
            self.store.commit_fenced(
                term.epoch_zk_version, [FencedOp("delete", layout.delete_topic_path(name))]
            )
            log.warning(
                "event=internal_topic_deletion_refused controller_epoch=%d topic=%s reason=internal_topic",
                term.epoch,
                name,
            )
            return
        ops = self.store.topic_deletion_ops(name)
        self.store.commit_fenced(term.epoch_zk_version, ops)
        log.info("event=topic_deleted controller_epoch=%d topic=%s", term.epoch, name)

"""The cluster controller: one broker at a time decides partition leadership.

Election is an ephemeral ``/controller`` znode plus an increment of ``/controller_epoch``.
Every write the controller makes is a multi-op that checks the version of
``/controller_epoch`` (``ZkStore.commit_fenced``), so a deposed controller cannot write (I4).

The controller keeps no state between events: each event runs a *reconcile* pass that reads
live brokers, topics and partition states from ZooKeeper and writes only what differs from
what the rules in ``cluster.election`` decide. That is slower than an incremental cache but
cannot act on a stale view, which is what left incident B's partition leaderless. Events are
processed one at a time from one bounded queue, on the controller's own thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import orjson
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from sluice import test_switches
from sluice.cluster import layout
from sluice.cluster.election import (
    controlled_shutdown_leader,
    offline_partition_leader,
    offline_state_isr,
    unclean_partition_leader,
)
from sluice.cluster.layout import PartitionState, TopicAssignment
from sluice.cluster.state_machine import check_partition_transition, partition_phase
from sluice.cluster.zkstore import ControllerDeposedError, FencedOp, ZkStore

log = logging.getLogger("sluice.controller")

EVENT_QUEUE_MAX = 1024
REASSIGNMENT_SWEEP_S = 0.25


@dataclass(frozen=True, slots=True)
class ControllerTerm:
    epoch: int
    epoch_zk_version: int


class Controller:
    """Runs inside every broker; acts only while this broker holds ``/controller``."""

    def __init__(self, store: ZkStore, broker_id: int, *, sweep_interval_s: float = 2.0):
        self.store = store
        self.broker_id = broker_id
        self.sweep_interval_s = sweep_interval_s
        self.term: ControllerTerm | None = None
        self.reassigning = False
        #: the live brokers of the previous pass (only the test switch below looks at it)
        self._previously_live: set[int] | None = None
        self._sweep_disabled = test_switches.enabled(test_switches.DISABLE_LEADERLESS_SWEEP)
        #: unclean elections decided in the current pass: (new state, state it replaced)
        self._pending_audits: list[tuple[PartitionState, PartitionState]] = []
        self._events: queue.Queue[str] = queue.Queue(maxsize=EVENT_QUEUE_MAX)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"controller-{broker_id}", daemon=True)

    @property
    def is_active(self) -> bool:
        return self.term is not None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self.store.client.add_listener(self._on_session_state)
        self.store.watch_data(layout.CONTROLLER, lambda data, stat: self._post("controller_changed"))
        self.store.watch_children(layout.BROKER_IDS, lambda children: self._post("brokers_changed"))
        self.store.watch_children(layout.TOPICS, lambda children: self._post("topics_changed"))
        self.store.watch_children(layout.DELETE_TOPICS, lambda children: self._post("topics_changed"))
        self.store.watch_children(
            layout.CONTROLLED_SHUTDOWN, lambda children: self._post("shutdown_requested")
        )
        self.store.watch_data(layout.REASSIGN_PARTITIONS, lambda data, stat: self._post("reassignment"))

    def stop(self) -> None:
        self._stopped.set()
        self._post("stop")
        self._thread.join(timeout=5)
        if self.term is not None:
            self._resign("broker stopping")

    def _post(self, event: str) -> None:
        try:
            self._events.put_nowait(event)
        except queue.Full:
            # A full queue already holds a reconcile that will see the newest state.
            pass

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
            timeout = max(0.0, next_sweep - time.monotonic())
            try:
                event = self._events.get(timeout=timeout)
            except queue.Empty:
                event = "sweep"
            if event == "stop":
                return
            if event == "sweep":
                # While partitions move, look again soon: each phase waits on a broker's progress.
                interval = REASSIGNMENT_SWEEP_S if self.reassigning else self.sweep_interval_s
                next_sweep = time.monotonic() + interval
            self.dispatch(event)

    def dispatch(self, event: str) -> None:
        """Handle one event; a fenced write that fails its epoch check makes this controller resign."""
        try:
            self._handle(event)
        except ControllerDeposedError as exc:
            self._resign(str(exc))
        except Exception:
            log.exception("event=controller_error broker=%d event=%s", self.broker_id, event)

    def _handle(self, event: str) -> None:
        if self.term is None:
            if event in ("controller_changed", "sweep"):
                self._try_elect()
            if self.term is None:
                return
        self.reconcile()

    def _try_elect(self) -> None:
        payload = orjson.dumps(
            {"version": 1, "brokerid": self.broker_id, "timestamp": int(time.time() * 1000)}
        )
        try:
            self.store.client.create(layout.CONTROLLER, payload, ephemeral=True)
        except NodeExistsError:
            return
        # We hold /controller: take the next epoch with a conditional write.
        while True:
            epoch, version = self.store.controller_epoch()
            try:
                if version < 0:
                    self.store.client.create(layout.CONTROLLER_EPOCH, layout.encode_int(1))
                    _, st = self.store.client.get(layout.CONTROLLER_EPOCH)
                    self.term = ControllerTerm(1, int(st.version))
                else:
                    st = self.store.client.set(layout.CONTROLLER_EPOCH, layout.encode_int(epoch + 1), version)
                    self.term = ControllerTerm(epoch + 1, int(st.version))
                break
            except (BadVersionError, NodeExistsError):
                continue
        self._previously_live = None
        log.info("event=controller_elected broker=%d epoch=%d", self.broker_id, self.term.epoch)

    def _resign(self, why: str) -> None:
        if self.term is None:
            return
        log.info(
            "event=controller_resigned broker=%d epoch=%d reason=%r", self.broker_id, self.term.epoch, why
        )
        self.term = None
        try:
            data, _ = self.store.client.get(layout.CONTROLLER)
            if orjson.loads(data).get("brokerid") == self.broker_id:
                self.store.client.delete(layout.CONTROLLER)
        except (NoNodeError, Exception):
            pass

    # -- reconcile -----------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Bring ZooKeeper's partition states in line with the election rules."""
        term = self.term
        if term is None:
            return
        registered = set(self.store.live_brokers())
        shutting_down = {int(c) for c in self.store.client.get_children(layout.CONTROLLED_SHUTDOWN)}
        # A broker in controlled shutdown is alive but may not be elected.
        live = registered - shutting_down
        previously_live = self._previously_live if self._previously_live is not None else live
        self._previously_live = live
        for name in self.store.topics_marked_for_deletion():
            self._delete_topic(term, name)
        self._reassign(term, live)
        for name in self.store.topics():
            assignment = self.store.topic(name)
            if assignment is None:
                continue
            ops: list[FencedOp] = []
            changes: list[str] = []
            unclean = assignment.config.get("unclean.leader.election.enable", "false") == "true"
            make_parent = not self.store.client.exists(layout.partitions_path(name))
            audits: list[FencedOp] = []
            for p, replicas in sorted(assignment.replicas.items()):
                self._pending_audits.clear()
                current = self.store.partition_state(name, p)
                if current is None:
                    ops.extend(self._initial_state_ops(term, name, p, replicas, live, make_parent))
                    make_parent = False
                    changes.append(f"{name}-{p}:new")
                    continue
                state, version = current
                if state.leader in shutting_down:
                    new_state = self._move_off_shutting_down(term, state, replicas, live, shutting_down)
                elif state.leader != -1 and state.leader in live:
                    # Followers that died or are shutting down leave the ISR now, so acks=all
                    # writes stop waiting for them (Kafka's OnlineReplica -> OfflineReplica).
                    new_state = self._drop_from_isr(term, state, set(state.isr) - live)
                elif self._sweep_disabled and state.leader not in previously_live - live:
                    continue  # test switch: only partitions whose leader was just seen dying
                else:
                    new_state = self._elect(term, state, replicas, live, unclean)
                if new_state is None or new_state == state:
                    continue
                check_partition_transition(
                    partition_phase(state, live), partition_phase(new_state, live), f"{name}-{p}"
                )
                ops.append(FencedOp("set", layout.partition_state_path(name, p), new_state.encode(), version))
                for elected, replaced in self._pending_audits:
                    audits.append(self._unclean_audit_op(name, p, elected, replaced))
                changes.append(
                    f"{name}-{p}:leader {state.leader}->{new_state.leader} epoch={new_state.leader_epoch} "
                    f"isr={list(new_state.isr)}"
                )
            if ops:
                try:
                    self.store.commit_fenced(term.epoch_zk_version, ops + audits)
                except (BadVersionError, NodeExistsError, NoNodeError) as exc:
                    # A broker changed an ISR concurrently; the next pass reads it afresh.
                    log.info("event=controller_retry topic=%s reason=%s", name, type(exc).__name__)
                    self._post("sweep")
                    continue
                for change in changes:
                    log.info("event=partition_state_changed controller_epoch=%d %s", term.epoch, change)

    def _initial_state_ops(
        self,
        term: ControllerTerm,
        topic: str,
        p: int,
        replicas: tuple[int, ...],
        live: set[int],
        make_parent: bool,
    ) -> list[FencedOp]:
        live_replicas = tuple(r for r in replicas if r in live)
        if live_replicas:
            state = PartitionState(live_replicas[0], 0, live_replicas, term.epoch)
        else:
            # No replica has data yet, so every one of them is in sync.
            state = PartitionState(-1, 0, tuple(replicas), term.epoch)
        ops = [FencedOp("create", layout.partitions_path(topic))] if make_parent else []
        if make_parent or not self.store.client.exists(layout.partition_path(topic, p)):
            ops.append(FencedOp("create", layout.partition_path(topic, p)))
        ops.append(FencedOp("create", layout.partition_state_path(topic, p), state.encode()))
        return ops

    def _elect(
        self,
        term: ControllerTerm,
        state: PartitionState,
        replicas: tuple[int, ...],
        live: set[int],
        unclean: bool,
    ) -> PartitionState | None:
        election = offline_partition_leader(replicas, state.isr, live)
        if election is None and unclean:
            election = unclean_partition_leader(replicas, live)
            if election is not None:
                new_state = PartitionState(election.leader, state.leader_epoch + 1, election.isr, term.epoch)
                self._pending_audits.append((new_state, state))
                return new_state
        if election is not None:
            return PartitionState(election.leader, state.leader_epoch + 1, election.isr, term.epoch)
        if state.leader == -1:
            return None
        return PartitionState(-1, state.leader_epoch + 1, offline_state_isr(state.isr, live), term.epoch)

    @staticmethod
    def _unclean_audit_op(topic: str, p: int, elected: PartitionState, replaced: PartitionState) -> FencedOp:
        """The audit record of an unclean election, written in the same multi-op as the election.

        Records from the new leader's log end offset on (``lost_from_offset``, filled in by the
        new leader when it takes over) that the old in-sync replicas had may be lost.
        """
        log.warning(
            "event=unclean_leader_election partition=%s-%d leader=%d leader_epoch=%d isr_was=%s",
            topic,
            p,
            elected.leader,
            elected.leader_epoch,
            list(replaced.isr),
        )
        record = orjson.dumps(
            {
                "version": 1,
                "topic": topic,
                "partition": p,
                "new_leader": elected.leader,
                "leader_epoch": elected.leader_epoch,
                "previous_leader": replaced.leader,
                "previous_isr": list(replaced.isr),
                "time_ms": int(time.time() * 1000),
                "lost_from_offset": None,
                "note": "records at or after lost_from_offset that the previous ISR held may be lost",
            }
        )
        return FencedOp("create", layout.unclean_election_path(topic, p, elected.leader_epoch), record)

    def _move_off_shutting_down(
        self,
        term: ControllerTerm,
        state: PartitionState,
        replicas: tuple[int, ...],
        live: set[int],
        shutting_down: set[int],
    ) -> PartitionState | None:
        """Controlled shutdown: hand leadership to another live ISR member before the broker stops.

        With no other in-sync replica (replication factor 1, or the rest out of sync) nothing
        can move: the partition stays where it is, and goes offline when the broker stops, unless
        it was drained first (``sluice broker drain``).
        """
        election = controlled_shutdown_leader(replicas, state.isr, live | shutting_down, shutting_down)
        if election is None:
            return None
        return PartitionState(election.leader, state.leader_epoch + 1, election.isr, term.epoch)

    @staticmethod
    def _drop_from_isr(
        term: ControllerTerm, state: PartitionState, leaving: set[int]
    ) -> PartitionState | None:
        """Followers that died or are in controlled shutdown leave the ISR, so that they are
        neither waited for (acks=all) nor elected; the leader stays, so its epoch does not change.
        The leader is never removed here, so the ISR is never empty (I6)."""
        leaving = leaving - {state.leader}
        if not leaving & set(state.isr):
            return None
        isr = tuple(r for r in state.isr if r not in leaving)
        return PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)

    # -- reassignment (drain) ----------------------------------------------------------------------

    def _reassign(self, term: ControllerTerm, live: set[int]) -> None:
        """Move partitions to the replica lists in ``/admin/reassign_partitions``, one phase per
        pass, each phase a fenced write: (1) add the new replicas to the assignment, (2) wait
        until they are in the ISR, (3) move leadership into the new list if needed, (4) shrink
        the assignment and the ISR to the new list. Removed replicas then delete their logs."""
        if test_switches.enabled(test_switches.DISABLE_REASSIGNMENT):
            return
        try:
            data, stat = self.store.client.get(layout.REASSIGN_PARTITIONS)
        except NoNodeError:
            self.reassigning = False
            return
        moves = layout.decode_reassignments(data)
        remaining: list[layout.Reassignment] = []
        for move in moves:
            if not self._reassign_one(term, move, live):
                remaining.append(move)
        self.reassigning = bool(remaining)
        if remaining == moves:
            return
        if remaining:
            encoded = layout.encode_reassignments(remaining)
            op = FencedOp("set", layout.REASSIGN_PARTITIONS, encoded, int(stat.version))
        else:
            op = FencedOp("delete", layout.REASSIGN_PARTITIONS, version=int(stat.version))
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
            self.store.commit_fenced(
                term.epoch_zk_version, [FencedOp("set", path, new_state.encode(), state_version)]
            )
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
        isr = tuple(r for r in state.isr if r in target)
        if isr != state.isr:
            shrunk = PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
            extra.append(
                FencedOp("set", layout.partition_state_path(name, p), shrunk.encode(), state_version)
            )
        self._write_assignment(term, assignment, topic_version, p, target, extra)
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
    ) -> None:
        updated = TopicAssignment(
            assignment.name, assignment.topic_id, {**assignment.replicas, p: replicas}, assignment.config
        )
        ops = [FencedOp("set", layout.topic_path(assignment.name), updated.encode(), version), *extra]
        self.store.commit_fenced(term.epoch_zk_version, ops)

    def _delete_topic(self, term: ControllerTerm, name: str) -> None:
        ops: list[FencedOp] = []
        client = self.store.client
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
        if client.exists(layout.topic_path(name)):
            if client.exists(layout.partitions_path(name)):
                for p in client.get_children(layout.partitions_path(name)):
                    base = f"{layout.partitions_path(name)}/{p}"
                    for child in client.get_children(base):
                        ops.append(FencedOp("delete", f"{base}/{child}"))
                    ops.append(FencedOp("delete", base))
                ops.append(FencedOp("delete", layout.partitions_path(name)))
            ops.append(FencedOp("delete", layout.topic_path(name)))
        ops.append(FencedOp("delete", layout.delete_topic_path(name)))
        self.store.commit_fenced(term.epoch_zk_version, ops)
        log.info("event=topic_deleted controller_epoch=%d topic=%s", term.epoch, name)

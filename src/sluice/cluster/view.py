"""A process's view of the cluster's state in ZooKeeper: live brokers with their epochs, the
controller, brokers in controlled shutdown, topic assignments and every partition's state.

Brokers act on it (leadership, replica fetching) and the controller decides from it, so it
must never be stale in a way that matters. It is kept current at a cost that follows what
changes, not the size of the cluster:

- brokers, the controller, controlled shutdowns and the topic list through one watch each,
  and each topic's assignment through a watch per topic (not per partition);
- partition states through the state-change notices (``layout.STATE_CHANGES``): every write
  of a partition state, the controller's and a leader's ISR change alike, creates in the same
  multi-op a notice listing the states it wrote with their new znode versions, so one children
  watch brings every change and no state is read back;
- a state is applied only if it is newer than the one held (a higher znode version of the same
  topic id), so notices, reads and a process's own writes can arrive in any order;
- states are read in bulk (pipelined) only when a topic appears, after a lost session (notices
  may have been trimmed meanwhile), and by :meth:`verify`, which re-reads everything and repairs
  any difference (a hand edit in ZooKeeper) with a warning.

Watch callbacks run on kazoo's callback thread; :meth:`catch_up` runs on the caller's. Both
update the view under one lock, and listeners are told what changed.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kazoo.protocol.states import KazooState, ZnodeStat

from sluice.cluster import layout
from sluice.cluster.layout import (
    BrokerRegistration,
    PartitionState,
    StateChanges,
    StateWrite,
    TopicAssignment,
)
from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.view")

#: (kind, topic, partition): kind is "brokers", "controller", "shutdown", "topic",
#: "topic_deleted" or "partition".
ChangeListener = Callable[[str, str, int], None]


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    state: PartitionState | None
    state_version: int


@dataclass(frozen=True, slots=True)
class HeldState:
    state: PartitionState
    version: int
    topic_id: uuid.UUID


class ClusterView:
    def __init__(
        self, store: ZkStore, on_change: ChangeListener | None = None, *, verify_interval_s: float = 0
    ):
        self._store = store
        self.listeners: list[ChangeListener] = [on_change] if on_change is not None else []
        self._lock = threading.RLock()
        self._brokers: dict[int, BrokerRegistration] = {}
        #: broker id -> broker epoch (the creation zxid of its registration, KIP-380)
        self._broker_epochs: dict[int, int] = {}
        self._shutting_down: frozenset[int] = frozenset()
        self._topics: dict[str, TopicAssignment] = {}
        #: topic -> creation zxid of its znode: a state created before it is an older topic's
        self._topic_czxid: dict[str, int] = {}
        self._states: dict[tuple[str, int], HeldState] = {}
        self._watched_topics: set[str] = set()
        #: state-change notices already applied (names under STATE_CHANGES), with their time
        self._notices: dict[str, int] = {}
        self.controller_id = -1
        self.cluster_id = ""
        self.verify_interval_s = verify_interval_s
        self._session_lost = False
        self._stopped = threading.Event()

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Set the watches; each first reads what it watches, so the view is complete on return."""
        self.cluster_id = self._store.cluster_id()
        self._store.watch_children(layout.BROKER_IDS, self._brokers_changed)
        self._store.watch_data(layout.CONTROLLER, self._controller_changed)
        self._store.watch_children(layout.CONTROLLED_SHUTDOWN, self._shutdown_changed)
        self._store.watch_children(layout.STATE_CHANGES, self._notices_changed)
        self._store.watch_children(layout.TOPICS, self._topics_changed)
        self._store.add_session_listener(self._on_session_state)
        if self.verify_interval_s > 0:
            threading.Thread(target=self._verify_periodically, name="view-verify", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    # -- reads (any thread) ----------------------------------------------------------------------

    def brokers(self) -> dict[int, BrokerRegistration]:
        with self._lock:
            return dict(self._brokers)

    def broker_epochs(self) -> dict[int, int]:
        with self._lock:
            return dict(self._broker_epochs)

    def shutting_down(self) -> frozenset[int]:
        with self._lock:
            return self._shutting_down

    def topics(self) -> dict[str, TopicAssignment]:
        with self._lock:
            return dict(self._topics)

    def topic(self, name: str) -> TopicAssignment | None:
        with self._lock:
            return self._topics.get(name)

    def topic_by_id(self, topic_id: object) -> TopicAssignment | None:
        with self._lock:
            for t in self._topics.values():
                if t.topic_id == topic_id:
                    return t
        return None

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        with self._lock:
            held = self._held(topic, partition)
            return (held.state, held.version) if held is not None else None

    def partitions(self, topic: str) -> list[PartitionInfo]:
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return []
            result = []
            for p, replicas in sorted(t.replicas.items()):
                held = self._held(topic, p)
                result.append(
                    PartitionInfo(
                        topic, p, replicas, held.state if held else None, held.version if held else -1
                    )
                )
            return result

    def notices(self) -> dict[str, int]:
        """Applied state-change notices: name -> the time (ms) they were written."""
        with self._lock:
            return dict(self._notices)

    def _held(self, topic: str, partition: int) -> HeldState | None:
        held = self._states.get((topic, partition))
        t = self._topics.get(topic)
        if held is None or (t is not None and held.topic_id != t.topic_id):
            return None
        return held

    # -- applying states -------------------------------------------------------------------------

    def apply_writes(
        self, writes: Iterable[StateWrite], notice: str | None = None, time_ms: int = 0
    ) -> list[tuple[str, int]]:
        """Apply partition states that a write left (this process's own, or a notice's); returns
        the partitions whose held state changed. Older or equal versions are ignored."""
        changed: list[tuple[str, int]] = []
        with self._lock:
            if notice is not None:
                self._notices[notice] = time_ms or int(time.time() * 1000)
            for w in writes:
                key = (w.topic, w.partition)
                held = self._states.get(key)
                if held is not None and held.topic_id == w.topic_id and held.version >= w.version:
                    continue
                t = self._topics.get(w.topic)
                if t is not None and t.topic_id != w.topic_id:
                    continue  # a notice about an earlier topic of this name
                self._states[key] = HeldState(w.state, w.version, w.topic_id)
                changed.append(key)
        self._tell_partitions(changed)
        return changed

    def _apply_read(
        self, topic: str, p: int, data: bytes | None, stat: ZnodeStat | None, *, repair: bool
    ) -> bool:
        """Apply a state read from ZooKeeper (under the lock). With `repair`, a read that differs
        from the held state of the same version replaces it too (a hand edit moved the version
        on as well, so an equal version with different content cannot happen through Sluice)."""
        key = (topic, p)
        t = self._topics.get(topic)
        if t is None:
            return False
        if data is None or stat is None:
            if key in self._states and repair:
                del self._states[key]
                return True
            return False
        if int(stat.czxid) < self._topic_czxid.get(topic, 0):
            return False  # created before this topic's znode: an earlier topic's state
        try:
            state = PartitionState.decode(data, layout.partition_state_path(topic, p))
        except (ValueError, KeyError, AssertionError) as exc:
            log.warning("event=bad_partition_state topic=%s partition=%d error=%s", topic, p, exc)
            return False
        held = self._states.get(key)
        version = int(stat.version)
        if held is not None and held.topic_id == t.topic_id:
            if held.version > version or (held.version == version and held.state == state):
                return False
            if repair and held.version == version:
                log.warning(
                    "event=view_repaired partition=%s-%d held=%s read=%s", topic, p, held.state, state
                )
        self._states[key] = HeldState(state, version, t.topic_id)
        return True

    def read_states(
        self, topic: str, partitions: Iterable[int], *, repair: bool = False
    ) -> list[tuple[str, int]]:
        """Read partition states of a topic from ZooKeeper in one pipelined batch and apply them."""
        paths = {layout.partition_state_path(topic, p): p for p in partitions}
        found = self._store.read_many(paths)
        changed = []
        with self._lock:
            for path, p in paths.items():
                got = found.get(path)
                if self._apply_read(
                    topic, p, got[0] if got else None, got[1] if got else None, repair=repair
                ):
                    changed.append((topic, p))
        self._tell_partitions(changed)
        return changed

    def _tell_partitions(self, changed: list[tuple[str, int]]) -> None:
        for topic, p in changed:
            self._tell("partition", topic, p)

    def _tell(self, kind: str, topic: str = "", partition: int = -1) -> None:
        for listener in self.listeners:
            try:
                listener(kind, topic, partition)
            except Exception:
                log.exception("event=view_listener_failed kind=%s topic=%s", kind, topic)

    # -- catching up and verifying (caller's thread) -----------------------------------------------

    def catch_up(self) -> None:
        """Bring the view up to what ZooKeeper holds now, reading only lists and what is new:
        brokers, controlled shutdowns, topics not yet known, and unapplied state-change notices.
        A controller calls it right after taking its epoch, so it decides from every change
        written before its term began."""
        self._brokers_changed(self._store.children(layout.BROKER_IDS) or [])
        self._shutdown_changed(self._store.children(layout.CONTROLLED_SHUTDOWN) or [])
        names = self._store.children(layout.TOPICS) or []
        with self._lock:
            unknown = [n for n in names if n not in self._topics]
        for name in sorted(unknown):
            found = self._store.read(layout.topic_path(name))
            if found is not None:
                self._topic_read(name, *found)
        self._topics_changed(names)
        self._notices_changed(self._store.children(layout.STATE_CHANGES) or [])

    def verify(self) -> int:
        """Re-read every topic's assignment and partition state and repair what differs; returns
        the number of partitions repaired. Costs one read per partition (pipelined)."""
        repaired = 0
        names = self._store.children(layout.TOPICS) or []
        for name in sorted(names):
            found = self._store.read(layout.topic_path(name))
            if found is None:
                continue
            self._topic_read(name, *found, read_states=False)
            t = self.topic(name)
            if t is not None:
                repaired += len(self.read_states(name, t.replicas, repair=True))
        return repaired

    def _verify_periodically(self) -> None:
        while not self._stopped.wait(self.verify_interval_s):
            try:
                started = time.monotonic()
                repaired = self.verify()
                took_ms = (time.monotonic() - started) * 1000
                level = logging.WARNING if repaired else logging.DEBUG
                log.log(level, "event=view_verified repaired=%d took_ms=%d", repaired, took_ms)
            except Exception as exc:
                if not self._stopped.is_set():  # at stop, the session's close ends the reads
                    log.warning("event=view_verify_failed error=%r", exc)

    def _on_session_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            self._session_lost = True
        elif state == KazooState.CONNECTED and self._session_lost:
            # Notices may have been trimmed while this process had no session: read everything.
            self._session_lost = False
            threading.Thread(target=self._reload_after_session_loss, name="view-reload", daemon=True).start()

    def _reload_after_session_loss(self) -> None:
        try:
            repaired = self.verify()
            log.info("event=view_reloaded reason=session_lost repaired=%d", repaired)
        except Exception as exc:
            log.warning("event=view_reload_failed error=%r", exc)

    # -- watch callbacks (kazoo's thread) --------------------------------------------------------

    def _brokers_changed(self, children: list[str]) -> None:
        brokers: dict[int, BrokerRegistration] = {}
        epochs: dict[int, int] = {}
        found = self._store.read_many(layout.broker_path(int(c)) for c in children if c.isdigit())
        for path, got in found.items():
            if got is None:
                continue
            broker_id = int(path.rsplit("/", 1)[1])
            try:
                brokers[broker_id] = BrokerRegistration.decode(broker_id, got[0])
            except (ValueError, KeyError) as exc:
                log.warning("event=bad_broker_znode id=%s error=%s", broker_id, exc)
                continue
            epochs[broker_id] = int(got[1].czxid)
        with self._lock:
            same = brokers == self._brokers and epochs == self._broker_epochs
            self._brokers, self._broker_epochs = brokers, epochs
        if not same:
            self._tell("brokers")

    def _controller_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        cid = -1
        if data:
            try:
                cid = int(layout._loads(data, layout.CONTROLLER)["brokerid"])
            except (ValueError, KeyError):
                cid = -1
        self.controller_id = cid
        self._tell("controller")

    def _shutdown_changed(self, children: list[str]) -> None:
        ids = frozenset(int(c) for c in children if c.isdigit())
        with self._lock:
            same = ids == self._shutting_down
            self._shutting_down = ids
        if not same:
            self._tell("shutdown")

    def _topics_changed(self, children: list[str]) -> None:
        with self._lock:
            new = set(children) - self._watched_topics
            self._watched_topics |= new
        for name in sorted(new):
            self._store.watch_data(layout.topic_path(name), self._make_topic_watch(name))

    def _make_topic_watch(self, name: str) -> Callable[[bytes | None, ZnodeStat | None], bool | None]:
        def watch(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            # The watch stays on a deleted topic: a topic deleted and created again between two
            # looks at the topic list is then still seen (the list may never show it missing).
            if data is None or stat is None:
                self._topic_gone(name)
            else:
                self._topic_read(name, data, stat)
            return None

        return watch

    def _topic_gone(self, name: str) -> None:
        with self._lock:
            known = self._topics.pop(name, None) is not None
            self._topic_czxid.pop(name, None)
            for key in [k for k in self._states if k[0] == name]:
                del self._states[key]
        if known:
            self._tell("topic_deleted", name)

    def _refresh_topic(self, name: str) -> None:
        """Read a topic's assignment now (a notice named a topic id this view does not hold)."""
        found = self._store.read(layout.topic_path(name))
        if found is None:
            return
        self._topic_read(name, *found)
        self._topics_changed([name])

    def _topic_read(self, name: str, data: bytes, stat: ZnodeStat, *, read_states: bool = True) -> None:
        """A topic's assignment was read: keep it, and read the states of partitions not yet held
        (a new topic, added partitions, or a topic created again under the same name)."""
        try:
            assignment = TopicAssignment.decode(name, data)
        except (ValueError, KeyError) as exc:
            log.warning("event=bad_topic_znode topic=%s error=%s", name, exc)
            return
        with self._lock:
            previous = self._topics.get(name)
            if previous is not None and previous.topic_id != assignment.topic_id:
                log.info(
                    "event=topic_recreated_seen topic=%s topic_id=%s previous_topic_id=%s",
                    name, assignment.topic_id, previous.topic_id,
                )  # fmt: skip
            self._topics[name] = assignment
            self._topic_czxid[name] = int(stat.czxid)
            missing = [p for p in assignment.replicas if self._held(name, p) is None]
        if read_states and missing:
            # Only partitions whose znodes exist have a state to read: a new topic has none yet
            # (its states arrive with the controller's notice), so one list read stands in for
            # a read per partition.
            existing = {
                int(c) for c in self._store.children(layout.partitions_path(name)) or [] if c.isdigit()
            }
            missing = [p for p in missing if p in existing]
            if missing:
                self.read_states(name, missing)
        if previous != assignment:
            self._tell("topic", name)

    def _notices_changed(self, children: list[str]) -> None:
        with self._lock:
            present = set(children)
            for gone in [n for n in self._notices if n not in present]:
                del self._notices[gone]  # trimmed by the controller
            new = sorted(n for n in present if n not in self._notices)
        if not new:
            return
        found = self._store.read_many(f"{layout.STATE_CHANGES}/{n}" for n in new)
        for name in new:  # sequential names sort in write order
            got = found.get(f"{layout.STATE_CHANGES}/{name}")
            if got is None:
                continue
            try:
                notice = StateChanges.decode(got[0])
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("event=bad_state_change_notice name=%s error=%r", name, exc)
                with self._lock:
                    self._notices[name] = int(time.time() * 1000)
                continue
            self.apply_writes(notice.writes, notice=name, time_ms=notice.time_ms)
            with self._lock:
                unknown = {
                    w.topic
                    for w in notice.writes
                    if (t := self._topics.get(w.topic)) is None or t.topic_id != w.topic_id
                }
            for topic in sorted(unknown):
                # A topic this view missed (created, or deleted and created again, between two
                # looks): read it, so that its states are never held without their topic.
                self._refresh_topic(topic)

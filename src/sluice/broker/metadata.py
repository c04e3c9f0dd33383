"""The broker's view of the cluster, kept current by ZooKeeper watches.

Watch callbacks arrive on kazoo's thread; they update this cache under a lock and hand a
change notice to the broker's event loop. Readers on the loop take consistent copies.
ZooKeeper is the source of truth: nothing here is ever written back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

from sluice.cluster import layout
from sluice.cluster.layout import BrokerRegistration, PartitionState, TopicAssignment
from sluice.cluster.zkstore import ZkStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    state: PartitionState | None
    state_version: int


#: (kind, topic, partition): kind is "brokers", "controller", "topic", "topic_deleted" or "partition".
ChangeListener = Callable[[str, str, int], None]


class MetadataCache:
    def __init__(self, store: ZkStore, on_change: ChangeListener):
        self._store = store
        self._on_change = on_change
        self._lock = threading.Lock()
        self._brokers: dict[int, BrokerRegistration] = {}
        self._topics: dict[str, TopicAssignment] = {}
        self._states: dict[tuple[str, int], tuple[PartitionState, int]] = {}
        self._watched_topics: set[str] = set()
        self._watched_states: set[tuple[str, int]] = set()
        #: creation zxid of each partition state znode seen: a new one means the topic was
        #: deleted and created again, whether or not the deletion itself was seen.
        self._state_czxid: dict[tuple[str, int], int] = {}
        self.controller_id = -1
        self.cluster_id = ""

    def start(self) -> None:
        self.cluster_id = self._store.cluster_id()
        self._store.watch_children(layout.BROKER_IDS, self._brokers_changed)
        self._store.watch_data(layout.CONTROLLER, self._controller_changed)
        self._store.watch_children(layout.TOPICS, self._topics_changed)

    # -- reads (any thread) ----------------------------------------------------------------------

    def brokers(self) -> dict[int, BrokerRegistration]:
        with self._lock:
            return dict(self._brokers)

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
            return self._states.get((topic, partition))

    def partitions(self, topic: str) -> list[PartitionInfo]:
        with self._lock:
            t = self._topics.get(topic)
            if t is None:
                return []
            result = []
            for p, replicas in sorted(t.replicas.items()):
                st = self._states.get((topic, p))
                result.append(PartitionInfo(topic, p, replicas, st[0] if st else None, st[1] if st else -1))
            return result

    # -- watch callbacks (kazoo thread) ----------------------------------------------------------

    def _brokers_changed(self, children: list[str]) -> None:
        brokers: dict[int, BrokerRegistration] = {}
        for child in children:
            try:
                data, _ = self._store.client.get(f"{layout.BROKER_IDS}/{child}")
            except NoNodeError:
                continue
            try:
                brokers[int(child)] = BrokerRegistration.decode(int(child), data)
            except (ValueError, KeyError) as exc:
                log.warning("event=bad_broker_znode id=%s error=%s", child, exc)
        with self._lock:
            self._brokers = brokers
        self._on_change("brokers", "", -1)

    def _controller_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        cid = -1
        if data:
            try:
                cid = int(layout._loads(data, layout.CONTROLLER)["brokerid"])
            except (ValueError, KeyError):
                cid = -1
        self.controller_id = cid
        self._on_change("controller", "", -1)

    def _topics_changed(self, children: list[str]) -> None:
        current = set(children)
        with self._lock:
            new = current - self._watched_topics
            self._watched_topics |= new
        for name in sorted(new):
            self._store.watch_data(layout.topic_path(name), self._make_topic_watch(name))

    def _make_topic_watch(self, name: str) -> Callable[[bytes | None, ZnodeStat | None], bool | None]:
        def watch(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            if data is None:
                with self._lock:
                    self._topics.pop(name, None)
                    self._watched_topics.discard(name)
                    for key in [k for k in self._states if k[0] == name]:
                        del self._states[key]
                    for key in [k for k in self._state_czxid if k[0] == name]:
                        del self._state_czxid[key]
                    self._watched_states = {k for k in self._watched_states if k[0] != name}
                self._on_change("topic_deleted", name, -1)
                return False
            try:
                assignment = TopicAssignment.decode(name, data)
            except (ValueError, KeyError) as exc:
                log.warning("event=bad_topic_znode topic=%s error=%s", name, exc)
                return None
            with self._lock:
                self._topics[name] = assignment
                new_parts = [p for p in assignment.replicas if (name, p) not in self._watched_states]
                self._watched_states.update((name, p) for p in new_parts)
            for p in new_parts:
                self._store.watch_data(layout.partition_state_path(name, p), self._make_state_watch(name, p))
            self._on_change("topic", name, -1)
            return None

        return watch

    def _make_state_watch(self, name: str, p: int) -> Callable[[bytes | None, ZnodeStat | None], bool | None]:
        def watch(data: bytes | None, stat: ZnodeStat | None) -> bool | None:
            recreated = False
            with self._lock:
                if (name, p) not in self._watched_states:
                    return False
                if data is None or stat is None:
                    self._states.pop((name, p), None)
                else:
                    try:
                        self._states[(name, p)] = (PartitionState.decode(data), int(stat.version))
                    except (ValueError, KeyError, AssertionError) as exc:
                        log.warning("event=bad_partition_state topic=%s partition=%d error=%s", name, p, exc)
                        return None
                    seen = self._state_czxid.get((name, p))
                    recreated = seen is not None and seen != stat.czxid
                    self._state_czxid[(name, p)] = int(stat.czxid)
            if recreated:
                # This state belongs to a topic created again under the same name (this broker
                # missed the deletion, e.g. while paused): read the new topic's assignment before
                # anyone acts on the state, so that the old topic's replica is never paired with it.
                self._refresh_topic(name)
            self._on_change("partition", name, p)
            return None

        return watch

    def _refresh_topic(self, name: str) -> None:
        try:
            data, _stat = self._store.client.get(layout.topic_path(name))
            assignment = TopicAssignment.decode(name, data)
        except NoNodeError:
            return
        except (ValueError, KeyError) as exc:
            log.warning("event=bad_topic_znode topic=%s error=%s", name, exc)
            return
        with self._lock:
            previous = self._topics.get(name)
            self._topics[name] = assignment
        if previous is None or previous.topic_id != assignment.topic_id:
            log.info(
                "event=topic_recreated_seen topic=%s topic_id=%s previous_topic_id=%s",
                name,
                assignment.topic_id,
                previous.topic_id if previous else None,
            )

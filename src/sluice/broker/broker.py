"""One broker process: its ZooKeeper session, logs, controller candidacy and Kafka listener.

Start-up order: lock the data directory, reach ZooKeeper and refuse a duplicate broker id,
recover every local log, load the cluster's metadata (the view: acting on it makes this broker
leader or follower of its partitions), listen, register the ephemeral broker znode, then stand
for controller. Shutdown closes logs cleanly so the next start skips recovery, and ends within
:func:`stop_bound_s` whatever ZooKeeper does.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from kazoo.exceptions import BadVersionError

from sluice import metrics, test_switches
from sluice.broker import log_cleaner
from sluice.broker.admin import TopicAdmin
from sluice.broker.authorizer import make_authorizer
from sluice.broker.config import CONTROLLED_SHUTDOWN_TIMEOUT_S, BrokerConfig
from sluice.broker.coordinator import GroupCoordinator
from sluice.broker.dynamic_config import DynamicBrokerConfig
from sluice.broker.fetch_sessions import FetchSessionCache
from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.broker.listeners import Listener
from sluice.broker.log_cleaner import LogCleaner
from sluice.broker.metadata import VERIFY_INTERVAL_S, MetadataCache
from sluice.broker.partition import Partition
from sluice.broker.producer_ids import ProducerIdManager
from sluice.broker.replica_access import inter_broker_authenticates, may_act_as_replica
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.replication import isr_eligible
from sluice.broker.server import KafkaServer, bind_listener
from sluice.broker.txn_coordinator import TransactionCoordinator
from sluice.broker.txn_verification import TxnVerifier
from sluice.cluster import layout
from sluice.cluster.controller import Controller, LeaderBalance
from sluice.cluster.health import OFFLINE, UNDER_REPLICATED, classify_partition
from sluice.cluster.layout import BrokerRegistration, PartitionState, StateWrite
from sluice.cluster.zkstore import ZOOKEEPER_UNREACHABLE, BrokerIdInUseError, ZkStore
from sluice.security.credentials import own_credentials
from sluice.security.scram import ScramCredential
from sluice.storage.fsutil import atomic_write, fsync_dir

log = logging.getLogger("sluice.broker")

LOCK_FILE = ".lock"
#: In the data directory after a clean stop: every log was flushed and closed (Kafka's
#: ``.kafka_cleanshutdown``). One for the directory, not one per log: a stop of a broker with
#: 10,000 partitions wrote, and fsynced, 10,000 of them.
CLEAN_SHUTDOWN_MARKER = ".sluice-clean-shutdown"
#: ISR changes decided within this long are written together (one multi-op, one notice)
ISR_BATCH_S = 0.05
#: What a stop may take besides the controlled shutdown and ZooKeeper: letting cleans in progress
#: stop (the log cleaner's STOP_WAIT_S at most), then closing connections and every log.
STOP_SLACK_S = log_cleaner.STOP_WAIT_S + 5.0


def stop_bound_s(
    zk_session_timeout_s: float, controlled_shutdown_timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S
) -> float:
    """The longest a broker's stop takes, from SIGTERM to exit, whatever ZooKeeper does: the
    controlled shutdown (attempted only while ZooKeeper answers, and over once it stops
    answering), then the ZooKeeper session timeout for the rest of its ZooKeeper work (the
    controller's resignation, closing the session), then STOP_SLACK_S. With the session already
    disconnected when the stop begins (ZooKeeper gone), the session timeout plus STOP_SLACK_S:
    21 s with the defaults, 36 s with ZooKeeper up. ``sluice broker stop`` and ``cluster down``
    SIGKILL a broker only past it."""
    return controlled_shutdown_timeout_s + zk_session_timeout_s + STOP_SLACK_S


class DataDirInUseError(RuntimeError):
    pass


class Broker:
    def __init__(self, config: BrokerConfig, *, switches: test_switches.Switches = test_switches.OFF):
        self.config = config
        self.switches = switches
        self.store = ZkStore(
            config.zookeeper,
            session_timeout_s=config.zk_session_timeout_s,
            switches=switches,
            auth=config.zk_auth,
        )
        self.metadata = MetadataCache(
            self.store, self._on_metadata_change, verify_interval_s=VERIFY_INTERVAL_S
        )
        self.replicas = ReplicaManager(
            config.broker_id, config.data_dir, self.metadata, config.log_defaults, switches=switches
        )
        self.replicas.rack_aware_reads = bool(config.replica_selector)
        self.fetch_sessions = FetchSessionCache(
            config.fetch_session_cache_slots, config.fetch_session_eviction_ms
        )
        self.admin = TopicAdmin(self)
        self.producer_ids = ProducerIdManager(self.store, config.broker_id)
        self.controller = Controller(
            self.store,
            config.broker_id,
            sweep_interval_s=config.controller_sweep_interval_s,
            view=self.metadata,
            switches=switches,
            leader_balance=LeaderBalance(
                config.auto_leader_rebalance,
                float(config.leader_imbalance_check_interval_s),
                config.leader_imbalance_per_broker_percentage,
            ),
        )
        #: ACL authorization (broker/authz.py), or None when authorizer.class.name is empty
        self.authorizer = make_authorizer(config, self.store)
        # The replication door's principal check, and how this broker's followers connect.
        own_user = config.inter_broker_username
        self.replicas.may_replicate = functools.partial(
            may_act_as_replica,
            authorizer=self.authorizer,
            inter_broker=config.inter_broker,
            broker_principal=f"User:{own_user}" if own_user else None,
        )
        #: the brokers' own SASL user's credentials, from this broker's configuration (never
        #: from ZooKeeper: security.credentials.with_own_user); empty without a password
        self.own_credentials: dict[str, ScramCredential] = (
            own_credentials(config.inter_broker_password) if config.inter_broker_password else {}
        )
        self.replicas.fetchers.security = config.inter_broker_client()
        #: /config/brokers/<default> and /config/brokers/<id>, applied live
        self.dynamic_config = DynamicBrokerConfig(self)
        self.server = KafkaServer(self)
        self.coordinator = GroupCoordinator(self)
        self.cleaner = LogCleaner(self.replicas, config.cleaner)
        self.txn_coordinator = TransactionCoordinator(self)
        #: KIP-890: this broker, as a partition's leader, asking a transactional id's coordinator
        self.txn_verifier = TxnVerifier(self)
        self.replicas.leadership_listeners.append(self._on_leadership)
        self.replicas.isr_listeners.append(self._on_isr_may_grow)
        self._isr_writes: set[tuple[str, int]] = set()
        #: (partition, new ISR, reason, the state version the decision was based on)
        self._isr_queue: list[tuple[Partition, tuple[int, ...], str, int]] = []
        self._isr_batch_running = False
        self._pending_partitions: set[tuple[str, int]] = set()
        self._partition_batch_running = False
        self._background: set[asyncio.Task[object]] = set()
        self._controlled_shutdown_enabled = config.controlled_shutdown
        self.stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._lock_fd: int | None = None
        #: the Prometheus endpoint's bound port (None: metrics.port unset)
        self.metrics_port: int | None = None

    def spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run a background task, keeping a reference so it is not collected mid-flight."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self.request_stop)
        bound: list[tuple[Listener, socket.socket]] = []
        try:
            for lst in self.config.bound_listeners:
                bound.append((lst, bind_listener(lst.host, lst.port)))
            self._serve_metrics()
            await self._run_bound(bound)
        finally:
            for _, sock in bound:
                sock.close()  # a no-op once the server has closed it

    async def _run_bound(self, listeners: list[tuple[Listener, socket.socket]]) -> None:
        self._lock_data_dir()
        self.replicas.clean_start = self._take_clean_shutdown_marker()
        await asyncio.to_thread(self.store.start)
        try:
            await asyncio.to_thread(self._refuse_duplicate_id)
            # Dynamic log defaults first: they are applied while the topics are read, so every
            # log opens with them (its replica's retention and limits as the cluster set them).
            self.dynamic_config.start()
            known = await asyncio.to_thread(self._known_topics)
            self.replicas.load_local_logs(known)
            self.coordinator.start()
            self.cleaner.start()
            self.txn_coordinator.start()
            # The view first: a client asking this broker for metadata must never be told the
            # cluster has no topics because the view of thousands of partitions is still loading.
            await asyncio.to_thread(self.metadata.start)
            if self.authorizer is not None:
                # The ACLs before the listener: no request is answered without them.
                await asyncio.to_thread(self.authorizer.start)
            await self.server.start_listeners(listeners)
            host, port = self.config.advertised
            reg = self._registration()
            epoch = await asyncio.to_thread(self.store.register_broker, reg)
            self.store.add_session_listener(self._on_session_state)
            self.controller.start()
            log.info(
                "event=broker_started id=%d listen=%s:%d broker_epoch=%d zookeeper=%s pid=%d metrics_port=%s",
                self.config.broker_id,
                host,
                port,
                epoch,
                self.store.address,
                os.getpid(),
                self.metrics_port if self.metrics_port is not None else "off",
            )
            self._warn_if_replication_is_open()
            await self._housekeeping_until_stopped()
        finally:
            await self._shutdown()

    def _warn_if_replication_is_open(self) -> None:
        """One WARNING at start when the inter-broker listener authenticates nobody: there any
        connection may fetch as a follower (replica_access), as on every Kafka listener."""
        config = self.config
        client_auth = config.tls.client_auth if config.tls is not None else "none"
        if inter_broker_authenticates(config.inter_broker, client_auth):
            return
        log.warning(
            "event=inter_broker_listener_unauthenticated listener=%s protocol=%s "
            "risk='a client that reaches it can fetch as a follower: acks=all records acknowledged "
            "with one copy' action='make the inter-broker listener SASL_PLAINTEXT or SASL_SSL with "
            "inter.broker.sasl.username and .password (as sluice cluster up does), or SSL with "
            "ssl.client.auth=required, on a listener of its own'",
            config.inter_broker.name,
            config.inter_broker.protocol,
        )

    def _serve_metrics(self) -> None:
        """The Prometheus endpoint, on the listener's host, before the data directory or
        ZooKeeper: like the listener, a port that cannot be bound stops the broker first."""
        if self.config.metrics_port is None:
            return
        metrics.enable_broker(self.health_gauges)
        self.metrics_port = metrics.serve(self.config.metrics_port, self.config.host)

    def health_gauges(self) -> metrics.BrokerGauges:
        """The partition and controller gauges, asked for by a scrape on the metrics server's
        thread: from the view (its lock, held briefly per call) and the partitions led here,
        never ZooKeeper, never the event loop. One classifier decides (cluster.health)."""
        live = self.metadata.brokers()
        me = self.config.broker_id
        under = 0
        for part in self.replicas.leader_partitions():
            held = self.metadata.partition_state(part.topic, part.index)
            if held is None or held[0].leader != me:
                continue  # leadership moving: the view's leader reports it
            health = classify_partition(part.topic, part.index, held[0], part.replicas, live)
            under += health.status == UNDER_REPLICATED
        active = self.controller.is_active
        offline = 0
        if active:  # Kafka's OfflinePartitionsCount: the controller's figure, so a sum counts each once
            for name in self.metadata.topics():
                for info in self.metadata.partitions(name):
                    health = classify_partition(name, info.partition, info.state, info.replicas, live)
                    offline += health.status == OFFLINE
        return metrics.BrokerGauges(offline, under, int(active))

    def request_stop(self) -> None:
        if self._stop_event is not None:
            self._stop_event.set()

    async def _housekeeping_until_stopped(self) -> None:
        """The periodic work, each at its own interval: the ISR check (over the partitions led
        here), time-based flushes (over those with ``flush.ms``), high-watermark checkpoints and
        retention (over every replica, seconds and a minute apart)."""
        assert self._stop_event is not None
        c = self.config
        tick_s = min(c.flush_check_interval_ms, c.isr_check_interval_ms) / 1000.0
        now = time.monotonic()
        next_flush = now + c.flush_check_interval_ms / 1000.0
        next_checkpoint = now + c.hw_checkpoint_interval_ms / 1000.0
        next_retention = now + c.retention_check_interval_ms / 1000.0
        while not self._stop_event.is_set():
            try:
                await asyncio.wait_for(self._stop_event.wait(), timeout=tick_s)
            except TimeoutError:
                pass
            now, now_ms = time.monotonic(), int(time.time() * 1000)
            self._shrink_isrs()
            if now >= next_flush:
                self.replicas.flush_due(now_ms)
                next_flush = now + c.flush_check_interval_ms / 1000.0
            if now >= next_checkpoint:
                self.replicas.checkpoint_high_watermarks()
                next_checkpoint = now + c.hw_checkpoint_interval_ms / 1000.0
            if now >= next_retention:
                self.replicas.enforce_retention(now_ms)
                next_retention = now + c.retention_check_interval_ms / 1000.0

    async def _shutdown(self) -> None:
        """Stop within :func:`stop_bound_s`. Every ZooKeeper call here has a deadline, and none
        is made while ZooKeeper is unreachable: kazoo holds a call until it reconnects, and it
        retries forever (a controller's stop waited there for good, issue 32)."""
        started = time.monotonic()
        me = self.config.broker_id
        log.info("event=broker_stopping id=%d", me)
        self.metadata.stop()
        await self.replicas.fetchers.stop()
        if not self.store.connected:
            self._log_zookeeper_unreachable_at_stop(None)
        elif self._controlled_shutdown_enabled:
            await self._controlled_shutdown()
        self.stopping = True
        await self.server.stop()
        await self.coordinator.stop()
        await self.cleaner.stop()
        await self.txn_coordinator.stop()
        await self.txn_verifier.close()
        # The rest of the ZooKeeper work (resigning, closing the session) shares one deadline.
        zookeeper_deadline = time.monotonic() + self.config.zk_session_timeout_s
        await asyncio.to_thread(self.controller.stop, zookeeper_deadline - time.monotonic())
        if self.replicas.close_all():
            # Every log is flushed and closed: the next start may trust them without recovery.
            atomic_write(self.config.data_dir / CLEAN_SHUTDOWN_MARKER, b"", durable=True)
        await asyncio.to_thread(self.store.stop_by, zookeeper_deadline)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
        log.info("event=broker_stopped id=%d took_ms=%d", me, (time.monotonic() - started) * 1000)

    async def _controlled_shutdown(self) -> None:
        """Ask the controller to move leadership off this broker, and wait until it has (or
        until nothing more can move: a partition whose only in-sync replica is here stays)."""
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        timeout_s = self.config.controlled_shutdown_timeout_s
        deadline = loop.time() + timeout_s
        try:
            await asyncio.to_thread(self.store.request_controlled_shutdown, self.config.broker_id, timeout_s)
        except ZOOKEEPER_UNREACHABLE as exc:  # it went away as the stop began
            self._log_zookeeper_unreachable_at_stop(exc)
            return
        except Exception as exc:
            log.warning("event=controlled_shutdown_unavailable id=%d error=%r", self.config.broker_id, exc)
            return
        live = set(self.metadata.brokers())

        def movable() -> list[str]:
            return [
                p.name
                for p in self.replicas.leader_partitions()
                if any(r != self.config.broker_id and r in live for r in p.isr)
            ]

        # Without ZooKeeper this broker cannot see leadership move: waiting on would only
        # spend the timeout.
        while movable() and loop.time() < deadline and self.store.connected:
            await asyncio.sleep(0.05)
        left = movable()
        stuck = [p.name for p in self.replicas.leader_partitions() if p.name not in left]
        log.info(
            "event=controlled_shutdown_done id=%d took_ms=%d still_leading=%s single_replica=%s "
            "zookeeper_connected=%s",
            self.config.broker_id,
            (time.monotonic() - started) * 1000,
            left,
            stuck,
            self.store.connected,
        )

    def _log_zookeeper_unreachable_at_stop(self, error: Exception | None) -> None:
        """The one line for a stop without ZooKeeper (found disconnected, or its controlled-
        shutdown request failed): an expected case, never a traceback."""
        log.warning(
            "event=zookeeper_unreachable_at_stop id=%d zookeeper=%s error=%r session_timeout_s=%.1f "
            "action=%r",
            self.config.broker_id, self.store.address, error, self.config.zk_session_timeout_s,
            "no controlled shutdown; this broker's znodes go when its session expires, and the other "
            "brokers then elect leaders for its partitions; closing the logs",
        )  # fmt: skip

    # -- start-up checks -------------------------------------------------------------------------

    def _take_clean_shutdown_marker(self) -> bool:
        """Whether the broker's last run closed every log cleanly (its data directory's marker).
        The marker goes, durably, before any log is opened: a crash from now on must leave the
        logs to be recovered."""
        path = Path(self.config.data_dir) / CLEAN_SHUTDOWN_MARKER
        if not path.exists():
            log.info("event=logs_recover reason=no_clean_shutdown_marker")
            return False
        path.unlink()
        fsync_dir(path.parent)
        return True

    def _lock_data_dir(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        path = Path(self.config.data_dir) / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUseError(
                f"data directory {self.config.data_dir} is in use by another running broker; "
                "each broker needs its own --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _refuse_duplicate_id(self) -> None:
        """Refuse to start while another live broker holds this id.

        A znode left by a broker that died (kill -9) outlives it until its session expires, so
        a stale one is waited out for a session timeout; one that is still there after that
        belongs to a broker that keeps its session alive.
        """
        deadline = time.monotonic() + self.config.zk_session_timeout_s * 1.5 + 2.0
        announced = False
        while True:
            holder = self.store.registration(self.config.broker_id)
            if holder is None:
                return
            other, owner = holder
            if owner == self.store.session_id:
                return
            if time.monotonic() >= deadline:
                raise BrokerIdInUseError(
                    f"broker id {self.config.broker_id} is already registered by a live broker at "
                    f"{other.host}:{other.port} (pid {other.pid}); refusing to start a second broker with "
                    "the same id. Stop that broker or pick another --id."
                )
            if not announced:
                log.info(
                    "event=waiting_for_stale_registration id=%d held_by=%s:%d pid=%d",
                    self.config.broker_id,
                    other.host,
                    other.port,
                    other.pid,
                )
                announced = True
            time.sleep(0.2)

    def _known_topics(self) -> dict[str, layout.TopicAssignment]:
        return self.store.all_topics()

    # -- cluster events --------------------------------------------------------------------------

    def _on_metadata_change(self, kind: str, topic: str, partition: int) -> None:
        """Called on kazoo's thread: hand the change to the event loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._apply_metadata_change, kind, topic, partition)
        except RuntimeError:
            pass

    def _apply_metadata_change(self, kind: str, topic: str, partition: int) -> None:
        if self.stopping:
            return
        try:
            if kind == "partition":
                self._queue_partitions([(topic, partition)])
            elif kind == "topic":
                self.replicas.reconfigure(topic)  # a changed topic config reaches every replica live
                indexes = self.replicas.remove_stale_replicas(topic)
                self._queue_partitions([(topic, p) for p in indexes])
            elif kind == "topic_deleted":
                self.replicas.on_topic_deleted(topic)
        except Exception:
            log.exception(
                "event=metadata_change_failed kind=%s topic=%s partition=%d", kind, topic, partition
            )

    def _queue_partitions(self, keys: list[tuple[str, int]]) -> None:
        """Changes arrive by the thousand (a batch of elections, a new topic): gather them and
        act on them together, creating the logs they need side by side."""
        self._pending_partitions.update(keys)
        if keys and not self._partition_batch_running:
            self._partition_batch_running = True
            self.spawn(self._apply_partition_batches())

    async def _apply_partition_batches(self) -> None:
        try:
            while self._pending_partitions and not self.stopping:
                batch = sorted(self._pending_partitions)
                self._pending_partitions.clear()
                try:
                    await self.replicas.on_partition_states(batch)
                except Exception:
                    log.exception("event=metadata_change_failed kind=partition partitions=%d", len(batch))
        finally:
            self._partition_batch_running = False

    # -- ISR maintenance (the leader's side of I3 and I6) -----------------------------------------

    def _shrink_isrs(self) -> None:
        now_ms = time.monotonic() * 1000
        lag_max = self.config.replica_lag_time_max_ms
        for part in self.replicas.leader_partitions():
            out = part.isr_candidates_to_remove(now_ms, lag_max)
            if out:
                self._change_isr(part, tuple(r for r in part.isr if r not in out), f"lagging {out}")

    def _on_isr_may_grow(self, part: Partition) -> None:
        """Called from a follower's fetch: only a replica that is fetching can rejoin, and only
        while it is ISR-eligible (registered, not shutting down)."""
        live, leaving = self.metadata.brokers(), self.metadata.shutting_down()
        joining = [r for r in part.isr_candidates_to_add() if isr_eligible(r, live, leaving)]
        if joining:
            members = set(part.isr) | set(joining)
            self._change_isr(
                part,
                tuple(r for r in part.replicas if r in members),
                f"caught up {joining}",
                frozenset(joining),
            )

    def _change_isr(
        self, part: Partition, new_isr: tuple[int, ...], reason: str, joining: frozenset[int] = frozenset()
    ) -> None:
        key = (part.topic, part.index)
        if key in self._isr_writes or self.stopping or new_isr == part.isr:
            return
        self._isr_writes.add(key)
        if joining:
            # KIP-497: from the decision on, the joining followers hold the high watermark back
            # as if they were members already; otherwise it could pass them while ZooKeeper
            # answers, and they would enter the ISR missing committed records (I3).
            part.begin_isr_expansion(joining)
        self._isr_queue.append((part, new_isr, reason, part.state_version))
        if not self._isr_batch_running:
            self._isr_batch_running = True
            self.spawn(self._write_isr_batches())

    async def _write_isr_batches(self) -> None:
        """ISR changes come by the thousand after a restart or a failover: gather those decided
        within ISR_BATCH_S and write them in one multi-op with one state-change notice."""
        try:
            while self._isr_queue:
                await asyncio.sleep(ISR_BATCH_S)
                batch, self._isr_queue = self._isr_queue, []
                await self._write_isrs(batch)
        finally:
            self._isr_batch_running = False

    async def _write_isrs(self, batch: list[tuple[Partition, tuple[int, ...], str, int]]) -> None:
        """Conditional writes of the partition states: one fails if the controller (or anyone)
        changed the state since this leader last saw it, and the next state change wins."""
        ready: list[tuple[Partition, tuple[int, ...], str, StateWrite, int]] = []
        try:
            for part, new_isr, reason, based_on in batch:
                prepared = self._prepare_isr_write(part, new_isr, based_on)
                if prepared is not None:
                    ready.append((part, new_isr, reason, *prepared))
            if not ready:
                return
            items = [(write, version) for _, _, _, write, version in ready]
            outcomes = await asyncio.to_thread(
                self.store.write_partition_states, items, f"broker {self.config.broker_id}"
            )
            for (part, new_isr, reason, write, version), outcome in zip(ready, outcomes, strict=True):
                if isinstance(outcome, BadVersionError):
                    continue
                if isinstance(outcome, Exception):
                    log.warning("event=isr_write_failed partition=%s error=%r", part.name, outcome)
                    continue
                self.metadata.apply_writes([write], notice=outcome)
                if part.is_leader and part.leader_epoch == write.state.leader_epoch:
                    old = part.isr
                    part.set_isr(new_isr, version + 1)
                    log.info(
                        "event=isr_changed partition=%s isr=%s->%s leader_epoch=%d reason=%r",
                        part.name, list(old), list(new_isr), write.state.leader_epoch, reason,
                    )  # fmt: skip
        except ZOOKEEPER_UNREACHABLE as exc:
            # Nothing written is applied: the leader decides again at its next ISR check.
            log.warning("event=isr_write_failed partitions=%d error=%r", len(batch), exc)
        except Exception:
            log.exception("event=isr_write_failed partitions=%d", len(batch))
        finally:
            for part, _, _, _ in batch:
                part.end_isr_expansion()
                self._isr_writes.discard((part.topic, part.index))

    def _prepare_isr_write(
        self, part: Partition, new_isr: tuple[int, ...], based_on: int
    ) -> tuple[StateWrite, int] | None:
        """The state to write for a leader's ISR change, or None when it no longer applies. The
        write is conditional on the state version the decision was based on: if the controller
        changed the state meanwhile (e.g. dropped a dead follower), the decision is stale and
        is dropped, never written over the newer state (Kafka's AlterPartition epoch check)."""
        current = self.metadata.partition_state(part.topic, part.index)
        if current is None:
            return None
        state, version = current
        if version != based_on:
            return None
        if (
            state.leader != self.config.broker_id
            or state.leader_epoch != part.leader_epoch
            or not part.is_leader
        ):
            return None
        assert new_isr and self.config.broker_id in new_isr, "I6: the leader stays in a non-empty ISR"
        live, leaving = self.metadata.brokers(), self.metadata.shutting_down()
        ineligible = [r for r in new_isr if r not in state.isr and not isr_eligible(r, live, leaving)]
        if ineligible:
            # Checked again at the write: a broker whose session expired, or that began a
            # controlled shutdown, while the decision waited for its batch must not be written
            # back into the ISR the controller is shrinking (KIP-841).
            log.info(
                "event=isr_expansion_abandoned partition=%s ineligible=%s reason=unregistered_or_leaving",
                part.name,
                ineligible,
            )
            return None
        lagging = {r: part.follower_leos.get(r, -1) for r in part.joining}
        if any(leo < part.high_watermark for leo in lagging.values()):
            # A joining follower's log end went back (it truncated): it no longer qualifies.
            log.info(
                "event=isr_expansion_abandoned partition=%s joining=%s hw=%d",
                part.name,
                lagging,
                part.high_watermark,
            )
            return None
        assignment = self.metadata.topic(part.topic)
        if assignment is None or assignment.topic_id != part.topic_id:
            return None
        new_state = PartitionState(state.leader, state.leader_epoch, new_isr, state.controller_epoch)
        return StateWrite(part.topic, part.topic_id, part.index, new_state, version + 1), version

    def _on_leadership(self, topic: str, partition: int, is_leader: bool) -> None:
        if is_leader:
            part = self.replicas.partitions.get((topic, partition))
            # Only a topic that allows unclean elections can have had one (the controller elects
            # outside the ISR only then), and never for its first leader (epoch 0). Asking
            # ZooKeeper for every leadership taken cost a blocking call per partition: 3,333 of
            # them on a worker thread for each broker creating 10,000 partitions.
            if (
                part is not None
                and part.leader_epoch > 0
                and part.config.get("unclean.leader.election.enable", "false") == "true"
            ):
                self.spawn(
                    self._complete_unclean_audit(topic, partition, part.leader_epoch, part.log.log_end_offset)
                )
        if topic == layout.TRANSACTION_STATE_TOPIC:
            (self.txn_coordinator.on_became_leader if is_leader else self.txn_coordinator.on_resigned)(
                partition
            )
        if topic != OFFSETS_TOPIC:
            return
        if is_leader:
            self.coordinator.on_became_leader(partition)
        else:
            self.coordinator.on_resigned(partition)

    async def _complete_unclean_audit(self, topic: str, partition: int, epoch: int, leo: int) -> None:
        """If this leadership came from an unclean election, record where the possible loss starts."""
        try:
            done = await asyncio.to_thread(self.store.complete_unclean_audit, topic, partition, epoch, leo)
        except Exception as exc:
            log.warning("event=unclean_audit_write_failed partition=%s-%d error=%r", topic, partition, exc)
            return
        if not done:
            return
        log.warning(
            "event=unclean_leader_took_over partition=%s-%d leader_epoch=%d lost_from_offset=%d",
            topic,
            partition,
            epoch,
            leo,
        )

    def _on_session_state(self, state: str) -> None:
        # A lost session drops our ephemeral znode; when it comes back, register again.
        from kazoo.protocol.states import KazooState

        if state == KazooState.LOST and not self.stopping:  # at stop, the session is closed on purpose
            log.warning("event=zookeeper_session_lost id=%d", self.config.broker_id)
        elif state == KazooState.CONNECTED and self._loop is not None and not self.stopping:
            self._loop.call_soon_threadsafe(lambda: self.spawn(self._reregister()))

    def _registration(self) -> BrokerRegistration:
        """What /brokers/ids/<id> holds: the inter-broker listener's address and every listener's."""
        host, port = self.config.advertised
        endpoints = tuple((n, *e) for n, e in self.config.advertised_endpoints().items())
        return BrokerRegistration(self.config.broker_id, host, port, os.getpid(), self.config.rack, endpoints)

    async def _reregister(self) -> None:
        reg = self._registration()
        try:
            await asyncio.to_thread(self.store.register_broker, reg)
        except BrokerIdInUseError as exc:
            log.error("event=reregister_refused id=%d error=%s", self.config.broker_id, exc)
            self.request_stop()
        except Exception as exc:
            log.warning("event=reregister_failed id=%d error=%r", self.config.broker_id, exc)


#: What a broker asks for: Kafka's documentation asks operators for 100,000 descriptors or more.
OPEN_FILES_WANTED = 1_048_576


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> tuple[int, int]:
    """Raise this process's limit on open files as far as it may: the soft limit to the hard
    one, and the hard one too where the process is allowed to (root). Returns (soft, hard).

    A broker holds a descriptor for every segment's log file of every replica it hosts (and a
    few for sockets). At 10,000 partitions a shell's usual 20,000 ran out during creation, and
    the ZooKeeper client, unable to open a socket, lost the broker's session."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            soft = hard = wanted
        except (ValueError, OSError):
            pass  # not allowed: the hard limit stays
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft, hard


#: The cyclic garbage collector's thresholds for a broker (CPython's default is 700, 10, 10).
#: A broker's heap is mostly long-lived state, hundreds of objects per replica, and its hot paths
#: allocate short-lived lists of thousands (a fetch session's partitions, a controller pass).
#: Collecting the young generation every 700 allocations caught those alive and promoted them,
#: and the old generation's promotions set off a full collection: at 10,000 partitions one of
#: about 200 ms (the event loop stalled) every 30 s per broker while idle, 1,700 young
#: collections a minute. At 20,000 the transient lists die before a collection sees them.
GC_THRESHOLDS = (20_000, 10, 10)


def tune_gc() -> tuple[int, int, int]:
    """Set the broker's garbage-collection thresholds (``GC_THRESHOLDS``); returns them."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_threshold()


def run_broker(config: BrokerConfig) -> None:
    """Run one broker in the foreground until SIGTERM/SIGINT."""
    import uvloop

    soft, hard = raise_open_files_limit()
    log.info("event=open_files_limit soft=%d hard=%d", soft, hard)
    log.info("event=gc_thresholds thresholds=%s", ",".join(map(str, tune_gc())))
    uvloop.run(Broker(config, switches=test_switches.for_process()).run())

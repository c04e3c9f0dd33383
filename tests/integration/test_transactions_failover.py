"""Exactly-once consume-transform-produce through kill -9 of the transaction coordinator's
broker and of a partition leader (three brokers, replication factor 3, min.insync.replicas 2).

The application is confluent-kafka's consume-transform-produce loop: a read_committed consumer
in a group and a transactional producer writing each input's transform and the consumer's
offsets in one transaction (``send_offsets_to_transaction``). On any error it does what an
application does: it is started again (a new producer with the same transactional id, which
fences the old one and aborts its open transaction, and a new consumer in the same group,
which starts from the group's committed offsets). The checker then compares inputs and
outputs: every input transformed exactly once, none missing, none twice.

The default test kills each kind of broker once (about 25 s); the same loop runs on
kafka-python 3 and on aiokafka (about 30 s each; kafka-python's hang after its coordinator dies
is bounded by the application, see ``KafkaPythonTransformer``); the slow one kills a random
broker of either kind eight times. Two more pin what a new coordinator owes: a transaction
whose PrepareCommit the old one wrote without writing a single marker (the old one stopped at
the test-only "txn-markers" pause point, then killed) is completed, and a transaction left open
by a producer that went away with its coordinator is aborted at its timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError as AioKafkaError
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.errors import KafkaError as KafkaPythonError
from kafka.errors import KafkaTimeoutError

from sluice import test_switches
from sluice.broker.group_placement import partition_for_group
from sluice.clients import close_within
from sluice.cluster.layout import TRANSACTION_STATE_TOPIC
from sluice.cluster.zkstore import ZkStore
from tests.support.cluster import TestCluster, wait_until
from tests.support.transactions import read_values, wait_stable, watermarks

log = logging.getLogger("test.txn_failover")

PARTITIONS = 3
TXN_PARTITIONS = 6
SETTINGS = {
    "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
    "offsets.topic.num.partitions": "6",
    "min.insync.replicas": "2",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}


@pytest.fixture(scope="module")
def pause_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pause")


@pytest.fixture(scope="module")
def cluster(
    zookeeper: str, tmp_path_factory: pytest.TempPathFactory, pause_dir: Path
) -> Iterator[TestCluster]:
    """Three brokers armed with a pause directory (brokers restarted by the tests inherit it)."""
    with (
        test_switches.armed(test_switches.Switches(pause_dir=str(pause_dir))) as env,
        pytest.MonkeyPatch.context() as mp,
    ):
        for key, value in env.items():
            mp.setenv(key, value)
        c = TestCluster(zookeeper, tmp_path_factory.mktemp("txn-failover"), 3, 4.0, SETTINGS)
        try:
            yield c
        finally:
            c.down()


class Transformer:
    """One instance of the application, on confluent-kafka."""

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, txn_id: str) -> None:
        self.sink = sink
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": txn_id,
                "log_level": 0,
                "transaction.timeout.ms": 30000,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "session.timeout.ms": 6000,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 0,
            }
        )
        try:
            self.producer.init_transactions(60)
        except Exception:
            self.close()
            raise
        self.consumer.subscribe([source])

    def step(self, at: Callable[[str], None]) -> int:
        """One transaction of up to 10 inputs; how many it committed. ``at`` is called with
        "open" once its records and offsets are sent and "committed" once commit returned."""
        msgs = [m for m in self.consumer.consume(num_messages=10, timeout=0.5) if m.error() is None]
        if not msgs:
            return 0
        self.producer.begin_transaction()
        for m in msgs:
            value = m.value()
            assert value is not None
            self.producer.produce(self.sink, value=b"out-" + value, partition=m.partition())
        self.producer.send_offsets_to_transaction(
            self.consumer.position(self.consumer.assignment()), self.consumer.consumer_group_metadata(), 30
        )
        at("open")
        self.producer.commit_transaction(30)
        at("committed")
        return len(msgs)

    def idle(self, seconds: float) -> None:
        """Nothing to do for a while (librdkafka heartbeats on threads of its own)."""
        time.sleep(seconds)

    def close(self) -> None:
        close_within(self.consumer, 10)
        close_within(self.producer, 10, what="producer")

    def abandon(self) -> object:
        """The instance dies where it stands: its consumer leaves the group (so its successor
        gets the partitions), its producer is kept, unclosed, with whatever it had open."""
        close_within(self.consumer, 10)
        return self.producer


#: How long a call may wait with `lost()` true all along before it is a hang: the client's own
#: state passes through "nothing queued, nothing in flight" between two requests of one call
#: (a response handled, its follow-up not yet queued), for moments, never seconds.
LOST_FOR_S = 3.0


def bounded(
    call: Callable[[], Any], timeout_s: float, what: str, lost: Callable[[], bool] | None = None
) -> Any:
    """``call()`` on a thread of its own, given ``timeout_s``: a call still waiting then is a hung
    client, which the application treats as a failure (it restarts, as a watchdog would restart
    it); raises kafka-python's KafkaTimeoutError. ``lost()``: whether nothing the client holds
    can ever answer the call any more; true for LOST_FOR_S on end, the call is hung as well."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"bounded-{what}", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    lost_since: float | None = None
    while not done.wait(0.1):
        now = time.monotonic()
        if now >= deadline:
            raise KafkaTimeoutError(f"{what} still waiting after {timeout_s:.0f} s")
        if lost is None or not lost():
            lost_since = None
        elif lost_since is None:
            lost_since = now
        elif now - lost_since >= LOST_FOR_S:
            raise KafkaTimeoutError(
                f"{what} still waiting, its request lost: nothing queued or in flight for {LOST_FOR_S:.0f} s"
            )
    if "error" in box:
        raise box["error"]
    return box.get("result")


class KafkaPythonTransformer:
    """The same application on kafka-python 3 (its transactional producer and group consumer,
    ``send_offsets_to_transaction`` with the consumer's group metadata, KIP-447).

    kafka-python 3.0.12 loses a transactional request whose coordinator's connection fails: its
    sender logs "Got an exception when trying to find a node to send a transactional request
    to" and looks the coordinator up again, but does not requeue the request (``target_node`` is
    still set in that branch), so ``commit_transaction`` would wait for good after its
    coordinator is killed. The application bounds each transactional call and restarts on a
    hang; its successor's InitProducerId fences the hung producer, so exactly-once must still
    hold. A call is hung once its request is seen lost (`_request_lost`), which it is right
    after the coordinator's kill, or at the latest after CALL_TIMEOUT_S (it waited the whole
    40 s for each kill of the coordinator: two thirds of the test's time). The successor's own
    InitProducerId is bounded the same way: started before the killed coordinator's session
    expired, it is lost as well, and kafka-python would wait max_block_ms (60 s) for it."""

    CALL_TIMEOUT_S = 40

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, txn_id: str) -> None:
        from kafka import KafkaConsumer, KafkaProducer

        self.sink = sink
        self.hung = False  # a transactional call of it was found hung
        self.producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            transactional_id=txn_id,
            transaction_timeout_ms=30000,
            max_block_ms=60000,
        )
        try:
            # Its InitProducerId is lost too when it finds the killed coordinator still named
            # (before that broker's session expired): kafka-python's own bound is max_block_ms.
            bounded(self.producer.init_transactions, self.CALL_TIMEOUT_S, "init", self._request_lost)
        except Exception:
            self.producer.close(timeout=1)
            raise
        self.consumer = KafkaConsumer(
            source,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )

    def step(self, at: Callable[[str], None]) -> int:
        from kafka import OffsetAndMetadata

        polled = self.consumer.poll(timeout_ms=500, max_records=10)
        if not polled:
            return 0
        self.producer.begin_transaction()
        offsets = {}
        n = 0
        for tp, records in polled.items():
            for r in records:
                self.producer.send(self.sink, value=b"out-" + r.value, partition=tp.partition)
                n += 1
            offsets[tp] = OffsetAndMetadata(records[-1].offset + 1, "", -1)
        metadata = self.consumer.group_metadata()
        try:
            bounded(
                lambda: self.producer.send_offsets_to_transaction(offsets, metadata),
                self.CALL_TIMEOUT_S,
                "offsets",
                self._request_lost,
            )
            at("open")
            bounded(self.producer.commit_transaction, self.CALL_TIMEOUT_S, "commit", self._request_lost)
        except KafkaTimeoutError:
            self.hung = True
            raise
        at("committed")
        return n

    def _request_lost(self) -> bool:
        """The bug's state: the producer's transaction manager has no request queued and none in
        flight (the lost one is in neither), so nothing can answer the call that waits. While a
        call's request waits for a coordinator, or its EndTxn for the batches, it is queued."""
        manager = self.producer._transaction_manager
        return not manager._pending_requests and not manager.has_in_flight_transactional_request()

    def idle(self, seconds: float) -> None:
        """Nothing to do for a while (kafka-python heartbeats on a thread of its own)."""
        time.sleep(seconds)

    def close(self) -> None:
        """A hung producer is closed without waiting: its close would only wait out its timeout
        (its flush cannot finish with the transaction's request lost) and fail all the same."""
        close_within(self.consumer, 10)
        close_within(_Closing(self.producer, 0.0 if self.hung else 5.0), 10, what="producer")

    def abandon(self) -> object:
        close_within(self.consumer, 10)
        return _Closing(self.producer)


class _Closing:
    """A kafka-python producer whose ``close()`` waits at most ``timeout_s`` for what it has in
    flight."""

    def __init__(self, producer: Any, timeout_s: float = 5.0) -> None:
        self.producer, self.timeout_s = producer, timeout_s

    def close(self) -> None:
        self.producer.close(timeout=self.timeout_s)


class AiokafkaTransformer:
    """The same application on aiokafka (its transactional producer and group consumer,
    ``send_offsets_to_transaction`` with the group id), on an event loop of its own; every call
    is bounded, so a client that hangs is an application error (restarted), not a stuck test."""

    CALL_TIMEOUT_S = 60

    def __init__(self, bootstrap: str, source: str, sink: str, group: str, txn_id: str) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        self.sink, self.group = sink, group
        self.loop = asyncio.new_event_loop()

        async def make() -> tuple[Any, Any]:  # aiokafka's clients are made on their loop
            producer = AIOKafkaProducer(
                bootstrap_servers=bootstrap, transactional_id=txn_id, transaction_timeout_ms=30000
            )
            consumer = AIOKafkaConsumer(
                source,
                bootstrap_servers=bootstrap,
                group_id=group,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                isolation_level="read_committed",
                session_timeout_ms=6000,
                heartbeat_interval_ms=1000,
            )
            return producer, consumer

        self.producer, self.consumer = self._run(make())
        try:
            self._run(self.producer.start())
            self._run(self.consumer.start())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(asyncio.wait_for(coro, self.CALL_TIMEOUT_S))

    def step(self, at: Callable[[str], None]) -> int:
        polled = self._run(self.consumer.getmany(timeout_ms=500, max_records=10))
        if not polled:
            return 0

        async def send_all() -> int:
            await self.producer.begin_transaction()
            sent = [
                await self.producer.send(self.sink, value=b"out-" + r.value, partition=tp.partition)
                for tp, records in polled.items()
                for r in records
            ]
            await asyncio.gather(*sent)
            offsets = {tp: records[-1].offset + 1 for tp, records in polled.items()}
            await self.producer.send_offsets_to_transaction(offsets, self.group)
            return len(sent)

        n = int(self._run(send_all()))
        at("open")
        self._run(self.producer.commit_transaction())
        at("committed")
        return n

    def idle(self, seconds: float) -> None:
        """Nothing to do for a while, its event loop running: aiokafka's consumer heartbeats on
        it, and would lose its group session if the loop stood still."""
        self._run(asyncio.sleep(seconds))

    def _stop(self, client: Any) -> None:
        try:
            self._run(client.stop())
        except Exception as exc:
            log.info("event=aiokafka_stop_failed error=%r", exc)

    def close(self) -> None:
        self._stop(self.consumer)
        self._stop(self.producer)
        self.loop.close()

    def abandon(self) -> object:
        self._stop(self.consumer)
        return _Abandoned(self)


class _Abandoned:
    """An abandoned aiokafka producer, stopped (with its loop) only at the end of the run."""

    def __init__(self, app: AiokafkaTransformer) -> None:
        self.app = app

    def close(self) -> None:
        self.app._stop(self.app.producer)
        self.app.loop.close()


def all_registered(cluster: TestCluster) -> None:
    """Wait until all three brokers are registered: a restarted broker answers on its port
    before its registration replaces the dead one's (whose session has still to expire)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    wait_until(lambda: len(admin.list_topics(timeout=10).brokers) == 3, 60, "all three brokers registered")


@pytest.fixture(autouse=True)
def all_brokers_up(cluster: TestCluster) -> None:
    all_registered(cluster)


def new_topics(cluster: TestCluster, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    for name in names:
        admin.create_topics([NewTopic(name, PARTITIONS, 3)], operation_timeout=30)[name].result(60)


def coordinator_of(cluster: TestCluster, txn_id: str) -> int:
    store = ZkStore(cluster.zookeeper)
    store.start()
    try:
        return _victim(store, "coordinator", txn_id, "")
    finally:
        store.stop()


#: what a failed client call raises (the application starts again on any)
APP_ERRORS = (KafkaException, KafkaPythonError, AioKafkaError, TimeoutError)


class AppCrash(Exception):
    """The application instance dies (the test's fault): it is abandoned where it stands."""


App = Transformer | KafkaPythonTransformer | AiokafkaTransformer


def run_with_kills(
    cluster: TestCluster,
    kills: list[str],
    seed: int,
    deadline_s: float = 240,
    make_app: Callable[[str, str, str, str, str], App] = Transformer,
) -> None:
    """Transform 300 inputs (more for many kills) through each fault of ``kills``, one after
    another every few transactions: "coordinator" kills (-9) the transactional id's coordinator's
    broker, "leader" the leader of a sink partition led elsewhere (each restarted in the
    background), "app" abandons the application instance (a new one takes over with the same
    transactional id and group). Each strikes either with a transaction open (its records and
    offsets sent, the commit not yet asked for) or right after a commit was answered (its
    markers still being written).

    The plan waits for the state each kill needs, never for the machine's speed: a kill due
    while the last killed broker is still restarting (two of three replicas must be in sync)
    holds the application, idle between two transactions, until that broker is back. Issue 32:
    with the application running on meanwhile, on a machine 2.4 times slower than usual the
    restart outlasted the inputs, and aiokafka's run ended "before every kill: ['app'] left"."""
    rng = random.Random(seed)
    source, sink = f"in-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
    new_topics(cluster, source, sink)
    inputs = [f"{i:05d}".encode() for i in range(max(300, 90 * len(kills)))]  # ~7 transactions a kill
    feeder = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "log_level": 0})
    for i, v in enumerate(inputs):
        feeder.produce(source, value=v, partition=i % PARTITIONS)
    assert feeder.flush(60) == 0
    group, txn_id = f"g-{source}", f"x-{source}"
    store = ZkStore(cluster.zookeeper)
    store.start()
    restarts = ThreadPoolExecutor(max_workers=1)
    pending_restart: Future[None] | None = None
    app: App | None = None
    abandoned: list[object] = []
    progress = failures = 0
    plan = list(kills)
    next_kill_at = rng.randint(3, 6)
    transactions = 0
    deadline = time.monotonic() + deadline_s
    idle = False

    def at(point: str) -> None:
        nonlocal pending_restart, next_kill_at
        due = plan and transactions >= next_kill_at and (pending_restart is None or pending_restart.done())
        if not due or point != kill_point[0]:
            return
        if pending_restart is not None:
            pending_restart.result()
        kind = plan.pop(0)
        next_kill_at = transactions + rng.randint(4, 8)
        kill_point[0] = rng.choice(["open", "committed"])
        if kind == "app":
            log.info("event=app_killed point=%s transactions=%d", point, transactions)
            raise AppCrash
        victim = _victim(store, kind, txn_id, sink)
        log.info("event=kill broker=%d kind=%s point=%s transactions=%d", victim, kind, point, transactions)
        cluster.kill(victim)
        pending_restart = restarts.submit(_restart_later, cluster, victim)

    def kill_waits_for_restart() -> bool:
        """The next kill is due, and the broker killed last is not back yet."""
        return (
            bool(plan)
            and transactions >= next_kill_at
            and pending_restart is not None
            and not pending_restart.done()
        )

    kill_point = [rng.choice(["open", "committed"])]
    try:
        while not (idle and _all_committed(cluster.bootstrap, group, source, len(inputs) // PARTITIONS)):
            assert time.monotonic() < deadline, (
                f"{progress} of {len(inputs)} inputs after {deadline_s} s, {failures} restarts"
            )
            try:
                if app is None:
                    app = make_app(cluster.bootstrap, source, sink, group, txn_id)
                while kill_waits_for_restart() and time.monotonic() < deadline:
                    app.idle(0.2)
                n = app.step(at)
                idle = n == 0
                if n:
                    transactions += 1
                    progress += n
            except AppCrash:
                idle = False
                assert app is not None
                abandoned.append(app.abandon())  # its open transaction is the successor's to fence
                app = None
            except APP_ERRORS as exc:
                idle = False
                failures += 1
                log.info("event=app_restart error=%s", exc)
                if app is not None:
                    app.close()
                app = None
        if pending_restart is not None:
            pending_restart.result()
    finally:
        if app is not None:
            app.close()
        for producer in abandoned:
            close_within(producer, 1, what="producer")
        restarts.shutdown(wait=True)
        store.stop()
    assert not plan, f"the run ended before every kill: {plan} left"
    wait_stable(cluster.bootstrap, sink, PARTITIONS, timeout_s=90)
    outputs = Counter(read_values(cluster.bootstrap, sink, range(PARTITIONS), "read_committed"))
    expected = Counter(b"out-" + v for v in inputs)
    missing = sorted((expected - outputs).elements())
    twice = sorted((outputs - expected).elements())
    assert not missing and not twice, (
        f"missing {missing[:10]} ({len(missing)}), twice {twice[:10]} ({len(twice)})"
    )
    log.info("event=checked inputs=%d transactions=%d restarts=%d", len(inputs), transactions, failures)


def _all_committed(bootstrap: str, group: str, topic: str, per_partition: int) -> bool:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 0})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        return all(tp.offset >= per_partition for tp in got)
    except KafkaException:
        return False
    finally:
        close_within(c, 10)


def _victim(store: ZkStore, kind: str, txn_id: str, sink: str) -> int:
    coordinator_p = partition_for_group(txn_id, TXN_PARTITIONS)

    def leader(topic: str, p: int) -> int:
        found = store.partition_state(topic, p)
        return found[0].leader if found else -1

    def live_coordinator() -> int:
        return max(0, leader(TRANSACTION_STATE_TOPIC, coordinator_p))

    coordinator: int = wait_until(live_coordinator, 60, "the transaction coordinator to have a leader")
    if kind == "coordinator":
        return coordinator
    others = [leader(sink, p) for p in range(PARTITIONS) if leader(sink, p) not in (coordinator, -1)]
    return others[0] if others else leader(sink, 0)


def _restart_later(cluster: TestCluster, broker_id: int) -> None:
    cluster.restart(broker_id)
    all_registered(cluster)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.timeout(300)
def test_consume_transform_produce_is_exactly_once_through_kill_9_of_coordinator_leader_and_app(
    cluster: TestCluster,
) -> None:
    run_with_kills(cluster, ["coordinator", "app", "leader", "app"], seed=5)


@pytest.mark.timeout(180)
def test_a_new_coordinator_writes_the_markers_of_a_commit_the_old_one_prepared(
    cluster: TestCluster, pause_dir: Path
) -> None:
    """The coordinator answers the commit once PrepareCommit is in __transaction_state, and is
    stopped right there, before any marker, then killed: no partition has a marker. The next
    leader of its partition finds the prepared commit, writes every marker and completes it."""
    topic = f"prep-{uuid.uuid4().hex[:6]}"
    new_topics(cluster, topic)
    txn_id = f"prep-{topic}"
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id, "log_level": 0})
    p.init_transactions(60)
    p.begin_transaction()
    values = [f"v{i}".encode() for i in range(9)]
    for i, v in enumerate(values):
        p.produce(topic, value=v, partition=i % PARTITIONS)
    assert p.flush(30) == 0
    coordinator = coordinator_of(cluster, txn_id)
    (pause_dir / "txn-markers").touch()
    p.commit_transaction(60)
    pid = cluster.broker(coordinator).pid
    wait_until(lambda: _stopped(pid), 30, f"broker {coordinator} to stop at the txn-markers pause point")
    cluster.kill(coordinator)
    close_within(p, 1, what="producer")  # abandoned: its close waits on the dead coordinator
    try:
        wait_stable(cluster.bootstrap, topic, PARTITIONS, timeout_s=90)
        assert sorted(read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed")) == values
    finally:
        cluster.restart(coordinator)


@pytest.mark.timeout(180)
def test_a_new_coordinator_aborts_an_open_transaction_at_its_timeout(cluster: TestCluster) -> None:
    """A producer opens a transaction and goes away as its coordinator is killed: the next
    coordinator loads the open transaction and aborts it at its timeout (3 s here), so the
    partitions' last stable offsets move past it and its records are never read."""
    topic = f"open-{uuid.uuid4().hex[:6]}"
    new_topics(cluster, topic)
    txn_id = f"open-{topic}"
    p = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 3000,
            "log_level": 0,
        }
    )
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(6):
        p.produce(topic, value=f"lost{i}".encode(), partition=i % PARTITIONS)
    assert p.flush(30) == 0
    coordinator = coordinator_of(cluster, txn_id)
    cluster.kill(coordinator)
    close_within(p, 1, what="producer")  # abandoned: its close waits on the dead coordinator
    try:
        hw = wait_stable(cluster.bootstrap, topic, PARTITIONS, timeout_s=90)
        assert sum(hw) >= 6 + PARTITIONS  # the records and an ABORT marker per partition
        assert read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed") == []
        assert watermarks(cluster.bootstrap, topic, PARTITIONS, "read_committed") == hw
    finally:
        cluster.restart(coordinator)


@pytest.mark.timeout(300)
def test_kafka_pythons_consume_transform_produce_is_exactly_once_through_the_same_faults(
    cluster: TestCluster,
) -> None:
    run_with_kills(cluster, ["coordinator", "app", "leader", "app"], seed=5, make_app=KafkaPythonTransformer)


@pytest.mark.timeout(300)
def test_aiokafkas_consume_transform_produce_is_exactly_once_through_the_same_faults(
    cluster: TestCluster,
) -> None:
    run_with_kills(cluster, ["coordinator", "app", "leader", "app"], seed=6, make_app=AiokafkaTransformer)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_consume_transform_produce_is_exactly_once_through_many_kills(cluster: TestCluster) -> None:
    rng = random.Random(1919)
    kills = [rng.choice(["coordinator", "leader", "app"]) for _ in range(12)]
    run_with_kills(cluster, kills, seed=1919, deadline_s=900)

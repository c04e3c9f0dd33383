"""Three brokers, RF=3, acks=all idempotent producer: every acknowledged record survives a
kill -9 of a partition leader, a kill -9 of the controller, and a controlled shutdown, and is
read back exactly once; the producer resumes after each fault."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

TOPIC = "replicated"
PARTITIONS = 3


class Workload:
    """An idempotent acks=all producer in the background, recording every acknowledgement."""

    def __init__(self, bootstrap: str):
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: list[str] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.bootstrap = bootstrap
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err: object, msg: object) -> None:
        with self.lock:
            if err is None:
                self.acked[msg.value()] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]
            else:
                self.failed.append(str(err))

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120000,
            }
        )
        i = 0
        while not self.stop_event.is_set():
            try:
                producer.produce(
                    TOPIC, value=f"w{i:08d}".encode(), key=str(i).encode(), on_delivery=self._on_delivery
                )
                i += 1
            except BufferError:
                producer.poll(0.01)
            if i % 100 == 0:
                producer.poll(0.005)  # bounded rate keeps the read-back short
        producer.flush(120)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def wait_for_more(self, n: int, timeout_s: float, what: str) -> None:
        start = self.count()
        wait_until(lambda: self.count() >= start + n, timeout_s, what)


def read_all(bootstrap: str) -> dict[bytes, list[tuple[int, int]]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "failover-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    seen: dict[bytes, list[tuple[int, int]]] = {}
    eof: set[int] = set()
    deadline = time.monotonic() + 90
    try:
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    if msg.error().code() == -191:
                        eof.add(msg.partition())
                    continue
                eof.discard(msg.partition())
                seen.setdefault(msg.value(), []).append((msg.partition(), msg.offset()))
    finally:
        close_within(consumer)
    assert len(eof) == PARTITIONS
    return seen


def leader_of(bootstrap: str, partition: int) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(TOPIC, timeout=10)
    return int(md.topics[TOPIC].partitions[partition].leader)


def controller_of(cluster: TestCluster) -> int:
    from sluice.ops.launcher import wait_controller

    return wait_controller(cluster.cluster)


@pytest.mark.parametrize("fault", ["kill_leader", "kill_controller", "controlled_shutdown"])
def test_acknowledged_records_survive_and_are_read_exactly_once(
    make_cluster: Callable[..., TestCluster], fault: str
) -> None:
    cluster = make_cluster(3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], operation_timeout=30)[TOPIC].result()
    work = Workload(cluster.bootstrap)
    work.thread.start()
    work.wait_for_more(3000, 60, "acknowledgements before the fault")

    if fault == "kill_leader":
        victim = leader_of(cluster.bootstrap, 0)
        cluster.kill(victim, signal.SIGKILL)
    elif fault == "kill_controller":
        victim = controller_of(cluster)
        cluster.kill(victim, signal.SIGKILL)
    else:
        victim = leader_of(cluster.bootstrap, 0)
        cluster.stop(victim)
    work.wait_for_more(3000, 90, f"the producer to resume after {fault} of broker {victim}")
    wait_until(
        lambda: leader_of(cluster.bootstrap, 0) not in (victim, -1), 30, "a new leader for partition 0"
    )

    cluster.restart(victim)
    work.wait_for_more(1000, 60, "more acknowledgements with the broker back")
    work.stop_event.set()
    work.thread.join(150)
    assert not work.thread.is_alive()

    seen = read_all(cluster.bootstrap)
    lost = [v for v in work.acked if v not in seen]
    duplicated = {v: where for v, where in seen.items() if len(where) > 1}
    assert lost == [], f"{len(lost)} acknowledged records lost after {fault}, e.g. {lost[:5]}"
    assert duplicated == {}, (
        f"{len(duplicated)} records read twice after {fault}, e.g. {list(duplicated.items())[:3]}"
    )
    for value, (p, offset) in work.acked.items():
        assert seen[value] == [(p, offset)], f"{value!r} acknowledged at {p}/{offset}, read at {seen[value]}"

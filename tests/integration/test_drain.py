"""Incident C: a single-replica partition survives its broker's maintenance when the broker is
drained first: a producer writing to it throughout sees no failed send."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice import test_switches
from sluice.clients import close_within
from sluice.ops.launcher import pid_alive
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

TOPIC = "single"


def sluice(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_drain_then_stop_moves_a_single_replica_partition_with_no_failed_send(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(3)
    victim = 2
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics(
        [NewTopic(TOPIC, num_partitions=2, replica_assignment=[[victim], [1]])], operation_timeout=30
    )[TOPIC].result()

    acked: list[tuple[bytes, int]] = []
    failed: list[str] = []
    stop = threading.Event()

    def on_delivery(err: object, msg: object) -> None:
        if err is None:
            acked.append((msg.value(), msg.offset()))  # type: ignore[attr-defined]
        else:
            failed.append(str(err))

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 60000,
            }
        )
        i = 0
        while not stop.is_set():
            producer.produce(TOPIC, value=f"s{i:07d}".encode(), partition=0, on_delivery=on_delivery)
            i += 1
            producer.poll(0.002)
        producer.flush(60)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    wait_until(lambda: len(acked) > 500, 30, "writes to the single-replica partition")

    drained = sluice("broker", "drain", str(victim), "--dir", str(cluster.directory))
    assert drained.returncode == 0, drained.stderr + drained.stdout
    assert f"drained=true broker={victim}" in drained.stdout
    md = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    assert victim not in md[0].replicas and md[0].leader != victim

    before_stop = len(acked)
    stopped = sluice("broker", "stop", str(victim), "--dir", str(cluster.directory))
    assert stopped.returncode == 0, stopped.stderr
    assert not pid_alive(cluster.broker(victim).pid)
    wait_until(lambda: len(acked) > before_stop + 500, 30, "writes to continue after the stop")
    stop.set()
    thread.join(90)

    assert failed == [], f"{len(failed)} sends failed, e.g. {failed[:3]}"
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "drain-check", "enable.partition.eof": True}
    )
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read: list[tuple[bytes, int]] = []
    deadline = time.monotonic() + 60
    done = False
    while not done and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, timeout=1.0):
            if msg.error() is not None:
                done = msg.error().code() == -191
                continue
            read.append((msg.value(), msg.offset()))
    close_within(consumer)
    assert sorted(read, key=lambda r: r[1]) == sorted(acked, key=lambda r: r[1])


def test_drain_fails_and_names_the_unfinished_move_when_the_controller_cannot_move_replicas(
    make_cluster: Callable[..., TestCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Able to fail: with the brokers armed with `disable_reassignment`, the controller never
    moves the replica, and the drain says so instead of reporting the broker safe to stop: the
    single-replica drill's able-to-fail run in seconds
    (`test_incidents.py::test_single_replica_shutdown_fails_when_drain_cannot_move_replicas`,
    slow)."""
    with test_switches.armed(test_switches.Switches(disable_reassignment=True)) as env:
        for name, value in env.items():
            monkeypatch.setenv(name, value)  # the brokers the launcher starts inherit it
        cluster = make_cluster(2)
        victim = 2
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        admin.create_topics(
            [NewTopic(TOPIC, num_partitions=1, replica_assignment=[[victim]])], operation_timeout=30
        )[TOPIC].result()
        drained = sluice("broker", "drain", str(victim), "--dir", str(cluster.directory), "--timeout", "6")
    assert drained.returncode != 0, drained.stdout
    assert "move(s) did not finish within 6 s" in drained.stderr, drained.stderr
    assert "drained=true" not in drained.stdout
    md = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
    assert md[0].replicas == [victim], md[0].replicas

"""The README's main job: a local 3-broker cluster, a replicated topic, an idempotent acks=all
producer, a broker killed with kill -9 in the middle, and a report of what was acknowledged,
read back, lost or duplicated. Later issues grow it into the full change-data sync demo."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.ops import launcher

TOPIC = "demo-orders"
PARTITIONS = 3
BROKERS = 3


def run_demo(directory: Path, *, records: int, keep: bool, console: Console) -> bool:
    directory = directory.resolve()
    if (directory / launcher.STATE_FILE).exists():
        try:
            launcher.cluster_down(directory)
        except Exception:
            pass
        shutil.rmtree(directory, ignore_errors=True)
    console.print(f"[bold]1.[/] starting a local cluster of {BROKERS} brokers in {directory}")
    t0 = time.monotonic()
    cluster = launcher.cluster_up(directory, brokers=BROKERS)
    took_s = time.monotonic() - t0
    console.print(
        f"   bootstrap.servers={cluster.bootstrap_servers}  zookeeper={cluster.zookeeper}  ({took_s:.1f} s)"
    )
    try:
        return _produce_kill_and_check(cluster, records=records, console=console)
    finally:
        if keep:
            console.print(f"cluster left running: `sluice cluster down --dir {directory}` stops it")
        else:
            launcher.cluster_down(directory)
            console.print("[bold]6.[/] cluster stopped")


def _produce_kill_and_check(cluster: launcher.LocalCluster, *, records: int, console: Console) -> bool:
    """Steps 2-5. Its clients are gone when it returns, before the cluster stops."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = cluster.bootstrap_servers
    console.print(
        f"[bold]2.[/] creating topic {TOPIC}: {PARTITIONS} partitions, replication factor 3, "
        "min.insync.replicas 2"
    )
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3)], operation_timeout=30)[TOPIC].result()

    console.print(
        f"[bold]3.[/] producing {records:,} records (idempotent, acks=all, zstd); "
        "kill -9 of partition 0's leader half way"
    )
    acked: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    failed: list[str] = []
    lock = threading.Lock()
    kill_time: list[float] = []
    first_ack_after_kill: list[float] = []

    def on_delivery(error: object, msg: object) -> None:
        with lock:
            if error is not None:
                failed.append(str(error))
                return
            acked[msg.partition()].append(int(msg.value()))  # type: ignore[attr-defined]
            if kill_time and not first_ack_after_kill and msg.partition() == 0:  # type: ignore[attr-defined]
                first_ack_after_kill.append(time.monotonic())

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
            "log_level": 0,
        }
    )
    victim = int(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0].leader)
    t1 = time.monotonic()
    for i in range(records):
        if i == records // 2:
            producer.flush(30)
            os.kill(cluster.broker(victim).pid, signal.SIGKILL)
            kill_time.append(time.monotonic())
            console.print(f"   killed broker {victim} (kill -9) after {i:,} records; producing on")
        while True:
            try:
                producer.produce(
                    TOPIC, key=f"order-{i % 997}".encode(), value=str(i).encode(), on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    producer.flush(120)
    produce_s = time.monotonic() - t1
    if first_ack_after_kill:
        console.print(
            f"   partition 0 acknowledged again {first_ack_after_kill[0] - kill_time[0]:.1f} s after "
            "the kill (ZooKeeper session timeout 6 s, then a new leader from the ISR)"
        )

    console.print(f"[bold]4.[/] restarting broker {victim}; it truncates by leader epoch and catches up")
    launcher.restart_broker(cluster, cluster.broker(victim))

    console.print("[bold]5.[/] consuming everything back by partition assignment")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "demo",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    total_acked = sum(len(v) for v in acked.values())
    t2 = time.monotonic()
    deadline = t2 + 60
    while sum(len(v) for v in read.values()) < total_acked and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=0.5):
            partition, value = msg.partition(), msg.value()
            if msg.error() is None and partition is not None and value is not None:
                read[partition].append(int(value))
    consume_s = time.monotonic() - t2
    consumer.close()

    table = Table(title="what happened")
    for col in ("partition", "acknowledged", "read", "lost", "duplicated", "in order"):
        table.add_column(col, justify="right")
    lost_total = dup_total = 0
    all_in_order = True
    for p in range(PARTITIONS):
        a, r = acked[p], read[p]
        lost = len(set(a) - set(r))
        dup = len(r) - len(set(r))
        in_order = r == sorted(r)
        lost_total += lost
        dup_total += dup
        all_in_order &= in_order
        table.add_row(str(p), f"{len(a):,}", f"{len(r):,}", str(lost), str(dup), "yes" if in_order else "NO")
    console.print(table)
    produce_rate = records / produce_s
    consume_rate = total_acked / max(consume_s, 1e-9)
    console.print(
        f"   produce: {produce_rate:,.0f} records/s (failover included); "
        f"consume: {consume_rate:,.0f} records/s"
    )
    ok = not failed and total_acked == records and lost_total == 0 and dup_total == 0 and all_in_order
    if ok:
        console.print(
            "[bold green]OK[/]: every acknowledged record was read back once, in order, "
            "across a kill -9 of a leader"
        )
    else:
        console.print(
            f"[bold red]FAILED[/]: {len(failed)} send errors {failed[:3]}, "
            f"lost {lost_total}, duplicated {dup_total}"
        )
    del producer, admin
    return ok

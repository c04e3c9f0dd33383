"""The README's main job: a local cluster, a topic, a sample produced and consumed back, and a
report of what happened. Later issues grow it into the full change-data sync demo."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.ops import launcher

TOPIC = "demo-orders"
PARTITIONS = 3


def run_demo(directory: Path, *, records: int, keep: bool, console: Console) -> bool:
    directory = directory.resolve()
    if (directory / launcher.STATE_FILE).exists():
        try:
            launcher.cluster_down(directory)
        except Exception:
            pass
        shutil.rmtree(directory, ignore_errors=True)
    console.print(f"[bold]1.[/] starting a local cluster in {directory}")
    t0 = time.monotonic()
    cluster = launcher.cluster_up(directory, brokers=1)
    took_s = time.monotonic() - t0
    console.print(
        f"   bootstrap.servers={cluster.bootstrap_servers}  zookeeper={cluster.zookeeper}  ({took_s:.1f} s)"
    )
    try:
        return _produce_and_check(cluster.bootstrap_servers, records=records, console=console)
    finally:
        if keep:
            console.print(f"cluster left running: `sluice cluster down --dir {directory}` stops it")
        else:
            launcher.cluster_down(directory)
            console.print("[bold]5.[/] cluster stopped")


def _produce_and_check(bootstrap: str, *, records: int, console: Console) -> bool:
    """Steps 2-4. Its clients are gone when it returns, before the cluster stops."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    console.print(f"[bold]2.[/] creating topic {TOPIC} with {PARTITIONS} partitions")
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, -1)], operation_timeout=30)[TOPIC].result()

    console.print(f"[bold]3.[/] producing {records:,} records (idempotent, acks=all, zstd)")
    acked: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    failed: list[str] = []

    def on_delivery(error: object, msg: object) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            acked[msg.partition()].append(int(msg.value()))  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
            "log_level": 3,
        }
    )
    t1 = time.monotonic()
    for i in range(records):
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
    producer.flush(60)
    produce_s = time.monotonic() - t1

    console.print("[bold]4.[/] consuming everything back by partition assignment")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "demo",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
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
    console.print(f"   produce: {produce_rate:,.0f} records/s; consume: {consume_rate:,.0f} records/s")
    ok = not failed and total_acked == records and lost_total == 0 and dup_total == 0 and all_in_order
    if ok:
        console.print("[bold green]OK[/]: every acknowledged record was read back once, in order")
    else:
        console.print(
            f"[bold red]FAILED[/]: {len(failed)} send errors {failed[:3]}, "
            f"lost {lost_total}, duplicated {dup_total}"
        )
    del producer, admin
    return ok

"""Failover time on a local 3-broker cluster, RF=3, min.insync.replicas=2, idempotent acks=all.

For each fault (kill -9 of partition 0's leader; controlled shutdown of it) a producer writes
to partition 0 continuously (one record every ~2 ms) and we print:

- first_ack_s: from the fault to the first acknowledgement of a record produced after it,
  which can only come from the new leader for kill -9;
- max_gap_s: the longest time partition 0 went without any acknowledgement around the fault
  (the unavailability a client sees).

Usage: .venv/bin/python bench/failover.py [--session-timeout 6] [--rounds 3]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.ops import launcher

TOPIC = "failover"


def leader_of(admin: AdminClient, partition: int) -> int:
    return int(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[partition].leader)


def run_round(cluster: launcher.LocalCluster, fault: str) -> tuple[float, float]:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
    acks: list[tuple[float, float]] = []  # (sent, acked)
    lock = threading.Lock()
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap_servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
                "log_level": 0,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 200,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        while not stop.is_set():
            sent = time.monotonic()

            def on_delivery(err: object, msg: object, sent: float = sent) -> None:
                if err is None:
                    with lock:
                        acks.append((sent, time.monotonic()))

            producer.produce(TOPIC, value=b"x" * 100, partition=0, on_delivery=on_delivery)
            producer.poll(0.002)
        producer.flush(60)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    time.sleep(2.0)
    victim = leader_of(admin, 0)
    b = cluster.broker(victim)
    t_fault = time.monotonic()
    if fault == "kill":
        os.kill(b.pid, signal.SIGKILL)
    else:
        threading.Thread(target=launcher.stop_pid, args=(b.pid,), daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if any(s > t_fault for s, _ in acks):
                break
        time.sleep(0.02)
    time.sleep(1.0)
    stop.set()
    thread.join(60)
    with lock:
        after = [a for s, a in acks if s > t_fault]
        ack_times = sorted(a for _, a in acks)
    first = (min(after) - t_fault) if after else float("nan")
    window = [a for a in ack_times if t_fault - 1 <= a]
    gaps = [y - x for x, y in itertools.pairwise(window)]
    max_gap = max(gaps) if gaps else float("nan")
    # Bring the broker back for the next round.
    launcher.stop_pid(b.pid)  # a controlled shutdown may still be finishing
    launcher.restart_broker(cluster, b)
    time.sleep(3.0)  # let it rejoin the ISR
    return first, max_gap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session-timeout", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="sluice-failover-"))
    cluster = launcher.cluster_up(directory, 3, zk_session_timeout_s=args.session_timeout)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        admin.create_topics([NewTopic(TOPIC, 1, 3)], operation_timeout=30)[TOPIC].result()
        print(f"command: {' '.join(sys.argv)}")
        print(f"cluster: 3 brokers, RF=3, min.insync.replicas=2, zk session timeout {args.session_timeout} s")
        for fault in ("kill", "controlled"):
            results = [run_round(cluster, fault) for _ in range(args.rounds)]
            firsts = [r[0] for r in results]
            gaps = [r[1] for r in results]
            name = "kill -9 of the leader" if fault == "kill" else "controlled shutdown of the leader"
            print(
                f"{name:36s} first_ack_s median={statistics.median(firsts):.2f} max={max(firsts):.2f}   "
                f"max_gap_s median={statistics.median(gaps):.2f} max={max(gaps):.2f}   "
                f"rounds={[f'{f:.2f}/{g:.2f}' for f, g in results]}"
            )
    finally:
        launcher.cluster_down(directory)


if __name__ == "__main__":
    main()

"""Failover time on a local 3-broker cluster, RF=3, min.insync.replicas=2, idempotent acks=all.

For each fault (kill -9 of partition 0's leader; controlled shutdown of it) a producer writes
to partition 0 continuously (one record every ~2 ms) and we print:

- first_ack_s: from the fault to the first acknowledgement of a record produced after it,
  which can only come from the new leader for kill -9;
- max_gap_s: the longest time partition 0 went without any acknowledgement around the fault
  (the unavailability a client sees).

After each round the broker is restarted with its data and the next round waits until it is
back in partition 0's ISR (bounded by 60 s).

``--against sluice,kafka`` runs the same rounds on a local Apache Kafka 3.9.1 cluster
(``sluice.peers.kafka``, 3 ZooKeeper-mode brokers, zookeeper.session.timeout.ms=6000 like
Sluice's default session timeout, Kafka's defaults otherwise), one system after the other,
alternating which goes first for each fault, and prints for each figure the median of the
rounds in the format ``kill9_first_ack_s sluice=X kafka=Y`` then
``kill9_first_ack_s ratio sluice/kafka=R``. Kafka is skipped, with the reason, when its jars
are not fetched (``scripts/peers.sh``).

Usage: .venv/bin/python bench/failover.py [--session-timeout 6] [--rounds 3] [--against sluice,kafka]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

import systems as sysmod
import versus

TOPIC = "failover"
FAULTS = {"kill": "kill -9 of the leader", "controlled": "controlled shutdown of the leader"}
#: figure prefix of each fault in the compared lines
FIGURE_PREFIX = {"kill": "kill9", "controlled": "controlled"}


def partition0(admin: AdminClient) -> tuple[int, list[int]]:
    """(leader, ISR) of partition 0."""
    p = admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0]
    return int(p.leader), list(p.isrs)


def wait_isr_full(admin: AdminClient, replicas: int, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            leader, isr = partition0(admin)
            if leader >= 0 and len(isr) == replicas:
                return True
        except Exception:  # metadata not answered yet
            pass
        time.sleep(0.2)
    return False


def run_round(system: sysmod.System, fault: str) -> tuple[float, float]:
    admin = AdminClient({"bootstrap.servers": system.bootstrap_servers, "log_level": 0})
    acks: list[tuple[float, float]] = []  # (sent, acked)
    lock = threading.Lock()
    stop = threading.Event()

    def produce() -> None:
        producer = Producer(
            {
                "bootstrap.servers": system.bootstrap_servers,
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
    victim, _ = partition0(admin)
    t_fault = time.monotonic()
    if fault == "kill":
        system.kill(victim)
    else:
        threading.Thread(target=system.stop, args=(victim,), daemon=True).start()
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
    # Bring the broker back and wait until it is in sync again, for the next round.
    system.restart(victim)
    if not wait_isr_full(admin, 3):
        print(f"# {system.label}: broker {victim} not back in partition 0's ISR after 60 s", file=sys.stderr)
    return first, max_gap


def start_system(name: str, directory: Path, session_timeout_s: float) -> sysmod.System:
    system = sysmod.start(name, directory, 3, session_timeout_s)
    try:
        admin = AdminClient({"bootstrap.servers": system.bootstrap_servers, "log_level": 0})
        topic = NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})
        admin.create_topics([topic], operation_timeout=30)[TOPIC].result()
        wait_isr_full(admin, 3)
    except BaseException:
        system.down()
        raise
    return system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--session-timeout", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--against",
        default="sluice",
        help="systems to run, comma-separated: sluice, kafka (Apache Kafka from scripts/peers.sh)",
    )
    args = ap.parse_args()
    try:
        wanted = versus.parse_against(args.against)
    except ValueError as exc:
        ap.error(str(exc))
    names, skipped = sysmod.usable(wanted)
    if skipped:
        print(skipped, flush=True)
    if not names:
        sys.exit(1)
    directory = Path(tempfile.mkdtemp(prefix="sluice-failover-"))
    running: dict[str, sysmod.System] = {}
    print(f"command: {' '.join(sys.argv)}")
    print(f"cluster: 3 brokers, RF=3, min.insync.replicas=2, zk session timeout {args.session_timeout:g} s")
    if "kafka" in names:
        print(f"Apache Kafka settings: {sysmod.kafka_settings(args.session_timeout)}")
    #: fault -> system -> [(first_ack_s, max_gap_s)] per round
    results: dict[str, dict[str, list[tuple[float, float]]]] = {f: {n: [] for n in names} for f in FAULTS}
    try:
        for name in names:
            running[name] = start_system(name, directory / name, args.session_timeout)
        for fault in FAULTS:
            # Each round runs on every system, the first one alternating from round to round.
            for order in versus.round_orders(names, args.rounds):
                for name in order:
                    first, gap = run_round(running[name], fault)
                    results[fault][name].append((first, gap))
                    print(
                        f"# {time.strftime('%H:%M:%S')} {fault} {name}: first_ack_s={first:.2f} "
                        f"max_gap_s={gap:.2f}",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for system in running.values():
            system.down()
        shutil.rmtree(directory, ignore_errors=True)
    for fault, label in FAULTS.items():
        for name in names:
            rounds = results[fault][name]
            firsts = [r[0] for r in rounds]
            gaps = [r[1] for r in rounds]
            who = f"{label} ({running[name].label})" if len(names) > 1 else label
            print(
                f"{who:50s} first_ack_s median={statistics.median(firsts):.2f} max={max(firsts):.2f}   "
                f"max_gap_s median={statistics.median(gaps):.2f} max={max(gaps):.2f}   "
                f"rounds={[f'{f:.2f}/{g:.2f}' for f, g in rounds]}"
            )
    if len(names) == 2:
        figures = []
        for fault in FAULTS:
            prefix = FIGURE_PREFIX[fault]
            for i, figure in enumerate(("first_ack_s", "max_gap_s")):
                per = {n: versus.median(r[i] for r in results[fault][n]) for n in names}
                figures.append((f"{prefix}_{figure}", per["sluice"], per["kafka"]))
        versus.print_figures(figures, digits=2)


if __name__ == "__main__":
    main()

"""End-to-end latency at a fixed rate: producer -> broker(s) -> group consumer.

A confluent-kafka producer (acks=all, idempotent, ``--linger-ms``) writes ``--record-size``-byte
records at a fixed rate for ``--warmup-seconds`` then ``--seconds``; each record carries the
wall-clock time it was handed to ``produce()`` and whether it belongs to the warm-up. A group
consumer (confluent-kafka, its own new group, subscribed and assigned before the first record is
sent, librdkafka's fetch defaults: fetch.wait.max.ms=500, fetch.min.bytes=1) reads them in
another thread of the same process; a record's latency is the time it came out of
``consume()`` minus the time in it (one clock). The warm-up's records are not counted.

For each rate of ``--rates`` it prints p50, p99 and max latency, records received of those sent,
and the rate reached. Every rate runs on a fresh topic (``--partitions``, replication factor
``--replication-factor``) of a local cluster of ``--brokers`` brokers that the benchmark starts
and stops.

``--against sluice,kafka`` starts a local Apache Kafka 3.9.1 cluster of the same brokers too
(``sluice.peers.kafka``; skipped, saying why, when ``scripts/peers.sh`` has not fetched its
jars) and runs each rate on one then the other, the first alternating from round to round
(``--rounds``, 2 by default then); each figure is the median of the rounds, printed as
``e2e_p50_ms@1000 sluice=X kafka=Y`` then ``e2e_p50_ms@1000 ratio sluice/kafka=R`` (below 1:
Sluice faster). ``@1000`` is the rate in records/s.

Usage: .venv/bin/python bench/latency.py [--against sluice,kafka] [--rates 1000,5000]
           [--seconds 10] [--brokers 3] [--replication-factor 3] [--json]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

import systems as sysmod
import versus

#: value header: wall-clock send time (float seconds), 1 if measured / 0 if warm-up
HEADER = struct.Struct(">dB")


@dataclass
class LatencyRun:
    system: str
    rate: int
    round: int
    sent: int = 0
    received: int = 0
    errors: int = 0
    seconds: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")

    @property
    def rate_reached(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of a sorted list; NaN when empty."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def create_topic(bootstrap: str, topic: str, partitions: int, rf: int, timeout_s: float = 30.0) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, partitions, rf)], operation_timeout=timeout_s)[topic].result(
        timeout=timeout_s
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        ready = t is not None and t.error is None and len(t.partitions) == partitions
        if ready and all(p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {topic} has no leader for every partition after {timeout_s:.0f} s")


def measure(args: argparse.Namespace, system: sysmod.System, rate: int, rnd: int) -> LatencyRun:
    run = LatencyRun(system.name, rate, rnd)
    bootstrap = system.bootstrap_servers
    topic = f"latency-{rate}-{rnd}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, args.partitions, args.replication_factor)
    latencies: list[float] = []
    stop = threading.Event()
    assigned = threading.Event()
    consumer = sysmod.group_consumer(bootstrap, "latency")

    def on_assign(c: Consumer, partitions: list[object]) -> None:
        if partitions:
            assigned.set()

    consumer.subscribe([topic], on_assign=on_assign)

    def consume() -> None:
        while not stop.is_set():
            for msg in consumer.consume(num_messages=1000, timeout=0.05):
                now = time.time()
                if msg.error() is not None:
                    continue
                value = msg.value()
                if value is None or len(value) < HEADER.size:
                    continue
                sent_at, measured = HEADER.unpack_from(value)
                if measured:
                    latencies.append(now - sent_at)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not assigned.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not assigned.is_set():
            raise TimeoutError(f"the consumer of {topic} got no partition within 60 s")
        failures: list[KafkaError] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(err)

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": args.linger_ms,
                "log_level": 0,
                "on_delivery": on_delivery,
            }
        )
        padding = b"\0" * max(0, args.record_size - HEADER.size)
        for measured, seconds in ((0, args.warmup_seconds), (1, args.seconds)):
            total = int(rate * seconds)
            start = time.monotonic()
            for i in range(total):
                due = start + i / rate
                ahead = due - time.monotonic()
                if ahead > 0.0005:
                    producer.poll(ahead)  # serve delivery reports while waiting for the schedule
                producer.produce(topic, HEADER.pack(time.time(), measured) + padding)
                if i & 63 == 0:
                    producer.poll(0)
            if measured:
                run.sent = total
                run.seconds = time.monotonic() - start
        producer.flush(60)
        run.errors = len(failures)
        deadline = time.monotonic() + 30
        while len(latencies) < run.sent - run.errors and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
        consumer.close()
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).delete_topics([topic])
    run.received = len(latencies)
    ordered = sorted(latencies)
    run.p50_ms = percentile(ordered, 50) * 1e3
    run.p99_ms = percentile(ordered, 99) * 1e3
    run.max_ms = ordered[-1] * 1e3 if ordered else float("nan")
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="sluice", help="comma-separated: sluice, kafka")
    ap.add_argument("--rates", default="1000,5000", help="records/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds at each rate")
    ap.add_argument("--warmup-seconds", type=float, default=3.0, help="unmeasured seconds before them")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--record-size", type=int, default=100, help="bytes per record value")
    ap.add_argument("--linger-ms", type=float, default=1.0, help="producer linger.ms")
    ap.add_argument("--rounds", type=int, help="default: 2 with --against kafka, else 1")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args(argv)
    versus.parse_systems(ap, args)
    try:
        args.rate_list = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if not args.rate_list or min(args.rate_list) <= 0:
        ap.error("--rates takes positive records/s, e.g. 1000,5000")
    if args.replication_factor > args.brokers:
        ap.error("--replication-factor cannot exceed --brokers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names, skipped = sysmod.usable(args.systems)
    if skipped:
        print(skipped, flush=True)
    if not names:
        return 1
    print(f"command: {' '.join(sys.argv)}", flush=True)
    print(
        f"cluster: {args.brokers} broker(s), RF={args.replication_factor}, {args.partitions} partitions, "
        f"acks=all idempotent, linger.ms={args.linger_ms:g}, {args.record_size} B records, "
        f"warm-up {args.warmup_seconds:g} s + {args.seconds:g} s measured per rate, rounds={args.rounds}",
        flush=True,
    )
    if "kafka" in names:
        print(f"Apache Kafka settings: {sysmod.kafka_settings()}", flush=True)
    runs: list[LatencyRun] = []

    def start_one(name: str, directory: Path) -> sysmod.System:
        return sysmod.start(name, directory, args.brokers)

    with sysmod.clusters(names, "sluice-latency-", start_one) as running:
        for rnd, order in enumerate(versus.round_orders(names, args.rounds)):
            for rate in args.rate_list:
                for name in order:
                    r = measure(args, running[name], rate, rnd)
                    runs.append(r)
                    print(
                        f"round={rnd + 1} system={name} rate={rate} sent={r.sent} received={r.received} "
                        f"errors={r.errors} rate_reached={r.rate_reached:.0f} p50_ms={r.p50_ms:.2f} "
                        f"p99_ms={r.p99_ms:.2f} max_ms={r.max_ms:.2f}",
                        flush=True,
                    )
    figures: list[tuple[str, float, float]] = []
    for rate in args.rate_list:
        for figure in ("p50_ms", "p99_ms"):
            per = {
                n: versus.median(getattr(r, figure) for r in runs if r.system == n and r.rate == rate)
                for n in names
            }
            versus.add_figure(figures, f"e2e_{figure}@{rate}", per, names)
    versus.print_figures(figures, digits=2)
    if args.json:
        print(
            json.dumps(
                versus.finite(
                    {
                        "argv": sys.argv[1:],
                        "runs": [asdict(r) for r in runs],
                        "sluice_over_kafka": versus.ratios_json(figures),
                    }
                ),
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

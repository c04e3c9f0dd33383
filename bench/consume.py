"""Consumer throughput: a group consumer reading a pre-filled topic from the beginning.

The benchmark fills a topic (``--partitions``, replication factor ``--replication-factor``) with
``--records`` incompressible records of ``--record-size`` bytes (a confluent-kafka producer,
acks=all, idempotent, 1 MB batches), then reads it whole with confluent-kafka group consumers,
each in a new group (``auto.offset.reset=earliest``, librdkafka's fetch defaults but for the
backoff below), and prints:

- consume_mb_s, consume_records_s: payload over the time from the first record received to the
  last (the group join is not in it);
- consume_join_s: from ``subscribe()`` to the first record (group join, assignment, first fetch;
  with Kafka in the run both wait 0 ms before a new group's first rebalance, Sluice's default
  being 500 ms and Kafka's peers started with 0).

The first read (``--warmup``, on by default with ``--against kafka``) is not measured: it warms
the JIT, connections and page cache for the reads that follow. Each read is bounded by
``--timeout``.

``--against sluice,kafka`` starts a local Apache Kafka 3.9.1 cluster of the same brokers too
(``sluice.peers.kafka``; skipped, saying why, when ``scripts/peers.sh`` has not fetched its
jars), fills a topic on each, and reads them in ``--rounds`` rounds (2 by default then), the
first system alternating from round to round; each figure is the median of the rounds, printed
as ``consume_mb_s sluice=X kafka=Y`` then ``consume_mb_s ratio sluice/kafka=R``.

``--security sasl_ssl`` makes Sluice's cluster SASL_SSL (``cluster up --security sasl_ssl``; the
benchmark's clients are its admin user); ``--security both`` runs a plaintext and a SASL_SSL
Sluice cluster in the same rounds and prints ``consume_mb_s ratio sasl_ssl/plaintext=R``. Kafka's
peer is plaintext and is compared with the plaintext Sluice cluster.

Usage: .venv/bin/python bench/consume.py [--against sluice,kafka] [--records 500000]
           [--brokers 3] [--replication-factor 3] [--security none|sasl_ssl|both]
           [--producer-mb-s X] [--profile DIR] [--json]
``--producer-mb-s X`` runs a producer writing X MB/s (acks=all) to a second topic of the same
partitions and replication factor during each read: the brokers' followers fetch while the
consumer does (they share the read path). ``--profile DIR`` samples each Sluice broker with
py-spy during the first measured read and prints each one's top frames (bench/pyspy.py).
The consumers' ``fetch.queue.backoff.ms`` is 10 ms (``--fetch-queue-backoff-ms``). With
librdkafka's default (1000 ms) a consumer whose local queue reached ``queued.max.messages.kbytes``
(64 MB) fetches nothing for a second: a broker that fills it faster than the application drains
it then waits out the backoff, and the read is bound by the client (about 64 MB per 1.1 s on this
machine, 75 MB/s whatever the broker; ``--fetch-queue-backoff-ms 1000`` shows it).
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

import pyspy
import systems as sysmod
import versus

MB = 1_000_000
TOPIC = "consume-bench"
#: what ``--producer-mb-s`` writes to during the reads
LOAD_TOPIC = "consume-bench-load"
#: Sluice's brokers wait 500 ms (``group.initial.rebalance.delay.ms``) before a new group's first
#: rebalance; Kafka's peers are started with 0 (``sluice.peers.kafka``): with Kafka in the run
#: Sluice gets 0 too, so that the join time compares like with like.
MATCH_KAFKA = {"group.initial.rebalance.delay.ms": "0"}


@dataclass
class ReadRun:
    system: str
    round: int
    records: int = 0
    payload_bytes: int = 0
    join_s: float = float("nan")
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else float("nan")

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else float("nan")


def fill(args: argparse.Namespace, system: sysmod.System) -> float:
    """Create the topic and write ``--records`` records into it; seconds it took."""
    bootstrap = system.bootstrap_servers
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **system.client_config()})
    admin.create_topics([NewTopic(TOPIC, args.partitions, args.replication_factor)], operation_timeout=30)[
        TOPIC
    ].result(timeout=30)
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    producer = Producer(
        {
            **system.client_config(),
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "log_level": 0,
            "on_delivery": on_delivery,
        }
    )
    rng = random.Random(99)
    values = [rng.randbytes(args.record_size) for _ in range(256)]
    started = time.monotonic()
    for i in range(args.records):
        while True:
            try:
                producer.produce(TOPIC, values[i % len(values)])
                break
            except BufferError:
                producer.poll(0.005)
        if i & 1023 == 0:
            producer.poll(0)
    left = producer.flush(120)
    if left or failures:
        raise RuntimeError(
            f"filling {TOPIC} on {system.label}: {left} records unacknowledged, "
            f"{len(failures)} failed (first: {failures[:1]})"
        )
    return time.monotonic() - started


class BackgroundProducer:
    """While a read runs: a producer writing ``mb_s`` MB/s (acks=all) to its own topic of the
    same partitions and replication factor, so that the brokers' followers fetch while the
    consumer does (``--producer-mb-s``)."""

    def __init__(self, args: argparse.Namespace, system: sysmod.System) -> None:
        self.mb_s = args.producer_mb_s
        self.record_size = args.record_size
        self.system = system
        self.stop = threading.Event()
        self.sent_bytes = 0
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BackgroundProducer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def _run(self) -> None:
        producer = Producer(
            {
                **self.system.client_config(),
                "bootstrap.servers": self.system.bootstrap_servers,
                "acks": "all",
                "linger.ms": 5,
                "log_level": 0,
            }
        )
        value = random.Random(7).randbytes(self.record_size)
        per_tick = max(1, int(self.mb_s * MB / self.record_size / 100))  # every 10 ms
        started = time.monotonic()
        tick = started
        while not self.stop.is_set():
            for _ in range(per_tick):
                try:
                    producer.produce(LOAD_TOPIC, value)
                    self.sent_bytes += len(value)
                except BufferError:
                    break
            producer.poll(0)
            tick += 0.01
            self.stop.wait(max(0.0, tick - time.monotonic()))
        self.seconds = time.monotonic() - started
        producer.flush(30)

    @property
    def achieved_mb_s(self) -> float:
        return self.sent_bytes / MB / self.seconds if self.seconds > 0 else 0.0


def create_load_topic(args: argparse.Namespace, system: sysmod.System) -> None:
    admin = AdminClient(
        {"bootstrap.servers": system.bootstrap_servers, "log_level": 0, **system.client_config()}
    )
    new = NewTopic(LOAD_TOPIC, args.partitions, args.replication_factor)
    admin.create_topics([new], operation_timeout=30)[LOAD_TOPIC].result(timeout=30)


def read_all(args: argparse.Namespace, system: sysmod.System, rnd: int) -> ReadRun:
    """One new group reads the whole topic."""
    run = ReadRun(system.name, rnd)
    config = dict(system.client_config())
    config["fetch.queue.backoff.ms"] = str(args.fetch_queue_backoff_ms)
    consumer = sysmod.group_consumer(system.bootstrap_servers, "consume-bench", config)
    try:
        subscribed = time.monotonic()
        consumer.subscribe([TOPIC])
        deadline = subscribed + args.timeout
        first = last = 0.0
        while run.records < args.records and time.monotonic() < deadline:
            batch = consumer.consume(num_messages=1000, timeout=0.5)
            if not batch:
                continue
            if not first:
                first = time.monotonic()
                run.join_s = first - subscribed
            for msg in batch:
                if msg.error() is not None:
                    continue
                value = msg.value()
                run.records += 1
                run.payload_bytes += len(value) if value is not None else 0
            last = time.monotonic()
        # throughput from the first batch received to the last: the group join is not in it
        run.seconds = last - first if first else 0.0
    finally:
        consumer.close()
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="sluice", help="comma-separated: sluice, kafka")
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--replication-factor", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--rounds", type=int, help="measured reads per system (default: 2 with kafka, else 1)")
    ap.add_argument(
        "--warmup",
        choices=("auto", "on", "off"),
        default="auto",
        help="an unmeasured read first (auto: on with --against kafka)",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="bound on each read (s)")
    ap.add_argument(
        "--security",
        choices=("none", "sasl_ssl", "both"),
        default="none",
        help="Sluice's cluster (cluster up --security); both: a plaintext and a SASL_SSL cluster",
    )
    ap.add_argument(
        "--producer-mb-s",
        type=float,
        default=0.0,
        help="a producer writing this many MB/s (acks=all) to another topic during each read",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy each Sluice broker in the first measured read: raw profiles in DIR, top frames printed",
    )
    ap.add_argument(
        "--fetch-queue-backoff-ms",
        type=int,
        default=10,
        metavar="MS",
        help="the consumer's fetch.queue.backoff.ms (default 10; librdkafka's own default, 1000, makes "
        "a consumer whose local queue is full fetch nothing for a second: the client's bound)",
    )
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args(argv)
    versus.parse_systems(ap, args)
    if args.replication_factor > args.brokers:
        ap.error("--replication-factor cannot exceed --brokers")
    if args.warmup == "auto":
        args.warmup = "on" if "kafka" in args.systems else "off"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names, skipped = sysmod.usable(args.systems)
    if "sluice" in names and args.security != "none":
        at = names.index("sluice")
        sides = ["sluice", "sluice_sasl_ssl"] if args.security == "both" else ["sluice_sasl_ssl"]
        names[at : at + 1] = sides
    if skipped:
        print(skipped, flush=True)
    if not names:
        return 1
    print(f"command: {' '.join(sys.argv)}", flush=True)
    print(
        f"cluster: {args.brokers} broker(s), RF={args.replication_factor}, {args.partitions} partitions, "
        f"{args.records:,} records of {args.record_size} B, warm-up read {args.warmup}, "
        f"rounds={args.rounds}, consumers' fetch.queue.backoff.ms={args.fetch_queue_backoff_ms}",
        flush=True,
    )
    settings = MATCH_KAFKA if "kafka" in names else None
    if settings:
        print(f"Apache Kafka settings: {sysmod.kafka_settings()}", flush=True)
        print(
            "Sluice settings: group.initial.rebalance.delay.ms=0 (as Kafka's peers; 500 by default)",
            flush=True,
        )
    runs: list[ReadRun] = []

    def start_one(name: str, directory: Path) -> sysmod.System:
        system = sysmod.start(name, directory, args.brokers, sluice_settings=settings)
        took = fill(args, system)
        print(f"filled {TOPIC} on {system.label} in {took:.1f} s", flush=True)
        if args.producer_mb_s > 0:
            create_load_topic(args, system)
        if args.warmup == "on":
            w = read_all(args, system, -1)
            print(f"warm-up read ({system.label}): {w.records:,} records, {w.mb_per_s:.1f} MB/s", flush=True)
        return system

    with sysmod.clusters(names, "sluice-consume-", start_one) as running:
        for rnd, order in enumerate(versus.round_orders(names, args.rounds)):
            for name in order:
                profiler = None
                if args.profile is not None and rnd == 0 and name.startswith("sluice"):
                    pids = {f"broker-{b.broker_id}": b.pid for b in running[name].brokers()}
                    profiler = pyspy.Profiler(args.profile / name, pids)
                if args.producer_mb_s > 0:
                    with BackgroundProducer(args, running[name]) as load:
                        r = read_all(args, running[name], rnd)
                    print(f"round={rnd + 1} system={name} producer_mb_s={load.achieved_mb_s:.1f}", flush=True)
                else:
                    r = read_all(args, running[name], rnd)
                if profiler is not None:
                    pyspy.print_profiles(f"system={name} read", profiler.stop())
                runs.append(r)
                print(
                    f"round={rnd + 1} system={name} records={r.records} seconds={r.seconds:.2f} "
                    f"mb_s={r.mb_per_s:.1f} records_s={r.records_per_s:.0f} join_s={r.join_s:.2f}",
                    flush=True,
                )
    reads = {
        "consume_mb_s": lambda r: r.mb_per_s,
        "consume_records_s": lambda r: r.records_per_s,
        "consume_join_s": lambda r: r.join_s,
    }
    figures: list[tuple[str, float, float]] = []
    compared = [n for n in names if n in versus.SYSTEMS]  # Kafka is compared with plaintext Sluice
    for figure, read in reads.items():
        per = {n: versus.median(read(r) for r in runs if r.system == n) for n in names}
        if compared:
            versus.add_figure(figures, figure, per, compared)
        if "sluice_sasl_ssl" in per:
            secure = per["sluice_sasl_ssl"]
            print(f"{figure} sluice_sasl_ssl={secure:.2f}", flush=True)
            if "sluice" in per:
                print(
                    f"{figure} ratio sasl_ssl/plaintext={versus.ratio(secure, per['sluice']):.2f}", flush=True
                )
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

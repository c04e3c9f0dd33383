"""Produce throughput benchmark for Sluice.

What it measures
----------------
* ``client`` mode: what an ordinary Kafka application gets. A confluent-kafka (librdkafka)
  ``Producer`` writes ``--records`` records of ``--record-size`` bytes (incompressible values
  drawn from a pre-generated pool, no keys) as fast as it can, with batching on
  (``--linger-ms``, ``--batch-size``, no compression) and ``enable.idempotence=true`` when
  ``--acks all``. Reports records, MB/s and records/s (payload bytes over the wall time from
  the first ``produce()`` to the last acknowledgement) and the p50/p99/max acknowledgement
  latency (``produce()`` to delivery callback) of every 16th record.
* ``prebuilt`` mode: the broker's ceiling with the client taken (almost) out of the picture.
  About 64 uncompressed ~1 MB record batches (1 KB records, no producer id) are built ONCE;
  then ONE connection (``sluice.sync.wire_client.WireClient``) sends Produce requests, each
  carrying one batch for one partition (round robin), keeping ``--window`` requests in
  flight, for ``--seconds`` or ``--max-bytes``. Every response must carry error code 0.
  Reports MB/s, requests/s and p50/p99/max request latency. With ``--acks 0`` there are no
  responses: the run ends with a Metadata request on the same connection, which the broker
  answers only after it has handled every Produce before it, and nothing is verified.

For each mode the table also shows the average CPU cores busy (this process including the
librdkafka threads, the broker processes, the whole machine), which says who the bottleneck
was; and before each mode a plain ``pwrite`` probe (``--probe-mb``) measures how fast this
machine takes writes into the page cache at that moment, the ceiling of the broker's log
appends (on a VM it varies several-fold with whether page-cache pages are recycled or
first-touch guest memory).

Unless ``--bootstrap`` names an existing cluster, the benchmark starts its own local cluster
(ZooKeeper + ``--brokers`` brokers) in a temporary directory and always stops and removes it
at the end. ``--security sasl_ssl`` makes that cluster SASL_SSL (``cluster up --security
sasl_ssl``: TLS, SCRAM-SHA-512 as its admin user, ACLs on) and every client of the benchmark
uses its client properties; ``--security both`` starts a plaintext and a SASL_SSL cluster side
by side, runs each mode on one then the other, and prints the SASL_SSL/plaintext MB/s ratio.
With ``--bootstrap``, ``--client-properties`` gives the existing cluster's client properties.
Each mode writes to its own fresh topic (``--partitions``, ``--replication-factor``),
deleted after the mode unless ``--keep-topics``.
``--against sluice,kafka`` also starts a local Apache Kafka 3.9.1 cluster of the same brokers
(``sluice.peers.kafka``; skipped, saying why, when ``scripts/peers.sh`` has not fetched its jars)
of the same security: ``--security sasl_ssl`` a SASL_SSL Kafka (``peer up kafka --security
sasl_ssl``: TLS, SCRAM-SHA-512, ACLs), ``--security both`` a plaintext and a SASL_SSL Kafka beside
Sluice's two. Then the plaintext clusters are the ones compared figure by figure, and each
system's SASL_SSL/plaintext ratio prints for both, ``sasl_ssl_over_plaintext_<mode> sluice=X
kafka=Y`` then its ratio (how much less of its plaintext throughput TLS and SCRAM cost Sluice
than Kafka), all in the same rounds.
To be fair to a JVM, each system first runs every mode briefly on a topic of its own
(``--warmup``: JIT, connections, page cache; figures thrown away); then ``--rounds`` rounds (2 by
default) run every mode on each system, the first system alternating from round to round. Each
compared figure prints as ``client_mb_s sluice=X kafka=Y`` then ``client_mb_s ratio
sluice/kafka=R``, X and Y the medians of the rounds.
The benchmark prints figures and asserts nothing about them.

How to run
----------
    cd /work/main
    .venv/bin/python bench/produce.py                                 # 1 broker, both modes
    .venv/bin/python bench/produce.py --mode client --partitions 6 --linger-ms 20
    .venv/bin/python bench/produce.py --brokers 3 --replication-factor 3 --acks all
    .venv/bin/python bench/produce.py --bootstrap 127.0.0.1:9092 --mode prebuilt --json
    .venv/bin/python bench/produce.py --security both                 # plaintext vs SASL_SSL
    .venv/bin/python bench/produce.py --against sluice,kafka --brokers 3 --replication-factor 3 \
        --acks all --rounds 3                                         # beside Apache Kafka
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from rich.console import Console
from rich.table import Table

import systems as sysmod
import versus
from sluice.ops.launcher import LocalCluster, cluster_down, cluster_up
from sluice.peers.kafka import PeerCluster, PeerError, peer_down, peer_up
from sluice.protocol.api import ApiKey
from sluice.protocol.records import COMPRESSION_NONE, build_batch
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.sync.wire_client import WireClient

MB = 1_000_000  # throughput figures are in decimal megabytes (10^6 bytes) per second
ACKS = {"all": -1, "1": 1, "0": 0}
#: Produce request version used in prebuilt mode (the highest Sluice speaks).
PRODUCE_VERSION = 9
#: Ack latency is recorded for every SAMPLE_EVERY-th record (client mode).
SAMPLE_EVERY = 16
#: Distinct record values; a pool keeps value generation out of the timed loop.
VALUE_POOL = 512


# --- results -----------------------------------------------------------------------------------


@dataclass
class LatencyStats:
    samples: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    max_ms: float = float("nan")

    @classmethod
    def of(cls, seconds: list[float]) -> LatencyStats:
        if not seconds:
            return cls()
        s = sorted(seconds)
        return cls(len(s), _pct(s, 50) * 1e3, _pct(s, 99) * 1e3, s[-1] * 1e3)


def _pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty list."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass
class ModeResult:
    mode: str
    topic: str
    #: "none" (PLAINTEXT) or "sasl_ssl"
    security: str = "none"
    records: int = 0
    payload_bytes: int = 0
    seconds: float = 0.0
    errors: int = 0
    requests: int = 0  # prebuilt mode only
    latency: LatencyStats = field(default_factory=LatencyStats)
    cpu: dict[str, float] = field(default_factory=dict)
    page_cache_probe_mb_per_s: float = float("nan")
    notes: list[str] = field(default_factory=list)
    #: which round of ``--rounds`` (0 for the first)
    round: int = 0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            mb_per_s=round(self.mb_per_s, 2),
            records_per_s=round(self.records_per_s, 1),
            requests_per_s=round(self.requests_per_s, 1),
        )
        return d


class CpuMeter:
    """CPU seconds (user+system) used by this process, by given pids and by the whole machine."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._hz = os.sysconf("SC_CLK_TCK")
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float]:
        t = os.times()
        me = t.user + t.system
        others = 0.0
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                others += (int(fields[11]) + int(fields[12])) / self._hz  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
        with open("/proc/stat") as f:
            cpu = [int(x) for x in f.readline().split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) / self._hz  # all but idle and iowait
        return me, others, busy, time.monotonic()

    def stop(self) -> dict[str, float]:
        """Average cores in use since the start: bench process, brokers, whole machine."""
        end = self._sample()
        wall = max(1e-9, end[3] - self._start[3])
        return {
            "bench_cores": round((end[0] - self._start[0]) / wall, 2),
            "broker_cores": round((end[1] - self._start[1]) / wall, 2) if self.pids else float("nan"),
            "machine_cores": round((end[2] - self._start[2]) / wall, 2),
        }


# --- setup ---------------------------------------------------------------------------------------


def value_pool(record_size: int, n: int = VALUE_POOL) -> list[bytes]:
    """``n`` distinct incompressible values of ``record_size`` bytes."""
    rng = random.Random(1234)
    return [rng.randbytes(record_size) for _ in range(n)]


def admin_client(bootstrap: str, security: ClientSecurity) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **security.confluent_config()})


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    replication_factor: int,
    timeout_s: float = 30.0,
    security: ClientSecurity = PLAINTEXT,
) -> None:
    """Create ``name`` and wait until every partition has a leader in the metadata."""
    admin = admin_client(bootstrap, security)
    new = NewTopic(name, partitions, replication_factor)
    futures = admin.create_topics([new], operation_timeout=timeout_s)
    futures[name].result(timeout=timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=name, timeout=5)
        t = md.topics.get(name)
        if (
            t is not None
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 and p.error is None for p in t.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise TimeoutError(f"topic {name} has no leader for every partition after {timeout_s:.0f} s")


def page_cache_probe(directory: Path, megabytes: int) -> float:
    """MB/s of 1 MB ``pwrite`` calls into a new file: the ceiling of the broker's own log writes.

    On a VM whose guest memory is handed back to the host while idle, writing into page-cache
    pages touched for the first time is several times slower than into recycled ones; this
    figure tells the two situations apart.
    """
    if megabytes <= 0:
        return float("nan")
    chunk = random.Random(7).randbytes(MB)
    path = directory / f"probe-{uuid.uuid4().hex[:8]}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        start = time.perf_counter()
        for i in range(megabytes):
            os.pwrite(fd, chunk, i * MB)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return megabytes / elapsed


def delete_topic(
    bootstrap: str, name: str, timeout_s: float = 30.0, security: ClientSecurity = PLAINTEXT
) -> str | None:
    """Delete ``name`` (frees its disk and page cache); returns an error text instead of raising."""
    admin = admin_client(bootstrap, security)
    try:
        admin.delete_topics([name], operation_timeout=timeout_s)[name].result(timeout=timeout_s)
    except KafkaException as exc:
        return str(exc)
    return None


def partition_leaders(bootstrap: str, topic: str, security: ClientSecurity = PLAINTEXT) -> dict[int, str]:
    """partition -> "host:port" of its leader."""
    admin = admin_client(bootstrap, security)
    md = admin.list_topics(topic=topic, timeout=10)
    brokers = {b.id: f"{b.host}:{b.port}" for b in md.brokers.values()}
    return {p.id: brokers[p.leader] for p in md.topics[topic].partitions.values()}


# --- client mode ---------------------------------------------------------------------------------


def run_client(
    args: argparse.Namespace, bootstrap: str, topic: str, security: ClientSecurity = PLAINTEXT
) -> ModeResult:
    """confluent-kafka Producer in a tight loop; ack latency from the delivery callbacks."""
    res = ModeResult("client", topic)
    values = value_pool(args.record_size)
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": args.acks,
        "enable.idempotence": args.acks == "all",
        "linger.ms": args.linger_ms,
        "batch.size": args.batch_size,
        "batch.num.messages": 1_000_000,
        "compression.type": "none",
        "queue.buffering.max.messages": args.queue_messages,
        "queue.buffering.max.kbytes": args.queue_kbytes,
        "message.max.bytes": max(1_000_000, args.batch_size + 1000),
        "max.in.flight.requests.per.connection": 5,
        "socket.send.buffer.bytes": 4 * 1024 * 1024,
        "statistics.interval.ms": 0,
        **security.confluent_config(),
    }
    conf.update(dict(kv.split("=", 1) for kv in args.producer_config))
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    conf["on_delivery"] = on_delivery
    producer = Producer(conf)
    # Warm up: metadata and producer id, so connection setup is not timed.
    producer.produce(topic, values[0], partition=0)
    if producer.flush(30) != 0 or failures:
        raise RuntimeError(f"warm-up produce failed: {failures[:3]}")

    latencies: list[float] = []
    perf = time.perf_counter

    def on_sampled(t0: float, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)
        else:
            latencies.append(perf() - t0)

    n, npool = args.records, len(values)
    produce, poll = producer.produce, producer.poll
    max_s = args.client_max_seconds
    produced = 0
    start = perf()
    give_up = start + max_s if max_s > 0 else float("inf")
    for i in range(n):
        value = values[i % npool]
        cb = functools.partial(on_sampled, perf()) if i % SAMPLE_EVERY == 0 else None
        while True:
            try:
                if cb is None:
                    produce(topic, value)
                else:
                    produce(topic, value, on_delivery=cb)
                break
            except BufferError:
                poll(0.001)  # local queue full: serve delivery callbacks, then retry
        produced += 1
        if i & 1023 == 1023:
            poll(0)
            if perf() > give_up:
                res.notes.append(f"stopped after {max_s:.0f} s (--client-max-seconds) at {produced} records")
                break
    remaining = producer.flush(120)
    end = perf()
    res.records = produced - len(failures) - remaining
    res.payload_bytes = res.records * args.record_size
    res.seconds = end - start
    res.errors = len(failures) + remaining
    if failures:
        res.notes.append(f"first delivery errors: {sorted({str(e) for e in failures[:100]})[:3]}")
    res.latency = LatencyStats.of(latencies)
    return res


# --- prebuilt mode -------------------------------------------------------------------------------


def build_batches(record_size: int, batch_bytes: int, count: int) -> list[tuple[bytes, int]]:
    """``count`` uncompressed batches of about ``batch_bytes`` each: (batch, records in it)."""
    values = value_pool(record_size)
    per_batch = max(1, batch_bytes // (record_size + 12))  # ~12 bytes of per-record framing
    out = []
    for b in range(count):
        recs = [(None, values[(b * per_batch + j) % len(values)]) for j in range(per_batch)]
        out.append((build_batch(recs, compression=COMPRESSION_NONE), per_batch))
    return out


def run_prebuilt(
    args: argparse.Namespace, bootstrap: str, topic: str, security: ClientSecurity = PLAINTEXT
) -> ModeResult:
    """One WireClient connection, pre-built ~1 MB batches, ``--window`` requests in flight."""
    res = ModeResult("prebuilt", topic)
    leaders = partition_leaders(bootstrap, topic, security)
    # One connection: partitions led by the broker that leads partition 0 (all of them with
    # one broker; with several brokers the others would need connections of their own).
    target = leaders[0]
    parts = sorted(p for p, addr in leaders.items() if addr == target)
    if len(parts) < len(leaders):
        res.notes.append(f"one connection to {target}: using its {len(parts)} of {len(leaders)} partitions")
    batches = build_batches(args.record_size, args.prebuilt_batch_bytes, args.prebuilt_batches)
    res.notes.append(
        f"{len(batches)} batches of {len(batches[0][0]):,} bytes / {batches[0][1]} records, "
        f"window {args.window}, produce v{PRODUCE_VERSION}"
    )
    acks = ACKS[args.acks]
    expect = acks != 0
    host, _, port = target.rpartition(":")
    latencies: list[float] = []
    inflight: deque[tuple[float, int]] = deque()  # (send time, records) per outstanding request
    perf = time.perf_counter

    with WireClient(host, int(port), client_id="sluice-bench", timeout_s=60.0, security=security) as wc:

        def receive_one() -> None:
            t0, nrec = inflight.popleft()
            body = wc.receive()
            latencies.append(perf() - t0)
            for t in body["responses"]:
                for p in t["partition_responses"]:
                    if p["error_code"] != 0:
                        res.errors += 1
                        if len(res.notes) < 5:
                            res.notes.append(
                                f"partition {p['index']}: error {p['error_code']} "
                                f"{p.get('error_message') or ''}".rstrip()
                            )
                    else:
                        res.records += nrec

        # Warm-up request (not timed).
        first = {"index": parts[0], "records": batches[0][0]}
        warm = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 30000,
            "topic_data": [{"name": topic, "partition_data": [first]}],
        }
        body = wc.request(ApiKey.PRODUCE, PRODUCE_VERSION, warm)
        err = body["responses"][0]["partition_responses"][0]["error_code"]
        if err != 0:
            raise RuntimeError(f"warm-up produce failed with error code {err}")

        sent_bytes = 0
        sent_records = 0
        i = 0
        start = perf()
        stop_at = start + args.seconds
        while sent_bytes < args.max_bytes and perf() < stop_at:
            batch, nrec = batches[i % len(batches)]
            req = {
                "transactional_id": None,
                "acks": acks,
                "timeout_ms": 30000,
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": parts[i % len(parts)], "records": batch}]}
                ],
            }
            t0 = perf()
            wc.send(ApiKey.PRODUCE, PRODUCE_VERSION, req, expect_response=expect)
            i += 1
            sent_bytes += nrec * args.record_size
            sent_records += nrec
            if expect:
                inflight.append((t0, nrec))
                if len(inflight) >= args.window:
                    receive_one()
        while inflight:
            receive_one()
        if not expect:
            # acks=0 gets no responses; a request after the last one is answered only after the
            # broker has handled everything before it on this connection.
            wc.request(ApiKey.METADATA, 1, {"topics": [{"name": topic}]})
            res.records = sent_records
            res.notes.append("acks=0: no responses, records counted as sent (not verified)")
        end = perf()
    res.requests = i
    res.payload_bytes = res.records * args.record_size
    res.seconds = end - start
    res.latency = LatencyStats.of(latencies)
    return res


def warm_up(
    console: Console,
    args: argparse.Namespace,
    modes: tuple[str, ...],
    name: str,
    bootstrap: str,
    security: ClientSecurity,
    run_id: str,
) -> None:
    """Each mode briefly, on a topic of its own deleted afterwards, figures thrown away: the
    measured rounds then meet a warm JIT (Kafka's JVM), warm connections and page cache."""
    warm = argparse.Namespace(**vars(args))
    warm.records = min(args.records, args.warmup_records)
    warm.seconds = min(args.seconds, args.warmup_seconds)
    warm.client_max_seconds = max(10.0, 3 * args.warmup_seconds)
    topic = f"bench-warmup-{name}-{run_id}"
    create_topic(bootstrap, topic, args.partitions, args.replication_factor, security=security)
    started = time.monotonic()
    for mode in modes:
        (run_client if mode == "client" else run_prebuilt)(warm, bootstrap, topic, security)
    failed = delete_topic(bootstrap, topic, security=security)
    console.print(
        f"warm-up ({SECURITY_LABELS[name]}): {', '.join(modes)} for {time.monotonic() - started:.1f} s "
        f"(not measured){f'; deleting {topic} failed: {failed}' if failed else ''}"
    )


# --- output --------------------------------------------------------------------------------------


#: how the report names the ``--security`` values
SECURITY_LABELS = {
    "none": "plaintext",
    "sasl_ssl": "SASL_SSL",
    "kafka": "Apache Kafka",
    "kafka_sasl_ssl": "Apache Kafka SASL_SSL",
}
#: Sluice's side (``--security`` value) -> Kafka's side of the same security
KAFKA_SIDES = {"none": "kafka", "sasl_ssl": "kafka_sasl_ssl"}
#: The figures compared with ``--against sluice,kafka``: name -> (mode, how it is read).
PEER_FIGURES: dict[str, tuple[str, Any]] = {
    "client_mb_s": ("client", lambda r: r.mb_per_s),
    "client_records_s": ("client", lambda r: r.records_per_s),
    "client_ack_p50_ms": ("client", lambda r: r.latency.p50_ms),
    "client_ack_p99_ms": ("client", lambda r: r.latency.p99_ms),
    "prebuilt_mb_s": ("prebuilt", lambda r: r.mb_per_s),
    "prebuilt_request_p99_ms": ("prebuilt", lambda r: r.latency.p99_ms),
}


def peer_figures(results: list[ModeResult]) -> list[tuple[str, float, float]]:
    """(figure, Sluice's median over the rounds, Kafka's median) for each figure both were
    measured for."""
    rounds: dict[int, dict[str, dict[str, float]]] = {}
    sides = {r.security for r in results}
    compared = next((s for s in KAFKA_SIDES if {s, KAFKA_SIDES[s]} <= sides), "none")
    for r in results:
        system = {compared: "sluice", KAFKA_SIDES[compared]: "kafka"}.get(r.security)
        if system is None:
            continue  # plaintext is compared with plaintext, SASL_SSL only when alone
        for name, (mode, read) in PEER_FIGURES.items():
            if r.mode == mode:
                rounds.setdefault(r.round, {}).setdefault(name, {})[system] = float(read(r))
    return versus.median_figures(rounds[k] for k in sorted(rounds))


def print_peer_figures(figures: list[tuple[str, float, float]]) -> None:
    """Each figure with both values, then ``<figure> ratio sluice/kafka=R`` (for latencies a
    ratio below 1 means Sluice is faster)."""
    versus.print_figures(figures)


def security_ratios(
    results: list[ModeResult], plain_side: str = "none", secure_side: str = "sasl_ssl"
) -> dict[str, float]:
    """mode -> SASL_SSL MB/s over plaintext MB/s (medians of the rounds), for each mode run both
    ways; Sluice's, or Kafka's with ``plain_side="kafka", secure_side="kafka_sasl_ssl"``."""
    out: dict[str, float] = {}
    for mode in ("client", "prebuilt"):
        plain = versus.median(r.mb_per_s for r in results if (r.mode, r.security) == (mode, plain_side))
        secure = versus.median(r.mb_per_s for r in results if (r.mode, r.security) == (mode, secure_side))
        r = versus.ratio(secure, plain)
        if not math.isnan(r):
            out[mode] = r
    return out


def print_report(
    console: Console,
    args: argparse.Namespace,
    bootstrap: str,
    results: list[ModeResult],
    cluster_note: str,
) -> None:
    console.print(f"[bold]command:[/] {shlex.join([sys.executable, *sys.argv])}")
    settings = Table(title="settings", show_header=False)
    for k, v in [
        ("cluster", cluster_note),
        ("bootstrap.servers", bootstrap),
        ("security", args.security),
        ("acks", args.acks),
        ("partitions", args.partitions),
        ("replication factor", args.replication_factor),
        ("record size", f"{args.record_size} B"),
        ("client: records", f"{args.records:,}"),
        ("client: linger.ms / batch.size", f"{args.linger_ms} / {args.batch_size:,}"),
        ("client: idempotence", str(args.acks == "all")),
        ("client: extra config", " ".join(args.producer_config) or "-"),
        ("prebuilt: window / seconds / max bytes", f"{args.window} / {args.seconds:g} / {args.max_bytes:,}"),
        ("rounds (first system alternating)", args.rounds),
        (
            "warm-up per system before measuring",
            (
                f"{args.warmup_records:,} client records / {args.warmup_seconds:g} s prebuilt"
                if args.warmup == "on"
                else "off"
            ),
        ),
        ("cpus", os.cpu_count()),
        ("page-cache probe before each mode", f"{args.probe_mb} MB" if args.probe_mb > 0 else "skipped"),
    ]:
        settings.add_row(k, str(v))
    console.print(settings)
    table = Table(title="produce throughput (MB = 10^6 bytes of record payload)")
    for col in (
        *(("round",) if args.rounds > 1 else ()),
        "mode",
        "security",
        "records",
        "seconds",
        "MB/s",
        "records/s",
        "requests/s",
        "lat p50 ms",
        "lat p99 ms",
        "lat max ms",
        "errors",
        "cpu bench",
        "cpu brokers",
        "cpu all",
        "probe MB/s",
    ):
        table.add_column(col, justify="left" if col in ("round", "mode", "security") else "right")
    for r in results:
        lat = r.latency
        table.add_row(
            *((str(r.round + 1),) if args.rounds > 1 else ()),
            r.mode,
            SECURITY_LABELS.get(r.security, r.security),
            f"{r.records:,}",
            f"{r.seconds:.2f}",
            f"{r.mb_per_s:.1f}",
            f"{r.records_per_s:,.0f}",
            f"{r.requests_per_s:,.1f}" if r.mode == "prebuilt" else "-",
            f"{lat.p50_ms:.1f}",
            f"{lat.p99_ms:.1f}",
            f"{lat.max_ms:.1f}",
            str(r.errors),
            *(f"{r.cpu.get(k, float('nan')):.2f}" for k in ("bench_cores", "broker_cores", "machine_cores")),
            f"{r.page_cache_probe_mb_per_s:,.0f}",
        )
    console.print(table)
    for system, sides in (("Sluice", ("none", "sasl_ssl")), ("Apache Kafka", ("kafka", "kafka_sasl_ssl"))):
        for mode, ratio in security_ratios(results, *sides).items():
            plain, secure = (
                versus.median(r.mb_per_s for r in results if (r.mode, r.security) == (mode, side))
                for side in sides
            )
            console.print(
                f"  {system} {mode}: SASL_SSL / plaintext = {secure:.1f} / {plain:.1f} MB/s (medians) "
                f"= {ratio:.2f}"
            )
    for r in results:
        for note in r.notes:
            console.print(f"  {r.mode} {SECURITY_LABELS.get(r.security, r.security)}: {note}")
    console.print(
        "  latency: client = produce() to delivery callback (every 16th record); "
        "prebuilt = request sent to response read"
    )
    console.print(
        "  cpu: average CPU cores busy during the mode (bench process incl. librdkafka threads; "
        "broker processes; whole machine incl. anything else running)"
    )
    console.print(
        "  probe: plain 1 MB pwrites into a new file just before the mode, the ceiling of the broker's "
        "log appends (slow when page-cache pages are first-touch guest memory)"
    )


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN float replaced by None, so that the JSON line is strict JSON."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--brokers", type=int, default=1, help="brokers of the local cluster")
    p.add_argument("--replication-factor", type=int, default=1, help="of the benchmark topics")
    p.add_argument("--acks", choices=("all", "1", "0"), default="all", help="all = -1 (idempotent client)")
    p.add_argument(
        "--records",
        type=int,
        default=4_000_000,
        help="client mode: records to produce (4 M x 1 KB takes ~10-15 s here)",
    )
    p.add_argument("--record-size", type=int, default=1024, help="bytes of value per record")
    p.add_argument("--partitions", type=int, default=3, help="of the benchmark topics")
    p.add_argument("--mode", choices=("client", "prebuilt", "both"), default="both", help="what to run")
    p.add_argument("--bootstrap", help="HOST:PORT of an existing cluster (no local cluster is started)")
    p.add_argument(
        "--against",
        default="sluice",
        help="the systems to run, comma-separated: sluice, kafka (Apache Kafka from scripts/peers.sh, "
        "started with the same brokers; each mode runs on one then the other, and each figure is "
        "followed by its ratio sluice/kafka)",
    )
    p.add_argument(
        "--security",
        choices=("none", "sasl_ssl", "both"),
        default="none",
        help="the local cluster's (cluster up --security); both: a plaintext and a SASL_SSL cluster, "
        "each mode run on one then the other",
    )
    p.add_argument(
        "--client-properties",
        type=Path,
        help="with --bootstrap: Kafka client properties of the existing cluster (security.protocol, ...)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="run every mode on every system this many times, the first system alternating from "
        "round to round; compared figures are the medians (default: 2 with --against kafka, else 1)",
    )
    p.add_argument(
        "--warmup",
        choices=("auto", "on", "off"),
        default="auto",
        help="before measuring, run each mode briefly on each system (JIT, page cache, connections) "
        "on a topic of its own; auto: on with --against kafka",
    )
    p.add_argument("--warmup-records", type=int, default=300_000, help="client-mode records of the warm-up")
    p.add_argument("--warmup-seconds", type=float, default=3.0, help="prebuilt-mode seconds of the warm-up")
    p.add_argument("--json", action="store_true", help="also print one JSON line of results")
    p.add_argument(
        "--keep-topics", action="store_true", help="do not delete each mode's topic after the mode"
    )
    p.add_argument(
        "--probe-mb",
        type=int,
        default=512,
        help="MB written with plain pwrite before each mode, as a storage reference (0: skip)",
    )
    g = p.add_argument_group("client mode")
    g.add_argument("--linger-ms", type=float, default=5.0, help="linger.ms")
    g.add_argument("--batch-size", type=int, default=1_000_000, help="batch.size (bytes per partition batch)")
    g.add_argument(
        "--queue-messages",
        type=int,
        default=100_000,
        help="queue.buffering.max.messages (librdkafka's default)",
    )
    g.add_argument(
        "--queue-kbytes",
        type=int,
        default=1_048_576,
        help="queue.buffering.max.kbytes (librdkafka's default)",
    )
    g.add_argument(
        "--client-max-seconds",
        type=float,
        default=30.0,
        help="stop producing after this long (0: never) so a slow run stays bounded",
    )
    g.add_argument(
        "-X",
        dest="producer_config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra librdkafka producer property (repeatable)",
    )
    g = p.add_argument_group("prebuilt mode")
    g.add_argument("--seconds", type=float, default=10.0, help="send for this long")
    g.add_argument("--max-bytes", type=int, default=4_000_000_000, help="... or until this much payload")
    g.add_argument("--window", type=int, default=12, help="requests in flight")
    g.add_argument("--prebuilt-batches", type=int, default=64, help="distinct batches built up front")
    g.add_argument("--prebuilt-batch-bytes", type=int, default=1_000_000, help="payload bytes per batch")
    args = p.parse_args(argv)
    versus.parse_systems(p, args)
    if args.warmup == "auto":
        args.warmup = "on" if "kafka" in args.systems else "off"
    if args.replication_factor > args.brokers and not args.bootstrap:
        p.error("--replication-factor cannot exceed --brokers")
    if args.bootstrap and args.security != "none":
        p.error("--security starts local clusters; with --bootstrap give --client-properties instead")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=170)  # a pipe or file: do not squeeze the tables to 80 columns
    tmp: Path | None = None
    clusters: list[LocalCluster] = []
    peers: list[PeerCluster] = []
    against, skipped = sysmod.usable(versus.parse_against(args.against))
    if skipped:
        console.print(f"[yellow]{skipped}[/]")
    if not against:
        return 1
    if "kafka" in against and args.bootstrap:
        console.print("[red]--against kafka starts local clusters: leave out --bootstrap[/]")
        return 2
    #: security ("none" / "sasl_ssl") -> (bootstrap servers, the benchmark's client settings)
    targets: dict[str, tuple[str, ClientSecurity]] = {}
    results: list[ModeResult] = []
    try:
        if args.bootstrap:
            security = (
                ClientSecurity.from_file(args.client_properties) if args.client_properties else PLAINTEXT
            )
            targets["sasl_ssl" if security.sasl else "none"] = (args.bootstrap, security)
            cluster_note = "existing (--bootstrap)"
        else:
            tmp = Path(tempfile.mkdtemp(prefix="sluice-bench-"))
            notes = []
            sluice_sides = ("none", "sasl_ssl") if args.security == "both" else (args.security,)
            for name in sluice_sides if "sluice" in against else ():
                label = SECURITY_LABELS[name]
                console.print(
                    f"starting a local {label} cluster of {args.brokers} broker(s) in {tmp / name} ..."
                )
                cluster = cluster_up(tmp / name, args.brokers, security=name)
                clusters.append(cluster)
                targets[name] = (cluster.bootstrap_servers, cluster.client_security())
                pids = ", ".join(f"{b.broker_id}:{b.pid}" for b in cluster.brokers)
                notes.append(f"{label}: local, {args.brokers} broker(s) (id:pid {pids})")
                console.print(f"{label}: bootstrap.servers={cluster.bootstrap_servers}  broker pids {pids}")
            for name in (KAFKA_SIDES[s] for s in sluice_sides) if "kafka" in against else ():
                label = SECURITY_LABELS[name]
                console.print(f"starting a local {label} cluster of {args.brokers} broker(s) in {tmp / name}")
                peer = peer_up(tmp / name, args.brokers, security="none" if name == "kafka" else "sasl_ssl")
                peers.append(peer)
                targets[name] = (peer.bootstrap_servers, peer.client_security())
                pids = ", ".join(f"{b.broker_id}:{b.pid}" for b in peer.brokers)
                notes.append(f"{label} {peer.version}: local, {args.brokers} broker(s) (id:pid {pids})")
                console.print(f"{label}: bootstrap.servers={peer.bootstrap_servers}  broker pids {pids}")
            cluster_note = "; ".join(notes)
        run_id = uuid.uuid4().hex[:8]
        modes = ("client", "prebuilt") if args.mode == "both" else (args.mode,)
        if args.warmup == "on":
            for name, (bootstrap, security) in targets.items():
                warm_up(console, args, modes, name, bootstrap, security, run_id)
        orders = versus.round_orders(list(targets), args.rounds)
        for rnd, mode, name in ((i, m, n) for i, order in enumerate(orders) for m in modes for n in order):
            # One system (security) after the other for each mode, so all see the machine in the same
            # minutes; the first one alternates from round to round.
            bootstrap, security = targets[name]
            topic = f"bench-{mode}-{name}-{run_id}-{rnd}"
            create_topic(bootstrap, topic, args.partitions, args.replication_factor, security=security)
            console.print(
                f"round {rnd + 1}/{args.rounds}: running {mode} mode ({SECURITY_LABELS[name]}) "
                f"on topic {topic} ..."
            )
            run = run_client if mode == "client" else run_prebuilt
            probe = page_cache_probe(tmp or Path(tempfile.gettempdir()), args.probe_mb)
            if args.probe_mb > 0:
                console.print(f"  page-cache write probe: {probe:,.0f} MB/s ({args.probe_mb} x 1 MB pwrite)")
            pids = [b.pid for c in clusters if c.bootstrap_servers == bootstrap for b in c.brokers]
            pids += [b.pid for c in peers if c.bootstrap_servers == bootstrap for b in c.brokers]
            meter = CpuMeter(pids)
            r = run(args, bootstrap, topic, security)
            r.security = name
            r.round = rnd
            r.cpu = meter.stop()
            r.page_cache_probe_mb_per_s = round(probe, 1)
            if not args.keep_topics:
                failed = delete_topic(bootstrap, topic, security=security)
                if failed:
                    r.notes.append(f"deleting topic {topic} failed: {failed}")
            console.print(
                f"  {mode} {SECURITY_LABELS[name]}: {r.mb_per_s:.1f} MB/s, "
                f"{r.records_per_s:,.0f} records/s, {r.errors} errors"
            )
            results.append(r)
    except KafkaException as exc:
        console.print(f"[red]Kafka error:[/] {exc}")
        return 1
    except PeerError as exc:
        console.print(f"[red]Apache Kafka peer:[/] {exc}")
        return 1
    finally:
        for cluster in clusters:
            cluster_down(Path(cluster.directory))
        for peer in peers:
            peer_down(Path(peer.directory))
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    bootstraps = "; ".join(f"{SECURITY_LABELS[name]}: {b}" for name, (b, _) in targets.items())
    print_report(console, args, bootstraps, results, cluster_note)
    figures = peer_figures(results)
    print_peer_figures(figures)
    security_figures = [
        (f"sasl_ssl_over_plaintext_{mode}", ours, theirs[mode])
        for theirs in [security_ratios(results, "kafka", "kafka_sasl_ssl")]
        for mode, ours in security_ratios(results).items()
        if mode in theirs
    ]
    versus.print_figures(security_figures, digits=3)
    if args.json:
        print(
            json.dumps(  # NaN (no latency figures with acks=0, probe skipped) becomes null
                _finite(
                    {
                        "argv": sys.argv[1:],
                        "acks": args.acks,
                        "brokers": args.brokers,
                        "partitions": args.partitions,
                        "replication_factor": args.replication_factor,
                        "record_size": args.record_size,
                        "security": args.security,
                        "results": [r.to_json() for r in results],
                        "rounds": args.rounds,
                        "warmup": args.warmup,
                        "sluice_over_kafka": versus.ratios_json(figures),
                        "kafka_sasl_ssl_over_plaintext": {
                            m: round(v, 3)
                            for m, v in security_ratios(results, "kafka", "kafka_sasl_ssl").items()
                        },
                        "sasl_ssl_over_plaintext": {
                            m: round(v, 3) for m, v in security_ratios(results).items()
                        },
                    }
                )
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

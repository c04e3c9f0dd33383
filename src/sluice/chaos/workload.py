"""Verifiable producer and consumer: a workload whose every acknowledgement and every read is
recorded, so the checker can say what was lost, duplicated or reordered.

The producer writes ``{writer}:{partition}:{seq}`` values, choosing partitions round robin
and counting ``seq`` per partition; it records each acknowledgement with its offset and the
broker that led the partition at the time (from the client's own metadata), and each failure
with the error's name. ``stale_leader_writes`` is the same kind of writer on Sluice's own codec,
aimed at one broker a drill names, whatever the cluster's metadata says.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.chaos.checker import Ack, Read
from sluice.clients import close_within
from sluice.security.client import PLAINTEXT, ClientSecurity


@dataclass
class ProducerStats:
    sent: int = 0
    acks: list[Ack] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)


class VerifiableProducer:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        acks: str = "all",
        idempotent: bool = True,
        writer: str = "w1",
        rate_per_s: float = 2000.0,
        extra: dict[str, Any] | None = None,
        security: ClientSecurity = PLAINTEXT,
    ):
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.writer = writer
        self.rate_per_s = rate_per_s
        self.config = {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": idempotent and acks == "all",
            "linger.ms": 2,
            "message.timeout.ms": 60000,
            "log_level": 0,
            "retry.backoff.ms": 100,
            "topic.metadata.refresh.interval.ms": 1000,
            **security.confluent_config(),
            **(extra or {}),
        }
        self.stats = ProducerStats()
        self._leaders: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"verifiable-producer-{writer}", daemon=True)

    def start(self) -> VerifiableProducer:
        self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 90.0) -> ProducerStats:
        self._stop.set()
        self._thread.join(flush_timeout_s + 10)
        return self.stats

    def acked(self) -> int:
        with self._lock:
            return len(self.stats.acks)

    def producing(self) -> bool:
        """False once the producer has ended (stopped, or a fatal client error ended it)."""
        return self._thread.is_alive()

    def failed(self) -> int:
        with self._lock:
            return sum(self.stats.errors.values())

    def _refresh_leaders(self, producer: Any) -> None:
        try:
            md = producer.list_topics(self.topic, timeout=2)
            t = md.topics.get(self.topic)
            if t is not None:
                with self._lock:
                    self._leaders = {p: int(pm.leader) for p, pm in t.partitions.items()}
        except Exception:
            pass

    def _run(self) -> None:
        from confluent_kafka import KafkaError, KafkaException, Producer

        producer = Producer(self.config)
        seq = [0] * self.partitions
        interval = 1.0 / self.rate_per_s if self.rate_per_s > 0 else 0.0

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            with self._lock:
                if err is None:
                    value = msg.value().decode()
                    self.stats.acks.append(
                        Ack(
                            self.topic,
                            msg.partition(),
                            msg.offset(),
                            value,
                            self._leaders.get(msg.partition(), -1),
                        )
                    )
                else:
                    name = err.name()
                    self.stats.errors[name] += 1
                    self.stats.first_error.setdefault(name, err.str())

        try:
            self._produce_loop(producer, seq, interval, on_delivery)
        except KafkaException as exc:
            # A fatal client error (e.g. an idempotent producer whose sequence the broker lost):
            # the client cannot go on; record it as the drill's evidence and stop producing.
            err = exc.args[0] if exc.args else None
            name = f"FATAL {err.name()}" if isinstance(err, KafkaError) else f"FATAL {exc!r}"
            with self._lock:
                self.stats.errors[name] += 1
                self.stats.first_error.setdefault(
                    name, err.str() if isinstance(err, KafkaError) else str(exc)
                )
            return
        producer.flush(90)

    def _produce_loop(self, producer: Any, seq: list[int], interval: float, on_delivery: Any) -> None:
        next_send = time.monotonic()
        next_refresh = 0.0
        i = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_refresh:
                self._refresh_leaders(producer)
                next_refresh = now + 0.25
            p = i % self.partitions
            value = f"{self.writer}:{p}:{seq[p]}".encode()
            try:
                producer.produce(self.topic, value=value, partition=p, on_delivery=on_delivery)
            except BufferError:
                producer.poll(0.05)
                continue
            seq[p] += 1
            i += 1
            with self._lock:
                self.stats.sent += 1
            next_send += interval
            delay = next_send - time.monotonic()
            producer.poll(max(0.0, delay))
            if delay < -1.0:
                next_send = time.monotonic()  # fell behind (a fault); do not burst to catch up


def stale_leader_writes(
    host: str,
    port: int,
    broker_id: int,
    topic: str,
    partition: int,
    *,
    acks: int,
    writer: str,
    records: int = 200,
    per_request: int = 10,
    timeout_ms: int = 250,
    deadline_s: float = 15.0,
    security: ClientSecurity = PLAINTEXT,
) -> ProducerStats:
    """A client that still believes ``broker_id`` leads ``partition`` (incident A's client: its
    metadata predates the move) and writes to it directly, one request at a time, as the
    verifiable producer does: ``{writer}:{partition}:{seq}`` values, each acknowledged record an
    ``Ack`` via ``broker_id``, each record of a failed request counted under ``stale <error>``.

    On Sluice's own codec (``WireClient``, ``build_batch``) rather than librdkafka: librdkafka
    decides for itself which broker it sends to, and keeping it on a deposed leader is exactly
    what the drill cannot leave to chance. ``records`` and ``timeout_ms`` bound the time taken
    when nothing is acknowledged (acks=-1 on a leader nobody fetches from waits ``timeout_ms``
    per request)."""
    from sluice.protocol.api import ApiKey
    from sluice.protocol.errors import ErrorCode
    from sluice.protocol.records import build_batch
    from sluice.sync.wire_client import WireClient

    stats = ProducerStats()
    deadline = time.monotonic() + deadline_s
    seq = 0
    try:
        with WireClient(
            host, port, client_id=f"stale-{writer}", timeout_s=timeout_ms / 1000 + 10, security=security
        ) as w:
            while seq < records and time.monotonic() < deadline:
                values = [f"{writer}:{partition}:{s}" for s in range(seq, min(records, seq + per_request))]
                response = w.request(
                    ApiKey.PRODUCE,
                    9,
                    {
                        "transactional_id": None,
                        "acks": acks,
                        "timeout_ms": timeout_ms,
                        "topic_data": [
                            {
                                "name": topic,
                                "partition_data": [
                                    {
                                        "index": partition,
                                        "records": build_batch([(None, v.encode()) for v in values]),
                                    }
                                ],
                            }
                        ],
                    },
                )
                seq += len(values)
                stats.sent += len(values)
                answer = response["responses"][0]["partition_responses"][0]
                error = ErrorCode(answer["error_code"])
                if error is ErrorCode.NONE:
                    base = int(answer["base_offset"])
                    stats.acks.extend(
                        Ack(topic, partition, base + i, v, broker_id) for i, v in enumerate(values)
                    )
                else:
                    stats.errors[f"stale {error.name}"] += len(values)  # counted per record, as sends are
                    stats.first_error.setdefault(f"stale {error.name}", answer.get("error_message") or "")
    except (OSError, ConnectionError) as exc:
        stats.errors[f"stale {type(exc).__name__}"] += 1
        stats.first_error.setdefault(f"stale {type(exc).__name__}", str(exc))
    return stats


def read_everything(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = 90.0, security: ClientSecurity = PLAINTEXT
) -> list[Read]:
    """Read every partition from its start to its end, by assignment (no group)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-verifier",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
            **security.confluent_config(),
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    reads: list[Read] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(eof) < partitions and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == -191:  # _PARTITION_EOF
                        eof.add(msg.partition() or 0)
                    continue
                partition, offset, value = msg.partition(), msg.offset(), msg.value()
                if partition is None or offset is None or value is None:
                    continue
                eof.discard(partition)
                reads.append(Read(topic, partition, offset, value.decode(errors="replace")))
    finally:
        close_within(consumer)
    if len(eof) < partitions:
        raise TimeoutError(
            f"could not read {topic} to its end in {timeout_s:.0f} s (partitions at end: {sorted(eof)})"
        )
    return reads


class GroupReader:
    """A consumer in a group that records what it read, committing after processing."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        *,
        session_timeout_ms: int = 6000,
        security: ClientSecurity = PLAINTEXT,
    ):
        self.bootstrap = bootstrap
        self.security = security
        self.topic = topic
        self.group = group
        self.session_timeout_ms = session_timeout_ms
        self.reads: list[Read] = []
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"group-reader-{group}", daemon=True)

    def start(self) -> GroupReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def count(self) -> int:
        with self._lock:
            return len(self.reads)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": self.session_timeout_ms,
                "log_level": 0,
                **self.security.confluent_config(),
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self._stop.is_set():
                msgs = consumer.consume(500, timeout=0.5)
                batch = []
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        self.errors[err.name()] += 1
                        continue
                    partition, offset, value = msg.partition(), msg.offset(), msg.value()
                    if partition is not None and offset is not None and value is not None:
                        batch.append(Read(self.topic, partition, offset, value.decode(errors="replace")))
                if batch:
                    with self._lock:
                        self.reads.extend(batch)
                    try:
                        consumer.commit(asynchronous=False)
                    except Exception as exc:
                        self.errors[type(exc).__name__] += 1
        finally:
            close_within(consumer)


class JavaVerifiableClient:
    """Kafka's Java client (kafka-clients) as a second verifiable producer and a group
    consumer beside librdkafka's (issue 20): ``bench/peers/clients/VerifiableClient.java``,
    compiled with javac against the jars ``scripts/peers.sh`` fetched, in one JVM. Its
    acknowledgements land in ``stats`` (as the librdkafka producer's do) and what its consumer
    read in ``reads``; the chaos checker judges both."""

    SOURCE = Path(__file__).resolve().parents[3] / "bench" / "peers" / "clients" / "VerifiableClient.java"

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, directory: Path, *, writer: str, group: str,
        rate_per_s: float = 500.0,
    ):  # fmt: skip
        from sluice.ops.peer_jars import kafka_libs

        self.topic = topic
        self.stats = ProducerStats()
        self.reads: list[Read] = []
        self.read_errors: Counter[str] = Counter()
        self.done = False
        self._lock = threading.Lock()
        classpath = f"{kafka_libs()}/*"  # PeerError names scripts/peers.sh when the jars are missing
        build = directory / "java-client"
        build.mkdir(parents=True, exist_ok=True)
        compiled = subprocess.run(
            ["javac", "-d", str(build), "-cp", classpath, str(self.SOURCE)], capture_output=True, text=True
        )
        if compiled.returncode != 0:
            raise RuntimeError(f"javac failed on {self.SOURCE}: {compiled.stderr[-2000:]}")
        self._stderr = (directory / "java-client.log").open("wb")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-cp", f"{build}:{classpath}", "VerifiableClient", bootstrap, topic,
             str(partitions), writer, group, str(rate_per_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._collect, name="java-verifiable-client", daemon=True)
        self._thread.start()

    def acked(self) -> int:
        with self._lock:
            return len(self.stats.acks)

    def _collect(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                item = json.loads(raw)
            except ValueError:
                continue
            with self._lock:
                if item[0] == "ack":
                    self.stats.acks.append(Ack(self.topic, item[1], item[2], item[3], -1))
                elif item[0] == "read":
                    self.reads.append(Read(self.topic, item[1], item[2], item[3]))
                elif item[0] == "error":
                    target = self.read_errors if item[1].startswith("read:") else self.stats.errors
                    target[item[1]] += 1
                elif item[0] == "done":
                    self.stats.sent = int(item[1])
                    self.done = True

    def stop(self, timeout_s: float = 120.0) -> ProducerStats:
        """Ends the load: its producer flushes (every send acknowledged or failed), then the JVM
        exits; killed if it has not after ``timeout_s``."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._thread.join(10)
        self._stderr.close()
        return self.stats

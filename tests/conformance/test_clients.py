"""Real Kafka clients against a real one-broker Sluice cluster.

Each client creates a 3-partition topic, produces 100,000 records with acks=all and
idempotence on, a quarter of them in each of gzip, snappy, lz4 and zstd batches, and reads
them all back by partition assignment: every value present once, in produced order.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.timeout(240)

RECORDS = 100_000
PARTITIONS = 3
CODECS = ("gzip", "snappy", "lz4", "zstd")


def value_of(i: int) -> bytes:
    return f"v{i:07d}".encode()


def index_of(value: bytes) -> int:
    return int(value[1:])


def expected_per_partition() -> dict[int, list[int]]:
    return {p: [i for i in range(RECORDS) if i % PARTITIONS == p] for p in range(PARTITIONS)}


def codec_of(i: int) -> str:
    return CODECS[i * len(CODECS) // RECORDS]


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)], operation_timeout=30)[name].result(timeout=40)


def assert_intact(read: dict[int, list[int]]) -> None:
    expected = expected_per_partition()
    for p in range(PARTITIONS):
        got = read.get(p, [])
        assert len(got) == len(expected[p]), f"partition {p}: read {len(got)}, produced {len(expected[p])}"
        assert got == expected[p], f"partition {p}: values differ or are out of order"


def read_with_confluent(bootstrap: str, topic: str) -> dict[int, list[int]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "conformance-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    eof: set[int] = set()
    try:
        while len(eof) < PARTITIONS:
            for msg in consumer.consume(10_000, timeout=1.0):
                if msg.error() is not None:
                    if msg.error().code() == -191:  # _PARTITION_EOF
                        eof.add(msg.partition())
                        continue
                    raise AssertionError(msg.error().str())
                eof.discard(msg.partition())
                read[msg.partition()].append(index_of(msg.value()))
    finally:
        close_within(consumer)
    return read


def test_confluent_kafka_roundtrip_all_codecs(cluster: TestCluster) -> None:
    topic = "conf-confluent"
    create_topic(cluster.bootstrap, topic)
    errors: list[str] = []
    for codec in CODECS:
        producer = Producer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": codec,
                "linger.ms": 5,
            }
        )

        def on_delivery(err: object, msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        for i in range(RECORDS):
            if codec_of(i) != codec:
                continue
            while True:
                try:
                    producer.produce(
                        topic,
                        value=value_of(i),
                        key=str(i).encode(),
                        partition=i % PARTITIONS,
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(60) == 0
    assert errors == []
    assert_intact(read_with_confluent(cluster.bootstrap, topic))


def test_kafka_python_roundtrip_all_codecs(cluster: TestCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = "conf-kafka-python"
    create_topic(cluster.bootstrap, topic)
    for codec in CODECS:
        producer = KafkaProducer(
            bootstrap_servers=cluster.bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type=codec,
            linger_ms=5,
            batch_size=256 * 1024,
        )
        futures = [
            producer.send(topic, value=value_of(i), partition=i % PARTITIONS)
            for i in range(RECORDS)
            if codec_of(i) == codec
        ]
        producer.flush(timeout=120)
        for f in futures:
            f.get(timeout=30)
        producer.close()
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    tps = [KTP(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    idle = 0
    while sum(map(len, read.values())) < RECORDS and idle < 20:
        batch = consumer.poll(timeout_ms=1000, max_records=20_000)
        idle = 0 if batch else idle + 1
        for tp, msgs in batch.items():
            read[tp.partition].extend(index_of(m.value) for m in msgs)
    close_within(consumer)
    assert_intact(read)


def test_aiokafka_roundtrip_all_codecs(cluster: TestCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATP

    topic = "conf-aiokafka"
    create_topic(cluster.bootstrap, topic)

    async def run() -> dict[int, list[int]]:
        for codec in CODECS:
            producer = AIOKafkaProducer(
                bootstrap_servers=cluster.bootstrap,
                acks="all",
                enable_idempotence=True,
                compression_type=codec,
                linger_ms=5,
                max_batch_size=256 * 1024,
            )
            await producer.start()
            try:
                futs = [
                    await producer.send(topic, value=value_of(i), partition=i % PARTITIONS)
                    for i in range(RECORDS)
                    if codec_of(i) == codec
                ]
                await producer.flush()
                await asyncio.gather(*futs)
            finally:
                await producer.stop()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cluster.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        await consumer.start()
        read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        try:
            tps = [ATP(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            idle = 0
            while sum(map(len, read.values())) < RECORDS and idle < 20:
                batch = await consumer.getmany(timeout_ms=1000, max_records=20_000)
                idle = 0 if batch else idle + 1
                for tp, msgs in batch.items():
                    read[tp.partition].extend(index_of(m.value) for m in msgs)
        finally:
            await consumer.stop()
        return read

    assert_intact(asyncio.run(run()))


def _kcat(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["kcat", *args], check=True, capture_output=True, timeout=120, **kwargs)  # type: ignore[call-overload]


def test_kcat_roundtrip_all_codecs(cluster: TestCluster, tmp_path: Path) -> None:
    topic = "conf-kcat"
    create_topic(cluster.bootstrap, topic)
    for codec in CODECS:
        for p in range(PARTITIONS):
            lines = [value_of(i) for i in range(RECORDS) if codec_of(i) == codec and i % PARTITIONS == p]
            path = tmp_path / f"{codec}-{p}.txt"
            path.write_bytes(b"\n".join(lines) + b"\n")
            _kcat(
                [
                    "-P",
                    "-b",
                    cluster.bootstrap,
                    "-t",
                    topic,
                    "-p",
                    str(p),
                    "-z",
                    codec,
                    "-X",
                    "enable.idempotence=true",
                    "-X",
                    "acks=all",
                    "-X",
                    "linger.ms=5",
                    "-l",
                    str(path),
                ]
            )
    read: dict[int, list[int]] = {}
    for p in range(PARTITIONS):
        out = _kcat(
            [
                "-C",
                "-b",
                cluster.bootstrap,
                "-t",
                topic,
                "-p",
                str(p),
                "-o",
                "beginning",
                "-e",
                "-q",
                "-f",
                "%s\n",
            ]
        ).stdout
        read[p] = [index_of(v) for v in out.split(b"\n") if v]
    assert_intact(read)


def test_produce_to_missing_topic_gets_unknown_topic(cluster: TestCluster) -> None:
    errors: list[object] = []
    # The broker answers UNKNOWN_TOPIC_OR_PARTITION in metadata; librdkafka waits this long for
    # the topic to appear before it fails the send with _UNKNOWN_TOPIC.
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "message.timeout.ms": 10000,
            "topic.metadata.propagation.max.ms": 1000,
            "enable.idempotence": True,
        }
    )
    producer.produce("no-such-topic", value=b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() in (3, -188), errors[0]  # UNKNOWN_TOPIC_OR_PART or _UNKNOWN_TOPIC

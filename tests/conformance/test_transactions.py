"""Transactions (KIP-98) with real clients on a three-broker cluster: confluent-kafka's,
kafka-python's and aiokafka's transactional producers, read back by read_committed consumers.

One cluster for the module. ``__transaction_state`` and ``__consumer_offsets`` have 6
partitions here (placement is the same rule at any count) and replication factor 3, and the
topics' partitions have leaders on every broker, so the coordinator writes most markers over
the inter-broker listener.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from tests.support.cluster import TestCluster, wait_until
from tests.support.transactions import read_values, wait_stable, watermarks

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 3
SETTINGS = {
    "transaction.state.log.num.partitions": "6",
    "offsets.topic.num.partitions": "6",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("txn-cluster"), 3, broker_settings=SETTINGS)
    try:
        yield c
    finally:
        c.down()


def new_topic(cluster: TestCluster, partitions: int = PARTITIONS) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, partitions, 3)], operation_timeout=30)[name].result(60)
    return name


def txn_producer(cluster: TestCluster, txn_id: str, **extra: Any) -> Producer:
    p = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id, "log_level": 0, **extra}
    )
    p.init_transactions(60)
    return p


def test_committed_transactions_are_read_once_and_aborted_ones_never(cluster: TestCluster) -> None:
    """Twenty transactions over three partitions, every third aborted (records flushed, so the
    aborted records are in the log), with plain records in between: read_committed reads every
    committed record once and no aborted one; read_uncommitted reads them all (the filter is the
    broker's answer, not an absence)."""
    topic = new_topic(cluster)
    p = txn_producer(cluster, f"txn-{topic}")
    plain = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    committed, aborted = set(), set()
    for txn in range(20):
        p.begin_transaction()
        values = {f"{txn}:{i}".encode() for i in range(9)}
        for i, v in enumerate(sorted(values)):
            p.produce(topic, value=v, partition=i % PARTITIONS)
        p.flush(30)
        plain.produce(topic, value=f"plain{txn}".encode(), partition=txn % PARTITIONS)
        plain.flush(30)
        if txn % 3 == 2:
            p.abort_transaction(30)
            aborted |= values
        else:
            p.commit_transaction(30)
            committed |= values
        committed.add(f"plain{txn}".encode())
    wait_stable(cluster.bootstrap, topic, PARTITIONS)
    read = read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed")
    assert len(read) == len(set(read)), "a committed record was read twice"
    assert set(read) == committed
    everything = read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_uncommitted")
    assert set(everything) == committed | aborted


def test_an_open_transaction_holds_read_committed_readers_at_its_first_offset(cluster: TestCluster) -> None:
    """While a transaction is open, a read_committed client is told its first offset as the
    latest (ListOffsets) and reads nothing from there, even records committed after it by
    others; once it commits, all of it."""
    topic = new_topic(cluster, 1)
    plain = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    plain.produce(topic, value=b"before", partition=0)
    plain.flush(30)
    p = txn_producer(cluster, f"txn-{topic}")
    p.begin_transaction()
    p.produce(topic, value=b"in-txn", partition=0)
    p.flush(30)
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(30)
    assert watermarks(cluster.bootstrap, topic, 1, "read_uncommitted") == [3]
    assert watermarks(cluster.bootstrap, topic, 1, "read_committed") == [1]
    assert read_values(cluster.bootstrap, topic, [0], "read_committed") == [b"before"]
    p.commit_transaction(30)
    wait_stable(cluster.bootstrap, topic, 1)
    assert read_values(cluster.bootstrap, topic, [0], "read_committed") == [b"before", b"in-txn", b"after"]


def test_a_zombie_producer_with_the_same_transactional_id_is_fenced(cluster: TestCluster) -> None:
    """The first producer's transaction is open when a second one initialises with the same id:
    the open transaction is aborted, and the first producer's commit fails as fenced (a fatal
    error); only the second one's records are ever read."""
    topic = new_topic(cluster)
    txn_id = f"zombie-{topic}"
    zombie = txn_producer(cluster, txn_id)
    zombie.begin_transaction()
    for i in range(6):
        zombie.produce(topic, value=f"zombie{i}".encode(), partition=i % PARTITIONS)
    zombie.flush(30)
    successor = txn_producer(cluster, txn_id)
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(30)
    zombie.produce(topic, value=b"zombie-late", partition=1)
    with pytest.raises(KafkaException) as failed:
        zombie.commit_transaction(30)
    error = failed.value.args[0]
    assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
    wait_stable(cluster.bootstrap, topic, PARTITIONS)
    assert read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed") == [b"successor"]


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(cluster: TestCluster) -> None:
    topic = new_topic(cluster, 1)
    p = txn_producer(cluster, f"slow-{topic}", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce(topic, value=b"too-late", partition=0)
    p.flush(30)
    assert watermarks(cluster.bootstrap, topic, 1, "read_committed") == [0]
    # The coordinator aborts it (its marker ends it on the partition): the LSO passes it.
    wait_stable(cluster.bootstrap, topic, 1, timeout_s=30)
    with pytest.raises(KafkaException):
        p.commit_transaction(30)
    assert read_values(cluster.bootstrap, topic, [0], "read_committed") == []


def test_consume_transform_produce_with_send_offsets_to_transaction(cluster: TestCluster) -> None:
    """A read_committed consumer in a group, and a transactional producer that writes each
    input's transform and the consumer's offsets in one transaction; every fourth transaction is
    aborted and its inputs read again from the group's committed offsets. Every input is
    transformed exactly once, and the group's offsets end at the inputs' end."""
    source, sink = new_topic(cluster), new_topic(cluster)
    inputs = [f"in{i}".encode() for i in range(150)]
    plain = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0, "enable.idempotence": True})
    for i, v in enumerate(inputs):
        plain.produce(source, value=v, partition=i % PARTITIONS)
    plain.flush(30)
    group = f"ctp-{source}"
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "log_level": 0,
        }
    )
    producer = txn_producer(cluster, f"ctp-{source}")
    consumer.subscribe([source])
    transactions = 0
    done = 0
    deadline = time.monotonic() + 120
    try:
        while done < len(inputs):
            assert time.monotonic() < deadline, f"transformed {done} of {len(inputs)}"
            msgs = [m for m in consumer.consume(num_messages=20, timeout=1.0) if m.error() is None]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                value = m.value()
                assert value is not None
                producer.produce(sink, value=b"out-" + value, partition=m.partition())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
            )
            transactions += 1
            if transactions % 4 == 0:
                producer.abort_transaction(30)
                # Back to the committed offsets: the aborted inputs are read again.
                committed = consumer.committed(consumer.assignment(), timeout=10)
                for tp in committed:
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            else:
                producer.commit_transaction(30)
                done += len(msgs)
    finally:
        close_within(consumer)
    wait_stable(cluster.bootstrap, sink, PARTITIONS)
    outputs = read_values(cluster.bootstrap, sink, range(PARTITIONS), "read_committed")
    assert sorted(outputs) == sorted(b"out-" + v for v in inputs)
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "log_level": 0})
    try:
        ends = watermarks(cluster.bootstrap, source, PARTITIONS, "read_committed")
        got = reader.committed([TopicPartition(source, p) for p in range(PARTITIONS)], timeout=10)
        assert [tp.offset for tp in got] == ends
    finally:
        close_within(reader)
    assert transactions > 4


def test_kafka_python_transactional_producer(cluster: TestCluster) -> None:
    """kafka-python 3's transactional producer: a committed transaction with its offsets sent,
    an aborted one, and a second producer fencing the first; its read_committed consumer
    agrees with librdkafka's."""
    from kafka import KafkaConsumer, KafkaProducer, OffsetAndMetadata
    from kafka import TopicPartition as KpTopicPartition
    from kafka.errors import KafkaError as KpError

    topic = new_topic(cluster)
    txn_id = f"kp-{topic}"
    p = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=txn_id)
    p.init_transactions()
    group = f"kp-group-{topic}"
    p.begin_transaction()
    for i in range(6):
        p.send(topic, value=f"kp-commit{i}".encode(), partition=i % PARTITIONS)
    p.send_offsets_to_transaction({KpTopicPartition(topic, 0): OffsetAndMetadata(4, "", -1)}, group)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(6):
        p.send(topic, value=f"kp-abort{i}".encode(), partition=i % PARTITIONS)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send(topic, value=b"kp-zombie", partition=0)
    p.flush()
    successor = KafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=txn_id)
    successor.init_transactions()
    with pytest.raises(KpError):
        p.commit_transaction()
    p.close(timeout=5)
    successor.close(timeout=5)
    wait_stable(cluster.bootstrap, topic, PARTITIONS)
    expected = {f"kp-commit{i}".encode() for i in range(6)}
    assert set(read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed")) == expected
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=3000,
    )
    try:
        consumer.assign([KpTopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        assert sorted(m.value for m in consumer) == sorted(expected)
    finally:
        consumer.close()
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "log_level": 0})
    try:
        (tp,) = reader.committed([TopicPartition(topic, 0)], timeout=10)
        assert tp.offset == 4
    finally:
        close_within(reader)


def test_a_timeout_above_the_brokers_maximum_is_refused(cluster: TestCluster) -> None:
    """transaction.timeout.ms above transaction.max.timeout.ms (15 minutes by default) is refused
    with INVALID_TRANSACTION_TIMEOUT, as Kafka refuses it."""
    p = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": f"too-long-{uuid.uuid4().hex[:6]}",
            "transaction.timeout.ms": 900_001,
            "log_level": 0,
        }
    )
    with pytest.raises(KafkaException) as refused:
        p.init_transactions(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_aiokafka_transactional_producer(cluster: TestCluster) -> None:
    """aiokafka's transactional producer, with send_offsets_to_transaction: committed records
    and offsets visible, aborted ones not, and a successor fencing it."""
    from aiokafka import AIOKafkaProducer
    from aiokafka import TopicPartition as AioTp
    from aiokafka.errors import KafkaError as AioError

    topic = new_topic(cluster)
    txn_id = f"aio-{topic}"
    group = f"aio-group-{topic}"

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=txn_id)
        await p.start()
        try:
            async with p.transaction():
                for i in range(6):
                    await p.send_and_wait(topic, value=f"aio-commit{i}".encode(), partition=i % PARTITIONS)
                await p.send_offsets_to_transaction({AioTp(topic, 0): 3}, group)
            await p.begin_transaction()
            for i in range(6):
                await p.send_and_wait(topic, value=f"aio-abort{i}".encode(), partition=i % PARTITIONS)
            await p.abort_transaction()
            await p.begin_transaction()
            await p.send_and_wait(topic, value=b"aio-zombie", partition=0)
            successor = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, transactional_id=txn_id)
            await successor.start()
            try:
                with pytest.raises(AioError):
                    await p.commit_transaction()
            finally:
                await successor.stop()
        finally:
            await p.stop()

    asyncio.run(asyncio.wait_for(run(), 120))
    wait_stable(cluster.bootstrap, topic, PARTITIONS)
    expected = {f"aio-commit{i}".encode() for i in range(6)}
    assert set(read_values(cluster.bootstrap, topic, range(PARTITIONS), "read_committed")) == expected
    reader = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "log_level": 0})
    try:
        wait_until(
            lambda: [t for t in reader.committed([TopicPartition(topic, 0)], timeout=10) if t.offset == 3],
            30,
            "the transaction's offset to be the group's",
        )
    finally:
        close_within(reader)

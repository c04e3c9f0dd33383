"""Protocol answers a new user sees through real clients, each as Kafka gives it (issue 19).

One one-broker cluster for the module; each test uses topics of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from sluice.clients import close_within
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import BatchHeader, build_batch, iter_batches
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(120)

UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture(scope="module")
def kafka(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("answers"), 1)
    try:
        yield c
    finally:
        c.down()


def create_topic(bootstrap: str, name: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, 1, 1, config=config or {})
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=40)


def produce_one_batch(bootstrap: str, topic: str, records: list[tuple[bytes, int]], **conf: object) -> None:
    """Every record into partition 0 in one batch: one `produce` each, then one flush, the
    linger long enough that librdkafka sends them together."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 500, "acks": "all", **conf})
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for value, ts in records:
        producer.produce(topic, value=value, partition=0, timestamp=ts, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []


def stored_batches(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[BatchHeader, bytes]]:
    """The batches the broker serves for a partition from offset 0 (header, whole batch)."""
    with WireClient.connect(bootstrap, timeout_s=10) as w:
        r = w.request(
            ApiKey.FETCH,
            4,
            {
                "replica_id": -1,
                "max_wait_ms": 0,
                "min_bytes": 0,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "topics": [
                    {
                        "topic": topic,
                        "partitions": [
                            {"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                        ],
                    }
                ],
            },
        )
    (part,) = r["responses"][0]["partitions"]
    assert part["error_code"] == ErrorCode.NONE, part
    data = bytes(part["records"])
    return [(h, data[pos : pos + h.size_bytes]) for pos, h in iter_batches(data)]


def consumer(bootstrap: str, **conf: object) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": "answers", **conf})


# -- ListOffsets by timestamp ---------------------------------------------------------------------


def test_offsets_for_times_answers_the_first_record_at_or_after_the_time_inside_a_batch(
    kafka: TestCluster,
) -> None:
    """Two records of one batch, timestamps 1234 and 999999999999: a seek to 999999999999 lands
    on offset 1 (Kafka's answer), not on the batch's base offset 0, which would re-read record 0."""
    topic = "times-in-a-batch"
    create_topic(kafka.bootstrap, topic)
    produce_one_batch(kafka.bootstrap, topic, [(b"early", 1234), (b"late", 999_999_999_999)])
    assert [(h.base_offset, h.records_count) for h, _ in stored_batches(kafka.bootstrap, topic)] == [(0, 2)]
    c = consumer(kafka.bootstrap)
    try:
        asked = {
            1234: 0,
            1235: 1,
            999_999_999_999: 1,
            1_000_000_000_000: -1,  # after every record: the end (librdkafka's OFFSET_END)
        }
        for ts, expected in asked.items():
            (answer,) = c.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert answer.error is None, answer.error
            assert answer.offset == expected, f"timestamp {ts}: offset {answer.offset}, expected {expected}"
    finally:
        close_within(c)


def test_list_offsets_max_timestamp_answers_the_first_record_with_the_largest_time(
    kafka: TestCluster,
) -> None:
    """KIP-734 (OffsetSpec.max_timestamp): the record carrying the partition's largest timestamp,
    the first of two that carry it, inside its batch."""
    topic = "max-timestamp"
    create_topic(kafka.bootstrap, topic)
    produce_one_batch(kafka.bootstrap, topic, [(b"a", 100), (b"b", 300), (b"c", 200), (b"d", 300)])
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    tp = TopicPartition(topic, 0)
    for spec in (OffsetSpec.max_timestamp(), OffsetSpec.for_timestamp(150)):
        answer = admin.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        assert (answer.offset, answer.timestamp) == (1, 300), spec


# -- invalid topic names --------------------------------------------------------------------------

INVALID_NAMES = ["a$#!", "x" * 250, ".", "..", "white space", "dé"]


def test_producing_to_an_invalid_topic_name_fails_at_once_with_invalid_topic(kafka: TestCluster) -> None:
    """librdkafka asks Metadata for the name; INVALID_TOPIC_EXCEPTION is final, so the messages
    fail at once instead of being retried until message.timeout.ms (UNKNOWN_TOPIC_OR_PARTITION)."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 60_000})
    failures: list[tuple[str, int]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        failures.append((str(msg.topic()), err.code() if err is not None else 0))

    for name in INVALID_NAMES:
        producer.produce(name, value=b"v", on_delivery=on_delivery)
    started = time.monotonic()
    assert producer.flush(20) == 0, f"still waiting after 20 s: {failures}"
    assert time.monotonic() - started < 20
    assert sorted(failures) == sorted((name, KafkaError.TOPIC_EXCEPTION) for name in INVALID_NAMES)


def test_metadata_for_an_invalid_topic_name_answers_invalid_topic(kafka: TestCluster) -> None:
    c = consumer(kafka.bootstrap)
    try:
        for name in INVALID_NAMES:
            answer = c.list_topics(name, timeout=10).topics[name]
            assert answer.error is not None and answer.error.code() == KafkaError.TOPIC_EXCEPTION, name
        # a valid name that does not exist is still UNKNOWN_TOPIC_OR_PARTITION: it may be created
        answer = c.list_topics("not-yet", timeout=10).topics["not-yet"]
        assert answer.error is not None and answer.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        close_within(c)


def test_create_topics_with_an_invalid_name_answers_invalid_topic(kafka: TestCluster) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    futures = admin.create_topics([NewTopic(name, 1, 1) for name in INVALID_NAMES], operation_timeout=10)
    for name, future in futures.items():
        with pytest.raises(KafkaException) as raised:
            future.result(timeout=20)
        assert raised.value.args[0].code() == KafkaError.TOPIC_EXCEPTION, (name, raised.value)


def test_a_produce_request_to_an_invalid_topic_name_answers_invalid_topic(kafka: TestCluster) -> None:
    """Clients ask Metadata first; a Produce naming such a topic anyway gets the final answer too."""
    with WireClient.connect(kafka.bootstrap, timeout_s=10) as w:
        for name, expected in [("a$#!", ErrorCode.INVALID_TOPIC_EXCEPTION), ("absent", UNKNOWN)]:
            r = w.request(
                ApiKey.PRODUCE,
                9,
                {
                    "acks": -1,
                    "timeout_ms": 5000,
                    "topic_data": [
                        {
                            "name": name,
                            "partition_data": [{"index": 0, "records": build_batch([(b"k", b"v")])}],
                        }
                    ],
                },
            )
            assert r["responses"][0]["partition_responses"][0]["error_code"] == expected, name


# -- OffsetCommit ---------------------------------------------------------------------------------


def test_committing_offsets_of_a_missing_topic_or_partition_answers_unknown_and_stores_nothing(
    kafka: TestCluster,
) -> None:
    create_topic(kafka.bootstrap, "committed")  # one partition
    outcomes: list[tuple[KafkaError | None, list[TopicPartition]]] = []
    c = consumer(
        kafka.bootstrap,
        **{"group.id": "commits-to-nowhere", "on_commit": lambda err, tps: outcomes.append((err, tps))},
    )
    wanted = [
        TopicPartition("committed", 0, 5),
        TopicPartition("committed", 1, 6),  # no partition 1
        TopicPartition("never-created", 0, 7),
    ]
    try:
        c.commit(offsets=wanted, asynchronous=True)
        wait_until(lambda: c.poll(0.1) is None and outcomes, 15, "the commit's outcome")
        # librdkafka reports the request's first error on every partition of the commit
        ((error, answered),) = outcomes
        assert error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, error
        assert {(tp.topic, tp.partition) for tp in answered} == {(tp.topic, tp.partition) for tp in wanted}
    finally:
        close_within(c)
    c = consumer(kafka.bootstrap, **{"group.id": "commits-to-nowhere"})
    try:
        stored = c.committed([TopicPartition(tp.topic, tp.partition) for tp in wanted], timeout=10)
        assert [(tp.topic, tp.partition, tp.offset) for tp in stored] == [
            ("committed", 0, 5),
            ("committed", 1, OFFSET_INVALID),
            ("never-created", 0, OFFSET_INVALID),
        ]
    finally:
        close_within(c)

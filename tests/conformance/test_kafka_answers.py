"""Protocol answers a new user sees through real clients, each as Kafka gives it (issue 19).

One two-broker cluster for the module (a replicated topic shows what a follower stores); each
test uses topics of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

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
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from sluice.clients import close_within
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import (
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    iter_batches,
    validate_batch,
)
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(120)

UNKNOWN = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


@pytest.fixture(scope="module")
def kafka(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("answers"), 2)
    try:
        yield c
    finally:
        c.down()


def create_topic(
    bootstrap: str, name: str, config: dict[str, str] | None = None, replication_factor: int = 1
) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, 1, replication_factor, config=config or {})
    admin.create_topics([topic], operation_timeout=30)[name].result(timeout=40)


#: Longer than any test here waits: only flush() sends (see ``produce_one_batch``).
LINGER_MS = 60_000


def produce_one_batch(bootstrap: str, topic: str, records: list[tuple[bytes, int]], **conf: object) -> None:
    """Every record into partition 0 in one batch: one `produce` each, then one flush. The linger
    outlasts any stall of the test process (librdkafka sends a batch when its linger ends, and a
    500 ms one was cut in two under load); flush sends at once, whatever the linger."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS, "acks": "all", **conf})
    errors: list[str] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    for value, ts in records:
        producer.produce(topic, value=value, partition=0, timestamp=ts, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert errors == []


def stored_batches(bootstrap: str, topic: str, partition: int = 0) -> list[tuple[BatchHeader, bytes]]:
    """The batches the partition's leader serves from offset 0 (header, whole batch)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    leader = metadata.brokers[metadata.topics[topic].partitions[partition].leader]
    with WireClient.connect(f"{leader.host}:{leader.port}", timeout_s=10) as w:
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

    refused_at_once: dict[str, int] = {}
    for name in INVALID_NAMES:
        try:
            producer.produce(name, value=b"v", on_delivery=on_delivery)
        except KafkaException as exc:
            # librdkafka already held the broker's answer for the name (under load its Metadata
            # answer came back before the loop's next produce) and refuses it on the spot
            refused_at_once[name] = exc.args[0].code()
    started = time.monotonic()
    assert producer.flush(20) == 0, f"still waiting after 20 s: {failures}"
    assert time.monotonic() - started < 20
    refusals = {KafkaError._UNKNOWN_TOPIC, KafkaError.TOPIC_EXCEPTION}
    assert set(refused_at_once.values()) <= refusals, refused_at_once
    assert sorted(failures) == sorted(
        (name, KafkaError.TOPIC_EXCEPTION) for name in INVALID_NAMES if name not in refused_at_once
    )


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


# -- topic configs --------------------------------------------------------------------------------

#: Every topic config Kafka 3.9 defines but the compaction ones (cleanup.policy=compact,
#: delete.retention.ms, min.cleanable.dirty.ratio, min.compaction.lag.ms, max.compaction.lag.ms,
#: which come with the log cleaner), each at a value that describes what Sluice does.
KAFKA_39_TOPIC_CONFIGS = {
    "cleanup.policy": "delete",
    "compression.type": "zstd",
    "compression.gzip.level": "6",
    "compression.lz4.level": "10",
    "compression.zstd.level": "5",
    "file.delete.delay.ms": "30000",
    "flush.messages": "100000",
    "flush.ms": "60000",
    "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "8192",
    "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2",
    "local.retention.ms": "-2",
    "max.message.bytes": "2000000",
    "message.downconversion.enable": "false",
    "message.format.version": "3.0-IV1",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "86400000",
    "message.timestamp.difference.max.ms": "86400000",
    "message.timestamp.type": "CreateTime",
    "min.insync.replicas": "1",
    "preallocate": "false",
    "remote.log.copy.disable": "false",
    "remote.log.delete.on.disable": "false",
    "remote.storage.enable": "false",
    "retention.bytes": "1073741824",
    "retention.ms": "604800000",
    "segment.bytes": "104857600",
    "segment.index.bytes": "1048576",
    "segment.jitter.ms": "60000",
    "segment.ms": "3600000",
    "unclean.leader.election.enable": "false",
}


def outcome_into(outcomes: list[KafkaError | None]) -> Callable[[KafkaError | None, Message], None]:
    return lambda err, _msg: outcomes.append(err)


def describe_topic(bootstrap: str, name: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    entries = admin.describe_configs([resource])[resource].result(timeout=15)
    return {key: entry.value for key, entry in entries.items()}


def test_create_topics_accepts_every_kafka_topic_config_and_describe_configs_shows_it(
    kafka: TestCluster,
) -> None:
    create_topic(kafka.bootstrap, "every-config", KAFKA_39_TOPIC_CONFIGS)
    described = describe_topic(kafka.bootstrap, "every-config")
    assert {k: described.get(k) for k in KAFKA_39_TOPIC_CONFIGS} == KAFKA_39_TOPIC_CONFIGS
    produce_one_batch(kafka.bootstrap, "every-config", [(b"v", int(time.time() * 1000))])


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("remote.storage.enable", "true", "tiered storage is not supported"),
        ("preallocate", "true", "does not preallocate"),
        ("leader.replication.throttled.replicas", "*", "replication throttling is not supported"),
        ("follower.replication.throttled.replicas", "0:1", "replication throttling is not supported"),
        ("compression.type", "brotli", "compression.type"),
        ("compression.zstd.level", "99", "compression.zstd.level"),
        ("message.timestamp.before.max.ms", "-1", "message.timestamp.before.max.ms"),
        ("message.format.version", "latest", "message.format.version"),
        ("no.such.config", "1", "unknown topic config"),
    ],
)
def test_a_topic_config_sluice_does_not_do_is_refused_naming_it_and_nothing_is_created(
    kafka: TestCluster, key: str, value: str, named: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    name = f"refused-{key.replace('.', '-')}"
    future = admin.create_topics([NewTopic(name, 1, 1, config={key: value})], operation_timeout=10)[name]
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=20)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG, error
    assert named in error.str(), error.str()
    assert name not in admin.list_topics(timeout=10).topics


def test_compression_type_makes_the_leader_store_every_batch_in_the_topics_codec(kafka: TestCluster) -> None:
    """compression.type=zstd on a topic replicated to both brokers: gzip and uncompressed batches
    from an idempotent producer are stored as zstd batches with the producer's ids, sequences,
    timestamps and offsets, valid CRCs, the follower's copy byte for byte the leader's, and a
    consumer reads every record back."""
    topic = "stored-as-zstd"
    create_topic(kafka.bootstrap, topic, {"compression.type": "zstd"}, replication_factor=2)
    now = int(time.time() * 1000)
    sent = []
    for codec in ("gzip", "none", "lz4"):
        records = [(f"{codec}-{i}".encode(), now + i) for i in range(5)]
        produce_one_batch(
            kafka.bootstrap, topic, records, **{"compression.type": codec, "enable.idempotence": True}
        )
        sent.extend(records)
    stored = stored_batches(kafka.bootstrap, topic)
    assert [h.compression for h, _ in stored] == [COMPRESSION_ZSTD] * 3
    assert [(h.base_offset, h.records_count) for h, _ in stored] == [(0, 5), (5, 5), (10, 5)]
    for h, batch in stored:
        validate_batch(batch, 0, h)
        assert h.producer_id >= 0 and h.producer_epoch >= 0 and h.base_sequence == 0, h
    assert [(r.value, r.timestamp) for h, b in stored for r in decode_records(b, 0, h)] == sent
    files = [Path(kafka.broker(b).data_dir) / f"{topic}-0" / "00000000000000000000.log" for b in (1, 2)]
    wait_until(lambda: all(f.exists() for f in files) and files[0].read_bytes() == files[1].read_bytes(),
               15, "the follower to hold the leader's bytes")  # fmt: skip
    c = consumer(kafka.bootstrap, **{"group.id": "reads-zstd", "auto.offset.reset": "earliest"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got: list[tuple[bytes, int]] = []

        def read_all() -> bool:
            got.extend((bytes(m.value() or b""), m.timestamp()[1]) for m in c.consume(20, 0.5))
            return len(got) >= len(sent)

        wait_until(read_all, 20, "every record")
        assert got == sent
    finally:
        close_within(c)


def test_compression_type_uncompressed_stores_compressed_batches_uncompressed(kafka: TestCluster) -> None:
    topic = "stored-uncompressed"
    create_topic(kafka.bootstrap, topic, {"compression.type": "uncompressed"})
    produce_one_batch(
        kafka.bootstrap, topic, [(b"a" * 100, 1), (b"b" * 100, 2)], **{"compression.type": "snappy"}
    )
    ((h, batch),) = stored_batches(kafka.bootstrap, topic)
    assert h.compression == COMPRESSION_NONE and h.records_count == 2
    validate_batch(batch, 0, h)
    assert [r.value for r in decode_records(batch, 0, h)] == [b"a" * 100, b"b" * 100]


def test_a_record_outside_the_timestamp_bounds_is_refused_invalid_timestamp_and_nothing_is_appended(
    kafka: TestCluster,
) -> None:
    topic = "bounded-times"
    hour_ms = 3_600_000
    create_topic(
        kafka.bootstrap,
        topic,
        {"message.timestamp.before.max.ms": str(hour_ms), "message.timestamp.after.max.ms": str(hour_ms)},
    )
    now = int(time.time() * 1000)
    with WireClient.connect(kafka.bootstrap, timeout_s=10) as w:
        for ts in (now - 2 * hour_ms, now + 2 * hour_ms):
            # one batch, built here (a client may send its records in two batches under load: one
            # librdkafka run sent the record inside the bounds alone): the record inside the
            # bounds shares it with the one outside them, and the whole batch is refused
            batch = build_batch([Record(0, now, None, b"in"), Record(1, ts, None, b"out")])
            deadline = time.monotonic() + 30
            while True:
                r = w.request(
                    ApiKey.PRODUCE, 9,
                    {"acks": -1, "timeout_ms": 5000,
                     "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]},
                )  # fmt: skip
                part = r["responses"][0]["partition_responses"][0]
                # the new topic's leader not elected yet (under load): retriable, as every client
                # treats it; any other answer is the one asserted
                if part["error_code"] != ErrorCode.NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert part["error_code"] == ErrorCode.INVALID_TIMESTAMP, part
            assert [e["batch_index"] for e in part["record_errors"]] == [1], part  # KIP-467: names it
    for ts in (now - 2 * hour_ms, now + 2 * hour_ms):
        # a client's view: librdkafka's delivery report says INVALID_TIMESTAMP
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": LINGER_MS, "retries": 0})
        outcomes: list[KafkaError | None] = []
        producer.produce(topic, value=b"out", partition=0, timestamp=ts, on_delivery=outcome_into(outcomes))
        assert producer.flush(20) == 0
        assert [e.code() if e else None for e in outcomes] == [KafkaError.INVALID_TIMESTAMP], outcomes
    assert stored_batches(kafka.bootstrap, topic) == []
    produce_one_batch(kafka.bootstrap, topic, [(b"in", now), (b"also-in", now - hour_ms // 2)])
    assert [h.records_count for h, _ in stored_batches(kafka.bootstrap, topic)] == [2]


def test_the_deprecated_timestamp_difference_bounds_both_sides_while_they_are_unset(
    kafka: TestCluster,
) -> None:
    topic = "difference-bounded"
    create_topic(kafka.bootstrap, topic, {"message.timestamp.difference.max.ms": "60000"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "retries": 0})
    outcomes: list[KafkaError | None] = []
    producer.produce(topic, value=b"old", partition=0, timestamp=int(time.time() * 1000) - 120_000,
                     on_delivery=outcome_into(outcomes))  # fmt: skip
    assert producer.flush(20) == 0
    assert outcomes and outcomes[0] is not None and outcomes[0].code() == KafkaError.INVALID_TIMESTAMP

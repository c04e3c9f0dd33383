"""Static group membership (KIP-345, ``group.instance.id``) with real confluent-kafka consumers.

One one-broker cluster for the module (the broker coordinates every group, so its log holds
every rebalance); each test has its own topic and group.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer

from sluice.clients import close_within
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
#: long enough that a restart is well inside it, so only the rules can cause a rebalance
SESSION_TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def kafka(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("static"), 1)
    try:
        yield c
    finally:
        c.down()


def create_topic(bootstrap: str, name: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)], operation_timeout=30)[name].result(timeout=40)


@dataclass
class Member:
    """A confluent-kafka consumer with its rebalance callbacks journalled."""

    consumer: Consumer
    events: list[tuple[str, list[int]]] = field(default_factory=list)
    assignment: set[int] = field(default_factory=set)
    values: list[bytes] = field(default_factory=list)
    errors: list[KafkaError] = field(default_factory=list)

    @classmethod
    def start(cls, bootstrap: str, group: str, topic: str, instance: str | None = None) -> Member:
        conf: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 300,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        if instance is not None:
            conf["group.instance.id"] = instance
        m = cls(Consumer(conf))

        def on_assign(_c: Consumer, tps: list[TopicPartition]) -> None:
            m.events.append(("assign", sorted(tp.partition for tp in tps)))
            m.assignment = {tp.partition for tp in tps}

        def on_revoke(_c: Consumer, tps: list[TopicPartition]) -> None:
            m.events.append(("revoke", sorted(tp.partition for tp in tps)))
            m.assignment = set()

        m.consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return m

    def poll(self) -> None:
        for msg in self.consumer.consume(50, timeout=0.1):
            error = msg.error()
            if error is not None:
                self.errors.append(error)
            else:
                self.values.append(bytes(msg.value() or b""))

    def close(self) -> None:
        close_within(self.consumer)


def poll_until(members: list[Member], condition: object, what: str, timeout_s: float = 20) -> None:
    def step() -> bool:
        for m in members:
            m.poll()
        return bool(condition())  # type: ignore[operator]

    wait_until(step, timeout_s, what, interval_s=0)


def rebalances(kafka: TestCluster, group: str) -> int:
    """How many rebalances of ``group`` the coordinator started (its log's one line each)."""
    return len(re.findall(rf"event=rebalance_started group={re.escape(group)} ", kafka.log_text(1)))


def produce_to_every_partition(bootstrap: str, topic: str, tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for p in range(PARTITIONS):
        producer.produce(topic, value=f"{tag}-{p}".encode(), partition=p)
    assert producer.flush(20) == 0


def split(a: Member, b: Member) -> bool:
    return bool(a.assignment) and bool(b.assignment) and a.assignment | b.assignment == set(range(PARTITIONS))


def test_a_static_member_restarted_within_its_session_gets_its_partitions_back_and_nobody_rebalances(
    kafka: TestCluster,
) -> None:
    topic = group = "static-restart"
    create_topic(kafka.bootstrap, topic)
    a = Member.start(kafka.bootstrap, group, topic, instance="static-a")
    b = Member.start(kafka.bootstrap, group, topic)
    a2: Member | None = None
    try:
        poll_until([a, b], lambda: split(a, b), "the two members to split the partitions")
        owned_by_a, events_of_b, started = set(a.assignment), list(b.events), rebalances(kafka, group)
        a.close()  # a static member sends no LeaveGroup: it stays in the group for its session
        a2 = Member.start(kafka.bootstrap, group, topic, instance="static-a")
        restarted = a2
        poll_until([restarted, b], lambda: restarted.assignment, "the restarted member's assignment")
        assert restarted.assignment == owned_by_a
        produce_to_every_partition(kafka.bootstrap, topic, "after")
        poll_until(
            [restarted, b],
            lambda: (
                len([v for m in (restarted, b) for v in m.values if v.startswith(b"after")]) == PARTITIONS
            ),
            "every partition's new record, read by its owner",
        )
        assert b.events == events_of_b, "the other member was revoked or assigned"
        assert rebalances(kafka, group) == started, "the restart made the group rebalance"
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        described = admin.describe_consumer_groups([group])[group].result(timeout=15)
        assert sorted(str(m.group_instance_id) for m in described.members) == ["None", "static-a"]
    finally:
        for m in (a2, b):
            if m is not None:
                m.close()


def test_a_second_live_member_with_the_same_instance_id_fences_the_first(kafka: TestCluster) -> None:
    topic = group = "static-fence"
    create_topic(kafka.bootstrap, topic)
    first = Member.start(kafka.bootstrap, group, topic, instance="twin")
    second: Member | None = None
    try:
        poll_until(
            [first], lambda: first.assignment == set(range(PARTITIONS)), "the first member's partitions"
        )
        second = Member.start(kafka.bootstrap, group, topic, instance="twin")
        newer = second
        poll_until([first, newer], lambda: newer.assignment and first.errors, "the newer member to take over")
        assert newer.assignment == set(range(PARTITIONS))
        # librdkafka raises FENCED_INSTANCE_ID as a fatal error: the older process must stop
        assert any(e.code() == KafkaError._FATAL and "fenced" in e.str() for e in first.errors), first.errors
    finally:
        for m in (first, second):
            if m is not None:
                m.close()


def test_leave_group_by_instance_id_removes_the_static_member_and_rebalances(kafka: TestCluster) -> None:
    topic = group = "static-leave"
    create_topic(kafka.bootstrap, topic)
    a = Member.start(kafka.bootstrap, group, topic, instance="leaver")
    b = Member.start(kafka.bootstrap, group, topic)
    try:
        poll_until([a, b], lambda: split(a, b), "the two members to split the partitions")
        with WireClient.connect(kafka.bootstrap, timeout_s=10) as w:
            answer = w.request(
                ApiKey.LEAVE_GROUP,
                4,
                {"group_id": group, "members": [{"member_id": "", "group_instance_id": "leaver"}]},
            )
        assert answer["error_code"] == ErrorCode.NONE, answer
        assert [(m["group_instance_id"], m["error_code"]) for m in answer["members"]] == [("leaver", 0)]
        poll_until(
            [b], lambda: b.assignment == set(range(PARTITIONS)), "the other member to take every partition"
        )
    finally:
        a.close()
        b.close()


def test_a_kafka_python_static_member_restarts_without_a_rebalance(kafka: TestCluster) -> None:
    """kafka-python takes Sluice for a broker of 2.3 or later (KIP-345), so it joins with the
    instance id and sends no LeaveGroup on close."""
    topic = group = "static-kafka-python"
    create_topic(kafka.bootstrap, topic)

    def start() -> KafkaConsumer:
        return KafkaConsumer(
            topic, bootstrap_servers=kafka.bootstrap, group_id=group, group_instance_id="kp",
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=300, enable_auto_commit=False,
        )  # fmt: skip

    def assigned(c: KafkaConsumer) -> set[int]:
        c.poll(timeout_ms=100)
        return {tp.partition for tp in c.assignment()}

    first = start()
    owned = wait_until(lambda: assigned(first), 20, "the member's partitions")
    started = rebalances(kafka, group)
    first.close()
    again = start()
    try:
        assert wait_until(lambda: assigned(again), 20, "the restarted member's partitions") == owned
        assert rebalances(kafka, group) == started
    finally:
        again.close()

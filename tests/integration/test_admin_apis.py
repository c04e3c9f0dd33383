"""The admin APIs real tools call (issue 19), through confluent-kafka's AdminClient (and
kafka-python's KafkaAdminClient for the calls confluent-kafka's Python client lacks:
partition reassignments, log dirs, offset deletion, producers), against one three-broker
cluster: each API does what Kafka's does, and bad input (fewer partitions than today, an unknown
config key, an offset beyond the end ...) is answered with Kafka's error code and changes nothing.

Before these APIs the brokers did not advertise them, and every call failed with
UNSUPPORTED_VERSION (librdkafka: "Broker: Unsupported version" / kafka-python:
IncompatibleBrokerVersion)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)
from kafka import TopicPartition as KTopicPartition
from kafka import errors as kafka_errors
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata

from sluice.clients import close_within
from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

#: The automatic rebalance is off here: the elections these tests ask for must be theirs
#: (tests/integration/test_leader_balance.py runs it).
SETTINGS = {"auto.leader.rebalance.enable": "false"}


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("admin-apis"), 3, broker_settings=SETTINGS)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def admin(cluster: TestCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})


@pytest.fixture(scope="module")
def kadmin(cluster: TestCluster) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def zk(cluster: TestCluster) -> Iterator[ZkStore]:
    store = ZkStore(cluster.zookeeper)
    store.start()
    try:
        yield store
    finally:
        store.stop()


def create(
    admin: AdminClient, name: str, partitions: int = 1, *, assignment: list[list[int]] | None = None
) -> None:
    topic = (
        NewTopic(name, num_partitions=len(assignment), replica_assignment=assignment)
        if assignment is not None
        else NewTopic(name, num_partitions=partitions, replication_factor=3)
    )
    admin.create_topics([topic], operation_timeout=30)[name].result(60)


def refused(future: Any) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        future.result(60)
    error = info.value.args[0]
    assert isinstance(error, KafkaError), error
    return error


def leaders(admin: AdminClient, topic: str) -> dict[int, tuple[int, list[int]]]:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return {p: (m.leader, list(m.replicas)) for p, m in md.partitions.items()}


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes], **config: Any) -> list[Any]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0, **config})
    outcome: list[Any] = []
    for value in values:
        producer.produce(
            topic, value, partition=partition, on_delivery=lambda e, m: outcome.append(e or m.offset())
        )
    producer.flush(30)
    assert len(outcome) == len(values), outcome
    return outcome


def _partition_count(wire: WireClient, topic: str) -> int:
    """How many partitions of ``topic`` the broker at the other end of ``wire`` itself knows."""
    md = wire.request(ApiKey.METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    return len(md["topics"][0]["partitions"])


def earliest(admin: AdminClient, topic: str, partition: int) -> int:
    tp = TopicPartition(topic, partition)
    return int(admin.list_offsets({tp: OffsetSpec.earliest()})[tp].result(30).offset)


def topic_configs(admin: AdminClient, topic: str) -> dict[str, Any]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return dict(admin.describe_configs([resource])[resource].result(30))


def incremental(admin: AdminClient, rtype: ResourceType, name: str, **ops: tuple[str | None, Any]) -> Any:
    resource = ConfigResource(
        rtype,
        name,
        incremental_configs=[
            ConfigEntry(key.replace("_", "."), value, incremental_operation=op)
            for key, (value, op) in ops.items()
        ],
    )
    return admin.incremental_alter_configs([resource])[resource]


# -- CreatePartitions ------------------------------------------------------------------------------


def test_create_partitions_adds_led_partitions_and_refuses_fewer(
    cluster: TestCluster, admin: AdminClient
) -> None:
    create(admin, "grow", 2)
    assert (
        admin.create_partitions([NewPartitions("grow", 4)], operation_timeout=30)["grow"].result(60) is None
    )
    parts = leaders(admin, "grow")
    assert sorted(parts) == [0, 1, 2, 3]
    assert all(leader in replicas and len(replicas) == 3 for leader, replicas in parts.values()), parts
    assert {replicas[0] for _, replicas in parts.values()} == {1, 2, 3}, (
        "new partitions spread over the brokers"
    )
    # The answer comes once the broker that handled the request has the leaders; the others learn
    # it from ZooKeeper's change notices moments later (Kafka's AdminClient documents the same
    # "shortly after"). A producer that bootstraps from one of those before then is told of two
    # partitions and fails partition 3 as unknown, so wait for every broker's own answer.
    for b in cluster.cluster.brokers:
        with WireClient.connect(b.address) as direct:
            wait_until(lambda: _partition_count(direct, "grow") == 4, 10, f"broker {b.broker_id} to know")
    assert produce(cluster.bootstrap, "grow", 3, [b"new"]) == [0]

    for count in (3, 4):  # fewer, and as many as today
        error = refused(admin.create_partitions([NewPartitions("grow", count)])["grow"])
        assert error.code() == KafkaError.INVALID_PARTITIONS, error
        assert "has 4 partition(s)" in error.str() and "nothing was changed" in error.str(), error.str()
    assert sorted(leaders(admin, "grow")) == [0, 1, 2, 3]
    error = refused(admin.create_partitions([NewPartitions("no-such-topic", 3)])["no-such-topic"])
    assert error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, error


def test_an_explicit_assignment_is_honoured_or_refused_and_validate_only_changes_nothing(
    admin: AdminClient, kadmin: KafkaAdminClient
) -> None:
    create(admin, "placed", assignment=[[1, 2]])
    future = admin.create_partitions([NewPartitions("placed", 2, replica_assignment=[[3, 1]])])["placed"]
    assert future.result(60) is None
    assert leaders(admin, "placed")[1] == (3, [3, 1])

    for assignment, why in (([[9, 1]], "not live"), ([[2, 2]], "twice"), ([[1, 2, 3]], "replication factor")):
        error = refused(
            admin.create_partitions([NewPartitions("placed", 3, replica_assignment=assignment)])["placed"]
        )
        assert error.code() == KafkaError.INVALID_REPLICA_ASSIGNMENT and why in error.str(), error.str()
    assert (
        admin.create_partitions([NewPartitions("placed", 5)], validate_only=True)["placed"].result(60) is None
    )
    assert sorted(leaders(admin, "placed")) == [0, 1], "nothing changed"

    # kafka-python, and the internal topic (whose groups are placed by its partition count).
    kadmin.create_partitions({"placed": 3})
    wait_until(lambda: sorted(leaders(admin, "placed")) == [0, 1, 2], 30, "partition 2 of placed")


# -- configs ---------------------------------------------------------------------------------------


def test_a_topic_config_change_reaches_every_replica_live_and_a_refused_one_changes_nothing(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient
) -> None:
    create(admin, "limits", assignment=[[1, 2, 3]])
    assert produce(cluster.bootstrap, "limits", 0, [b"x" * 5000]) == [0]
    ops = {
        "max_message_bytes": ("2000", AlterConfigOpType.SET),
        "retention_ms": ("3600000", AlterConfigOpType.SET),
    }
    assert incremental(admin, ResourceType.TOPIC, "limits", **ops).result(30) is None
    configs = topic_configs(admin, "limits")
    assert configs["max.message.bytes"].value == "2000"
    assert configs["max.message.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["retention.ms"].value == "3600000"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    (too_large,) = produce(cluster.bootstrap, "limits", 0, [b"x" * 5000], **{"message.timeout.ms": 10_000})
    assert isinstance(too_large, KafkaError) and too_large.code() == KafkaError.MSG_SIZE_TOO_LARGE, too_large
    for broker_id in (1, 2, 3):  # every replica's log took the change, none restarted
        wait_until(
            lambda b=broker_id: (
                "event=log_config_changed topic=limits partitions=[0]" in cluster.log_text(b)
                and "max.message.bytes': '1048588->2000'" in cluster.log_text(b)
            ),
            30,
            f"broker {broker_id} to apply the config",
        )
    # A follower that never restarted enforces it once it leads: reorder the replicas so that
    # broker 2 is preferred, then elect it.
    kadmin.alter_partition_reassignments({KTopicPartition("limits", 0): [2, 1, 3]})
    wait_until(lambda: leaders(admin, "limits")[0][1] == [2, 1, 3], 30, "the reordered replicas")
    elected = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("limits", 0)]).result(30)
    assert list(elected.values()) == [None], elected
    wait_until(lambda: leaders(admin, "limits")[0][0] == 2, 30, "broker 2 to lead")
    (too_large,) = produce(cluster.bootstrap, "limits", 0, [b"x" * 5000], **{"message.timeout.ms": 10_000})
    assert isinstance(too_large, KafkaError) and too_large.code() == KafkaError.MSG_SIZE_TOO_LARGE, too_large

    before = topic_configs(admin, "limits")
    for key, value, named in (
        ("no.such.config", "1", "'no.such.config'"),
        ("retention.ms", "soon", "'retention.ms'"),
        ("min.insync.replicas", "4", "min.insync.replicas=4"),
    ):
        error = refused(
            incremental(
                admin, ResourceType.TOPIC, "limits", **{key.replace(".", "_"): (value, AlterConfigOpType.SET)}
            )
        )
        assert error.code() == KafkaError.INVALID_CONFIG and named in error.str(), error.str()
    error = refused(
        incremental(admin, ResourceType.TOPIC, "limits", retention_ms=("5", AlterConfigOpType.APPEND))
    )
    assert error.code() == KafkaError.INVALID_CONFIG and "'retention.ms'" in error.str(), error.str()
    after = topic_configs(admin, "limits")
    assert {k: v.value for k, v in after.items()} == {k: v.value for k, v in before.items()}, (
        "nothing changed"
    )

    # DELETE returns a key to its default; AlterConfigs replaces the whole set.
    assert (
        incremental(
            admin, ResourceType.TOPIC, "limits", retention_ms=(None, AlterConfigOpType.DELETE)
        ).result(30)
        is None
    )
    assert topic_configs(admin, "limits")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    whole = ConfigResource(ResourceType.TOPIC, "limits", set_config={"retention.ms": "7200000"})
    with pytest.warns(DeprecationWarning):  # AlterConfigs is what older tools use
        assert admin.alter_configs([whole])[whole].result(30) is None
    configs = topic_configs(admin, "limits")
    assert configs["retention.ms"].value == "7200000"
    assert configs["max.message.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert produce(cluster.bootstrap, "limits", 0, [b"x" * 5000])[0] > 0, "the default limit is back, live"


def test_broker_configs_are_kept_in_zookeeper_and_applied_live(
    cluster: TestCluster, admin: AdminClient, zk: ZkStore
) -> None:
    create(admin, "defaults", assignment=[[1, 2, 3]])
    with WireClient.connect(cluster.bootstrap) as wire:  # the cluster's defaults: the empty broker name
        answer = wire.request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 4,
                        "resource_name": "",
                        "configs": [{"name": "message.max.bytes", "config_operation": 0, "value": "3000"}],
                    }
                ]
            },
        )
    assert answer["responses"][0]["error_code"] == ErrorCode.NONE, answer
    assert zk.dynamic_broker_config("<default>") == {"message.max.bytes": "3000"}
    try:
        for broker_id in (1, 2, 3):
            wait_until(
                lambda b=broker_id: "max.message.bytes': '1048588->3000'" in cluster.log_text(b),
                30,
                f"broker {broker_id} to apply the cluster default",
            )
        (too_large,) = produce(
            cluster.bootstrap, "defaults", 0, [b"x" * 5000], **{"message.timeout.ms": 10_000}
        )
        assert isinstance(too_large, KafkaError) and too_large.code() == KafkaError.MSG_SIZE_TOO_LARGE

        assert (
            incremental(
                admin, ResourceType.BROKER, "2", log_retention_ms=("7200000", AlterConfigOpType.SET)
            ).result(30)
            is None
        )
        assert zk.dynamic_broker_config("2") == {"log.retention.ms": "7200000"}
        resource = ConfigResource(ResourceType.BROKER, "2")
        described = admin.describe_configs([resource])[resource].result(30)
        assert described["log.retention.ms"].value == "7200000"
        assert described["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
        assert described["message.max.bytes"].source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
        assert described["broker.id"].is_read_only

        # Kafka's answers (tests/conformance/test_differential.py compares every key with it)
        for key, why in (
            ("num.partitions", "Cannot update these configs dynamically: num.partitions"),
            ("max.connections", "read from the brokers' configuration files"),
            ("log.retention.ms", "Invalid value soon for configuration log.retention.ms"),
        ):
            value = "soon" if key == "log.retention.ms" else "3"
            error = refused(
                incremental(
                    admin, ResourceType.BROKER, "2", **{key.replace(".", "_"): (value, AlterConfigOpType.SET)}
                )
            )
            assert error.code() == KafkaError.INVALID_REQUEST and why in error.str(), error.str()
        assert zk.dynamic_broker_config("2") == {"log.retention.ms": "7200000"}, "nothing changed"
    finally:
        done = incremental(admin, ResourceType.BROKER, "2", log_retention_ms=(None, AlterConfigOpType.DELETE))
        done.result(30)
        with WireClient.connect(cluster.bootstrap) as wire:
            wire.request(
                ApiKey.INCREMENTAL_ALTER_CONFIGS,
                1,
                {
                    "resources": [
                        {
                            "resource_type": 4,
                            "resource_name": "",
                            "configs": [{"name": "message.max.bytes", "config_operation": 1, "value": None}],
                        }
                    ]
                },
            )
    wait_until(
        lambda: all("max.message.bytes': '3000->1048588'" in cluster.log_text(b) for b in (1, 2, 3)),
        30,
        "default back",
    )


# -- DeleteRecords ----------------------------------------------------------------------------------


def test_delete_records_moves_the_log_start_on_every_replica_and_refuses_an_offset_beyond_the_end(
    cluster: TestCluster, admin: AdminClient
) -> None:
    create(admin, "trimmed", assignment=[[1, 2, 3]])
    produce(cluster.bootstrap, "trimmed", 0, [b"v%d" % i for i in range(20)])
    tp = TopicPartition("trimmed", 0, 5)
    deleted = admin.delete_records([tp], operation_timeout=30)[tp].result(30)
    assert deleted.low_watermark == 5, "answered once every replica's log start moved"
    assert earliest(admin, "trimmed", 0) == 5
    by_time = TopicPartition("trimmed", 0)
    found = admin.list_offsets({by_time: OffsetSpec.for_timestamp(0)})[by_time].result(30)
    assert found.offset == 5, "a lookup by time never answers an offset below the log start"

    beyond = TopicPartition("trimmed", 0, 21)
    error = refused(admin.delete_records([beyond])[beyond])
    assert error.code() == KafkaError.OFFSET_OUT_OF_RANGE, error
    assert earliest(admin, "trimmed", 0) == 5, "nothing changed"

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"trimmed-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "error",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        consumer.assign([TopicPartition("trimmed", 0, 2)])
        deadline = time.monotonic() + 20
        while True:
            msg = consumer.poll(2)
            assert time.monotonic() < deadline, "no answer to a read below the log start"
            if msg is not None:
                break
        assert msg.error() is not None and msg.error().code() == KafkaError._AUTO_OFFSET_RESET, msg.error()
        assert "out of range" in msg.error().str().lower(), msg.error().str()
    finally:
        close_within(consumer)

    # The followers have it (the answer waited for them): the leader stops, a follower leads
    # and answers the same log start; the leader comes back with it from its own disk.
    cluster.stop(1)
    try:
        wait_until(lambda: leaders(admin, "trimmed")[0][0] in (2, 3), 30, "a follower to lead")
        assert wait_until(lambda: earliest(admin, "trimmed", 0), 30, "the new leader's answer") == 5
    finally:
        cluster.restart(1)
    wait_until(
        lambda: (
            admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("trimmed", 0)]).result(10) is not None
            and leaders(admin, "trimmed")[0][0] == 1
        ),
        60,
        "broker 1 to lead again",
    )
    start = wait_until(lambda: earliest(admin, "trimmed", 0), 30, "the restarted leader's answer")
    assert start == 5, "the restarted leader kept its log start"


# -- ElectLeaders and reassignments ---------------------------------------------------------------


def test_preferred_elections_on_request(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient
) -> None:
    create(admin, "elected", assignment=[[1, 2, 3], [2, 3, 1]])
    tp0, tp1 = TopicPartition("elected", 0), TopicPartition("elected", 1)
    not_needed = admin.elect_leaders(ElectionType.PREFERRED, [tp0]).result(30)[tp0]
    assert not_needed is not None and not_needed.code() == KafkaError.ELECTION_NOT_NEEDED, not_needed
    unclean = admin.elect_leaders(ElectionType.UNCLEAN, [tp1]).result(30)[tp1]
    assert unclean is not None and unclean.code() == KafkaError.ELECTION_NOT_NEEDED, "broker 2 leads it"

    kadmin.alter_partition_reassignments({KTopicPartition("elected", 0): [3, 1, 2]})
    wait_until(lambda: leaders(admin, "elected")[0] == (1, [3, 1, 2]), 30, "broker 3 preferred, 1 leading")
    assert admin.elect_leaders(ElectionType.PREFERRED, [tp0]).result(30) == {tp0: None}
    wait_until(lambda: leaders(admin, "elected")[0] == (3, [3, 1, 2]), 30, "broker 3 to lead elected-0")
    produce(cluster.bootstrap, "elected", 0, [b"after the election"])
    missing = TopicPartition("elected", 7)
    answer = admin.elect_leaders(ElectionType.PREFERRED, [missing]).result(30)[missing]
    assert answer is not None and answer.code() == KafkaError.UNKNOWN_TOPIC_OR_PART, answer


def test_a_partition_reassignment_moves_replicas_and_a_refused_one_changes_nothing(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient, zk: ZkStore
) -> None:
    create(admin, "moved", assignment=[[1, 2], [2, 3]])
    kadmin.alter_partition_reassignments({KTopicPartition("moved", 0): [2, 3]})
    wait_until(lambda: leaders(admin, "moved")[0][1] == [2, 3], 30, "moved-0 on brokers 2 and 3")
    wait_until(lambda: kadmin.list_partition_reassignments() == {}, 30, "the move to end")

    with WireClient.connect(cluster.bootstrap) as wire:
        body = {
            "timeout_ms": 30000,
            "topics": [
                {
                    "name": "moved",
                    "partitions": [
                        {"partition_index": 1, "replicas": [1, 9]},  # broker 9 does not exist
                        {"partition_index": 0, "replicas": None},  # nothing to cancel
                    ],
                },
                {"name": "no-such-topic", "partitions": [{"partition_index": 0, "replicas": [1]}]},
            ],
        }
        answer = _to_broker(wire, zk.controller_id(), ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body)
    codes = {
        (t["name"], p["partition_index"]): p["error_code"]
        for t in answer["responses"]
        for p in t["partitions"]
    }
    assert codes == {
        ("moved", 1): ErrorCode.INVALID_REPLICA_ASSIGNMENT,
        ("moved", 0): ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
        ("no-such-topic", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }, answer
    assert leaders(admin, "moved")[1][1] == [2, 3] and kadmin.list_partition_reassignments() == {}


def test_an_ongoing_reassignment_is_listed_and_a_cancellation_returns_it(
    cluster: TestCluster, admin: AdminClient, zk: ZkStore
) -> None:
    """The move waits for its new replica, paused (SIGSTOP, well inside its ZooKeeper session)
    so it cannot catch up: ListPartitionReassignments shows it, and cancelling it returns the
    partition to the replicas it started from. (Requests go straight to the controller: a
    client's metadata request to the paused broker would wait.)"""
    controller = zk.controller_id()
    paused = next(b for b in (3, 2, 1) if b != controller)
    a, b = (x for x in (1, 2, 3) if x != paused)
    create(admin, "listed", assignment=[[a, b]])
    (node,) = [n for n in admin.describe_cluster().result(30).nodes if n.id == controller]

    def move(replicas: list[int] | None) -> int:
        body = {"topics": [{"name": "listed", "partitions": [{"partition_index": 0, "replicas": replicas}]}]}
        answer = wire.request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, body)
        return int(answer["responses"][0]["partitions"][0]["error_code"])

    def listed() -> list[dict[str, Any]]:
        answer = wire.request(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"topics": None})
        return [p for t in answer["topics"] if t["name"] == "listed" for p in t["partitions"]]

    with WireClient.connect(f"{node.host}:{node.port}") as wire:
        os.kill(cluster.broker(paused).pid, signal.SIGSTOP)
        try:
            assert move([a, paused]) == ErrorCode.NONE
            (ongoing,) = wait_until(
                lambda: (got := listed()) and len(got[0]["replicas"]) == 3 and got,
                10,
                "the move to be listed with the new replica added",
            )
            assert ongoing == {
                "partition_index": 0,
                "replicas": [a, b, paused],
                "adding_replicas": [paused],
                "removing_replicas": [b],
            }
            assert move(None) == ErrorCode.NONE
            wait_until(lambda: listed() == [], 10, "the cancellation to finish")
        finally:
            os.kill(cluster.broker(paused).pid, signal.SIGCONT)
    assignment = zk.topic("listed")
    assert assignment is not None and assignment.replicas[0] == (a, b), "back where it started"


def _to_broker(
    wire: WireClient, broker_id: int, key: ApiKey, version: int, body: dict[str, Any]
) -> dict[str, Any]:
    md = wire.request(ApiKey.METADATA, 8, {"topics": [], "allow_auto_topic_creation": False})
    (target,) = [b for b in md["brokers"] if b["node_id"] == broker_id]
    with WireClient.connect(f"{target['host']}:{target['port']}") as direct:
        return direct.request(key, version, body)


def test_a_broker_that_is_not_the_controller_answers_not_controller(
    cluster: TestCluster, zk: ZkStore
) -> None:
    other = next(b for b in (1, 2, 3) if b != zk.controller_id())
    with WireClient.connect(cluster.bootstrap) as wire:
        answer = _to_broker(
            wire,
            other,
            ApiKey.CREATE_PARTITIONS,
            1,
            {"topics": [{"name": "grow", "count": 9, "assignments": None}], "timeout_ms": 5000},
        )
    assert answer["results"][0]["error_code"] == ErrorCode.NOT_CONTROLLER, answer


# -- describes ------------------------------------------------------------------------------------


def test_describe_cluster_and_log_dirs(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient, zk: ZkStore
) -> None:
    described = admin.describe_cluster().result(30)  # librdkafka asks Metadata for this
    assert sorted(n.id for n in described.nodes) == [1, 2, 3]
    assert described.controller.id == zk.controller_id()
    assert described.cluster_id == zk.cluster_id()
    cluster_view = kadmin.describe_cluster()  # kafka-python asks DescribeCluster
    assert sorted(b["broker_id"] for b in cluster_view["brokers"]) == [1, 2, 3]
    assert (cluster_view["controller_id"], cluster_view["cluster_id"]) == (
        zk.controller_id(),
        zk.cluster_id(),
    )
    operations = set(cluster_view["authorized_operations"])
    assert {"ALTER", "DESCRIBE", "ALTER_CONFIGS", "IDEMPOTENT_WRITE"} <= {
        getattr(o, "name", o) for o in operations
    }, operations

    create(admin, "sized", assignment=[[1, 2, 3]])
    produce(cluster.bootstrap, "sized", 0, [b"y" * 1000 for _ in range(10)])
    sizes: dict[int, int] = {}

    def replicated() -> bool:
        # Every broker's answer: kafka-python's module-wide client skips a broker it has no
        # connection to (broker 1 restarted by an earlier test of the module), and two equal
        # sizes are not yet three.
        sizes.clear()
        for entry in kadmin.describe_log_dirs(topic_partitions={"sized": [0]}):
            (log_dir,) = entry["log_dirs"]
            assert log_dir["log_dir"].endswith(f"broker-{entry['broker']}"), log_dir
            (topic,) = log_dir["topics"]
            (partition,) = topic["partitions"]
            sizes[entry["broker"]] = partition["partition_size"]
        return sorted(sizes) == [1, 2, 3] and len(set(sizes.values())) == 1

    wait_until(replicated, 30, "the same size on every replica")
    assert sorted(sizes) == [1, 2, 3] and sizes[1] > 10_000, sizes


def test_describe_producers_shows_an_idempotent_producers_state(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient
) -> None:
    create(admin, "produced", assignment=[[1, 2, 3]])
    produce(
        cluster.bootstrap, "produced", 0, [b"a", b"b", b"c"], **{"enable.idempotence": True, "linger.ms": 0}
    )
    # (kafka-python forgets a broker whose connection closed, as broker 1's did when an earlier
    # test restarted it, until its metadata is refreshed: UnknownBrokerIdError meanwhile)
    states = wait_until(
        lambda: kadmin.describe_producers([KTopicPartition("produced", 0)]), 30, "the producer states"
    )
    (state,) = states.values()
    (producer,) = state.active_producers
    assert producer.producer_id >= 0 and producer.producer_epoch == 0
    assert producer.last_sequence == 2, "three records, sequences 0..2"
    assert producer.last_timestamp > 0


# -- OffsetDelete ----------------------------------------------------------------------------------


def test_offset_delete_removes_offsets_of_topics_the_group_no_longer_consumes(
    cluster: TestCluster, admin: AdminClient, kadmin: KafkaAdminClient
) -> None:
    create(admin, "consumed", assignment=[[1, 2, 3]])
    create(admin, "abandoned", assignment=[[2, 3, 1]])
    group = f"g-{uuid.uuid4().hex[:6]}"
    offsets = {
        KTopicPartition("abandoned", 0): OffsetAndMetadata(3, "", -1),
        KTopicPartition("consumed", 0): OffsetAndMetadata(0, "", -1),
    }
    assert set(kadmin.alter_group_offsets(group, offsets).values()) == {kafka_errors.NoError}
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "log_level": 0,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe(["consumed"])
        wait_until(
            lambda: consumer.poll(0.2) is None and consumer.assignment(), 30, "the member's assignment"
        )
        answer = kadmin.delete_group_offsets(
            group, [KTopicPartition("abandoned", 0), KTopicPartition("consumed", 0)]
        )
        errors = {tp.topic: e for tp, e in answer.items()}
        assert errors == {
            "abandoned": kafka_errors.NoError,
            "consumed": kafka_errors.GroupSubscribedToTopicError,
        }, answer
        committed = kadmin.list_group_offsets({group: None})[group]
        assert KTopicPartition("abandoned", 0) not in committed
        assert KTopicPartition("consumed", 0) in committed, "a subscribed topic's offsets stay"
    finally:
        close_within(consumer)
    with pytest.raises(kafka_errors.GroupIdNotFoundError):
        kadmin.delete_group_offsets(f"never-{uuid.uuid4().hex[:6]}", [KTopicPartition("abandoned", 0)])


# -- the newest Produce and Fetch versions ---------------------------------------------------------


def test_librdkafka_produces_with_v10_and_fetches_with_v16_by_topic_id(
    cluster: TestCluster, admin: AdminClient
) -> None:
    """Before the schemas went past Produce v9 and Fetch v12, librdkafka used those."""
    create(admin, "versions", assignment=[[1, 2, 3]])
    lines: list[str] = []
    logger = logging.getLogger(f"librdkafka-protocol-{uuid.uuid4().hex[:6]}")
    logger.addHandler(_Lines(lines))
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "debug": "protocol", "logger": logger})
    producer.produce("versions", b"hello", partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"v-{uuid.uuid4().hex[:6]}",
            "debug": "protocol",
            "logger": logger,
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition("versions", 0, 0)])
        msg = None
        deadline = time.monotonic() + 30
        while msg is None or msg.error() is not None:
            assert time.monotonic() < deadline, "nothing consumed"
            msg = consumer.poll(1)
        assert msg.value() == b"hello"
    finally:
        close_within(consumer)
    text = "\n".join(lines)
    assert "ProduceRequest (v10" in text, [line for line in lines if "Produce" in line][:5]
    assert "FetchRequest (v16" in text, [line for line in lines if "Fetch" in line][:5]

    with WireClient.connect(cluster.bootstrap) as wire:  # an id no topic has: UNKNOWN_TOPIC_ID
        unknown = uuid.uuid4()
        body = {
            "max_wait_ms": 0,
            "min_bytes": 0,
            "topics": [
                {
                    "topic_id": unknown,
                    "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1024}],
                }
            ],
        }
        answer = wire.request(ApiKey.FETCH, 13, body)
    (topic,) = answer["responses"]
    assert topic["topic_id"] == unknown and topic["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_ID


class _Lines(logging.Handler):
    """Keeps librdkafka's log lines (confluent-kafka hands them to a Python logger)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


# -- the CLI ---------------------------------------------------------------------------------------


def sluice(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "SLUICE_BOOTSTRAP": bootstrap, "COLUMNS": "200"},
    )


def test_topic_alter_and_add_partitions_from_the_cli(cluster: TestCluster, admin: AdminClient) -> None:
    create(admin, "cli-topic", assignment=[[1, 2, 3]])
    done = sluice("topic", "add-partitions", "cli-topic", "--partitions", "3", bootstrap=cluster.bootstrap)
    assert done.returncode == 0, done.stderr
    assert sorted(leaders(admin, "cli-topic")) == [0, 1, 2]
    fewer = sluice("topic", "add-partitions", "cli-topic", "--partitions", "2", bootstrap=cluster.bootstrap)
    assert fewer.returncode != 0 and "'cli-topic' has 3 partition(s) and 2 were asked for" in fewer.stderr, (
        fewer.stderr
    )

    done = sluice(
        "topic", "alter", "cli-topic", "--config", "retention.ms=60000", "--config", "max.message.bytes=5000",
        bootstrap=cluster.bootstrap,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert topic_configs(admin, "cli-topic")["retention.ms"].value == "60000"
    done = sluice(
        "topic", "alter", "cli-topic", "--delete-config", "retention.ms", bootstrap=cluster.bootstrap
    )
    assert done.returncode == 0, done.stderr
    configs = topic_configs(admin, "cli-topic")
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert configs["max.message.bytes"].value == "5000"
    bad = sluice("topic", "alter", "cli-topic", "--config", "retention.msec=1", bootstrap=cluster.bootstrap)
    assert bad.returncode != 0
    assert "unknown topic config 'retention.msec'" in bad.stderr and "nothing was changed" in bad.stderr, (
        bad.stderr
    )

"""The admin APIs under Kafka's ACLs (issue 19): a principal without the operation Kafka asks for
is refused with Kafka's code (TOPIC_, CLUSTER_ or GROUP_AUTHORIZATION_FAILED) and nothing
changes. User:ANONYMOUS (the PLAINTEXT listener's principal) may create topics, write to and
describe ``guarded``, and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.security import acl
from sluice.security.acl_store import AclStore
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(180)

ANONYMOUS = "User:ANONYMOUS"
TOPIC = "guarded"
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def grant(store: ZkStore, rtype: acl.ResourceType, name: str, *ops: acl.Operation) -> None:
    AclStore(store).add(
        acl.AclBinding(
            acl.ResourcePattern(rtype, name), acl.AccessControlEntry(ANONYMOUS, "*", op, acl.Permission.ALLOW)
        )
        for op in ops
    )


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    settings = {"authorizer.class.name": acl.AclAuthorizer.CLASS_NAME, "super.users": "User:admin"}
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("admin-acls"), 1, broker_settings=settings)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def zk(cluster: TestCluster) -> Iterator[ZkStore]:
    store = ZkStore(cluster.zookeeper)
    store.start()
    try:
        yield store
    finally:
        store.stop()


@pytest.fixture(scope="module")
def wire(cluster: TestCluster, zk: ZkStore) -> Iterator[WireClient]:
    grant(zk, acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, acl.Operation.CREATE)
    grant(zk, acl.ResourceType.TOPIC, TOPIC, acl.Operation.WRITE)  # WRITE implies DESCRIBE
    with WireClient.connect(cluster.bootstrap) as w:
        topic = {"name": TOPIC, "num_partitions": 1, "replication_factor": 1}
        wait_until(
            lambda: (
                w.request(ApiKey.CREATE_TOPICS, 5, {"topics": [topic], "timeout_ms": 30000})["topics"][0][
                    "error_code"
                ]
                in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)
            ),
            30,
            "CREATE on the cluster to take effect",
        )
        produced = w.request(
            ApiKey.PRODUCE,
            8,
            {
                "acks": -1,
                "timeout_ms": 10000,
                "topic_data": [
                    {
                        "name": TOPIC,
                        "partition_data": [{"index": 0, "records": build_batch([(None, b"v")] * 5)}],
                    }
                ],
            },
        )
        assert produced["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE, produced
        yield w


def earliest(w: WireClient) -> int:
    r = w.request(
        ApiKey.LIST_OFFSETS,
        5,
        {
            "replica_id": -1,
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -2}]}],
        },
    )
    return int(r["topics"][0]["partitions"][0]["offset"])


def alter_config(w: WireClient, rtype: int, name: str, key: str, value: str) -> dict[str, Any]:
    return w.request(
        ApiKey.INCREMENTAL_ALTER_CONFIGS,
        1,
        {
            "resources": [
                {
                    "resource_type": rtype,
                    "resource_name": name,
                    "configs": [{"name": key, "config_operation": 0, "value": value}],
                }
            ]
        },
    )["responses"][0]


def test_topic_operations_without_their_acl_are_refused_and_change_nothing(
    cluster: TestCluster, zk: ZkStore, wire: WireClient
) -> None:
    grown = wire.request(
        ApiKey.CREATE_PARTITIONS,
        1,
        {"topics": [{"name": TOPIC, "count": 3, "assignments": None}], "timeout_ms": 5000},
    )
    assert grown["results"][0]["error_code"] == TOPIC_DENIED, "CreatePartitions needs ALTER on the topic"
    assert alter_config(wire, 2, TOPIC, "retention.ms", "1000")["error_code"] == TOPIC_DENIED
    whole = wire.request(
        ApiKey.ALTER_CONFIGS,
        1,
        {
            "resources": [
                {
                    "resource_type": 2,
                    "resource_name": TOPIC,
                    "configs": [{"name": "retention.ms", "value": "1"}],
                }
            ]
        },
    )
    assert whole["responses"][0]["error_code"] == TOPIC_DENIED, (
        "AlterConfigs needs ALTER_CONFIGS on the topic"
    )
    deleted = wire.request(
        ApiKey.DELETE_RECORDS,
        1,
        {
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 3}]}],
            "timeout_ms": 5000,
        },
    )
    assert deleted["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED, "DeleteRecords needs DELETE"
    producers = wire.request(
        ApiKey.DESCRIBE_PRODUCERS, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0]}]}
    )
    assert producers["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED, (
        "DescribeProducers needs READ"
    )
    topic_id = zk.topic(TOPIC).topic_id  # type: ignore[union-attr]
    fetched = wire.request(
        ApiKey.FETCH,
        13,
        {
            "max_wait_ms": 0,
            "min_bytes": 0,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 16}],
                }
            ],
        },
    )
    (answer,) = fetched["responses"]
    assert answer["partitions"][0]["error_code"] == TOPIC_DENIED, (
        "a Fetch naming the topic by id needs READ too"
    )
    assert not answer["partitions"][0]["records"]

    assignment = zk.topic(TOPIC)
    assert (
        assignment is not None and assignment.partition_count == 1 and "retention.ms" not in assignment.config
    )
    assert earliest(wire) == 0, "no record was deleted"

    grant(zk, acl.ResourceType.TOPIC, TOPIC, acl.Operation.ALTER, acl.Operation.DELETE)
    wait_until(
        lambda: (
            wire.request(
                ApiKey.CREATE_PARTITIONS,
                1,
                {"topics": [{"name": TOPIC, "count": 2, "assignments": None}], "timeout_ms": 10000},
            )["results"][0]["error_code"]
            == ErrorCode.NONE
        ),
        20,
        "ALTER on the topic to let CreatePartitions through",
    )
    deleted = wire.request(
        ApiKey.DELETE_RECORDS,
        1,
        {
            "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 3}]}],
            "timeout_ms": 5000,
        },
    )
    assert deleted["topics"][0]["partitions"][0] == {
        "partition_index": 0,
        "low_watermark": 3,
        "error_code": 0,
    }


def test_cluster_operations_without_their_acl_are_refused_and_change_nothing(
    cluster: TestCluster, zk: ZkStore, wire: WireClient
) -> None:
    elected = wire.request(
        ApiKey.ELECT_LEADERS,
        1,
        {"election_type": 0, "topic_partitions": [{"topic": TOPIC, "partitions": [0]}]},
    )
    assert elected["error_code"] == CLUSTER_DENIED, "ElectLeaders needs ALTER on the cluster"
    assert elected["replica_election_results"][0]["partition_result"][0]["error_code"] == CLUSTER_DENIED
    moved = wire.request(
        ApiKey.ALTER_PARTITION_REASSIGNMENTS,
        0,
        {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "replicas": [1]}]}]},
    )
    assert moved["error_code"] == CLUSTER_DENIED, "AlterPartitionReassignments needs ALTER on the cluster"
    listed = wire.request(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, {"topics": None})
    assert listed["error_code"] == CLUSTER_DENIED, "ListPartitionReassignments needs DESCRIBE on the cluster"
    # DescribeCluster needs no ACL in Kafka (like Metadata); its authorized operations are 0
    # without DESCRIBE on the cluster (the differential authorization suite)
    described = wire.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})
    assert described["error_code"] == ErrorCode.NONE and described["brokers"], described
    # 0 although the principal has CREATE on the cluster: no DESCRIBE, no operations shown
    assert described["cluster_authorized_operations"] == 0
    log_dirs = wire.request(ApiKey.DESCRIBE_LOG_DIRS, 3, {"topics": None})
    assert (log_dirs["error_code"], log_dirs["results"]) == (CLUSTER_DENIED, [])
    broker = alter_config(wire, 4, "1", "log.retention.ms", "1000")
    assert broker["error_code"] == CLUSTER_DENIED, "a broker's configs need ALTER_CONFIGS on the cluster"
    assert zk.dynamic_broker_config("1") == {} and zk.reassignment_request() is None

    grant(zk, acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, acl.Operation.DESCRIBE)
    wait_until(
        lambda: (
            wire.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": True})[
                "cluster_authorized_operations"
            ]
            == (1 << acl.Operation.DESCRIBE) | (1 << acl.Operation.CREATE)
        ),
        20,
        "DESCRIBE on the cluster to show in DescribeCluster's authorized operations",
    )


def test_offset_delete_needs_delete_on_the_group_and_read_on_the_topic(zk: ZkStore, wire: WireClient) -> None:
    group = f"g-{uuid.uuid4().hex[:6]}"
    body = {"group_id": group, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}]}
    refused = wire.request(ApiKey.OFFSET_DELETE, 0, body)
    assert refused["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED, refused
    grant(zk, acl.ResourceType.GROUP, group, acl.Operation.DELETE)

    def topic_refused() -> bool:
        answer = wire.request(ApiKey.OFFSET_DELETE, 0, body)
        return (
            answer["error_code"] == ErrorCode.NONE
            and answer["topics"][0]["partitions"][0]["error_code"] == TOPIC_DENIED
        )

    wait_until(topic_refused, 20, "DELETE on the group to take effect, READ on the topic still missing")

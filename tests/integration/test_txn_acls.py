"""Authorization of transactions with Kafka's ACL model (one broker, the authorizer on): every
refusal a transactional or idempotent producer can meet, one test each, on the wire with
Kafka's error codes; and the same flow with every grant in place, through confluent-kafka, so
each refusal is shown to come from the missing ACL alone.

The principal is the PLAINTEXT listener's, User:ANONYMOUS. It may create topics and describe
them; each test grants what it needs beyond that.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.security import acl
from sluice.security.acl_store import AclStore
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until
from tests.support.transactions import read_values, wait_stable

pytestmark = pytest.mark.timeout(180)

ANONYMOUS = "User:ANONYMOUS"
RT, OP = acl.ResourceType, acl.Operation
SETTINGS = {
    "authorizer.class.name": acl.AclAuthorizer.CLASS_NAME,
    "super.users": "User:admin",
    "transaction.state.log.num.partitions": "2",
    "offsets.topic.num.partitions": "2",
}


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("txn-acls"), 1, broker_settings=SETTINGS)
    try:
        grant(c, RT.CLUSTER, acl.CLUSTER_NAME, OP.CREATE)
        grant(c, RT.TOPIC, "*", OP.DESCRIBE)
        for name in ("writable", "closed"):
            wait_until(lambda n=name: create_topic(c, n), 30, f"topic {name} created (CREATE applied)")
        grant(c, RT.TOPIC, "writable", OP.WRITE, OP.READ)
        yield c
    finally:
        c.down()


def create_topic(cluster: TestCluster, name: str) -> bool:
    with WireClient.connect(cluster.bootstrap, timeout_s=30) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            5,
            {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout_ms": 30000},
        )
    return r["topics"][0]["error_code"] in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)


def grant(cluster: TestCluster, rtype: acl.ResourceType, name: str, *ops: acl.Operation) -> None:
    """Add ALLOW ACLs for User:ANONYMOUS (the broker applies them from its watch: a request
    relying on one is retried until it does)."""
    zk = ZkStore(cluster.zookeeper)
    zk.start()
    try:
        AclStore(zk).add(
            acl.AclBinding(
                acl.ResourcePattern(rtype, name),
                acl.AccessControlEntry(ANONYMOUS, "*", op, acl.Permission.ALLOW),
            )
            for op in ops
        )
    finally:
        zk.stop()


def wire(cluster: TestCluster) -> WireClient:
    return WireClient.connect(cluster.bootstrap, timeout_s=30)


def init_pid(w: WireClient, txn_id: str | None) -> dict[str, Any]:
    return w.request(
        ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": txn_id, "transaction_timeout_ms": 60000}
    )


def initialised(cluster: TestCluster, txn_id: str) -> tuple[int, int]:
    """WRITE on ``txn_id`` granted and a producer id taken for it (retrying while the
    coordinator's partition is created and loaded)."""
    grant(cluster, RT.TRANSACTIONAL_ID, txn_id, OP.WRITE)

    def attempt() -> tuple[int, int] | None:
        with wire(cluster) as w:
            # FindCoordinator first, as clients do: it creates __transaction_state.
            if w.request(ApiKey.FIND_COORDINATOR, 3, {"key": txn_id, "key_type": 1})["error_code"]:
                return None
            r = init_pid(w, txn_id)
        return (r["producer_id"], r["producer_epoch"]) if r["error_code"] == ErrorCode.NONE else None

    return wait_until(attempt, 60, f"a producer id for {txn_id}")


def add_partitions(w: WireClient, txn_id: str, pid: int, epoch: int, topic: str) -> dict[str, int]:
    r = w.request(
        ApiKey.ADD_PARTITIONS_TO_TXN,
        3,
        {
            "v3_and_below_transactional_id": txn_id,
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [0]}],
        },
    )
    return {
        t["name"]: t["results_by_partition"][0]["partition_error_code"]
        for t in r["results_by_topic_v3_and_below"]
    }


def test_init_producer_id_needs_write_on_the_transactional_id(cluster: TestCluster) -> None:
    with wire(cluster) as w:
        assert init_pid(w, "never-granted")["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_find_coordinator_needs_describe_on_the_transactional_id(cluster: TestCluster) -> None:
    with wire(cluster) as w:
        r = w.request(ApiKey.FIND_COORDINATOR, 3, {"key": "never-granted", "key_type": 1})
    assert r["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_add_partitions_needs_write_on_each_topic(cluster: TestCluster) -> None:
    pid, epoch = initialised(cluster, "adds")
    with wire(cluster) as w:
        assert add_partitions(w, "adds", pid, epoch, "closed") == {
            "closed": ErrorCode.TOPIC_AUTHORIZATION_FAILED
        }
        assert add_partitions(w, "adds", pid, epoch, "writable") == {"writable": ErrorCode.NONE}


def test_add_offsets_needs_read_on_the_group(cluster: TestCluster) -> None:
    pid, epoch = initialised(cluster, "offsets")
    body = {
        "transactional_id": "offsets",
        "producer_id": pid,
        "producer_epoch": epoch,
        "group_id": "closed-group",
    }
    with wire(cluster) as w:
        assert (
            w.request(ApiKey.ADD_OFFSETS_TO_TXN, 3, body)["error_code"]
            == ErrorCode.GROUP_AUTHORIZATION_FAILED
        )


def test_txn_offset_commit_needs_read_on_each_topic_and_the_group(cluster: TestCluster) -> None:
    pid, epoch = initialised(cluster, "commits")
    grant(cluster, RT.GROUP, "commit-group", OP.READ)

    def commit(group: str, topic: str) -> int:
        body = {
            "transactional_id": "commits",
            "group_id": group,
            "producer_id": pid,
            "producer_epoch": epoch,
            "topics": [
                {
                    "name": topic,
                    "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_metadata": None}],
                }
            ],
        }
        with wire(cluster) as w:
            r = w.request(ApiKey.TXN_OFFSET_COMMIT, 3, body)
        return int(r["topics"][0]["partitions"][0]["error_code"])

    wait_until(
        lambda: commit("commit-group", "closed") == ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        10,
        "the group's READ to apply, leaving the topic's refusal",
    )
    assert commit("other-group", "writable") == ErrorCode.GROUP_AUTHORIZATION_FAILED


def test_end_txn_needs_write_on_the_transactional_id(cluster: TestCluster) -> None:
    body = {"transactional_id": "never-granted", "producer_id": 1, "producer_epoch": 0, "committed": True}
    with wire(cluster) as w:
        assert (
            w.request(ApiKey.END_TXN, 3, body)["error_code"]
            == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )


def test_transactional_records_need_write_on_the_transactional_id(cluster: TestCluster) -> None:
    """WRITE on the topic is not enough for a transactional batch: the request's transactional
    id must be writable too (and a transactional batch without one is refused the same way)."""
    records = build_batch(
        [(None, b"v")], producer_id=77, producer_epoch=0, base_sequence=0, transactional=True
    )
    for txn_id in ("never-granted", None):
        body = {
            "transactional_id": txn_id,
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [{"name": "writable", "partition_data": [{"index": 0, "records": records}]}],
        }
        with wire(cluster) as w:
            r = w.request(ApiKey.PRODUCE, 8, body)
        assert (
            r["responses"][0]["partition_responses"][0]["error_code"]
            == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        )


def test_write_txn_markers_is_for_brokers_only(cluster: TestCluster) -> None:
    """A client without CLUSTER_ACTION cannot end anyone's transaction with a marker."""
    body = {
        "markers": [
            {
                "producer_id": 5,
                "producer_epoch": 0,
                "transaction_result": True,
                "topics": [{"name": "writable", "partition_indexes": [0]}],
                "coordinator_epoch": 0,
            }
        ]
    }
    with wire(cluster) as w:
        r = w.request(ApiKey.WRITE_TXN_MARKERS, 1, body)
    assert (
        r["markers"][0]["topics"][0]["partitions"][0]["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    )


def test_with_every_grant_a_transactional_producer_commits(cluster: TestCluster) -> None:
    """The positive control: WRITE on the id and the topic is all confluent-kafka's producer
    needs; without the id's WRITE its init_transactions fails with the authorization error."""
    refused = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": "control-refused", "log_level": 0}
    )
    with pytest.raises(KafkaException, match=r"TRANSACTIONAL_ID_AUTHORIZATION_FAILED|authoriz"):
        refused.init_transactions(20)
    initialised(cluster, "control")  # granted, and applied
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "control", "log_level": 0})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce("writable", value=b"granted", partition=0)
    p.commit_transaction(30)
    grant(cluster, RT.GROUP, "reader-read_committed", OP.READ)  # the reader's group, found by librdkafka
    wait_stable(cluster.bootstrap, "writable", 1)
    wait_until(
        lambda: b"granted" in read_values(cluster.bootstrap, "writable", [0], "read_committed"),
        30,
        "the committed record read back",
    )


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic(cluster: TestCluster) -> None:
    """KIP-679: WRITE on any topic is enough (granted on "writable" by the fixture); without any
    it takes IDEMPOTENT_WRITE on the cluster. Here, a DENY of WRITE on every topic takes the
    topic route away first (last in the module: the DENY's removal reaches the broker later)."""
    with wire(cluster) as w:
        wait_until(lambda: init_pid(w, None)["error_code"] == ErrorCode.NONE, 10, "WRITE on a topic to count")
    zk = ZkStore(cluster.zookeeper)
    zk.start()
    deny = acl.AclBinding(
        acl.ResourcePattern(RT.TOPIC, "*", acl.PatternType.LITERAL),
        acl.AccessControlEntry(ANONYMOUS, "*", OP.WRITE, acl.Permission.DENY),
    )
    try:
        AclStore(zk).add([deny])
        with wire(cluster) as w:
            wait_until(
                lambda: init_pid(w, None)["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                10,
                "InitProducerId refused without IDEMPOTENT_WRITE",
            )
        grant(cluster, RT.CLUSTER, acl.CLUSTER_NAME, OP.IDEMPOTENT_WRITE)
        with wire(cluster) as w:
            wait_until(
                lambda: init_pid(w, None)["error_code"] == ErrorCode.NONE, 10, "IDEMPOTENT_WRITE to count"
            )
    finally:
        AclStore(zk).remove(
            [
                acl.AclBindingFilter(
                    RT.TOPIC, "*", acl.PatternType.LITERAL, ANONYMOUS, "*", OP.WRITE, acl.Permission.DENY
                )
            ]
        )
        zk.stop()

"""ACLs on a real broker with the authorizer on (issue 17): the PLAINTEXT listener's principal,
User:ANONYMOUS, given READ on one topic only, cannot produce to it, does not see the other
topic, cannot use a group or create a topic; ACLs added and removed with `sluice acl` reach the
running broker through its watch; confluent-kafka's AdminClient creates, describes and deletes
ACLs; DescribeConfigs shows no ZooKeeper address."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.security import acl
from sluice.security.acl_store import AclStore
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

ANONYMOUS = "User:ANONYMOUS"
AUTHORIZER = {"authorizer.class.name": acl.AclAuthorizer.CLASS_NAME, "super.users": "User:admin"}


@contextmanager
def acl_store(cluster: TestCluster) -> Iterator[AclStore]:
    zk = ZkStore(cluster.zookeeper)
    zk.start()
    try:
        yield AclStore(zk)
    finally:
        zk.stop()


def grant(cluster: TestCluster, rtype: acl.ResourceType, name: str, *ops: acl.Operation) -> None:
    with acl_store(cluster) as store:
        store.add(
            acl.AclBinding(
                acl.ResourcePattern(rtype, name),
                acl.AccessControlEntry(ANONYMOUS, "*", op, acl.Permission.ALLOW),
            )
            for op in ops
        )


def sluice_acl(cluster: TestCluster, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "acl", *args, "--zookeeper", cluster.zookeeper],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def metadata(w: WireClient, topics: list[str] | None) -> dict[str, int]:
    r = w.request(
        ApiKey.METADATA,
        8,
        {
            "topics": None if topics is None else [{"name": t} for t in topics],
            "allow_auto_topic_creation": False,
        },
    )
    return {t["name"]: t["error_code"] for t in r["topics"]}


def create_topic(w: WireClient, name: str) -> int:
    r = w.request(
        ApiKey.CREATE_TOPICS,
        5,
        {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout_ms": 30000},
    )
    return int(r["topics"][0]["error_code"])


def produce(w: WireClient, name: str) -> int:
    r = w.request(
        ApiKey.PRODUCE,
        8,
        {
            "acks": -1,
            "timeout_ms": 5000,
            "topic_data": [{"name": name, "partition_data": [{"index": 0, "records": b"\x00" * 70}]}],
        },
    )
    return int(r["responses"][0]["partition_responses"][0]["error_code"])


def deliveries(bootstrap: str, topic: str) -> Callable[[], Any]:
    """A confluent-kafka produce of one record: its delivery error's code, or its offset."""

    def attempt() -> Any:
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 5000})
        outcome: list[Any] = []
        producer.produce(topic, b"v", on_delivery=lambda e, m: outcome.append(e.code() if e else m.offset()))
        producer.flush(10)
        return outcome[0] if outcome else None

    return attempt


def test_a_principal_with_only_read_on_one_topic_is_refused_everything_else(
    make_cluster: Callable[..., TestCluster],
) -> None:
    c = make_cluster(1, broker_settings=AUTHORIZER)
    grant(c, acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, acl.Operation.CREATE)  # to set the topics up
    with WireClient.connect(c.bootstrap) as w:
        wait_until(lambda: create_topic(w, "a") == ErrorCode.NONE, 30, "topic a created")
        assert create_topic(w, "b") == ErrorCode.NONE
        out = sluice_acl(c, "remove", "--cluster", "--allow-principal", ANONYMOUS, "--operation", "Create")
        assert "removed=1" in out and "operation=CREATE" in out, out
        wait_until(
            lambda: create_topic(w, "c") == ErrorCode.TOPIC_AUTHORIZATION_FAILED, 20, "CREATE taken back"
        )
        assert metadata(w, None) == {}  # no DESCRIBE on anything: no topic is shown

        out = sluice_acl(c, "add", "--allow-principal", ANONYMOUS, "--operation", "Read", "--topic", "a")
        assert "added=1" in out, out
        wait_until(lambda: metadata(w, None) == {"a": ErrorCode.NONE}, 20, "READ on a to take effect")
        # b is not shown, and named it is refused as a topic that may not exist would be
        assert metadata(w, ["b"]) == {"b": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert metadata(w, ["nothing-here"]) == {"nothing-here": ErrorCode.TOPIC_AUTHORIZATION_FAILED}
        assert produce(w, "a") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        coordinator = w.request(ApiKey.FIND_COORDINATOR, 2, {"key": "g", "key_type": 0})
        assert coordinator["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
        joined = w.request(
            ApiKey.JOIN_GROUP,
            5,
            {
                "group_id": "g",
                "session_timeout_ms": 10000,
                "rebalance_timeout_ms": 10000,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        )
        assert joined["error_code"] == ErrorCode.GROUP_AUTHORIZATION_FAILED
        configs = w.request(
            ApiKey.DESCRIBE_CONFIGS,
            1,
            {"resources": [{"resource_type": 4, "resource_name": "1", "configuration_keys": None}]},
        )
        assert configs["results"][0]["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    # A real client sees the same refusal; WRITE added with the CLI then lets it through.
    assert deliveries(c.bootstrap, "a")() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    sluice_acl(c, "add", "--allow-principal", ANONYMOUS, "--operation", "Write", "--topic", "a")
    wait_until(
        lambda: isinstance(deliveries(c.bootstrap, "a")(), int) or None, 30, "WRITE on a to take effect"
    )
    assert "principal=User:ANONYMOUS host=* operation=WRITE permission=ALLOW" in sluice_acl(
        c, "list", "--topic", "a"
    )

    grant(c, acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, acl.Operation.DESCRIBE_CONFIGS)
    with WireClient.connect(c.bootstrap) as w:

        def broker_configs() -> list[str] | None:
            r = w.request(
                ApiKey.DESCRIBE_CONFIGS,
                1,
                {"resources": [{"resource_type": 4, "resource_name": "1", "configuration_keys": None}]},
            )
            result = r["results"][0]
            return [e["name"] for e in result["configs"]] if result["error_code"] == ErrorCode.NONE else None

        names = wait_until(broker_configs, 20, "DESCRIBE_CONFIGS on the cluster to take effect")
        assert "log.dirs" in names and "zookeeper.connect" not in names, names


def test_admin_client_creates_describes_and_deletes_acls(make_cluster: Callable[..., TestCluster]) -> None:
    c = make_cluster(1, broker_settings=AUTHORIZER)
    admin = AdminClient({"bootstrap.servers": c.bootstrap, "log_level": 3})
    everything = AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY, AclPermissionType.ANY
    )
    bob = AclBinding(
        ResourceType.TOPIC,
        "orders.",
        ResourcePatternType.PREFIXED,
        "User:bob",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    # Without ALTER and DESCRIBE on the cluster: refused (librdkafka drops DescribeAcls' error and
    # returns an empty list, so that one is read on the wire).
    (refused,) = admin.create_acls([bob], request_timeout=20).values()
    with pytest.raises(KafkaException) as caught:
        refused.result()
    assert caught.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    with WireClient.connect(c.bootstrap) as w:
        answer = w.request(
            ApiKey.DESCRIBE_ACLS,
            1,
            {"resource_type_filter": 1, "pattern_type_filter": 1, "operation": 1, "permission_type": 1},
        )
        assert answer["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    grant(c, acl.ResourceType.CLUSTER, acl.CLUSTER_NAME, acl.Operation.ALTER, acl.Operation.DESCRIBE)
    wait_until(
        lambda: len(admin.describe_acls(everything, request_timeout=20).result()) == 2,
        30,
        "the grant to arrive",
    )

    deny = AclBinding(
        ResourceType.GROUP,
        "audit",
        ResourcePatternType.LITERAL,
        "User:bob",
        "10.1.2.3",
        AclOperation.ALL,
        AclPermissionType.DENY,
    )
    wait_until(
        lambda: admin.describe_acls(everything, request_timeout=20).result() is not None, 30, "DESCRIBE"
    )
    for future in admin.create_acls([bob, deny], request_timeout=20).values():
        assert future.result() is None
    described = admin.describe_acls(everything, request_timeout=20).result()
    assert bob in described and deny in described
    assert len(described) == 4  # with ANONYMOUS's ALTER and DESCRIBE on the cluster

    bobs = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        "User:bob",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    (deleted_future,) = admin.delete_acls([bobs], request_timeout=20).values()
    assert sorted(map(str, deleted_future.result())) == sorted(map(str, [bob, deny]))
    left = admin.describe_acls(everything, request_timeout=20).result()
    assert bob not in left and deny not in left and len(left) == 2
    listed = sluice_acl(c, "list")
    assert "User:bob" not in listed and listed.count("principal=User:ANONYMOUS") == 2, listed

"""Deleting topics: the internal offsets topic cannot be deleted; a topic deleted and created again
under the same name never gets the old topic's records back."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from sluice.broker.group_placement import OFFSETS_TOPIC
from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(180)


def sluice(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "SLUICE_BOOTSTRAP": bootstrap, "COLUMNS": "200"},
    )


def test_internal_offsets_topic_cannot_be_deleted(cluster: TestCluster) -> None:
    """Before the guard, DeleteTopics removed __consumer_offsets (every group's committed offsets
    with it): ``Failed: DID NOT RAISE <class 'cimpl.KafkaException'>``."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    admin.describe_consumer_groups(["lifecycle"])  # FindCoordinator creates the offsets topic
    wait_until(lambda: OFFSETS_TOPIC in admin.list_topics(timeout=5).topics, 30, "the offsets topic")

    future = admin.delete_topics([OFFSETS_TOPIC], operation_timeout=30)[OFFSETS_TOPIC]
    with pytest.raises(KafkaException) as refused:
        future.result()
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused.value
    with WireClient.connect(cluster.bootstrap) as wire:  # DeleteTopics v6 carries the message
        body = {"topics": [{"name": OFFSETS_TOPIC, "topic_id": uuid.UUID(int=0)}], "timeout_ms": 30000}
        (answer,) = wire.request(ApiKey.DELETE_TOPICS, 6, body)["responses"]
    assert answer["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "internal topic and cannot be deleted" in answer["error_message"], answer

    cli = sluice("topic", "delete", OFFSETS_TOPIC, bootstrap=cluster.bootstrap)
    assert cli.returncode != 0
    assert "internal topic and cannot be deleted" in cli.stderr, cli.stderr

    # An operator writing the deletion request to ZooKeeper by hand gets the same answer from
    # the controller: the request is dropped, the topic stays.
    store = ZkStore(cluster.zookeeper)
    store.start()
    try:
        store.mark_topic_for_deletion(OFFSETS_TOPIC)
        wait_until(lambda: not store.topics_marked_for_deletion(), 30, "the controller to drop the request")
        assert store.topic(OFFSETS_TOPIC) is not None
    finally:
        store.stop()
    assert OFFSETS_TOPIC in admin.list_topics(timeout=5).topics
    assert "event=internal_topic_deletion_refused" in cluster.log_text(1)

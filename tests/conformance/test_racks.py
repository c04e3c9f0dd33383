"""Racks and follower fetching (KIP-392) compared with Apache Kafka (issue 33, item 7).

Two brokers on each side, each in a rack of its own (Sluice: ``cluster up --rack 1=r1 --rack
2=r2``; the Kafka peer: ``broker.rack=r{id}``), both with Kafka's rack-aware replica selector
(``replica.selector.class``). The same requests go to both: the racks Metadata and DescribeCluster
answer, the replica a leader points a consumer in each rack at, what a follower serves, and a
librdkafka consumer with ``client.rack`` reading everything through the follower of its rack.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from sluice.broker.config import RACK_AWARE_SELECTOR
from sluice.clients import close_within
from sluice.ops import launcher
from sluice.peers.kafka import PeerError, kafka_libs, peer_down, peer_up
from sluice.protocol.api import ApiKey
from sluice.sync.wire_client import WireClient
from tests.conformance.differential.wire import (
    _broker,
    _create,
    _fetch_at,
    _leader,
    _metadata,
    _produce_acks_all,
)
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

RACKS = {1: "r1", 2: "r2"}


@pytest.fixture(scope="module")
def sluice(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    c = TestCluster(
        zookeeper,
        tmp_path_factory.mktemp("racks-sluice"),
        2,
        broker_settings={"replica.selector.class": RACK_AWARE_SELECTOR},
        racks=RACKS,
    )
    try:
        yield c.bootstrap
    finally:
        c.down()


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    try:
        kafka_libs()
    except PeerError:
        yield None
        return
    directory = tmp_path_factory.mktemp("racks-kafka")
    cluster = peer_up(
        directory, 2, properties={"broker.rack": "r{id}", "replica.selector.class": RACK_AWARE_SELECTOR}
    )
    try:
        yield cluster.bootstrap_servers
    finally:
        peer_down(directory)


def test_cluster_up_takes_one_rack_per_broker_and_refuses_a_stranger() -> None:
    assert launcher.broker_racks(["1=us-east-1a", "2=us-east-1b"]) == {1: "us-east-1a", 2: "us-east-1b"}
    from sluice.properties import ConfigError

    for bad in (["1"], ["x=a"], ["1="], ["1=a", "1=b"]):
        with pytest.raises(ConfigError, match="--rack"):
            launcher.broker_racks(bad)


def observe(bootstrap: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        meta = w.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
        described = w.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
    seen["metadata-racks"] = sorted([b["node_id"], b["rack"]] for b in meta["brokers"])
    seen["describe-cluster-racks"] = sorted([b["broker_id"], b["rack"]] for b in described["brokers"])
    topic = "follow-me"
    seen["create"] = _create(bootstrap, topic, replicas=[1, 2])
    leader_address, leader, _, topic_id = _leader(bootstrap, topic)
    seen["leader"] = leader
    seen["produce"] = _produce_acks_all(leader_address, topic, 5)
    follower_address = _broker(_metadata(bootstrap, topic), 2)
    # the follower is in the ISR with everything (its high watermark caught up)
    wait_until(
        lambda: _fetch_at(follower_address, 11, topic, topic_id)["high_watermark"] == 5, 20, "the follower"
    )
    for rack in ("r1", "r2", "", "elsewhere"):
        seen[f"leader-fetch-rack-{rack}"] = _fetch_at(leader_address, 11, topic, topic_id, rack=rack)
    seen["follower-fetch-rack-r2"] = _fetch_at(follower_address, 12, topic, topic_id, rack="r2")
    seen["follower-fetch-v10"] = _fetch_at(follower_address, 10, topic, topic_id)
    seen["consumer-in-r2"] = _consume_in_rack(bootstrap, topic, "r2", 5)
    return seen


def _consume_in_rack(bootstrap: str, topic: str, rack: str, count: int) -> list[Any]:
    """A librdkafka consumer with client.rack: every record, read through the replica its
    rack was pointed at."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"rack-{rack}", "client.rack": rack,
         "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 0}
    )  # fmt: skip
    got: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append([msg.offset(), msg.value()])
    finally:
        close_within(consumer)
    return got


def test_follower_fetching_answered_as_kafka_answers_it(sluice: str, kafka: str | None) -> None:
    """Before, Sluice had no replica selector (replica.selector.class was an unknown key) and no
    follower served a consumer: a leader named no preferred replica for a consumer in the
    follower's rack, and the follower answered NOT_LEADER_OR_FOLLOWER to Fetch v12."""
    sluice_seen = observe(sluice)
    if kafka is None:
        pytest.skip(f"the Sluice side ran: {sluice_seen}; Kafka's jars are not fetched (scripts/peers.sh)")
    kafka_seen = observe(kafka)
    assert kafka_seen["leader-fetch-rack-r2"]["preferred_read_replica"] == 2
    assert kafka_seen["follower-fetch-rack-r2"]["records"] == 5
    assert sluice_seen == kafka_seen

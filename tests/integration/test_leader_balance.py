"""Leadership goes back where it belongs (issue 19): after a broker restarts, the controller's
automatic rebalance (``auto.leader.rebalance.enable``, checked every second here) gives it back
the partitions it is the preferred replica of; and an unclean election asked for over the wire
(ElectLeaders UNCLEAN, KIP-460) brings back a partition whose in-sync replicas are all gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import ElectionType, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.cluster.zkstore import ZkStore
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

SETTINGS = {
    "auto.leader.rebalance.enable": "true",
    "leader.imbalance.check.interval.seconds": "1",
    "leader.imbalance.per.broker.percentage": "10",
}
#: How long leadership may take to come back: the restarted broker catches up and rejoins the
#: ISR (a fetch or two), then the next check (every second) elects it.
REBALANCE_BOUND_S = 20


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("leader-balance"), 3, broker_settings=SETTINGS)
    try:
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def admin(cluster: TestCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})


def states(cluster: TestCluster, topic: str) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...]]]:
    """partition -> (leader, replicas, isr), from ZooKeeper."""
    store = ZkStore(cluster.zookeeper)
    store.start()
    try:
        assignment = store.topic(topic)
        assert assignment is not None
        out = {}
        for p, replicas in assignment.replicas.items():
            held = store.partition_state(topic, p)
            assert held is not None
            out[p] = (held[0].leader, replicas, held[0].isr)
        return out
    finally:
        store.stop()


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "log_level": 0})
    failed: list[object] = []
    for i in range(count):
        producer.produce(
            topic, b"%d" % i, partition=partition, on_delivery=lambda e, m: e and failed.append(e)
        )
    assert producer.flush(30) == 0 and not failed, failed


def test_leadership_returns_to_preferred_replicas_after_a_broker_restarts(
    cluster: TestCluster, admin: AdminClient
) -> None:
    """With the rebalance off (``auto.leader.rebalance.enable=false``) this fails: broker 1
    leads none of its partitions after the restart."""
    assignment = [[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2]]
    admin.create_topics([NewTopic("balanced", num_partitions=4, replica_assignment=assignment)])[
        "balanced"
    ].result(60)
    wait_until(
        lambda: all(s[0] == s[1][0] for s in states(cluster, "balanced").values()), 30, "preferred leaders"
    )
    for p in range(4):
        produce(cluster.bootstrap, "balanced", p, 20)

    cluster.stop(1)  # a controlled shutdown moves broker 1's leaderships to the others
    wait_until(
        lambda: all(s[0] != 1 for s in states(cluster, "balanced").values()), 30, "broker 1 to lead nothing"
    )
    cluster.restart(1)
    wait_until(
        lambda: all(leader == replicas[0] for leader, replicas, _ in states(cluster, "balanced").values()),
        REBALANCE_BOUND_S,
        "every partition to be led by its preferred replica again",
    )
    assert "event=leader_rebalance" in "".join(cluster.log_text(b) for b in (1, 2, 3))


def test_an_unclean_election_on_request_brings_back_a_partition_whose_isr_is_gone(
    cluster: TestCluster, admin: AdminClient
) -> None:
    admin.create_topics([NewTopic("orphaned", num_partitions=1, replica_assignment=[[2, 3]])])[
        "orphaned"
    ].result(60)
    produce(cluster.bootstrap, "orphaned", 0, 5)
    tp = TopicPartition("orphaned", 0)
    cluster.stop(3)  # out of the ISR
    wait_until(lambda: states(cluster, "orphaned")[0][2] == (2,), 30, "broker 3 to leave the ISR")
    cluster.stop(2)  # the ISR's last member: the partition is offline
    try:
        wait_until(lambda: states(cluster, "orphaned")[0][0] == -1, 30, "the partition to go offline")
        cluster.restart(3)
        state = states(cluster, "orphaned")[0]
        assert state[0] == -1 and state[2] == (2,), "a clean election cannot elect broker 3"
        # A new client: the module's client may hold broker 2 (now stopped) as the controller
        # from an earlier Metadata answer, and librdkafka waits for the controller it knows to
        # come up rather than asking again, so its ElectLeaders would wait out its timeout.
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
        preferred = admin.elect_leaders(ElectionType.PREFERRED, [tp]).result(30)[tp]
        assert preferred is not None and preferred.code() == KafkaError.PREFERRED_LEADER_NOT_AVAILABLE, (
            preferred
        )
        assert admin.elect_leaders(ElectionType.UNCLEAN, [tp]).result(30) == {tp: None}
        assert states(cluster, "orphaned")[0][:3:2] == (3, (3,))
        produce(cluster.bootstrap, "orphaned", 0, 1)
        logs = "".join(cluster.log_text(b) for b in (1, 3))
        assert "event=unclean_leader_election partition=orphaned-0 leader=3" in logs
    finally:
        cluster.restart(2)
    wait_until(lambda: 2 in states(cluster, "orphaned")[0][2], 30, "broker 2 to catch up again")

"""Produce, the transactional door (issue 33, finding 2 and KIP-890 part 1), on a real broker.

Before: the authorizer looked only at the first batch of each partition, and the log took every
batch a partition carried. A client with WRITE on a topic and no transactional-id ACL sent a
plain batch followed by a transactional one for one partition, in one request; both were
appended, and the transactional one opened a transaction that no coordinator knew of. Nothing
ever ended it: the partition's last stable offset stayed at the transactional batch's first
offset (a probe at 80e17d7: high watermark 5, last stable offset 3, for good), and every
read_committed consumer of the partition stalled there. The same with the transactional id's
ACL, or on a default cluster with none: a transactional batch for a partition its transaction
never added, at another epoch, under another transactional id's producer id, or with no
transactional id at all, was appended and opened the same hanging transaction. At 80e17d7::

    test_a_plain_then_a_transactional_batch_in_one_partition_is_refused_and_opens_nothing
    E   AssertionError: {'index': 0, 'error_code': 0, 'base_offset': 0, ...}
    E   assert 0 == <ErrorCode.INVALID_RECORD: 87>
    test_with_the_acls_a_transactional_batch_its_transaction_never_added_is_refused
    E   assert 0 == <ErrorCode.INVALID_TXN_STATE: 48>
    test_on_a_default_cluster_a_transactional_batch_no_coordinator_knows_is_refused
    E   assert 0 == <ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: 53>
    test_on_a_default_cluster_a_batch_must_be_one_and_a_producer_id_needs_a_sequence
    E   assert 2 == <ErrorCode.INVALID_RECORD: 87>   (CORRUPT_MESSAGE for a request with no batch)
    test_a_transaction_that_added_the_partition_writes_and_commits
    E   assert 0 == <ErrorCode.INVALID_TXN_STATE: 48>   (a batch after the commit reopened it)
    test_a_txn_offset_commit_its_transaction_never_added_is_refused_and_leaves_no_offset_unstable
    E   assert 0 == <ErrorCode.INVALID_TXN_STATE: 48>   (then UNSTABLE_OFFSET_COMMIT for good)

Every expected answer here is Apache Kafka 3.9.1's to the same request (the peer of `sluice peer
up kafka`), code and message; Kafka sends no message with INVALID_RECORD, Sluice sends the words
of Kafka's own exception.

Now a Produce carries exactly one batch per partition (Kafka's rule since Produce v3: anything
else is INVALID_RECORD), and the partition's leader asks the transaction coordinator whether a
transactional batch belongs to an ongoing transaction that added the partition before the batch
may open a transaction there (KIP-890 part 1, Kafka's answer after KAFKA-14402).

Two clusters: one broker with the authorizer on (the principal is the PLAINTEXT listener's,
User:ANONYMOUS), and a default one of two brokers, no authorizer, where a transactional id's
coordinator and a partition's leader can be different brokers (the leader then asks over the
inter-broker listener, AddPartitionsToTxn v4).
"""

from __future__ import annotations

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
RT, OP = acl.ResourceType, acl.Operation
SETTINGS = {
    "authorizer.class.name": acl.AclAuthorizer.CLASS_NAME,
    "super.users": "User:admin",
    "transaction.state.log.num.partitions": "2",
    "offsets.topic.num.partitions": "2",
}
TOPICS = ("two-batches", "txn-first", "unadded")


def grant(cluster: TestCluster, rtype: acl.ResourceType, name: str, *ops: acl.Operation) -> None:
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


def create_topic(cluster: TestCluster, name: str) -> bool:
    with wire(cluster) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            5,
            {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout_ms": 30000},
        )
    return r["topics"][0]["error_code"] in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)


@pytest.fixture(scope="module")
def secured(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("produce-door"), 1, broker_settings=SETTINGS)
    try:
        grant(c, RT.CLUSTER, acl.CLUSTER_NAME, OP.CREATE)
        grant(c, RT.TOPIC, "*", OP.DESCRIBE)
        for name in TOPICS:
            wait_until(lambda n=name: create_topic(c, n), 30, f"topic {name} created (CREATE applied)")
            grant(c, RT.TOPIC, name, OP.WRITE, OP.READ)
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def default(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    """A default cluster of two brokers (no authorizer): a transactional id's coordinator and a
    partition's leader may be different brokers."""
    c = TestCluster(
        zookeeper,
        tmp_path_factory.mktemp("produce-door-default"),
        2,
        broker_settings={"transaction.state.log.num.partitions": "4", "offsets.topic.num.partitions": "2"},
    )
    try:
        yield c
    finally:
        c.down()


def leader(cluster: TestCluster, topic: str) -> str:
    """host:port of the leader of ``topic``-0."""
    with wire(cluster) as w:
        r = w.request(ApiKey.METADATA, 8, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    node = r["topics"][0]["partitions"][0]["leader_id"]
    broker = next(b for b in r["brokers"] if b["node_id"] == node)
    return f"{broker['host']}:{broker['port']}"


def produce(cluster: TestCluster, topic: str, records: bytes, txn_id: str | None = None) -> dict[str, Any]:
    """One partition's answer to a Produce v8 (acks=all) carrying ``records`` as sent, from the
    partition's leader."""
    body = {
        "transactional_id": txn_id,
        "acks": -1,
        "timeout_ms": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    }
    with WireClient.connect(leader(cluster, topic), timeout_s=30) as w:
        r = w.request(ApiKey.PRODUCE, 8, body)
    answer: dict[str, Any] = r["responses"][0]["partition_responses"][0]
    return answer


def offsets(cluster: TestCluster, topic: str) -> tuple[int, int]:
    """(high watermark, last stable offset): ListOffsets latest as read_uncommitted and
    read_committed clients are told it."""

    def latest(isolation: int) -> int:
        with WireClient.connect(leader(cluster, topic), timeout_s=30) as w:
            r = w.request(
                ApiKey.LIST_OFFSETS,
                4,
                {
                    "replica_id": -1,
                    "isolation_level": isolation,
                    "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
                },
            )
        part = r["topics"][0]["partitions"][0]
        assert part["error_code"] == ErrorCode.NONE, part
        return int(part["offset"])

    return latest(0), latest(1)


def plain(value: bytes) -> bytes:
    return build_batch([(None, value)])


def txn_batch(pid: int, epoch: int, *values: bytes, seq: int = 0) -> bytes:
    return build_batch(
        [(None, v) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        transactional=True,
    )


def coordinator(cluster: TestCluster, txn_id: str) -> tuple[int, str]:
    """(node id, host:port) of ``txn_id``'s transaction coordinator (waiting while
    ``__transaction_state`` is created)."""

    def attempt() -> tuple[int, str] | None:
        with wire(cluster) as w:
            r = w.request(ApiKey.FIND_COORDINATOR, 3, {"key": txn_id, "key_type": 1})
        return None if r["error_code"] else (r["node_id"], f"{r['host']}:{r['port']}")

    return wait_until(attempt, 60, f"the coordinator of {txn_id}")


def initialised(cluster: TestCluster, txn_id: str, *, acls: bool = True) -> tuple[int, int]:
    """WRITE on ``txn_id`` granted (``acls``) and a producer id taken for it from its
    coordinator (retrying while the grant applies)."""
    if acls:
        grant(cluster, RT.TRANSACTIONAL_ID, txn_id, OP.WRITE)

    def attempt() -> tuple[int, int] | None:
        with WireClient.connect(coordinator(cluster, txn_id)[1], timeout_s=30) as w:
            r = w.request(
                ApiKey.INIT_PRODUCER_ID, 4, {"transactional_id": txn_id, "transaction_timeout_ms": 60000}
            )
        return (r["producer_id"], r["producer_epoch"]) if r["error_code"] == ErrorCode.NONE else None

    return wait_until(attempt, 60, f"a producer id for {txn_id}")


def add_partition(cluster: TestCluster, txn_id: str, pid: int, epoch: int, topic: str) -> int:
    with WireClient.connect(coordinator(cluster, txn_id)[1], timeout_s=30) as w:
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
    return int(r["results_by_topic_v3_and_below"][0]["results_by_partition"][0]["partition_error_code"])


def end_txn(cluster: TestCluster, txn_id: str, pid: int, epoch: int, commit: bool) -> int:
    with WireClient.connect(coordinator(cluster, txn_id)[1], timeout_s=30) as w:
        r = w.request(
            ApiKey.END_TXN,
            3,
            {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "committed": commit},
        )
    return int(r["error_code"])


def txn_id_coordinated(cluster: TestCluster, topic: str, *, by_leader: bool, prefix: str) -> str:
    """A transactional id whose coordinator is (``by_leader``) or is not the leader of
    ``topic``-0."""
    lead = leader(cluster, topic)
    for i in range(64):
        candidate = f"{prefix}-{i}"
        if (coordinator(cluster, candidate)[1] == lead) == by_leader:
            return candidate
    raise AssertionError(f"no transactional id {prefix}-N is coordinated as wanted")


def test_a_plain_then_a_transactional_batch_in_one_partition_is_refused_and_opens_nothing(
    secured: TestCluster,
) -> None:
    """Finding 2: WRITE on the topic, no transactional-id ACL, a plain batch then a
    transactional one. Kafka answers INVALID_RECORD (Produce v3+ takes exactly one batch per
    partition) and appends neither; the last stable offset stays with the high watermark."""
    answer = produce(secured, "two-batches", plain(b"plain") + txn_batch(4242, 0, b"t1", b"t2"))
    assert answer["error_code"] == ErrorCode.INVALID_RECORD, answer
    assert answer["base_offset"] == -1
    assert "exactly one record batch per partition" in answer["error_message"]
    assert offsets(secured, "two-batches") == (0, 0)
    # two plain batches are refused the same way: the rule is one batch, whatever it claims
    answer = produce(secured, "two-batches", plain(b"a") + plain(b"b"))
    assert answer["error_code"] == ErrorCode.INVALID_RECORD, answer
    assert offsets(secured, "two-batches") == (0, 0)
    # and a single plain batch is what a producer sends: accepted
    assert produce(secured, "two-batches", plain(b"one"))["error_code"] == ErrorCode.NONE
    assert offsets(secured, "two-batches") == (1, 1)


def test_a_transactional_batch_first_without_the_transactional_ids_acl_refuses_the_request(
    secured: TestCluster,
) -> None:
    """A transactional batch first (Kafka's rule reads each partition's first batch): the whole
    request is refused TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and nothing is appended."""
    records = txn_batch(4343, 0, b"t") + plain(b"plain")
    answer = produce(secured, "txn-first", records, txn_id="never-granted")
    assert answer["error_code"] == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, answer
    assert offsets(secured, "txn-first") == (0, 0)


def test_with_the_acls_a_transactional_batch_its_transaction_never_added_is_refused(
    secured: TestCluster,
) -> None:
    """KIP-890 part 1 with the authorizer on: WRITE on the topic and on the transactional id,
    its producer id and epoch, but no AddPartitionsToTxn: INVALID_TXN_STATE with Kafka's
    message, nothing appended, no transaction opened."""
    pid, epoch = initialised(secured, "unadded")
    answer = produce(secured, "unadded", txn_batch(pid, epoch, b"t"), txn_id="unadded")
    assert answer["error_code"] == ErrorCode.INVALID_TXN_STATE, answer
    assert answer["error_message"] == "Partition was not added to the transaction"
    assert offsets(secured, "unadded") == (0, 0)


def test_on_a_default_cluster_a_transactional_batch_no_coordinator_knows_is_refused(
    default: TestCluster,
) -> None:
    """No ACLs at all, and no transaction can be opened behind its coordinator's back, whichever
    broker coordinates it: a transactional batch without a transactional id
    (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka answers it without an authorizer too), for a
    partition its transaction never added (INVALID_TXN_STATE), at another epoch
    (INVALID_PRODUCER_EPOCH), under another transactional id's producer id or an id never
    initialised (INVALID_PRODUCER_ID_MAPPING). Each appends nothing."""
    topic = "default-unadded"
    wait_until(lambda: create_topic(default, topic), 30, f"topic {topic}")
    assert produce(default, topic, txn_batch(4444, 0, b"t"))["error_code"] == (
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    )
    for by_leader in (True, False):  # answered in process, and over the inter-broker listener
        txn_id = txn_id_coordinated(default, topic, by_leader=by_leader, prefix="unadded")
        pid, epoch = initialised(default, txn_id, acls=False)
        answer = produce(default, topic, txn_batch(pid, epoch, b"t"), txn_id=txn_id)
        assert answer["error_code"] == ErrorCode.INVALID_TXN_STATE, (by_leader, answer)
        assert answer["error_message"] == "Partition was not added to the transaction"
        answer = produce(default, topic, txn_batch(pid, epoch + 1, b"t"), txn_id=txn_id)
        assert answer["error_code"] == ErrorCode.INVALID_PRODUCER_EPOCH, (by_leader, answer)
        other, other_epoch = initialised(default, f"{txn_id}-other", acls=False)
        answer = produce(default, topic, txn_batch(other, other_epoch, b"t"), txn_id=txn_id)
        assert answer["error_code"] == ErrorCode.INVALID_PRODUCER_ID_MAPPING, (by_leader, answer)
        answer = produce(default, topic, txn_batch(pid, epoch, b"t"), txn_id=f"{txn_id}-never")
        assert answer["error_code"] == ErrorCode.INVALID_PRODUCER_ID_MAPPING, (by_leader, answer)
    assert offsets(default, topic) == (0, 0)


def test_on_a_default_cluster_a_batch_must_be_one_and_a_producer_id_needs_a_sequence(
    default: TestCluster,
) -> None:
    """Kafka's INVALID_RECORD for records that are not exactly one batch (none, two) and for a
    batch that claims a producer id without a sequence; nothing is appended."""
    topic = "default-records"
    wait_until(lambda: create_topic(default, topic), 30, f"topic {topic}")
    for records in (
        b"",
        plain(b"a") + plain(b"b"),
        build_batch([(None, b"q")], producer_id=99, producer_epoch=0),
    ):
        answer = produce(default, topic, records)
        assert answer["error_code"] == ErrorCode.INVALID_RECORD, answer
    assert offsets(default, topic) == (0, 0)


def test_a_transaction_that_added_the_partition_writes_and_commits(default: TestCluster) -> None:
    """The positive control, on the wire as a producer does it, with the coordinator on the
    leader and on the other broker: AddPartitionsToTxn, then the batch (accepted and opening the
    transaction: the last stable offset holds at its first offset), a second batch of the same
    transaction (no question asked: its transaction is open), then EndTxn; the marker closes it.
    Once closed, a batch of the ended transaction is refused: it would open a new one."""
    for n, by_leader in enumerate((True, False)):
        topic = f"added-{n}"
        wait_until(lambda t=topic: create_topic(default, t), 30, f"topic {topic}")  # type: ignore[misc]
        txn_id = txn_id_coordinated(default, topic, by_leader=by_leader, prefix=f"adds{n}")
        pid, epoch = initialised(default, txn_id, acls=False)
        assert add_partition(default, txn_id, pid, epoch, topic) == ErrorCode.NONE
        assert produce(default, topic, txn_batch(pid, epoch, b"a", b"b"), txn_id=txn_id)["error_code"] == 0
        assert produce(default, topic, txn_batch(pid, epoch, b"c", seq=2), txn_id=txn_id)["error_code"] == 0
        assert offsets(default, topic) == (3, 0)
        assert end_txn(default, txn_id, pid, epoch, True) == ErrorCode.NONE
        wait_until(lambda t=topic: offsets(default, t) == (4, 4), 30, "the COMMIT marker to close it")  # type: ignore[misc]

        # Until the coordinator has written CompleteCommit (after the marker), it cannot verify and
        # answers CONCURRENT_TRANSACTIONS, which a leader passes on as the retriable
        # NOT_ENOUGH_REPLICAS (Kafka's words too): a producer retries, and so does this test,
        # until the answer is final. Nothing is written meanwhile.
        def final_answer(t: str = topic, batch: bytes = txn_batch(pid, epoch, b"d", seq=3),
                         tid: str = txn_id) -> dict[str, Any] | None:  # fmt: skip
            answer = produce(default, t, batch, txn_id=tid)
            return None if answer["error_code"] == ErrorCode.NOT_ENOUGH_REPLICAS else answer

        late = wait_until(final_answer, 30, "a final answer to the ended transaction's batch")
        assert late["error_code"] == ErrorCode.INVALID_TXN_STATE, late
        assert offsets(default, topic) == (4, 4)


def test_a_txn_offset_commit_its_transaction_never_added_is_refused_and_leaves_no_offset_unstable(
    default: TestCluster,
) -> None:
    """KIP-890 part 1 on ``__consumer_offsets``: TxnOffsetCommit without AddOffsetsToTxn. Before,
    the offsets were appended as a transaction no coordinator knew of, so the group's offsets
    stayed UNSTABLE_OFFSET_COMMIT for good to every require_stable OffsetFetch (a read_committed
    consumer of the group never starts). Kafka 3.9 answers INVALID_TXN_STATE; so does Sluice."""
    topic, group = "offsets-unadded", "group-unadded"
    wait_until(lambda: create_topic(default, topic), 30, f"topic {topic}")
    txn_id = "offsets-unadded"
    pid, epoch = initialised(default, txn_id, acls=False)
    body = {
        "transactional_id": txn_id,
        "group_id": group,
        "producer_id": pid,
        "producer_epoch": epoch,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 5,
                        "committed_leader_epoch": -1,
                        "committed_metadata": "",
                    }
                ],
            }
        ],
    }
    moving = (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)

    def commit_and_fetch() -> tuple[dict[str, Any], dict[str, Any]] | None:
        """Both requests at the group's coordinator; None (find it and ask again, as a client
        does) while the coordinator moves or loads: a fresh-clone run of the suite got
        NOT_COORDINATOR from the broker FindCoordinator had named a moment before."""
        with WireClient.connect(coordinator_of_group(default, group), timeout_s=30) as w:
            r = w.request(ApiKey.TXN_OFFSET_COMMIT, 3, body)
            if r["topics"][0]["partitions"][0]["error_code"] in moving:
                return None
            fetched = w.request(
                ApiKey.OFFSET_FETCH,
                7,
                {
                    "group_id": group,
                    "topics": [{"name": topic, "partition_indexes": [0]}],
                    "require_stable": True,
                },
            )
        return r, fetched

    r, fetched = wait_until(commit_and_fetch, 60, f"an answer from the coordinator of {group}")
    assert r["topics"][0]["partitions"][0]["error_code"] == ErrorCode.INVALID_TXN_STATE, r
    part = fetched["topics"][0]["partitions"][0]
    assert (part["error_code"], part["committed_offset"]) == (ErrorCode.NONE, -1), fetched


def coordinator_of_group(cluster: TestCluster, group: str) -> str:
    def attempt() -> str | None:
        with wire(cluster) as w:
            r = w.request(ApiKey.FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        return None if r["error_code"] else f"{r['host']}:{r['port']}"

    return wait_until(attempt, 60, f"the coordinator of group {group}")

"""Fetch sessions, the consumer's door (issue 33, finding 3), on a real SASL_SSL broker with the
authorizer on: every partition a fetch session serves is authorized again on every Fetch, and a
session answers only the principal (and listener, and replica id) that opened it.

Before, the Fetch check covered only the topics a request named; an incremental fetch names
none, and the handler served every partition of the session, which stored no owner. So after
READ on ``secret`` was revoked, alice's open session still returned new records, and bob, with
no ACL at all, sent alice's session id (its ids came from ``random.Random``) and read them too.
At 0bb43e9::

    test_a_session_partition_whose_read_was_revoked_is_refused_on_the_next_incremental_fetch
    E   AssertionError: the revoked session served 1 record(s)
    test_another_principal_sending_a_sessions_id_is_told_it_does_not_exist
    E   assert 0 == <ErrorCode.FETCH_SESSION_ID_NOT_FOUND: 70>
    test_a_denied_partition_named_in_a_full_request_stays_in_the_session_and_is_served_once_granted
    E   assert (0 > 0)   (the refused partition joined no session: answered once, then never again)

Kafka re-authorizes every partition of the fetch context on every Fetch (KafkaApis
handleFetchRequest, ``fetchContext.foreachPartition``) and answers a partition the principal may
not read TOPIC_AUTHORIZATION_FAILED, keeping it in the session; binding a session to its owner
is Sluice's own rule (Kafka's cache is keyed by id alone).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch, iter_batches
from sluice.security import acl
from sluice.security.acl_store import AclStore
from sluice.security.client import ClientSecurity
from sluice.security.credentials import CredentialStore
from sluice.security.scram import MECHANISMS
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(180)

RT, OP = acl.ResourceType, acl.Operation
VERSION = 12
PASSWORDS = {"alice": "alice-password", "bob": "bob-password"}


@pytest.fixture(scope="module")
def secured(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("fetch-door"), 1, security="sasl_ssl")
    try:
        with zk(c) as store:
            credentials = CredentialStore(store.client)
            for user, password in PASSWORDS.items():
                credentials.set_password(user, password, tuple(MECHANISMS))
        yield c
    finally:
        c.down()


class zk:
    """A ZooKeeper session with the cluster's credential (ACLs and users are under its ACL)."""

    def __init__(self, cluster: TestCluster) -> None:
        self.store = ZkStore(cluster.zookeeper, auth=cluster.cluster.zk_auth())

    def __enter__(self) -> ZkStore:
        self.store.start()
        return self.store

    def __exit__(self, *exc: object) -> None:
        self.store.stop()


def binding(user: str, topic: str) -> acl.AclBinding:
    return acl.AclBinding(
        acl.ResourcePattern(RT.TOPIC, topic),
        acl.AccessControlEntry(f"User:{user}", "*", OP.READ, acl.Permission.ALLOW),
    )


def grant_read(cluster: TestCluster, user: str, topic: str) -> None:
    with zk(cluster) as store:
        AclStore(store).add([binding(user, topic)])


def revoke_read(cluster: TestCluster, user: str, topic: str) -> None:
    with zk(cluster) as store:
        AclStore(store).remove(
            [acl.AclBindingFilter(RT.TOPIC, topic, acl.PatternType.LITERAL, f"User:{user}", None, OP.READ)]
        )


def connect(cluster: TestCluster, user: str | None) -> WireClient:
    """A connection as ``user`` (None: the cluster's admin, a super user)."""
    admin = cluster.client_security()
    security = (
        admin
        if user is None
        else ClientSecurity("SASL_SSL", "SCRAM-SHA-512", user, PASSWORDS[user], admin.ca_location)
    )
    host, _, port = cluster.bootstrap.split(",")[0].rpartition(":")
    return WireClient(host, int(port), security=security, timeout_s=30)


def create_topic(cluster: TestCluster, name: str) -> None:
    with connect(cluster, None) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            5,
            {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout_ms": 30000},
        )
    assert r["topics"][0]["error_code"] == ErrorCode.NONE, r


def produce(cluster: TestCluster, topic: str, value: bytes) -> None:
    with connect(cluster, None) as w:
        r = w.request(
            ApiKey.PRODUCE,
            9,
            {
                "acks": -1,
                "timeout_ms": 10000,
                "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": build_batch([(None, value)])}]}
                ],
            },
        )
    assert r["responses"][0]["partition_responses"][0]["error_code"] == ErrorCode.NONE, r


def fetch_body(session_id: int, epoch: int, topic: str | None, offset: int = 0) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": []
        if topic is None
        else [
            {
                "topic": topic,
                "partitions": [
                    {
                        "partition": 0,
                        "fetch_offset": offset,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": -1,
                        "log_start_offset": -1,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def partitions(r: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["partition_index"]: p for t in r["responses"] for p in t["partitions"]}


def records_in(r: dict[str, Any]) -> int:
    return sum(
        h.records_count for p in partitions(r).values() for _pos, h in iter_batches(p["records"] or b"")
    )


def open_session(w: WireClient, topic: str) -> int:
    """A fetch session over ``topic``-0 from offset 0, read to its end: its id."""
    r = w.request(ApiKey.FETCH, VERSION, fetch_body(0, 0, topic))
    assert r["error_code"] == ErrorCode.NONE and r["session_id"] > 0, r
    assert partitions(r)[0]["error_code"] == ErrorCode.NONE, r
    return int(r["session_id"])


def refused_by_name(cluster: TestCluster, user: str, topic: str) -> bool:
    """Does a sessionless Fetch naming ``topic`` tell ``user`` TOPIC_AUTHORIZATION_FAILED (the
    broker has applied a revocation)?"""
    with connect(cluster, user) as w:
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(0, -1, topic))
    return bool(partitions(r)[0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def test_a_session_partition_whose_read_was_revoked_is_refused_on_the_next_incremental_fetch(
    secured: TestCluster,
) -> None:
    create_topic(secured, "secret")
    produce(secured, "secret", b"before")
    grant_read(secured, "alice", "secret")
    with connect(secured, "alice") as alice:
        session = wait_until(lambda: open_session(alice, "secret"), 15, "alice's READ to apply")
        revoke_read(secured, "alice", "secret")
        wait_until(lambda: refused_by_name(secured, "alice", "secret"), 15, "the revocation to apply")
        produce(secured, "secret", b"after the revocation")
        r = alice.request(ApiKey.FETCH, VERSION, fetch_body(session, 1, None))
        assert records_in(r) == 0, f"the revoked session served {records_in(r)} record(s)"
        assert r["error_code"] == ErrorCode.NONE and r["session_id"] == session
        assert partitions(r)[0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED, r
        # refused again on every fetch, while the session lives
        r = alice.request(ApiKey.FETCH, VERSION, fetch_body(session, 2, None))
        assert partitions(r)[0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED and records_in(r) == 0


def test_another_principal_sending_a_sessions_id_is_told_it_does_not_exist(secured: TestCluster) -> None:
    """bob (no ACL) sends alice's session id at the epoch it expects: FETCH_SESSION_ID_NOT_FOUND,
    as for an id that does not exist; nor can a full request of his close her session. Alice's
    session is untouched: her next fetch, at the same epoch, is served."""
    create_topic(secured, "shared")
    grant_read(secured, "alice", "shared")
    with connect(secured, "alice") as alice, connect(secured, "bob") as bob:
        session = wait_until(lambda: open_session(alice, "shared"), 15, "alice's READ to apply")
        produce(secured, "shared", b"for alice only")
        r = bob.request(ApiKey.FETCH, VERSION, fetch_body(session, 1, None))
        assert r["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND, r
        assert records_in(r) == 0
        bob.request(ApiKey.FETCH, VERSION, fetch_body(session, 0, None))  # "close it and start over"
        r = alice.request(ApiKey.FETCH, VERSION, fetch_body(session, 1, None))
        assert (r["error_code"], r["session_id"]) == (ErrorCode.NONE, session), r
        assert records_in(r) == 1


def test_a_denied_partition_named_in_a_full_request_stays_in_the_session_and_is_served_once_granted(
    secured: TestCluster,
) -> None:
    """As in Kafka, a partition is answered TOPIC_AUTHORIZATION_FAILED while the principal may
    not read it, but stays in the session at the position the consumer sent: once READ is
    granted, the next incremental fetch serves it from there."""
    create_topic(secured, "later")
    produce(secured, "later", b"waiting")
    with connect(secured, "bob") as bob:
        r = bob.request(ApiKey.FETCH, VERSION, fetch_body(0, 0, "later"))
        assert partitions(r)[0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED, r
        session = int(r["session_id"])
        assert session > 0 and records_in(r) == 0
        grant_read(secured, "bob", "later")
        epoch = 1

        def served() -> bool:
            nonlocal epoch
            r = bob.request(ApiKey.FETCH, VERSION, fetch_body(session, epoch, None))
            epoch += 1
            assert r["error_code"] == ErrorCode.NONE, r
            return records_in(r) == 1

        wait_until(served, 15, "bob's READ to apply and the session to serve the partition")

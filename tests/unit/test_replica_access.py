"""Replication is a privileged door: a request acting as follower R is believed only from a
registered, live, assigned replica that is not the leader itself, through one decision
(``replica_access.replica_refusal``); a refused one touches no follower state.

Before, any client sending Fetch with a follower's replica id at the log end was recorded as
that follower caught up: the high watermark moved and acks=all was answered with one copy.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sluice.broker import handlers, replica_access
from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.listeners import Listener
from sluice.broker.partition import Partition
from sluice.broker.replica_access import ReplicaClaim, replica_refusal
from sluice.cluster import layout
from sluice.cluster.layout import PartitionState, StateWrite
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.security.session import Session, current_session

LIVE = frozenset({1, 2, 3})


def _claim(replica: int, live: frozenset[int] = LIVE) -> ReplicaClaim:
    return ReplicaClaim(replica, Session(), 1, live)


def test_only_a_live_assigned_replica_other_than_this_broker_may_act_as_a_follower() -> None:
    assert replica_refusal(_claim(2), (1, 2, 3), 0) is ErrorCode.NONE
    assert replica_refusal(_claim(2, frozenset({1, 3})), (1, 2, 3), 0) is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert replica_refusal(_claim(2, frozenset({1, 3})), (1, 2, 3), -1) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (
        replica_refusal(_claim(4, frozenset({1, 2, 3, 4})), (1, 2, 3), -1) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    )
    assert replica_refusal(_claim(1), (1, 2, 3), -1) is ErrorCode.NOT_LEADER_OR_FOLLOWER, "the leader itself"


def test_a_principal_that_may_not_replicate_is_refused_first() -> None:
    """Once the principal may not replicate, nothing else matters, and the answer is Kafka's for
    a follower fetch without ClusterAction."""
    claim = ReplicaClaim(2, Session(), 1, LIVE, may_replicate=False)
    assert replica_refusal(claim, (1, 2, 3), 0) is ErrorCode.TOPIC_AUTHORIZATION_FAILED


class _Acls:
    """An authorizer that lets only User:broker do CLUSTER_ACTION on the cluster."""

    def authorize(self, session: Session, op: object, resource: object) -> bool:
        from sluice.security.acl import Operation, Resource

        return (
            session.principal == "User:broker"
            and op == Operation.CLUSTER_ACTION
            and (resource == Resource.cluster())
        )


PLAINTEXT = Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)
INTERNAL = Listener("INTERNAL", "SASL_PLAINTEXT", "127.0.0.1", 9093)


def test_only_the_authenticated_inter_broker_principal_may_replicate_on_a_secured_cluster() -> None:
    sasl_ssl = Listener("SASL_SSL", "SASL_SSL", "127.0.0.1", 9093)
    anonymous, broker = Session(listener="SASL_SSL"), Session("User:broker", "SASL_SSL", "SASL_SSL")
    alice = Session("User:alice", "SASL_SSL", "SASL_SSL")
    may = replica_access.may_act_as_replica
    assert not may(anonymous, None, sasl_ssl, "User:broker")  # brokers authenticate: anonymous never
    assert not may(alice, None, sasl_ssl, "User:broker"), "without an authorizer: the brokers' user only"
    assert may(broker, None, sasl_ssl, "User:broker")
    acls: Any = _Acls()
    assert may(broker, acls, sasl_ssl, None)
    assert not may(alice, acls, sasl_ssl, "User:alice"), "with an authorizer: CLUSTER_ACTION decides"
    assert not may(anonymous, acls, PLAINTEXT, None)


def test_a_client_listener_never_believes_a_replica_id_whoever_asks() -> None:
    """Kafka believes a follower's fetch on every listener (with no authorizer, from anyone):
    Sluice only on the inter-broker listener. Even the brokers' own user, or a principal with
    CLUSTER_ACTION, is refused as a follower on a client listener."""
    may = replica_access.may_act_as_replica
    broker_on_client_port = Session("User:broker", "PLAINTEXT", "PLAINTEXT")
    assert not may(Session(), None, INTERNAL, "User:broker")
    assert not may(broker_on_client_port, None, INTERNAL, "User:broker")
    assert not may(broker_on_client_port, _Acls(), INTERNAL, "User:broker")  # type: ignore[arg-type]
    assert may(Session("User:broker", "INTERNAL", "SASL_PLAINTEXT"), None, INTERNAL, "User:broker")
    # an inter-broker listener that authenticates nobody believes anyone on it (warned at start)
    assert may(Session(), None, PLAINTEXT, None)
    assert not replica_access.inter_broker_authenticates(PLAINTEXT, "none")
    assert replica_access.inter_broker_authenticates(INTERNAL, "none")
    assert replica_access.inter_broker_authenticates(Listener("TLS", "SSL", "h", 1), "required")
    assert not replica_access.inter_broker_authenticates(Listener("TLS", "SSL", "h", 1), "requested")


def _fetch_body(replica: int, offset: int) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": 0,
        "topics": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition": 0,
                        "fetch_offset": offset,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": 0,
                        "log_start_offset": 0,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
    }


def _leader(tmp_path: Path, live: dict[int, None]) -> tuple[Broker, Partition]:
    """Broker 1 leading t-0 (replicas 1, 2, 3, all in the ISR, min.insync.replicas 2), with
    ``live`` as its view of /brokers/ids; ISR writes are recorded, not sent."""
    broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
    topic_id = uuid.uuid4()
    part = Partition.open(tmp_path / "b1", "t", 0, topic_id, {"min.insync.replicas": "2"}, 1)
    broker.replicas.partitions[("t", 0)] = part
    part.become_leader(0, (1, 2, 3), (1, 2, 3), time.monotonic() * 1000)
    broker.metadata.brokers = lambda: dict(live)  # type: ignore[method-assign,assignment,return-value]
    broker.metadata.topic = lambda t: SimpleNamespace(topic_id=topic_id)  # type: ignore[method-assign]
    return broker, part


def test_a_fetch_as_an_unregistered_follower_is_refused_and_moves_nothing(tmp_path: Path) -> None:
    async def run() -> None:
        live: dict[int, None] = {1: None}  # followers 2 and 3: sessions expired
        broker, part = _leader(tmp_path, live)
        appended = broker.replicas.append("t", 0, build_batch([(b"k", b"v")] * 3), required_acks=-1)
        assert appended.error is ErrorCode.NONE
        waiting = asyncio.ensure_future(broker.replicas.wait_replicated("t", 0, appended, 5.0))
        header = RequestHeader(ApiKey.FETCH, 12, 1, "not-a-broker")
        for replica in (2, 3):
            answer = await handlers.fetch(broker, header, _fetch_body(replica, part.log.log_end_offset))
            p = answer["responses"][0]["partitions"][0]
            assert p["error_code"] == ErrorCode.UNKNOWN_LEADER_EPOCH, p
            assert answer["session_id"] == 0, "a refused request opens no (privileged) fetch session"
        await asyncio.sleep(0.05)
        assert part.high_watermark == 0 and part.follower_leos == {}
        assert not waiting.done(), "acks=all answered with one copy"
        # OffsetForLeaderEpoch as a follower goes through the same door.
        oe = await handlers.offset_for_leader_epoch(
            broker,
            RequestHeader(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, 2, "not-a-broker"),
            {
                "replica_id": 2,
                "topics": [
                    {
                        "topic": "t",
                        "partitions": [{"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0}],
                    }
                ],
            },
        )
        assert oe["topics"][0]["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_LEADER_EPOCH
        # The followers register again: their fetches at the log end are believed (the control).
        for replica in (2, 3):
            live[replica] = None
            answer = await handlers.fetch(broker, header, _fetch_body(replica, part.log.log_end_offset))
            assert answer["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
        assert (await waiting).error is ErrorCode.NONE and part.high_watermark == 3
        part.close()

    asyncio.run(run())


def test_a_refused_fetch_closes_the_followers_session_so_its_position_is_named_again(tmp_path: Path) -> None:
    """Follower 2 fetches in a session; its registration lapses and a fetch at a new position
    is refused; registered again, its incremental fetch must not be served from the session's
    old position (it was: the follower got a batch below its log end, forever)."""

    async def run() -> None:
        live: dict[int, None] = {1: None, 2: None}
        broker, part = _leader(tmp_path, live)
        part.append(build_batch([(b"k", b"v")] * 3))
        header = RequestHeader(ApiKey.FETCH, 12, 1, "broker-2")
        full = {**_fetch_body(2, 0), "session_id": 0, "session_epoch": 0}
        opened = await handlers.fetch(broker, header, full)
        session = opened["session_id"]
        assert session != 0 and opened["responses"][0]["partitions"][0]["records"]
        del live[2]  # its ZooKeeper session lapses
        refused = await handlers.fetch(broker, header, {**_fetch_body(2, 3), "session_id": session,
                                                        "session_epoch": 1})  # fmt: skip
        assert refused["responses"][0]["partitions"][0]["error_code"] == ErrorCode.UNKNOWN_LEADER_EPOCH
        assert refused["session_id"] == 0, "the session survived a refusal it no longer agrees with"
        live[2] = None
        incremental = {**_fetch_body(2, 3), "topics": [], "session_id": session, "session_epoch": 2}
        stale = await handlers.fetch(broker, header, incremental)
        assert stale["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND, stale
        part.close()

    asyncio.run(run())


def test_an_isr_expansion_is_not_written_for_a_broker_no_longer_registered(tmp_path: Path) -> None:
    """Follower 3 caught up and was decided into the ISR, then its ZooKeeper session expired
    before the leader's batched write: the write must not put it back (the controller is
    dropping it), whatever the decision said."""

    async def run() -> None:
        live: dict[int, None] = {1: None, 2: None, 3: None}
        broker, part = _leader(tmp_path, live)
        part.become_leader(1, (1, 2), (1, 2, 3), time.monotonic() * 1000)
        part.state_version = 7
        broker.metadata.partition_state = lambda t, p: (PartitionState(1, 1, part.isr, 0), 7)  # type: ignore[method-assign]
        written: list[tuple[StateWrite, int]] = []

        def write(items: list[tuple[StateWrite, int]], writer: str) -> list[str]:
            written.extend(items)
            return [f"{layout.STATE_CHANGES}/change-0000000001"] * len(items)

        broker.store.write_partition_states = write  # type: ignore[method-assign]
        part.append(build_batch([(b"k", b"v")] * 4))
        claim = broker.replicas.replica_claim(2)
        assert broker.replicas.read("t", 0, 4, 1 << 20, 1, True, replica=claim).error is ErrorCode.NONE
        claim = broker.replicas.replica_claim(3)
        assert broker.replicas.read("t", 0, 4, 1 << 20, 1, True, replica=claim).error is ErrorCode.NONE
        assert broker._isr_queue, "follower 3 was decided into the ISR"
        del live[3]  # its session expires while the decision waits for its batch
        deadline = time.monotonic() + 5
        while broker._isr_writes and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert written == [], "a broker absent from /brokers/ids was written into the ISR"
        assert part.isr == (1, 2) and part.joining == frozenset()
        part.close()

    asyncio.run(run())


def _fetch_named(replica: int, names: list[tuple[str, int]]) -> dict[str, Any]:
    body = _fetch_body(replica, 0)
    body["topics"] = [
        {"topic": t, "partitions": [{**body["topics"][0]["partitions"][0], "partition": i}]} for t, i in names
    ]
    return body


def _epoch_request(replica: int, names: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "replica_id": replica,
        "topics": [
            {"topic": t, "partitions": [{"partition": i, "current_leader_epoch": 0, "leader_epoch": 0}]}
            for t, i in names
        ],
    }


def test_a_replica_id_claim_that_may_not_replicate_says_nothing_of_which_topics_exist(tmp_path: Path) -> None:
    """Finding 6 of issue 33: a claim skipped the topic check, so its answers told a partition led
    here (the door's TOPIC_AUTHORIZATION_FAILED or UNKNOWN_LEADER_EPOCH) from one that does not
    exist (UNKNOWN_TOPIC_OR_PARTITION) or is led elsewhere (NOT_LEADER_OR_FOLLOWER).
    Before the fix (80e17d7), anonymous on a client listener while the brokers replicate on a
    SASL one: ``{('t', 0): TOPIC_AUTHORIZATION_FAILED, ('t', 7): UNKNOWN_TOPIC_OR_PARTITION,
    ('secret-or-not', 0): UNKNOWN_TOPIC_OR_PARTITION}``.
    Now every partition is answered TOPIC_AUTHORIZATION_FAILED, before any lookup."""

    async def run() -> None:
        config = BrokerConfig(
            1, tmp_path / "b1", "127.0.0.1:1/unused", listeners=(PLAINTEXT, INTERNAL),
            inter_broker_listener="INTERNAL", inter_broker_username="broker", inter_broker_password="pw",
        )  # fmt: skip
        broker = Broker(config)
        part = Partition.open(tmp_path / "b1", "t", 0, uuid.uuid4(), {}, 1)
        broker.replicas.partitions[("t", 0)] = part
        part.become_leader(0, (1, 2, 3), (1, 2, 3), time.monotonic() * 1000)
        broker.metadata.brokers = lambda: dict.fromkeys(LIVE)  # type: ignore[method-assign,assignment,return-value]
        broker.metadata.topic = lambda t: None  # type: ignore[method-assign]
        names = [("t", 0), ("t", 7), ("secret-or-not", 0)]
        for session in (Session(), Session("User:broker", "PLAINTEXT", "PLAINTEXT")):
            current_session.set(session)
            answer = await handlers.fetch(
                broker, RequestHeader(ApiKey.FETCH, 12, 1, "x"), _fetch_named(2, names)
            )
            codes = {(t["topic"], p["partition_index"]): p["error_code"] for t in answer["responses"]
                     for p in t["partitions"]}  # fmt: skip
            assert codes == dict.fromkeys(names, ErrorCode.TOPIC_AUTHORIZATION_FAILED), codes
            assert answer["session_id"] == 0
            oe = await handlers.offset_for_leader_epoch(
                broker, RequestHeader(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, 2, "x"), _epoch_request(2, names)
            )
            codes = {
                (t["topic"], p["partition"]): p["error_code"] for t in oe["topics"] for p in t["partitions"]
            }
            assert codes == dict.fromkeys(names, ErrorCode.TOPIC_AUTHORIZATION_FAILED), codes
        assert part.follower_leos == {} and part.high_watermark == 0
        # The brokers' user on the inter-broker listener is a follower (the control).
        current_session.set(Session("User:broker", "INTERNAL", "SASL_PLAINTEXT"))
        answer = await handlers.fetch(
            broker, RequestHeader(ApiKey.FETCH, 12, 3, "x"), _fetch_named(2, names[:1])
        )
        assert answer["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
        part.close()

    asyncio.run(run())


def test_the_brokers_user_is_checked_against_the_configuration_never_zookeeper() -> None:
    """Whoever can write ZooKeeper (open on a default cluster) could otherwise give the brokers'
    user a password of their own, authenticate on the inter-broker listener and fake a follower."""
    from sluice.security.credentials import own_credentials, with_own_user
    from sluice.security.scram import make_credential, password_matches

    planted = make_credential("SCRAM-SHA-512", "attacker")
    in_zookeeper = {("broker", "SCRAM-SHA-512"): planted, ("alice", "SCRAM-SHA-512"): planted}
    lookup = with_own_user(lambda u, m: in_zookeeper.get((u, m)), "broker", own_credentials("configured"))
    own = lookup("broker", "SCRAM-SHA-512")
    assert own is not None and password_matches("SCRAM-SHA-512", own, "configured")
    assert not password_matches("SCRAM-SHA-512", own, "attacker")
    assert lookup("broker", "SCRAM-SHA-256") is not None
    assert lookup("alice", "SCRAM-SHA-512") is planted, "other users stay ZooKeeper's"


def test_cluster_up_brokers_replicate_only_on_an_authenticated_listener_of_their_own() -> None:
    """What `cluster up` writes for a broker: the client listener, and INTERNAL (SASL over the
    client listener's TLS or lack of it) as the inter-broker listener with the brokers' user."""
    from sluice.ops import launcher

    b = launcher.BrokerProcess(1, "127.0.0.1", 9092, "/tmp/b1", "/tmp/b1.log", internal_port=9093)
    settings = {"inter.broker.sasl.username": "sluice-broker", "inter.broker.sasl.password": "pw"}
    text = launcher.broker_properties(b, "127.0.0.1:2181/s", 6.0, settings)
    config = BrokerConfig.from_properties(
        dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    )
    assert [(lst.name, lst.protocol, lst.port) for lst in config.bound_listeners] == [
        ("PLAINTEXT", "PLAINTEXT", 9092),
        ("INTERNAL", "SASL_PLAINTEXT", 9093),
    ]
    assert config.inter_broker.name == "INTERNAL"
    assert replica_access.inter_broker_authenticates(config.inter_broker, "none")
    assert config.inter_broker_client().username == "sluice-broker"
    secured = launcher.broker_properties(b, "127.0.0.1:2181/s", 6.0, settings, "SASL_SSL")
    assert "listener.security.protocol.map=INTERNAL:SASL_SSL\n" in secured
    assert "listeners=SASL_SSL://127.0.0.1:9092,INTERNAL://127.0.0.1:9093\n" in secured


def test_write_txn_markers_from_a_client_port_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """WriteTxnMarkers is the brokers' own door, as follower fetches are: a marker ends another
    producer's transaction (an abort discards its records for every read_committed reader).
    Without an authorizer nothing checked who sent it. Before the fix, an anonymous client on the
    client listener aborted producer 7's open transaction: ``{'error_code': 0}`` for t-0 and
    the last stable offset moved from 0 to 4. Now CLUSTER_AUTHORIZATION_FAILED (Kafka's answer
    without CLUSTER_ACTION) and nothing is written."""
    from sluice.broker import txn_apis

    async def run() -> None:
        config = BrokerConfig(
            1, tmp_path / "b1", "127.0.0.1:1/unused", listeners=(PLAINTEXT, INTERNAL),
            inter_broker_listener="INTERNAL", inter_broker_username="broker", inter_broker_password="pw",
        )  # fmt: skip
        broker = Broker(config)
        part = Partition.open(tmp_path / "b1", "t", 0, uuid.uuid4(), {}, 1)
        broker.replicas.partitions[("t", 0)] = part
        part.become_leader(0, (1,), (1,), time.monotonic() * 1000)
        broker.metadata.brokers = lambda: {1: None}  # type: ignore[method-assign,assignment,return-value]
        batch = build_batch(
            [(b"k", b"v")] * 3, producer_id=7, producer_epoch=0, base_sequence=0, transactional=True
        )
        guard, _ = broker.replicas.begin_txn_verification("t", 0, 7)  # as if the coordinator said yes
        assert (
            broker.replicas.append("t", 0, batch, required_acks=-1, verification=guard).error
            is ErrorCode.NONE
        )
        assert part.high_watermark == 3 and part.last_stable_offset == 0
        marker = {"producer_id": 7, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": 0,
                  "topics": [{"name": "t", "partition_indexes": [0]}]}  # fmt: skip
        header = RequestHeader(ApiKey.WRITE_TXN_MARKERS, 1, 1, "not-a-broker")
        current_session.set(Session())  # anonymous, on the client listener
        answer = await txn_apis.write_txn_markers(broker, header, {"markers": [marker]})
        p = answer["markers"][0]["topics"][0]["partitions"][0]
        assert p["error_code"] == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, p
        assert part.log.log_end_offset == 3 and part.last_stable_offset == 0, "a client ended the transaction"
        # The coordinator's marker, over the inter-broker listener as the brokers' user (the control).
        current_session.set(Session("User:broker", "INTERNAL", "SASL_PLAINTEXT"))
        answer = await txn_apis.write_txn_markers(broker, header, {"markers": [marker]})
        assert answer["markers"][0]["topics"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
        assert part.last_stable_offset == 4
        part.close()

    asyncio.run(run())


def test_a_broker_whose_inter_broker_listener_authenticates_nobody_says_so_at_start(
    tmp_path: Path, caplog: Any
) -> None:
    """A hand-written configuration with one PLAINTEXT listener believes anyone on it as a
    follower (as Kafka does): the broker logs one WARNING naming the listener and the remedy; a
    SASL inter-broker listener (what `cluster up` writes) logs none."""
    import logging

    open_one = Broker(BrokerConfig(1, tmp_path / "a", "127.0.0.1:1/unused"))
    closed = Broker(
        BrokerConfig(
            1,
            tmp_path / "b",
            "127.0.0.1:1/unused",
            listeners=(PLAINTEXT, INTERNAL),
            inter_broker_listener="INTERNAL",
            inter_broker_username="broker",
            inter_broker_password="pw",
        )
    )
    with caplog.at_level(logging.WARNING, logger="sluice.broker"):
        closed._warn_if_replication_is_open()
        assert not caplog.records
        open_one._warn_if_replication_is_open()
    (record,) = caplog.records
    assert (
        "event=inter_broker_listener_unauthenticated listener=PLAINTEXT protocol=PLAINTEXT" in record.message
    )
    assert "SASL_PLAINTEXT" in record.message

"""Hostile clients cannot stop a broker (issue 17, acceptance 5), against a broker process.

1,000 connections that never send a byte, slow-loris clients that trickle a request out byte by
byte, and clients announcing 100 MB frames and sending ten bytes, all at once, while a producer
on another connection keeps producing: every produce is answered, the slow-loris connections
are closed by the broker, connections past ``max.connections.per.ip`` are refused, and the
broker's resident memory stays bounded (printed). Before, each 100 MB announcement made the
broker allocate 100 MB before any byte of the request had arrived.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

TOPIC = "hostile"
IDLE_CONNECTIONS = 1_000
ANNOUNCERS = 8
ANNOUNCED_BYTES = 100 * 1024 * 1024
SLOW_LORIS = 5
PER_IP_LIMIT = 50
#: The producer's bounds: at most this many requests, for at most this long.
PRODUCES_MAX = 200
PRODUCE_S = 8.0
#: RSS growth allowed while the attack runs: 8 announcements alone cost 800 MB before.
RSS_GROWTH_MAX_BYTES = 100 * 1024 * 1024

SETTINGS = {
    "queued.max.request.bytes": str(128 * 1024 * 1024),
    "socket.request.read.timeout.ms": "3000",
    "max.connections.per.ip": str(PER_IP_LIMIT),
    # the test's own connections and the idle crowd come from 127.0.0.1; the per-address limit
    # is shown on 127.0.0.2
    "max.connections.per.ip.overrides": f"127.0.0.1:{IDLE_CONNECTIONS + ANNOUNCERS + SLOW_LORIS + 50}",
}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.fixture
def broker(zookeeper: str, tmp_path: Path) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path, 1, broker_settings=SETTINGS)
    try:
        with WireClient.connect(c.bootstrap, timeout_s=30) as w:
            r = w.request(
                ApiKey.CREATE_TOPICS,
                5,
                {
                    "topics": [{"name": TOPIC, "num_partitions": 1, "replication_factor": 1}],
                    "timeout_ms": 30000,
                },
            )
            assert r["topics"][0]["error_code"] == ErrorCode.NONE, r
        yield c
    finally:
        c.down()


def produce(w: WireClient) -> int:
    r = w.request(
        ApiKey.PRODUCE,
        9,
        {
            "acks": 1,
            "timeout_ms": 5000,
            "topic_data": [
                {
                    "name": TOPIC,
                    "partition_data": [{"index": 0, "records": build_batch([(None, b"x" * 100)])}],
                }
            ],
        },
    )
    return int(r["responses"][0]["partition_responses"][0]["error_code"])


def connect(c: TestCluster, source: str = "127.0.0.1") -> socket.socket:
    b = c.broker(1)
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect((b.host, b.port))
    return s


def closed_by_broker(s: socket.socket, timeout_s: float) -> bool:
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return False
    except OSError:
        return True


def test_idle_crowds_slow_loris_and_100_mb_announcements_do_not_stop_a_producer(broker: TestCluster) -> None:
    pid = broker.broker(1).pid
    sockets: list[socket.socket] = []
    try:
        with WireClient.connect(broker.bootstrap, timeout_s=10) as producer:
            assert produce(producer) == ErrorCode.NONE
            rss_before = rss_bytes(pid)
            sockets += [connect(broker) for _ in range(IDLE_CONNECTIONS)]
            announcers = [connect(broker) for _ in range(ANNOUNCERS)]
            for s in announcers:
                s.sendall(struct.pack(">i", ANNOUNCED_BYTES) + b"0123456789")
            loris = [connect(broker) for _ in range(SLOW_LORIS)]
            for s in loris:
                s.sendall(struct.pack(">i", 1000))
            sockets += announcers + loris
            crowd = [connect(broker, "127.0.0.2") for _ in range(PER_IP_LIMIT + 10)]
            sockets += crowd
            answered, slowest = 0, 0.0
            deadline = time.monotonic() + PRODUCE_S
            for i in range(PRODUCES_MAX):
                if time.monotonic() >= deadline:
                    break
                if i % 10 == 0:
                    for s in loris:  # a byte now and then: progress, but never a whole request
                        try:
                            s.send(b"\0")
                        except OSError:
                            pass
                started = time.monotonic()
                assert produce(producer) == ErrorCode.NONE
                slowest = max(slowest, time.monotonic() - started)
                answered += 1
            rss_after = rss_bytes(pid)
            print(
                f"broker_rss_before_mb={rss_before / 2**20:.1f} broker_rss_after_mb={rss_after / 2**20:.1f} "
                f"idle={IDLE_CONNECTIONS} announcers={ANNOUNCERS}x{ANNOUNCED_BYTES // 2**20}MB "
                f"slow_loris={SLOW_LORIS} produces={answered} slowest_produce_s={slowest:.3f}"
            )
            assert answered >= 20 and slowest < 2.0, (answered, slowest)
            assert rss_after - rss_before < RSS_GROWTH_MAX_BYTES, (
                f"the broker's RSS grew by {(rss_after - rss_before) / 2**20:.0f} MB under the attack"
            )
            poller = select.poll()  # descriptors past 1,024 here: select() cannot take them
            for s in crowd:
                poller.register(s, select.POLLIN | select.POLLHUP)
            ready = {fd for fd, _ in poller.poll(2000)}  # the refused ones are closed at accept
            refused = sum(closed_by_broker(s, 1) for s in crowd if s.fileno() in ready)
            assert refused >= 10, f"only {refused} of {len(crowd)} connections from one address were refused"
            assert all(closed_by_broker(s, 10) for s in loris), "a slow-loris connection was left open"
            assert produce(producer) == ErrorCode.NONE
        wait_until(lambda: "event=connection_refused" in broker.log_text(1), 10, "the refusal's log line")
        assert "slow_request=" in broker.log_text(1)
    finally:
        for s in sockets:
            s.close()


def test_a_fetch_asking_for_more_than_fetch_max_bytes_gets_at_most_that(broker: TestCluster) -> None:
    """A consumer's max_bytes of 2 GB is clamped to fetch.max.bytes, and a partition named twice
    in one request is refused rather than read twice (Kafka answers ListOffsets the same way)."""
    with WireClient.connect(broker.bootstrap, timeout_s=30) as w:
        for _ in range(3):
            assert produce(w) == ErrorCode.NONE
        part = {
            "partition": 0,
            "fetch_offset": 0,
            "partition_max_bytes": 2**31 - 1,
            "current_leader_epoch": -1,
        }
        body = {
            "replica_id": -1,
            "max_wait_ms": 0,
            "min_bytes": 1,
            "max_bytes": 2**31 - 1,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": TOPIC, "partitions": [part]}],
            "forgotten_topics_data": [],
            "rack_id": "",
        }
        r = w.request(ApiKey.FETCH, 12, body)
        assert r["responses"][0]["partitions"][0]["error_code"] == ErrorCode.NONE
        body["topics"] = [{"topic": TOPIC, "partitions": [part, part]}]
        r = w.request(ApiKey.FETCH, 12, body)
        errors = [p["error_code"] for t in r["responses"] for p in t["partitions"]]
        assert errors == [ErrorCode.INVALID_REQUEST], errors
        lo = {"partition_index": 0, "timestamp": -1}
        r = w.request(
            ApiKey.LIST_OFFSETS, 7, {"replica_id": -1, "topics": [{"name": TOPIC, "partitions": [lo, lo]}]}
        )
        assert {p["error_code"] for p in r["topics"][0]["partitions"]} == {ErrorCode.INVALID_REQUEST}

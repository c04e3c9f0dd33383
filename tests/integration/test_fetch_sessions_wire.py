"""Fetch sessions (KIP-227) at the wire, against a broker process, as any client sees them.

Before the broker kept sessions it answered every Fetch with session id 0, so a client asking
for a session (epoch 0) stayed sessionless: each test here failed at ``assert 0 > 0`` on the
session id of its first answer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, one_broker_with_topic

pytestmark = pytest.mark.timeout(180)

TOPIC = "sessions"
VERSION = 11


@pytest.fixture(scope="module")
def broker(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    with one_broker_with_topic(zookeeper, tmp_path_factory.mktemp("sessions-cluster"), TOPIC, 3) as c:
        yield c


def connect(c: TestCluster) -> WireClient:
    return WireClient.connect(c.bootstrap, timeout_s=30)


def fetch_body(
    session_id: int,
    epoch: int,
    offsets: dict[int, int],
    *,
    forgotten: list[int] | None = None,
    max_wait_ms: int = 0,
) -> dict[str, Any]:
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": epoch,
        "topics": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition": p,
                        "fetch_offset": offset,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": -1,
                        "log_start_offset": -1,
                    }
                    for p, offset in offsets.items()
                ],
            }
        ]
        if offsets
        else [],
        "forgotten_topics_data": [{"topic": TOPIC, "partitions": forgotten}] if forgotten else [],
        "rack_id": "",
    }


def answered(r: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["partition_index"]: p for t in r["responses"] for p in t["partitions"]}


def produce(w: WireClient, partition: int, value: bytes) -> int:
    r = w.request(
        ApiKey.PRODUCE,
        9,
        {
            "acks": -1,
            "timeout_ms": 10000,
            "topic_data": [
                {
                    "name": TOPIC,
                    "partition_data": [{"index": partition, "records": build_batch([(None, value)])}],
                }
            ],
        },
    )
    p = r["responses"][0]["partition_responses"][0]
    assert p["error_code"] == ErrorCode.NONE, p
    return int(p["base_offset"])


def open_session(w: WireClient) -> tuple[int, dict[int, int]]:
    """A session over every partition at its high watermark: (session id, offsets)."""
    r = w.request(ApiKey.FETCH, VERSION, fetch_body(0, -1, {0: 0, 1: 0, 2: 0}))
    offsets = {p: int(d["high_watermark"]) for p, d in answered(r).items()}
    r = w.request(ApiKey.FETCH, VERSION, fetch_body(0, 0, offsets))
    assert r["error_code"] == ErrorCode.NONE
    assert r["session_id"] > 0, "a full request with epoch 0 opens a session"
    assert set(answered(r)) == {0, 1, 2}, "a full answer has every partition"
    return int(r["session_id"]), offsets


def test_incremental_answers_carry_only_partitions_that_changed(broker: TestCluster) -> None:
    with connect(broker) as w:
        session_id, offsets = open_session(w)
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 1, {}))
        assert (r["error_code"], r["session_id"], answered(r)) == (ErrorCode.NONE, session_id, {})
        produce(w, 1, b"news")
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 2, {}))
        got = answered(r)
        assert set(got) == {1}, "only the partition with new records"
        assert got[1]["high_watermark"] == offsets[1] + 1 and len(got[1]["records"] or b"") > 0
        # forget partition 2, move partition 1 past the record: nothing new anywhere
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 3, {1: offsets[1] + 1}, forgotten=[2]))
        assert set(answered(r)) == {1}, "a partition the request names is always answered"
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 4, {}))
        assert answered(r) == {}
        produce(w, 2, b"forgotten")
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 5, {}))
        assert answered(r) == {}, "a forgotten partition is no longer fetched"


def test_session_errors(broker: TestCluster) -> None:
    with connect(broker) as w:
        session_id, _ = open_session(w)
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 7, {}))
        assert (r["error_code"], answered(r)) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, {})
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 1, {}))
        assert r["error_code"] == ErrorCode.NONE, "a wrong epoch leaves the session as it was"
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id + 1, 1, {}))
        assert (r["error_code"], answered(r)) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, {})
        # a sessionless request naming the session closes it
        w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, -1, {0: 0}))
        r = w.request(ApiKey.FETCH, VERSION, fetch_body(session_id, 2, {}))
        assert r["error_code"] == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_long_poll_wakes_for_a_session_partition_the_request_did_not_name(broker: TestCluster) -> None:
    """Fails (after the full 20 s wait) if the long poll waits only on the partitions the
    request names: an idle incremental request names none."""
    with connect(broker) as w, connect(broker) as writer:
        session_id, offsets = open_session(w)
        w.send(ApiKey.FETCH, VERSION, fetch_body(session_id, 1, {}, max_wait_ms=20000))
        time.sleep(0.3)
        started = time.monotonic()
        produce(writer, 0, b"wake-up")
        r = w.receive()
        assert time.monotonic() - started < 10, "the fetch did not wake up when data arrived"
        got = answered(r)
        assert set(got) == {0} and len(got[0]["records"] or b"") > 0
        assert got[0]["high_watermark"] == offsets[0] + 1

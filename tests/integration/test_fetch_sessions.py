"""A follower's fetches to a leader over TCP become incremental (KIP-227), and replication stays
what it was: the real fetch handler, session cache, server and replica fetcher in one process,
with every Fetch the follower sends recorded as it went over the wire.

Before fetch sessions every request named every partition and every answer carried every
partition: with ``FetcherManager(fetch_sessions=False)``, the follower as it was, the first
check fails with ``assert [200, 200, 200, 200] == [0, 0, 0, 0]`` (partitions named per idle
request).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sluice.broker import replica_fetcher
from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.broker.peer_client import PeerConnection
from sluice.broker.replica_fetcher import FetcherManager
from sluice.cluster.layout import BrokerRegistration
from sluice.protocol.api import ApiKey, RequestHeader, encode_request, encode_response
from sluice.protocol.errors import ErrorCode
from sluice.protocol.records import build_batch

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 200
Key = tuple[str, int]


@dataclass
class Exchange:
    """One Fetch the follower sent, and its answer."""

    epoch: int
    named: list[Key]
    forgotten: list[Key]
    request_bytes: int
    error: int
    session_id: int
    answered: list[Key]
    response_bytes: int


class LeaderOnly:
    """The follower's metadata: only where broker 1 listens."""

    def __init__(self, port: int):
        self.port = port

    def brokers(self) -> dict[int, BrokerRegistration]:
        return {1: BrokerRegistration(1, "127.0.0.1", self.port, os.getpid())}


def record_fetches(monkeypatch: pytest.MonkeyPatch) -> list[Exchange]:
    exchanges: list[Exchange] = []
    original = PeerConnection.request

    async def recording(
        self: PeerConnection, api_key: int, version: int, body: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        response = await original(self, api_key, version, body, timeout_s)
        if api_key == ApiKey.FETCH:
            header = RequestHeader(ApiKey.FETCH, version, 1, None)
            exchanges.append(
                Exchange(
                    body["session_epoch"],
                    [(t["topic"], p["partition"]) for t in body["topics"] for p in t["partitions"]],
                    [(t["topic"], p) for t in body["forgotten_topics_data"] for p in t["partitions"]],
                    len(encode_request(api_key, version, 1, self.client_id, body)),
                    response["error_code"],
                    response["session_id"],
                    [
                        (t["topic"], p["partition_index"])
                        for t in response["responses"]
                        for p in t["partitions"]
                    ],
                    sum(len(c) for c in encode_response(header, response)),
                )
            )
        return response

    monkeypatch.setattr(PeerConnection, "request", recording)
    return exchanges


async def until(condition: Callable[[], Any], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def test_idle_follower_fetches_name_nothing_and_replication_still_follows_the_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchanges = record_fetches(monkeypatch)
    # Polls of 0.5 s rather than the follower's 3 s: this test counts what fetches carry, not how
    # long they wait, and would otherwise spend most of its time in idle polls.
    monkeypatch.setattr(replica_fetcher, "FETCH_MAX_WAIT_MS", 500)

    async def run() -> None:
        leader = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        leader.metadata.brokers = lambda: {1: None, 2: None, 3: None}  # type: ignore[method-assign,misc]
        topic_id = uuid.uuid4()
        now_ms = time.monotonic() * 1000
        leads: dict[int, Partition] = {}
        follows: dict[int, Partition] = {}
        for i in range(PARTITIONS):
            # replica 3 is played by this test (``fetch_as_3``), so that the high watermark moves
            # when the test says, not when the real follower (2) fetches.
            leads[i] = Partition.open(tmp_path / "b1", "t", i, topic_id, {}, 1)
            leads[i].become_leader(0, (1, 2, 3), (1, 2, 3), now_ms)
            leader.replicas.partitions[("t", i)] = leads[i]
            follows[i] = Partition.open(tmp_path / "b2", "t", i, topic_id, {}, 2)
            follows[i].become_follower(1, 0, (1, 2, 3))
        await leader.server.start("127.0.0.1", 0)
        port = leader.server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        manager = FetcherManager(2, LeaderOnly(port))  # type: ignore[arg-type]

        def fetch_as_3(i: int, offset: int) -> None:
            claim = leader.replicas.replica_claim(3)
            assert leader.replicas.read("t", i, offset, 1 << 20, 0, True, replica=claim).error == 0

        def idle_since(n: int) -> list[Exchange]:
            return [e for e in exchanges[n:] if e.epoch > 0]

        try:
            for i in range(PARTITIONS):
                manager.add(follows[i])
            await until(lambda: len(exchanges) >= 5, 30, "the follower's first fetches")

            # 1. One full fetch opens the session; then idle fetches name and answer nothing.
            first, idle = exchanges[0], exchanges[1:5]
            assert [len(e.named) for e in idle] == [0] * 4, "an idle fetch names no partition"
            assert [len(e.answered) for e in idle] == [0] * 4, "an idle answer has no partition"
            assert first.epoch == 0 and len(first.named) == PARTITIONS and len(first.answered) == PARTITIONS
            assert first.session_id > 0
            assert [e.epoch for e in idle] == [1, 2, 3, 4]
            # The leader still sees the follower fetch every partition, so none leaves the ISR
            # (fails if the leader reads only the partitions a request names).
            since, mark = time.monotonic() * 1000, len(exchanges)
            await until(lambda: len(exchanges) >= mark + 2, 10, "two more idle fetches")
            assert all(leads[i].follower_caught_up_ms[2] > since for i in range(PARTITIONS))

            # 2. Records on one partition: only it is named and answered.
            mark = len(exchanges)
            leads[7].append(build_batch([(b"k", b"v")] * 5))
            await until(lambda: follows[7].log.log_end_offset == 5, 10, "partition 7 to replicate")
            await until(lambda: leads[7].follower_leos.get(2) == 5, 10, "the follower to fetch at 5")

            def named_7_then_idle() -> bool:
                named = [n for n, e in enumerate(exchanges) if n >= mark and ("t", 7) in e.named]
                return bool(named) and len(exchanges) > named[-1] + 1

            # The request naming offset 5 was answered, and the next one named nothing.
            await until(named_7_then_idle, 10, "the fetch at 5 to be answered")
            assert follows[7].high_watermark == 0, "replica 3 has not fetched: the HW is still 0"
            assert {k for e in exchanges[mark:] for k in e.named} <= {("t", 7)}
            assert {k for e in exchanges[mark:] for k in e.answered} == {("t", 7)}

            # 3. The HW moves without the follower naming the partition: the answer carries it.
            mark = len(exchanges)
            fetch_as_3(7, 5)
            assert leads[7].high_watermark == 5
            await until(lambda: follows[7].high_watermark == 5, 10, "the new HW to reach the follower")
            moved = [e for e in idle_since(mark) if ("t", 7) in e.answered]
            assert moved and not moved[0].named, "the HW came in an answer to a request naming nothing"
            assert all(follows[i].high_watermark == 0 for i in range(PARTITIONS) if i != 7)

            # 4. The session is lost on the leader: the follower starts over with a full fetch.
            # A poll already waiting when the session goes is still answered in it (it holds the
            # session; a follower poll lasts up to 3 s, so one usually is), then the next
            # request finds no session.
            old_session = exchanges[-1].session_id
            for session_id in list(leader.fetch_sessions._sessions):
                leader.fetch_sessions._remove(session_id)
            mark = len(exchanges)

            def new_session() -> bool:
                errors = [n for n in range(mark, len(exchanges)) if exchanges[n].error]
                return bool(errors) and any(e.epoch > 0 and not e.error for e in exchanges[errors[0] + 1 :])

            await until(new_session, 10, "a new session")
            lost = next(n for n in range(mark, len(exchanges)) if exchanges[n].error)
            assert lost - mark <= 1, "at most the poll in flight is answered in the removed session"
            assert all(e.session_id == old_session for e in exchanges[mark:lost])
            assert exchanges[lost].error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
            again = exchanges[lost + 1]
            assert again.epoch == 0 and len(again.named) == PARTITIONS and again.session_id > 0
            leads[3].append(build_batch([(b"k", b"w")] * 2))
            await until(lambda: follows[3].log.log_end_offset == 2, 10, "partition 3 to replicate")
            fetch_as_3(3, 2)
            await until(lambda: follows[3].high_watermark == 2, 10, "partition 3's HW")

            # 5. A partition that leaves the follower is forgotten, not named again.
            mark = len(exchanges)
            manager.remove(follows[11])

            def forgot_then_idle() -> bool:
                forgot = [n for n in range(mark, len(exchanges)) if exchanges[n].forgotten]
                return bool(forgot) and len(exchanges) > forgot[0] + 1

            # (the poll in flight when the partition left is answered first, up to 3 s later)
            await until(forgot_then_idle, 20, "the fetch forgetting it and one after it")
            forgot = next(n for n in range(mark, len(exchanges)) if exchanges[n].forgotten)
            assert forgot - mark <= 1 and exchanges[forgot].forgotten == [("t", 11)]
            last = exchanges[-1]
            assert last.named == [] and last.forgotten == []

            idle_bytes = [(e.request_bytes, e.response_bytes) for e in idle]
            print(f"full fetch: request {first.request_bytes} B, answer {first.response_bytes} B")
            print(f"idle incremental fetches (request B, answer B): {idle_bytes}")
        finally:
            await manager.stop()
            await leader.server.stop()
            for part in (*leads.values(), *follows.values()):
                part.close()

    asyncio.run(run())

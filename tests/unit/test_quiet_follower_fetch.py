"""A follower's incremental fetch skips the partitions it is caught up on that did not change
since its last read (Partition.quiet_mark), and still counts as a fetch of each for the ISR.

Reading every partition of a session on every poll cost about 20 us a partition in the leader's
event loop (66 ms a poll for a follower of 3,300 partitions, at 10,000 partitions in the cluster).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sluice.broker import handlers
from sluice.broker.broker import Broker
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import Partition
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.records import build_batch

FOLLOWER = 2
TOPIC = "t"


def _fetch_request(session_id: int, epoch: int, offsets: dict[int, int]) -> dict[str, Any]:
    return {
        "replica_id": FOLLOWER,
        "max_wait_ms": 0,
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
                        "fetch_offset": o,
                        "partition_max_bytes": 1 << 20,
                        "current_leader_epoch": 0,
                        "log_start_offset": 0,
                        "last_fetched_epoch": -1,
                    }
                    for p, o in offsets.items()
                ],
            }
        ]
        if offsets
        else [],
        "forgotten_topics_data": [],
    }


class Leader:
    """A broker leading partitions 0..n-1 of ``t`` with followers 2 and 3 in every ISR, called
    through the Fetch handler as follower 2; counts the partitions each fetch reads."""

    def __init__(self, tmp_path: Path, n: int):
        self.broker = Broker(BrokerConfig(1, tmp_path / "b1", "127.0.0.1:1/unused"))
        self.parts = []
        for p in range(n):
            part = Partition.open(tmp_path / "b1", TOPIC, p, uuid.uuid4(), {}, 1)
            self.broker.replicas.partitions[(TOPIC, p)] = part
            part.become_leader(0, (1, FOLLOWER, 3), (1, FOLLOWER, 3), time.monotonic() * 1000)
            self.parts.append(part)
        self.broker.metadata.brokers = lambda: {1: None, FOLLOWER: None, 3: None}  # type: ignore[method-assign,misc]
        self.reads: list[tuple[str, int]] = []
        real_read = self.broker.replicas.read

        def counting_read(topic: str, index: int, *args: Any, **kwargs: Any) -> Any:
            self.reads.append((topic, index))
            return real_read(topic, index, *args, **kwargs)

        self.broker.replicas.read = counting_read  # type: ignore[method-assign]
        self.header = RequestHeader(ApiKey.FETCH, 12, 1, "replica-2")

    async def fetch(self, session_id: int, epoch: int, offsets: dict[int, int]) -> dict[str, Any]:
        self.reads.clear()
        answer = await handlers.fetch(self.broker, self.header, _fetch_request(session_id, epoch, offsets))
        assert answer["error_code"] == 0, answer
        return answer

    def other_follower_fetches(self, p: int, offset: int) -> None:
        result = self.broker.replicas.read(
            TOPIC, p, offset, 1 << 20, 0, True, replica=self.broker.replicas.replica_claim(3)
        )
        assert result.error == 0, result

    def close(self) -> None:
        for part in self.parts:
            part.close()


def _answered(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["partition_index"]: p for t in answer["responses"] for p in t["partitions"]}


def test_an_idle_follower_reads_nothing_yet_stays_caught_up_on_every_partition(tmp_path: Path) -> None:
    async def run() -> None:
        leader = Leader(tmp_path, 5)
        for p, part in enumerate(leader.parts):
            part.append(build_batch([(b"k", b"v")] * 3))
            leader.other_follower_fetches(p, 3)
        full = await leader.fetch(0, 0, {p: 3 for p in range(5)})  # caught up on all five
        session = full["session_id"]
        assert session != 0 and len(leader.reads) == 5
        await leader.fetch(session, 1, {})  # incremental: each read once, and each left quiet
        assert len(leader.reads) == 5
        before = {p: part.follower_caught_up_ms[FOLLOWER] for p, part in enumerate(leader.parts)}
        await asyncio.sleep(0.02)
        answer = await leader.fetch(session, 2, {})
        assert leader.reads == [], "an unchanged partition the follower is caught up on is not read"
        assert _answered(answer) == {}
        for p, part in enumerate(leader.parts):
            assert part.follower_caught_up_ms[FOLLOWER] > before[p], (
                "the skipped fetch still counts for the ISR"
            )
            assert part.isr_candidates_to_remove(time.monotonic() * 1000, 10_000) == []

        leader.parts[3].append(build_batch([(b"k", b"new")]))  # one partition changes
        answer = await leader.fetch(session, 3, {})
        assert leader.reads == [(TOPIC, 3)]
        assert set(_answered(answer)) == {3} and _answered(answer)[3]["records"]
        leader.close()

    asyncio.run(run())


@pytest.mark.parametrize("change", ["high_watermark", "leadership", "isr", "named", "records", "replaced"])
def test_a_partition_is_read_again_once_anything_a_read_depends_on_changed(
    tmp_path: Path, change: str
) -> None:
    async def run() -> None:
        leader = Leader(tmp_path, 2)
        for p, part in enumerate(leader.parts):
            part.append(build_batch([(b"k", b"v")] * 3))
            if not (change == "high_watermark" and p == 0):
                leader.other_follower_fetches(p, 3)
        session = (await leader.fetch(0, 0, {0: 3, 1: 3}))["session_id"]
        await leader.fetch(session, 1, {})
        await leader.fetch(session, 2, {})
        assert leader.reads == []
        part = leader.parts[0]
        named: dict[int, int] = {}
        if change == "high_watermark":
            assert part.high_watermark == 0
            leader.other_follower_fetches(0, 3)  # the HW moves; follower 2 must be told
            assert part.high_watermark == 3
        elif change == "leadership":
            part.become_leader(1, part.isr, part.replicas, time.monotonic() * 1000)
        elif change == "isr":
            part.isr = (1, 3)
        elif change == "named":
            named = {0: 3}
        elif change == "records":
            part.append(build_batch([(b"k", b"v")]))
        elif change == "replaced":
            # A replica under the same name, not the one the follower's last read found.
            fresh = Partition.open(tmp_path / "b2", TOPIC, 0, uuid.uuid4(), {}, 1)
            leader.broker.replicas.partitions[(TOPIC, 0)] = fresh
            leader.parts.append(fresh)
        leader.reads.clear()
        answer = await handlers.fetch(leader.broker, leader.header, _fetch_request(session, 3, named))
        assert (TOPIC, 0) in leader.reads, f"{change}: partition 0 was skipped"
        assert (TOPIC, 1) not in leader.reads
        if change in ("high_watermark", "leadership", "named", "records", "replaced"):
            assert 0 in _answered(answer), f"{change}: the follower was not told"
        leader.close()

    asyncio.run(run())

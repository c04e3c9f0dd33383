"""Consumer groups and the classic group protocol against a real one-broker Sluice cluster.

- Real clients (confluent-kafka, kafka-python, aiokafka), each member in its own process:
  two members split a topic, a third joins and the partitions rebalance, one is ``kill -9``ed
  and its partitions move to the others after its session timeout; with commits after
  processing, no record is skipped.
- Committed offsets survive a broker restart: a new consumer resumes exactly there.
- A group whose protocol type is not "consumer" (Sluice's workers) joins, syncs and heartbeats
  at the wire level, through KIP-394's member-id handshake, rebalances and error paths.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.sync.wire_client import WireClient
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(120)

CLIENTS = ["confluent", "kafka-python", "aiokafka"]
REPO = Path(__file__).resolve().parents[2]
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000


# -- helpers ------------------------------------------------------------------------------------------


def pov(m: Message) -> tuple[int, int, bytes]:
    """(partition, offset, value) of a consumed confluent-kafka message."""
    p, o, v = m.partition(), m.offset(), m.value()
    assert p is not None and o is not None and v is not None, m
    return p, o, v


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)[name].result(timeout=40)


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    with WireClient.connect(bootstrap, timeout_s=10) as w:
        r = w.request(
            ApiKey.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "topics": [
                    {
                        "name": topic,
                        "partitions": [{"partition_index": p, "timestamp": -1} for p in range(partitions)],
                    }
                ],
            },
        )
    out = {}
    for p in r["topics"][0]["partitions"]:
        assert p["error_code"] == ErrorCode.NONE, p
        out[p["partition_index"]] = p["offset"]
    return out


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as the coordinator answers OffsetFetch (one broker: it is
    the coordinator of every group)."""
    with WireClient.connect(bootstrap, timeout_s=10) as w:
        r = w.request(
            ApiKey.OFFSET_FETCH,
            7,
            {"group_id": group, "topics": [{"name": topic, "partition_indexes": list(range(partitions))}]},
        )
    assert r["error_code"] == ErrorCode.NONE, r
    return {p["partition_index"]: p["committed_offset"] for t in r["topics"] for p in t["partitions"]}


class BackgroundProducer:
    """Produces unique values round-robin over the partitions, acks=all and idempotent, at a
    bounded rate, until stopped. ``delivered`` maps each acknowledged value to its (partition,
    offset)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, prefix: str):
        self.bootstrap, self.topic, self.partitions, self.prefix = bootstrap, topic, partitions, prefix
        self.delivered: dict[str, tuple[int, int]] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.delivered)

    def wait_for_more(self, n: int, timeout_s: float = 30.0) -> None:
        target = self.count + n
        wait_until(lambda: self.count >= target or self.errors, timeout_s, f"{n} more records acknowledged")
        assert self.errors == [], self.errors[:5]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the producer did not finish"

    def _on_delivery(self, err: Any, msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
            else:
                self.delivered[msg.value().decode()] = (msg.partition(), msg.offset())

    def _run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        i = 0
        while not self._stop.is_set():
            for _ in range(50):
                producer.produce(
                    self.topic,
                    value=f"{self.prefix}{i:07d}".encode(),
                    partition=i % self.partitions,
                    on_delivery=self._on_delivery,
                )
                i += 1
            producer.poll(0)
            self._stop.wait(0.02)  # pacing, at most ~2500 records/s: a few thousand per phase
        if producer.flush(30) != 0:
            self.errors.append("records still in flight after flush")


@dataclass
class Journal:
    """What a ``tests.support.group_member`` process wrote (see its docstring)."""

    assignments: list[list[int]] = field(default_factory=list)
    #: (partition, offset, value, byte position of the line in the file)
    records: list[tuple[int, int, str, int]] = field(default_factory=list)
    commits: list[tuple[int, int, int]] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> Journal:
        j = cls()
        if not path.exists():
            return j
        data = path.read_bytes()
        pos = 0
        for raw in data.splitlines(keepends=True):
            at, pos = pos, pos + len(raw)
            if not raw.endswith(b"\n"):
                break  # a line cut short by kill -9
            kind, *rest = raw.decode().split()
            if kind == "A":
                j.assignments.append([] if rest == ["-"] else [int(x) for x in rest[0].split(",")])
            elif kind == "R":
                j.records.append((int(rest[0]), int(rest[1]), rest[2], at))
            elif kind == "C":
                j.commits.append((int(rest[0]), int(rest[1]), at))
        return j

    @property
    def assignment(self) -> list[int] | None:
        return self.assignments[-1] if self.assignments else None


class MemberProcess:
    def __init__(self, client: str, bootstrap: str, topic: str, group: str, out: Path, name: str):
        self.name, self.out = name, out
        self.stderr_path = out.with_suffix(".stderr")
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()/kill()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.group_member",
                "--client",
                client,
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--group",
                group,
                "--out",
                str(out),
                "--client-id",
                name,
                "--session-timeout-ms",
                str(SESSION_TIMEOUT_MS),
                "--heartbeat-interval-ms",
                str(HEARTBEAT_INTERVAL_MS),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )

    def journal(self) -> Journal:
        return Journal.read(self.out)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._stderr.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-2000:]


@contextmanager
def stopping(members: list[MemberProcess]) -> Iterator[None]:
    """Stop (SIGTERM: close and leave the group) every member still running on the way out."""
    try:
        yield
    finally:
        for m in members:
            m.stop()


def assignments_split(members: list[MemberProcess], partitions: int) -> bool:
    """Each member holds partitions/len(members) partitions, disjoint, covering all."""
    for m in members:
        assert m.alive(), f"member {m.name} exited: {m.stderr_tail()}"
    held = [m.journal().assignment for m in members]
    if any(h is None or len(h) != partitions // len(members) for h in held):
        return False
    union = [p for h in held for p in h or []]
    return sorted(union) == list(range(partitions))


def wait_split(members: list[MemberProcess], partitions: int, timeout_s: float, what: str) -> None:
    try:
        wait_until(lambda: assignments_split(members, partitions), timeout_s, what, interval_s=0.1)
    except AssertionError as exc:
        state = {m.name: m.journal().assignment for m in members}
        raise AssertionError(f"{exc}; assignments now {state}") from None


def described_assignments(bootstrap: str, group: str) -> dict[str, list[int]] | None:
    """client id -> partitions, from DescribeGroups as confluent-kafka's admin client decodes
    it; None unless the group is Stable."""
    from confluent_kafka import ConsumerGroupState

    admin = AdminClient({"bootstrap.servers": bootstrap})
    d = admin.describe_consumer_groups([group], request_timeout=10)[group].result(15)
    if d.state != ConsumerGroupState.STABLE:
        return None
    return {m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in d.members}


# -- 1. real clients: split, rebalance, kill -9 takeover -----------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_members_split_rebalance_and_take_over_a_killed_member_without_skipping(
    cluster: TestCluster, tmp_path: Path, client: str
) -> None:
    partitions = 6
    topic, group = f"split-{client}", f"split-group-{client}"
    create_topic(cluster.bootstrap, topic, partitions)

    def member(name: str) -> MemberProcess:
        return MemberProcess(client, cluster.bootstrap, topic, group, tmp_path / f"{name}.journal", name)

    members: list[MemberProcess] = []
    with BackgroundProducer(cluster.bootstrap, topic, partitions, prefix="v") as producer, stopping(members):
        try:
            # Two members split six partitions three and three.
            members += [member("m1"), member("m2")]
            wait_split(members, partitions, 45, "two members to hold three partitions each")
            producer.wait_for_more(2000)

            # A third joins: two each.
            members.append(member("m3"))
            wait_split(members, partitions, 30, "three members to hold two partitions each")
            # The coordinator hands back the leader's assignment bytes intact: librdkafka's
            # admin client decodes them to what each member says it holds.
            wait_until(
                lambda: (
                    described_assignments(cluster.bootstrap, group)
                    == {m.name: m.journal().assignment for m in members}
                ),
                10,
                "DescribeGroups to show the members' assignments",
            )
            producer.wait_for_more(2000)

            # kill -9 one: after its session timeout its partitions move to the other two.
            victim, survivors = members[0], members[1:]
            victim_held = victim.journal().assignment
            assert victim_held
            kill_marks = {m.name: m.out.stat().st_size for m in survivors}
            victim.kill()
            killed_at = time.monotonic()
            wait_split(survivors, partitions, SESSION_TIMEOUT_MS / 1000 + 20, "the survivors to take over")
            takeover_s = time.monotonic() - killed_at
            producer.wait_for_more(2000)
        finally:
            producer.stop()
        assert producer.errors == []
        delivered = producer.delivered
        assert len(delivered) >= 6000

        # Every partition ends fully committed: the survivors consumed to the end.
        ends = end_offsets(cluster.bootstrap, topic, partitions)
        expected_ends = {p: 1 + max(o for q, o in delivered.values() if q == p) for p in range(partitions)}
        assert ends == expected_ends
        wait_until(
            lambda: committed_offsets(cluster.bootstrap, group, topic, partitions) == ends,
            30,
            f"committed offsets to reach the end offsets {ends}",
        )

    # The killed member's session expired (it never left); nothing before its timeout moved.
    assert f"event=member_expired group={group}" in cluster.log_text(1)
    assert takeover_s >= SESSION_TIMEOUT_MS / 1000 - 1.0, f"partitions moved after {takeover_s:.1f} s"

    journals = {m.name: m.journal() for m in members}
    processed: set[str] = set()
    for name, j in journals.items():
        for p, o, v, _ in j.records:
            assert delivered.get(v, (p, o)) == (p, o), (
                f"{name} read {v} at {p}/{o}, produced at {delivered[v]}"
            )
            processed.add(v)
    missing = sorted(set(delivered) - processed)
    assert missing == [], f"{len(missing)} produced records never processed, e.g. {missing[:5]}"

    # The partitions the victim held resume exactly at an offset it committed: its last
    # acknowledged commit, or the one in flight when it died (whose acknowledgement it never
    # got to write down) -- never past what it processed, never from the start.
    vj = journals[victim.name]
    for p in victim_held:
        last_commit = max(
            [o for q, o, _ in vj.commits if q == p]
            + [
                o
                for m in survivors
                for q, o, at in journals[m.name].commits
                if q == p and at < kill_marks[m.name]
            ]
            + [0]
        )
        victim_end = 1 + max([o for q, o, _, _ in vj.records if q == p], default=-1)
        after = [
            o
            for m in survivors
            for q, o, _, at in journals[m.name].records
            if q == p and at >= kill_marks[m.name]
        ]
        if not after:
            continue
        first = min(after)
        assert first in (last_commit, victim_end), (
            f"partition {p}: taken over at offset {first}; the victim's last commit was {last_commit} "
            f"and it had processed up to {victim_end}"
        )


# -- 2. committed offsets survive a broker restart ---------------------------------------------------


def consume_until_committed_confluent(
    bootstrap: str, topic: str, group: str, commit_at: dict[int, int]
) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    consumer.subscribe([topic])
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 45
        while any(seen.get(p, -1) < k - 1 for p, k in commit_at.items()):
            assert time.monotonic() < deadline, f"consumed only up to {seen}"
            for m in consumer.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                p, o, _ = pov(m)
                seen[p] = max(seen.get(p, -1), o)
        consumer.commit(
            offsets=[TopicPartition(topic, p, k) for p, k in commit_at.items()], asynchronous=False
        )
    finally:
        close_within(consumer)


def first_offsets_confluent(
    bootstrap: str, topic: str, group: str, partitions: int
) -> dict[int, tuple[int, str]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    consumer.subscribe([topic])
    first: dict[int, tuple[int, str]] = {}
    try:
        deadline = time.monotonic() + 45
        while len(first) < partitions:
            assert time.monotonic() < deadline, f"first records only from {first}"
            for m in consumer.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                p, o, v = pov(m)
                first.setdefault(p, (o, v.decode()))
    finally:
        close_within(consumer)
    return first


def consume_until_committed_kafka_python(
    bootstrap: str, topic: str, group: str, commit_at: dict[int, int]
) -> None:
    from kafka import KafkaConsumer
    from kafka.structs import OffsetAndMetadata
    from kafka.structs import TopicPartition as KTP

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
    )
    consumer.subscribe([topic])
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 45
        while any(seen.get(p, -1) < k - 1 for p, k in commit_at.items()):
            assert time.monotonic() < deadline, f"consumed only up to {seen}"
            for tp, msgs in consumer.poll(timeout_ms=500, max_records=1000).items():
                seen[tp.partition] = max([seen.get(tp.partition, -1)] + [m.offset for m in msgs])
        consumer.commit({KTP(topic, p): OffsetAndMetadata(k, None, -1) for p, k in commit_at.items()})
    finally:
        close_within(consumer)


def first_offsets_kafka_python(
    bootstrap: str, topic: str, group: str, partitions: int
) -> dict[int, tuple[int, str]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="latest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
    )
    consumer.subscribe([topic])
    first: dict[int, tuple[int, str]] = {}
    try:
        deadline = time.monotonic() + 45
        while len(first) < partitions:
            assert time.monotonic() < deadline, f"first records only from {first}"
            for tp, msgs in consumer.poll(timeout_ms=500, max_records=1000).items():
                for m in msgs:
                    first.setdefault(tp.partition, (m.offset, m.value.decode()))
    finally:
        close_within(consumer)
    return first


def consume_until_committed_aiokafka(
    bootstrap: str, topic: str, group: str, commit_at: dict[int, int]
) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    async def run() -> None:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        await consumer.start()
        seen: dict[int, int] = {}
        try:
            deadline = time.monotonic() + 45
            while any(seen.get(p, -1) < k - 1 for p, k in commit_at.items()):
                assert time.monotonic() < deadline, f"consumed only up to {seen}"
                batch = await consumer.getmany(timeout_ms=500, max_records=1000)
                for tp, msgs in batch.items():
                    seen[tp.partition] = max([seen.get(tp.partition, -1)] + [m.offset for m in msgs])
            await consumer.commit({ATP(topic, p): k for p, k in commit_at.items()})
        finally:
            await consumer.stop()

    asyncio.run(run())


def first_offsets_aiokafka(
    bootstrap: str, topic: str, group: str, partitions: int
) -> dict[int, tuple[int, str]]:
    from aiokafka import AIOKafkaConsumer

    async def run() -> dict[int, tuple[int, str]]:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS,
        )
        await consumer.start()
        first: dict[int, tuple[int, str]] = {}
        try:
            deadline = time.monotonic() + 45
            while len(first) < partitions:
                assert time.monotonic() < deadline, f"first records only from {first}"
                batch = await consumer.getmany(timeout_ms=500, max_records=1000)
                for tp, msgs in batch.items():
                    for m in msgs:
                        first.setdefault(tp.partition, (m.offset, m.value.decode()))
        finally:
            await consumer.stop()
        return first

    return asyncio.run(run())


RESUME = {
    "confluent": (consume_until_committed_confluent, first_offsets_confluent),
    "kafka-python": (consume_until_committed_kafka_python, first_offsets_kafka_python),
    "aiokafka": (consume_until_committed_aiokafka, first_offsets_aiokafka),
}


@pytest.mark.parametrize(
    ("client", "crash"),
    [(c, False) for c in CLIENTS] + [("confluent", True)],
    ids=[*CLIENTS, "confluent-kill9"],
)
def test_consumer_resumes_at_committed_offsets_after_broker_restart(
    cluster: TestCluster, client: str, crash: bool
) -> None:
    consume_and_commit, first_offsets = RESUME[client]
    partitions, per_partition = 3, 1000
    commit_at = {0: 137, 1: 512, 2: 999}
    topic, group = f"resume-{client}", f"resume-group-{client}"
    create_topic(cluster.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})
    for p in range(partitions):
        for i in range(per_partition):
            producer.produce(topic, value=f"p{p}-{i:05d}".encode(), partition=p)
    assert producer.flush(30) == 0

    consume_and_commit(cluster.bootstrap, topic, group, commit_at)
    assert committed_offsets(cluster.bootstrap, group, topic, partitions) == commit_at

    if crash:
        # An acknowledged commit is in __consumer_offsets below the high watermark: it
        # survives kill -9 as well as a clean stop.
        cluster.kill(1, signal.SIGKILL)
    cluster.restart(1)
    wait_until(
        lambda: committed_offsets(cluster.bootstrap, group, topic, partitions) == commit_at,
        30,
        "the restarted coordinator to serve the committed offsets",
    )
    # auto.offset.reset=latest: a consumer that lost its offsets would start at the end.
    first = first_offsets_after_more_records(cluster, topic, group, partitions, first_offsets)
    assert first == {p: (k, f"p{p}-{k:05d}") for p, k in commit_at.items()}


def first_offsets_after_more_records(
    cluster: TestCluster, topic: str, group: str, partitions: int, first_offsets: Any
) -> dict[int, tuple[int, str]]:
    """Run ``first_offsets`` while records keep arriving, so that a consumer wrongly reset to
    the end still sees records (at the end offset) and the assertion says what it read."""
    stop = threading.Event()

    def trickle() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        i = 0
        while not stop.wait(0.2):
            for p in range(partitions):
                producer.produce(topic, value=f"late-{p}-{i}".encode(), partition=p)
            producer.poll(0)
            i += 1
        producer.flush(10)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        return first_offsets(cluster.bootstrap, topic, group, partitions)
    finally:
        stop.set()
        t.join(30)


def test_member_that_outlives_a_broker_restart_keeps_its_assignment_without_a_rebalance(
    cluster: TestCluster,
) -> None:
    """The restarted broker rebuilds the group (members, generation, assignment) from
    __consumer_offsets, so a member that kept running heartbeats on as if nothing happened.

    The member's session must outlive the restart: librdkafka drops its own assignment when no
    heartbeat succeeded for session.timeout.ms, whatever the broker kept. A loaded CI run once
    took longer than the 6 s the other tests use (the events read [[0, 1], 'revoked', [0, 1]]),
    so this member gets 30 s and the test checks the restart fitted in it."""
    partitions = 2
    session_timeout_ms = 30_000
    topic, group = "outlive", "outlive-group"
    create_topic(cluster.bootstrap, topic, partitions)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True})

    def produce(prefix: str, n: int) -> None:
        for i in range(n):
            producer.produce(topic, value=f"{prefix}{i}".encode(), partition=i % partitions)
        assert producer.flush(30) == 0

    events: list[Any] = []
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": session_timeout_ms,
            "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
        }
    )
    consumer.subscribe(
        [topic],
        on_assign=lambda c, ps: events.append(sorted(tp.partition for tp in ps)),
        on_revoke=lambda c, ps: events.append("revoked"),
    )

    def consume(n: int) -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + 30
        while len(got) < n:
            assert time.monotonic() < deadline, f"consumed {len(got)} of {n}; rebalance events {events}"
            for m in consumer.consume(500, timeout=0.5):
                if m.error() is None:
                    got.append(pov(m)[2].decode())
        return got

    try:
        produce("before-", 100)
        assert sorted(consume(100)) == sorted(f"before-{i}" for i in range(100))
        consumer.commit(asynchronous=False)
        assert events == [[0, 1]]

        down_at = time.monotonic()
        cluster.restart(1)
        outage_s = time.monotonic() - down_at
        assert outage_s < session_timeout_ms / 1000 - 5, f"the restart took {outage_s:.1f} s (too long)"
        produce("after-", 100)
        assert sorted(consume(100)) == sorted(f"after-{i}" for i in range(100))
        consumer.commit(asynchronous=False)
        assert committed_offsets(cluster.bootstrap, group, topic, partitions) == {0: 100, 1: 100}
        assert events == [[0, 1]], "the member lost its assignment across the restart"
    finally:
        close_within(consumer)
    log = cluster.log_text(1)
    assert log.count(f"event=rebalance_completed group={group} ") == 1, "the group rebalanced again"


# -- 3. a non-consumer protocol type at the wire level -------------------------------------------------

GROUP = "sluice-workers"
PROTOCOL_TYPE = "sluice-worker"
JOIN_V, SYNC_V, HEARTBEAT_V, LEAVE_V = 9, 5, 4, 5
RETRIABLE = {
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NOT_COORDINATOR,
}


def find_coordinator(bootstrap: str, group: str) -> str:
    def ask() -> str | None:
        with WireClient.connect(bootstrap, timeout_s=10) as w:
            r = w.request(ApiKey.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]})
        (c,) = r["coordinators"]
        if c["error_code"] == ErrorCode.COORDINATOR_NOT_AVAILABLE:
            return None
        assert c["error_code"] == ErrorCode.NONE, c
        assert c["key"] == group
        return f"{c['host']}:{c['port']}"

    return wait_until(ask, 30, f"a coordinator for {group}", interval_s=0.2)


class Worker:
    """One member of a ``sluice-worker`` group on its own connection (JoinGroup blocks it)."""

    def __init__(self, coordinator: str, name: str, protocols: list[tuple[str, bytes]]):
        self.w = WireClient.connect(coordinator, client_id=name, timeout_s=30)
        self.protocols = protocols
        self.member_id = ""
        self.generation = -1

    def close(self) -> None:
        self.w.close()

    def join_request(self, member_id: str) -> dict[str, Any]:
        return self.w.request(
            ApiKey.JOIN_GROUP,
            JOIN_V,
            {
                "group_id": GROUP,
                "session_timeout_ms": SESSION_TIMEOUT_MS,
                "rebalance_timeout_ms": 10_000,
                "member_id": member_id,
                "group_instance_id": None,
                "protocol_type": PROTOCOL_TYPE,
                "protocols": [{"name": n, "metadata": md} for n, md in self.protocols],
                "reason": None,
            },
        )

    def get_member_id(self) -> None:
        """KIP-394: the first JoinGroup, without a member id, only hands one out."""
        while True:
            r = self.join_request("")
            if r["error_code"] in RETRIABLE:
                time.sleep(0.1)  # the coordinator is still loading its partition: back off
                continue
            assert r["error_code"] == ErrorCode.MEMBER_ID_REQUIRED, r
            assert r["member_id"]
            assert r["generation_id"] == -1
            self.member_id = r["member_id"]
            return

    def join(self) -> dict[str, Any]:
        r = self.join_request(self.member_id)
        assert r["error_code"] == ErrorCode.NONE, r
        assert r["member_id"] == self.member_id
        assert r["protocol_type"] == PROTOCOL_TYPE
        self.generation = r["generation_id"]
        return r

    def sync(
        self, assignments: dict[str, bytes] | None = None, generation: int | None = None
    ) -> dict[str, Any]:
        return self.w.request(
            ApiKey.SYNC_GROUP,
            SYNC_V,
            {
                "group_id": GROUP,
                "generation_id": self.generation if generation is None else generation,
                "member_id": self.member_id,
                "group_instance_id": None,
                "protocol_type": PROTOCOL_TYPE,
                "protocol_name": None,
                "assignments": [{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()],
            },
        )

    def heartbeat(self, generation: int | None = None, member_id: str | None = None) -> int:
        r = self.w.request(
            ApiKey.HEARTBEAT,
            HEARTBEAT_V,
            {
                "group_id": GROUP,
                "generation_id": self.generation if generation is None else generation,
                "member_id": self.member_id if member_id is None else member_id,
                "group_instance_id": None,
            },
        )
        return r["error_code"]

    def leave(self) -> dict[str, Any]:
        return self.w.request(
            ApiKey.LEAVE_GROUP,
            LEAVE_V,
            {
                "group_id": GROUP,
                "members": [{"member_id": self.member_id, "group_instance_id": None, "reason": None}],
            },
        )


def describe(w: WireClient) -> dict[str, Any]:
    r = w.request(ApiKey.DESCRIBE_GROUPS, 5, {"groups": [GROUP], "include_authorized_operations": False})
    (g,) = r["groups"]
    assert g["error_code"] == ErrorCode.NONE, g
    return g


@contextmanager
def workers(coordinator: str, *specs: tuple[str, list[tuple[str, bytes]]]) -> Iterator[list[Worker]]:
    ws = [Worker(coordinator, name, protocols) for name, protocols in specs]
    try:
        yield ws
    finally:
        for w in ws:
            w.close()


def test_non_consumer_protocol_type_joins_syncs_heartbeats_and_rebalances(cluster: TestCluster) -> None:
    create_topic(cluster.bootstrap, "work", 1)  # offsets are committed only for partitions that exist
    coordinator = find_coordinator(cluster.bootstrap, GROUP)
    pool = ThreadPoolExecutor(4)
    a_protocols = [("alpha", b"a-meta-alpha"), ("beta", b"a-meta-beta")]
    b_protocols = [("beta", b"b-meta-beta"), ("alpha", b"b-meta-alpha")]
    with (
        workers(coordinator, ("worker-a", a_protocols), ("worker-b", b_protocols)) as (a, b),
        WireClient.connect(coordinator) as admin,
    ):
        # One member: the member-id handshake, then a generation it leads alone.
        a.get_member_id()
        r = a.join()
        assert r["leader"] == a.member_id
        assert r["protocol_name"] == "alpha"
        assert r["members"] == [
            {"member_id": a.member_id, "group_instance_id": None, "metadata": b"a-meta-alpha"}
        ]
        gen1 = a.generation
        s = a.sync({a.member_id: b"tasks:0-7"})
        assert s["error_code"] == ErrorCode.NONE, s
        assert (s["assignment"], s["protocol_type"], s["protocol_name"]) == (
            b"tasks:0-7",
            PROTOCOL_TYPE,
            "alpha",
        )
        assert a.heartbeat() == ErrorCode.NONE
        g = describe(admin)
        assert (g["group_state"], g["protocol_type"], g["protocol_data"]) == (
            "Stable",
            PROTOCOL_TYPE,
            "alpha",
        )
        assert [(m["member_id"], m["client_id"], m["member_assignment"]) for m in g["members"]] == [
            (a.member_id, "worker-a", b"tasks:0-7")
        ]

        # A "consumer" may not join a sluice-worker group.
        with WireClient.connect(coordinator, client_id="intruder") as w:
            r = w.request(
                ApiKey.JOIN_GROUP,
                JOIN_V,
                {
                    "group_id": GROUP,
                    "session_timeout_ms": SESSION_TIMEOUT_MS,
                    "rebalance_timeout_ms": 10_000,
                    "member_id": "",
                    "protocol_type": "consumer",
                    "protocols": [{"name": "alpha", "metadata": b""}],
                },
            )
            assert r["error_code"] == ErrorCode.INCONSISTENT_GROUP_PROTOCOL, r

        # A second member joins: the first learns of the rebalance from its heartbeat.
        b.get_member_id()
        assert b.member_id != a.member_id
        b_join: Future[dict[str, Any]] = pool.submit(b.join)
        wait_until(
            lambda: a.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS,
            10,
            "REBALANCE_IN_PROGRESS on the first member's heartbeat",
            interval_s=0.1,
        )
        assert not b_join.done(), "a join answered before every known member rejoined"
        a_join = pool.submit(a.join)
        joined = {"a": a_join.result(15), "b": b_join.result(15)}
        gen2 = a.generation
        assert gen2 == b.generation == gen1 + 1
        leader = a if joined["a"]["leader"] == a.member_id else b
        follower = b if leader is a else a
        assert {r["leader"] for r in joined.values()} == {leader.member_id}
        assert joined["a" if leader is a else "b"]["members"] != []
        assert joined["a" if follower is a else "b"]["members"] == []
        # One vote each for alpha and beta: the tie goes to the first member's preference.
        assert {r["protocol_name"] for r in joined.values()} == {"alpha"}
        leader_members = joined["a" if leader is a else "b"]["members"]
        assert sorted((m["member_id"], m["metadata"]) for m in leader_members) == sorted(
            [(a.member_id, b"a-meta-alpha"), (b.member_id, b"b-meta-alpha")]
        )

        # The follower's SyncGroup waits for the leader's assignment.
        follower_sync = pool.submit(follower.sync)
        assignment = {leader.member_id: b"tasks:0-3", follower.member_id: b"tasks:4-7"}
        s_leader = leader.sync(assignment)
        s_follower = follower_sync.result(15)
        assert s_leader["error_code"] == s_follower["error_code"] == ErrorCode.NONE, (s_leader, s_follower)
        assert s_leader["assignment"] == assignment[leader.member_id]
        assert s_follower["assignment"] == assignment[follower.member_id]
        assert a.heartbeat() == b.heartbeat() == ErrorCode.NONE

        # Stale generation, unknown member.
        assert a.heartbeat(generation=gen1) == ErrorCode.ILLEGAL_GENERATION
        assert a.sync(generation=gen1)["error_code"] == ErrorCode.ILLEGAL_GENERATION
        assert a.heartbeat(member_id="no-such-member") == ErrorCode.UNKNOWN_MEMBER_ID
        stranger = Worker(coordinator, "stranger", a_protocols)
        try:
            stranger.member_id, stranger.generation = "no-such-member", gen2
            assert stranger.sync()["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
            assert stranger.join_request("no-such-member")["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
            assert stranger.leave()["members"][0]["error_code"] == ErrorCode.UNKNOWN_MEMBER_ID
        finally:
            stranger.close()

        g = describe(admin)
        assert (g["group_state"], g["protocol_type"]) == ("Stable", PROTOCOL_TYPE)
        assert {m["member_id"]: m["member_assignment"] for m in g["members"]} == assignment
        listed = admin.request(ApiKey.LIST_GROUPS, 4, {"states_filter": []})
        assert {"group_id": GROUP, "protocol_type": PROTOCOL_TYPE, "group_state": "Stable"} in listed[
            "groups"
        ]

        # The group commits and fetches offsets like any other.
        commit = admin.request(
            ApiKey.OFFSET_COMMIT,
            8,
            {
                "group_id": GROUP,
                "generation_id_or_member_epoch": gen2,
                "member_id": a.member_id,
                "topics": [{"name": "work", "partitions": [{"partition_index": 0, "committed_offset": 42}]}],
            },
        )
        assert commit["topics"][0]["partitions"][0]["error_code"] == ErrorCode.NONE, commit
        assert committed_offsets(coordinator, GROUP, "work", 1) == {0: 42}

        # b leaves: a's heartbeat says rebalance, a rejoins alone in the next generation.
        left = b.leave()
        assert left["error_code"] == ErrorCode.NONE
        assert left["members"] == [{"member_id": b.member_id, "group_instance_id": None, "error_code": 0}]
        assert b.heartbeat() == ErrorCode.UNKNOWN_MEMBER_ID
        assert a.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS
        r = a.join()
        assert (r["generation_id"], r["leader"]) == (gen2 + 1, a.member_id)
        assert [m["member_id"] for m in r["members"]] == [a.member_id]
        assert a.sync({a.member_id: b"tasks:0-7"})["assignment"] == b"tasks:0-7"
        assert a.heartbeat() == ErrorCode.NONE
        assert a.heartbeat(generation=gen2) == ErrorCode.ILLEGAL_GENERATION
        g = describe(admin)
        assert [m["member_id"] for m in g["members"]] == [a.member_id]

        # The last member leaves: the group is Empty but keeps its offsets.
        assert a.leave()["members"][0]["error_code"] == ErrorCode.NONE
        wait_until(lambda: describe(admin)["group_state"] == "Empty", 10, "the group to become Empty")
        g = describe(admin)
        assert (g["members"], g["protocol_type"]) == ([], PROTOCOL_TYPE)
        assert committed_offsets(coordinator, GROUP, "work", 1) == {0: 42}
    pool.shutdown(wait=False, cancel_futures=True)


def test_member_of_the_current_generation_may_commit_while_the_group_prepares_a_rebalance(
    cluster: TestCluster,
) -> None:
    create_topic(cluster.bootstrap, "work", 1)
    coordinator = find_coordinator(cluster.bootstrap, GROUP)
    pool = ThreadPoolExecutor(1)
    with workers(coordinator, ("worker-a", [("alpha", b"")]), ("worker-b", [("alpha", b"")])) as (a, b):
        a.get_member_id()
        a.join()
        assert a.sync({a.member_id: b"all"})["error_code"] == ErrorCode.NONE
        b.get_member_id()
        b_join = pool.submit(b.join)
        wait_until(lambda: a.heartbeat() == ErrorCode.REBALANCE_IN_PROGRESS, 10, "the rebalance to start")
        # a has not rejoined yet: it still owns its partitions in its generation, and commits
        # what it processed before giving them up.
        r = a.w.request(
            ApiKey.OFFSET_COMMIT,
            8,
            {
                "group_id": GROUP,
                "generation_id_or_member_epoch": a.generation,
                "member_id": a.member_id,
                "topics": [{"name": "work", "partitions": [{"partition_index": 0, "committed_offset": 7}]}],
            },
        )
        commit_error = r["topics"][0]["partitions"][0]["error_code"]
        a.join()
        b_join.result(15)
    pool.shutdown(wait=False, cancel_futures=True)
    assert commit_error == ErrorCode.NONE
    assert committed_offsets(coordinator, GROUP, "work", 1) == {0: 7}

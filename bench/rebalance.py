"""Cooperative rebalancing (incremental assignors, KIP-429) with confluent-kafka's
``cooperative-sticky`` assignor, on Sluice and beside Apache Kafka (issue 33, item 7).

Every scenario is timed from the change (members joining, leaving, changing their subscription,
a member that stops polling) until the group has settled: every partition of the subscribed
topics owned by exactly one member, each member holding its fair share (at most one partition
more than any other member subscribed to the same topics), unchanged for one second (the time
printed excludes that second). Members run in threads of their own, each polling every 100 ms,
as applications do; the playbook scenario polls every member from one thread, as librdkafka's own
test suite does (its test 0113, ``u_multiple_subscription_changes``).

- ``join_one_by_one`` / ``leave_one_by_one``: ``--members`` members join, each once the one
  before it has settled, then leave the same way (each join is two rebalances with the
  cooperative protocol: the first revokes what moves, the second assigns it);
- ``join_at_once`` / ``half_leave_at_once``: the members subscribe together; then half close
  together;
- ``subscription_playbook``: librdkafka test 0113's playbook: 8 members, two topics of 16
  partitions, 27 subscription changes over 15 s, then the time until the group has settled;
- ``max_poll_exceeded``: of two members, one stops polling (``max.poll.interval.ms`` 7 s): the
  time from the moment it stopped until the other holds every partition.

``--against sluice,kafka`` runs each scenario on both (a local Kafka 3.9.1 cluster of the same
brokers, ``sluice.peers.kafka``), ``--rounds`` times, the first system alternating; figures print
as ``<scenario>_s sluice=X kafka=Y`` and their ratio. Both clusters wait 0 ms before a new
group's first rebalance (Kafka's peers are started so; Sluice's default is 500 ms).

Usage: .venv/bin/python bench/rebalance.py [--against sluice,kafka] [--brokers 3] [--members 6]
           [--partitions 12] [--rounds 2] [--json]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

import systems as sysmod
import versus

#: Kafka's peers start new groups at once; Sluice's default waits 500 ms for more members.
MATCH_KAFKA = {"group.initial.rebalance.delay.ms": "0"}
STABLE_S = 1.0
#: a scenario that has not settled by then prints nan (and the run goes on)
SETTLE_TIMEOUT_S = 180.0


@dataclass
class Member:
    """One consumer of the group and the partitions its rebalance callbacks say it owns."""

    consumer: Consumer
    topics: list[str]
    owned: set[tuple[str, int]] = field(default_factory=set)
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def subscribe(self, topics: list[str]) -> None:
        self.topics = list(topics)
        if not topics:
            self.consumer.unsubscribe()
            return

        def assigned(_c: Consumer, parts: list[TopicPartition]) -> None:
            self.owned |= {(p.topic, p.partition) for p in parts}

        def revoked(_c: Consumer, parts: list[TopicPartition]) -> None:
            self.owned -= {(p.topic, p.partition) for p in parts}

        self.consumer.subscribe(topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def run_in_thread(self) -> None:
        def loop() -> None:
            while not self.stop.is_set():
                self.consumer.poll(0.1)

        self.thread = threading.Thread(target=loop, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)
        self.consumer.close()


def new_member(bootstrap: str, group: str, **conf: object) -> Member:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "partition.assignment.strategy": "cooperative-sticky",
            "auto.offset.reset": "earliest",
            "log_level": 0,
            **conf,
        }
    )
    return Member(consumer, [])


def settled(members: Iterable[Member], partitions: dict[str, int]) -> bool:
    """Every subscribed partition owned once, nothing owned outside a member's subscription,
    every member's share fair among the members of the same subscription."""
    members = list(members)
    owned = [tp for m in members for tp in m.owned]
    if len(owned) != len(set(owned)):
        return False
    wanted = {(t, p) for m in members for t in m.topics for p in range(partitions[t])}
    if set(owned) != wanted:
        return False
    if any(t not in m.topics for m in members for t, _ in m.owned):
        return False
    by_subscription: dict[tuple[str, ...], list[int]] = {}
    for m in members:
        if m.topics:
            by_subscription.setdefault(tuple(sorted(m.topics)), []).append(len(m.owned))
    return all(max(sizes) - min(sizes) <= 1 for sizes in by_subscription.values())


def wait_settled(
    members: Callable[[], list[Member]], partitions: dict[str, int], poll: Callable[[], None] | None = None
) -> float:
    """Seconds until the group has settled and stayed so for STABLE_S (not counted)."""
    started = time.monotonic()
    stable_since: float | None = None
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        if poll is not None:
            poll()
        else:
            time.sleep(0.05)
        now = time.monotonic()
        if settled(members(), partitions):
            stable_since = stable_since or now
            if now - stable_since >= STABLE_S:
                return stable_since - started
        else:
            stable_since = None
    return float("nan")


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()]).values():
        future.result(60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # every partition has a leader
        meta = admin.list_topics(timeout=10)
        if all(
            t in meta.topics
            and meta.topics[t].error is None
            and len(meta.topics[t].partitions) == n
            and all(p.leader >= 0 for p in meta.topics[t].partitions.values())
            for t, n in topics.items()
        ):
            return
        time.sleep(0.2)


def threaded_scenarios(args: argparse.Namespace, bootstrap: str) -> dict[str, float]:
    """join_one_by_one, leave_one_by_one, join_at_once, half_leave_at_once."""
    tag = uuid.uuid4().hex[:8]
    topic = f"coop-{tag}"
    partitions = {topic: args.partitions}
    create_topics(bootstrap, partitions)
    out: dict[str, float] = {}
    members: list[Member] = []
    joins = []
    for _ in range(args.members):
        m = new_member(bootstrap, f"one-by-one-{tag}")
        m.subscribe([topic])
        m.run_in_thread()
        members.append(m)
        joins.append(wait_settled(lambda: members, partitions))
    out["join_one_by_one_s"] = sum(joins)
    leaves = []
    while len(members) > 1:
        members.pop().close()
        leaves.append(wait_settled(lambda: members, partitions))
    out["leave_one_by_one_s"] = sum(leaves)
    members.pop().close()

    group = [new_member(bootstrap, f"at-once-{tag}") for _ in range(args.members)]
    for m in group:
        m.subscribe([topic])
        m.run_in_thread()
    out["join_at_once_s"] = wait_settled(lambda: group, partitions)
    leaving = group[: args.members // 2]
    for m in leaving:
        m.stop.set()
    for m in leaving:
        m.close()
        group.remove(m)
    out["half_leave_at_once_s"] = wait_settled(lambda: group, partitions)
    for m in group:
        m.close()
    return out


#: librdkafka's test 0113 u_multiple_subscription_changes: (ms from the start, member, subscription)
PLAYBOOK = [
    (0, 0, 1), (4000, 1, 1), (4000, 1, 1), (4000, 1, 1), (4000, 2, 1), (6000, 3, 1), (6000, 4, 1),
    (6000, 5, 1), (6000, 6, 1), (6000, 7, 2), (6000, 1, 1), (6000, 1, 2), (6000, 1, 1), (6000, 2, 2),
    (7000, 2, 1), (7000, 1, 2), (8000, 0, 2), (8000, 1, 1), (8000, 0, 1), (13000, 2, 1), (13000, 1, 2),
    (13000, 5, 2), (14000, 6, 2), (15000, 7, 1), (15000, 1, 1), (15000, 5, 1), (15000, 6, 1),
]  # fmt: skip


def subscription_playbook(bootstrap: str) -> float:
    """The playbook with subscription 2 = both topics (test 0113's first variation); seconds
    from its last change until the group has settled."""
    tag = uuid.uuid4().hex[:8]
    t1, t2 = f"u1-{tag}", f"u2-{tag}"
    partitions = {t1: 16, t2: 16}
    create_topics(bootstrap, partitions)
    subscriptions = {1: [t1], 2: [t1, t2]}
    members = [new_member(bootstrap, f"u-{tag}", **{"client.id": f"C_{i}"}) for i in range(8)]

    def poll_all() -> None:
        for m in members:
            m.consumer.poll(0.01)

    started = time.monotonic()
    for at_ms, index, subscription in PLAYBOOK:
        while time.monotonic() < started + at_ms / 1000:
            poll_all()
        members[index].subscribe(subscriptions[subscription])
    took = wait_settled(lambda: members, partitions, poll_all)
    for m in members:
        m.close()
    return took


def max_poll_exceeded(bootstrap: str) -> float:
    """Two members (session.timeout.ms 6 s, max.poll.interval.ms 7 s) share two partitions; one
    stops polling: seconds until the other holds both."""
    tag = uuid.uuid4().hex[:8]
    topic = f"maxpoll-{tag}"
    partitions = {topic: 2}
    create_topics(bootstrap, partitions)
    conf = {"session.timeout.ms": 6000, "max.poll.interval.ms": 7000}
    a, b = (new_member(bootstrap, f"maxpoll-{tag}", **conf) for _ in range(2))
    for m in (a, b):
        m.subscribe([topic])
        m.run_in_thread()
    wait_settled(lambda: [a, b], partitions)
    a.stop.set()
    assert a.thread is not None
    a.thread.join(30)
    stopped = time.monotonic()
    while len(b.owned) < 2 and time.monotonic() - stopped < SETTLE_TIMEOUT_S:
        time.sleep(0.05)
    took = time.monotonic() - stopped
    a.consumer.poll(0.5)  # its max.poll error, then its lost partitions
    a.consumer.close()
    b.close()
    return took


def run_round(args: argparse.Namespace, system: sysmod.System) -> dict[str, float]:
    bootstrap = system.bootstrap_servers
    figures = threaded_scenarios(args, bootstrap)
    figures["subscription_playbook_s"] = subscription_playbook(bootstrap)
    figures["max_poll_exceeded_s"] = max_poll_exceeded(bootstrap)
    figures["total_s"] = sum(figures.values())
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="sluice", help="comma-separated: sluice, kafka")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--members", type=int, default=6)
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--rounds", type=int, help="rounds per system (default: 2 with kafka, else 1)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args(argv)
    versus.parse_systems(ap, args)
    if args.members < 2 or args.partitions < args.members:
        ap.error("--members must be at least 2 and --partitions at least --members")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names, skipped = sysmod.usable(args.systems)
    if skipped:
        print(skipped, flush=True)
    if not names:
        return 1
    print(f"command: {' '.join(sys.argv)}", flush=True)
    print(
        f"cluster: {args.brokers} broker(s); {args.members} members, {args.partitions} partitions; "
        f"confluent-kafka cooperative-sticky; rounds={args.rounds}",
        flush=True,
    )
    if "kafka" in names:
        print(f"Apache Kafka settings: {sysmod.kafka_settings()}", flush=True)
    print(
        "Sluice settings: group.initial.rebalance.delay.ms=0 (as Kafka's peers; 500 by default)", flush=True
    )
    rounds: list[dict[str, dict[str, float]]] = []

    def start_one(name: str, directory: Path) -> sysmod.System:
        return sysmod.start(name, directory, args.brokers, sluice_settings=MATCH_KAFKA)

    with sysmod.clusters(names, "sluice-rebalance-", start_one) as running:
        for rnd, order in enumerate(versus.round_orders(names, args.rounds)):
            one: dict[str, dict[str, float]] = {}
            for name in order:
                figures = run_round(args, running[name])
                for figure, value in figures.items():
                    one.setdefault(figure, {})[name] = value
                shown = " ".join(f"{k}={v:.1f}" for k, v in figures.items())
                print(f"round={rnd + 1} system={name} {shown}", flush=True)
            rounds.append(one)
    if len(names) == 2:
        figures = versus.median_figures(rounds)
        versus.print_figures(figures, digits=1)
        ratios = versus.ratios_json(figures)
    else:
        ratios = {}
    if args.json:
        summary = {"argv": sys.argv[1:], "rounds": rounds, "sluice_over_kafka": ratios}
        print(json.dumps(versus.finite(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The guarantees at the partition counts data teams run: incident B's drill and a broker's
kill -9 under an idempotent producer, on clusters of thousands of partitions (issue 14).

Both start three brokers at replication factor 3; the figures for time and CPU are in
bench/scale.py, these check the promise: no partition with a live in-sync replica leaderless
for long, nothing acknowledged lost, nothing duplicated. They take minutes on a 2-core machine,
so they run in the slow suite (`-m slow`)."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.chaos.checker import check
from sluice.chaos.harness import DrillCluster, LeaderlessMonitor
from sluice.chaos.incidents import controller_split_brain
from sluice.chaos.workload import VerifiableProducer, read_everything
from tests.support.cluster import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def create_partitions(dc: DrillCluster, topics: dict[str, int]) -> None:
    """Create the topics (replication factor 3) and wait until every partition has a leader."""
    admin = AdminClient({"bootstrap.servers": dc.bootstrap, "log_level": 0})
    names = sorted(topics)
    for i in range(0, len(names), 10):
        futures = admin.create_topics(
            [NewTopic(n, topics[n], 3) for n in names[i : i + 10]], operation_timeout=60
        )
        for future in futures.values():
            future.result(120)
    assert dc.wait_quiescent(300), "the new partitions never all had a leader and a full ISR"


def test_incident_b_on_3000_partitions_leaves_none_leaderless_for_long(tmp_path: Path) -> None:
    """Incident B's drill (the controller paused past its session while the group
    coordinator's broker fails; then that broker fails again) on a cluster that also holds
    3,000 partitions, the group's coordinator partition among the 50 of __consumer_offsets:
    no partition with a live in-sync replica is leaderless for more than 10 s, the group keeps
    consuming, nothing acknowledged is lost."""
    with DrillCluster(tmp_path / "b", 3) as dc:
        create_partitions(dc, {f"bulk-{i:02d}": 100 for i in range(30)})
        assert dc.store is not None
        monitor = LeaderlessMonitor(dc.store, interval_s=0.5).start()
        result = controller_split_brain(dc, random.Random(1))
        longest = monitor.stop()
    worst = max(longest.items(), key=lambda kv: kv[1], default=("-", 0.0))
    assert worst[1] <= 10.0, f"{worst[0]} had a live in-sync replica but no leader for {worst[1]:.1f} s"
    checks = {c.guarantee: c for c in result.checks}
    assert checks["the group kept consuming after each failure"].passed, checks
    assert checks["no acknowledged record lost"].passed, checks
    assert checks["the group read every acknowledged record"].passed, checks


def test_kill_9_on_2000_partitions_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """kill -9 of the broker leading the most of 200 partitions (of 2,000) while an idempotent
    acks=all producer writes to those 200: every acknowledged record is read back once."""
    with DrillCluster(tmp_path / "k", 3) as dc:
        create_partitions(dc, {"writes": 200, **{f"bulk-{i:02d}": 100 for i in range(18)}})
        producer = VerifiableProducer(dc.bootstrap, "writes", 200, writer="k9", rate_per_s=2000).start()
        wait_until(lambda: producer.acked() > 4000, 120, "the producer to get going")
        leaders = [dc.leader_of("writes", p) for p in range(200)]
        victim = max(set(leaders), key=leaders.count)
        dc.kill(victim)
        time.sleep(dc.session_timeout_s + 4.0)
        before = producer.acked()
        wait_until(lambda: producer.acked() > before + 4000, 120, "acknowledgements from the new leaders")
        dc.restart(victim)
        assert dc.wait_quiescent(300), "the restarted broker never rejoined every ISR"
        before = producer.acked()
        wait_until(lambda: producer.acked() > before + 2000, 120, "acknowledgements after the restart")
        stats = producer.stop()
        reads = read_everything(dc.bootstrap, "writes", 200)
    verdict = check(stats.acks, reads)["writes"]
    assert verdict.acknowledged > 10_000
    assert not verdict.lost, f"{len(verdict.lost)} acknowledged records lost, e.g. {verdict.lost[:3]}"
    # (one run in three read ~450 records twice, each copy under a different producer epoch:
    # the client bumped its epoch and sent again records the new leader had stored; see the
    # note on issue 14. The errors the producer saw say why it bumped.)
    assert not verdict.duplicated, (
        f"{len(verdict.duplicated)} records read twice; producer errors {dict(stats.errors)}"
    )

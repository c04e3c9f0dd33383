"""`sluice group list/describe/reset-offsets` report what a real consumer group did."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(180)

TOPIC = "lagging"
PARTITIONS = 6
PER_PARTITION = 50


def sluice(*args: str, bootstrap: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args, "--bootstrap-server", bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "250"},
    )


def offsets_table(stdout: str) -> dict[int, tuple[str, str, str, str]]:
    """partition -> (committed, end, lag, member) from the describe output."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("│ ").split("│")]
        if len(cells) == 6 and cells[0] == TOPIC:
            rows[int(cells[1])] = (cells[2], cells[3], cells[4], cells[5])
    return rows


def test_group_describe_shows_members_and_lag_that_match_what_was_consumed(cluster: TestCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)], operation_timeout=30)[TOPIC].result()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for i in range(PARTITIONS * PER_PARTITION):
        producer.produce(TOPIC, value=str(i).encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "reporting",
            "client.id": "report-app",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([TOPIC])
    consumed: dict[int, int] = {p: 0 for p in range(PARTITIONS)}
    # Consume exactly `want[p]` records of each partition, then commit what was processed.
    want = {p: 10 + 5 * p for p in range(PARTITIONS)}
    try:

        def consume_some() -> bool:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None and consumed[msg.partition()] < want[msg.partition()]:
                    consumed[msg.partition()] += 1
                    consumer.commit(
                        offsets=[TopicPartition(TOPIC, msg.partition(), msg.offset() + 1)], asynchronous=False
                    )
                    if consumed[msg.partition()] == want[msg.partition()]:
                        consumer.pause([TopicPartition(TOPIC, msg.partition())])
            return consumed == want

        wait_until(consume_some, 60, "the consumer to process its share", interval_s=0)

        listed = sluice("group", "list", bootstrap=cluster.bootstrap)
        assert listed.returncode == 0, listed.stderr
        assert re.search(r"reporting\s+│ Stable\s+│ consumer", listed.stdout), listed.stdout

        described = sluice("group", "describe", "reporting", bootstrap=cluster.bootstrap)
        assert described.returncode == 0, described.stderr
        assert "state Stable" in described.stdout
        assert "report-app" in described.stdout and "/127.0.0.1" in described.stdout
        rows = offsets_table(described.stdout)
        assert sorted(rows) == list(range(PARTITIONS)), described.stdout
        for p, (committed, end, lag, member) in rows.items():
            assert int(committed) == want[p]
            assert int(end) == PER_PARTITION
            assert int(lag) == PER_PARTITION - want[p]
            assert member.startswith("report-app")
        total = sum(PER_PARTITION - w for w in want.values())
        assert f"total_lag={total}" in described.stdout

        refused = sluice(
            "group",
            "reset-offsets",
            "reporting",
            "--topic",
            TOPIC,
            "--to-earliest",
            bootstrap=cluster.bootstrap,
        )
        assert refused.returncode != 0 and "active member" in refused.stderr
    finally:
        close_within(consumer)

    reset = sluice(
        "group",
        "reset-offsets",
        "reporting",
        "--topic",
        TOPIC,
        "--to-offset",
        "7",
        bootstrap=cluster.bootstrap,
    )
    assert reset.returncode == 0, reset.stderr
    after = offsets_table(sluice("group", "describe", "reporting", bootstrap=cluster.bootstrap).stdout)
    assert all(
        int(committed) == 7 and int(lag) == PER_PARTITION - 7 for committed, _, lag, _ in after.values()
    )

"""A broker's stop ends within its bound whatever ZooKeeper does (issue 32, item 10).

Three brokers with a ZooKeeper of their own and a replicated topic; the ZooKeeper is killed
with SIGKILL, then the brokers are stopped. The controller used to resign, then wait forever in
the delete of ``/controller`` (kazoo queues a call while it reconnects, and retries the
connection forever), and ``cluster down`` had to SIGKILL it. Each broker must now exit with
status 0 within ``stop_bound_s`` (no controlled shutdown without ZooKeeper: the session timeout
plus ``STOP_SLACK_S``), with every log closed (the clean-stop marker written), no traceback in
its log, and ``broker_stopped`` its log's last line.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.broker.broker import CLEAN_SHUTDOWN_MARKER, stop_bound_s
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.timeout(120)

BROKERS = [1, 2, 3]
SESSION_TIMEOUT_S = 6.0
#: ZooKeeper is gone before the stop begins, so there is no controlled shutdown to wait for.
BOUND_S = stop_bound_s(SESSION_TIMEOUT_S, controlled_shutdown_timeout_s=0.0)
TOPIC = "orders"
RECORDS = 30


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[TestCluster]:
    """Three brokers on a ZooKeeper of their own, holding a topic with replication factor 3."""
    c = TestCluster(None, tmp_path / "cluster", len(BROKERS), SESSION_TIMEOUT_S)
    try:
        fill_topic(c.bootstrap)
        yield c
    finally:
        c.down()


def fill_topic(bootstrap: str) -> None:
    """Create the topic and write to it (the clients are gone on return: none is left to
    reconnect to the stopped brokers)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(TOPIC, 3, 3)], operation_timeout=30).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=f"v{i}".encode())
    assert producer.flush(30) == 0, "records left unacknowledged"


def assert_stopped_cleanly(c: TestCluster, exits: dict[int, tuple[int, float]]) -> None:
    """Every broker exited with status 0 within the bound, closed its logs, and its log ends
    with its stop and holds no traceback."""
    report = {b: (f"status {exits[b][0]} after {exits[b][1]:.1f} s" if b in exits else "still running")
              for b in BROKERS}  # fmt: skip
    tails = "\n".join(f"--- broker {b}:\n" + "".join(c.log_text(b).splitlines(True)[-12:]) for b in BROKERS)
    assert all(exits.get(b, (None, 0.0))[0] == 0 for b in BROKERS), f"bound {BOUND_S} s: {report}\n{tails}"
    for b in BROKERS:
        text = c.log_text(b)
        assert "Traceback" not in text, f"broker {b}'s log has a traceback:\n{text}"
        lines = text.rstrip("\n").splitlines()
        assert f"event=broker_stopped id={b}" in lines[-1], f"broker {b}'s log ends:\n{tails}"
        assert f"event=zookeeper_unreachable_at_stop id={b}" in text, f"broker {b}:\n{tails}"
        assert re.search(rf"event=logs_closed partitions={len(BROKERS)} .*failed=0", text), tails
        assert (Path(c.broker(b).data_dir) / CLEAN_SHUTDOWN_MARKER).exists(), f"broker {b} not clean"


def test_brokers_stop_within_the_bound_with_zookeeper_gone(cluster: TestCluster) -> None:
    cluster.kill_zookeeper()
    for b in BROKERS:
        cluster.kill(b, signal.SIGTERM)
    exits = cluster.wait_exits(BROKERS, BOUND_S)
    assert_stopped_cleanly(cluster, exits)


def test_cluster_down_stops_every_broker_within_the_bound_with_zookeeper_gone(cluster: TestCluster) -> None:
    cluster.kill_zookeeper()
    started = time.monotonic()
    down = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "cluster", "down", "--dir", cluster.cluster.directory],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    took_s = time.monotonic() - started
    assert down.returncode == 0, down.stderr
    # One broker after another, each sub-second without ZooKeeper: the whole command, Python's
    # start included, fits in one broker's bound, and none had to be killed.
    assert "killed" not in down.stderr, down.stderr
    assert took_s < BOUND_S, f"cluster down took {took_s:.1f} s (bound {BOUND_S} s): {down.stderr}"
    assert_stopped_cleanly(cluster, cluster.wait_exits(BROKERS, 5.0))

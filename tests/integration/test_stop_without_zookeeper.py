"""A broker's and a worker's stop end within their bounds whatever ZooKeeper does (issue 32,
item 10).

Three brokers with a ZooKeeper of their own and a replicated topic; the ZooKeeper is killed
with SIGKILL, then the brokers are stopped. The controller used to resign, then wait forever in
the delete of ``/controller`` (kazoo queues a call while it reconnects, and retries the
connection forever), and ``cluster down`` had to SIGKILL it. Each broker must now exit with
status 0 within ``stop_bound_s`` (no controlled shutdown without ZooKeeper: the session timeout
plus ``STOP_SLACK_S``), with every log closed (the clean-stop marker written), no traceback in
its log, and ``broker_stopped`` its log's last line.

A worker running a task (a generator into SQLite: a capture thread and a Spark apply query), its
ZooKeeper killed the same way, then SIGTERM: the worker's loop used to wait forever in the task's
status check (kazoo again), so it never saw the stop and ``cluster down`` killed it. It must now
exit with status 0 within ``pipeline.worker.stop_bound_s``, having said once that ZooKeeper was
unreachable, with no traceback in its log and nothing of it left running (its Spark driver JVM).
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.broker.broker import CLEAN_SHUTDOWN_MARKER, stop_bound_s
from sluice.pipeline import worker
from tests.support.cluster import TestCluster, group_left, wait_exits, wait_until

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


# -- a worker ------------------------------------------------------------------------------------

WORKER = "worker-1"
#: The worker's own ZooKeeper session is ZkStore's default (6 s), whatever the brokers' is.
WORKER_BOUND_S = worker.stop_bound_s()
#: Records the task must have applied before ZooKeeper goes: its query and capture are running.
APPLIED_FIRST = 200
#: How often the worker's loop checks its tasks: a quarter of its group session (10 s by default).
LOOP_PASS_S = 2.5


@pytest.fixture
def worker_cluster(tmp_path: Path) -> Iterator[TestCluster]:
    """One broker and one worker (`cluster up --workers 1`) on a ZooKeeper of their own, the
    worker running a generator task into SQLite. Every process goes at the
    end, whatever happened: a worker killed past its bound leaves its Spark driver JVM to
    `TestCluster.down`."""
    c = TestCluster(None, tmp_path / "cluster", 1, SESSION_TIMEOUT_S, workers=1)
    try:
        target = tmp_path / "gen.db"
        spec = tmp_path / "gen.yaml"
        spec.write_text(
            "id: gen\nsource: {kind: generator, rate: 200, seed: 3}\n"
            f"target: sqlite:///{target}\noptions: {{trigger: 500ms, partitions: 1, replication_factor: 1}}\n"
        )
        created = subprocess.run(
            [sys.executable, "-m", "sluice.cli", "task", "create", "--file", str(spec),
             "--zookeeper", c.zookeeper],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        wait_until(lambda: applied(target) >= APPLIED_FIRST, 240, f"{APPLIED_FIRST} records applied")
        yield c
    finally:
        c.down()


def applied(target: Path) -> int:
    """Records the task has committed to SQLite (0 before its first commit, or while locked)."""
    if not target.exists():
        return 0
    db = sqlite3.connect(target, timeout=0.1)
    try:
        return int(db.execute("SELECT coalesce(sum(next_offset), 0) FROM _sluice_offsets").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()


def assert_worker_stopped_cleanly(c: TestCluster, exit: tuple[int, float] | None) -> None:
    """The worker exited with status 0 within its bound, said once that ZooKeeper was
    unreachable, logged no traceback, and left nothing of it running (its Spark driver)."""
    w = c.worker(WORKER)
    text = Path(w.log_file).read_text(errors="replace")
    tail = "".join(text.splitlines(True)[-25:])
    report = "still running" if exit is None else f"status {exit[0]} after {exit[1]:.1f} s"
    assert exit is not None and exit[0] == 0, f"bound {WORKER_BOUND_S} s: {report}\n--- {WORKER}:\n{tail}"
    assert "Traceback" not in text, f"{WORKER}'s log has a traceback:\n{text[-6000:]}"
    assert text.count(f"event=zookeeper_unreachable_at_stop worker={WORKER}") == 1, tail
    assert f"event=worker_stopped worker={WORKER}" in text, tail
    # (py4j logs its connections' close as the interpreter exits)
    ours = [line for line in text.rstrip().splitlines() if " py4j." not in line]
    assert ours[-1] == f"worker {WORKER} stopped", tail
    # Its Spark driver JVM exits once the worker's end closes its stdin.
    wait_until(lambda: not group_left(w.pid), 20, f"{WORKER}'s processes (its Spark driver) to exit")


@pytest.mark.timeout(400)
def test_a_worker_stops_within_its_bound_with_zookeeper_gone(worker_cluster: TestCluster) -> None:
    c = worker_cluster
    c.kill_zookeeper()
    w = c.worker(WORKER)
    # The loop checks its task's status every LOOP_PASS_S; once it has made a pass since
    # ZooKeeper went, it is inside a ZooKeeper call that kazoo holds until it reconnects (for good),
    # and the stop must end that call (cluster down, in the next test, stops it at once, with the
    # loop anywhere).
    refused = "Connection dropped: socket connection error: Connection refused"
    wait_until(lambda: refused in Path(w.log_file).read_text(errors="replace"), 30, "a reconnection refused")
    time.sleep(2 * LOOP_PASS_S + 1.0)
    os.kill(w.pid, signal.SIGTERM)
    exit = wait_exits({w.pid: WORKER}, WORKER_BOUND_S).get(WORKER)
    assert_worker_stopped_cleanly(c, exit)
    text = Path(w.log_file).read_text(errors="replace")
    # the stop found the loop inside a ZooKeeper call, and ended it
    assert "event=task_check_ended_at_stop task=gen" in text or "event=worker_loop_left_at_stop" in text, (
        text[-4000:]
    )


@pytest.mark.timeout(400)
def test_cluster_down_stops_a_worker_within_its_bound_with_zookeeper_gone(
    worker_cluster: TestCluster,
) -> None:
    c = worker_cluster
    c.kill_zookeeper()
    started = time.monotonic()
    down = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "cluster", "down", "--dir", c.cluster.directory],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    took_s = time.monotonic() - started
    assert down.returncode == 0, down.stderr
    assert f"worker {WORKER}" in down.stderr and "killed" not in down.stderr, down.stderr
    # The worker within its bound, then the broker sub-second without ZooKeeper.
    assert took_s < WORKER_BOUND_S, f"cluster down took {took_s:.1f} s (worker bound {WORKER_BOUND_S} s)"
    w = c.worker(WORKER)
    assert_worker_stopped_cleanly(c, wait_exits({w.pid: WORKER}, 5.0).get(WORKER))

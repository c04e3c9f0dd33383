"""The `sluice` command line against a real local cluster, as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from sluice.ops.ports import free_port
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(180)


def sluice(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
    )


def test_cluster_up_status_topic_produce_consume_down(tmp_path: Path) -> None:
    d = str(tmp_path / "cli-cluster")
    up = sluice("cluster", "up", "--brokers", "1", "--dir", d)
    assert up.returncode == 0, up.stderr
    bootstrap = re.search(r"^bootstrap\.servers=(\S+)$", up.stdout, re.M)
    zookeeper = re.search(r"^zookeeper=(\S+)$", up.stdout, re.M)
    assert bootstrap and zookeeper, up.stdout
    env = {"SLUICE_BOOTSTRAP": bootstrap.group(1)}
    try:
        status = sluice("cluster", "status", "--dir", d)
        assert status.returncode == 0, status.stderr
        assert re.search(r"│ 1\s+│ 127\.0\.0\.1:\d+\s+│ \d+\s+│ yes\s+│ yes\s+│ \*", status.stdout), (
            status.stdout
        )
        # the same cluster seen from ZooKeeper alone, as on a host that did not start it
        remote = sluice(
            "cluster", "status", "--zookeeper", zookeeper.group(1), "--dir", str(tmp_path / "none")
        )
        assert remote.returncode == 0, remote.stderr
        assert re.search(r"│ 1\s+│ 127\.0\.0\.1:\d+\s+│ \d+\s+│ \?\s+│ yes\s+│ \*", remote.stdout), (
            remote.stdout
        )
        assert "live_brokers=1" in remote.stdout and "offline_partitions=0" in remote.stdout

        created = sluice(
            "topic", "create", "orders", "--partitions", "3", "--config", "retention.ms=86400000", env=env
        )
        assert created.returncode == 0, created.stderr
        again = sluice("topic", "create", "orders", "--partitions", "3", env=env)
        assert again.returncode != 0 and "already exists" in again.stderr
        assert "orders" in sluice("topic", "list", env=env).stdout.split()

        produced = sluice("produce", "orders", "--key-separator", ":", stdin="a:1\nb:2\nc:3\n", env=env)
        assert produced.returncode == 0, produced.stderr
        assert "3 record(s) acknowledged" in produced.stderr
        consumed = sluice(
            "consume", "orders", "--from-beginning", "--max-messages", "3", "--print-key", env=env
        )
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.splitlines()) == ["a\t1", "b\t2", "c\t3"]

        described = sluice("topic", "describe", "orders", env=env)
        assert described.returncode == 0, described.stderr
        rows = [line for line in described.stdout.splitlines() if re.match(r"│ [0-2]\s+│", line)]
        assert len(rows) == 3
        # Every partition led by broker 1; the log end offsets add up to the 3 records.
        ends = [int(re.split(r"\s*│\s*", r)[6]) for r in rows]
        assert sum(ends) == 3, described.stdout

        deleted = sluice("topic", "delete", "orders", env=env)
        assert deleted.returncode == 0, deleted.stderr
        assert "orders" not in sluice("topic", "list", env=env).stdout.split()
        missing = sluice("topic", "describe", "orders", env=env)
        assert missing.returncode != 0 and "does not exist" in missing.stderr
    finally:
        down = sluice("cluster", "down", "--dir", d)
    assert down.returncode == 0, down.stderr
    assert "broker 1" in down.stderr and "zookeeper" in down.stderr
    after = sluice("cluster", "status", "--dir", d)
    assert re.search(r"│ 1\s+│ 127\.0\.0\.1:\d+\s+│ \d+\s+│ no", after.stdout), after.stdout


def test_two_clusters_side_by_side_do_not_collide(tmp_path: Path) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    outs = []
    try:
        for d in dirs:
            up = sluice("cluster", "up", "--dir", d)
            assert up.returncode == 0, up.stderr
            outs.append(up.stdout)
        assert outs[0] != outs[1]
    finally:
        for d in dirs:
            sluice("cluster", "down", "--dir", d)


def test_cluster_up_overrides_make_a_producer_create_its_topic_with_num_partitions(
    zookeeper: str, tmp_path: Path
) -> None:
    """`--override key=value` sets a broker config key for every broker: a client that expects
    topics created on first use with several partitions works against `cluster up`."""
    d = str(tmp_path / "overridden")
    up = sluice(
        "cluster", "up", "--brokers", "2", "--dir", d, "--zookeeper", f"{zookeeper}/t-overrides",
        "--override", "auto.create.topics.enable=true", "--override", "num.partitions=4",
        "--override", "default.replication.factor=2",
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    bootstrap = re.search(r"^bootstrap\.servers=(\S+)$", up.stdout, re.M)
    assert bootstrap, up.stdout
    try:
        producer = Producer({"bootstrap.servers": bootstrap.group(1), "acks": "all"})
        delivered: list[object] = []
        producer.produce("made-on-first-use", value=b"v", on_delivery=lambda err, msg: delivered.append(err))
        assert producer.flush(30) == 0
        assert delivered == [None]
        admin = AdminClient({"bootstrap.servers": bootstrap.group(1)})
        topic = admin.list_topics("made-on-first-use", timeout=10).topics["made-on-first-use"]
        assert len(topic.partitions) == 4
        assert all(len(p.replicas) == 2 for p in topic.partitions.values())
    finally:
        down = sluice("cluster", "down", "--dir", d)
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("num.partitions=zero", "'num.partitions'"),
        ("auto.create.topics.enabled=true", "'auto.create.topics.enabled'"),
        ("broker.id=7", "broker.id"),
        ("log.dirs=/tmp/elsewhere", "log.dirs"),
        ("no-equals-sign", "key=value"),
    ],
)
def test_cluster_up_refuses_a_bad_override_before_starting_anything(
    tmp_path: Path, override: str, named: str
) -> None:
    d = tmp_path / "refused"
    up = sluice("cluster", "up", "--dir", str(d), "--override", override, timeout=30)
    assert up.returncode != 0
    assert named in up.stderr, up.stderr
    assert up.stderr.count("\n") <= 3, up.stderr  # one error, no traceback
    assert not d.exists() or not any(d.iterdir()), "cluster up started something"


def test_second_broker_with_same_id_is_refused(cluster: TestCluster, tmp_path: Path) -> None:
    result = sluice(
        "broker",
        "start",
        "--id",
        "1",
        "--port",
        str(free_port()),
        "--data-dir",
        str(tmp_path / "other"),
        "--zookeeper",
        cluster.zookeeper,
        "--zk-session-timeout",
        "2",
        timeout=60,
    )
    assert result.returncode != 0
    assert "already registered by a live broker" in result.stderr, result.stderr
    # The first broker is unaffected.
    assert "event=broker_stopping" not in cluster.log_text(1)


def test_broker_refuses_a_data_dir_in_use(cluster: TestCluster) -> None:
    result = sluice(
        "broker",
        "start",
        "--id",
        "2",
        "--port",
        str(free_port()),
        "--data-dir",
        cluster.broker(1).data_dir,
        "--zookeeper",
        cluster.zookeeper,
        timeout=60,
    )
    assert result.returncode != 0
    assert "in use by another running broker" in result.stderr, result.stderr


def test_single_replica_topic_needs_the_flag_and_its_loss_is_reported_with_the_reason(
    make_cluster: Callable[..., TestCluster],
) -> None:
    cluster = make_cluster(2)
    env = {"SLUICE_BOOTSTRAP": cluster.bootstrap}
    refused = sluice("topic", "create", "fragile", "--partitions", "2", "--replication-factor", "1", env=env)
    assert refused.returncode != 0 and "--allow-single-replica" in refused.stderr
    assert "offline" in refused.stderr
    created = sluice(
        "topic",
        "create",
        "fragile",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--allow-single-replica",
        env=env,
    )
    assert created.returncode == 0, created.stderr
    assert "warning" in created.stderr

    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics("fragile", timeout=10)
    victim = md.topics["fragile"].partitions[0].leader
    cluster.kill(victim)
    status = wait_until(
        lambda: (
            (r := sluice("cluster", "status", "--dir", str(cluster.directory)))
            and "offline_partitions=1" in r.stdout
            and r
        ),
        30,
        "cluster status to report the offline partition",
    )
    assert f"its only replica, broker {victim}, is down" in status.stdout.replace("\n", " ")
    described = sluice("topic", "describe", "fragile", env=env)
    assert "offline" in described.stdout and f"broker {victim}" in described.stdout

"""What a local cluster writes is its owner's alone (issue 33, finding 6): data directories 0700,
log files 0600, and the processes `cluster up` starts (ZooKeeper, brokers, workers) create
their files with umask 077, so a segment, a checkpoint or a snapshot is never world-readable.

Failing run before the fix, on a secured cluster:

    AssertionError: {'cluster directory': '0o755', 'broker-1 data directory': '0o755',
    'broker-1.log': '0o644', 'a segment': '0o644', ...}
    Left contains 8 more items: {'a segment': '0o644', 'broker-1 data directory': '0o755',
    'broker-1.log': '0o644', 'cluster directory': '0o755', ...}
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.ops import launcher
from tests.support.cluster import wait_until


def _mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def _umask(pid: int) -> str | None:
    """The umask of a running process, from /proc (Linux 4.7 and later)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    return None


def test_data_directories_and_logs_are_the_owners_alone(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    cluster = launcher.cluster_up(directory, 1, workers=1, security="sasl_ssl")
    try:
        b = cluster.brokers[0]
        w = cluster.workers[0]
        config = {
            "bootstrap.servers": cluster.bootstrap_servers,
            **cluster.client_security().confluent_config(),
        }
        admin = AdminClient(config)
        for future in admin.create_topics([NewTopic("modes", 1, 1)]).values():
            future.result(60)
        producer = Producer(config)
        for i in range(10):
            producer.produce("modes", value=f"secret-{i}".encode())
        assert producer.flush(60) == 0
        segments = wait_until(
            lambda: [p for p in Path(b.data_dir).glob("modes-0/*.log")], 30, "the topic's segment"
        )
        zk_dir = directory / "zookeeper"
        got = {
            "cluster directory": _mode(directory),
            f"broker-{b.broker_id} data directory": _mode(Path(b.data_dir)),
            f"broker-{b.broker_id}.log": _mode(Path(b.log_file)),
            "a segment": _mode(segments[0]),
            "zookeeper directory": _mode(zk_dir),
            "zookeeper snapshots": _mode(zk_dir / "data"),
            "zookeeper.out": _mode(zk_dir / "zookeeper.out"),
            f"{w.name}.log": _mode(Path(w.log_file)),
        }
        umasks = {
            "broker": _umask(b.pid),
            "worker": _umask(w.pid),
            "zookeeper": _umask(int((zk_dir / "zookeeper.pid").read_text())),
        }
        want_dirs = {k for k in got if "directory" in k or k == "zookeeper snapshots"}
        assert {k: v for k, v in got.items() if v != ("0o700" if k in want_dirs else "0o600")} == {}, got
        assert umasks == {"broker": "0077", "worker": "0077", "zookeeper": "0077"}, umasks
        assert os.access(Path(b.data_dir), os.R_OK)  # the owner still reads everything
    finally:
        launcher.cluster_down(directory)

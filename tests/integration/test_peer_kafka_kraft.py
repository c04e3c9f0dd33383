"""Apache Kafka as a local KRaft peer (issue 20): `sluice peer up kafka --brokers 3 --kraft`
starts Kafka 4.x without ZooKeeper (three nodes, each broker and controller, storage formatted
with one cluster id), prints bootstrap.servers like the ZooKeeper mode, serves an RF 3 topic
acks=all writes and a group's reads from confluent-kafka, and `sluice peer down` leaves no
Kafka process behind. Skipped only when scripts/peers.sh could not fetch Kafka 4.x's jars."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.peers.kafka import KRAFT_VERSION, PeerError, kafka_libs, new_cluster_id
from tests.integration.test_peer_kafka import _kafka_pids, _sluice, serves_an_rf3_topic

pytestmark = pytest.mark.timeout(240)


def test_peer_up_kafka_kraft_serves_an_rf3_topic_and_down_stops_it(tmp_path: Path) -> None:
    try:
        kafka_libs(KRAFT_VERSION)
    except PeerError as exc:
        pytest.skip(str(exc))
    directory = tmp_path / "peer"
    up = _sluice("peer", "up", "kafka", "--brokers", "3", "--kraft", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        lines = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        assert lines["mode"] == "kraft" and lines["kafka_version"] == KRAFT_VERSION
        assert "zookeeper" not in lines and not (directory / "zookeeper").exists()
        bootstrap = lines["bootstrap.servers"]
        assert len(bootstrap.split(",")) == 3 and len(_kafka_pids(directory)) == 3
        state = json.loads((directory / "peer.json").read_text())
        assert state["mode"] == "kraft" and state["cluster_id"]
        for b in state["brokers"]:  # every node a voter of the one quorum, on one cluster id
            props = (Path(b["directory"]) / "server.properties").read_text()
            assert "process.roles=broker,controller\n" in props
            meta = (Path(b["directory"]) / "data" / "meta.properties").read_text()
            assert f"cluster.id={state['cluster_id']}" in meta
        serves_an_rf3_topic(bootstrap)
    finally:
        down = _sluice("peer", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr[-3000:]
    assert "stopped=3" in down.stdout
    left = _kafka_pids(directory)
    for pid in left:  # stop them even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, "a KRaft peer node outlived `sluice peer down`"
    assert not (directory / "peer.json").exists()


def test_peer_up_kraft_with_zookeeper_is_refused(tmp_path: Path) -> None:
    done = _sluice(
        "peer", "up", "kafka", "--kraft", "--zookeeper", "127.0.0.1:2181", "--dir", str(tmp_path / "p")
    )
    assert done.returncode != 0 and "--kraft and --zookeeper exclude each other" in done.stderr, done.stderr
    assert not (tmp_path / "p").exists()


def test_cluster_ids_are_kafka_uuids_no_command_line_reads_as_an_option() -> None:
    ids = {new_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_peer_up_kraft_without_the_jars_says_how_to_fetch_them(tmp_path: Path) -> None:
    env = {**os.environ, "SLUICE_PEERS_DIR": str(tmp_path / "none")}
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "peer", "up", "kafka", "--kraft",
         "--dir", str(tmp_path / "p")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert f"Kafka {KRAFT_VERSION} is not fetched" in done.stderr and "run scripts/peers.sh" in done.stderr

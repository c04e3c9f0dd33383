"""Apache Kafka as a local peer (issue 20): `sluice peer up kafka --brokers 3` prints
bootstrap.servers like `sluice cluster up`, the brokers take an RF 3 topic, acks=all writes and
a group's reads from confluent-kafka, and `sluice peer down` leaves no broker process behind.
Skipped only when scripts/peers.sh could not fetch Kafka's jars (Maven Central unreachable)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.peers.kafka import PeerCluster, PeerError, kafka_libs

pytestmark = pytest.mark.timeout(240)


def _libs_or_skip() -> None:
    try:
        kafka_libs()
    except PeerError as exc:
        pytest.skip(str(exc))


def _sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args], capture_output=True, text=True, timeout=180
    )


def _kafka_pids(directory: Path) -> set[int]:
    """Kafka JVMs whose command line names ``directory``: other engineers' and tests' Kafka
    brokers on the same machine come and go during the test and are not ours."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
                if b"kafka.Kafka" in args and any(str(directory).encode() in a for a in args):
                    pids.add(int(entry.name))
            except OSError:
                pass
    return pids


def serves_an_rf3_topic(bootstrap: str) -> None:
    """An RF 3 topic on the peer takes 300 acks=all idempotent writes and a group reads them all."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic("peer-rf3", 3, 3)])["peer-rf3"].result(60)

    def replicas() -> set[int]:
        """Replica counts of the topic's partitions, as the broker asked knows them now: a
        broker learns a new topic from the controller after CreateTopics has answered (in CI a
        KRaft broker still listed it with no partitions), so this is waited for."""
        parts = admin.list_topics("peer-rf3", timeout=10).topics["peer-rf3"].partitions
        return {len(p.replicas) for p in parts.values()} if len(parts) == 3 else set()

    deadline = time.monotonic() + 30
    while replicas() != {3} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert replicas() == {3}
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(300):
        producer.produce("peer-rf3", b"%d" % i, partition=i % 3)
    assert producer.flush(60) == 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "peer-readers", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(["peer-rf3"])
    got: set[bytes] = set()
    deadline = time.monotonic() + 60
    while len(got) < 300 and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got.add(msg.value())
    consumer.close()
    assert got == {b"%d" % i for i in range(300)}


def test_peer_up_kafka_serves_an_rf3_topic_and_down_stops_it(tmp_path: Path) -> None:
    _libs_or_skip()
    directory = tmp_path / "peer"
    up = _sluice("peer", "up", "kafka", "--brokers", "3", "--heap", "448m", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        lines = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        bootstrap = lines["bootstrap.servers"]
        assert len(bootstrap.split(",")) == 3 and lines["kafka_version"] == "3.9.1"
        assert lines["mode"] == "zookeeper" and lines["heap"] == "448m"
        pids = _kafka_pids(directory)
        assert len(pids) == 3
        for pid in pids:
            assert b"-Xmx448m" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        serves_an_rf3_topic(bootstrap)
        again = _sluice("peer", "up", "kafka", "--dir", str(directory))
        assert again.returncode != 0 and "already" in again.stderr, again.stderr
    finally:
        down = _sluice("peer", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr[-3000:]
    assert "stopped=3" in down.stdout
    left = _kafka_pids(directory)
    for pid in left:  # stop them even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not left, "a peer broker outlived `sluice peer down`"
    assert not (directory / "peer.json").exists()


def test_peer_up_refuses_a_heap_that_is_no_jvm_size(tmp_path: Path) -> None:
    done = _sluice("peer", "up", "kafka", "--heap", "lots", "--dir", str(tmp_path / "p"))
    assert done.returncode != 0 and "--heap 'lots' is not a JVM heap size" in done.stderr, done.stderr
    assert not (tmp_path / "p").exists()


def test_peer_up_without_the_jars_says_how_to_fetch_them(tmp_path: Path) -> None:
    env = {**os.environ, "SLUICE_PEERS_DIR": str(tmp_path / "none")}
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "peer", "up", "kafka", "--dir", str(tmp_path / "p")],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode != 0 and "run scripts/peers.sh" in done.stderr, done.stderr


def test_a_sasl_ssl_peer_takes_its_admin_over_tls_and_refuses_a_plaintext_client(tmp_path: Path) -> None:
    """`peer up kafka --security sasl_ssl --brokers 2`: the brokers replicate over TLS (an RF 2
    topic's acks=all writes need both), the admin's client properties (SCRAM, the peer's CA)
    write and read, and a PLAINTEXT client gets no metadata from the TLS listener."""
    _libs_or_skip()
    directory = tmp_path / "peer"
    up = _sluice("peer", "up", "kafka", "--brokers", "2", "--security", "sasl_ssl", "--dir", str(directory))
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        lines = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        assert lines["security"] == "sasl_ssl"
        props = dict(line.split("=", 1) for line in Path(lines["client_properties"]).read_text().splitlines())
        assert props["security.protocol"] == "SASL_SSL" and Path(props["ssl.ca.location"]).is_file()
        cluster = PeerCluster.load(directory)
        conf = {
            "bootstrap.servers": lines["bootstrap.servers"],
            **cluster.client_security().confluent_config(),
        }
        admin = AdminClient(conf)  # kept: the futures fail once their client is destroyed
        admin.create_topics([NewTopic("over-tls", 1, 2)])["over-tls"].result(60)
        producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
        for i in range(100):
            producer.produce("over-tls", b"%d" % i)
        assert producer.flush(60) == 0
        consumer = Consumer({**conf, "group.id": "tls-readers", "auto.offset.reset": "earliest"})
        consumer.subscribe(["over-tls"])
        got: set[bytes] = set()
        deadline = time.monotonic() + 60
        while len(got) < 100 and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.add(msg.value())
        consumer.close()
        assert got == {b"%d" % i for i in range(100)}
        plain = AdminClient({"bootstrap.servers": lines["bootstrap.servers"], "log_level": 0})
        with pytest.raises(Exception):  # noqa: B017 (librdkafka: a transport failure, any kind)
            plain.list_topics(timeout=5)
    finally:
        down = _sluice("peer", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr[-3000:]
    assert not _kafka_pids(directory)

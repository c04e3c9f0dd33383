"""`sluice broker start --config`: a broker from a properties file, and bad configurations
refused before the broker touches its data directory or ZooKeeper (issue 15, acceptance 5)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from sluice.ops import launcher
from sluice.ops.ports import ADDRESS_IN_USE_EXIT, free_port

pytestmark = pytest.mark.timeout(120)


def broker_start(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "broker", "start", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


class WatchedPort:
    """A TCP port standing in for ZooKeeper that counts the connections made to it."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def watched_zookeeper() -> Iterator[WatchedPort]:
    port = WatchedPort()
    try:
        yield port
    finally:
        port.close()


def base_config(tmp_path: Path, zk_port: int, listen_port: int) -> str:
    return (
        f"broker.id=1\nlisteners=PLAINTEXT://127.0.0.1:{listen_port}\nlog.dirs={tmp_path / 'data'}\n"
        f"zookeeper.connect=127.0.0.1:{zk_port}/c\n"
    )


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ("brokr.rack=r1\n", "unknown key 'brokr.rack'; did you mean 'broker.rack'?"),
        ("min.insync.replicas=none\n", "bad value 'none' for 'min.insync.replicas'"),
        (
            "listeners=PLAINTEXT://127.0.0.1:99999\n",
            "bad value 'PLAINTEXT://127.0.0.1:99999' for 'listeners'",
        ),
    ],
)
def test_a_bad_key_or_value_stops_the_broker_before_it_touches_anything(
    tmp_path: Path, watched_zookeeper: WatchedPort, extra: str, says: str
) -> None:
    path = tmp_path / "broker.properties"
    path.write_text(base_config(tmp_path, watched_zookeeper.port, free_port()) + extra)
    done = broker_start("--config", str(path))
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert says in message and str(path) in message, done.stderr
    assert "Traceback" not in done.stderr
    assert len([line for line in done.stderr.splitlines() if "error:" in line]) == 1, done.stderr
    assert watched_zookeeper.accepted == 0
    assert not (tmp_path / "data").exists()


def test_a_listener_that_cannot_bind_stops_the_broker_before_it_touches_anything(
    tmp_path: Path, watched_zookeeper: WatchedPort
) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        port = taken.getsockname()[1]
        path = tmp_path / "broker.properties"
        path.write_text(base_config(tmp_path, watched_zookeeper.port, port))
        done = broker_start("--config", str(path))
        message = " ".join(done.stderr.split())
        assert done.returncode == ADDRESS_IN_USE_EXIT, "the launcher picks other ports on this status"
        assert f"listener PLAINTEXT://127.0.0.1:{port} cannot be bound" in message, done.stderr
        assert "Address already in use" in message, done.stderr
        # an address that is not this host's
        path.write_text(base_config(tmp_path, watched_zookeeper.port, free_port()).replace(
            "PLAINTEXT://127.0.0.1:", "PLAINTEXT://192.0.2.1:"
        ))  # fmt: skip
        done = broker_start("--config", str(path))
        assert done.returncode not in (0, ADDRESS_IN_USE_EXIT), "not an address another port mends"
        assert "listener PLAINTEXT://192.0.2.1:" in " ".join(done.stderr.split()), done.stderr
    finally:
        taken.close()
    assert watched_zookeeper.accepted == 0
    assert not (tmp_path / "data").exists()


def test_a_broker_from_a_config_file_serves_clients_at_its_advertised_address(
    tmp_path: Path, zookeeper: str
) -> None:
    """The listener binds every address; clients are told `localhost`, and confluent-kafka
    produces and consumes through it. min.insync.replicas=2 from the file holds back acks=all
    on this single broker (the broker's log defaults reach its partitions)."""
    port = free_port()
    path = tmp_path / "broker.properties"
    chroot = f"/broker-config-{os.getpid()}-{port}"
    path.write_text(
        f"broker.id=0\nlisteners=PLAINTEXT://0.0.0.0:{port}\n"
        f"advertised.listeners=PLAINTEXT://localhost:{port}\nlog.dirs={tmp_path / 'data'}\n"
        f"zookeeper.connect={zookeeper.split('/')[0]}{chroot}\nauto.create.topics.enable=true\n"
    )
    with open(tmp_path / "broker.log", "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "broker", "start", "--config", str(path),
             "--override", "min.insync.replicas=2"],
            stdout=subprocess.DEVNULL, stderr=log_file, start_new_session=True,
        )  # fmt: skip
    try:
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": "all", "retries": 0})
        md = producer.list_topics(timeout=20)
        assert [(b.host, b.port) for b in md.brokers.values()] == [("localhost", port)]
        errors: list[str] = []
        producer.produce("cfg", b"v1", on_delivery=lambda e, _m: errors.append(e and e.name()))
        producer.flush(25)
        assert errors == ["NOT_ENOUGH_REPLICAS"], errors
        one = Producer({"bootstrap.servers": f"localhost:{port}", "acks": "1"})
        delivered: list[object] = []
        one.produce("cfg", b"v2", on_delivery=lambda e, m: delivered.append(e or m.offset()))
        one.flush(20)
        assert delivered and isinstance(delivered[0], int), delivered
        consumer = Consumer(
            {"bootstrap.servers": f"localhost:{port}", "group.id": "g", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe(["cfg"])
        got = None
        deadline = time.monotonic() + 30
        while got is None and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got = msg.value()
        consumer.close()
        assert got == b"v2"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_worker_with_a_bad_config_file_stops_before_it_connects(
    tmp_path: Path, watched_zookeeper: WatchedPort
) -> None:
    path = tmp_path / "worker.properties"
    path.write_text(
        f"bootstrap.servers=127.0.0.1:{free_port()}\nzookeeper.connect=127.0.0.1:{watched_zookeeper.port}/w\n"
        "group.id=g\nspark.mastr=local[1]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "worker", "start", "--config", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    message = " ".join(done.stderr.split())
    assert done.returncode != 0
    assert "unknown key 'spark.mastr'; did you mean 'spark.master'?" in message and str(path) in message
    assert "Traceback" not in done.stderr
    assert watched_zookeeper.accepted == 0


def test_cluster_up_starts_a_broker_again_on_new_ports_when_another_server_took_a_picked_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ports are picked free and reserved by nobody (ops.ports): another test's server that picked
    the same one at random can bind it first. The broker exits ADDRESS_IN_USE_EXIT and the
    launcher starts it on new ports; the cluster comes up."""
    taken = socket.create_server(("127.0.0.1", 0))
    picked: list[list[int]] = []
    real = launcher.free_ports

    def pick(n: int, host: str = "127.0.0.1") -> list[int]:
        ports = real(n, host=host)
        if n == 3 and not any(len(p) == 3 for p in picked):  # the broker's first three
            ports[0] = taken.getsockname()[1]
        picked.append(ports)
        return ports

    monkeypatch.setattr(launcher, "free_ports", pick)
    try:
        cluster = launcher.cluster_up(tmp_path / "c", 1)
        try:
            (b,) = cluster.brokers
            assert (
                b.port != taken.getsockname()[1] and [b.port, b.internal_port, b.metrics_port] == picked[-1]
            )
            assert len(picked) == 3, "ZooKeeper's port, the broker's taken three, its next three"
        finally:
            launcher.cluster_down(tmp_path / "c")
    finally:
        taken.close()


def test_a_restarted_broker_whose_metrics_or_internal_port_was_taken_comes_back_on_new_ones(
    tmp_path: Path,
) -> None:
    """While a broker is down another server may bind one of its picked ports (ops.ports). Its
    restart keeps the listener's port (clients know it) and picks new inter-broker and metrics
    ports; a taken listener port is said, naming it."""
    cluster = launcher.cluster_up(tmp_path / "c", 1)
    try:
        (b,) = cluster.brokers
        listener, old_internal, old_metrics = b.port, b.internal_port, b.metrics_port
        assert old_internal is not None and old_metrics is not None
        launcher.stop_pid(b.pid, sig=signal.SIGKILL)
        with (
            socket.create_server(("127.0.0.1", old_metrics)),
            socket.create_server(("127.0.0.1", old_internal)),
        ):
            launcher.restart_broker(cluster, b)
        assert b.port == listener and old_metrics != b.metrics_port and old_internal != b.internal_port
        saved = launcher.LocalCluster.load(tmp_path / "c").broker(1)
        assert (saved.metrics_port, saved.internal_port) == (b.metrics_port, b.internal_port)
        assert b.metrics_url is not None
        with urllib.request.urlopen(b.metrics_url, timeout=10) as answer:
            assert b"sluice_" in answer.read()

        launcher.stop_pid(b.pid, sig=signal.SIGKILL)
        with (
            socket.create_server(("127.0.0.1", listener)),
            pytest.raises(
                launcher.AddressTakenError, match=f"its listener port 127.0.0.1:{listener} is taken"
            ),
        ):
            launcher.restart_broker(cluster, b, timeout_s=30)
        launcher.restart_broker(cluster, b)  # freed: it comes back on its port
        assert b.port == listener and launcher.port_open(b.host, b.port)
    finally:
        launcher.cluster_down(tmp_path / "c")

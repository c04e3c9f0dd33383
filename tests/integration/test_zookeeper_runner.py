"""LocalZooKeeper runs a real standalone ZooKeeper (Debian package) that kazoo can use."""

from __future__ import annotations

import logging
import re
import socket
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, RolledBackError
from kazoo.protocol.serialization import Connect

from sluice.ops.ports import free_port, free_ports, port_open
from sluice.ops.zookeeper import LocalZooKeeper, find_classpath

try:
    find_classpath()
except RuntimeError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(str(exc), allow_module_level=True)

pytestmark = pytest.mark.timeout(60)


class _Records(logging.Handler):
    """Collects the formatted messages of a logger."""

    def __init__(self) -> None:
        super().__init__(level=1)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record's message."""
        self.messages.append(record.getMessage())


@pytest.fixture
def zk(tmp_path: Path) -> Iterator[LocalZooKeeper]:
    """A running server on a free port, stopped after the test."""
    server = LocalZooKeeper(tmp_path / "zk", free_port(), force_sync=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _kazoo(connect_string: str, timeout_s: float, logger: logging.Logger | None = None) -> KazooClient:
    """Return a started kazoo client with the given session timeout."""
    client = KazooClient(hosts=connect_string, timeout=timeout_s, logger=logger)
    client.start(timeout=10)
    return client


def _negotiated_timeout_ms(connect_string: str, requested_ms: int) -> int:
    """Open a raw ZooKeeper session asking for ``requested_ms``; return what the server grants."""
    host, port = connect_string.rsplit(":", 1)
    request = Connect(0, 0, requested_ms, 0, b"\0" * 16, False).serialize()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(struct.pack("!i", len(request)) + request)
        (length,) = struct.unpack("!i", _recv_exactly(sock, 4))
        response, _ = Connect.deserialize(_recv_exactly(sock, length), 0)
    return int(response.time_out)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes."""
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "server closed the connection"
        data += chunk
    return data


def test_session_ephemeral_transaction_and_stop(zk: LocalZooKeeper) -> None:
    """A 6 s kazoo session, an ephemeral znode, all-or-nothing transactions, then stop."""
    assert zk.is_running()
    assert zk.pid_path.read_text().strip() == str(zk.pid)

    records = _Records()
    logger = logging.getLogger("test.zookeeper_runner.kazoo")
    logger.setLevel(1)  # kazoo logs the negotiated timeout at its BLATHER level (5)
    logger.addHandler(records)
    client = _kazoo(zk.connect_string, 6.0, logger)
    try:
        negotiated = [
            int(m.group(1))
            for text in records.messages
            if (m := re.search(r"negotiated session timeout: (\d+)", text))
        ]
        assert negotiated == [6000]

        # An ephemeral znode belongs to the session and disappears when it closes.
        client.create("/sluice/brokers/ids/1", b"broker-1", ephemeral=True, makepath=True)
        _, stat = client.get("/sluice/brokers/ids/1")
        assert stat.ephemeralOwner == client.client_id[0]

        # A transaction guarded by a version check commits as a whole...
        client.create("/sluice/controller_epoch", b"0")
        txn = client.transaction()
        txn.check("/sluice/controller_epoch", 0)
        txn.set_data("/sluice/controller_epoch", b"1")
        txn.create("/sluice/controller", b"broker-1")
        assert txn.commit() == [True, client.get("/sluice/controller_epoch")[1], "/sluice/controller"]
        data, stat = client.get("/sluice/controller_epoch")
        assert (data, stat.version) == (b"1", 1)

        # ...and a failed check (stale version 0) aborts every operation in it.
        txn = client.transaction()
        txn.create("/sluice/stale_marker", b"")
        txn.check("/sluice/controller_epoch", 0)
        txn.set_data("/sluice/controller_epoch", b"2")
        results = txn.commit()
        assert isinstance(results[0], RolledBackError)
        assert isinstance(results[1], BadVersionError)
        assert client.exists("/sluice/stale_marker") is None
        assert client.get("/sluice/controller_epoch")[0] == b"1"
    finally:
        client.stop()
        client.close()
        logger.removeHandler(records)

    other = _kazoo(zk.connect_string, 6.0)
    try:
        assert other.exists("/sluice/brokers/ids/1") is None
        assert other.get("/sluice/controller")[0] == b"broker-1"
    finally:
        other.stop()
        other.close()

    zk.stop()
    assert not zk.is_running()
    assert not zk.pid_path.exists()
    assert not port_open(zk.host, zk.port)
    zk.stop()  # stopping again is harmless


def test_session_timeout_bounds(zk: LocalZooKeeper) -> None:
    """Requested session timeouts are granted within [min, max] and clamped outside it."""
    # The server grants 2 s to 30 s as asked and clamps to [1 s, 60 s] (tick is 0.5 s).
    for requested, granted in [(2000, 2000), (6000, 6000), (30000, 30000), (200, 1000), (120000, 60000)]:
        assert _negotiated_timeout_ms(zk.connect_string, requested) == granted


def test_restart_keeps_data(zk: LocalZooKeeper) -> None:
    """Stopping and starting on the same directory keeps the znodes."""
    client = _kazoo(zk.connect_string, 6.0)
    client.create("/kept", b"value")
    client.stop()
    client.close()
    zk.stop()
    zk.start()
    client = _kazoo(zk.connect_string, 6.0)
    try:
        assert client.get("/kept")[0] == b"value"
    finally:
        client.stop()
        client.close()


def test_two_servers_at_once_and_stop_from_pidfile(tmp_path: Path) -> None:
    """Two servers started concurrently are independent; one stops through its pid file."""
    servers = [
        LocalZooKeeper(tmp_path / f"zk{i}", port, force_sync=False) for i, port in enumerate(free_ports(2))
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(), servers))
        assert all(s.is_running() for s in servers)
        clients = [_kazoo(s.connect_string, 6.0) for s in servers]
        try:
            clients[0].create("/only-on-first", b"")
            assert clients[1].exists("/only-on-first") is None
        finally:
            for client in clients:
                client.stop()
                client.close()

        # Another process would stop a server through its pid file.
        assert LocalZooKeeper.stop_from_pidfile(servers[0].data_dir) is True
        assert not servers[0].is_running()
        assert not port_open(servers[0].host, servers[0].port)
        assert servers[1].is_running()
        assert LocalZooKeeper.stop_from_pidfile(servers[0].data_dir) is False
    finally:
        for server in servers:
            server.stop()
    assert not port_open(servers[1].host, servers[1].port)


def test_start_fails_clearly_when_port_is_taken(tmp_path: Path) -> None:
    """start() refuses a port another process listens on, without launching Java."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server = LocalZooKeeper(tmp_path / "zk", squatter.getsockname()[1])
        with pytest.raises(RuntimeError, match="already in use"):
            server.start()
    assert not server.is_running()

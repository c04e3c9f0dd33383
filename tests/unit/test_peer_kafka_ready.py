"""When `sluice peer up` calls a Kafka peer ready. A Kafka broker registers in ZooKeeper a second
or two before it enables request processing: another broker's Metadata already names it while
its own port still refuses connections. A suite run connected to it in that gap."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.ops.ports import free_port
from sluice.peers import kafka
from sluice.peers.kafka import PeerBroker, PeerCluster, PeerError


class _Metadata:
    brokers = {1: object(), 2: object()}


class _Admin:
    """Metadata from the first broker up: both brokers registered."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def list_topics(self, timeout: float) -> _Metadata:
        return _Metadata()


def test_the_peer_is_ready_once_every_brokers_own_port_accepts_not_when_metadata_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import confluent_kafka.admin

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _Admin)
    first = socket.create_server(("127.0.0.1", 0))
    late_port = free_port()
    cluster = PeerCluster(
        str(tmp_path),
        "3.9.1",
        "zk:1",
        None,
        [
            PeerBroker(1, first.getsockname()[1], str(tmp_path / "b1"), pid=os.getpid()),
            PeerBroker(2, late_port, str(tmp_path / "b2"), pid=os.getpid()),
        ],
    )
    try:
        with pytest.raises(PeerError, match=r"\[2\] not yet accepting connections"):
            kafka._wait_registered(cluster, timeout_s=1.5)
        late: list[socket.socket] = []
        opener = threading.Timer(1.0, lambda: late.append(socket.create_server(("127.0.0.1", late_port))))
        opener.start()
        t0 = time.monotonic()
        kafka._wait_registered(cluster, timeout_s=20)
        assert late and time.monotonic() - t0 >= 0.9, "ready only once broker 2 listened"
        opener.join()
        late[0].close()
    finally:
        first.close()

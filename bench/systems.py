"""A local cluster of Sluice or of Apache Kafka behind one small interface, for the benchmarks
that run both (issue 20): start, the brokers' pids and addresses, kill -9, controlled shutdown,
restart with the same data, stop.

Sluice's side is ``sluice.ops.launcher``; Kafka's is ``sluice.peers.kafka`` (``peer_up``,
``restart_broker``, ``peer_down``). Both run with the same ZooKeeper session timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer

from sluice.ops import launcher
from sluice.peers.kafka import HEAP, PeerCluster, PeerError, kafka_libs, peer_down, peer_up, restart_broker


def kafka_settings(session_timeout_s: float = 6.0, heap: str = HEAP) -> str:
    """What the comparison runs with on Kafka's side, printed beside the figures."""
    return (
        f"zookeeper.session.timeout.ms={round(session_timeout_s * 1000)} (as Sluice's zk session timeout), "
        "replica.lag.time.max.ms=30000, unclean.leader.election.enable=false, "
        "controlled.shutdown.enable=true (Kafka's defaults), group.initial.rebalance.delay.ms=0, "
        f"-Xmx{heap} per broker (sluice.peers.kafka)"
    )


#: how the output names each system
LABELS = {"sluice": "Sluice", "sluice_sasl_ssl": "Sluice (SASL_SSL)", "kafka": "Apache Kafka"}


@dataclass(frozen=True, slots=True)
class Broker:
    broker_id: int
    pid: int
    address: str
    log_file: str


def kafka_missing() -> str | None:
    """Why Kafka cannot run here (its jars not fetched), or None when it can."""
    try:
        kafka_libs()
    except PeerError as exc:
        return str(exc)
    return None


def usable(systems: list[str]) -> tuple[list[str], str | None]:
    """``systems`` without Kafka when its jars are missing, and the message saying so."""
    if "kafka" not in systems:
        return systems, None
    why = kafka_missing()
    if why is None:
        return systems, None
    return [s for s in systems if s != "kafka"], f"skipping Apache Kafka: {why}"


class System:
    """One running local cluster; ``name`` is "sluice", "sluice_sasl_ssl" or "kafka"."""

    name: str
    label: str
    directory: Path

    def client_config(self) -> dict[str, str]:
        """librdkafka settings a client of this cluster needs beyond ``bootstrap.servers``."""
        return {}

    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    def brokers(self) -> list[Broker]:
        raise NotImplementedError

    def broker(self, broker_id: int) -> Broker:
        for b in self.brokers():
            if b.broker_id == broker_id:
                return b
        raise KeyError(f"no broker {broker_id} in the {self.label} cluster")

    def kill(self, broker_id: int) -> None:
        """kill -9."""
        os.kill(self.broker(broker_id).pid, signal.SIGKILL)

    def stop(self, broker_id: int, timeout_s: float = 60.0) -> bool:
        """SIGTERM (a controlled shutdown) and wait for the exit; SIGKILL after ``timeout_s``.
        True if it exited within the time."""
        pid = self.broker(broker_id).pid
        started = time.monotonic()
        launcher.stop_pid(pid, timeout_s=timeout_s)
        return time.monotonic() - started < timeout_s

    def restart(self, broker_id: int, timeout_s: float = 120.0) -> None:
        """Start a stopped broker again with its data; returns once it is registered."""
        raise NotImplementedError

    def down(self, fast: bool = False) -> None:
        """Stop everything; ``fast``: kill -9 the brokers first (nothing is measured any more)."""
        raise NotImplementedError


class SluiceSystem(System):
    def __init__(
        self,
        directory: Path,
        brokers: int,
        session_timeout_s: float,
        settings: dict[str, str] | None = None,
        security: str = "none",
    ) -> None:
        self.name = "sluice" if security == "none" else f"sluice_{security}"
        self.label = "Sluice" if security == "none" else f"Sluice ({security.upper()})"
        self.directory = directory
        self.cluster = launcher.cluster_up(
            directory,
            brokers,
            zk_session_timeout_s=session_timeout_s,
            broker_settings=settings,
            security=security,
        )

    def client_config(self) -> dict[str, str]:
        return dict(self.cluster.client_security().confluent_config())

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    def brokers(self) -> list[Broker]:
        return [Broker(b.broker_id, b.pid, b.address, b.log_file) for b in self.cluster.brokers]

    def restart(self, broker_id: int, timeout_s: float = 120.0) -> None:
        b = self.cluster.broker(broker_id)
        launcher.stop_pid(b.pid)  # a controlled shutdown may still be finishing
        launcher.restart_broker(self.cluster, b, timeout_s=timeout_s)

    def down(self, fast: bool = False) -> None:
        if fast:  # nothing is measured any more: no controlled shutdown of thousands of partitions
            for b in self.cluster.brokers:
                launcher.stop_pid(b.pid, sig=signal.SIGKILL)
        if (self.directory / launcher.STATE_FILE).exists():
            launcher.cluster_down(self.directory)


class KafkaSystem(System):
    def __init__(self, directory: Path, brokers: int, session_timeout_s: float, heap: str) -> None:
        self.name, self.label, self.directory = "kafka", "Apache Kafka", directory
        timeout_ms = str(round(session_timeout_s * 1000))
        self.cluster: PeerCluster = peer_up(
            directory, brokers, properties={"zookeeper.session.timeout.ms": timeout_ms}, heap=heap
        )

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    def brokers(self) -> list[Broker]:
        return [
            Broker(b.broker_id, b.pid, f"127.0.0.1:{b.port}", str(Path(b.directory) / "server.log"))
            for b in self.cluster.brokers
        ]

    def restart(self, broker_id: int, timeout_s: float = 120.0) -> None:
        (b,) = [x for x in self.cluster.brokers if x.broker_id == broker_id]
        launcher.stop_pid(b.pid)
        try:
            os.waitpid(b.pid, 0)  # a child of this process (peer_up's Popen): reap it
        except ChildProcessError:
            pass
        restart_broker(self.cluster, broker_id, timeout_s)  # saves the new pid for peer_down

    def down(self, fast: bool = False) -> None:
        if fast:
            for b in self.cluster.brokers:
                launcher.stop_pid(b.pid, sig=signal.SIGKILL)
        peer_down(self.directory)


def start(
    name: str,
    directory: Path,
    brokers: int,
    session_timeout_s: float = 6.0,
    sluice_settings: dict[str, str] | None = None,
    kafka_heap: str = HEAP,
) -> System:
    """A fresh local cluster of ``brokers`` brokers of ``name`` under ``directory``, with the
    ZooKeeper session timeout ``session_timeout_s`` on either side; ``sluice_settings``: more
    keys of each Sluice broker's configuration (to match Kafka's); ``kafka_heap``: each Kafka
    broker's ``-Xmx``."""
    if name == "sluice":
        return SluiceSystem(directory, brokers, session_timeout_s, sluice_settings)
    if name == "sluice_sasl_ssl":  # cluster up --security sasl_ssl; clients as its admin user
        return SluiceSystem(directory, brokers, session_timeout_s, sluice_settings, security="sasl_ssl")
    return KafkaSystem(directory, brokers, session_timeout_s, kafka_heap)


@contextmanager
def clusters(
    names: list[str], prefix: str, start_one: Callable[[str, Path], System]
) -> Iterator[dict[str, System]]:
    """One cluster per system name (``start_one(name, directory)``), under a temporary directory
    removed afterwards; every cluster is stopped at the end, also on Ctrl-C, which ends the
    rounds early and keeps what was measured."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    running: dict[str, System] = {}
    try:
        try:
            for name in names:
                running[name] = start_one(name, directory / name)
        except KeyboardInterrupt:
            print("interrupted while starting; stopping the clusters", file=sys.stderr)
            raise SystemExit(130) from None
        try:
            yield running
        except KeyboardInterrupt:
            print("interrupted; stopping the clusters", file=sys.stderr)
    finally:
        for system in running.values():
            system.down()
        shutil.rmtree(directory, ignore_errors=True)


def group_consumer(bootstrap: str, prefix: str, client_config: dict[str, str] | None = None) -> Consumer:
    """A consumer in a new group of its own, reading from the earliest offset; ``client_config``:
    the cluster's client settings (``System.client_config()``)."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{prefix}-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "log_level": 0,
            **(client_config or {}),
        }
    )

"""A local cluster of Sluice or of Apache Kafka behind one small interface, for the benchmarks
that run both (issue 20): start, the brokers' pids and addresses, kill -9, controlled shutdown,
restart with the same data, stop.

Sluice's side is ``sluice.ops.launcher``; Kafka's is ``sluice.peers.kafka`` (``peer_up``,
``peer_down``, ``PeerCluster``). The peer module has no call to restart one broker, so a Kafka
broker is restarted here with the command line its JVM was started with (read from
``/proc/<pid>/cmdline`` while it runs), and the new pid is saved in ``peer.json`` so that
``peer_down`` still stops it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from sluice.ops import launcher
from sluice.ops.processes import pid_alive
from sluice.peers.kafka import PeerCluster, PeerError, kafka_libs, peer_down, peer_up

#: ``zookeeper.session.timeout.ms`` of every peer broker (``sluice.peers.kafka`` writes 6000).
KAFKA_SESSION_TIMEOUT_S = 6.0
#: What the comparison runs with on Kafka's side, printed beside the figures.
KAFKA_SETTINGS = (
    "zookeeper.session.timeout.ms=6000 (as Sluice's zk session timeout), replica.lag.time.max.ms="
    "30000, unclean.leader.election.enable=false, controlled.shutdown.enable=true (Kafka's defaults), "
    "group.initial.rebalance.delay.ms=0, -Xmx384m per broker (sluice.peers.kafka)"
)


#: how the output names each system
LABELS = {"sluice": "Sluice", "kafka": "Apache Kafka"}


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
    """One running local cluster; ``name`` is "sluice" or "kafka"."""

    name: str
    label: str
    directory: Path

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
    ) -> None:
        self.name, self.label, self.directory = "sluice", "Sluice", directory
        self.cluster = launcher.cluster_up(
            directory, brokers, zk_session_timeout_s=session_timeout_s, broker_settings=settings
        )

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
    def __init__(self, directory: Path, brokers: int) -> None:
        self.name, self.label, self.directory = "kafka", "Apache Kafka", directory
        self.cluster: PeerCluster = peer_up(directory, brokers)
        #: broker id -> the command line its JVM runs, for a restart after it stopped
        self._commands = {b.broker_id: _cmdline(b.pid) for b in self.cluster.brokers}

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
        with (Path(b.directory) / "stdout.log").open("ab") as out:
            proc = subprocess.Popen(
                self._commands[broker_id], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        b.pid = proc.pid
        self.cluster.save()  # peer_down reads the pids from peer.json
        deadline = time.monotonic() + timeout_s
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{b.port}", "log_level": 0})
        while time.monotonic() < deadline:
            if not pid_alive(b.pid):
                raise RuntimeError(f"Kafka broker {broker_id} exited during its restart; see {b.directory}")
            try:
                if broker_id in admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # not listening yet
                pass
            time.sleep(0.25)
        raise TimeoutError(f"Kafka broker {broker_id} not registered {timeout_s:.0f} s after its restart")

    def down(self, fast: bool = False) -> None:
        if fast:
            for b in self.cluster.brokers:
                launcher.stop_pid(b.pid, sig=signal.SIGKILL)
        peer_down(self.directory)


def _cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


def start(
    name: str,
    directory: Path,
    brokers: int,
    session_timeout_s: float = 6.0,
    sluice_settings: dict[str, str] | None = None,
) -> System:
    """A fresh local cluster of ``brokers`` brokers of ``name`` under ``directory``;
    ``sluice_settings``: more keys of each Sluice broker's configuration (to match Kafka's)."""
    if name == "sluice":
        return SluiceSystem(directory, brokers, session_timeout_s, sluice_settings)
    if session_timeout_s != KAFKA_SESSION_TIMEOUT_S:
        raise PeerError(
            f"Kafka's peers run with zookeeper.session.timeout.ms=6000 (sluice.peers.kafka); "
            f"--session-timeout {session_timeout_s:g} would not compare like with like: leave it at 6"
        )
    return KafkaSystem(directory, brokers)

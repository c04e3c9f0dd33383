"""Apache Kafka as a local peer: a cluster of Kafka brokers on the same Debian ZooKeeper Sluice
uses, for benchmarks and drills that run both side by side (issue 20).

The broker jars are Kafka's own, fetched by ``scripts/peers.sh`` (versions pinned in
``bench/peers/pom.xml``) into ``.peers/kafka-<version>/libs``; nothing of Kafka is part of Sluice.
Everything a peer cluster writes stays under one directory::

    peer.json                 what runs (version, ZooKeeper, each broker's port and pid)
    zookeeper/                a private standalone ZooKeeper (sluice.ops.zookeeper), unless one
                              was given
    broker-<id>/server.properties, log4j.properties, server.log, stdout.log, data/

Brokers run in ZooKeeper mode (``kafka.Kafka``, Kafka 3.9: the last line that has it) under
the chroot ``/kafka-peer``, each in its own session so that they outlive the command that
started them; ``down`` sends SIGTERM (Kafka's controlled shutdown), then SIGKILL after a grace.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sluice.ops.ports import free_ports
from sluice.ops.processes import pid_alive
from sluice.ops.zookeeper import LocalZooKeeper, find_java

__all__ = [
    "CHROOT",
    "KAFKA_VERSION",
    "PeerCluster",
    "PeerError",
    "kafka_libs",
    "peer_down",
    "peer_up",
    "restart_broker",
]

log = logging.getLogger("sluice.peers")

#: The pinned Kafka version (``bench/peers/pom.xml``'s ``kafka.version``).
KAFKA_VERSION = "3.9.1"
CHROOT = "/kafka-peer"
STATE_FILE = "peer.json"
#: What a peer broker's JVM may take: three of them fit beside Sluice's on this 2-core machine.
HEAP = "-Xmx384m"
_MAIN_CLASS = "kafka.Kafka"


class PeerError(Exception):
    """A peer cluster cannot be started or stopped; the message says what to do next."""


def _project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """The directory of Kafka ``version``'s jars. ``SLUICE_PEERS_DIR`` overrides where peers are
    kept (default: ``.peers`` in the project). Raises PeerError naming the set-up step."""
    base = Path(os.environ.get("SLUICE_PEERS_DIR") or _project_root() / ".peers")
    libs = base / f"kafka-{version}" / "libs"
    if not (libs.parent / ".complete").is_file():
        raise PeerError(
            f"Kafka {version} is not fetched (no {libs}): run scripts/peers.sh (needs Maven and "
            "Maven Central)"
        )
    return libs


@dataclass
class PeerBroker:
    broker_id: int
    port: int
    directory: str
    pid: int = -1
    #: this broker's own way to ZooKeeper (e.g. a drill's proxy that can cut it off), if not
    #: the cluster's
    zookeeper: str | None = None


@dataclass
class PeerCluster:
    """A running (or described) peer cluster; saved as ``peer.json`` in its directory."""

    directory: str
    version: str
    zookeeper: str
    zookeeper_dir: str | None
    brokers: list[PeerBroker] = field(default_factory=list)
    #: broker properties set beyond `broker_properties`' own (a drill's settings)
    properties: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path) -> PeerCluster:
        path = directory / STATE_FILE
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise PeerError(f"no peer cluster in {directory} (no {STATE_FILE})") from None
        raw["brokers"] = [PeerBroker(**b) for b in raw["brokers"]]
        return cls(**raw)


def broker_properties(
    broker: PeerBroker, zookeeper: str, brokers: int, extra: dict[str, str] | None = None
) -> str:
    """A peer broker's ``server.properties``: Kafka's defaults but for what a small local
    cluster needs (internal topics replicated as far as the brokers allow, no initial rebalance
    delay, ZooKeeper session as Sluice's brokers have it)."""
    rf = min(3, brokers)
    data = Path(broker.directory) / "data"
    lines: dict[str, object] = {
        "broker.id": broker.broker_id,
        "listeners": f"PLAINTEXT://127.0.0.1:{broker.port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker.port}",
        "log.dirs": data,
        "zookeeper.connect": f"{broker.zookeeper or zookeeper}{CHROOT}",
        "zookeeper.session.timeout.ms": 6000,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min(2, rf),
        "group.initial.rebalance.delay.ms": 0,
        "num.partitions": 1,
        **(extra or {}),
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


_LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


def _start_broker(
    java: str, libs: Path, broker: PeerBroker, zookeeper: str, brokers: int, extra: dict[str, str]
) -> int:
    d = Path(broker.directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "server.properties").write_text(broker_properties(broker, zookeeper, brokers, extra))
    (d / "log4j.properties").write_text(_LOG4J.format(path=d / "server.log"))
    cmd = [
        java,
        HEAP,
        "-XX:+UseG1GC",
        f"-Dlog4j.configuration=file:{d / 'log4j.properties'}",
        f"-Dkafka.logs.dir={d}",
        "-cp",
        f"{libs}/*",
        _MAIN_CLASS,
        str(d / "server.properties"),
    ]
    with (d / "stdout.log").open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc.pid


def _wait_registered(cluster: PeerCluster, timeout_s: float) -> None:
    """Until every broker answers Metadata naming all of them (each registered in ZooKeeper)."""
    from confluent_kafka.admin import AdminClient

    want = {b.broker_id for b in cluster.brokers}
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        for b in cluster.brokers:
            if not pid_alive(b.pid):
                tail = _tail(Path(b.directory) / "server.log") or _tail(Path(b.directory) / "stdout.log")
                raise PeerError(f"Kafka broker {b.broker_id} exited during start; its log ends:\n{tail}")
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})
        try:
            seen = set(admin.list_topics(timeout=2).brokers)
            if seen == want:
                return
            last = f"brokers {sorted(seen)} registered"
        except Exception as exc:  # not up yet
            last = str(exc)
        time.sleep(0.5)
    raise PeerError(f"Kafka brokers not all up after {timeout_s:.0f} s ({last}); see {cluster.directory}")


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def peer_up(
    directory: Path,
    brokers: int = 1,
    *,
    zookeeper: str | None = None,
    version: str = KAFKA_VERSION,
    timeout_s: float = 120,
    broker_zookeeper: dict[int, str] | None = None,
    properties: dict[str, str] | None = None,
) -> PeerCluster:
    """Start ``brokers`` Kafka brokers (and a private ZooKeeper unless ``zookeeper`` names one)
    with their files under ``directory``; returns once every broker is registered.
    ``broker_zookeeper`` gives broker N its own HOST:PORT for ZooKeeper (a drill's proxy);
    ``properties`` are broker settings beyond the defaults (a drill's)."""
    if brokers < 1:
        raise PeerError(f"--brokers must be at least 1, got {brokers}")
    directory = directory.resolve()
    if (directory / STATE_FILE).exists():
        raise PeerError(
            f"a peer cluster is already in {directory}: stop it with `sluice peer down --dir {directory}`"
        )
    libs = kafka_libs(version)
    java = find_java()
    directory.mkdir(parents=True, exist_ok=True)
    zk_dir: Path | None = None
    ports = free_ports(brokers + (0 if zookeeper else 1))
    if zookeeper is None:
        zk_dir = directory / "zookeeper"
        zk = LocalZooKeeper(zk_dir, ports.pop())
        zk.start()
        zookeeper = zk.connect_string
    zk_of = broker_zookeeper or {}
    cluster = PeerCluster(
        str(directory),
        version,
        zookeeper,
        None if zk_dir is None else str(zk_dir),
        [
            PeerBroker(i + 1, ports[i], str(directory / f"broker-{i + 1}"), zookeeper=zk_of.get(i + 1))
            for i in range(brokers)
        ],
        dict(properties or {}),
    )
    cluster.save()  # before any broker starts: `peer down` can always find what it must stop
    try:
        for b in cluster.brokers:
            b.pid = _start_broker(java, libs, b, zookeeper, brokers, cluster.properties)
            cluster.save()
            log.info("event=peer_broker_started kind=kafka id=%d port=%d pid=%d", b.broker_id, b.port, b.pid)
        _wait_registered(cluster, timeout_s)
    except BaseException:
        peer_down(directory)
        raise
    return cluster


def restart_broker(cluster: PeerCluster, broker_id: int, timeout_s: float = 60) -> PeerBroker:
    """Start a stopped broker of ``cluster`` again from its own directory (its data kept); returns
    once every broker is registered again."""
    broker = next(b for b in cluster.brokers if b.broker_id == broker_id)
    if broker.pid > 0 and _is_peer_broker(broker.pid):
        raise PeerError(f"Kafka broker {broker_id} is still running (pid {broker.pid})")
    libs = kafka_libs(cluster.version)
    broker.pid = _start_broker(
        find_java(), libs, broker, cluster.zookeeper, len(cluster.brokers), cluster.properties
    )
    cluster.save()
    log.info("event=peer_broker_restarted kind=kafka id=%d pid=%d", broker_id, broker.pid)
    _wait_registered(cluster, timeout_s)
    return broker


def _is_peer_broker(pid: int) -> bool:
    """The pid still names one of our Kafka JVMs (not a process that reused the number)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _MAIN_CLASS.encode() in cmdline


def peer_down(directory: Path, grace_s: float = 30) -> PeerCluster:
    """Stop a peer cluster: SIGTERM to every broker (controlled shutdown), SIGKILL to any still
    running after ``grace_s``, then its private ZooKeeper; the state file goes last."""
    directory = directory.resolve()
    cluster = PeerCluster.load(directory)
    running = [b for b in cluster.brokers if b.pid > 0 and _is_peer_broker(b.pid)]
    for b in running:
        os.kill(b.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while running and time.monotonic() < deadline:
        running = [b for b in running if pid_alive(b.pid) and _is_peer_broker(b.pid)]
        time.sleep(0.2)
    for b in running:
        log.warning(
            "event=peer_broker_killed id=%d pid=%d reason='no exit %.0f s after SIGTERM'",
            b.broker_id,
            b.pid,
            grace_s,
        )
        os.kill(b.pid, signal.SIGKILL)
    if cluster.zookeeper_dir is not None:
        LocalZooKeeper.stop_from_pidfile(Path(cluster.zookeeper_dir))
    (directory / STATE_FILE).unlink(missing_ok=True)
    return cluster

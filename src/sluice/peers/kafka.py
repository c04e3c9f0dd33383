"""Apache Kafka as a local peer: a cluster of Kafka brokers on the same Debian ZooKeeper Sluice
uses, or a KRaft cluster without ZooKeeper, for benchmarks and drills that run both side by side
(issue 20).

The broker jars are Kafka's own, fetched by ``scripts/peers.sh`` (versions pinned in
``bench/peers/pom.xml`` for ZooKeeper mode, ``bench/peers/kafka4/pom.xml`` for KRaft) into
``.peers/kafka-<version>/libs``; nothing of Kafka is part of Sluice. Everything a peer cluster
writes stays under one directory::

    peer.json                 what runs (mode, version, ZooKeeper, each broker's ports and pid)
    zookeeper/                a private standalone ZooKeeper (sluice.ops.zookeeper), unless one
                              was given (ZooKeeper mode only)
    broker-<id>/server.properties, log4j.properties (log4j2.properties in KRaft mode),
                server.log, stdout.log, format.log (KRaft), data/

ZooKeeper mode: Kafka 3.9 (the last line that has it), brokers under the chroot ``/kafka-peer``.
KRaft mode (``kraft=True``): Kafka 4.x in combined mode, every node both broker and controller,
the quorum a static ``controller.quorum.voters`` of all nodes; each node's storage is formatted
(``kafka.tools.StorageTool format``, what ``kafka-storage.sh`` runs) with one cluster id before
any starts. Either way the main class is ``kafka.Kafka``, each broker in its own session so that
it outlives the command that started it; ``down`` sends SIGTERM (Kafka's controlled shutdown),
then SIGKILL after a grace.

``security="sasl_plaintext"`` (ZooKeeper mode; issue 33's differential authorization suite):
one SASL_PLAINTEXT listener with SCRAM-SHA-256 and SCRAM-SHA-512, on which the brokers also
replicate, and Kafka's ``AclAuthorizer`` with the super user ``admin``. Its SCRAM credential is
written into the peer's chroot (Kafka's ``/config/users`` layout) before any broker starts, with
a random password kept in the owner-only ``client.properties`` (the admin's Kafka client
properties), ``peer.json`` and the brokers' ``server.properties``. ``security="sasl_ssl"`` is the
same on a SASL_SSL listener (Sluice's ``cluster up --security sasl_ssl`` beside it: issue 35's
SASL_SSL/plaintext figures): a local CA and the brokers' certificate (``tls/``, made by
``sluice.security.tls.local_ca``) as Kafka's PEM key and trust stores, the brokers replicating over
TLS too.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sluice.ops.peer_jars import KAFKA_VERSION, KRAFT_VERSION, PeerError, kafka_libs
from sluice.ops.ports import free_ports, port_open
from sluice.ops.processes import pid_alive
from sluice.ops.zookeeper import LocalZooKeeper, find_java
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.security.tls import local_ca

__all__ = [
    "ADMIN_USER",
    "CHROOT",
    "KAFKA_VERSION",
    "KRAFT_VERSION",
    "SECURITY_MODES",
    "PeerCluster",
    "PeerError",
    "kafka_libs",
    "peer_down",
    "peer_up",
    "restart_broker",
]

log = logging.getLogger("sluice.peers")

ZOOKEEPER_MODE = "zookeeper"
KRAFT_MODE = "kraft"
CHROOT = "/kafka-peer"
STATE_FILE = "peer.json"
#: What a peer broker's JVM may take by default (``-Xmx``): three of them fit beside Sluice's on a
#: small machine. Kafka at thousands of partitions needs more (``--heap``).
HEAP = "384m"
_HEAP_FORM = re.compile(r"[1-9][0-9]*[kKmMgG]")
_MAIN_CLASS = "kafka.Kafka"
#: what ``kafka-storage.sh format`` runs (Kafka 4.x keeps it in kafka_2.13's jar)
_STORAGE_TOOL = "kafka.tools.StorageTool"
#: ``peer_up(security=)``: PLAINTEXT, or SCRAM and Kafka's ACL authorizer on a SASL_PLAINTEXT or
#: a SASL_SSL listener
SECURITY_MODES = ("none", "sasl_plaintext", "sasl_ssl")
#: each security mode's listener (and inter-broker) protocol
LISTENER_PROTOCOLS = {"none": "PLAINTEXT", "sasl_plaintext": "SASL_PLAINTEXT", "sasl_ssl": "SASL_SSL"}
#: ``security="sasl_ssl"``: the local CA and the brokers' certificate, under the peer's directory
TLS_DIR = "tls"
#: the peer's super user with ``security="sasl_plaintext"`` (the brokers replicate as it too)
ADMIN_USER = "admin"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: ZooKeeper mode's authorizer (Kafka 3.9; KRaft's is StandardAuthorizer)
ACL_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
CLIENT_PROPERTIES = "client.properties"


@dataclass
class PeerBroker:
    broker_id: int
    port: int
    directory: str
    pid: int = -1
    #: this broker's own way to ZooKeeper (e.g. a drill's proxy that can cut it off), if not
    #: the cluster's
    zookeeper: str | None = None
    #: KRaft mode: this node's CONTROLLER listener port (-1 in ZooKeeper mode)
    controller_port: int = -1


@dataclass
class PeerCluster:
    """A running (or described) peer cluster; saved as ``peer.json`` in its directory."""

    directory: str
    version: str
    #: HOST:PORT of ZooKeeper; empty in KRaft mode
    zookeeper: str
    zookeeper_dir: str | None
    brokers: list[PeerBroker] = field(default_factory=list)
    #: broker properties set beyond `broker_properties`' own (a drill's settings)
    properties: dict[str, str] = field(default_factory=dict)
    #: ``zookeeper`` or ``kraft``
    mode: str = ZOOKEEPER_MODE
    #: KRaft mode: the cluster id every node's storage was formatted with
    cluster_id: str | None = None
    #: every broker JVM's maximum heap (``-Xmx``), e.g. ``384m``, ``2g``
    heap: str = HEAP
    #: one of SECURITY_MODES
    security: str = "none"
    #: ``sasl_plaintext``: ADMIN_USER's password (this file is owner-only)
    admin_password: str | None = field(default=None, repr=False)
    #: ``sasl_ssl``: the CA of the brokers' certificate (a client's ``ssl.ca.location``)
    ca_file: str | None = None
    #: ``sasl_ssl``: the brokers' certificate chain and key, one PEM file (owner-only)
    keystore: str | None = None

    @property
    def kraft(self) -> bool:
        return self.mode == KRAFT_MODE

    @property
    def client_properties(self) -> Path | None:
        """The admin's Kafka client properties (security on), else None."""
        return Path(self.directory) / CLIENT_PROPERTIES if self.security != "none" else None

    def client_security(self) -> ClientSecurity:
        """How a client reaches the brokers as ADMIN_USER (PLAINTEXT with security off)."""
        if self.security == "none":
            return PLAINTEXT
        ca = Path(self.ca_file) if self.ca_file else None
        return ClientSecurity(
            LISTENER_PROTOCOLS[self.security], "SCRAM-SHA-512", ADMIN_USER, self.admin_password, ca
        )

    @property
    def controller_quorum_voters(self) -> str:
        """KRaft mode: ``id@host:port`` of every node, the static controller quorum."""
        return ",".join(f"{b.broker_id}@127.0.0.1:{b.controller_port}" for b in self.brokers)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers)

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        _write_private(tmp, json.dumps(asdict(self), indent=2))  # it may hold the admin's password
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


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only (it may hold a password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def sasl_properties(admin_password: str, protocol: str = "SASL_PLAINTEXT") -> dict[str, str]:
    """A broker's settings for a SASL ``protocol`` (SASL_PLAINTEXT or SASL_SSL): SCRAM on its
    listener, the brokers replicating on it as ADMIN_USER (SCRAM-SHA-512), and Kafka's ACL
    authorizer with ADMIN_USER its super user (``allow.everyone.if.no.acl.found`` stays false)."""
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN_USER}" password="{admin_password}";'
    )
    return {
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        "security.inter.broker.protocol": protocol,
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        **{f"listener.name.{protocol.lower()}.{m.lower()}.sasl.jaas.config": jaas for m in SCRAM_MECHANISMS},
        "authorizer.class.name": ACL_AUTHORIZER,
        "super.users": f"User:{ADMIN_USER}",
    }


def tls_properties(keystore: str, ca_file: str) -> dict[str, str]:
    """A broker's TLS settings (``security="sasl_ssl"``): its certificate chain and key in one
    PEM file, the CA it trusts (the other brokers' certificates, replicating over TLS) as PEM; no
    client certificates asked for (clients authenticate with SCRAM)."""
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": keystore,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": ca_file,
        "ssl.client.auth": "none",
    }


def broker_properties(
    broker: PeerBroker,
    zookeeper: str,
    brokers: int,
    extra: dict[str, str] | None = None,
    *,
    admin_password: str | None = None,
    tls: tuple[str, str] | None = None,
) -> str:
    """A peer broker's ``server.properties``: Kafka's defaults but for what a small local
    cluster needs (internal topics replicated as far as the brokers allow, no initial rebalance
    delay, ZooKeeper session as Sluice's brokers have it). With ``admin_password``, a
    SASL_PLAINTEXT listener and ACLs (`sasl_properties`), SASL_SSL with ``tls`` as well (the
    keystore and the CA file, `tls_properties`). ``{port}`` and ``{id}`` in a value of
    ``extra`` are this broker's own port and id (a second listener beside its first one, a
    ``broker.rack`` of its own)."""
    rf = min(3, brokers)
    data = Path(broker.directory) / "data"
    if tls is not None and admin_password is None:
        raise PeerError("a SASL_SSL peer needs the admin's password as well as its certificates")
    protocol = "PLAINTEXT" if admin_password is None else "SASL_SSL" if tls else "SASL_PLAINTEXT"
    lines: dict[str, object] = {
        "broker.id": broker.broker_id,
        "listeners": f"{protocol}://127.0.0.1:{broker.port}",
        "advertised.listeners": f"{protocol}://127.0.0.1:{broker.port}",
        **(sasl_properties(admin_password, protocol) if admin_password is not None else {}),
        **(tls_properties(*tls) if tls is not None else {}),
        "log.dirs": data,
        "zookeeper.connect": f"{broker.zookeeper or zookeeper}{CHROOT}",
        "zookeeper.session.timeout.ms": 6000,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min(2, rf),
        "group.initial.rebalance.delay.ms": 0,
        "num.partitions": 1,
        **{
            k: str(v).replace("{port}", str(broker.port)).replace("{id}", str(broker.broker_id))
            for k, v in (extra or {}).items()
        },
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def kraft_properties(cluster: PeerCluster, broker: PeerBroker) -> str:
    """A KRaft node's ``server.properties``: broker and controller in one process (combined
    mode), the quorum every node of ``cluster``, and the same small-cluster settings as
    `broker_properties` (internal topics replicated as far as the nodes allow, no initial
    rebalance delay); ``cluster.properties`` last."""
    rf = min(3, len(cluster.brokers))
    data = Path(broker.directory) / "data"
    lines: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": broker.broker_id,
        "controller.quorum.voters": cluster.controller_quorum_voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{broker.port},CONTROLLER://127.0.0.1:{broker.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{broker.port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": data,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min(2, rf),
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min(2, rf),
        "group.initial.rebalance.delay.ms": 0,
        "num.partitions": 1,
        **cluster.properties,
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def new_cluster_id() -> str:
    """A KRaft cluster id as ``kafka-storage random-uuid`` prints one: 16 random bytes in
    URL-safe base64 without padding, never starting with ``-`` (Kafka's own ``Uuid.randomUuid``
    draws again then: command lines would read such an id as an option)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


# Kafka 4.x logs through Log4j 2 (its own distribution's layout, written as properties)
_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
"""


def _write_config(cluster: PeerCluster, broker: PeerBroker) -> list[str]:
    """Write ``broker``'s server.properties and logging configuration; returns the JVM options
    that point at the logging configuration."""
    d = Path(broker.directory)
    d.mkdir(parents=True, exist_ok=True)
    if cluster.kraft:
        (d / "server.properties").write_text(kraft_properties(cluster, broker))
        (d / "log4j2.properties").write_text(_LOG4J2.format(path=d / "server.log"))
        return [f"-Dlog4j2.configurationFile={d / 'log4j2.properties'}"]
    _write_private(
        d / "server.properties",
        broker_properties(
            broker,
            cluster.zookeeper,
            len(cluster.brokers),
            cluster.properties,
            admin_password=cluster.admin_password if cluster.security != "none" else None,
            tls=(cluster.keystore, cluster.ca_file) if cluster.keystore and cluster.ca_file else None,
        ),
    )
    (d / "log4j.properties").write_text(_LOG4J.format(path=d / "server.log"))
    return [f"-Dlog4j.configuration=file:{d / 'log4j.properties'}"]


def _format_storage(java: str, libs: Path, cluster: PeerCluster, timeout_s: float = 90) -> None:
    """KRaft mode: format every node's log directory with ``cluster.cluster_id`` (the static
    quorum's way: ``kafka-storage format -t ID -c server.properties``), all nodes at once."""
    procs: list[tuple[PeerBroker, subprocess.Popen[bytes]]] = []
    for b in cluster.brokers:
        d = Path(b.directory)
        logging_opts = _write_config(cluster, b)
        cmd = [
            java, "-Xmx128m", *logging_opts, "-cp", f"{libs}/*", _STORAGE_TOOL,
            "format", f"--cluster-id={cluster.cluster_id}", "--config", str(d / "server.properties"),
        ]  # fmt: skip
        with (d / "format.log").open("wb") as out:
            procs.append((b, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)))
    failed = []
    for b, proc in procs:
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -1
        if code != 0:
            failed.append(f"node {b.broker_id} (exit {code}): {_tail(Path(b.directory) / 'format.log', 800)}")
    if failed:
        raise PeerError("formatting KRaft storage failed; " + "; ".join(failed))
    log.info(
        "event=peer_storage_formatted kind=kafka mode=kraft cluster_id=%s nodes=%d",
        cluster.cluster_id,
        len(procs),
    )


_LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
"""


def _start_broker(java: str, libs: Path, cluster: PeerCluster, broker: PeerBroker) -> int:
    d = Path(broker.directory)
    logging_opts = _write_config(cluster, broker)
    cmd = [
        java,
        f"-Xmx{cluster.heap}",
        "-XX:+UseG1GC",
        *logging_opts,
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
    """Until the brokers' Metadata names all of them (each registered in ZooKeeper, or with the
    KRaft controller and unfenced) and every broker's own listener accepts connections: a Kafka
    broker registers in ZooKeeper a second or two before it enables request processing, so one
    broker's answer naming another says nothing of whether that one can be reached yet (a suite
    run connected to it in that gap and was refused)."""
    from confluent_kafka.admin import AdminClient

    want = {b.broker_id for b in cluster.brokers}
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    config: dict[str, str | int | float | bool] = {
        "bootstrap.servers": cluster.bootstrap_servers,
        "log_level": 0,
        **cluster.client_security().confluent_config(),
    }
    while time.monotonic() < deadline:
        for b in cluster.brokers:
            if not pid_alive(b.pid):
                tail = _tail(Path(b.directory) / "server.log") or _tail(Path(b.directory) / "stdout.log")
                raise PeerError(f"Kafka broker {b.broker_id} exited during start; its log ends:\n{tail}")
        admin = AdminClient(config)
        try:
            seen = set(admin.list_topics(timeout=2).brokers)
            closed = [b.broker_id for b in cluster.brokers if not port_open("127.0.0.1", b.port)]
            if seen == want and not closed:
                return
            last = f"brokers {sorted(seen)} registered, {closed} not yet accepting connections"
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
    version: str | None = None,
    timeout_s: float = 120,
    broker_zookeeper: dict[int, str] | None = None,
    properties: dict[str, str] | None = None,
    kraft: bool = False,
    heap: str = HEAP,
    security: str = "none",
) -> PeerCluster:
    """Start ``brokers`` Kafka brokers (and a private ZooKeeper unless ``zookeeper`` names one)
    with their files under ``directory``; returns once every broker is registered.
    ``broker_zookeeper`` gives broker N its own HOST:PORT for ZooKeeper (a drill's proxy);
    ``properties`` are broker settings beyond the defaults (a drill's). ``kraft``: a KRaft
    cluster of Kafka `KRAFT_VERSION` instead (no ZooKeeper; every node broker and controller).
    ``version`` defaults to the pinned one of the mode; ``heap`` is each broker's ``-Xmx``.
    ``security``: one of SECURITY_MODES (``sasl_plaintext``, ``sasl_ssl``: ZooKeeper mode only;
    the admin's client properties in ``client.properties``)."""
    if brokers < 1:
        raise PeerError(f"--brokers must be at least 1, got {brokers}")
    if not _HEAP_FORM.fullmatch(heap):
        raise PeerError(f"--heap {heap!r} is not a JVM heap size: give a number and a unit, e.g. 512m or 2g")
    if security not in SECURITY_MODES:
        raise PeerError(f"--security must be one of {', '.join(SECURITY_MODES)}, not {security!r}")
    if kraft and security != "none":
        raise PeerError(
            f"--security {security} is for ZooKeeper mode (Kafka 3.9, its AclAuthorizer): leave out "
            "--kraft, or leave out --security for a PLAINTEXT KRaft cluster"
        )
    if kraft:
        if zookeeper is not None or broker_zookeeper:
            raise PeerError(
                "--kraft runs Kafka without ZooKeeper: leave out --zookeeper, or leave out --kraft "
                f"for ZooKeeper mode (Kafka {KAFKA_VERSION})"
            )
        return _kraft_up(directory, brokers, version or KRAFT_VERSION, timeout_s, properties, heap)
    version = version or KAFKA_VERSION
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
        heap=heap,
        security=security,
        admin_password=secrets.token_urlsafe(18) if security != "none" else None,
    )
    cluster.save()  # before any broker starts: `peer down` can always find what it must stop
    if cluster.security != "none":
        try:
            if cluster.security == "sasl_ssl":
                ca = local_ca(directory / TLS_DIR, ["127.0.0.1", "localhost"])
                cluster.ca_file, cluster.keystore = str(ca.ca_file), str(ca.keystore)
                cluster.save()
            _write_admin_credential(cluster)
        except BaseException:
            peer_down(directory)
            raise
        cluster.client_security().write(directory / CLIENT_PROPERTIES)
    _start_all(java, libs, cluster, timeout_s)
    return cluster


def _write_admin_credential(cluster: PeerCluster) -> None:
    """ADMIN_USER's SCRAM credentials in the peer's chroot, Kafka's ``/config/users`` layout, before
    any broker starts (what ``kafka-configs --zookeeper ... --add-config SCRAM-SHA-512=[...]``
    writes: the brokers need it to replicate, and to let the admin in)."""
    from sluice.cluster.zkstore import close, connect
    from sluice.security.credentials import CredentialStore

    assert cluster.admin_password is not None
    root = connect(cluster.zookeeper, auth=None)
    try:
        root.ensure_path(CHROOT)
    finally:
        close(root)
    zk = connect(f"{cluster.zookeeper}{CHROOT}", auth=None)
    try:
        CredentialStore(zk).set_password(ADMIN_USER, cluster.admin_password, SCRAM_MECHANISMS)
    finally:
        close(zk)


def _start_all(java: str, libs: Path, cluster: PeerCluster, timeout_s: float) -> None:
    """Start every broker of a saved ``cluster`` and wait for all; on any failure stop what
    started (``peer_down``) and raise."""
    try:
        for b in cluster.brokers:
            b.pid = _start_broker(java, libs, cluster, b)
            cluster.save()
            log.info(
                "event=peer_broker_started kind=kafka mode=%s id=%d port=%d pid=%d",
                cluster.mode, b.broker_id, b.port, b.pid,
            )  # fmt: skip
        _wait_registered(cluster, timeout_s)
    except BaseException:
        peer_down(Path(cluster.directory))
        raise


def _kraft_up(
    directory: Path,
    nodes: int,
    version: str,
    timeout_s: float,
    properties: dict[str, str] | None,
    heap: str,
) -> PeerCluster:
    directory = directory.resolve()
    if (directory / STATE_FILE).exists():
        raise PeerError(
            f"a peer cluster is already in {directory}: stop it with `sluice peer down --dir {directory}`"
        )
    libs = kafka_libs(version)
    java = find_java()
    directory.mkdir(parents=True, exist_ok=True)
    ports = free_ports(2 * nodes)
    cluster = PeerCluster(
        str(directory),
        version,
        "",
        None,
        [
            PeerBroker(
                i + 1, ports[2 * i], str(directory / f"broker-{i + 1}"), controller_port=ports[2 * i + 1]
            )
            for i in range(nodes)
        ],
        dict(properties or {}),
        mode=KRAFT_MODE,
        cluster_id=new_cluster_id(),
        heap=heap,
    )
    cluster.save()  # before anything starts: `peer down` can always find what it must stop
    try:
        _format_storage(java, libs, cluster)
    except BaseException:
        peer_down(directory)
        raise
    _start_all(java, libs, cluster, timeout_s)
    return cluster


def restart_broker(cluster: PeerCluster, broker_id: int, timeout_s: float = 60) -> PeerBroker:
    """Start a stopped broker of ``cluster`` again from its own directory (its data kept); returns
    once every broker is registered again."""
    broker = next(b for b in cluster.brokers if b.broker_id == broker_id)
    if broker.pid > 0 and _is_peer_broker(broker.pid):
        raise PeerError(f"Kafka broker {broker_id} is still running (pid {broker.pid})")
    libs = kafka_libs(cluster.version)
    broker.pid = _start_broker(find_java(), libs, cluster, broker)
    cluster.save()
    log.info(
        "event=peer_broker_restarted kind=kafka mode=%s id=%d pid=%d", cluster.mode, broker_id, broker.pid
    )
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

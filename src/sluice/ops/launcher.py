"""A Sluice cluster on this machine: ZooKeeper (one server or an ensemble), N brokers and,
optionally, K sync workers.

Everything a cluster started lives in one directory: ``cluster.json`` (what runs where),
``zookeeper/`` and ``broker-N/`` (data and logs). With ``hosts="local"`` every process listens
on 127.0.0.1 on free ports, so several clusters (tests, demos) can run side by side. With
``hosts="netns"`` every ZooKeeper member, broker and worker runs in its own network namespace
with its own address on a private bridge (``sluice.ops.netns``; ``network.json`` records it),
as on separate hosts, so real network faults (``sluice.chaos.netfaults``) can be put between
them; brokers then listen on the standard port 9092 of their own address.

Brokers replicate on a listener of their own, ``INTERNAL`` (SASL_PLAINTEXT, or SASL_SSL with
``--security sasl_ssl``), as the brokers' SCRAM user ``sluice-broker`` with a random password
made for the cluster: only a broker may fetch as a follower, and only there; the client
listener never believes a replica id (``sluice.broker.replica_access``).

Every broker and worker serves Prometheus metrics (``metrics.port`` in the properties file the
launcher writes for it): on a free port of 127.0.0.1, or on port 9404 of its own address in a
namespace. ``cluster.json`` keeps the ports and :meth:`LocalCluster.metrics_urls` lists them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from sluice.cluster.zkstore import ZkAuth, close, connect, registered_broker
from sluice.ops.netns import HostNetwork, namespace_exec_prefix
from sluice.ops.ports import ADDRESS_IN_USE_EXIT, bind_error, free_ports, port_open
from sluice.ops.private_files import PRIVATE_UMASK, open_private_log, private_dir
from sluice.ops.processes import forget_detached, pid_alive, reap, spawn_detached
from sluice.ops.zookeeper import EnsembleMember, LocalZooKeeper, ZooKeeperEnsemble
from sluice.security.client import PLAINTEXT, ClientSecurity

if TYPE_CHECKING:
    from sluice.security.acl import AclBinding

log = logging.getLogger("sluice.launcher")

STATE_FILE = "cluster.json"
NETWORK_FILE = "network.json"
DEFAULT_DIR = Path(".sluice/cluster")
HOST_MODES = ("local", "netns")
#: ``cluster up --security``: none (PLAINTEXT) or sasl_ssl (TLS + SCRAM + ACLs)
SECURITY_MODES = ("none", "sasl_ssl")
CLIENT_PROPERTIES = "client.properties"
ADMIN_USER = "admin"
#: the ZooKeeper digest user of a secured local cluster's processes
ZOOKEEPER_USER = "sluice"
ZOOKEEPER_AUTH_FILE = "zookeeper-auth.properties"
BROKER_USER = "sluice-broker"
#: the workers' SCRAM user of a secured local cluster: not a super user, only its ACLs
#: (``worker_client_acls``); its client properties are ``worker-client.properties``
WORKER_USER = "sluice-worker"
WORKER_CLIENT_PROPERTIES = "worker-client.properties"
#: groups a worker's Kafka clients name without joining them (assign() only, nothing committed):
#: task status reads, the log tail a restarted capture reads, the Spark planner and readers.
#: librdkafka still looks their coordinator up, which needs DESCRIBE (implied by READ)
WORKER_CLIENT_GROUPS = ("sluice-status", "sluice-recover", "sluice-spark-planner", "sluice-spark-reader")
#: The port brokers listen on in their own namespace (each has its own address).
NETNS_BROKER_PORT = 9092
#: The brokers' own listener, the only one they replicate on (inter.broker.listener.name), and
#: its port in a namespace.
INTERNAL_LISTENER = "INTERNAL"
NETNS_INTERNAL_PORT = 9093
#: The metrics port of a broker or worker in its own namespace.
NETNS_METRICS_PORT = 9404


@dataclass
class BrokerProcess:
    broker_id: int
    host: str
    port: int
    data_dir: str
    log_file: str
    pid: int = -1
    #: this broker's own way to ZooKeeper (e.g. through a fault-injection proxy); None: the cluster's
    zookeeper: str | None = None
    #: the network namespace it runs in (hosts="netns"); None: this host's
    namespace: str | None = None
    #: the port of its Prometheus endpoint, on ``host`` (None: a cluster saved before metrics)
    metrics_port: int | None = None
    #: its ``broker.rack`` (``cluster up --rack ID=RACK``); None: the cluster's settings decide
    rack: str | None = None
    #: the port of its inter-broker listener (INTERNAL_LISTENER), on ``host``; None: a cluster
    #: saved before brokers had one (they replicate on ``port``)
    internal_port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass
class ZooKeeperMember:
    """One member of the cluster's own ZooKeeper ensemble (files in ``zookeeper/zk<id>/``)."""

    server_id: int
    host: str
    client_port: int
    peer_port: int
    election_port: int
    namespace: str | None = None


@dataclass
class WorkerProcess:
    name: str
    log_file: str
    pid: int = -1
    namespace: str | None = None
    #: the address its metrics are reached at (its namespace's, or the cluster's host)
    host: str = "127.0.0.1"
    metrics_port: int | None = None

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://{self.host}:{self.metrics_port}/metrics"


@dataclass
class LocalCluster:
    directory: str
    zookeeper: str
    zookeeper_port: int
    own_zookeeper: bool
    brokers: list[BrokerProcess] = field(default_factory=list)
    zk_session_timeout_s: float = 6.0
    hosts: str = "local"
    #: the members of the cluster's own ZooKeeper ensemble (empty: a standalone server in
    #: ``zookeeper/``, or none of its own)
    zookeeper_members: list[ZooKeeperMember] = field(default_factory=list)
    workers: list[WorkerProcess] = field(default_factory=list)
    zookeeper_force_sync: bool = True
    #: more keys of every broker's configuration file (``authorizer.class.name`` ...)
    broker_settings: dict[str, str] = field(default_factory=dict)
    #: "none" (PLAINTEXT) or "sasl_ssl": TLS, SCRAM users, ACLs (``cluster_up`` sets them up)
    security: str = "none"
    #: the ZooKeeper digest user and password of every process of the cluster (security on; the
    #: znodes carry its ACLs); None: ZooKeeper without credentials or ACLs
    zookeeper_auth: dict[str, str] | None = None

    def zk_auth(self) -> ZkAuth | None:
        """The credentials of :attr:`zookeeper_auth`, for :func:`sluice.cluster.zkstore.connect`."""
        a = self.zookeeper_auth
        return None if a is None else ZkAuth(a["username"], a["password"])

    @property
    def client_properties(self) -> Path | None:
        """The admin user's Kafka client properties (security on), else None."""
        return Path(self.directory) / CLIENT_PROPERTIES if self.security != "none" else None

    def client_security(self) -> ClientSecurity:
        path = self.client_properties
        return ClientSecurity.from_file(path) if path is not None else PLAINTEXT

    def worker_security(self) -> ClientSecurity:
        """The workers' client security (the ``sluice-worker`` user), PLAINTEXT with security off."""
        if self.security == "none":
            return PLAINTEXT
        return ClientSecurity.from_file(Path(self.directory) / WORKER_CLIENT_PROPERTIES)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def metrics_urls(self) -> list[str]:
        """The Prometheus endpoints of the brokers, then of the workers."""
        urls = [b.metrics_url for b in self.brokers] + [w.metrics_url for w in self.workers]
        return [u for u in urls if u is not None]

    @property
    def network_state(self) -> Path:
        return Path(self.directory) / NETWORK_FILE

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        # owner-only: with security on, the brokers' settings hold the inter-broker password
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, directory: Path) -> LocalCluster:
        path = directory / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"no cluster was started in {directory} (no {STATE_FILE}); run `sluice cluster up`"
            )
        obj = orjson.loads(path.read_bytes())
        obj["brokers"] = [BrokerProcess(**b) for b in obj["brokers"]]
        obj["zookeeper_members"] = [ZooKeeperMember(**m) for m in obj.get("zookeeper_members", [])]
        obj["workers"] = [WorkerProcess(**w) for w in obj.get("workers", [])]
        return cls(**obj)

    def network(self) -> HostNetwork:
        """The namespaces of a ``hosts="netns"`` cluster."""
        return HostNetwork.load(self.network_state)

    def ensemble(self) -> ZooKeeperEnsemble:
        """The cluster's own ZooKeeper ensemble, to kill or restart members (state is read from
        each member's files, so any process can use it)."""
        if not self.zookeeper_members:
            raise RuntimeError(f"the cluster in {self.directory} runs no ZooKeeper ensemble of its own")
        members = [
            EnsembleMember(
                m.server_id, m.host, m.client_port, m.peer_port, m.election_port,
                exec_prefix=tuple(namespace_prefix(m.namespace)),
            )
            for m in self.zookeeper_members
        ]  # fmt: skip
        return ZooKeeperEnsemble(
            Path(self.directory) / "zookeeper", members, force_sync=self.zookeeper_force_sync
        )

    def broker(self, broker_id: int) -> BrokerProcess:
        for b in self.brokers:
            if b.broker_id == broker_id:
                return b
        raise KeyError(f"broker {broker_id} is not part of the cluster in {self.directory}")


def namespace_prefix(namespace: str | None) -> list[str]:
    return namespace_exec_prefix(namespace) if namespace else []


def broker_properties(
    b: BrokerProcess,
    zookeeper: str,
    session_timeout_s: float,
    settings: dict[str, str] | None = None,
    protocol: str = "PLAINTEXT",
) -> str:
    """The broker's configuration file (``sluice broker start --config``). A broker in its own
    namespace binds every address of it and advertises its own. With an ``internal_port``, a
    second listener for the brokers alone (INTERNAL_LISTENER), SASL over the client listener's
    TLS or lack of it, on which they replicate (its user and password are in ``settings``)."""
    bind = "0.0.0.0" if b.namespace else b.host
    listeners = [(protocol, b.port)]
    if b.internal_port is not None:
        listeners.append((INTERNAL_LISTENER, b.internal_port))
    lines = [
        f"broker.id={b.broker_id}",
        "listeners=" + ",".join(f"{name}://{bind}:{port}" for name, port in listeners),
        "advertised.listeners=" + ",".join(f"{name}://{b.host}:{port}" for name, port in listeners),
        f"log.dirs={b.data_dir}",
        f"zookeeper.connect={zookeeper}",
        f"zookeeper.session.timeout.ms={round(session_timeout_s * 1000)}",
    ]
    if b.internal_port is not None:
        internal = "SASL_SSL" if protocol in ("SSL", "SASL_SSL") else "SASL_PLAINTEXT"
        lines += [
            f"listener.security.protocol.map={INTERNAL_LISTENER}:{internal}",
            f"inter.broker.listener.name={INTERNAL_LISTENER}",
        ]
    if b.metrics_port is not None:
        lines.append(f"metrics.port={b.metrics_port}")
    own = dict(settings or {})
    if b.rack is not None:
        own["broker.rack"] = b.rack  # this broker's own, over a rack --override gave every broker
    lines.extend(f"{k}={v}" for k, v in own.items())  # later lines win
    return "# written by `sluice cluster up`\n" + "\n".join(lines) + "\n"


#: Broker keys `cluster up` writes for each broker itself: an override would give every broker
#: the same id, address, data directory, ZooKeeper or metrics port.
PER_BROKER_KEYS = frozenset(
    {
        "broker.id",
        "listeners",
        "advertised.listeners",
        "log.dirs",
        "log.dir",
        "zookeeper.connect",
        "metrics.port",
    }
)


def broker_overrides(items: Iterable[str]) -> dict[str, str]:
    """``cluster up --override key=value``s: broker config keys (the broker configuration file's
    names) for every broker the command starts, checked the way a broker checks its file
    (``BrokerConfig.from_properties``), so a bad key or value stops the command, naming it,
    before anything starts. Raises ``properties.ConfigError``."""
    from sluice.broker.config import BrokerConfig
    from sluice.properties import ConfigError, parse_overrides

    overrides = parse_overrides(items)
    for key in overrides:
        if key in PER_BROKER_KEYS:
            raise ConfigError(
                f"--override {key}: `cluster up` sets {key} for each broker it starts, so it cannot be "
                "one value for all; nothing was started (to choose it, start brokers with "
                "`sluice broker start --config FILE`)"
            )
    # what `cluster up` writes for each broker (broker_properties), with the overrides over it
    sample = {"broker.id": "1", "log.dirs": "broker-1", "zookeeper.connect": "127.0.0.1:2181"}
    BrokerConfig.from_properties({**sample, **overrides}, source="--override")
    return overrides


def broker_racks(items: Iterable[str]) -> dict[int, str]:
    """``cluster up --rack ID=RACK``s: broker id -> its ``broker.rack``, each broker once.
    Raises ``properties.ConfigError`` naming the item."""
    from sluice.properties import ConfigError

    racks: dict[int, str] = {}
    for item in items:
        broker_id, sep, rack = item.partition("=")
        if not sep or not broker_id.strip().isdigit() or not rack.strip():
            raise ConfigError(
                f"--rack {item!r}: expected BROKER_ID=RACK, e.g. --rack 1=us-east-1a; nothing was started"
            )
        if int(broker_id) in racks:
            raise ConfigError(f"--rack names broker {int(broker_id)} twice; nothing was started")
        racks[int(broker_id)] = rack.strip()
    return racks


def broker_command(b: BrokerProcess, config_file: Path) -> list[str]:
    return [
        *namespace_prefix(b.namespace),
        sys.executable, "-m", "sluice.cli", "broker", "start", "--config", str(config_file),
    ]  # fmt: skip


def start_broker_process(cluster: LocalCluster, b: BrokerProcess) -> None:
    private_dir(Path(b.data_dir))
    config_file = Path(cluster.directory) / f"broker-{b.broker_id}.properties"
    config_file.touch(mode=0o600)  # it may hold the inter-broker password
    config_file.write_text(
        broker_properties(
            b, b.zookeeper or cluster.zookeeper, cluster.zk_session_timeout_s, cluster.broker_settings,
            "SASL_SSL" if cluster.security == "sasl_ssl" else "PLAINTEXT",
        )
    )  # fmt: skip
    with open_private_log(b.log_file) as logf:
        b.pid = spawn_detached(broker_command(b, config_file), logf, PRIVATE_UMASK)


def restart_broker(cluster: LocalCluster, b: BrokerProcess, timeout_s: float = 60.0) -> None:
    """Start a stopped broker of the cluster again, with its data, and wait until it is ready.

    Its listener keeps its port: clients and the cluster's bootstrap list know it. The
    inter-broker and metrics ports are read from ZooKeeper and the cluster file, so when another
    server took one of them while the broker was down (`ops.ports`: a picked port is reserved by
    nobody), new ones are picked and it is started again."""
    if pid_alive(b.pid):
        raise RuntimeError(f"broker {b.broker_id} is still running (pid {b.pid})")
    reap(b.pid)  # if this process started it and it exited, collect it
    for attempt in range(1, PICKED_PORT_TRIES + 1):
        start_broker_process(cluster, b)
        cluster.save()
        try:
            wait_broker_ready(cluster, b, timeout_s=timeout_s)
            return
        except AddressTakenError as exc:
            if attempt == PICKED_PORT_TRIES:
                raise
            _pick_side_ports_again(b, exc)


def _pick_side_ports_again(b: BrokerProcess, exc: AddressTakenError) -> None:
    """New inter-broker and metrics ports for a broker whose restart found a port taken; raises
    ``exc`` when it is the listener's (which a restart keeps) or cannot be told from here."""
    if b.namespace is not None:  # its ports are bound in its own namespace, not this one's
        raise exc
    taken = bind_error(b.host, b.port)
    if taken is not None:
        raise AddressTakenError(
            f"broker {b.broker_id} cannot be restarted: its listener port {b.host}:{b.port} is taken "
            f"by another process ({taken.strerror}); stop that process (`ss -ltnp 'sport = :{b.port}'` "
            "names it) and restart the broker"
        ) from exc
    old = (b.internal_port, b.metrics_port)
    internal, metrics_port = free_ports(2, host=b.host)
    if b.internal_port is not None:  # None: a cluster saved before brokers had one
        b.internal_port = internal
    if b.metrics_port is not None:  # None: a cluster saved before metrics
        b.metrics_port = metrics_port
    log.warning(
        "event=broker_ports_repicked broker=%d internal_port=%s->%s metrics_port=%s->%s reason='a port "
        "was taken while the broker was down'",
        b.broker_id, old[0], b.internal_port, old[1], b.metrics_port,
    )  # fmt: skip


class AddressTakenError(RuntimeError):
    """A broker exited at start-up because one of its addresses was taken (ADDRESS_IN_USE_EXIT)."""


#: Seconds `_exit_status` waits for an exited process to become collectable: a multithreaded
#: process's first thread shows as a zombie while exit_group still ends its other threads, and
#: only then can it be collected (a broker that exited at start-up under load read as a status
#: unknown, and its taken port as any failure).
EXIT_COLLECT_S = 5.0


def _exit_status(pid: int) -> int | None:
    """The exit status of ``pid`` if it is an exited child of this process (reaping it)."""
    deadline = time.monotonic() + EXIT_COLLECT_S
    while True:
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if reaped == pid:
            forget_detached(pid)
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def wait_broker_ready(cluster: LocalCluster, b: BrokerProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    zk = connect(cluster.zookeeper, auth=cluster.zk_auth())
    try:
        while time.monotonic() < deadline:
            if not pid_alive(b.pid):
                error = AddressTakenError if _exit_status(b.pid) == ADDRESS_IN_USE_EXIT else RuntimeError
                raise error(
                    f"broker {b.broker_id} exited during start-up; see {b.log_file}:\n{tail(b.log_file)}"
                )
            # the registration of this start, not the one a killed broker's session still holds
            # (until it expires) while anything else may listen on its port
            registered = registered_broker(zk, b.broker_id)
            if registered is not None and registered.pid == b.pid and port_open(b.host, b.port):
                return
            time.sleep(0.1)
    finally:
        close(zk)
    raise TimeoutError(
        f"broker {b.broker_id} was not ready after {timeout_s:.0f} s; see {b.log_file}:\n{tail(b.log_file)}"
    )


#: Start-ups of one broker on newly picked ports when another server took a picked one first.
PICKED_PORT_TRIES = 3


def _wait_ready_on_picked_ports(cluster: LocalCluster, b: BrokerProcess, host: str) -> None:
    """Wait for a broker whose ports the launcher picked (ops.ports: free when picked, reserved
    by nobody); if another server bound one of them first, pick three new ones and start it
    again. The cluster is new: no client has been told the old port."""
    for attempt in range(1, PICKED_PORT_TRIES + 1):
        try:
            wait_broker_ready(cluster, b)
            return
        except AddressTakenError:
            if attempt == PICKED_PORT_TRIES:
                raise
        b.port, b.internal_port, b.metrics_port = free_ports(3, host=host)
        start_broker_process(cluster, b)
        cluster.save()


def tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def cluster_up(
    directory: Path,
    brokers: int,
    zookeeper: str | None = None,
    *,
    host: str = "127.0.0.1",
    zk_session_timeout_s: float = 6.0,
    broker_zookeeper: dict[int, str] | None = None,
    hosts: str = "local",
    zookeeper_nodes: int = 1,
    workers: int = 0,
    zookeeper_force_sync: bool = True,
    broker_settings: dict[str, str] | None = None,
    security: str = "none",
    racks: Mapping[int, str] | None = None,
) -> LocalCluster:
    """Start ZooKeeper (unless ``zookeeper`` names one), the brokers and the workers; wait until
    every broker is registered, a controller elected and every broker's view complete.
    ``racks``: broker id -> its ``broker.rack`` (``cluster up --rack``).

    ``hosts="netns"`` runs every process in its own network namespace (module docstring);
    ``zookeeper_nodes`` > 1 starts an ensemble instead of a standalone server. On any failure
    everything started so far is stopped and removed."""
    directory = directory.resolve()
    # Everything of the cluster is its owner's (logs, data, credentials): a new directory is made
    # 0700 (a directory given that exists already keeps its mode; what is in it is private).
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (directory / STATE_FILE).exists():
        existing = LocalCluster.load(directory)
        if any(pid_alive(b.pid) for b in existing.brokers):
            raise RuntimeError(
                f"a cluster is already running in {directory}; `sluice cluster down --dir {directory}` first"
            )
        if existing.network_state.exists():
            cluster_down(directory)  # the namespaces of a cluster that was not taken down
    if brokers < 1:
        raise ValueError("--brokers must be at least 1")
    if hosts not in HOST_MODES:
        raise ValueError(f"--hosts must be one of {', '.join(HOST_MODES)}, not {hosts!r}")
    if zookeeper_nodes < 1 or zookeeper_nodes > 9:
        raise ValueError("--zookeeper-nodes must be 1 to 9 (an odd number survives the most failures)")
    if zookeeper is not None and (hosts == "netns" or zookeeper_nodes > 1):
        raise ValueError("--zookeeper names an existing ensemble: it cannot be combined with --hosts netns "
                         "or --zookeeper-nodes")  # fmt: skip
    if workers < 0:
        raise ValueError("--workers must be 0 or more")
    if security not in SECURITY_MODES:
        raise ValueError(f"--security must be one of {', '.join(SECURITY_MODES)}, not {security!r}")
    racks = dict(racks or {})
    strangers = sorted(set(racks) - set(range(1, brokers + 1)))
    if strangers:
        raise ValueError(
            f"--rack names broker(s) {strangers}, but the cluster's brokers are 1..{brokers}; "
            "nothing was started"
        )
    cluster = LocalCluster(
        str(directory), zookeeper or "", -1, zookeeper is None, zk_session_timeout_s=zk_session_timeout_s,
        hosts=hosts, zookeeper_force_sync=zookeeper_force_sync, broker_settings=dict(broker_settings or {}),
        security=security,
    )  # fmt: skip
    network: HostNetwork | None = None
    try:
        if hosts == "netns":
            network = HostNetwork.create(cluster.network_state, owner_pid=None)
        _start_zookeeper(cluster, network, zookeeper_nodes, host)
        if network is None:
            ports = free_ports(3 * brokers + workers, host=host)  # all held at once: distinct
            internal_ports, metrics_ports = ports[brokers : 2 * brokers], ports[2 * brokers :]
            ports = ports[:brokers]
        else:
            ports = [NETNS_BROKER_PORT] * brokers
            internal_ports = [NETNS_INTERNAL_PORT] * brokers
            metrics_ports = [NETNS_METRICS_PORT] * (brokers + workers)
        for i in range(brokers):
            bid = i + 1
            place = network.add_host(f"broker{bid}") if network else None
            cluster.brokers.append(
                BrokerProcess(
                    bid,
                    place.ip if place else host,
                    ports[i],
                    str(directory / f"broker-{bid}"),
                    str(directory / f"broker-{bid}.log"),
                    zookeeper=(broker_zookeeper or {}).get(bid),
                    namespace=place.namespace if place else None,
                    metrics_port=metrics_ports[i],
                    rack=racks.get(bid),
                    internal_port=internal_ports[i],
                )
            )
        _inter_broker_user(cluster)
        if security == "sasl_ssl":
            _zookeeper_credential(cluster)
        cluster.save()
        ensure_chroot(cluster.zookeeper, auth=cluster.zk_auth())
        if security == "sasl_ssl":
            _secure(cluster, host)
        for b in cluster.brokers:
            start_broker_process(cluster, b)
        cluster.save()
        for b in cluster.brokers:
            if network is None:
                _wait_ready_on_picked_ports(cluster, b, host)
            else:
                wait_broker_ready(cluster, b)
        wait_controller(cluster)
        wait_views_complete(cluster)
        for i in range(workers):
            place = network.add_host(f"worker{i + 1}") if network else None
            w = WorkerProcess(
                f"worker-{i + 1}", str(directory / f"worker-{i + 1}.log"),
                namespace=place.namespace if place else None, host=place.ip if place else host,
                metrics_port=metrics_ports[brokers + i],
            )  # fmt: skip
            cluster.workers.append(w)
            start_worker_process(cluster, w)
        cluster.save()
    except BaseException:
        cluster.save()
        cluster_down(directory)
        raise
    return cluster


def _inter_broker_user(cluster: LocalCluster) -> None:
    """The brokers' own SCRAM user (BROKER_USER) with a random password made for this cluster, in
    every broker's configuration file (owner-only, as ``cluster.json``). Each broker checks a
    connection claiming that user against this password, never against ZooKeeper
    (``security.credentials.with_own_user``), so nothing written to ZooKeeper makes a broker.
    ``--override`` keys win (they are given first)."""
    import secrets

    cluster.broker_settings.setdefault("inter.broker.sasl.username", BROKER_USER)
    cluster.broker_settings.setdefault("inter.broker.sasl.password", secrets.token_urlsafe(24))


def _secure(cluster: LocalCluster, host: str) -> None:
    """SASL_SSL for a local cluster: a CA and a certificate for the brokers' addresses, an
    ``admin`` user (a random password, SCRAM credentials in ZooKeeper), Kafka's ACL authorizer
    with it and the brokers' own user (``_inter_broker_user``) as super users, and the admin's
    client properties; and the workers' ``sluice-worker`` user with only its ACLs
    (``worker_client_acls``: enough for group membership, capture, apply and status reads) and
    its client properties."""
    import secrets

    from sluice.security.credentials import CredentialStore
    from sluice.security.scram import MECHANISMS
    from sluice.security.tls import local_ca

    directory = Path(cluster.directory)
    hosts = sorted({host, "localhost", "127.0.0.1", *(b.host for b in cluster.brokers)})
    ca = local_ca(directory / "tls", hosts)
    passwords = {user: secrets.token_urlsafe(18) for user in (ADMIN_USER, WORKER_USER)}
    # before any broker starts, and with the cluster's ZooKeeper credential: the credentials'
    # znodes get the ACL that keeps them from everyone else
    zk = connect(cluster.zookeeper, auth=cluster.zk_auth())
    try:
        store = CredentialStore(zk)
        for user, password in passwords.items():
            store.set_password(user, password, tuple(MECHANISMS))
    finally:
        close(zk)
    cluster.broker_settings.update({
        "ssl.keystore.location": str(ca.keystore),
        "ssl.truststore.location": str(ca.ca_file),
        "authorizer.class.name": "sluice.security.acl.AclAuthorizer",
        "super.users": f"User:{ADMIN_USER};User:{cluster.broker_settings['inter.broker.sasl.username']}",
    })  # fmt: skip
    admin = ClientSecurity("SASL_SSL", "SCRAM-SHA-512", ADMIN_USER, passwords[ADMIN_USER], ca.ca_file)
    admin.write(directory / CLIENT_PROPERTIES)
    worker = ClientSecurity("SASL_SSL", "SCRAM-SHA-512", WORKER_USER, passwords[WORKER_USER], ca.ca_file)
    worker.write(directory / WORKER_CLIENT_PROPERTIES)
    _add_acls(cluster, worker_client_acls(f"User:{WORKER_USER}"))
    cluster.save()


def _zookeeper_credential(cluster: LocalCluster) -> None:
    """A random ZooKeeper digest credential for every process of the cluster (brokers, workers,
    the manager, the CLI): the znodes they create carry its ACLs (``sluice.cluster.zkstore``).
    It is kept in the owner-only ``cluster.json`` and broker/worker configuration files, and in
    ``zookeeper-auth.properties`` (``zookeeper.auth.file``, ``$SLUICE_ZOOKEEPER_AUTH_FILE``)."""
    import secrets

    auth = ZkAuth(ZOOKEEPER_USER, secrets.token_urlsafe(18))
    cluster.zookeeper_auth = {"username": auth.username, "password": auth.password}
    cluster.broker_settings.update(auth.properties())  # into every broker's configuration file
    path = Path(cluster.directory) / ZOOKEEPER_AUTH_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# written by `sluice cluster up`\n")
        f.writelines(f"{k}={v}\n" for k, v in auth.properties().items())


def zookeeper_auth_lines(cluster: LocalCluster) -> list[str]:
    """The ``zookeeper.set.acl`` / ``zookeeper.auth.*`` lines of a process's configuration file."""
    auth = cluster.zk_auth()
    return [] if auth is None else [f"{k}={v}" for k, v in auth.properties().items()]


def worker_client_acls(principal: str) -> list[AclBinding]:
    """A worker principal's ACLs: ``worker_acls`` (its group, every topic, idempotent writes) and
    READ on the groups its Kafka clients name (WORKER_CLIENT_GROUPS)."""
    from sluice.security.acl import (
        WILDCARD,
        AccessControlEntry,
        AclBinding,
        Operation,
        Permission,
        ResourcePattern,
        ResourceType,
        worker_acls,
    )

    return [
        *worker_acls(principal),
        *(
            AclBinding(
                ResourcePattern(ResourceType.GROUP, group),
                AccessControlEntry(principal, WILDCARD, Operation.READ, Permission.ALLOW),
            )
            for group in WORKER_CLIENT_GROUPS
        ),
    ]


def _add_acls(cluster: LocalCluster, bindings: list[AclBinding]) -> None:
    """Store ACLs before the brokers start (their authorizer loads them before listening)."""
    from sluice.cluster.zkstore import ZkStore
    from sluice.security.acl_store import AclStore

    store = ZkStore(cluster.zookeeper, connect_timeout_s=15.0, auth=cluster.zk_auth())
    store.start()
    try:
        AclStore(store).add(bindings)
    finally:
        store.stop()


def _start_zookeeper(cluster: LocalCluster, network: HostNetwork | None, nodes: int, host: str) -> None:
    """The cluster's own ZooKeeper: a standalone server, or an ensemble of ``nodes`` members
    (each in its own namespace when there is a network)."""
    if not cluster.own_zookeeper:
        return
    directory = Path(cluster.directory)
    if network is None and nodes == 1:
        port = free_ports(1, host=host)[0]
        zk = LocalZooKeeper(directory / "zookeeper", port, host=host, force_sync=cluster.zookeeper_force_sync)
        zk.start()
        cluster.zookeeper, cluster.zookeeper_port = f"{zk.connect_string}/sluice", port
        return
    if network is not None:
        places = [network.add_host(f"zk{n}") for n in range(1, nodes + 1)]
        members = [EnsembleMember(i, h.ip) for i, h in enumerate(places, start=1)]
        namespaces: list[str | None] = [h.namespace for h in places]
    else:
        ports = free_ports(3 * nodes, host=host)
        members = [
            EnsembleMember(i + 1, host, ports[3 * i], ports[3 * i + 1], ports[3 * i + 2])
            for i in range(nodes)
        ]
        namespaces = [None] * nodes
    cluster.zookeeper_members = [
        ZooKeeperMember(m.server_id, m.host, m.client_port, m.peer_port, m.election_port, namespace=ns)
        for m, ns in zip(members, namespaces, strict=True)
    ]
    cluster.save()  # before starting: `cluster down` finds the members of a start that failed
    ensemble = cluster.ensemble()
    ensemble.start()
    cluster.zookeeper = f"{ensemble.connect_string}/sluice"


def worker_properties(cluster: LocalCluster, w: WorkerProcess) -> str:
    """The worker's configuration file (``sluice worker start --config``). A worker in its own
    namespace serves its metrics on every address of it."""
    lines = [
        f"bootstrap.servers={cluster.bootstrap_servers}",
        f"zookeeper.connect={cluster.zookeeper}",
        *zookeeper_auth_lines(cluster),
        f"worker.name={w.name}",
        f"work.dir={Path(cluster.directory) / w.name}",
    ]
    # Kafka's client keys of the workers' own user (security on): group membership, capture,
    # apply and admin calls all authenticate with them
    if cluster.security != "none":
        lines += [f"{k}={v}" for k, v in cluster.worker_security().properties().items()]
    if w.metrics_port is not None:
        lines += [f"metrics.port={w.metrics_port}", f"metrics.host={'0.0.0.0' if w.namespace else w.host}"]
    return "# written by `sluice cluster up`\n" + "\n".join(lines) + "\n"


def start_worker_process(cluster: LocalCluster, w: WorkerProcess) -> None:
    """A sync worker (`sluice worker start`) of the cluster, in its own namespace if it has one."""
    config_file = Path(cluster.directory) / f"{w.name}.properties"
    config_file.touch(mode=0o600)  # it may hold the workers' and the ZooKeeper passwords
    config_file.write_text(worker_properties(cluster, w))
    argv = [
        *namespace_prefix(w.namespace), sys.executable, "-m", "sluice.cli", "worker", "start",
        "--config", str(config_file),
    ]  # fmt: skip
    with open_private_log(w.log_file) as logf:
        w.pid = spawn_detached(argv, logf, PRIVATE_UMASK)


def ensure_chroot(zookeeper: str, auth: ZkAuth | None = None) -> None:
    """Create the cluster's chroot so that chrooted sessions (ours and the brokers') can use it;
    with ``auth``, the chroot carries its ACL (world READ, writable by that user only)."""
    from sluice.cluster import zkstore

    zkstore.ensure_chroot(zookeeper, auth=auth)


def wait_views_complete(cluster: LocalCluster, timeout_s: float = 30.0) -> None:
    """Wait until every running broker answers Metadata naming every running broker and a
    controller. A broker's registration is in ZooKeeper before the others' views have it (they
    learn it from a watch); a CreateTopics with replication factor 3 sent in between was refused
    as "larger than the 2 live broker(s)" right after `cluster up` returned."""
    from sluice.protocol.api import ApiKey
    from sluice.sync.wire_client import WireClient

    running = [b for b in cluster.brokers if pid_alive(b.pid)]
    want = {b.broker_id for b in running}
    deadline = time.monotonic() + timeout_s
    seen: dict[int, object] = {}
    for b in running:
        while True:
            try:
                with WireClient(b.host, b.port, client_id="sluice-launcher", timeout_s=5.0,
                                security=cluster.client_security()) as w:  # fmt: skip
                    r = w.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
                names = {x["node_id"] for x in r["brokers"]}
                seen[b.broker_id] = (sorted(names), r["controller_id"])
                if want <= names and r["controller_id"] in names:
                    break
            except OSError as exc:
                seen[b.broker_id] = str(exc)
            if not pid_alive(b.pid):
                raise RuntimeError(
                    f"broker {b.broker_id} exited during start-up; see {b.log_file}:\n{tail(b.log_file)}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"brokers do not all see each other after {timeout_s:.0f} s "
                    f"(broker: [brokers seen], controller): {seen}; broker {b.broker_id}'s log "
                    f"{b.log_file} ends:\n{tail(b.log_file)}"
                )
            time.sleep(0.05)


def wait_controller(cluster: LocalCluster, timeout_s: float = 30.0) -> int:
    zk = connect(cluster.zookeeper, auth=cluster.zk_auth())
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if zk.exists("/controller"):
                data, _ = zk.get("/controller")
                return int(orjson.loads(data)["brokerid"])
            time.sleep(0.1)
    finally:
        close(zk)
    raise TimeoutError("no controller was elected")


@dataclass(frozen=True, slots=True)
class Stopped:
    """How :func:`stop_process` ended: whether the process was running, and whether it had to be
    killed (SIGKILL) because it was still running at the timeout."""

    was_running: bool
    killed: bool = False


def stop_process(pid: int, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> Stopped:
    """Signal a process and wait for it to go; SIGKILL after the timeout."""
    return stop_processes([pid], timeout_s, sig)[pid]


def stop_processes(pids: list[int], timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> dict[int, Stopped]:
    """Signal every process at once and wait for them to go, on one deadline; SIGKILL those
    still running after it."""
    outcome: dict[int, Stopped] = {}
    waiting = []
    for pid in pids:
        if not pid_alive(pid):
            outcome[pid] = Stopped(False)
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            outcome[pid] = Stopped(False)
            continue
        waiting.append(pid)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        for pid in list(waiting):
            reap(pid)  # our child that exited: collected here, so it reads as gone
            if not pid_alive(pid):
                outcome[pid] = Stopped(True)
                waiting.remove(pid)
        if waiting:
            time.sleep(0.05)
    for pid in waiting:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            outcome[pid] = Stopped(True)
            continue
        outcome[pid] = Stopped(True, killed=True)
    killed = time.monotonic() + 2.0
    while any(pid_alive(p) for p in waiting) and time.monotonic() < killed:
        time.sleep(0.02)
    for pid in waiting:
        reap(pid)
    return outcome


def stop_pid(pid: int, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> bool:
    """:func:`stop_process`; True if the process was running."""
    return stop_process(pid, timeout_s, sig).was_running


def broker_stop_bound_s(cluster: LocalCluster) -> float:
    """How long a broker of ``cluster`` may take to stop after SIGTERM, whatever ZooKeeper does
    (``sluice.broker.broker.stop_bound_s``); past it, `broker stop` and `cluster down` kill it."""
    from sluice.broker.broker import stop_bound_s

    return stop_bound_s(cluster.zk_session_timeout_s)


def worker_stop_bound_s(cluster: LocalCluster) -> float:
    """How long a worker of ``cluster`` may take to stop after SIGTERM, whatever ZooKeeper does
    (``sluice.pipeline.worker.stop_bound_s``, for the worker's ZooKeeper session, ZkStore's default);
    past it, `cluster down` kills it."""
    from sluice.pipeline.worker import stop_bound_s

    return stop_bound_s()


def _resume(pid: int) -> None:
    """SIGCONT: a paused process cannot stop."""
    if pid_alive(pid):
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def cluster_down(directory: Path) -> list[str]:
    """Stop everything the cluster in ``directory`` started (workers, brokers with a controlled
    shutdown, its ZooKeeper) and remove its network namespaces; returns what was stopped, naming
    a worker or broker that had to be killed (SIGKILL) past its stop bound."""
    directory = directory.resolve()
    cluster = LocalCluster.load(directory)
    stopped = []
    # All workers at once: stopped one after another, each one's leaving would hand its tasks to
    # the next, which would start them only to stop them.
    bound_s = worker_stop_bound_s(cluster)
    for w in cluster.workers:
        _resume(w.pid)
    outcomes = stop_processes([w.pid for w in cluster.workers], timeout_s=bound_s)
    for w in cluster.workers:
        if outcomes[w.pid].killed:
            stopped.append(
                f"worker {w.name} (pid {w.pid}, killed: still running {bound_s:.0f} s after SIGTERM, its "
                "stop bound; its tasks' status znodes go when its ZooKeeper session expires; "
                f"see {w.log_file})"
            )
        elif outcomes[w.pid].was_running:
            stopped.append(f"worker {w.name} (pid {w.pid})")
    bound_s = broker_stop_bound_s(cluster)
    for b in cluster.brokers:  # one at a time: each one's controlled shutdown moves leadership
        _resume(b.pid)
        outcome = stop_process(b.pid, timeout_s=bound_s)
        if outcome.killed:
            stopped.append(
                f"broker {b.broker_id} (pid {b.pid}, killed: still running {bound_s:.0f} s after SIGTERM, "
                f"its stop bound; its logs are recovered at its next start; see {b.log_file})"
            )
        elif outcome.was_running:
            stopped.append(f"broker {b.broker_id} (pid {b.pid})")
    if cluster.own_zookeeper and cluster.zookeeper_members:
        for m in cluster.zookeeper_members:
            if LocalZooKeeper.stop_from_pidfile(directory / "zookeeper" / f"zk{m.server_id}"):
                stopped.append(f"zookeeper {m.server_id}")
    elif cluster.own_zookeeper and LocalZooKeeper.stop_from_pidfile(directory / "zookeeper"):
        stopped.append("zookeeper")
    if cluster.network_state.exists():
        network = cluster.network()
        network.remove()
        stopped.append(f"network {network.tag} ({len(network.hosts)} namespaces)")
    return stopped

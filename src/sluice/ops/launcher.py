"""A local Sluice cluster on this machine: a standalone ZooKeeper and N broker processes.

Everything a cluster started lives in one directory: ``cluster.json`` (what runs where),
``zookeeper/`` and ``broker-N/`` (data and logs). Ports are picked free at start, so several
clusters (tests, demos) can run side by side.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from sluice.ops.ports import free_ports
from sluice.ops.zookeeper import LocalZooKeeper

STATE_FILE = "cluster.json"
DEFAULT_DIR = Path(".sluice/cluster")


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

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class LocalCluster:
    directory: str
    zookeeper: str
    zookeeper_port: int
    own_zookeeper: bool
    brokers: list[BrokerProcess] = field(default_factory=list)
    zk_session_timeout_s: float = 6.0

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def save(self) -> None:
        path = Path(self.directory) / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2))
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
        return cls(**obj)

    def broker(self, broker_id: int) -> BrokerProcess:
        for b in self.brokers:
            if b.broker_id == broker_id:
                return b
        raise KeyError(f"broker {broker_id} is not part of the cluster in {self.directory}")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def broker_command(
    b: BrokerProcess, zookeeper: str, session_timeout_s: float, extra: list[str] | None = None
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sluice.ops.cli",
        "broker",
        "start",
        "--id",
        str(b.broker_id),
        "--host",
        b.host,
        "--port",
        str(b.port),
        "--data-dir",
        b.data_dir,
        "--zookeeper",
        zookeeper,
        "--zk-session-timeout",
        str(session_timeout_s),
        *(extra or []),
    ]


def start_broker_process(cluster: LocalCluster, b: BrokerProcess) -> None:
    Path(b.data_dir).mkdir(parents=True, exist_ok=True)
    with open(b.log_file, "ab") as logf:
        proc = subprocess.Popen(
            broker_command(b, b.zookeeper or cluster.zookeeper, cluster.zk_session_timeout_s),
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    b.pid = proc.pid


def restart_broker(cluster: LocalCluster, b: BrokerProcess, timeout_s: float = 60.0) -> None:
    """Start a stopped broker of the cluster again, with its data, and wait until it is ready."""
    if pid_alive(b.pid):
        raise RuntimeError(f"broker {b.broker_id} is still running (pid {b.pid})")
    try:
        os.waitpid(b.pid, 0)  # reap it if it was our child; it is dead, so this returns at once
    except ChildProcessError:
        pass
    start_broker_process(cluster, b)
    cluster.save()
    wait_broker_ready(cluster, b, timeout_s=timeout_s)


def wait_broker_ready(cluster: LocalCluster, b: BrokerProcess, timeout_s: float = 60.0) -> None:
    from kazoo.client import KazooClient

    deadline = time.monotonic() + timeout_s
    zk = KazooClient(hosts=cluster.zookeeper, timeout=10.0)
    zk.start(timeout=15)
    try:
        while time.monotonic() < deadline:
            if not pid_alive(b.pid):
                raise RuntimeError(
                    f"broker {b.broker_id} exited during start-up; see {b.log_file}:\n{tail(b.log_file)}"
                )
            if zk.exists(f"/brokers/ids/{b.broker_id}") and port_open(b.host, b.port):
                return
            time.sleep(0.1)
    finally:
        zk.stop()
        zk.close()
    raise TimeoutError(
        f"broker {b.broker_id} was not ready after {timeout_s:.0f} s; see {b.log_file}:\n{tail(b.log_file)}"
    )


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
) -> LocalCluster:
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / STATE_FILE).exists():
        existing = LocalCluster.load(directory)
        if any(pid_alive(b.pid) for b in existing.brokers):
            raise RuntimeError(
                f"a cluster is already running in {directory}; `sluice cluster down --dir {directory}` first"
            )
    if brokers < 1:
        raise ValueError("--brokers must be at least 1")
    ports = free_ports(brokers + 1, host=host)
    own_zk = zookeeper is None
    if own_zk:
        zk = LocalZooKeeper(directory / "zookeeper", ports[0], host=host)
        zk.start()
        zookeeper = f"{zk.connect_string}/sluice"
        zk_port = ports[0]
    else:
        assert zookeeper is not None
        zk_port = -1
    cluster = LocalCluster(
        str(directory), zookeeper, zk_port, own_zk, zk_session_timeout_s=zk_session_timeout_s
    )
    for i in range(brokers):
        bid = i + 1
        b = BrokerProcess(
            bid,
            host,
            ports[i + 1],
            str(directory / f"broker-{bid}"),
            str(directory / f"broker-{bid}.log"),
            zookeeper=(broker_zookeeper or {}).get(bid),
        )
        cluster.brokers.append(b)
    try:
        ensure_chroot(zookeeper)
        for b in cluster.brokers:
            start_broker_process(cluster, b)
        cluster.save()
        for b in cluster.brokers:
            wait_broker_ready(cluster, b)
        wait_controller(cluster)
        wait_views_complete(cluster)
    except BaseException:
        cluster_down(directory)
        raise
    return cluster


def ensure_chroot(zookeeper: str) -> None:
    """Create the cluster's chroot so that chrooted sessions (ours and the brokers') can use it."""
    from kazoo.client import KazooClient

    from sluice.cluster.zkstore import split_zookeeper_address

    hosts, chroot = split_zookeeper_address(zookeeper)
    zk = KazooClient(hosts=hosts, timeout=10.0)
    zk.start(timeout=15)
    try:
        zk.ensure_path(chroot)
    finally:
        zk.stop()
        zk.close()


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
                with WireClient(b.host, b.port, client_id="sluice-launcher", timeout_s=5.0) as w:
                    r = w.request(ApiKey.METADATA, 9, {"topics": [], "allow_auto_topic_creation": False})
                names = {x["node_id"] for x in r["brokers"]}
                seen[b.broker_id] = (sorted(names), r["controller_id"])
                if want <= names and r["controller_id"] in names:
                    break
            except OSError as exc:
                seen[b.broker_id] = str(exc)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"brokers do not all see each other after {timeout_s:.0f} s "
                    f"(broker: [brokers seen], controller): {seen}; "
                    f"see the broker logs in {cluster.directory}"
                )
            time.sleep(0.05)


def wait_controller(cluster: LocalCluster, timeout_s: float = 30.0) -> int:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=cluster.zookeeper, timeout=10.0)
    zk.start(timeout=15)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if zk.exists("/controller"):
                data, _ = zk.get("/controller")
                return int(orjson.loads(data)["brokerid"])
            time.sleep(0.1)
    finally:
        zk.stop()
        zk.close()
    raise TimeoutError("no controller was elected")


def stop_pid(pid: int, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> bool:
    """Signal a process and wait for it to go; SIGKILL after the timeout. True if it was running."""
    if not pid_alive(pid):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def cluster_down(directory: Path) -> list[str]:
    directory = directory.resolve()
    cluster = LocalCluster.load(directory)
    stopped = []
    for b in cluster.brokers:
        if stop_pid(b.pid):
            stopped.append(f"broker {b.broker_id} (pid {b.pid})")
    if cluster.own_zookeeper and LocalZooKeeper.stop_from_pidfile(directory / "zookeeper"):
        stopped.append("zookeeper")
    return stopped

"""A cluster wired for fault injection, and the faults; the targets by role (leader of a
partition, controller, coordinator of a group, a random broker).

Two ways to run it:

* ``hosts="local"``: a standalone ZooKeeper and N brokers on 127.0.0.1, with one TCP proxy per
  broker on its way to ZooKeeper, so a broker can be cut from ZooKeeper alone.
* ``hosts="netns"``: every ZooKeeper member and broker in its own network namespace
  (``launcher.cluster_up(hosts="netns")``); network faults are real packet drops, delay and loss
  between those hosts (``sluice.chaos.netfaults``), and ZooKeeper members can be killed.

Process faults (kill -9, SIGSTOP, controlled shutdown, restart) work in both.

A drill that must be able to fail runs on a cluster given test switches: every process the
cluster starts, brokers restarted mid-drill included, is armed with them (`test_switches.armed`)
for as long as the cluster runs."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from sluice import test_switches
from sluice.broker.group_placement import OFFSETS_TOPIC, partition_for_group
from sluice.chaos import netfaults
from sluice.chaos.tcp_proxy import TcpProxy
from sluice.cluster import layout
from sluice.cluster.layout import PartitionState
from sluice.cluster.zkstore import ZkStore
from sluice.ops import launcher
from sluice.ops.netns import HostNetwork
from sluice.ops.ports import free_port, free_ports
from sluice.ops.processes import pid_alive
from sluice.ops.zookeeper import LocalZooKeeper, ZooKeeperEnsemble
from sluice.security.client import ClientSecurity

log = logging.getLogger("sluice.chaos")

CHROOT = "/sluice"


class BrokerSignals:
    """A drill cluster's timeline and its faults by signal on broker processes, shared by the
    Sluice drill cluster below and Apache Kafka's (peers/incidents_kafka.py): kill -9 (waiting
    until the process is gone), SIGSTOP and SIGCONT. A subclass sets ``events`` and ``_t0`` and
    names each broker's process (``broker(id).pid``)."""

    events: list[tuple[float, str]]
    _t0: float
    #: the running cluster (``bootstrap_servers``), None before it starts
    cluster: Any
    #: ZooKeeper as the cluster lays it out (``partition_state``, ``controller_id``)
    store: Any
    session_timeout_s: float

    def broker(self, broker_id: int) -> Any:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return str(self.cluster.bootstrap_servers)

    def leader_of(self, topic: str, partition: int) -> int:
        """The partition's leader as ZooKeeper holds it (-1: none)."""
        assert self.store is not None
        current = self.store.partition_state(topic, partition)
        return int(current[0].leader) if current else -1

    def controller(self) -> int:
        assert self.store is not None
        return int(self.store.controller_id())

    def restart(self, broker_id: int) -> None:
        raise NotImplementedError

    def shutdown(self, broker_id: int) -> None:
        """SIGTERM: a controlled shutdown."""
        raise NotImplementedError

    def wait_quiescent(self, timeout_s: float = 90.0) -> bool:
        """Every broker registered, every partition led by a live broker with a full ISR."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._quiescent():
                return True
            time.sleep(0.25)
        return False

    def _quiescent(self) -> bool:
        raise NotImplementedError

    def note(self, what: str) -> None:
        self.events.append((time.monotonic() - self._t0, what))
        log.info("event=drill_step t=%.1f %s", time.monotonic() - self._t0, what)

    def kill(self, broker_id: int) -> None:
        pid = self.broker(broker_id).pid
        os.kill(pid, signal.SIGKILL)
        wait_gone(pid, 10.0)
        self.note(f"kill -9 broker {broker_id}")

    def pause(self, broker_id: int) -> None:
        os.kill(self.broker(broker_id).pid, signal.SIGSTOP)
        self.note(f"SIGSTOP broker {broker_id}")

    def resume(self, broker_id: int) -> None:
        os.kill(self.broker(broker_id).pid, signal.SIGCONT)
        self.note(f"SIGCONT broker {broker_id}")


def reap(pid: int) -> None:
    """Collect ``pid``'s exit status if it is a child of this process that has ended."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has ended (reaped when it is our child); False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


class DrillCluster(BrokerSignals):
    def __init__(
        self,
        directory: Path,
        brokers: int = 3,
        *,
        session_timeout_s: float = 6.0,
        hosts: str = "local",
        zookeeper_nodes: int = 1,
        switches: test_switches.Switches = test_switches.OFF,
        security: str = "none",
    ):
        """``security="sasl_ssl"``: brokers with TLS, SCRAM users and ACLs (``cluster_up``'s);
        the drill's clients then authenticate as its admin (:attr:`client_security`)."""
        if hosts not in launcher.HOST_MODES:
            raise ValueError(f"hosts must be one of {', '.join(launcher.HOST_MODES)}, not {hosts!r}")
        self.directory = directory.resolve()
        self.brokers = brokers
        self.session_timeout_s = session_timeout_s
        self.hosts = hosts
        self.zookeeper_nodes = zookeeper_nodes
        self.zk: LocalZooKeeper | None = None
        self.proxies: dict[int, TcpProxy] = {}
        self.cluster: launcher.LocalCluster | None = None
        self.store: ZkStore | None = None
        #: hosts="netns": the namespaces, and the network faults in place by name
        self.network: HostNetwork | None = None
        self.net_faults: dict[str, netfaults.NetFault] = {}
        self.ensemble: ZooKeeperEnsemble | None = None
        self.events: list[tuple[float, str]] = []
        self._t0 = time.monotonic()
        #: what the cluster's processes turn off; drills that start processes of their own
        #: (zombie.py's workers) arm them with these too
        self.switches = switches
        self.security = security
        self._armed = ExitStack()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> DrillCluster:
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        if self.switches != test_switches.OFF:
            # Every process started from here on inherits them: brokers restarted by faults too.
            env = self._armed.enter_context(test_switches.armed(self.switches))
            self._armed.enter_context(_exported(env))
        if self.hosts == "netns" or self.zookeeper_nodes > 1:
            return self._start_with_ensemble()
        self.zk = LocalZooKeeper(self.directory / "zookeeper", free_port(), force_sync=False)
        self.zk.start()
        zk_host, zk_port = self.zk.connect_string.rsplit(":", 1)
        ports = free_ports(self.brokers)
        overrides = {}
        for i, port in enumerate(ports, start=1):
            proxy = TcpProxy("127.0.0.1", port, zk_host, int(zk_port)).start()
            self.proxies[i] = proxy
            overrides[i] = f"{proxy.address}{CHROOT}"
        self.cluster = launcher.cluster_up(
            self.directory / "cluster",
            self.brokers,
            f"{self.zk.connect_string}{CHROOT}",
            zk_session_timeout_s=self.session_timeout_s,
            broker_zookeeper=overrides,
            security=self.security,
        )
        self.store = ZkStore(f"{self.zk.connect_string}{CHROOT}", auth=self.cluster.zk_auth())
        self.store.start()
        return self

    def _start_with_ensemble(self) -> DrillCluster:
        self.cluster = launcher.cluster_up(
            self.directory / "cluster", self.brokers, hosts=self.hosts, zookeeper_nodes=self.zookeeper_nodes,
            zk_session_timeout_s=self.session_timeout_s, zookeeper_force_sync=False, security=self.security,
        )  # fmt: skip
        if self.cluster.zookeeper_members:
            self.ensemble = self.cluster.ensemble()
        if self.hosts == "netns":
            self.network = self.cluster.network()
        self.store = ZkStore(self.cluster.zookeeper, auth=self.cluster.zk_auth())
        self.store.start()
        return self

    def stop(self) -> None:
        for b in self.cluster.brokers if self.cluster else []:
            if launcher.pid_alive(b.pid):
                try:
                    os.kill(b.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        if self.store is not None:
            self.store.stop()
        if self.network is not None:
            self.heal_network()
        if self.cluster is not None:
            launcher.cluster_down(Path(self.cluster.directory))
        for proxy in self.proxies.values():
            proxy.stop()
        if self.zk is not None:
            self.zk.stop()
        self._armed.close()

    def __enter__(self) -> DrillCluster:
        return self.start()

    @property
    def client_security(self) -> ClientSecurity:
        """How the drill's own clients authenticate (the admin's; PLAINTEXT with security off)."""
        assert self.cluster is not None
        return self.cluster.client_security()

    def broker(self, broker_id: int) -> launcher.BrokerProcess:
        assert self.cluster is not None
        return self.cluster.broker(broker_id)

    # -- faults (kill, pause, resume: BrokerSignals) -------------------------------------------------

    def shutdown(self, broker_id: int) -> None:
        launcher.stop_pid(self.broker(broker_id).pid)
        self.note(f"controlled shutdown of broker {broker_id}")

    def restart(self, broker_id: int) -> None:
        assert self.cluster is not None
        b = self.broker(broker_id)
        if launcher.pid_alive(b.pid):
            return
        launcher.restart_broker(self.cluster, b)
        self.note(f"restarted broker {broker_id}")

    def cut_zookeeper(self, broker_id: int, mode: str = "drop") -> None:
        """Cut a broker from ZooKeeper alone: through its proxy (hosts="local"; ``mode`` drop or
        reset), or by dropping every packet between its host and the ZooKeeper members."""
        if self.network is not None:
            self.apply_net_fault(
                f"zk-cut-{broker_id}",
                netfaults.Partition(self.network, broker_host(broker_id), self.zookeeper_hosts()),
            )
            return
        self.proxies[broker_id].set_mode(mode)
        self.note(f"cut broker {broker_id} from ZooKeeper ({mode})")

    def heal_zookeeper(self, broker_id: int) -> None:
        if self.network is not None:
            self.heal_net_fault(f"zk-cut-{broker_id}")
            return
        self.proxies[broker_id].set_mode("pass")
        self.note(f"reconnected broker {broker_id} to ZooKeeper")

    # -- network faults and ZooKeeper members (hosts="netns") --------------------------------------

    def zookeeper_hosts(self) -> list[str]:
        assert self.cluster is not None
        return [f"zk{m.server_id}" for m in self.cluster.zookeeper_members]

    def apply_net_fault(self, name: str, fault: netfaults.NetFault) -> None:
        if name in self.net_faults:
            raise RuntimeError(f"network fault {name} is already in place")
        fault.apply()
        self.net_faults[name] = fault
        self.note(fault.describe())

    def heal_net_fault(self, name: str) -> None:
        fault = self.net_faults.pop(name, None)
        if fault is not None:
            fault.heal()
            self.note(f"healed: {fault.describe()}")

    def heal_network(self) -> None:
        for name in list(self.net_faults):
            self.heal_net_fault(name)
        if self.network is not None:
            netfaults.heal_all(self.network)

    def kill_zookeeper(self, server_id: int) -> None:
        assert self.ensemble is not None
        self.ensemble.kill(server_id)
        self.note(f"kill -9 ZooKeeper member {server_id}")

    def restart_zookeeper(self, server_id: int) -> None:
        assert self.ensemble is not None
        if self.ensemble.node(server_id).pid is not None:
            return
        self.ensemble.restart(server_id)
        self.note(f"restarted ZooKeeper member {server_id}")

    def zookeeper_leader(self) -> int | None:
        return self.ensemble.leader() if self.ensemble is not None else None

    def heal_all(self) -> None:
        assert self.cluster is not None
        for bid, proxy in self.proxies.items():
            if proxy.mode != "pass":
                self.heal_zookeeper(bid)
        self.heal_network()
        if self.ensemble is not None:
            for sid in self.ensemble.nodes:
                self.restart_zookeeper(sid)
        for b in self.cluster.brokers:
            if launcher.pid_alive(b.pid):
                os.kill(b.pid, signal.SIGCONT)
            else:
                self.restart(b.broker_id)

    # -- targets -----------------------------------------------------------------------------------

    def coordinator_of(self, group: str) -> int:
        return self.leader_of(OFFSETS_TOPIC, partition_for_group(group, 50))

    def random_broker(self, rng: random.Random, *, alive_only: bool = True) -> int:
        assert self.cluster is not None
        ids = [b.broker_id for b in self.cluster.brokers if not alive_only or launcher.pid_alive(b.pid)]
        return rng.choice(sorted(ids))

    # -- waiting -----------------------------------------------------------------------------------

    def _quiescent(self) -> bool:
        assert self.store is not None and self.cluster is not None
        live = set(self.store.live_brokers())
        if live != {b.broker_id for b in self.cluster.brokers}:
            return False
        topics = self.store.all_topics()
        paths = {
            layout.partition_state_path(n, p): r for n, a in topics.items() for p, r in a.replicas.items()
        }
        for path, got in self.store.read_many(paths).items():
            if got is None:
                return False
            state = PartitionState.decode(got[0], path)
            if state.leader not in live or set(state.isr) != set(paths[path]):
                return False
        return True


@contextmanager
def _exported(env: dict[str, str]) -> Iterator[None]:
    """`env` set in this process's environment for the block, so every child started in it
    inherits it (the launcher starts brokers with the environment it runs in)."""
    before = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def broker_host(broker_id: int) -> str:
    """The name of a broker's host in a netns cluster (launcher.cluster_up)."""
    return f"broker{broker_id}"


class LeaderlessMonitor:
    """Polls ZooKeeper and records, per partition, the longest stretch during which it had no
    live leader although a live broker was in its ISR (the condition I5 bounds)."""

    def __init__(self, store: ZkStore, interval_s: float = 0.1):
        import threading

        self.store = store
        self.interval_s = interval_s
        self.longest: dict[str, float] = {}
        self._since: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leaderless-monitor", daemon=True)

    def start(self) -> LeaderlessMonitor:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        now = time.monotonic()
        for key, since in self._since.items():
            self.longest[key] = max(self.longest.get(key, 0.0), now - since)
        return self.longest

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
            except Exception as exc:
                log.debug("event=monitor_sample_failed error=%r", exc)
            self._stop.wait(self.interval_s)

    def _sample(self) -> None:
        """One look at every partition state, read straight from ZooKeeper in one pipelined
        batch (independent of the views it checks)."""
        live = set(self.store.live_brokers())
        now = time.monotonic()
        paths = {
            layout.partition_state_path(name, p): f"{name}-{p}"
            for name, a in self.store.all_topics().items()
            for p in a.replicas
        }
        for path, got in self.store.read_many(paths).items():
            if got is None:
                continue
            state = PartitionState.decode(got[0], path)
            key = paths[path]
            bad = state.leader not in live and any(r in live for r in state.isr)
            if bad:
                self._since.setdefault(key, now)
            elif key in self._since:
                self.longest[key] = max(self.longest.get(key, 0.0), now - self._since.pop(key))

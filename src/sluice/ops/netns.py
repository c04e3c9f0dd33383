"""A private network of "hosts" on this machine: one Linux network namespace per host.

Sluice's many-host mode runs every ZooKeeper node, broker and sync worker in its own network
namespace, with its own IPv4 address on a private bridge, so that real network faults
(``sluice.chaos.netfaults``) can be put between them. The layout of one network::

    root namespace                         namespace <tag>-<name>  (one per host)
      bridge <tag>br   10.A.B.1/24   <--->   eth0  10.A.B.n/24, default route via 10.A.B.1
        port <tag>v<n>  (veth end)             lo    up

* ``tag`` is a short prefix plus four hex digits (``slu3fa2``), so that several networks can
  coexist and every interface name stays within Linux's 15 characters.
* The /24 is picked at random in 10.100.0.0-10.254.255.0 among those that overlap no route and
  no address of the root namespace, under a machine-wide lock so two creators never pick the
  same one.
* The root namespace has an address on the bridge, so test clients and tools running there
  reach every host directly. Nothing is forwarded or translated: the root namespace keeps its
  own ``ip_forward`` setting and no NAT rule is written, so traffic stays on the bridge. IPv6 is
  off on every interface made here (no router solicitations, no link-local chatter).

Everything is recorded in a JSON state file chosen by the caller, written *before* each
resource is made, so that another process (``sluice cluster down``) or a later run after a
crash can remove it all: :meth:`HostNetwork.load` then :meth:`HostNetwork.remove`. Removal
tolerates resources that are already gone. The bridge's interface alias names the creating
process (``sluice-netns owner=<pid>``), which lets :func:`remove_leftovers` tell the networks
of killed test runs from live ones.

Everything here needs root (``CAP_NET_ADMIN`` and ``CAP_SYS_ADMIN``) and iproute2's ``ip``.
:func:`unavailable_reason` says why a machine cannot run it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from sluice.ops.processes import pid_alive

__all__ = [
    "DEFAULT_TAG_PREFIX",
    "THIS_PROCESS",
    "Host",
    "HostNetwork",
    "NetnsError",
    "call_in_namespace",
    "namespace_exec_prefix",
    "remove_leftovers",
    "unavailable_reason",
]

log = logging.getLogger("sluice.ops.netns")

#: The tag prefix of networks made for clusters; tests use their own so that cleaning up after
#: killed tests never touches a cluster's network.
DEFAULT_TAG_PREFIX = "slu"

#: ``owner_pid`` of :meth:`HostNetwork.create` meaning "the calling process".
THIS_PROCESS = -1

#: The interface name of a host's end of its veth pair, inside its namespace.
HOST_INTERFACE = "eth0"

_NETNS_DIR = Path("/run/netns")
_BRIDGE_NF_CALL_IPTABLES = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_LOCK_PATH = Path("/run/sluice-netns.lock")
_ALIAS_PREFIX = "sluice-netns"
_STATE_VERSION = 1
_IFNAMSIZ_MAX = 15
_HOSTS_MAX = 253  # .2 to .254 of the /24; .1 is the root namespace's
_SUBNET_TRIES_MAX = 64
_TAG_TRIES_MAX = 16
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
_PREFIX_RE = re.compile(r"^[a-z]{1,4}$")
_CLONE_NEWNET = 0x40000000
_SETNS_TIMEOUT_S = 10.0
_KILL_GRACE_S = 2.0

T = TypeVar("T")


class NetnsError(RuntimeError):
    """A host network could not be made or changed; the message says what to do next."""


def unavailable_reason() -> str | None:
    """Return why host networks cannot be made on this machine, or None when they can.

    Checks root, Linux network namespaces and iproute2's ``ip``; tests skip with this reason.
    """
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces (Linux only)"
    if os.geteuid() != 0:
        return "making network namespaces, veths and bridges needs root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is missing (apt-get install iproute2)"
    return _bridged_traffic_blocked()


def _bridged_traffic_blocked() -> str | None:
    """Why packets between hosts on the bridge would be dropped by the root namespace's own
    firewall, if they would: with ``br_netfilter`` loaded and ``bridge-nf-call-iptables`` on,
    bridged frames pass the root FORWARD chain, whose DROP policy (Docker sets one) would drop
    every packet between two hosts while each still reached the root namespace."""
    try:
        if _BRIDGE_NF_CALL_IPTABLES.read_text().strip() != "1":
            return None
    except OSError:
        return None  # br_netfilter not loaded: bridged frames never see iptables
    if shutil.which("iptables") is None:
        return None
    try:
        rules = subprocess.run(
            ["iptables", "-S", "FORWARD"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "-P FORWARD DROP" in rules.splitlines():
        return (
            "the root namespace's FORWARD policy is DROP and bridge-nf-call-iptables is 1, so packets "
            "between hosts on the bridge would be dropped: run `sysctl net.bridge.bridge-nf-call-iptables=0` "
            "or allow the bridge (`iptables -I FORWARD -i 'slu+' -o 'slu+' -j ACCEPT`)"
        )
    return None


# -- one host ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Host:
    """One "host": a network namespace with one address on the network's bridge.

    Attributes:
        name: the caller's name for it (``zk1``, ``broker-2``); unique in its network.
        namespace: the ``ip netns`` name, ``<tag>-<name>``.
        ip: its IPv4 address.
        veth_root: its veth end on the bridge, in the root namespace (``<tag>v<n>``).
        veth_ns: its veth end inside its namespace (always ``eth0``).
    """

    name: str
    namespace: str
    ip: str
    veth_root: str
    veth_ns: str = HOST_INTERFACE

    @property
    def exec_prefix(self) -> list[str]:
        """The argv prefix that runs a program inside this host: ``ip netns exec <ns>``."""
        return namespace_exec_prefix(self.namespace)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside this host; keyword arguments go to :class:`subprocess.Popen`.

        ``ip netns exec`` replaces itself with the program, so the returned pid is the
        program's own and signals reach it directly.
        """
        return subprocess.Popen([*self.exec_prefix, *argv], **kwargs)

    def run(self, argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this host to completion; raise NetnsError when it fails."""
        return _run([*self.exec_prefix, *argv], timeout_s=timeout_s)

    def socket(
        self,
        family: socket.AddressFamily = socket.AF_INET,
        kind: socket.SocketKind = socket.SOCK_STREAM,
        proto: int = 0,
    ) -> socket.socket:
        """Return a socket that lives in this host's namespace, for use from this process.

        A socket belongs to the namespace it was created in for its whole life, so a test can
        talk *from* a host (connect, send, listen) without starting a process in it.
        """
        return call_in_namespace(self.namespace, lambda: socket.socket(family, kind, proto))

    def pids(self) -> list[int]:
        """Return the processes running in this host's namespace (empty when it is gone)."""
        return _namespace_pids(self.namespace)

    def exists(self) -> bool:
        """Return whether this host's namespace exists."""
        return (_NETNS_DIR / self.namespace).exists()


def namespace_exec_prefix(namespace: str) -> list[str]:
    """The argv prefix that runs a program inside ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def call_in_namespace(namespace: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` on a short-lived thread that has joined ``namespace``; return its result.

    Only that thread changes namespace (``setns(2)`` with ``CLONE_NEWNET`` is per thread), and
    it ends right after, so the rest of the process never sees the change. Sockets made by
    ``fn`` stay in ``namespace``.

    Raises:
        NetnsError: when the namespace does not exist or cannot be joined.
    """
    path = _NETNS_DIR / namespace
    outcome: dict[str, Any] = {}

    def target() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            with open("/proc/thread-self/ns/net", "rb") as own, open(path, "rb") as theirs:
                if libc.setns(theirs.fileno(), _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {namespace}: {os.strerror(err)}")
                try:
                    outcome["value"] = fn()
                finally:
                    # The thread ends next, but leave it as it was in case anything runs after.
                    libc.setns(own.fileno(), _CLONE_NEWNET)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name=f"netns-{namespace}", daemon=True)
    thread.start()
    thread.join(_SETNS_TIMEOUT_S)
    if thread.is_alive():
        raise NetnsError(f"a call inside namespace {namespace} did not finish in {_SETNS_TIMEOUT_S:g} s")
    if "error" in outcome:
        exc = outcome["error"]
        if isinstance(exc, FileNotFoundError):
            raise NetnsError(f"namespace {namespace} does not exist (was its network removed?)") from exc
        raise exc
    return outcome["value"]


# -- the network ---------------------------------------------------------------------------------


class HostNetwork:
    """A bridge in the root namespace and one namespace per host on it.

    Example::

        with HostNetwork.create(tmp_path / "net.json") as net:
            zk1 = net.add_host("zk1")
            proc = zk1.popen(["java", ...])
            ...
        # namespaces, veths and bridge are gone here, also when the body raised

    From another process: ``HostNetwork.load(path).remove()``.
    """

    def __init__(
        self,
        state_path: Path,
        *,
        tag: str,
        subnet: str,
        owner_pid: int | None,
        hosts: Sequence[Host] = (),
    ) -> None:
        """Describe a network; use :meth:`create` or :meth:`load` rather than this."""
        self.state_path = Path(state_path).resolve()
        self.tag = tag
        self.subnet = ipaddress.IPv4Network(subnet)
        self.owner_pid = owner_pid
        self._hosts: dict[str, Host] = {h.name: h for h in hosts}
        self._lock = threading.Lock()
        self._removed = False

    # -- naming --------------------------------------------------------------------------------

    @property
    def bridge(self) -> str:
        """The bridge's interface name, ``<tag>br``."""
        return f"{self.tag}br"

    @property
    def root_ip(self) -> str:
        """The root namespace's address on the bridge (the subnet's first address)."""
        return str(self.subnet.network_address + 1)

    @property
    def hosts(self) -> list[Host]:
        """The hosts, in the order they were added."""
        return list(self._hosts.values())

    def host(self, name: str) -> Host:
        """Return the host called ``name``.

        Raises:
            KeyError: with the names that exist, when there is no such host.
        """
        try:
            return self._hosts[name]
        except KeyError:
            raise KeyError(f"no host {name!r} in network {self.tag}; hosts: {sorted(self._hosts)}") from None

    def __repr__(self) -> str:
        """Show the tag, subnet and hosts."""
        return f"HostNetwork(tag={self.tag}, subnet={self.subnet}, hosts={sorted(self._hosts)})"

    # -- creation ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        state_path: Path,
        *,
        tag_prefix: str = DEFAULT_TAG_PREFIX,
        owner_pid: int | None = THIS_PROCESS,
    ) -> HostNetwork:
        """Make the bridge and its root-namespace address; record them in ``state_path``.

        Args:
            state_path: the JSON file that records the network (its directory must exist).
            tag_prefix: 1 to 4 lowercase letters that start the tag of every name made here.
            owner_pid: the process whose death makes the network a leftover for
                :func:`remove_leftovers` (default: this process); None for a network meant to
                outlive its creator, such as a cluster's.

        Raises:
            NetnsError: when this machine cannot make networks, ``state_path`` already records
                one, or no free subnet or tag is found.
        """
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsError(f"cannot make a host network: {reason}")
        if not _PREFIX_RE.match(tag_prefix):
            raise ValueError(f"tag_prefix must be 1 to 4 lowercase letters, got {tag_prefix!r}")
        state_path = Path(state_path).resolve()
        if state_path.exists():
            raise NetnsError(
                f"{state_path} already records a host network; remove it first "
                f"(HostNetwork.load({str(state_path)!r}).remove()) or pick another path"
            )
        owner = os.getpid() if owner_pid == THIS_PROCESS else owner_pid
        with _machine_lock():
            tag = _pick_tag(tag_prefix)
            subnet = _pick_subnet()
            net = cls(state_path, tag=tag, subnet=str(subnet), owner_pid=owner)
            net._save()
            try:
                net._make_bridge()
            except BaseException:
                net.remove()
                raise
        log.info("event=netns_network_created tag=%s subnet=%s bridge=%s", tag, subnet, net.bridge)
        return net

    @classmethod
    def load(cls, state_path: Path) -> HostNetwork:
        """Read the network recorded in ``state_path`` (written by :meth:`create`).

        Raises:
            FileNotFoundError: when no state file is there (nothing to remove).
            NetnsError: when the file is not a host network's state.
        """
        state_path = Path(state_path).resolve()
        try:
            state = json.loads(state_path.read_text())
            if state.get("version") != _STATE_VERSION:
                raise ValueError(f"unknown state version {state.get('version')!r}")
            hosts = [Host(**h) for h in state["hosts"]]
            return cls(
                state_path,
                tag=state["tag"],
                subnet=state["subnet"],
                owner_pid=state["owner_pid"],
                hosts=hosts,
            )
        except FileNotFoundError:
            raise FileNotFoundError(f"no host network recorded in {state_path}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise NetnsError(
                f"{state_path} is not a host network's state ({exc}); remove leftovers by tag with "
                "sluice.ops.netns.remove_leftovers"
            ) from exc

    def add_host(self, name: str) -> Host:
        """Make a host: a namespace, a veth pair to the bridge, an address and routes.

        Args:
            name: 1 to 32 of ``[a-z0-9_-]``, starting with a letter or digit; unique here.

        Raises:
            ValueError: on a bad or duplicate name, or when the /24 is full (253 hosts).
            NetnsError: when a command fails (the host's parts made so far are removed).
        """
        if not _NAME_RE.match(name):
            raise ValueError(
                f"host name must be 1-32 of [a-z0-9_-] starting with a letter or digit: {name!r}"
            )
        with self._lock:
            if self._removed:
                raise NetnsError(f"network {self.tag} was removed; create a new one")
            if name in self._hosts:
                raise ValueError(f"host {name!r} already exists in network {self.tag}")
            index = len(self._hosts) + 1
            if index > _HOSTS_MAX:
                raise ValueError(f"network {self.tag} is full: a /24 holds {_HOSTS_MAX} hosts")
            host = Host(
                name=name,
                namespace=f"{self.tag}-{name}",
                ip=str(self.subnet.network_address + 1 + index),
                veth_root=f"{self.tag}v{index}",
            )
            assert len(host.veth_root) <= _IFNAMSIZ_MAX, host.veth_root
            # Recorded first: a crash half-way leaves nothing that remove() does not know of.
            self._hosts[name] = host
            self._save()
            try:
                self._make_host(host)
            except BaseException:
                _remove_host_parts(host)
                del self._hosts[name]
                self._save()
                raise
        log.info("event=netns_created name=%s namespace=%s ip=%s", name, host.namespace, host.ip)
        return host

    # -- removal -------------------------------------------------------------------------------

    def remove(self, *, kill_processes: bool = True) -> None:
        """Remove every host (its processes, veth, namespace), the bridge and the state file.

        Idempotent, and works whatever is already gone (after a crash, a half-made host, a
        namespace deleted by hand). Firewall rules and queueing disciplines live inside the
        namespaces and go with them.

        Args:
            kill_processes: end the processes still running in the namespaces (SIGTERM, then
                SIGKILL after 2 s). A process keeps its namespace, and so its veth and address,
                alive after ``ip netns delete``; only pass False when none can be left.
        """
        with self._lock:
            self._removed = True
            if kill_processes:
                _kill_namespace_processes([h.namespace for h in self._hosts.values()])
            for host in self._hosts.values():
                _remove_host_parts(host)
            _delete_link(self.bridge)
            self.state_path.unlink(missing_ok=True)
        log.info("event=netns_network_removed tag=%s hosts=%d", self.tag, len(self._hosts))

    def __enter__(self) -> HostNetwork:
        """Return the network (it was made by :meth:`create`)."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Remove the network, also when the body raised."""
        self.remove()

    # -- internals -----------------------------------------------------------------------------

    def _save(self) -> None:
        """Write the state file atomically."""
        state = {
            "version": _STATE_VERSION,
            "tag": self.tag,
            "subnet": str(self.subnet),
            "owner_pid": self.owner_pid,
            "hosts": [asdict(h) for h in self._hosts.values()],
        }
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.state_path)

    def _make_bridge(self) -> None:
        """Make the bridge, give the root namespace its address, bring it up."""
        owner = "none" if self.owner_pid is None else str(self.owner_pid)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _disable_ipv6_root(self.bridge)
        _run(["ip", "link", "set", self.bridge, "alias", f"{_ALIAS_PREFIX} owner={owner}"])
        _run(["ip", "addr", "add", f"{self.root_ip}/{self.subnet.prefixlen}", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])

    def _make_host(self, host: Host) -> None:
        """Make one host's namespace, veth pair, address and routes."""
        _run(["ip", "netns", "add", host.namespace])
        # IPv6 off before eth0 exists, so it never sends a router solicitation.
        host.run(
            ["sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        )
        veth = ["ip", "link", "add", host.veth_root, "type", "veth"]
        _run([*veth, "peer", "name", host.veth_ns, "netns", host.namespace])
        _disable_ipv6_root(host.veth_root)
        _run(["ip", "link", "set", host.veth_root, "master", self.bridge, "up"])
        ns = ["ip", "-n", host.namespace]
        _run([*ns, "addr", "add", f"{host.ip}/{self.subnet.prefixlen}", "dev", host.veth_ns])
        _run([*ns, "link", "set", "lo", "up"])
        _run([*ns, "link", "set", host.veth_ns, "up"])
        _run([*ns, "route", "add", "default", "via", self.root_ip])


def remove_leftovers(tag_prefix: str, *, orphans_only: bool = True) -> list[str]:
    """Remove host networks whose tag starts with ``tag_prefix``, found by name, not state file.

    For cleaning up after killed processes (a test run killed by its timeout). Namespaces named
    ``<tag>-*`` and links named ``<tag>*`` go, with the processes running in those namespaces.

    Args:
        tag_prefix: the prefix given to :meth:`HostNetwork.create`.
        orphans_only: keep networks whose owner process (in the bridge's alias) still runs, and
            networks with no owner (made to outlive their creator, such as a cluster's). With
            False, every network with the prefix goes: only do that when nothing uses it.

    Returns:
        The tags of the networks removed.
    """
    if not _PREFIX_RE.match(tag_prefix):
        raise ValueError(f"tag_prefix must be 1 to 4 lowercase letters, got {tag_prefix!r}")
    tag_re = re.compile(rf"^({re.escape(tag_prefix)}[0-9a-f]{{4}})(?:br$|v\d+$|-)")
    links = _links()
    namespaces = _namespaces()
    tags: set[str] = set()
    for name in [*links, *namespaces]:
        m = tag_re.match(name)
        if m:
            tags.add(m.group(1))
    removed: list[str] = []
    for tag in sorted(tags):
        if orphans_only:
            alias = links.get(f"{tag}br", {}).get("ifalias", "")
            owner = _owner_from_alias(alias)
            if owner is None or owner == "none" or pid_alive(int(owner)):
                continue
        own_namespaces = [ns for ns in namespaces if ns.startswith(f"{tag}-")]
        _kill_namespace_processes(own_namespaces)
        for ns in own_namespaces:
            _delete_namespace(ns)
        for link in links:
            if link == f"{tag}br" or re.match(rf"^{tag}v\d+$", link):
                _delete_link(link)
        log.info("event=netns_leftover_removed tag=%s namespaces=%d", tag, len(own_namespaces))
        removed.append(tag)
    return removed


# -- helpers -------------------------------------------------------------------------------------


def _run(argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run a command; raise NetnsError quoting its stderr when it fails."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise NetnsError(f"{argv[0]} is not installed: run scripts/bootstrap.sh") from exc
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in {timeout_s:g} s") from exc
    if proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Hold a machine-wide lock while a network picks its tag and subnet and claims them."""
    _LOCK_PATH.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK_PATH, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pick_tag(prefix: str) -> str:
    """Return ``prefix`` plus four hex digits that no link or namespace name starts with."""
    taken = [*_links(), *_namespaces()]
    for _ in range(_TAG_TRIES_MAX):
        tag = prefix + secrets.token_hex(2)
        if not any(name.startswith(tag) for name in taken):
            return tag
    raise NetnsError(
        f"no free tag with prefix {prefix!r} after {_TAG_TRIES_MAX} tries; remove leftovers with "
        f"sluice.ops.netns.remove_leftovers({prefix!r})"
    )


def _pick_subnet() -> ipaddress.IPv4Network:
    """Return a random 10.x.y.0/24 (x >= 100) overlapping no route or address of this machine."""
    used = _used_networks()
    rng = random.Random(secrets.randbits(64))
    for _ in range(_SUBNET_TRIES_MAX):
        candidate = ipaddress.IPv4Network(f"10.{rng.randint(100, 254)}.{rng.randint(0, 255)}.0/24")
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise NetnsError(
        f"no free private /24 in 10.100.0.0-10.254.255.0 after {_SUBNET_TRIES_MAX} tries; "
        "this machine's routes cover them (see `ip route show table all`)"
    )


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Return every IPv4 route destination (but default) and address prefix of the root namespace."""
    used: list[ipaddress.IPv4Network] = []
    for route in json.loads(_run(["ip", "-j", "-4", "route", "show", "table", "all"]).stdout or "[]"):
        dst = route.get("dst", "default")
        if dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.IPv4Network(dst, strict=False))
    for link in json.loads(_run(["ip", "-j", "-4", "addr"]).stdout or "[]"):
        for addr in link.get("addr_info", []):
            with contextlib.suppress(ValueError, KeyError):
                used.append(ipaddress.IPv4Network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return used


def _links() -> dict[str, dict[str, Any]]:
    """Return the root namespace's links by name."""
    return {link["ifname"]: link for link in json.loads(_run(["ip", "-j", "link"]).stdout or "[]")}


def _namespaces() -> list[str]:
    """Return the names of the ``ip netns`` namespaces."""
    try:
        return sorted(p.name for p in _NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def _owner_from_alias(alias: str) -> str | None:
    """Return the owner in a bridge alias written by HostNetwork (a pid or "none"), else None."""
    m = re.match(rf"^{_ALIAS_PREFIX} owner=(\d+|none)$", alias)
    return m.group(1) if m else None


def _namespace_pids(namespace: str) -> list[int]:
    """Return the pids running in ``namespace`` (empty when it does not exist)."""
    if not (_NETNS_DIR / namespace).exists():
        return []
    proc = subprocess.run(
        ["ip", "netns", "pids", namespace], capture_output=True, text=True, timeout=30, check=False
    )
    return [int(p) for p in proc.stdout.split() if p.isdigit()]


def _kill_namespace_processes(namespaces: Sequence[str]) -> None:
    """SIGTERM every process in ``namespaces``, SIGKILL those left after a grace period."""
    pids = {pid: ns for ns in namespaces for pid in _namespace_pids(ns)}
    if not pids:
        return
    for pid, ns in pids.items():
        log.info("event=netns_process_killed namespace=%s pid=%d", ns, pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    # An exited child of this process stays a zombie until its Popen reaps it; it holds no
    # namespace any more, so it counts as gone (pid_alive).
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _remove_host_parts(host: Host) -> None:
    """Delete a host's veth (both ends go together) and namespace, whichever exist."""
    _delete_link(host.veth_root)
    _delete_namespace(host.namespace)


def _delete_link(name: str) -> None:
    """Delete a root-namespace link if it exists."""
    if not Path(f"/sys/class/net/{name}").exists():
        return
    proc = subprocess.run(
        ["ip", "link", "del", name], capture_output=True, text=True, timeout=30, check=False
    )
    if proc.returncode != 0 and Path(f"/sys/class/net/{name}").exists():
        raise NetnsError(
            f"cannot delete link {name}: {proc.stderr.strip()}; delete it with `ip link del {name}`"
        )


def _delete_namespace(namespace: str) -> None:
    """Delete a namespace if it exists."""
    if not (_NETNS_DIR / namespace).exists():
        return
    proc = subprocess.run(
        ["ip", "netns", "del", namespace], capture_output=True, text=True, timeout=30, check=False
    )
    if proc.returncode != 0 and (_NETNS_DIR / namespace).exists():
        raise NetnsError(
            f"cannot delete namespace {namespace}: {proc.stderr.strip()}; "
            f"delete it with `ip netns del {namespace}`"
        )


def _disable_ipv6_root(interface: str) -> None:
    """Turn IPv6 off on a root-namespace interface (no link-local address, no solicitations)."""
    path = Path(f"/proc/sys/net/ipv6/conf/{interface}/disable_ipv6")
    with contextlib.suppress(OSError):  # a kernel without IPv6 has nothing to turn off
        path.write_text("1\n")

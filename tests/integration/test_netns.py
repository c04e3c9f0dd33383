"""Hosts in network namespaces on a private bridge, and real network faults between them.

Every fault test first shows the traffic it is about to block flowing, so that a fault which
did nothing would fail the test.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.chaos import netfaults
from sluice.chaos.netfaults import (
    CHAIN_IN,
    CHAIN_OUT,
    LinkImpairment,
    OneWayDrop,
    Partition,
    Split,
    TimedFaults,
    heal_all,
)
from sluice.ops.netns import Host, HostNetwork, NetnsError, remove_leftovers
from tests.support.cluster import wait_until

_REASON = netfaults.unavailable_reason()
if _REASON is not None:  # pragma: no cover - depends on the machine
    pytest.skip(f"host networks cannot run here: {_REASON}", allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

#: Networks made by tests carry this tag prefix, so cleaning up after killed test runs never
#: touches a cluster's network ("slu").
TAG_PREFIX = "slt"
ECHO_PORT = 7000
#: How long a connection or datagram is given to get through before the test calls it blocked;
#: on this bridge a round trip takes well under a millisecond.
BLOCKED_AFTER_S = 1.0
#: How long traffic that should flow is given (generous: a loaded 2-core machine).
FLOWS_WITHIN_S = 5.0

# An echo server that tags each reply with the address it heard from, so a test sees that a
# host's packets arrive from the host's own address (no NAT on the way).
ECHO_SERVER = """
import socket, sys, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2])))
srv.listen(64)
print("listening", flush=True)
def serve(conn, peer):
    with conn:
        while data := conn.recv(65536):
            conn.sendall(peer.encode() + b" " + data)
while True:
    conn, (peer, _) = srv.accept()
    threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
"""

# A client run inside a host: connect, send a token, print the reply; exit 1 when it fails.
ECHO_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.sendall(b"ping")
        print(s.recv(100).decode())
except OSError as exc:
    print(f"failed: {exc}")
    sys.exit(1)
"""


@pytest.fixture(scope="module", autouse=True)
def _no_leftovers_of_killed_runs() -> None:
    """Remove the networks of test runs that were killed before their clean-up ran."""
    remove_leftovers(TAG_PREFIX, orphans_only=True)


@pytest.fixture
def net(tmp_path: Path) -> Iterator[HostNetwork]:
    """A network of three hosts a, b, c, each with an echo server; removed after the test."""
    network = HostNetwork.create(tmp_path / "net.json", tag_prefix=TAG_PREFIX)
    servers: list[subprocess.Popen[bytes]] = []
    try:
        for name in ("a", "b", "c"):
            host = network.add_host(name)
            servers.append(_start_echo_server(host))
        yield network
    finally:
        for server in servers:
            server.kill()
            server.wait(10)
            assert server.stdout is not None
            server.stdout.close()
        network.remove()


def _start_echo_server(host: Host) -> subprocess.Popen[bytes]:
    """Start the echo server inside ``host`` and wait until it listens."""
    proc = host.popen([sys.executable, "-c", ECHO_SERVER, host.ip, str(ECHO_PORT)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 10)
    assert ready and proc.stdout.readline().strip() == b"listening", (
        f"echo server in {host.name} did not start"
    )
    return proc


def _connect(src: Host | None, dst: Host, timeout_s: float) -> socket.socket:
    """Return a TCP connection from ``src``'s namespace (None: the root namespace) to ``dst``."""
    sock = src.socket() if src is not None else socket.socket()
    sock.settimeout(timeout_s)
    try:
        sock.connect((dst.ip, ECHO_PORT))
    except BaseException:
        sock.close()
        raise
    return sock


def _echo(sock: socket.socket, token: bytes) -> bytes:
    """Send ``token`` and return the reply (``<peer ip> <token>``)."""
    sock.sendall(token)
    return sock.recv(100)


def tcp_ok(src: Host | None, dst: Host, timeout_s: float = BLOCKED_AFTER_S) -> bool:
    """Return whether a new TCP connection from ``src`` to ``dst`` gets an echo within ``timeout_s``."""
    try:
        with _connect(src, dst, timeout_s) as sock:
            return _echo(sock, b"hello").endswith(b"hello")
    except OSError:
        return False


def _udp_socket(host: Host, port: int) -> socket.socket:
    """Return a UDP socket in ``host`` bound to its address and ``port``."""
    sock = host.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host.ip, port))
    return sock


def udp_arrives(sender: socket.socket, receiver: socket.socket, token: bytes) -> bool:
    """Send ``token`` three times; return whether it arrives within BLOCKED_AFTER_S."""
    for _ in range(3):
        sender.sendto(token, receiver.getsockname())
    deadline = time.monotonic() + BLOCKED_AFTER_S
    while (left := deadline - time.monotonic()) > 0:
        receiver.settimeout(left)
        try:
            if receiver.recv(100) == token:
                return True
        except TimeoutError:
            return False
    return False


def _round_trip_s(sock: socket.socket) -> float:
    """Return the time of one echo round trip on ``sock``."""
    t0 = time.monotonic()
    assert _echo(sock, b"x").endswith(b"x")
    return time.monotonic() - t0


def _sluice_names(tag: str) -> list[str]:
    """Return the links and namespaces whose names start with ``tag``."""
    links = [link["ifname"] for link in json.loads(subprocess.check_output(["ip", "-j", "link"]))]
    namespaces = [p.name for p in Path("/run/netns").iterdir()] if Path("/run/netns").exists() else []
    return sorted(n for n in links + namespaces if n.startswith(tag))


# -- the network ---------------------------------------------------------------------------------


def test_hosts_reach_each_other_from_their_own_addresses_and_the_root_namespace_reaches_them(
    net: HostNetwork,
) -> None:
    hosts = net.hosts
    assert [h.name for h in hosts] == ["a", "b", "c"]
    assert len({h.ip for h in hosts} | {net.root_ip}) == 4
    assert all(len(name) <= 15 for h in hosts for name in (h.veth_root, net.bridge))
    for src in hosts:
        route = src.run(["ip", "route", "show", "default"]).stdout
        assert f"default via {net.root_ip} dev eth0" in route
        for dst in hosts:
            if dst is src:
                continue
            # A client process started inside the source host.
            client = subprocess.run(
                [*src.exec_prefix, sys.executable, "-c", ECHO_CLIENT, dst.ip, str(ECHO_PORT), "5"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert client.returncode == 0, f"{src.name} -> {dst.name}: {client.stdout}{client.stderr}"
            assert client.stdout.strip() == f"{src.ip} ping", "the server heard the host's own address"
    for dst in hosts:
        with _connect(None, dst, FLOWS_WITHIN_S) as sock:
            assert _echo(sock, b"from-root") == f"{net.root_ip} from-root".encode()


def test_the_state_file_records_what_another_process_needs_to_remove_the_network(net: HostNetwork) -> None:
    loaded = HostNetwork.load(net.state_path)
    assert loaded.tag == net.tag
    assert loaded.subnet == net.subnet
    assert loaded.hosts == net.hosts
    assert loaded.bridge == net.bridge
    with pytest.raises(ValueError, match="already exists"):
        net.add_host("a")
    with pytest.raises(ValueError, match="host name"):
        net.add_host("Bad Name")


def test_two_networks_coexist_on_different_subnets(net: HostNetwork, tmp_path: Path) -> None:
    with HostNetwork.create(tmp_path / "other.json", tag_prefix=TAG_PREFIX) as other:
        x = other.add_host("a")  # the same host name as in `net`: namespaces differ by tag
        assert other.tag != net.tag
        assert not other.subnet.overlaps(net.subnet)
        assert x.namespace != net.host("a").namespace
        server = _start_echo_server(x)
        try:
            assert tcp_ok(None, x, FLOWS_WITHIN_S)
            assert tcp_ok(None, net.host("a"), FLOWS_WITHIN_S)
        finally:
            server.kill()
            server.wait(10)


# -- faults --------------------------------------------------------------------------------------


def test_partition_blocks_tcp_between_two_hosts_including_an_open_connection_but_not_to_the_third(
    net: HostNetwork,
) -> None:
    a, b, c = net.host("a"), net.host("b"), net.host("c")
    with _connect(a, b, FLOWS_WITHIN_S) as open_conn:
        assert _echo(open_conn, b"before") == f"{a.ip} before".encode()
        assert tcp_ok(a, b) and tcp_ok(b, a)

        partition = Partition(net, "a", ["b"])
        partition.apply()
        try:
            open_conn.settimeout(BLOCKED_AFTER_S)
            open_conn.sendall(b"during")
            with pytest.raises(TimeoutError):
                open_conn.recv(100)
            assert not tcp_ok(a, b), "a new connection a -> b got through the partition"
            assert not tcp_ok(b, a), "a new connection b -> a got through the partition"
            assert tcp_ok(a, c) and tcp_ok(c, a) and tcp_ok(b, c) and tcp_ok(c, b)
            assert tcp_ok(None, a) and tcp_ok(None, b), "the root namespace is never cut off"
        finally:
            partition.heal()
        partition.heal()  # idempotent

        # The open connection's retransmission delivers the data sent during the partition.
        open_conn.settimeout(15)
        assert open_conn.recv(100) == f"{a.ip} during".encode()
        assert tcp_ok(a, b, FLOWS_WITHIN_S) and tcp_ok(b, a, FLOWS_WITHIN_S)


def test_split_cuts_one_side_from_the_other_while_each_side_still_talks(net: HostNetwork) -> None:
    a, b, c = net.host("a"), net.host("b"), net.host("c")
    assert tcp_ok(a, b) and tcp_ok(a, c) and tcp_ok(b, c)
    split = Split(net, ["a", "b"])  # {a, b} against {c}
    assert [h.name for h in split.other] == ["c"]
    split.apply()
    try:
        assert tcp_ok(a, b) and tcp_ok(b, a), "hosts on one side still talk"
        assert not tcp_ok(a, c) and not tcp_ok(c, a) and not tcp_ok(b, c) and not tcp_ok(c, b)
    finally:
        split.heal()
    assert tcp_ok(a, c, FLOWS_WITHIN_S) and tcp_ok(c, b, FLOWS_WITHIN_S)
    with pytest.raises(ValueError, match="both sides"):
        Split(net, ["a", "b", "c"])


def test_one_way_drop_blocks_packets_from_a_to_b_but_not_from_b_to_a(net: HostNetwork) -> None:
    a, b = net.host("a"), net.host("b")
    with _udp_socket(a, 9001) as at_a, _udp_socket(b, 9001) as at_b:
        assert udp_arrives(at_a, at_b, b"a-to-b-before")
        assert udp_arrives(at_b, at_a, b"b-to-a-before")
        drop = OneWayDrop(net, "a", "b")
        drop.apply()
        try:
            assert not udp_arrives(at_a, at_b, b"a-to-b-during"), "a datagram a -> b got through"
            assert udp_arrives(at_b, at_a, b"b-to-a-during")
            # TCP needs both directions: a's SYN never reaches b.
            assert not tcp_ok(a, b)
        finally:
            drop.heal()
        assert udp_arrives(at_a, at_b, b"a-to-b-after")
        assert tcp_ok(a, b, FLOWS_WITHIN_S)


@pytest.mark.parametrize("backend", ["nfqueue", "netem"])
def test_link_delay_adds_measurable_round_trip_time(net: HostNetwork, backend: netfaults.Backend) -> None:
    b = net.host("b")
    if backend == "netem" and not netfaults.netem_available(b):
        pytest.skip(
            "this kernel has no sch_netem (CONFIG_NET_SCH_NETEM is off); the nfqueue backend covers it"
        )
    with _connect(None, b, FLOWS_WITHIN_S) as conn:
        before = statistics.median(_round_trip_s(conn) for _ in range(5))
        assert before < 0.03
        slow = LinkImpairment(net, "b", delay_ms=100, jitter_ms=10, backend=backend)
        slow.apply()
        try:
            during = [_round_trip_s(conn) for _ in range(5)]
        finally:
            slow.heal()
        assert min(during) >= 0.085, f"round trips during a 100 +/- 10 ms delay: {during}"
        assert statistics.median(during) < 0.5, during
        after = statistics.median(_round_trip_s(conn) for _ in range(5))
        assert after < 0.03, f"the delay outlived its heal: {after:.3f} s"
    slow.heal()  # idempotent


def test_link_loss_drops_about_the_given_share_of_packets(net: HostNetwork) -> None:
    a, b = net.host("a"), net.host("b")
    sent = 400
    with _udp_socket(b, 9002) as at_b, _udp_socket(a, 9002) as at_a:
        lossy = LinkImpairment(net, "b", loss_percent=50, backend="nfqueue", seed=7)
        lossy.apply()
        try:
            for i in range(sent):
                at_b.sendto(str(i).encode(), at_a.getsockname())
            received = 0
            at_a.settimeout(BLOCKED_AFTER_S)
            with contextlib.suppress(TimeoutError):
                for _ in range(sent):
                    at_a.recv(100)
                    received += 1
        finally:
            lossy.heal()
        assert 0.3 * sent < received < 0.7 * sent, f"{received} of {sent} datagrams arrived at 50% loss"
        assert udp_arrives(at_b, at_a, b"after")


def test_a_second_impairment_of_one_host_is_refused_until_the_first_heals(net: HostNetwork) -> None:
    first = LinkImpairment(net, "c", delay_ms=20)
    first.apply()
    try:
        with pytest.raises(netfaults.NetFaultError, match="already"):
            LinkImpairment(net, "c", delay_ms=50).apply()
        with pytest.raises(netfaults.NetFaultError, match="applied already"):
            first.apply()
    finally:
        first.heal()
    second = LinkImpairment(net, "c", delay_ms=50)
    second.apply()
    second.heal()


def test_timed_faults_heal_on_their_own_and_everything_heals_when_the_body_raises(net: HostNetwork) -> None:
    a, b, c = net.host("a"), net.host("b"), net.host("c")
    with pytest.raises(RuntimeError, match="drill failed"), TimedFaults(net) as faults:
        t0 = time.monotonic()
        faults.apply_for(Partition(net, "a", ["b"]), duration_s=1.5)
        assert not tcp_ok(a, b, 0.5)
        wait_until(lambda: tcp_ok(a, b, 0.5), 10, "the partition to heal after its duration")
        assert time.monotonic() - t0 >= 1.4
        assert faults.active == []

        faults.apply_for(Partition(net, "a", ["c"]), duration_s=600)
        faults.apply_for(LinkImpairment(net, "c", delay_ms=200), duration_s=600)
        assert not tcp_ok(a, c)
        assert faults.counts == {"partition": 2, "netem": 1}
        raise RuntimeError("drill failed")
    assert tcp_ok(a, c, FLOWS_WITHIN_S)
    with _connect(None, c, FLOWS_WITHIN_S) as conn:
        assert _round_trip_s(conn) < 0.1
    assert not [pid for pid in c.pids() if netfaults._is_delayer(pid)]
    assert faults.heal_errors == []


def test_heal_all_removes_faults_this_process_did_not_keep(net: HostNetwork) -> None:
    a, b = net.host("a"), net.host("b")
    # Fault objects dropped at once stand for faults applied by another (killed) process.
    Partition(net, "a", ["b"]).apply()
    LinkImpairment(net, "b", delay_ms=300).apply()
    assert not tcp_ok(a, b)
    heal_all(net)
    assert tcp_ok(a, b, FLOWS_WITHIN_S)
    for host in (a, b):  # c never had a rule, so it has no chains either
        for chain in (CHAIN_IN, CHAIN_OUT):
            rules = host.run(["iptables", "-S", chain]).stdout.splitlines()
            assert rules == [f"-N {chain}"], rules
    wait_until(lambda: not [p for p in b.pids() if netfaults._is_delayer(p)], 10, "the delayer to exit")


# -- removal -------------------------------------------------------------------------------------


def test_removal_leaves_no_namespace_link_bridge_or_process_behind_when_the_body_raises(
    tmp_path: Path,
) -> None:
    state = tmp_path / "net.json"
    with (
        pytest.raises(RuntimeError, match="test body failed"),
        HostNetwork.create(state, tag_prefix=TAG_PREFIX) as net,
    ):
        tag = net.tag
        hosts = [net.add_host(name) for name in ("x", "y")]
        sleeper = hosts[0].popen(["sleep", "300"])
        Partition(net, "x", ["y"]).apply()
        LinkImpairment(net, "y", delay_ms=50).apply()
        assert len(_sluice_names(tag)) == 5  # bridge, two veths, two namespaces
        raise RuntimeError("test body failed")
    assert _sluice_names(tag) == []
    assert not state.exists()
    assert sleeper.wait(10) is not None, "the process inside the host was ended"
    net.remove()  # idempotent


def test_another_process_removes_a_network_from_its_state_file_after_a_crash(tmp_path: Path) -> None:
    state = tmp_path / "net.json"
    net = HostNetwork.create(state, tag_prefix=TAG_PREFIX, owner_pid=None)
    try:
        net.add_host("x")
        net.add_host("y")
        # A crash half-way through a removal: one namespace is gone already.
        subprocess.run(["ip", "netns", "del", net.host("x").namespace], check=True)
        remover = subprocess.run(
            [
                sys.executable,
                "-c",
                f"from sluice.ops.netns import HostNetwork; HostNetwork.load({str(state)!r}).remove()",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert remover.returncode == 0, remover.stderr
        assert _sluice_names(net.tag) == []
        with pytest.raises(FileNotFoundError, match="no host network"):
            HostNetwork.load(state)
    finally:
        net.remove()
    with pytest.raises(NetnsError, match="was removed"):
        net.add_host("z")


def test_remove_leftovers_removes_networks_of_dead_owners_and_keeps_live_ones(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(10)
    orphan = HostNetwork.create(tmp_path / "orphan.json", tag_prefix=TAG_PREFIX, owner_pid=dead.pid)
    live = HostNetwork.create(tmp_path / "live.json", tag_prefix=TAG_PREFIX)
    try:
        orphan.add_host("x")
        live.add_host("x")
        removed = remove_leftovers(TAG_PREFIX, orphans_only=True)
        assert orphan.tag in removed
        assert live.tag not in removed
        assert _sluice_names(orphan.tag) == []
        assert len(_sluice_names(live.tag)) == 3
    finally:
        orphan.remove()
        live.remove()

"""A three-member ZooKeeper ensemble, each member in its own network namespace.

Kazoo clients run in the root namespace and reach every member's address directly. Every wait
has a deadline; every fault test first shows what the fault is about to take away.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from sluice.chaos import netfaults
from sluice.chaos.netfaults import Split
from sluice.ops.netns import HostNetwork, remove_leftovers
from sluice.ops.zookeeper import ZooKeeperEnsemble, find_classpath, four_letter_word
from tests.support.cluster import wait_until

_REASON = netfaults.unavailable_reason()
if _REASON is not None:  # pragma: no cover - depends on the machine
    pytest.skip(f"host networks cannot run here: {_REASON}", allow_module_level=True)
try:
    find_classpath()
except RuntimeError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(str(exc), allow_module_level=True)

pytestmark = pytest.mark.timeout(120)

TAG_PREFIX = "slt"
#: Longest wait for an election, a restart or a rejoin (they take 1-3 s here).
ELECTION_WITHIN_S = 30


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[tuple[HostNetwork, ZooKeeperEnsemble]]:
    """Three hosts zk1..zk3 with one ensemble member each; stopped and removed after the test."""
    remove_leftovers(TAG_PREFIX, orphans_only=True)
    net = HostNetwork.create(tmp_path / "net.json", tag_prefix=TAG_PREFIX)
    try:
        hosts = [net.add_host(f"zk{i}") for i in (1, 2, 3)]
        zk = ZooKeeperEnsemble.on_hosts(tmp_path / "zk", hosts, force_sync=False)
        zk.start(timeout_s=60)
        try:
            yield net, zk
        finally:
            zk.stop()
    finally:
        net.remove()


def _client(hosts: str, timeout_s: float = 10.0) -> KazooClient:
    """Return a started kazoo client (session timeout 6 s)."""
    client = KazooClient(hosts=hosts, timeout=6.0)
    client.start(timeout=timeout_s)
    return client


def test_ensemble_serves_a_root_namespace_client_and_survives_its_leader_killed(
    ensemble: tuple[HostNetwork, ZooKeeperEnsemble],
) -> None:
    net, zk = ensemble
    assert zk.connect_string == ",".join(f"{h.ip}:2181" for h in net.hosts)
    modes = zk.modes()
    assert sorted(modes.values()) == ["follower", "follower", "leader"], modes
    for sid, node in zk.nodes.items():
        # Each member binds its own host's address, with the ports every member uses.
        assert node.host == net.host(f"zk{sid}").ip
        conf = four_letter_word(node.host, 2181, "conf")
        assert f"serverId={sid}" in conf.splitlines()

    client = _client(zk.connect_string)
    try:
        client.create("/drill", b"one")
        assert client.get("/drill")[0] == b"one"

        old_leader = zk.leader()
        assert old_leader is not None
        zk.kill(old_leader)
        assert zk.node(old_leader).mode() is None
        others = [sid for sid in zk.nodes if sid != old_leader]
        new_leader = zk.wait_for_quorum(ELECTION_WITHIN_S, among=others)
        assert new_leader != old_leader

        # The two left keep serving: the client's session moves to one of them.
        wait_until(lambda: client.connected, ELECTION_WITHIN_S, "the client to reconnect")
        client.set("/drill", b"two")
        assert client.get("/drill")[0] == b"two"

        zk.restart(old_leader, timeout_s=ELECTION_WITHIN_S)
        assert zk.node(old_leader).mode() == "follower"
        assert zk.leader() == new_leader
    finally:
        client.stop()
        client.close()

    # The restarted member has the write made while it was dead.
    rejoined = _client(zk.node(old_leader).connect_string)
    try:
        rejoined.sync("/drill")
        assert rejoined.get("/drill")[0] == b"two"
    finally:
        rejoined.stop()
        rejoined.close()


def test_minority_side_of_a_split_stops_serving_and_rejoins_after_heal(
    ensemble: tuple[HostNetwork, ZooKeeperEnsemble],
) -> None:
    net, zk = ensemble
    minority = zk.leader()
    assert minority is not None
    majority = [sid for sid in zk.nodes if sid != minority]
    lone = zk.node(minority)
    assert lone.mode() == "leader", "before the split the minority member serves"

    split = Split(net, [f"zk{minority}"])
    split.apply()
    try:
        new_leader = zk.wait_for_quorum(ELECTION_WITHIN_S, among=majority)
        assert new_leader in majority
        wait_until(lambda: lone.mode() is None, ELECTION_WITHIN_S, "the minority member to stop serving")
        assert "not currently serving" in four_letter_word(lone.host, lone.port, "srvr")
        # A client that can only reach the minority cannot even open a session there ...
        with pytest.raises(KazooTimeoutError):
            _client(lone.connect_string, timeout_s=3)
        # ... while the majority takes writes.
        client = _client(",".join(zk.node(sid).connect_string for sid in majority))
        try:
            client.create("/split", b"majority")
        finally:
            client.stop()
            client.close()
    finally:
        split.heal()

    wait_until(lambda: lone.mode() == "follower", ELECTION_WITHIN_S, "the minority member to rejoin")
    assert zk.leader() == new_leader
    rejoined = _client(lone.connect_string)
    try:
        rejoined.sync("/split")
        assert rejoined.get("/split")[0] == b"majority"
    finally:
        rejoined.stop()
        rejoined.close()


def test_an_ensemble_on_loopback_ports_elects_one_leader(tmp_path: Path) -> None:
    # No namespaces: three members on 127.0.0.1, each with its own three ports.
    zk = ZooKeeperEnsemble.local(tmp_path / "zk", 3, force_sync=False)
    with zk:
        assert len(set(zk.connect_string.split(","))) == 3
        assert sorted(m for m in zk.modes().values() if m) == ["follower", "follower", "leader"]
        client = _client(zk.connect_string)
        try:
            client.create("/local", b"ok")
        finally:
            client.stop()
            client.close()
    assert all(node.pid is None for node in zk.nodes.values())

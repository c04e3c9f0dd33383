"""ZooKeeper ACLs (issue 17, acceptance 3): on a cluster started with ``security="sasl_ssl"``
every znode carries the cluster's digest ACL, so a ZooKeeper client without its credentials can
read no secret (SCRAM credentials, task definitions) and change nothing (partition state, the
controller epoch, a task definition). A cluster without credentials stays open, as before."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, Permissions

from sluice.cluster import layout
from sluice.cluster.zkstore import ZkAuth, ZkStore, connect, make_client
from sluice.ops import launcher
from sluice.sync.tasks import TaskStore, parse_spec
from tests.support.cluster import TestCluster, wait_until

TOPIC = "orders"
SPEC = {"id": "orders-sync", "source": {"kind": "generator"}, "target": "sqlite:///t.db"}


@contextmanager
def anonymous(address: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=address, timeout=10.0)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def test_a_client_without_the_credentials_can_read_no_secret_and_change_nothing(
    make_cluster: Callable[..., TestCluster],
) -> None:
    c = make_cluster(1, security="sasl_ssl")
    auth = c.cluster.zk_auth()
    assert auth is not None and auth.set_acl
    store = ZkStore(c.zookeeper, auth=auth)
    store.start()
    try:
        store.create_topic(layout.TopicAssignment(TOPIC, uuid.uuid4(), {0: (1,)}))
        wait_until(lambda: store.partition_state(TOPIC, 0), 30, "the controller to elect a leader")
        TaskStore(store.client).create(parse_spec(SPEC))
        state_path = layout.partition_state_path(TOPIC, 0)
        state_before = store.client.get(state_path)[0]
        epoch_before = store.client.get(layout.CONTROLLER_EPOCH)[0]
        task_before = store.client.get(f"/tasks/{SPEC['id']}")[0]

        with anonymous(c.zookeeper) as client:
            # secrets: not even readable
            for secret in ("/config/users/admin", f"/tasks/{SPEC['id']}"):
                with pytest.raises(NoAuthError):
                    client.get(secret)
            with pytest.raises(NoAuthError):
                client.get_children("/tasks")
            # cluster state: readable (as with Kafka's zookeeper.set.acl), never writable
            assert client.get(state_path)[0] == state_before
            for path in (state_path, layout.CONTROLLER_EPOCH, f"/tasks/{SPEC['id']}"):
                with pytest.raises(NoAuthError):
                    client.set(path, b'{"leader": 99}')
            for path in (layout.CONTROLLER, f"/tasks/{SPEC['id']}/control", "/brokers/ids/99"):
                with pytest.raises(NoAuthError):
                    client.delete(path)
            with pytest.raises(NoAuthError):
                client.create(layout.REASSIGN_PARTITIONS, b"{}")
            with pytest.raises(NoAuthError):
                client.set_acls(state_path, OPEN_ACL_UNSAFE)

        # nothing changed, and the cluster's own credential still reads and writes
        assert store.client.get(state_path)[0] == state_before
        assert store.client.get(layout.CONTROLLER_EPOCH)[0] == epoch_before
        assert store.client.get(f"/tasks/{SPEC['id']}")[0] == task_before
        assert store.client.get("/config/users/admin")[0]
        assert store.request_reassignment([]) is True
        store.client.delete(layout.REASSIGN_PARTITIONS)
    finally:
        store.stop()

    # every znode the cluster made carries the ACL, the chroot itself included
    root = connect(c.zookeeper.split("/")[0], auth=auth)
    try:
        chroot = "/" + c.zookeeper.split("/", 1)[1]
        acls, _ = root.get_acls(chroot)
        assert {(a.id.scheme, a.perms) for a in acls} == {
            ("digest", Permissions.ALL),
            ("world", Permissions.READ),
        }
        acls, _ = root.get_acls(f"{chroot}/config/users/admin")
        assert [(a.id.scheme, a.id.id.split(":")[0], a.perms) for a in acls] == [
            ("digest", auth.username, Permissions.ALL)
        ]
    finally:
        root.stop()
        root.close()


def test_creates_get_the_acl_of_their_path_parents_and_multi_ops_included(zookeeper: str) -> None:
    auth = ZkAuth("sluice", "not-a-real-password")
    address = f"{zookeeper}/t-{uuid.uuid4().hex[:8]}"
    store = ZkStore(address, auth=auth)
    store.start()
    try:
        zk = store.client
        zk.create("/tasks/a/b/c", b"x", makepath=True)
        zk.ensure_path("/manager/users")
        tx = zk.transaction()
        tx.create("/manager/users/u1", b"")
        tx.create("/brokers/topics/t", b"")
        assert not any(isinstance(r, Exception) for r in tx.commit())
        only_us = [("digest", Permissions.ALL)]
        shared = [("digest", Permissions.ALL), ("world", Permissions.READ)]
        for path, want in [
            ("/tasks", only_us), ("/tasks/a", only_us), ("/tasks/a/b/c", only_us),
            ("/manager", only_us), ("/manager/users", only_us), ("/manager/users/u1", only_us),
            ("/brokers", shared), ("/brokers/topics/t", shared), ("/admin", shared),
        ]:  # fmt: skip
            acls, _ = zk.get_acls(path)
            assert sorted((a.id.scheme, a.perms) for a in acls) == sorted(want), path
    finally:
        store.stop()


def test_without_credentials_znodes_stay_open_as_before(zookeeper: str) -> None:
    address = f"{zookeeper}/t-{uuid.uuid4().hex[:8]}"
    store = ZkStore(address)
    store.start()
    try:
        store.client.create("/tasks/x", b"{}", makepath=True)
        acls, _ = store.client.get_acls("/tasks/x")
        assert list(acls) == list(OPEN_ACL_UNSAFE)
    finally:
        store.stop()
    # and a credentialed client works on such a cluster (moving an existing one to ACLs)
    client = make_client(address, auth=ZkAuth("sluice", "pw", set_acl=False))
    client.start(timeout=15)
    try:
        client.set("/tasks/x", b"{}")
        client.create("/tasks/y", b"{}")
        assert list(client.get_acls("/tasks/y")[0]) == list(OPEN_ACL_UNSAFE)
    finally:
        client.stop()
        client.close()


def test_the_password_is_never_in_a_repr() -> None:
    auth = ZkAuth("sluice", "hunter2-secret")
    assert "hunter2" not in repr(auth)
    assert auth.auth_data == [("digest", "sluice:hunter2-secret")]


def test_a_chroot_someone_else_created_first_is_refused(zookeeper: str, tmp_path: Path) -> None:
    """Issue 33, finding 6: a secured cluster whose chroot someone else created first used to
    start in it, and the chroot kept the squatter's open ACL, so anyone could add znodes beside
    the cluster's (a task definition, an ACL) and read what it put there. Failing run before the
    fix: `cluster up` started in it (`ensure_path` of an existing znode changes no ACL):

        with pytest.raises(ValueError) as refused:
        Failed: DID NOT RAISE <class 'ValueError'>
    """
    chroot = f"/t-{uuid.uuid4().hex[:10]}"
    with anonymous(zookeeper) as squatter:
        squatter.create(chroot, b"")  # open to the world: anyone may create, change, delete
    address = f"{zookeeper}{chroot}"
    directory = tmp_path / "cluster"
    try:
        with pytest.raises(ValueError) as refused:
            launcher.cluster_up(directory, 1, address, security="sasl_ssl")
    finally:
        if (directory / launcher.STATE_FILE).exists():
            launcher.cluster_down(directory)
    text = str(refused.value)
    assert chroot in text and "world:anyone" in text and "setAcl" in text, text
    with anonymous(zookeeper) as squatter:
        assert squatter.get_children(chroot) == [], "something was written into the chroot"
    # a broker (any process: ZkStore.start) with the credential refuses it as well
    with pytest.raises(ValueError, match="not this cluster's"):
        ZkStore(address, auth=ZkAuth("sluice", "pw-of-another")).start()
    # a chroot with the cluster's own ACL is accepted, at its creation and every start after
    own = f"{zookeeper}/t-{uuid.uuid4().hex[:10]}"
    auth = ZkAuth("sluice", "our-password")
    for _ in range(2):
        store = ZkStore(own, auth=auth)
        store.start()
        store.stop()
    # ... and by a process of another cluster's credential, not
    with pytest.raises(ValueError, match="not this cluster's"):
        ZkStore(own, auth=ZkAuth("sluice", "their-password")).start()


def test_a_chroot_rule_is_a_pure_decision_over_its_acl() -> None:
    from kazoo.security import make_acl, make_digest_acl

    from sluice.cluster.zkstore import chroot_acl_problem

    auth = ZkAuth("sluice", "pw")
    ours = make_digest_acl("sluice", "pw", all=True)
    world_read = make_acl("world", "anyone", read=True)
    assert chroot_acl_problem([ours, world_read], auth) is None
    assert chroot_acl_problem([ours], auth) is None
    assert "world:anyone" in (chroot_acl_problem(list(OPEN_ACL_UNSAFE), auth) or "")
    assert "digest:mallory" in (
        chroot_acl_problem([ours, make_digest_acl("mallory", "x", create=True)], auth) or ""
    )
    assert "cannot" in (chroot_acl_problem([make_digest_acl("sluice", "other", all=True)], auth) or "")
    # without credentials (a cluster without ACLs) an open chroot is what every process shares
    assert chroot_acl_problem(list(OPEN_ACL_UNSAFE), None) is None
    assert "cannot" in (chroot_acl_problem([ours, world_read], None) or "")
    # authenticating without setting ACLs (moving a cluster to them): open is expected
    assert chroot_acl_problem(list(OPEN_ACL_UNSAFE), ZkAuth("sluice", "pw", set_acl=False)) is None

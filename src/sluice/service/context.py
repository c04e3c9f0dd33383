"""`Services`: the connections a service call needs, opened once per CLI command or manager."""

from __future__ import annotations

from typing import Any

from sluice.cluster.zkstore import ZkAuth, ZkStore
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.service.errors import UnavailableError
from sluice.sync.tasks import TaskStore

DEFAULT_WORKER_GROUP = "sluice-workers"


class Services:
    """Connections a service call needs. ZooKeeper is connected on first use: calls that only
    talk to the brokers (create a topic, describe a group) work without one."""

    def __init__(
        self,
        zookeeper: str | None,
        bootstrap: str,
        *,
        worker_group: str = DEFAULT_WORKER_GROUP,
        connect_timeout_s: float = 10.0,
        security: ClientSecurity = PLAINTEXT,
        zk_auth: ZkAuth | None = None,
    ) -> None:
        self.zookeeper = zookeeper
        #: ZooKeeper digest credentials (a cluster with ZooKeeper ACLs); None: none
        self.zk_auth = zk_auth
        self.bootstrap = bootstrap
        #: how every broker connection of a service call authenticates (Kafka's client keys)
        self.security = security
        self.worker_group = worker_group
        self.connect_timeout_s = connect_timeout_s
        self._zk: ZkStore | None = None
        self._tasks: TaskStore | None = None

    @property
    def zk(self) -> ZkStore:
        if self._zk is None:
            if self.zookeeper is None:
                raise UnavailableError("this needs ZooKeeper: give --zookeeper (or $SLUICE_ZOOKEEPER)")
            zk = ZkStore(self.zookeeper, connect_timeout_s=self.connect_timeout_s, auth=self.zk_auth)
            try:
                zk.start()
            except ConnectionError as exc:
                raise UnavailableError(str(exc)) from None
            self._zk = zk
        return self._zk

    @property
    def tasks(self) -> TaskStore:
        if self._tasks is None:
            self._tasks = TaskStore(self.zk.client)
        return self._tasks

    @property
    def client(self) -> Any:
        """The kazoo client on the cluster's chroot (for the manager's own stores)."""
        return self.zk.client

    def close(self) -> None:
        if self._zk is not None:
            self._zk.stop()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_services(
    zookeeper: str,
    bootstrap: str,
    *,
    worker_group: str = DEFAULT_WORKER_GROUP,
    connect_timeout_s: float = 10.0,
    security: ClientSecurity = PLAINTEXT,
    zk_auth: ZkAuth | None = None,
) -> Services:
    """Services connected to ZooKeeper now (a manager wants to know at start that it can)."""
    svc = Services(
        zookeeper,
        bootstrap,
        worker_group=worker_group,
        connect_timeout_s=connect_timeout_s,
        security=security,
        zk_auth=zk_auth,
    )
    svc.zk  # noqa: B018 - connect now
    return svc

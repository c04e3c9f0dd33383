"""`Services`: the connections a service call needs, opened once per CLI command or manager."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.cluster.zkstore import ZkStore
from sluice.service.errors import UnavailableError
from sluice.sync.tasks import TaskStore

DEFAULT_WORKER_GROUP = "sluice-workers"


@dataclass
class Services:
    zookeeper: str
    bootstrap: str
    zk: ZkStore
    tasks: TaskStore
    worker_group: str = DEFAULT_WORKER_GROUP

    @property
    def client(self) -> Any:
        """The kazoo client on the cluster's chroot (for the manager's own stores)."""
        return self.zk.client

    def close(self) -> None:
        self.zk.stop()

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
) -> Services:
    zk = ZkStore(zookeeper, connect_timeout_s=connect_timeout_s)
    try:
        zk.start()
    except ConnectionError as exc:
        raise UnavailableError(str(exc)) from None
    return Services(zookeeper, bootstrap, zk, TaskStore(zk.client), worker_group)

"""Access to a Sluice cluster's state in ZooKeeper (kazoo), used by brokers, the controller
and the CLI. Reads return decoded records from ``cluster.layout``; writes that change cluster
state on behalf of the controller go through :meth:`ZkStore.commit_fenced`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.protocol.states import ZnodeStat

from sluice import test_switches
from sluice.cluster import layout
from sluice.cluster.layout import BrokerRegistration, PartitionState, ProducerIdBlock, TopicAssignment

log = logging.getLogger(__name__)

DEFAULT_CHROOT = "/sluice"
PRODUCER_ID_BLOCK_SIZE = 1000


class BrokerIdInUseError(RuntimeError):
    """Another live broker already registered this id."""


class TopicExistsError(ValueError):
    pass


class ControllerDeposedError(RuntimeError):
    """A fenced write failed its controller-epoch check: someone else is controller now."""


class ZnodeContentionError(RuntimeError):
    """A compare-and-set lost to other writers more times than its bound allows."""


def update_znode(
    client: KazooClient,
    path: str,
    change: Callable[[bytes | None], bytes | None],
    *,
    ephemeral: bool = False,
    max_tries: int = 100,
) -> bytes | None:
    """The one compare-and-set recipe: read `path` (None when absent), ask `change` for the new
    data (None: leave it as it is), write it conditionally on the version read (or create it),
    and on a conflict read again, at most `max_tries` times. Returns what is stored afterwards.

    Counters (fencing epochs, producer-id blocks), control records and status records all use
    it, so a writer that read an old version can never overwrite a newer one."""
    for _ in range(max_tries):
        try:
            current, stat = client.get(path)
        except NoNodeError:
            current, stat = None, None
        new = change(current)
        if new is None:
            return current
        try:
            if stat is None:
                client.create(path, new, ephemeral=ephemeral, makepath=True)
            else:
                client.set(path, new, version=stat.version)
            return new
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
    raise ZnodeContentionError(f"{path}: gave up after {max_tries} conflicting writes")


def split_zookeeper_address(address: str) -> tuple[str, str]:
    """``host:port[,host:port]/chroot`` -> (hosts, chroot). The chroot defaults to /sluice."""
    if "/" in address:
        hosts, _, chroot = address.partition("/")
        chroot = "/" + chroot.strip("/")
    else:
        hosts, chroot = address, DEFAULT_CHROOT
    if not hosts:
        raise ValueError(f"ZooKeeper address {address!r} names no host:port")
    return hosts, chroot


@dataclass(frozen=True, slots=True)
class FencedOp:
    """One operation of a controller's fenced multi-op."""

    kind: str  # "create" | "set" | "delete"
    path: str
    data: bytes = b""
    version: int = -1


class ZkStore:
    """A kazoo session on the cluster's chroot."""

    def __init__(self, address: str, *, session_timeout_s: float = 6.0, connect_timeout_s: float = 15.0):
        hosts, chroot = split_zookeeper_address(address)
        self.address = f"{hosts}{chroot}"
        self.hosts = hosts
        self.chroot = chroot
        self._connect_timeout_s = connect_timeout_s
        self.client = KazooClient(
            hosts=self.address, timeout=session_timeout_s, connection_retry={"max_tries": -1, "max_delay": 1}
        )

    # -- session -----------------------------------------------------------------------------

    def start(self) -> None:
        # The chroot must exist before a chrooted session can use it.
        root = KazooClient(hosts=self.hosts, timeout=10.0)
        try:
            root.start(timeout=self._connect_timeout_s)
        except Exception as exc:
            raise ConnectionError(
                f"cannot reach ZooKeeper at {self.hosts}: {exc}; is it running? "
                "(`sluice cluster up` starts a local one)"
            ) from exc
        try:
            root.ensure_path(self.chroot)
        finally:
            root.stop()
            root.close()
        self.client.start(timeout=self._connect_timeout_s)
        for path in layout.PERSISTENT_PATHS:
            self.client.ensure_path(path)

    def stop(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    @property
    def session_id(self) -> int:
        sid = self.client.client_id
        return int(sid[0]) if sid else 0

    # -- brokers -----------------------------------------------------------------------------

    def register_broker(self, reg: BrokerRegistration) -> int:
        """Create the broker's ephemeral znode; returns the broker epoch (the znode's czxid).

        A znode left by this same session (a retried create) is ours; one held by any other
        live session means a second broker with this id, which is refused.
        """
        path = layout.broker_path(reg.broker_id)
        try:
            real = self.client.create(path, reg.encode(), ephemeral=True)
            _, stat = self.client.get(real)
            return int(stat.czxid)
        except NodeExistsError:
            try:
                data, stat = self.client.get(path)
            except NoNodeError:
                return self.register_broker(reg)
            if stat.ephemeralOwner == self.session_id:
                return int(stat.czxid)
            other = BrokerRegistration.decode(reg.broker_id, data)
            raise BrokerIdInUseError(
                f"broker id {reg.broker_id} is already registered by a live broker at "
                f"{other.host}:{other.port} (pid {other.pid}); refusing to start a second broker "
                f"with the same id. Stop that broker or pick another --id."
            ) from None

    def live_brokers(self) -> dict[int, BrokerRegistration]:
        result: dict[int, BrokerRegistration] = {}
        for child in self.client.get_children(layout.BROKER_IDS):
            try:
                data, _ = self.client.get(f"{layout.BROKER_IDS}/{child}")
            except NoNodeError:
                continue
            result[int(child)] = BrokerRegistration.decode(int(child), data)
        return result

    # -- cluster id, controller ----------------------------------------------------------------

    def cluster_id(self) -> str:
        try:
            return self.client.get(layout.CLUSTER_ID)[0].decode()
        except NoNodeError:
            try:
                self.client.create(layout.CLUSTER_ID, str(uuid.uuid4()).encode(), makepath=True)
            except NodeExistsError:
                pass
            return self.client.get(layout.CLUSTER_ID)[0].decode()

    def controller_id(self) -> int:
        try:
            data, _ = self.client.get(layout.CONTROLLER)
        except NoNodeError:
            return -1
        try:
            return int(layout._loads(data, layout.CONTROLLER)["brokerid"])
        except (ValueError, KeyError):
            return -1

    def controller_epoch(self) -> tuple[int, int]:
        """(epoch, znode version); (0, -1) before the first election."""
        try:
            data, stat = self.client.get(layout.CONTROLLER_EPOCH)
        except NoNodeError:
            return 0, -1
        return layout.decode_int(data, layout.CONTROLLER_EPOCH), int(stat.version)

    def commit_fenced(self, epoch_zk_version: int, ops: Iterable[FencedOp]) -> None:
        """Apply ``ops`` atomically, only if ``/controller_epoch`` still has the given version.

        This is the fence of I4: a controller that was deposed (the epoch moved on) cannot
        change anything, because its check fails and ZooKeeper rejects the whole multi-op.
        """
        txn = self.client.transaction()
        if not test_switches.enabled(test_switches.DISABLE_EPOCH_FENCE):
            txn.check(layout.CONTROLLER_EPOCH, epoch_zk_version)
        ops = list(ops)
        for op in ops:
            if op.kind == "create":
                txn.create(op.path, op.data)
            elif op.kind == "set":
                txn.set_data(op.path, op.data, op.version)
            elif op.kind == "delete":
                txn.delete(op.path, op.version)
            else:
                raise ValueError(f"unknown fenced op {op.kind!r}")
        results = txn.commit()
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return
        if test_switches.enabled(test_switches.DISABLE_EPOCH_FENCE):
            raise failures[0]
        first = results[0]
        if isinstance(first, (BadVersionError, NoNodeError)):
            raise ControllerDeposedError(
                f"controller epoch znode is no longer at version {epoch_zk_version}: deposed"
            )
        real = [r for r in results[1:] if isinstance(r, Exception) and type(r).__name__ != "RolledBackError"]
        raise real[0] if real else failures[0]

    # -- topics ------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        return sorted(self.client.get_children(layout.TOPICS))

    def topic(self, name: str) -> TopicAssignment | None:
        try:
            data, _ = self.client.get(layout.topic_path(name))
        except NoNodeError:
            return None
        return TopicAssignment.decode(name, data)

    def topic_with_version(self, name: str) -> tuple[TopicAssignment, int] | None:
        try:
            data, stat = self.client.get(layout.topic_path(name))
        except NoNodeError:
            return None
        return TopicAssignment.decode(name, data), int(stat.version)

    def create_topic(self, assignment: TopicAssignment) -> None:
        try:
            self.client.create(layout.topic_path(assignment.name), assignment.encode())
        except NodeExistsError:
            raise TopicExistsError(f"topic {assignment.name!r} already exists") from None

    def topics_marked_for_deletion(self) -> list[str]:
        return sorted(self.client.get_children(layout.DELETE_TOPICS))

    def mark_topic_for_deletion(self, name: str) -> None:
        try:
            self.client.create(layout.delete_topic_path(name), b"")
        except NodeExistsError:
            pass

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        path = layout.partition_state_path(topic, partition)
        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return PartitionState.decode(data, path), int(stat.version)

    def delete_recursive_unfenced(self, path: str) -> None:
        """For tools and tests only; the controller deletes through fenced ops."""
        try:
            self.client.delete(path, recursive=True)
        except (NoNodeError, NotEmptyError):
            pass

    # -- producer ids --------------------------------------------------------------------------

    def allocate_producer_id_block(
        self, broker_id: int, size: int = PRODUCER_ID_BLOCK_SIZE
    ) -> ProducerIdBlock:
        """Claim the next block of producer ids with a conditional write (unique cluster-wide)."""

        def next_block(data: bytes | None) -> bytes:
            first = ProducerIdBlock.decode(data).next_first if data is not None else 0
            return ProducerIdBlock(broker_id, first, size).encode()

        stored = update_znode(self.client, layout.PRODUCER_ID_BLOCK, next_block, max_tries=1000)
        assert stored is not None
        return ProducerIdBlock.decode(stored)

    # -- watches -----------------------------------------------------------------------------

    def watch_children(self, path: str, callback: Callable[[list[str]], Any]) -> None:
        self.client.ChildrenWatch(path, callback)

    def watch_data(self, path: str, callback: Callable[[bytes | None, ZnodeStat | None], Any]) -> None:
        self.client.DataWatch(path, callback)

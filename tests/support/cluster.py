"""Test harness: real brokers as subprocesses on a shared real ZooKeeper, one chroot per test."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sluice.ops import launcher
from sluice.ops.launcher import BrokerProcess, LocalCluster, WorkerProcess
from sluice.ops.zookeeper import LocalZooKeeper
from sluice.security.client import ClientSecurity

K = TypeVar("K")


def wait_until(condition: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:
            last_exc = exc
        time.sleep(interval_s)
    raise AssertionError(
        f"timed out after {timeout_s} s waiting for {what}"
        + (f" (last error: {last_exc!r})" if last_exc else "")
    )


class TestCluster:
    """Brokers in a chroot of their own on the shared ZooKeeper, or (``zookeeper=None``) with a
    standalone ZooKeeper of their own, for tests that take ZooKeeper away."""

    __test__ = False  # a harness, not a test class

    def __init__(
        self,
        zookeeper: str | None,
        directory: Path,
        brokers: int,
        session_timeout_s: float = 6.0,
        broker_settings: dict[str, str] | None = None,
        security: str = "none",
        racks: dict[int, str] | None = None,
        workers: int = 0,
    ):
        self.chroot = f"/t-{uuid.uuid4().hex[:10]}"
        self.directory = directory
        self.cluster: LocalCluster = launcher.cluster_up(
            directory,
            brokers,
            None if zookeeper is None else f"{zookeeper}{self.chroot}",
            zk_session_timeout_s=session_timeout_s,
            broker_settings=broker_settings,
            security=security,
            racks=racks,
            workers=workers,
        )

    @property
    def client_properties(self) -> Path | None:
        """The admin user's Kafka client properties (security on), else None."""
        return self.cluster.client_properties

    def client_security(self) -> ClientSecurity:
        return self.cluster.client_security()

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def zookeeper(self) -> str:
        return self.cluster.zookeeper

    @property
    def zookeeper_auth_file(self) -> Path:
        """The ZooKeeper credential's properties file (security on: ``$SLUICE_ZOOKEEPER_AUTH_FILE``
        for CLI commands against this cluster)."""
        return Path(self.cluster.directory) / launcher.ZOOKEEPER_AUTH_FILE

    def broker(self, broker_id: int) -> BrokerProcess:
        return self.cluster.broker(broker_id)

    def kill(self, broker_id: int, sig: int = signal.SIGKILL) -> None:
        b = self.broker(broker_id)
        os.kill(b.pid, sig)
        if sig == signal.SIGKILL:
            wait_until(
                lambda: not launcher.pid_alive(b.pid) or _reap(b.pid), 10, f"broker {broker_id} to die"
            )

    def stop(self, broker_id: int) -> None:
        launcher.stop_pid(self.broker(broker_id).pid)

    def restart(self, broker_id: int) -> None:
        b = self.broker(broker_id)
        if launcher.pid_alive(b.pid):
            launcher.stop_pid(b.pid)
        # The dead broker's ephemeral znode lingers until its session expires; the restarted
        # broker waits it out.
        launcher.restart_broker(self.cluster, b)

    def kill_zookeeper(self) -> None:
        """SIGKILL the cluster's own ZooKeeper (a cluster made with ``zookeeper=None``)."""
        c = self.cluster
        assert c.own_zookeeper and not c.zookeeper_members, "only a cluster's own standalone ZooKeeper"
        LocalZooKeeper(Path(c.directory) / "zookeeper", c.zookeeper_port).kill()

    def wait_exits(self, broker_ids: list[int], timeout_s: float) -> dict[int, tuple[int, float]]:
        """Wait up to ``timeout_s`` for these brokers (children of this process) to exit; for
        each that did: its exit code (negative: the signal that ended it) and the seconds it took
        from this call. Brokers still running are missing from the answer."""
        return wait_exits({self.broker(b).pid: b for b in broker_ids}, timeout_s)

    def worker(self, name: str) -> WorkerProcess:
        (w,) = [w for w in self.cluster.workers if w.name == name]
        return w

    def log_text(self, broker_id: int) -> str:
        return Path(self.broker(broker_id).log_file).read_text(errors="replace")

    def down(self) -> None:
        launcher.cluster_down(self.directory)
        for b in self.cluster.brokers:
            _reap(b.pid)
        for w in self.cluster.workers:
            _reap(w.pid)
            # What a worker killed past its bound may leave: its Spark driver JVM, in the process
            # group `cluster up` started the worker in (exits on its own once its stdin closes).
            group_left(w.pid, kill=True)


def group_left(pgid: int, kill: bool = False) -> list[int]:
    """The processes still in process group ``pgid`` (a worker's: it and its Spark driver JVM);
    with ``kill``, SIGKILL them."""
    left = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            left.append(int(entry.name))
    if kill and left and pgid > 0:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


def wait_exits(pids: dict[int, K], timeout_s: float) -> dict[K, tuple[int, float]]:
    """Wait up to ``timeout_s`` for these processes (children of this process; each pid's name
    for the answer) to exit; for each that did: its exit code (negative: the signal that ended
    it) and the seconds it took from this call. Processes still running are missing."""
    started = time.monotonic()
    waiting = dict(pids)
    exits: dict[K, tuple[int, float]] = {}
    while waiting and time.monotonic() - started < timeout_s:
        for pid, name in list(waiting.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                exits[name] = (os.waitstatus_to_exitcode(status), time.monotonic() - started)
                del waiting[pid]
        time.sleep(0.02)
    return exits


def _reap(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return not launcher.pid_alive(pid)


@contextmanager
def one_broker_with_topic(
    zookeeper: str, directory: Path, topic: str, partitions: int
) -> Iterator[TestCluster]:
    """A one-broker cluster holding ``topic`` (replication factor 1), created over the wire; the
    cluster is stopped on exit."""
    from sluice.protocol.api import ApiKey
    from sluice.protocol.errors import ErrorCode
    from sluice.sync.wire_client import WireClient

    c = TestCluster(zookeeper, directory, 1)
    try:
        with WireClient.connect(c.bootstrap) as w:
            r = w.request(
                ApiKey.CREATE_TOPICS,
                5,
                {
                    "topics": [{"name": topic, "num_partitions": partitions, "replication_factor": 1}],
                    "timeout_ms": 30000,
                },
            )
            assert r["topics"][0]["error_code"] == ErrorCode.NONE, r
        yield c
    finally:
        c.down()

"""The incident drills against Apache Kafka (``sluice incident run NAME --against kafka``, issue 20).

Incidents A and C run against a local Kafka 3.9.1 cluster in ZooKeeper mode (the jars that
``scripts/peers.sh`` fetches; `sluice.peers.kafka`), wired for faults the way `DrillCluster`
wires Sluice's: a private standalone ZooKeeper, and one TCP proxy per broker on its way there,
so a broker can be cut from ZooKeeper alone. Kafka keeps its own settings: the brokers run with
Kafka's defaults (``unclean.leader.election.enable=false``, the default since 0.11;
``min.insync.replicas=1`` broker-wide) but for what a 3-broker local cluster needs and
``zookeeper.session.timeout.ms`` equal to the drill's session timeout (6 s, as Sluice's brokers
have it); the drills' topics are created exactly as in the Sluice drills.

* A (``acks1-failover``) is the very same function as the Sluice drill (`incidents.acks1_failover`):
  same producers, same cut, same stale client, same checks. ZooKeeper's view of it is Kafka's own
  layout (``/brokers/ids``, ``/controller``, ``.../partitions/{p}/state``), read by
  `KafkaZkView`.
* C (``single-replica-shutdown``, alias ``rf1-maintenance``) has the Sluice drill's two phases
  and checks. Where Sluice drains the broker (``sluice broker drain``), Kafka's own tool for that
  step is a partition reassignment (written to ``/admin/reassign_partitions``, what
  ``kafka-reassign-partitions`` does); and a third row stops an RF=1 broker for maintenance the
  way the incident did it, by a controlled shutdown with no reassignment.
* B and D do not run: `not_applicable` says what part of them applies to Kafka.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.chaos.incidents import (
    _create_topic,
    _row,
    _wait_acks,
    _wait_for,
    acks1_failover,
)
from sluice.chaos.results import Check, IncidentResult
from sluice.chaos.tcp_proxy import TcpProxy
from sluice.chaos.workload import VerifiableProducer, read_everything
from sluice.cluster.layout import PartitionState
from sluice.ops.ports import free_port, free_ports
from sluice.ops.processes import pid_alive
from sluice.ops.zookeeper import LocalZooKeeper
from sluice.peers import kafka as peer
from sluice.security.client import PLAINTEXT, ClientSecurity

#: What `--against kafka` means, printed with every run.
AGAINST = f"kafka-{peer.KAFKA_VERSION}"


@dataclass(frozen=True, slots=True)
class KafkaBrokerAddress:
    broker_id: int
    host: str
    port: int
    pid: int


class KafkaZkView:
    """Kafka's ZooKeeper layout, read: what a drill asks ZooKeeper about a Kafka cluster, with
    the answers in the shapes `ZkStore` gives for Sluice's (Kafka's partition state znode holds
    the same fields as Sluice's: leader, leader_epoch, isr, controller_epoch)."""

    def __init__(self, connect: str):
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=connect, timeout=10.0)

    def start(self) -> None:
        self.client.start(timeout=15)

    def stop(self) -> None:
        self.client.stop()
        self.client.close()

    def live_brokers(self) -> dict[int, bytes]:
        result: dict[int, bytes] = {}
        for child in self.client.get_children("/brokers/ids"):
            got = self._get(f"/brokers/ids/{child}")
            if got is not None:
                result[int(child)] = got[0]
        return result

    def controller_id(self) -> int:
        got = self._get("/controller")
        return -1 if got is None else int(json.loads(got[0])["brokerid"])

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None:
        got = self._get(f"/brokers/topics/{topic}/partitions/{partition}/state")
        if got is None:
            return None
        return PartitionState.decode(got[0], f"Kafka's state of {topic}-{partition}"), got[1]

    def assignments(self) -> dict[str, dict[int, list[int]]]:
        """Every topic's replica assignment: topic -> partition -> replicas."""
        result: dict[str, dict[int, list[int]]] = {}
        for topic in self.client.get_children("/brokers/topics"):
            got = self._get(f"/brokers/topics/{topic}")
            if got is not None:
                parts = json.loads(got[0])["partitions"]
                result[topic] = {int(p): [int(r) for r in rs] for p, rs in parts.items()}
        return result

    def _get(self, path: str) -> tuple[bytes, int] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, stat = self.client.get(path)
        except NoNodeError:
            return None
        return data, stat.version


class KafkaDrillCluster:
    """A 3-broker Kafka cluster for a drill, with the fault methods the drills call on
    `DrillCluster` (same names, same notes in the timeline). Everything lives in ``directory``;
    leaving the ``with`` block stops every process it started."""

    def __init__(self, directory: Path, brokers: int = 3, *, session_timeout_s: float = 6.0):
        self.directory = directory.resolve()
        self.brokers = brokers
        self.session_timeout_s = session_timeout_s
        self.zk: LocalZooKeeper | None = None
        self.proxies: dict[int, TcpProxy] = {}
        self.cluster: peer.PeerCluster | None = None
        self.store: KafkaZkView | None = None
        self.events: list[tuple[float, str]] = []
        self._t0 = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> KafkaDrillCluster:
        peer.kafka_libs()  # before anything starts: no jars, a PeerError naming scripts/peers.sh
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        self.zk = LocalZooKeeper(self.directory / "zookeeper", free_port(), force_sync=False)
        self.zk.start()
        zk_host, zk_port = self.zk.connect_string.rsplit(":", 1)
        overrides = {}
        for i, port in enumerate(free_ports(self.brokers), start=1):
            self.proxies[i] = TcpProxy("127.0.0.1", port, zk_host, int(zk_port)).start()
            overrides[i] = self.proxies[i].address
        self.cluster = peer.peer_up(
            self.directory / "kafka",
            self.brokers,
            zookeeper=self.zk.connect_string,
            broker_zookeeper=overrides,
            properties={"zookeeper.session.timeout.ms": str(int(self.session_timeout_s * 1000))},
        )
        self.store = KafkaZkView(f"{self.zk.connect_string}{peer.CHROOT}")
        self.store.start()
        self.note(f"Kafka {peer.KAFKA_VERSION} up: {self.brokers} brokers (ZooKeeper mode)")
        return self

    def stop(self) -> None:
        try:
            if self.cluster is not None:
                for b in self.cluster.brokers:
                    if pid_alive(b.pid):
                        os.kill(b.pid, signal.SIGCONT)  # a paused broker cannot shut down
                for proxy in self.proxies.values():
                    proxy.set_mode("pass")  # nor can one cut from ZooKeeper, in good time
                peer.peer_down(Path(self.cluster.directory), grace_s=20)
                for b in self.cluster.brokers:
                    _reap(b.pid)
        finally:
            if self.store is not None:
                self.store.stop()
            for proxy in self.proxies.values():
                proxy.stop()
            if self.zk is not None:
                self.zk.stop()

    def __enter__(self) -> KafkaDrillCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bootstrap(self) -> str:
        assert self.cluster is not None
        return self.cluster.bootstrap_servers

    @property
    def client_security(self) -> ClientSecurity:
        return PLAINTEXT

    def note(self, what: str) -> None:
        self.events.append((time.monotonic() - self._t0, what))

    def broker(self, broker_id: int) -> KafkaBrokerAddress:
        assert self.cluster is not None
        b = next(b for b in self.cluster.brokers if b.broker_id == broker_id)
        return KafkaBrokerAddress(b.broker_id, "127.0.0.1", b.port, b.pid)

    # -- faults ------------------------------------------------------------------------------------

    def kill(self, broker_id: int) -> None:
        pid = self.broker(broker_id).pid
        os.kill(pid, signal.SIGKILL)
        _wait_gone(pid, 10)
        self.note(f"kill -9 broker {broker_id}")

    def pause(self, broker_id: int) -> None:
        os.kill(self.broker(broker_id).pid, signal.SIGSTOP)
        self.note(f"SIGSTOP broker {broker_id}")

    def resume(self, broker_id: int) -> None:
        os.kill(self.broker(broker_id).pid, signal.SIGCONT)
        self.note(f"SIGCONT broker {broker_id}")

    def shutdown(self, broker_id: int) -> None:
        """SIGTERM: Kafka's controlled shutdown (leadership moved off first where it can be)."""
        pid = self.broker(broker_id).pid
        os.kill(pid, signal.SIGTERM)
        if not _wait_gone(pid, 30):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(pid, 10)
        self.note(f"controlled shutdown of broker {broker_id}")

    def restart(self, broker_id: int) -> None:
        assert self.cluster is not None
        if pid_alive(self.broker(broker_id).pid):
            return
        peer.restart_broker(self.cluster, broker_id)
        self.note(f"restarted broker {broker_id}")

    def cut_zookeeper(self, broker_id: int, mode: str = "drop") -> None:
        self.proxies[broker_id].set_mode(mode)
        self.note(f"cut broker {broker_id} from ZooKeeper ({mode})")

    def heal_zookeeper(self, broker_id: int) -> None:
        self.proxies[broker_id].set_mode("pass")
        self.note(f"reconnected broker {broker_id} to ZooKeeper")

    # -- targets and waiting -----------------------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> int:
        assert self.store is not None
        current = self.store.partition_state(topic, partition)
        return current[0].leader if current else -1

    def controller(self) -> int:
        assert self.store is not None
        return self.store.controller_id()

    def wait_quiescent(self, timeout_s: float = 90.0) -> bool:
        """Every broker registered, every partition led by a live broker with a full ISR."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._quiescent():
                return True
            time.sleep(0.25)
        return False

    def _quiescent(self) -> bool:
        assert self.store is not None
        live = set(self.store.live_brokers())
        if live != set(range(1, self.brokers + 1)):
            return False
        for topic, parts in self.store.assignments().items():
            for p, replicas in parts.items():
                current = self.store.partition_state(topic, p)
                if current is None:
                    return False
                state = current[0]
                if state.leader not in live or set(state.isr) != set(replicas):
                    return False
        return True

    def reassign(self, moves: dict[tuple[str, int], list[int]], timeout_s: float) -> list[tuple[str, int]]:
        """Kafka's way to move replicas off a broker: the reassignment znode that
        ``kafka-reassign-partitions`` writes (still honoured in ZooKeeper mode); waits until the
        controller has finished (it deletes the znode) and the assignments show the moves.
        Returns the moves not done in ``timeout_s``."""
        assert self.store is not None
        plan = {
            "version": 1,
            "partitions": [{"topic": t, "partition": p, "replicas": r} for (t, p), r in moves.items()],
        }
        self.store.client.create("/admin/reassign_partitions", json.dumps(plan).encode(), makepath=True)

        def pending() -> list[tuple[str, int]]:
            assert self.store is not None
            now = self.store.assignments()
            return [(t, p) for (t, p), r in moves.items() if now.get(t, {}).get(p) != r]

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not pending() and self.store.client.exists("/admin/reassign_partitions") is None:
                break
            time.sleep(0.2)
        return pending()


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def _reap(pid: int) -> None:
    """Brokers restarted by a drill are this process's children: collect their exit."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


# -- C against Kafka ----------------------------------------------------------------------------------


def offline_in_metadata(partitions: dict[int, Any], live: set[int]) -> list[str]:
    """What Kafka's Metadata says of each partition it cannot serve (leader -1): its error, and
    the replicas it waits for that are not live. ``partitions``: confluent-kafka's
    PartitionMetadata by id (``.leader``, ``.replicas``, ``.isrs``, ``.error``)."""
    out = []
    for p, meta in sorted(partitions.items()):
        if meta.leader != -1:
            continue
        err = meta.error.name() if meta.error is not None else "no error code"
        down = [r for r in meta.replicas if r not in live]
        out.append(f"partition {p}: leader -1, {err}, replicas {list(meta.replicas)} (down: {down})")
    return out


def single_replica_shutdown(dc: KafkaDrillCluster, rng: random.Random) -> IncidentResult:
    """Incident C against Kafka: the Sluice drill's phases on an RF=1 topic (kill -9 with no
    drain; moved off, then stopped), Kafka's partition reassignment standing in for Sluice's
    drain; then the incident's own maintenance: a controlled shutdown with nothing moved."""
    from confluent_kafka.admin import AdminClient

    result = IncidentResult("single-replica-shutdown")
    assert dc.store is not None
    topic = "incident-c-kill"
    _create_topic(dc.bootstrap, topic, 3, 1, {})
    producer = VerifiableProducer(
        dc.bootstrap, topic, 3, writer="c1", rate_per_s=1000, extra={"message.timeout.ms": 8000},
    ).start()  # fmt: skip
    _wait_acks(producer, 1000, 60)
    victim = dc.leader_of(topic, 0)
    dc.kill(victim)
    offline: list[str] = []
    admin = AdminClient({"bootstrap.servers": dc.bootstrap, "log_level": 0})

    def offline_reported() -> bool:
        try:
            md = admin.list_topics(topic, timeout=2)
        except Exception:
            return False
        found = offline_in_metadata(md.topics[topic].partitions, set(md.brokers))
        offline[:] = [f"{topic} {o}" for o in found]
        return bool(offline)

    _wait_for(offline_reported, dc.session_timeout_s + 10)
    _wait_for(lambda: producer.failed() > 0, 20)
    dc.restart(victim)
    dc.wait_quiescent(90)
    _wait_acks(producer, 500, 60)
    stats = producer.stop()
    result.rows.append(_row("kill -9, no drain", topic, stats, read_everything(dc.bootstrap, topic, 3)))
    named = ", ".join(f"{k} ({stats.first_error.get(k, '')}) x{v}" for k, v in stats.errors.items()) or "none"
    result.checks.append(
        Check("without a drain the producer sees a named error", bool(stats.errors), f"errors: {named}")
    )
    result.checks.append(
        Check(
            "the offline partitions are reported with the reason",
            bool(offline),
            ("Kafka's Metadata: " + "; ".join(offline[:3])) if offline else "nothing reported",
        )
    )
    result.checks.append(
        Check(
            "no acknowledged record lost (kill -9 case)",
            result.rows[0].lost == 0,
            f"{result.rows[0].lost} lost",
        )
    )

    topic2 = "incident-c-drain"
    _create_topic(dc.bootstrap, topic2, 3, 1, {})
    producer = VerifiableProducer(
        dc.bootstrap, topic2, 3, writer="c2", rate_per_s=1000, extra={"message.timeout.ms": 8000},
    ).start()  # fmt: skip
    _wait_acks(producer, 1000, 60)
    victim = dc.leader_of(topic2, 0)
    others = [b for b in range(1, dc.brokers + 1) if b != victim]
    singles = [
        (t, p)
        for t, parts in sorted(dc.store.assignments().items())
        for p, r in parts.items()
        if r == [victim]
    ]
    moves = {tp: [others[i % len(others)]] for i, tp in enumerate(singles)}
    pending = dc.reassign(moves, 30)
    dc.note(
        f"reassigned broker {victim}'s single replicas (Kafka's drain): "
        f"{len(moves)} moved, {len(pending)} pending"
    )
    dc.shutdown(victim)
    _wait_acks(producer, 1000, 60)
    stats = producer.stop()
    dc.restart(victim)
    dc.wait_quiescent(90)
    result.rows.append(_row("reassign + stop", topic2, stats, read_everything(dc.bootstrap, topic2, 3)))
    row = result.rows[1]
    result.checks.append(
        Check(
            "drain then stop: zero failed sends",
            row.failed_sends == 0 and not pending,
            f"{row.failed_sends} failed sends; {len(pending)} moves unfinished "
            "(Kafka's drain: a partition reassignment, as kafka-reassign-partitions writes it)",
        )
    )
    result.checks.append(Check("no acknowledged record lost (drain case)", row.lost == 0, f"{row.lost} lost"))

    # The incident itself: the broker stopped for maintenance, its RF=1 partitions not moved.
    topic3 = "incident-c-maintenance"
    _create_topic(dc.bootstrap, topic3, 3, 1, {})
    producer = VerifiableProducer(
        dc.bootstrap, topic3, 3, writer="c3", rate_per_s=1000, extra={"message.timeout.ms": 8000},
    ).start()  # fmt: skip
    _wait_acks(producer, 1000, 60)
    victim = dc.leader_of(topic3, 0)
    dc.shutdown(victim)
    _wait_acks(producer, 1000, 60)
    stats = producer.stop()
    dc.restart(victim)
    dc.wait_quiescent(90)
    result.rows.append(
        _row("controlled shutdown, no move", topic3, stats, read_everything(dc.bootstrap, topic3, 3))
    )
    row = result.rows[2]
    named = ", ".join(f"{k} x{v}" for k, v in stats.errors.items()) or "none"
    result.checks.append(
        Check(
            "stopped for maintenance as in the incident (no move): zero failed sends",
            row.failed_sends == 0,
            f"{row.failed_sends} failed sends ({named}); {row.lost} lost",
        )
    )
    result.timeline = dc.events
    return result


# -- what runs, and what does not -------------------------------------------------------------------

KAFKA_DRILLS: dict[str, Callable[[KafkaDrillCluster, random.Random], IncidentResult]] = {
    # the Sluice drill itself: it only asks the cluster what `KafkaDrillCluster` answers
    "acks1-failover": acks1_failover,
    "single-replica-shutdown": single_replica_shutdown,
}

#: Incidents with no drill against Kafka: what of them applies to Kafka, printed instead.
NOT_APPLICABLE: dict[str, str] = {
    "controller-split-brain": (
        "B does not run against Kafka: its faults are Sluice's controller's. What applies to Kafka: "
        "Kafka's ZooKeeper-mode controller fences itself with the controller epoch (/controller_epoch; "
        "since Kafka 2.2 every controller write to ZooKeeper is a multi-op checking that znode's "
        "version, KAFKA-7165/KIP-380), the mechanism Sluice's controller copies, and the incident's "
        "leaderless __consumer_offsets partition (leader=-1 with a live ISR member) is what Kafka's "
        "controller left until a restart then. A drill of it against Kafka would need the same "
        "race of a controller change and a broker failure; it is not written. See incident B in "
        "docs/ARCHITECTURE.md for Sluice's guarantees."
    ),
    "zombie-task": (
        "D does not run against Kafka: it is about a sync task (a worker paused past its session "
        "runs the task twice) and Kafka has no sync tasks; a Sluice task's fencing token is "
        "Sluice's own. The peer in the Kafka ecosystem is Kafka Connect's zombie fencing for "
        "source connectors (KIP-618, exactly-once source support: a new task generation fences "
        "the producers of the old one through transactions), which Sluice does not drill."
    ),
}


def run_incident_kafka(name: str, directory: Path, *, seed: int = 1) -> IncidentResult:
    """Run drill ``name`` (A or C) on a fresh 3-broker Kafka cluster in ``directory``; every
    process it starts is stopped before it returns. Raises KeyError for an incident with no
    Kafka drill (`NOT_APPLICABLE` says why) and `peer.PeerError` without Kafka's jars."""
    drill = KAFKA_DRILLS[name]
    with KafkaDrillCluster(directory) as dc:
        result = drill(dc, random.Random(seed))
        result.name = f"{result.name} against={AGAINST}"
        return result

"""Incident drills: replay incidents A, B, C and D of the design against a local cluster and read
the verdict. Each drill runs a verifiable workload, injects the incident's faults, heals,
checks, and returns rows of the checker plus the guarantees it checked (passed or not).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from sluice import test_switches
from sluice.chaos.checker import Read, check, parse_value
from sluice.chaos.harness import BrokerSignals, DrillCluster, LeaderlessMonitor
from sluice.chaos.results import Check, IncidentResult, Row
from sluice.chaos.workload import (
    GroupReader,
    ProducerStats,
    VerifiableProducer,
    read_everything,
    stale_leader_writes,
)
from sluice.cluster.layout import PartitionState
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.service.health import partition_health


def single_replica_writer(
    bootstrap: str, topic: str, writer: str, security: ClientSecurity = PLAINTEXT
) -> VerifiableProducer:
    """Drill C's writer, on Sluice and on Kafka alike: a new topic of 3 single-replica partitions
    written at 1,000 records/s, returned once 1,000 records are acknowledged."""
    _create_topic(bootstrap, topic, 3, 1, {}, security=security)
    producer = VerifiableProducer(
        bootstrap, topic, 3, writer=writer, rate_per_s=1000, extra={"message.timeout.ms": 8000},
        security=security,
    ).start()  # fmt: skip
    _wait_acks(producer, 1000, 60)
    return producer


def stopped_case(
    dc: BrokerSignals,
    result: IncidentResult,
    producer: VerifiableProducer,
    victim: int,
    label: str,
    topic: str,
    security: ClientSecurity = PLAINTEXT,
) -> ProducerStats:
    """A drill C case that stops the leader ``victim`` (SIGTERM, a controlled shutdown), on
    Sluice and on Kafka alike: 1,000 more records acknowledged meanwhile, the broker back, the
    case's row (``label``) added to ``result``."""
    dc.shutdown(victim)
    _wait_acks(producer, 1000, 60)
    stats = producer.stop()
    dc.restart(victim)
    dc.wait_quiescent(90)
    read = read_everything(dc.bootstrap, topic, 3, security=security)
    result.rows.append(_row(label, topic, stats, read))
    return stats


def kill_case_recovered(
    dc: BrokerSignals,
    result: IncidentResult,
    producer: VerifiableProducer,
    topic: str,
    victim: int,
    offline_reported: Callable[[], bool],
    security: ClientSecurity = PLAINTEXT,
) -> ProducerStats:
    """Drill C's kill -9 case once the leader is killed, on Sluice and on Kafka alike: the
    offline partitions reported within a session timeout, the producer failing, then the broker
    back and 500 more records acknowledged; the case's row added to ``result``."""
    _wait_for(offline_reported, dc.session_timeout_s + 10)
    _wait_for(lambda: producer.failed() > 0, 20)
    dc.restart(victim)
    dc.wait_quiescent(90)
    _wait_acks(producer, 500, 60)
    stats = producer.stop()
    read = read_everything(dc.bootstrap, topic, 3, security=security)
    result.rows.append(_row("kill -9, no drain", topic, stats, read))
    return stats


def kill_case_checks(result: IncidentResult, stats: ProducerStats, offline: list[str], reported: str) -> None:
    """Drill C's verdict on its kill -9 case, on Sluice and on Kafka alike (``result.rows[0]``
    is that case's row): the producer saw a named error, the offline partitions were reported
    (``reported`` says how), and no acknowledged record was lost."""
    named = ", ".join(f"{k} ({stats.first_error.get(k, '')}) x{v}" for k, v in stats.errors.items()) or "none"
    result.checks.append(
        Check("without a drain the producer sees a named error", bool(stats.errors), f"errors: {named}")
    )
    result.checks.append(
        Check("the offline partitions are reported with the reason", bool(offline), reported)
    )
    lost = result.rows[0].lost
    result.checks.append(Check("no acknowledged record lost (kill -9 case)", lost == 0, f"{lost} lost"))


def _create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    rf: int,
    config: dict[str, str],
    security: ClientSecurity = PLAINTEXT,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **security.confluent_config()})
    admin.create_topics([NewTopic(name, partitions, rf, config=config)], operation_timeout=30)[name].result(
        60
    )


def _writer(value: str) -> str:
    parsed = parse_value(value)
    return parsed[0] if parsed is not None else "?"


def _row(label: str, topic: str, stats: ProducerStats, reads: list[Read]) -> Row:
    verdict = check(stats.acks, reads)[topic] if (stats.acks or reads) else None
    if verdict is None:
        return Row(label, 0, 0, 0, 0, 0, sum(stats.errors.values()), dict(stats.errors))
    return Row(
        label,
        verdict.acknowledged,
        verdict.read,
        len(verdict.lost),
        len(verdict.duplicated),
        len(verdict.out_of_order),
        sum(stats.errors.values()),
        dict(stats.errors),
        [f"{x.value}@{x.partition}/{x.offset} acked via broker {x.broker}" for x in verdict.lost[:5]],
        dict(Counter(_writer(a.value) for a in stats.acks)),
        dict(Counter(_writer(x.value) for x in verdict.lost)),
    )


def _wait_acks(producer: VerifiableProducer, n: int, timeout_s: float) -> None:
    start = producer.acked()
    deadline = time.monotonic() + timeout_s
    # (a producer ended by a fatal error acknowledges nothing more: no use waiting for it)
    while producer.acked() < start + n and time.monotonic() < deadline and producer.producing():
        time.sleep(0.05)


# -- A: acks=1 and a leader cut off from ZooKeeper ----------------------------------------------------


class ClusterState(Protocol):
    """What drill A reads from ZooKeeper: `ZkStore` for Sluice, `incidents_kafka.KafkaZkView`
    for Kafka (whose layout holds the same partition state)."""

    def live_brokers(self) -> Mapping[int, object]: ...

    def partition_state(self, topic: str, partition: int) -> tuple[PartitionState, int] | None: ...


class BrokerAddress(Protocol):
    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


class FaultCluster(Protocol):
    """What drill A asks of the cluster it runs on: `DrillCluster` (Sluice) and
    `incidents_kafka.KafkaDrillCluster` (Apache Kafka) both answer it, so A runs unchanged on
    either."""

    @property
    def session_timeout_s(self) -> float: ...

    @property
    def events(self) -> list[tuple[float, str]]: ...

    @property
    def store(self) -> ClusterState | None: ...

    @property
    def bootstrap(self) -> str: ...

    @property
    def client_security(self) -> ClientSecurity: ...

    def note(self, what: str) -> None: ...

    def broker(self, broker_id: int) -> BrokerAddress: ...

    def controller(self) -> int: ...

    def leader_of(self, topic: str, partition: int) -> int: ...

    def cut_zookeeper(self, broker_id: int, mode: str = "drop") -> None: ...

    def heal_zookeeper(self, broker_id: int) -> None: ...

    def wait_quiescent(self, timeout_s: float = 90.0) -> bool: ...


#: Records the stale client writes to the cut-off leader once its partition has moved.
STALE_RECORDS = 200


def acks1_failover(dc: FaultCluster, rng: random.Random) -> IncidentResult:
    """The leader of a partition loses its ZooKeeper session (cut off from ZooKeeper only, still
    serving clients) while producers write; leadership moves; later it reconnects. Run once with
    acks=1 and once with acks=all and min.insync.replicas=2.

    Incident A's loss came from a client that still believed the old leader led, after the new
    leader had stopped fetching from it. The verifiable producer (librdkafka) cannot be relied on
    to be that client: the moment the victim's session expires, its followers stop fetching from
    it (its registration is gone, `LeaderFetcher._connection`) and the other brokers answer
    Metadata with LEADER_NOT_AVAILABLE for its partitions, so the producer leaves the victim at
    its next metadata refresh; whether it acknowledged anything the followers lack is a race of
    tenths of a second between two reactions to the same ZooKeeper event. So, once ZooKeeper
    shows the victim's partition moved and the new leader acts as leader, and while the victim is
    still cut off, a stale client writes ``STALE_RECORDS`` records straight to the victim with
    the row's acks: whatever the victim acknowledges then is on no other replica, and is
    truncated when it rejoins. acks=all must refuse them (nobody fetches from the victim, so its
    ISR wait times out); acks=1 acknowledges them and loses them, every run. The cut lasts until
    the stale client is done (and at least as long as before), so no timing decides the outcome."""
    result = IncidentResult("acks1-failover")
    cut_s = dc.session_timeout_s + 6.0
    moves: list[tuple[bool, str]] = []
    for acks in ("1", "all"):
        topic = f"incident-a-acks{acks}"
        _create_topic(dc.bootstrap, topic, 3, 3, {"min.insync.replicas": "2"}, security=dc.client_security)
        producer = VerifiableProducer(
            dc.bootstrap, topic, 3, acks=acks, idempotent=acks == "all", writer=f"a{acks}", rate_per_s=3000,
            security=dc.client_security,
        ).start()  # fmt: skip
        _wait_acks(producer, 2000, 60)
        # A leader that is not also the controller: its partitions move as soon as its session
        # expires, rather than after a controller election first (a shorter, less certain window).
        controller = dc.controller()
        leaders = [dc.leader_of(topic, p) for p in range(3)]
        victim = next((b for b in leaders if b != controller), leaders[0])
        partition = leaders.index(victim)
        cut_at = time.monotonic()
        dc.cut_zookeeper(victim, "drop")
        moved = _wait_moved(dc, topic, partition, victim, dc.session_timeout_s + 45)
        stale = ProducerStats()
        if moved is not None:
            took = time.monotonic() - cut_at
            moves.append((True, f"acks={acks}: {topic}-{partition} {victim}->{moved} {took:.1f} s in"))
            broker = dc.broker(victim)
            stale = stale_leader_writes(
                broker.host,
                broker.port,
                victim,
                topic,
                partition,
                acks=1 if acks == "1" else -1,
                writer=f"a{acks}-stale",
                records=STALE_RECORDS,
                security=dc.client_security,
            )
            dc.note(
                f"stale client: {stale.sent} records to broker {victim} (cut off) for {topic}-{partition}, "
                f"acks={acks}: {len(stale.acks)} acknowledged; "
                + (", ".join(f"{k} x{v}" for k, v in stale.errors.items()) or "no error")
            )
        else:
            moves.append((False, f"acks={acks}: {topic}-{partition} still led by broker {victim}"))
        # At least the original cut, so the producer's own side of the incident is unchanged.
        time.sleep(max(0.0, cut_at + cut_s - time.monotonic()))
        dc.heal_zookeeper(victim)
        dc.wait_quiescent(90)
        _wait_acks(producer, 1000, 60)
        stats = producer.stop()
        stats.sent += stale.sent
        stats.acks.extend(stale.acks)
        stats.errors.update(stale.errors)
        for name, text in stale.first_error.items():
            stats.first_error.setdefault(name, text)
        reads = read_everything(dc.bootstrap, topic, 3, security=dc.client_security)
        result.rows.append(_row(f"acks={acks}", topic, stats, reads))
    one, all_row = result.rows
    result.checks.append(
        Check(
            "leadership moved off the cut-off leader while it was cut off",
            all(ok for ok, _ in moves),
            "; ".join(what for _, what in moves),
        )
    )
    result.checks.append(
        Check(
            "acks=all loses no acknowledged record",
            all_row.lost == 0 and all_row.acknowledged > 0,
            f"acks=all: {all_row.acknowledged} acknowledged, {all_row.lost} lost; {_stale(all_row, 'aall')}",
        )
    )
    result.checks.append(
        Check(
            "idempotent acks=all writes no duplicate",
            all_row.duplicated == 0,
            f"{all_row.duplicated} duplicated",
        )
    )
    result.checks.append(
        Check(
            "acks=1 row reported as measured (loss there is the demonstrated risk)",
            True,
            f"acks=1: {one.acknowledged} acknowledged, {one.lost} lost; {_stale(one, 'a1')}",
        )
    )
    result.timeline = dc.events
    return result


def _stale(row: Row, writer: str) -> str:
    stale = f"{writer}-stale"
    return (
        f"of them the stale client's: {row.acknowledged_by_writer.get(stale, 0)} acknowledged by the "
        f"cut-off leader, {row.lost_by_writer.get(stale, 0)} lost; the producer's: "
        f"{row.lost_by_writer.get(writer, 0)} lost"
    )


def _wait_moved(dc: FaultCluster, topic: str, partition: int, victim: int, timeout_s: float) -> int | None:
    """Wait until ZooKeeper shows ``partition`` led by another broker and that broker acts as its
    leader (it answers ListOffsets at the new leader epoch: it has stopped fetching the partition,
    and drops any fetch response still in flight); note each step. The new leader, or None."""
    from sluice.protocol.api import ApiKey
    from sluice.protocol.errors import ErrorCode
    from sluice.sync.wire_client import WireClient

    assert dc.store is not None
    deadline = time.monotonic() + timeout_s
    expired = moved = False
    while time.monotonic() < deadline:
        if not expired and victim not in dc.store.live_brokers():
            expired = True
            dc.note(f"ZooKeeper: broker {victim}'s session expired (its registration is gone)")
        current = dc.store.partition_state(topic, partition)
        state = current[0] if current else None
        if state is not None and state.leader not in (victim, -1):
            if not moved:
                moved = True
                dc.note(
                    f"ZooKeeper: {topic}-{partition} led by broker {state.leader} "
                    f"(epoch {state.leader_epoch})"
                )
            new = dc.broker(state.leader)
            try:
                with WireClient(
                    new.host, new.port, client_id="drill", timeout_s=5, security=dc.client_security
                ) as w:
                    answer = w.request(
                        ApiKey.LIST_OFFSETS,
                        7,
                        {
                            "replica_id": -1,
                            "isolation_level": 0,
                            "topics": [
                                {
                                    "name": topic,
                                    "partitions": [
                                        {
                                            "partition_index": partition,
                                            "current_leader_epoch": state.leader_epoch,
                                            "timestamp": -1,
                                        }
                                    ],
                                }
                            ],
                        },
                    )["topics"][0]["partitions"][0]
            except (OSError, ConnectionError):
                answer = {"error_code": -1}
            if answer["error_code"] == ErrorCode.NONE:
                dc.note(
                    f"broker {state.leader} leads {topic}-{partition} at epoch {state.leader_epoch} "
                    f"(high watermark {answer['offset']}); broker {victim} is still cut off"
                )
                return state.leader
        time.sleep(0.05)
    dc.note(f"{topic}-{partition} did not move off broker {victim} in {timeout_s:.0f} s")
    return None


# -- B: a paused controller, a failed broker, the group coordinator on an affected partition --------


def controller_split_brain(dc: DrillCluster, rng: random.Random) -> IncidentResult:
    """Take the controller away past its session while the broker leading the group's
    coordinator partition fails; bring it back; then fail the coordinator's broker again.
    Throughout, a group consumes and an idempotent acks=all producer writes.

    On local hosts the controller is paused (SIGSTOP). On netns hosts it is a network blip, as in
    incident B: every packet between the controller's host and the ZooKeeper members is dropped,
    while the controller keeps running and still reaches the other brokers; its session expires,
    another broker becomes controller, and the old one comes back to a ZooKeeper where its epoch
    is stale."""
    from sluice.service.admin_client import AdminClient

    result = IncidentResult("controller-split-brain")
    topic = "incident-b"
    _create_topic(dc.bootstrap, topic, 3, 3, {"min.insync.replicas": "2"}, security=dc.client_security)
    with AdminClient(dc.bootstrap, security=dc.client_security) as admin:
        admin.coordinator_id("incident-b-probe")  # creates __consumer_offsets
    assert dc.store is not None
    controller = dc.controller()
    group = next(
        g for g in (f"incident-b-{i}" for i in range(1000)) if dc.coordinator_of(g) not in (-1, controller)
    )
    producer = VerifiableProducer(
        dc.bootstrap, topic, 3, writer="b", rate_per_s=1500, security=dc.client_security
    ).start()
    reader = GroupReader(dc.bootstrap, topic, group, security=dc.client_security).start()
    _wait_acks(producer, 1500, 60)
    _wait_for(lambda: reader.count() > 500, 60)
    monitor = LeaderlessMonitor(dc.store).start()

    coordinator = dc.coordinator_of(group)
    # The broker fails first and the controller is paused a moment later, so the broker's
    # session expires while no controller is listening: a controller that only reacts to the
    # brokers it sees die (no sweep of leaderless partitions) never elects for its partitions.
    dc.kill(coordinator)
    time.sleep(1.0)
    if dc.network is not None:
        dc.cut_zookeeper(controller)
        time.sleep(dc.session_timeout_s + 4.0)
        dc.heal_zookeeper(controller)
    else:
        dc.pause(controller)
        time.sleep(dc.session_timeout_s + 4.0)
        dc.resume(controller)
    before = reader.count()
    progressed_1 = _wait_for(lambda: reader.count() > before + 300, 45)
    dc.restart(coordinator)
    dc.wait_quiescent(90)

    second = dc.coordinator_of(group)
    dc.kill(second)
    time.sleep(dc.session_timeout_s + 4.0)
    before = reader.count()
    progressed_2 = _wait_for(lambda: reader.count() > before + 300, 45)
    dc.restart(second)
    dc.wait_quiescent(90)
    _wait_acks(producer, 500, 60)
    stats = producer.stop()
    acked = {a.value for a in stats.acks}
    _wait_for(lambda: acked <= {r.value for r in list(reader.reads)}, 60)
    reader.stop()
    longest = monitor.stop()
    reads = read_everything(dc.bootstrap, topic, 3, security=dc.client_security)
    result.rows.append(_row("idempotent acks=all", topic, stats, reads))
    worst = max(longest.items(), key=lambda kv: kv[1], default=("-", 0.0))
    result.checks.append(
        Check(
            "no partition with a live in-sync replica stayed leaderless more than 5 s",
            worst[1] <= 5.0,
            f"longest: {worst[0]} {worst[1]:.1f} s",
        )
    )
    result.checks.append(
        Check(
            "the group kept consuming after each failure",
            progressed_1 and progressed_2,
            f"after the first failure: {'yes' if progressed_1 else 'NO'}; after the second: "
            f"{'yes' if progressed_2 else 'NO'}",
        )
    )
    row = result.rows[0]
    result.checks.append(
        Check("no acknowledged record lost", row.lost == 0, f"{row.lost} lost of {row.acknowledged}")
    )
    group_missing = len(acked - {r.value for r in reader.reads})
    result.checks.append(
        Check(
            "the group read every acknowledged record",
            group_missing == 0,
            f"{group_missing} acknowledged records never reached the group",
        )
    )
    result.timeline = dc.events
    return result


def _wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


# -- C: a single-replica topic and broker maintenance -------------------------------------------------


def single_replica_shutdown(dc: DrillCluster, rng: random.Random) -> IncidentResult:
    """An RF=1 topic. First the broker holding a partition is killed without draining: the
    producer must see a named error and the partition must be reported offline with the reason.
    Then, on a second RF=1 topic, the broker is drained and stopped: no send may fail."""
    from sluice.ops.drain import plan_drain, start_drain, wait_drained

    result = IncidentResult("single-replica-shutdown")
    assert dc.store is not None
    topic = "incident-c-kill"
    producer = single_replica_writer(dc.bootstrap, topic, "c1", dc.client_security)
    victim = dc.leader_of(topic, 0)
    dc.kill(victim)
    offline: list[str] = []

    def offline_reported() -> bool:
        offline[:] = [
            f"{h.topic}-{h.partition}: {h.reason}"
            for h in partition_health(dc.store)  # type: ignore[arg-type]
            if h.status == "offline" and h.topic == topic
        ]
        return bool(offline)

    stats = kill_case_recovered(dc, result, producer, topic, victim, offline_reported, dc.client_security)
    kill_case_checks(result, stats, offline, "; ".join(offline[:3]) or "nothing reported")

    topic2 = "incident-c-drain"
    producer = single_replica_writer(dc.bootstrap, topic2, "c2", dc.client_security)
    victim = dc.leader_of(topic2, 0)
    plan = plan_drain(dc.store, victim)
    start_drain(dc.store, plan)
    pending = wait_drained(dc.store, plan, 30)
    dc.note(f"drained broker {victim}: {len(plan.moves)} replica(s) moved, {len(pending)} pending")
    stats = stopped_case(dc, result, producer, victim, "drain + stop", topic2, dc.client_security)
    row = result.rows[1]
    result.checks.append(
        Check(
            "drain then stop: zero failed sends",
            row.failed_sends == 0 and not pending,
            f"{row.failed_sends} failed sends; {len(pending)} moves unfinished",
        )
    )
    result.checks.append(Check("no acknowledged record lost (drain case)", row.lost == 0, f"{row.lost} lost"))
    result.timeline = dc.events
    return result


def zombie_task(dc: DrillCluster, rng: random.Random, target: str = "sqlite") -> IncidentResult:
    """D: see `sluice.chaos.zombie` (imported here when run: it builds on this module)."""
    from sluice.chaos.zombie import zombie_task as drill

    return drill(dc, rng, target)


INCIDENTS: dict[str, tuple[str, Callable[[DrillCluster, random.Random], IncidentResult]]] = {
    "acks1-failover": (
        "A: a leader cut off from ZooKeeper while acks=1 and acks=all producers write",
        acks1_failover,
    ),
    "controller-split-brain": (
        "B: a controller paused (netns: cut from ZooKeeper) and broker failures around a group's coordinator",
        controller_split_brain,
    ),
    "single-replica-shutdown": (
        "C: an RF=1 topic's broker killed, then drained and stopped",
        single_replica_shutdown,
    ),
    "zombie-task": (
        "D: a sync task's worker paused past its session; the task runs twice and the zombie writes",
        zombie_task,
    ),
}


def run_incident(
    name: str,
    directory: Path,
    *,
    seed: int = 1,
    session_timeout_s: float = 6.0,
    hosts: str = "local",
    zookeeper_nodes: int | None = None,
    switches: test_switches.Switches = test_switches.OFF,
    security: str = "none",
    target: str = "sqlite",
) -> IncidentResult:
    """Run one drill on a fresh 3-broker cluster. ``hosts="netns"``: every broker and ZooKeeper
    member in its own network namespace (a 3-member ensemble unless told otherwise), and
    ZooKeeper cuts are dropped packets rather than a proxy. ``switches`` (tests only) turn a
    guarantee off in every process of the drill, to show the drill able to fail. ``security``:
    "sasl_ssl" runs it on brokers with TLS, SCRAM and ACLs, every client authenticating."""
    if name not in INCIDENTS:
        raise KeyError(f"unknown incident {name!r}; `sluice incident list` shows them")
    _, drill = INCIDENTS[name]
    nodes = zookeeper_nodes if zookeeper_nodes is not None else (3 if hosts == "netns" else 1)
    with DrillCluster(
        directory, 3, session_timeout_s=session_timeout_s, hosts=hosts, zookeeper_nodes=nodes,
        switches=switches, security=security,
    ) as dc:  # fmt: skip
        if target == "sqlite":
            result = drill(dc, random.Random(seed))
        elif name == "zombie-task":  # the one drill with a sync task: it applies where asked
            result = zombie_task(dc, random.Random(seed), target)
        else:
            raise ValueError(f"{name} has no sync task, so no --target: only zombie-task takes one")
        if hosts != "local":
            result.name = f"{result.name} hosts={hosts}"
        return result

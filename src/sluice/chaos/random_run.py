"""`sluice chaos run`: random faults against a 3-broker cluster under a verifiable load, then
heal, wait for quiescence and check. The schedule depends only on the seed (and the duration and
fault kinds), so a failing seed can be replayed.

Fault kinds (each hits a broker chosen by role: a partition's leader, the controller, the
group's coordinator or any broker):

* ``kill`` (kill -9, restarted after the fault's duration), ``pause`` (SIGSTOP), ``shutdown``
  (controlled shutdown, restarted), ``zk-cut`` (the broker loses ZooKeeper alone: through its
  proxy on local hosts, by dropped packets on netns hosts).

With ``hosts="netns"`` (every ZooKeeper member and broker in its own namespace), also:

* ``partition``: the broker exchanges no packets with the other brokers; ZooKeeper still
  reaches it.
* ``zk-partition``: either the broker is cut from every ZooKeeper member but not from the other
  brokers (incident A's blip), or ZooKeeper splits: one member and the broker against the
  majority and the other brokers (the variant is part of the seeded schedule).
* ``one-way``: packets from the broker to another host (broker or ZooKeeper member) are dropped;
  the other way passes.
* ``netem``: the broker's link is slow and lossy (delay with jitter, and loss).
* ``zk-kill``: kill -9 of a ZooKeeper member (the ensemble's leader half the time), restarted
  after the fault's duration.
"""

from __future__ import annotations

import collections
import random
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.chaos import netfaults
from sluice.chaos.checker import Read
from sluice.chaos.harness import DrillCluster, broker_host
from sluice.chaos.incidents import _create_topic, _row, _wait_acks, _writer
from sluice.chaos.results import Check, IncidentResult
from sluice.chaos.workload import (
    GroupReader,
    JavaVerifiableClient,
    ProducerStats,
    VerifiableProducer,
    read_everything,
)

LOCAL_FAULT_KINDS = ("kill", "pause", "shutdown", "zk-cut")
NETNS_FAULT_KINDS = ("partition", "zk-partition", "one-way", "netem", "zk-kill")
FAULT_KINDS = LOCAL_FAULT_KINDS + NETNS_FAULT_KINDS
ROLES = ("leader", "controller", "coordinator", "random")
TOPIC = "chaos"
GROUP = "chaos-readers"


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    at_s: float
    kind: str
    role: str
    duration_s: float
    #: a fault's own random choices (variant, peer, delay), drawn from the schedule's seed
    variant: int = 0


@dataclass
class ChaosRun:
    result: IncidentResult
    schedule: list[ScheduledFault]
    #: faults that happened, by kind (and zk-partition's variant): a fault whose target was
    #: missing at its time is skipped and not counted
    happened: collections.Counter[str]


def make_schedule(
    seed: int, duration_s: float, kinds: tuple[str, ...], *, hosts: str = "local"
) -> list[ScheduledFault]:
    """One fault at a time, so that two of three replicas stay up (min.insync.replicas=2).
    Kinds are dealt from a shuffled deck: every kind comes once before any comes again."""
    allowed = FAULT_KINDS if hosts == "netns" else LOCAL_FAULT_KINDS
    for kind in kinds:
        if kind not in allowed:
            extra = " (network faults need --hosts netns)" if kind in FAULT_KINDS else ""
            raise ValueError(f"unknown fault {kind!r}{extra}; choose from {', '.join(allowed)}")
    rng = random.Random(seed)
    t = 3.0
    out: list[ScheduledFault] = []
    deck: list[str] = []
    while t < duration_s - 4.0 and kinds:
        if not deck:
            deck = list(dict.fromkeys(kinds))
            rng.shuffle(deck)
        kind = deck.pop()
        role = rng.choice(ROLES)
        length = round(rng.uniform(2.0, 9.0), 1)
        out.append(ScheduledFault(round(t, 1), kind, role, length, rng.randrange(1 << 30)))
        t += length + rng.uniform(3.0, 6.0)
    return out


def run_chaos(
    directory: Path,
    *,
    seed: int,
    duration_s: float,
    kinds: tuple[str, ...],
    session_timeout_s: float = 6.0,
    hosts: str = "local",
    zookeeper_nodes: int = 1,
    security: str = "none",
    java_client: bool = False,
) -> ChaosRun:
    """``security="sasl_ssl"``: the cluster with TLS, SCRAM and ACLs; the workload authenticates.
    ``java_client``: Kafka's Java client also produces (writer ``j{seed}``) and reads in a group
    beside librdkafka, and the checker judges what it acknowledged and read (needs the jars of
    scripts/peers.sh; plaintext clusters only)."""
    if java_client and security != "none":
        raise ValueError("--java-client runs on a plaintext cluster only (no --security)")
    schedule = make_schedule(seed, duration_s, kinds, hosts=hosts)
    if any(f.kind == "zk-kill" for f in schedule) and zookeeper_nodes < 3:
        raise ValueError(
            "zk-kill needs an ensemble that survives a member's loss: --zookeeper-nodes 3 or more"
        )
    rng = random.Random(seed)
    result = IncidentResult(f"chaos seed={seed} hosts={hosts}")
    happened: collections.Counter[str] = collections.Counter()
    with DrillCluster(
        directory, 3, session_timeout_s=session_timeout_s, hosts=hosts, zookeeper_nodes=zookeeper_nodes,
        security=security,
    ) as dc:  # fmt: skip
        client_security = dc.client_security
        _create_topic(dc.bootstrap, TOPIC, 6, 3, {"min.insync.replicas": "2"}, client_security)
        producer = VerifiableProducer(
            dc.bootstrap, TOPIC, 6, writer=f"s{seed}", rate_per_s=1500, security=client_security
        ).start()
        reader = GroupReader(dc.bootstrap, TOPIC, GROUP, security=client_security).start()
        java = (
            JavaVerifiableClient(dc.bootstrap, TOPIC, 6, directory, writer=f"j{seed}", group=f"{GROUP}-java")
            if java_client
            else None
        )
        _wait_acks(producer, 500, 60)
        if java is not None:
            _wait_java_acks(java, 200, 60)
        started = time.monotonic()
        for fault in schedule:
            delay = started + fault.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            target = _target(dc, fault.role, rng)
            if target < 0:
                dc.note(f"skip {fault.kind}: no {fault.role} right now")
                continue
            happened[_apply(dc, fault, target)] += 1
        remaining = started + duration_s - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        dc.heal_all()
        quiet = dc.wait_quiescent(120)
        _wait_acks(producer, 300, 60)
        if java is not None:
            _wait_java_acks(java, 100, 60)
        stats = producer.stop()
        java_stats = java.stop() if java is not None else None
        reader.stop()
        reads = read_everything(dc.bootstrap, TOPIC, 6, security=client_security)
        row = _row("idempotent acks=all", TOPIC, stats, [r for r in reads if _writer(r.value) == f"s{seed}"])
        result.rows.append(row)
        if java is not None and java_stats is not None:
            result.checks.extend(_java_checks(result, java, java_stats, reads, f"j{seed}"))
        result.checks.append(
            Check(
                "the cluster healed and quiesced",
                quiet,
                "every partition led, ISR full" if quiet else "not quiescent after 120 s",
            )
        )
        result.checks.append(Check("0 acknowledged records lost", row.lost == 0, f"{row.lost} lost"))
        result.checks.append(Check("0 duplicated", row.duplicated == 0, f"{row.duplicated} duplicated"))
        result.checks.append(Check("no record out of order", row.out_of_order == 0, f"{row.out_of_order}"))
        result.timeline = dc.events
    return ChaosRun(result, schedule, happened)


def _wait_java_acks(java: JavaVerifiableClient, n: int, timeout_s: float) -> None:
    start = java.acked()
    deadline = time.monotonic() + timeout_s
    while java.acked() < start + n and time.monotonic() < deadline and java.proc.poll() is None:
        time.sleep(0.05)


def _java_checks(
    result: IncidentResult, java: JavaVerifiableClient, stats: ProducerStats, reads: list[Read], writer: str
) -> list[Check]:
    """What Kafka's Java client acknowledged, judged against the log as the librdkafka
    producer's is (its own row), and what its group consumer read: every record it was given
    is the one the log holds at that offset."""
    row = _row(
        "Java client, idempotent acks=all", TOPIC, stats, [r for r in reads if _writer(r.value) == writer]
    )
    result.rows.append(row)
    log = {(r.partition, r.offset): r.value for r in reads}
    with java._lock:
        java_reads = list(java.reads)
    wrong = [r for r in java_reads if log.get((r.partition, r.offset)) != r.value]
    return [
        Check("the Java client's producer ran to the end", java.done and row.acknowledged > 0,
              f"{row.acknowledged} acknowledged, ended cleanly: {java.done}"),
        Check("0 records the Java client acknowledged lost", row.lost == 0, f"{row.lost} lost"),
        Check("0 of the Java client's records duplicated", row.duplicated == 0, f"{row.duplicated}"),
        Check("no Java client record out of order", row.out_of_order == 0, f"{row.out_of_order}"),
        Check("the Java consumer read only what the log holds", bool(java_reads) and not wrong,
              f"{len(java_reads)} read, {len(wrong)} not as in the log"
              + (f" (first: {wrong[0].value}@{wrong[0].partition}/{wrong[0].offset})" if wrong else "")),
    ]  # fmt: skip


def _target(dc: DrillCluster, role: str, rng: random.Random) -> int:
    if role == "leader":
        return dc.leader_of(TOPIC, rng.randrange(6))
    if role == "controller":
        return dc.controller()
    if role == "coordinator":
        return dc.coordinator_of(GROUP)
    return dc.random_broker(rng)


def _apply(dc: DrillCluster, fault: ScheduledFault, target: int) -> str:
    """Inject one fault, hold it for its duration, heal it; return what happened (its kind, and
    zk-partition's variant)."""
    what = fault.kind
    choice = random.Random(fault.variant)
    if fault.kind == "kill":
        dc.kill(target)
        time.sleep(fault.duration_s)
        dc.restart(target)
    elif fault.kind == "pause":
        dc.pause(target)
        time.sleep(fault.duration_s)
        dc.resume(target)
    elif fault.kind == "shutdown":
        dc.shutdown(target)
        time.sleep(fault.duration_s)
        dc.restart(target)
    elif fault.kind == "zk-cut":
        dc.cut_zookeeper(target, "drop")
        time.sleep(fault.duration_s)
        dc.heal_zookeeper(target)
    elif fault.kind == "zk-kill":
        assert dc.ensemble is not None
        leader = dc.zookeeper_leader()
        members = sorted(dc.ensemble.nodes)
        member = leader if leader is not None and choice.random() < 0.5 else choice.choice(members)
        what = f"zk-kill ({'leader' if member == leader else 'follower'})"
        dc.kill_zookeeper(member)
        time.sleep(fault.duration_s)
        dc.restart_zookeeper(member)
    else:
        what = _apply_network_fault(dc, fault, target, choice)
    # Let the broker rejoin before the next fault, so two of three replicas stay in sync.
    dc.wait_quiescent(60)
    return what


def _apply_network_fault(dc: DrillCluster, fault: ScheduledFault, target: int, choice: random.Random) -> str:
    net = dc.network
    assert net is not None and dc.cluster is not None
    me = broker_host(target)
    brokers = [broker_host(b.broker_id) for b in dc.cluster.brokers]
    zks = dc.zookeeper_hosts()
    what = fault.kind
    made: netfaults.NetFault
    if fault.kind == "partition":
        made = netfaults.Partition(net, me, [b for b in brokers if b != me])
    elif fault.kind == "zk-partition" and choice.random() < 0.5:
        what = "zk-partition (broker-cut)"
        made = netfaults.Partition(net, me, zks)
    elif fault.kind == "zk-partition":
        what = "zk-partition (zk-split)"
        made = netfaults.Split(net, [choice.choice(zks), me])
    elif fault.kind == "one-way":
        made = netfaults.OneWayDrop(net, me, choice.choice([h for h in brokers + zks if h != me]))
    elif fault.kind == "netem":
        made = netfaults.LinkImpairment(
            net, me, delay_ms=choice.uniform(20, 150), jitter_ms=choice.uniform(0, 20),
            loss_percent=choice.uniform(0.5, 5.0), seed=choice.randrange(1 << 30),
        )  # fmt: skip
    else:
        raise ValueError(f"unknown fault {fault.kind!r}")
    dc.apply_net_fault(fault.kind, made)
    try:
        time.sleep(fault.duration_s)
    finally:
        dc.heal_net_fault(fault.kind)
    return what

"""`sluice chaos run`: random faults against a local 3-broker cluster under a verifiable load,
then heal, wait for quiescence and check. The schedule depends only on the seed (and the
duration and fault kinds), so a failing seed can be replayed."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from sluice.chaos.harness import DrillCluster
from sluice.chaos.incidents import Check, IncidentResult, _create_topic, _row, _wait_acks
from sluice.chaos.workload import GroupReader, VerifiableProducer, read_everything

FAULT_KINDS = ("kill", "pause", "shutdown", "zk-cut")
ROLES = ("leader", "controller", "coordinator", "random")
TOPIC = "chaos"
GROUP = "chaos-readers"


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    at_s: float
    kind: str
    role: str
    duration_s: float


def make_schedule(seed: int, duration_s: float, kinds: tuple[str, ...]) -> list[ScheduledFault]:
    """One fault at a time, so that two of three replicas stay up (min.insync.replicas=2)."""
    for kind in kinds:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; choose from {', '.join(FAULT_KINDS)}")
    rng = random.Random(seed)
    t = 3.0
    out = []
    while t < duration_s - 4.0:
        kind = rng.choice(kinds)
        role = rng.choice(ROLES)
        length = round(rng.uniform(2.0, 9.0), 1)
        out.append(ScheduledFault(round(t, 1), kind, role, length))
        t += length + rng.uniform(3.0, 6.0)
    return out


def run_chaos(
    directory: Path, *, seed: int, duration_s: float, kinds: tuple[str, ...], session_timeout_s: float = 6.0
) -> tuple[IncidentResult, list[ScheduledFault]]:
    schedule = make_schedule(seed, duration_s, kinds)
    rng = random.Random(seed)
    result = IncidentResult(f"chaos seed={seed}")
    with DrillCluster(directory, 3, session_timeout_s=session_timeout_s) as dc:
        _create_topic(dc.bootstrap, TOPIC, 6, 3, {"min.insync.replicas": "2"})
        producer = VerifiableProducer(dc.bootstrap, TOPIC, 6, writer=f"s{seed}", rate_per_s=1500).start()
        reader = GroupReader(dc.bootstrap, TOPIC, GROUP).start()
        _wait_acks(producer, 500, 60)
        started = time.monotonic()
        for fault in schedule:
            delay = started + fault.at_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            target = _target(dc, fault.role, rng)
            if target < 0:
                dc.note(f"skip {fault.kind}: no {fault.role} right now")
                continue
            _apply(dc, fault, target)
        remaining = started + duration_s - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        dc.heal_all()
        quiet = dc.wait_quiescent(120)
        _wait_acks(producer, 300, 60)
        stats = producer.stop()
        reader.stop()
        reads = read_everything(dc.bootstrap, TOPIC, 6)
        row = _row("idempotent acks=all", TOPIC, stats, reads)
        result.rows.append(row)
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
    return result, schedule


def _target(dc: DrillCluster, role: str, rng: random.Random) -> int:
    if role == "leader":
        return dc.leader_of(TOPIC, rng.randrange(6))
    if role == "controller":
        return dc.controller()
    if role == "coordinator":
        return dc.coordinator_of(GROUP)
    return dc.random_broker(rng)


def _apply(dc: DrillCluster, fault: ScheduledFault, target: int) -> None:
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
    # Let the broker rejoin before the next fault, so two of three replicas stay in sync.
    dc.wait_quiescent(60)

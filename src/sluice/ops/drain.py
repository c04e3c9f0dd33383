"""`sluice broker drain`: move every partition replica off a broker before it is stopped, so
that stopping it leaves nothing offline (incident C). The controller does the moving, through
``/admin/reassign_partitions``; this module plans the moves and waits for them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sluice.cluster.layout import Reassignment
from sluice.cluster.zkstore import ZkStore


class DrainError(RuntimeError):
    pass


@dataclass
class DrainPlan:
    broker_id: int
    moves: list[Reassignment] = field(default_factory=list)
    #: partitions that keep a replica on the broker: (topic, partition, why, still online without it)
    kept: list[tuple[str, int, str, bool]] = field(default_factory=list)


def plan_drain(store: ZkStore, broker_id: int) -> DrainPlan:
    live = set(store.live_brokers())
    if broker_id not in live:
        raise DrainError(f"broker {broker_id} is not registered (not running?); nothing can be copied off it")
    others = sorted(live - {broker_id})
    load = {b: 0 for b in others}
    assignments = {name: store.topic(name) for name in store.topics()}
    for a in assignments.values():
        if a is None:
            continue
        for replicas in a.replicas.values():
            for r in replicas:
                if r in load:
                    load[r] += 1
    plan = DrainPlan(broker_id)
    for name, a in sorted(assignments.items()):
        if a is None:
            continue
        for p, replicas in sorted(a.replicas.items()):
            if broker_id not in replicas:
                continue
            candidates = sorted((b for b in others if b not in replicas), key=lambda b: (load[b], b))
            if candidates:
                chosen = candidates[0]
                load[chosen] += 1
                target = tuple(chosen if r == broker_id else r for r in replicas)
                plan.moves.append(Reassignment(name, p, target, tuple(replicas)))
                continue
            current = store.partition_state(name, p)
            isr = current[0].isr if current else ()
            online_without = any(r != broker_id and r in live for r in isr)
            plan.kept.append((name, p, "every other live broker already holds a replica", online_without))
    return plan


def start_drain(store: ZkStore, plan: DrainPlan) -> None:
    if not plan.moves:
        return
    if not store.request_reassignment(plan.moves):
        raise DrainError(
            "another reassignment is in progress (/admin/reassign_partitions exists); wait for it to finish"
        )


def wait_drained(store: ZkStore, plan: DrainPlan, timeout_s: float) -> list[tuple[str, int]]:
    """Wait until every planned move finished; returns the moves still pending at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        pending = []
        for move in plan.moves:
            a = store.topic(move.topic)
            if a is not None and plan.broker_id in a.replicas.get(move.partition, ()):
                pending.append((move.topic, move.partition))
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.1)

"""The cluster at a glance: brokers, the controller and its epoch, partitions that need attention."""

from __future__ import annotations

from typing import Any

from sluice.cluster.health import OFFLINE, UNDER_REPLICATED
from sluice.ops.health import partition_health
from sluice.service.context import Services


def cluster_view(svc: Services) -> dict[str, Any]:
    zk = svc.zk
    live = zk.live_brokers()
    topics = zk.all_topics()
    health = partition_health(zk, topics)
    known = set(live) | {r for a in topics.values() for rs in a.replicas.values() for r in rs}
    brokers = []
    for broker_id in sorted(known):
        reg = live.get(broker_id)
        brokers.append(
            {
                "id": broker_id,
                # the inter-broker listener's address (registrations' host and port) ...
                "host": reg.host if reg else None,
                "port": reg.port if reg else None,
                # ... and every listener's, by name: a client uses its own listener's
                "listeners": [f"{n}://{h}:{p}" for n, _, h, p in reg.endpoints] if reg else [],
                "rack": reg.rack if reg else None,
                "alive": reg is not None,
            }
        )
    problems = [
        {
            "topic": h.topic,
            "partition": h.partition,
            "status": h.status,
            "leader": h.leader,
            "replicas": list(h.replicas),
            "isr": list(h.isr),
            "reason": h.reason,
        }
        for h in health
        if h.status != "ok"
    ]
    epoch, _ = zk.controller_epoch()
    return {
        "cluster_id": zk.cluster_id(),
        "controller": {"id": zk.controller_id(), "epoch": epoch},
        "brokers": brokers,
        "partitions": {
            "total": len(health),
            "offline": sum(h.status == OFFLINE for h in health),
            "under_replicated": sum(h.status == UNDER_REPLICATED for h in health),
        },
        "problems": problems,
    }

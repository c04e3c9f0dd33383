"""Scenarios every client driver runs, once against Kafka and once against Sluice. Each returns
its observations as ``[(step, observation), ...]``; topic and group names depend only on the
scenario and the client, so both clusters see the same names."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sluice.protocol.api import ApiKey
from sluice.sync.wire_client import WireClient
from tests.conformance.differential.drivers import Driver
from tests.support.cluster import wait_until

Steps = list[tuple[str, Any]]

#: The record timestamps (CreateTime) start here, the same for both clusters of a run, so that
#: fetches and ListOffsets by time are deterministic. An hour ago, never a fixed date: records
#: older than retention.ms (7 days) are deleted by Kafka's retention check (its first pass runs
#: 30 s after a broker starts, every 5 min after), and a fetch from offset 0 then answered
#: OFFSET_OUT_OF_RANGE on Kafka's side alone, whenever that pass fell inside the scenario.
T0 = (int(time.time()) - 3600) * 1000


def ready(bootstrap: str, topic: str, created: dict[str, Any], partitions: int = 0) -> dict[str, Any]:
    """``created`` once every broker's metadata names ``topic`` with a leader for each of its
    partitions: a client's first produce may go to a broker the controller has not told yet
    (Kafka answers UNKNOWN_TOPIC_OR_PARTITION then, and a producer without retries fails)."""
    if created.get("ok") != "NONE":
        return created
    with WireClient.connect(bootstrap, timeout_s=10) as w:
        meta = w.request(ApiKey.METADATA, 1, {"topics": [{"name": topic}]})
    addresses = [f"{b['host']}:{b['port']}" for b in meta["brokers"]]

    def everywhere() -> bool:
        for address in addresses:
            with WireClient.connect(address, timeout_s=10) as w:
                (t,) = w.request(ApiKey.METADATA, 1, {"topics": [{"name": topic}]})["topics"]
            if t["error_code"] or not t["partitions"] or any(p["leader_id"] < 0 for p in t["partitions"]):
                return False
            if len(t["partitions"]) < partitions:
                return False
        return True

    wait_until(everywhere, 20, f"every broker to know {topic}", interval_s=0.1)
    return created


def _records() -> list[dict[str, Any]]:
    return [
        {"key": "k0", "value": "v0", "headers": [["h", "x"]], "timestamp": T0},
        {"key": None, "value": "v1", "headers": [], "timestamp": T0 + 10},
        {"key": "k2", "value": None, "headers": [["a", "1"], ["a", None]], "timestamp": T0 + 5},
    ]


def metadata_and_admin(d: Driver, bootstrap: str, tag: str) -> Steps:
    topic = f"meta-{tag}"
    steps: Steps = [
        (
            "create",
            ready(
                bootstrap,
                topic,
                d.call("create_topic", bootstrap, topic=topic, partitions=3, replication_factor=1),
            ),
        )
    ]
    steps.append(("metadata", d.call("metadata", bootstrap, topic=topic)))
    steps.append(("metadata-unknown", d.call("metadata", bootstrap, topic=f"missing-{tag}")))
    steps.append(
        ("create-again", d.call("create_topic", bootstrap, topic=topic, partitions=3, replication_factor=1))
    )
    steps.append(
        (
            "create-rf-too-big",
            d.call("create_topic", bootstrap, topic=f"{topic}-rf", partitions=1, replication_factor=9),
        )
    )
    names = ["cleanup.policy", "retention.ms", "max.message.bytes", "min.insync.replicas", "segment.bytes"]
    steps.append(("describe-configs", d.call("describe_configs", bootstrap, topic=topic, names=names)))
    steps.append(
        (
            "describe-configs-unknown",
            d.call("describe_configs", bootstrap, topic=f"absent-{tag}", names=names),
        )
    )
    steps.append(("describe-cluster", d.call("describe_cluster", bootstrap)))
    steps.append(("create-partitions", d.call("create_partitions", bootstrap, topic=topic, count=5)))
    # Until every broker holds the new partitions' state, Sluice answers the topic
    # LEADER_NOT_AVAILABLE where a Kafka broker answers the partitions it knows
    # (docs/COMPATIBILITY.md): asked once every broker has all five.
    ready(bootstrap, topic, {"ok": "NONE"}, partitions=5)
    steps.append(("metadata-after", d.call("metadata", bootstrap, topic=topic)))
    steps.append(("create-partitions-fewer", d.call("create_partitions", bootstrap, topic=topic, count=2)))
    steps.append(("delete", d.call("delete_topic", bootstrap, topic=topic)))
    steps.append(("delete-again", d.call("delete_topic", bootstrap, topic=topic)))
    return steps


def produce_fetch_offsets(d: Driver, bootstrap: str, tag: str) -> Steps:
    topic = f"pf-{tag}"
    steps: Steps = [
        (
            "create",
            ready(
                bootstrap,
                topic,
                d.call("create_topic", bootstrap, topic=topic, partitions=1, replication_factor=1),
            ),
        )
    ]
    steps.append(("produce", d.call("produce", bootstrap, topic=topic, partition=0, records=_records())))
    steps.append(("fetch-all", d.call("fetch", bootstrap, topic=topic, partition=0, offset=0, count=3)))
    steps.append(("fetch-from-1", d.call("fetch", bootstrap, topic=topic, partition=0, offset=1, count=2)))
    for spec, ts in [("earliest", None), ("latest", None), ("max_timestamp", None), ("time", T0 + 3),
                     ("time", T0 + 10), ("time", T0 + 99)]:  # fmt: skip
        got = d.call("list_offsets", bootstrap, topic=topic, partition=0, spec=spec, timestamp=ts)
        steps.append((f"list-offsets-{spec}-{ts}", got))
    steps.append(
        ("fetch-out-of-range", d.call("fetch", bootstrap, topic=topic, partition=0, offset=100, count=1))
    )
    group = f"g-{tag}"
    steps.append(
        ("commit", d.call("commit", bootstrap, topic=topic, partition=0, group=group, offset=2, metadata="m"))
    )
    steps.append(("committed", d.call("committed", bootstrap, group=group)))
    steps.append(
        (
            "commit-unknown-partition",
            d.call("commit", bootstrap, topic=topic, partition=7, group=group, offset=1),
        )
    )
    return steps


def idempotent_produce(d: Driver, bootstrap: str, tag: str) -> Steps:
    topic = f"idem-{tag}"
    records = [{"key": f"k{i}", "value": f"v{i}", "timestamp": T0 + i} for i in range(5)]
    steps: Steps = [
        (
            "create",
            ready(
                bootstrap,
                topic,
                d.call("create_topic", bootstrap, topic=topic, partitions=1, replication_factor=1),
            ),
        )
    ]
    steps.append(
        (
            "produce-1",
            d.call("produce", bootstrap, topic=topic, partition=0, records=records, idempotent=True),
        )
    )
    steps.append(
        (
            "produce-2",
            d.call("produce", bootstrap, topic=topic, partition=0, records=records, idempotent=True),
        )
    )
    steps.append(("fetch", d.call("fetch", bootstrap, topic=topic, partition=0, offset=0, count=10)))
    return steps


def too_large(d: Driver, bootstrap: str, tag: str) -> Steps:
    topic = f"big-{tag}"
    create = d.call(
        "create_topic",
        bootstrap,
        topic=topic,
        partitions=1,
        replication_factor=1,
        configs={"max.message.bytes": "1000"},
    )
    big = [{"key": "k", "value": "x", "value_repeat": 2000, "timestamp": T0}]
    small = [{"key": "k", "value": "x", "value_repeat": 100, "timestamp": T0}]
    return [
        ("create", ready(bootstrap, topic, create)),
        ("produce-too-large", d.call("produce", bootstrap, topic=topic, partition=0, records=big)),
        ("produce-small", d.call("produce", bootstrap, topic=topic, partition=0, records=small)),
    ]


def _assignments(got: dict[str, Any]) -> dict[str, Any]:
    """Which member gets which partitions follows the members' broker-made ids (random): the
    assignments are compared as a sorted list, not by member."""
    if "ok" in got:
        return {"ok": sorted(got["ok"].values(), key=str)}
    return got


def groups_and_rebalances(d: Driver, bootstrap: str, tag: str) -> Steps:
    topic, group = f"grp-{tag}", f"grp-{tag}"
    steps: Steps = [
        (
            "create",
            ready(
                bootstrap,
                topic,
                d.call("create_topic", bootstrap, topic=topic, partitions=2, replication_factor=1),
            ),
        )
    ]
    steps.append(("describe-unknown-group", d.call("describe_group", bootstrap, group=f"nobody-{tag}")))
    steps.append(("join-1", d.call("join", bootstrap, topic=topic, group=group, member="m1")))
    steps.append(("assigned-1", _assignments(d.call("poll_members", bootstrap, partitions=2))))
    steps.append(("describe-1", d.call("describe_group", bootstrap, group=group)))
    steps.append(("join-2", d.call("join", bootstrap, topic=topic, group=group, member="m2")))
    steps.append(("assigned-2", _assignments(d.call("poll_members", bootstrap, partitions=2))))
    steps.append(("describe-2", d.call("describe_group", bootstrap, group=group)))
    steps.append(("leave-2", d.call("leave", bootstrap, member="m2")))
    steps.append(("assigned-after-leave", _assignments(d.call("poll_members", bootstrap, partitions=2))))
    steps.append(("describe-after-leave", d.call("describe_group", bootstrap, group=group)))
    steps.append(("leave-1", d.call("leave", bootstrap, member="m1")))
    steps.append(("describe-empty", d.call("describe_group", bootstrap, group=group)))
    return steps


SCENARIOS: dict[str, Callable[[Driver, str, str], Steps]] = {
    "metadata_and_admin": metadata_and_admin,
    "produce_fetch_offsets": produce_fetch_offsets,
    "idempotent_produce": idempotent_produce,
    "too_large": too_large,
    "groups_and_rebalances": groups_and_rebalances,
}

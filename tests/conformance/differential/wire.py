"""Raw-protocol scenarios (Sluice's WireClient, the same bytes to both clusters): produce and
fetch at every version Sluice advertises, idempotent sequences, a stale leader epoch, a corrupt
batch, an out-of-range fetch. Each returns ``[(step, response fields), ...]`` like ``scenarios``."""

from __future__ import annotations

import time
from typing import Any

from sluice.protocol.api import SUPPORTED, ApiKey
from sluice.protocol.records import Record, build_batch, decode_records, iter_batches
from sluice.sync.wire_client import WireClient
from tests.conformance.differential.scenarios import T0, Steps


def _metadata(bootstrap: str, topic: str) -> dict[str, Any]:
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        return w.request(
            ApiKey.METADATA,
            12,
            {
                "topics": [{"name": topic}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )


def _broker(meta: dict[str, Any], node: int) -> str:
    b = next(b for b in meta["brokers"] if b["node_id"] == node)
    return f"{b['host']}:{b['port']}"


def _leader(bootstrap: str, topic: str, want_epoch: int = 0) -> tuple[str, int, int, Any]:
    """(leader address, leader id, leader epoch, topic id) of partition 0, once it has a leader
    at ``want_epoch`` or later."""
    deadline = time.monotonic() + 20
    while True:
        meta = _metadata(bootstrap, topic)
        (t,) = meta["topics"]
        if t["error_code"] == 0 and t["partitions"]:
            p = t["partitions"][0]
            if p["leader_id"] >= 0 and p["leader_epoch"] >= want_epoch:
                address = _broker(meta, p["leader_id"])
                # the leader itself must know it leads at that epoch (the broker asked first may
                # know before the leader does), and answer a fetch naming the epoch
                (own,) = _metadata(address, topic)["topics"]
                mine = own["partitions"][0] if own["partitions"] else {}
                fetched = _fetch(address, 12, topic, t["topic_id"], 0, epoch=p["leader_epoch"])
                if (mine.get("leader_id"), mine.get("leader_epoch")) == (
                    p["leader_id"],
                    p["leader_epoch"],
                ) and (fetched["error_code"] == 0):
                    return address, p["leader_id"], p["leader_epoch"], t["topic_id"]
        if time.monotonic() > deadline:
            raise AssertionError(f"no leader at epoch >= {want_epoch} for {topic}: {t}")
        time.sleep(0.2)


def _create(
    bootstrap: str, topic: str, replicas: list[int] | None = None, configs: dict[str, str] | None = None
) -> Any:
    meta = _metadata(bootstrap, topic)
    with WireClient.connect(_broker(meta, meta["controller_id"]), timeout_s=30) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            5,
            {
                "topics": [
                    {
                        "name": topic,
                        "num_partitions": -1 if replicas else 1,
                        "replication_factor": -1 if replicas else 1,
                        "assignments": [{"partition_index": 0, "broker_ids": replicas}] if replicas else [],
                        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
                    }
                ],
                "timeout_ms": 20000,
                "validate_only": False,
            },
        )
    (t,) = r["topics"]
    _leader(bootstrap, topic)
    return {"error_code": t["error_code"]}


def _produce(address: str, version: int, topic: str, batch: bytes) -> dict[str, Any]:
    with WireClient.connect(address, timeout_s=15) as w:
        r = w.request(
            ApiKey.PRODUCE,
            version,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout_ms": 10000,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
    (part,) = r["responses"][0]["partition_responses"]
    return dict(part)


def _fetch_partition0(
    address: str, version: int, topic: str, topic_id: Any, offset: int, epoch: int = -1, rack: str = ""
) -> dict[str, Any]:
    """A consumer's Fetch ``version`` of partition 0 from ``offset`` (no session): the response."""
    with WireClient.connect(address, timeout_s=15) as w:
        return dict(
            w.request(
                ApiKey.FETCH,
                version,
                {
                    "replica_id": -1,
                    "max_wait_ms": 0,
                    "min_bytes": 0,
                    "max_bytes": 1 << 20,
                    "isolation_level": 0,
                    "session_id": 0,
                    "session_epoch": -1,
                    "topics": [
                        {
                            "topic": topic,
                            "topic_id": topic_id,
                            "partitions": [
                                {
                                    "partition": 0,
                                    "current_leader_epoch": epoch,
                                    "fetch_offset": offset,
                                    "last_fetched_epoch": -1,
                                    "log_start_offset": -1,
                                    "partition_max_bytes": 1 << 20,
                                }
                            ],
                        }
                    ],
                    "forgotten_topics_data": [],
                    "rack_id": rack,
                },
            )
        )


def _fetch(
    address: str, version: int, topic: str, topic_id: Any, offset: int, epoch: int = -1
) -> dict[str, Any]:
    r = _fetch_partition0(address, version, topic, topic_id, offset, epoch)
    (part,) = r["responses"][0]["partitions"]
    out = {k: v for k, v in part.items() if k != "records"}
    out["top_error_code"] = r.get("error_code", 0)
    data = bytes(part["records"] or b"")
    out["records"] = [
        [rec.offset, rec.timestamp, rec.key, rec.value, [list(h) for h in rec.headers]]
        for pos, h in iter_batches(data)
        for rec in decode_records(data, pos, h)
    ]
    return out


def _advertised(bootstrap: str) -> dict[int, tuple[int, int]]:
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        r = w.request(
            ApiKey.API_VERSIONS,
            3,
            {"client_software_name": "sluice-conformance", "client_software_version": "1"},
        )
    return {a["api_key"]: (a["min_version"], a["max_version"]) for a in r["api_keys"]}


def produce_fetch_every_version(bootstrap: str, tag: str) -> Steps:
    """Every Produce and Fetch version Sluice's ApiVersions advertises (SUPPORTED is what it
    answers); the first step records that this cluster's ApiVersions covers them all."""
    topic = f"wire-versions-{tag}"
    advertised = _advertised(bootstrap)
    covers = {
        api.name: advertised.get(api, (99, -1))[0] <= SUPPORTED[api][0]
        and SUPPORTED[api][1] <= advertised[api][1]
        for api in (ApiKey.PRODUCE, ApiKey.FETCH)
    }
    steps: Steps = [("advertises-every-version", covers), ("create", _create(bootstrap, topic))]
    address, _, _, topic_id = _leader(bootstrap, topic)
    lo, hi = SUPPORTED[ApiKey.PRODUCE]
    for v in range(lo, hi + 1):
        batch = build_batch([Record(0, T0 + v, b"k%d" % v, b"v%d" % v, (("h", b"%d" % v),))])
        steps.append((f"produce-v{v}", _produce(address, v, topic, batch)))
    lo, hi = SUPPORTED[ApiKey.FETCH]
    for v in range(lo, hi + 1):
        steps.append((f"fetch-v{v}", _fetch(address, v, topic, topic_id, 0)))
    steps.append(("fetch-out-of-range", _fetch(address, 12, topic, topic_id, 100)))
    return steps


def idempotent_sequences(bootstrap: str, tag: str) -> Steps:
    topic = f"wire-idem-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic))]
    address, _, _, _ = _leader(bootstrap, topic)
    deadline = time.monotonic() + 20
    while True:
        with WireClient.connect(address, timeout_s=15) as w:
            pid = w.request(
                ApiKey.INIT_PRODUCER_ID,
                4,
                {
                    "transactional_id": None,
                    "transaction_timeout_ms": -1,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            )
        # Kafka's first producer id on a fresh cluster comes from a block it asks its controller
        # for: COORDINATOR_LOAD_IN_PROGRESS (14) until then, which clients retry
        if pid["error_code"] != 14 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    steps.append(
        ("init-producer-id", {"error_code": pid["error_code"], "producer_epoch": pid["producer_epoch"]})
    )

    def batch(seq: int, n: int) -> bytes:
        return build_batch(
            [(b"k", b"%d" % (seq + i)) for i in range(n)],
            producer_id=pid["producer_id"],
            producer_epoch=pid["producer_epoch"],
            base_sequence=seq,
            timestamp_ms=T0,
        )

    steps.append(("seq-0", _produce(address, 9, topic, batch(0, 3))))
    steps.append(("seq-0-again", _produce(address, 9, topic, batch(0, 3))))
    steps.append(("seq-gap", _produce(address, 9, topic, batch(5, 1))))
    steps.append(("seq-3", _produce(address, 9, topic, batch(3, 2))))
    return steps


def corrupt_batch(bootstrap: str, tag: str) -> Steps:
    topic = f"wire-crc-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic))]
    address, _, _, topic_id = _leader(bootstrap, topic)
    good = build_batch([(b"k", b"value-to-corrupt")], timestamp_ms=T0)
    bad = good[:-3] + bytes([good[-3] ^ 0xFF]) + good[-2:]  # a byte of the value: the CRC no longer matches
    steps.append(("produce-corrupt-v8", _produce(address, 8, topic, bad)))
    steps.append(("produce-corrupt-v3", _produce(address, 3, topic, bad)))
    steps.append(("fetch-after", _fetch(address, 12, topic, topic_id, 0)))
    return steps


def too_large_batch(bootstrap: str, tag: str) -> Steps:
    """A batch larger than the topic's max.message.bytes: MESSAGE_TOO_LARGE, nothing stored."""
    topic = f"wire-big-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic, configs={"max.message.bytes": "1000"}))]
    address, _, _, topic_id = _leader(bootstrap, topic)
    big = build_batch([(b"k", b"x" * 2000)], timestamp_ms=T0)
    steps.append(("produce-too-large-v9", _produce(address, 9, topic, big)))
    steps.append(("fetch-after", _fetch(address, 12, topic, topic_id, 0)))
    return steps


def stale_leader_epoch(bootstrap: str, tag: str) -> Steps:
    """The leader moves (replicas [1, 2] reassigned as [2, 1], then a preferred election), so
    its epoch grows; a fetch or ListOffsets naming the old epoch is fenced, a newer one unknown."""
    topic = f"wire-epoch-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic, replicas=[1, 2]))]
    _, leader, epoch0, _ = _leader(bootstrap, topic)
    steps.append(("first-leader", {"leader": leader, "epoch": epoch0}))
    meta = _metadata(bootstrap, topic)
    with WireClient.connect(_broker(meta, meta["controller_id"]), timeout_s=30) as w:
        r = w.request(
            ApiKey.ALTER_PARTITION_REASSIGNMENTS,
            0,
            {
                "timeout_ms": 20000,
                "topics": [{"name": topic, "partitions": [{"partition_index": 0, "replicas": [2, 1]}]}],
            },
        )
        steps.append(("reassign", r))
        deadline = time.monotonic() + 20
        while True:
            r = w.request(
                ApiKey.ELECT_LEADERS,
                2,
                {
                    "election_type": 0,
                    "topic_partitions": [{"topic": topic, "partitions": [0]}],
                    "timeout_ms": 20000,
                },
            )
            if r["error_code"] or r["replica_election_results"][0]["partition_result"][0]["error_code"] == 0:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
        steps.append(("elect-preferred", r))
    address, leader, epoch, topic_id = _leader(bootstrap, topic, want_epoch=epoch0 + 1)
    # Kafka's controller bumps the epoch once for the reassignment and once for the election,
    # Sluice's only for the election: both grow it, which is what clients rely on.
    steps.append(("new-leader", {"leader": leader, "epoch_grew": epoch > epoch0}))
    for name, e in [("stale", epoch0), ("current", epoch), ("future", epoch + 1)]:
        f = _fetch(address, 12, topic, topic_id, 0, epoch=e)
        steps.append((f"fetch-{name}-epoch", {"error_code": f["error_code"]}))
        with WireClient.connect(address, timeout_s=15) as w:
            lo = w.request(
                ApiKey.LIST_OFFSETS,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [
                        {
                            "name": topic,
                            "partitions": [
                                {"partition_index": 0, "current_leader_epoch": e, "timestamp": -1}
                            ],
                        }
                    ],
                },
            )
        answer = dict(lo["topics"][0]["partitions"][0])
        answer["leader_epoch"] = "current" if answer["leader_epoch"] == epoch else answer["leader_epoch"]
        steps.append((f"list-offsets-{name}-epoch", answer))
    return steps


def _refused_records(part: dict[str, Any]) -> dict[str, Any]:
    """A Produce answer's error and which records it refused (KIP-467): each refused record's
    index and whether a message came with it (the messages' words are each broker's own)."""
    return {
        "error_code": part["error_code"],
        "base_offset": part["base_offset"],
        "log_start_offset": part.get("log_start_offset"),
        "record_errors": [
            [e["batch_index"], e["batch_index_error_message"] is not None]
            for e in part.get("record_errors", [])
        ],
        "has_error_message": part.get("error_message") is not None,
    }


def record_errors(bootstrap: str, tag: str) -> Steps:
    """Records refused one by one (KIP-467): keyless records to a compacted topic, timestamps
    outside a topic's bounds, both in one batch, and a batch the producer stamped LogAppendTime;
    at Produce v8-v10, which carry RecordErrors, and v7, which does not. Nothing is stored."""
    steps: Steps = []
    now = int(time.time() * 1000)
    hour = 3_600_000
    topics = {
        "compacted": {"cleanup.policy": "compact"},
        "bounded": {
            "message.timestamp.before.max.ms": str(hour),
            "message.timestamp.after.max.ms": str(hour),
        },
        "both": {"cleanup.policy": "compact", "message.timestamp.before.max.ms": str(hour)},
        "appendtime": {"message.timestamp.type": "LogAppendTime"},
    }
    for kind, configs in topics.items():
        topic = f"wire-rec-{kind}-{tag}"
        steps.append((f"create-{kind}", _create(bootstrap, topic, configs=configs)))
    address = {kind: _leader(bootstrap, f"wire-rec-{kind}-{tag}")[0] for kind in topics}

    def batch(keys: list[bytes | None], times: list[int], **kw: Any) -> bytes:
        return build_batch([Record(0, t, k, b"v") for k, t in zip(keys, times, strict=True)], **kw)

    cases = [
        ("compacted", 8, batch([b"k", None, b"k", None], [now] * 4)),
        ("compacted", 10, batch([None, b"k"], [now, now])),
        ("compacted", 7, batch([b"k", None], [now, now])),
        ("bounded", 9, batch([b"k"] * 4, [now, now - 2 * hour, now + 2 * hour, now])),
        ("bounded", 3, batch([b"k"] * 2, [now - 2 * hour, now])),
        ("both", 9, batch([None, b"k", b"k"], [now, now - 2 * hour, now])),
        ("appendtime", 9, batch([b"k", b"k"], [now, now], log_append_time=True)),
    ]
    for kind, version, data in cases:
        topic = f"wire-rec-{kind}-{tag}"
        steps.append(
            (f"produce-{kind}-v{version}", _refused_records(_produce(address[kind], version, topic, data)))
        )
    for kind in topics:
        topic = f"wire-rec-{kind}-{tag}"
        _, _, _, topic_id = _leader(bootstrap, topic)
        fetched = _fetch(address[kind], 12, topic, topic_id, 0)
        steps.append(
            (f"fetch-{kind}", {"high_watermark": fetched["high_watermark"], "records": fetched["records"]})
        )
    return steps


def _meta(bootstrap: str, version: int, body: dict[str, Any]) -> dict[str, Any]:
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        return w.request(ApiKey.METADATA, version, body)


def metadata_v0(bootstrap: str, tag: str) -> Steps:
    """Metadata v0 (clients with broker.version.fallback=0.9.0 send it): an empty topic list
    means every topic (v1 on: none), a named topic, and a name no topic can have. Sluice closed
    the connection at v0 before."""
    topic = f"wire-meta0-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic))]
    every = _meta(bootstrap, 0, {"topics": []})
    mine = [t for t in every["topics"] if t["name"] == topic]
    steps.append(("v0-every-topic", {"brokers": len(every["brokers"]), "mine": mine, "keys": sorted(every)}))
    named = _meta(bootstrap, 0, {"topics": [{"name": topic}, {"name": "bad name!"}]})
    named["brokers"] = sorted(named["brokers"], key=lambda b: b["node_id"])  # Kafka's come in any order
    steps.append(("v0-named", named))
    steps.append(("v1-empty-list", _meta(bootstrap, 1, {"topics": []})["topics"]))
    return steps


def authorized_operations(bootstrap: str, tag: str) -> Steps:
    """KIP-430 without an authorizer: Metadata v8-v10 answer the cluster's operations when asked
    (every one the cluster supports), v11 on never (DescribeCluster does), and every version from
    v8 a topic's when asked; DescribeCluster the cluster's. Sluice left the cluster's unset
    (INT32_MIN, "not asked") in Metadata."""
    topic = f"wire-authops-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic))]
    for version in (8, 9, 10, 11, 12):
        for asked in (False, True):
            r = _meta(
                bootstrap,
                version,
                {
                    "topics": [{"name": topic}, {"name": f"missing-{tag}"}],
                    "allow_auto_topic_creation": False,
                    "include_cluster_authorized_operations": asked,
                    "include_topic_authorized_operations": asked,
                },
            )
            steps.append(
                (
                    f"metadata-v{version}-asked-{asked}",
                    {
                        "cluster": r.get("cluster_authorized_operations"),
                        "topics": [[t["error_code"], t["topic_authorized_operations"]] for t in r["topics"]],
                    },
                )
            )
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        for asked in (False, True):
            r = w.request(ApiKey.DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": asked})
            steps.append((f"describe-cluster-asked-{asked}", r["cluster_authorized_operations"]))
    return steps


def _produce_acks_all(address: str, topic: str, records: int) -> int:
    batch = build_batch([(b"k", b"v%d" % i) for i in range(records)], timestamp_ms=T0)
    return int(_produce(address, 9, topic, batch)["error_code"])


def _fetch_at(address: str, version: int, topic: str, topic_id: Any, rack: str = "") -> dict[str, Any]:
    """Fetch ``version`` of partition 0 from offset 0 with a rack id (v11+): error, high
    watermark, preferred read replica and how many records came."""
    r = _fetch_partition0(address, version, topic, topic_id, 0, rack=rack)
    (part,) = r["responses"][0]["partitions"]
    data = bytes(part["records"] or b"")
    return {
        "error_code": part["error_code"],
        "high_watermark": part["high_watermark"],
        "preferred_read_replica": part.get("preferred_read_replica", -1),
        "records": sum(h.records_count for _, h in iter_batches(data)),
    }


def follower_fetch(bootstrap: str, tag: str) -> Steps:
    """KIP-392 without a replica selector (Kafka's default): a consumer's Fetch v11+ is served by
    a follower replica, up to its high watermark; an older Fetch there is NOT_LEADER_OR_FOLLOWER;
    a leader names no preferred replica, whatever rack the consumer says. Sluice answered
    NOT_LEADER_OR_FOLLOWER to every consumer fetch at a follower before."""
    topic = f"wire-follower-{tag}"
    steps: Steps = [("create", _create(bootstrap, topic, replicas=[1, 2]))]
    leader_address, leader, _, topic_id = _leader(bootstrap, topic)
    steps.append(("produce", _produce_acks_all(leader_address, topic, 3)))
    meta = _metadata(bootstrap, topic)
    follower_address = _broker(meta, 2 if leader == 1 else 1)
    deadline = time.monotonic() + 20
    while _fetch_at(follower_address, 11, topic, topic_id)["high_watermark"] < 3:  # the follower's HW
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for version in (10, 11, 12, 16):
        steps.append((f"follower-v{version}", _fetch_at(follower_address, version, topic, topic_id)))
    steps.append(("leader-v11-rack", _fetch_at(leader_address, 11, topic, topic_id, rack="rack-x")))
    return steps


WIRE_SCENARIOS = {
    "produce_fetch_every_version": produce_fetch_every_version,
    "idempotent_sequences": idempotent_sequences,
    "corrupt_batch": corrupt_batch,
    "too_large_batch": too_large_batch,
    "stale_leader_epoch": stale_leader_epoch,
    "record_errors": record_errors,
    "metadata_v0": metadata_v0,
    "authorized_operations": authorized_operations,
    "follower_fetch": follower_fetch,
}

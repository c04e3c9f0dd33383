"""DeleteRecords (KIP-107), DescribeLogDirs and DescribeProducers (KIP-664): the admin APIs a
partition's leader (or, for log dirs, each broker) answers from its own replicas.

DeleteRecords moves a partition's log start (``Partition.delete_records_before``, at most to
the high watermark: only committed records are deleted) and answers once every live replica's
log start has followed (Kafka's low watermark; followers take it from their fetches), so the
deletion survives the leader's loss. An offset past the high watermark is answered
OFFSET_OUT_OF_RANGE and nothing is deleted.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from typing import TYPE_CHECKING, Any

from sluice.cluster.layout import INTERNAL_TOPICS
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext
    from sluice.broker.partition import Partition

Body = dict[str, Any]
#: DeleteRecords' offset meaning "up to the high watermark".
HIGH_WATERMARK = -1
#: A low watermark that is not known (Kafka's answer with an error).
UNKNOWN_LOW_WATERMARK = -1
DEFAULT_TIMEOUT_MS = 30_000


def deletion_refusal(part: Partition, offset: int) -> tuple[ErrorCode, str] | None:
    """Why ``offset`` cannot become ``part``'s log start, or None (the leader's decision)."""
    if part.topic in INTERNAL_TOPICS:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"{part.topic} is internal: its records are the broker's"
    policies = {p.strip() for p in part.log.config.cleanup_policy.split(",")}
    if "delete" not in policies:
        return ErrorCode.POLICY_VIOLATION, f"{part.name} is compacted: its log start is the cleaner's"
    if offset < 0 or offset > part.high_watermark:
        return (
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"offset {offset} is beyond the high watermark {part.high_watermark} of {part.name}; "
            "only committed records can be deleted",
        )
    return None


async def delete_records(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    timeout_ms = int(req.get("timeout_ms", DEFAULT_TIMEOUT_MS)) or DEFAULT_TIMEOUT_MS
    deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
    named = [(t["name"], p["partition_index"]) for t in req["topics"] for p in t["partitions"]]
    twice = {k for k in named if named.count(k) > 1}
    answers: dict[tuple[str, int], tuple[ErrorCode, int]] = {}
    waiting: dict[tuple[str, int], tuple[Partition, int]] = {}
    for t in req["topics"]:
        for p in t["partitions"]:
            key = (t["name"], p["partition_index"])
            if key in twice:
                answers[key] = (ErrorCode.INVALID_REQUEST, UNKNOWN_LOW_WATERMARK)
                continue
            part, error = broker.replicas.leader_partition(*key)
            if part is None:
                answers[key] = (error, UNKNOWN_LOW_WATERMARK)
                continue
            offset = part.high_watermark if p["offset"] == HIGH_WATERMARK else p["offset"]
            refusal = deletion_refusal(part, offset)
            if refusal is not None:
                answers[key] = (refusal[0], UNKNOWN_LOW_WATERMARK)
                continue
            part.delete_records_before(offset)
            waiting[key] = (part, offset)
    while waiting:
        live = set(broker.metadata.brokers())
        for key, (part, offset) in list(waiting.items()):
            if not part.is_leader or broker.replicas.partitions.get(key) is not part:
                answers[key] = (ErrorCode.NOT_LEADER_OR_FOLLOWER, UNKNOWN_LOW_WATERMARK)
            elif part.low_watermark(live) >= offset:
                answers[key] = (ErrorCode.NONE, part.low_watermark(live))
            elif time.monotonic() >= deadline:
                # The leader's log start moved; a follower has not followed yet (it will).
                answers[key] = (ErrorCode.REQUEST_TIMED_OUT, UNKNOWN_LOW_WATERMARK)
            else:
                continue
            del waiting[key]
        if waiting:
            await asyncio.sleep(0.02)
    return {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "low_watermark": answers[(t["name"], p["partition_index"])][1],
                        "error_code": answers[(t["name"], p["partition_index"])][0],
                    }
                    for p in t["partitions"]
                ],
            }
            for t in req["topics"]
        ],
    }


async def describe_log_dirs(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    """This broker's one data directory: each replica's size in bytes, and how far its log end
    is below the high watermark (Kafka's offset lag; 0 for a replica that has everything)."""
    requested = req.get("topics")
    wanted = None if requested is None else {(t["topic"], int(p)) for t in requested for p in t["partitions"]}
    by_topic: dict[str, list[Body]] = {}
    for (topic, index), part in sorted(broker.replicas.partitions.items()):
        if wanted is not None and (topic, index) not in wanted:
            continue
        by_topic.setdefault(topic, []).append(
            {
                "partition_index": index,
                "partition_size": part.log.size_bytes,
                "offset_lag": max(part.high_watermark - part.log.log_end_offset, 0),
                "is_future_key": False,
            }
        )
    directory = broker.config.data_dir
    usage = shutil.disk_usage(directory)
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "results": [
            {
                "error_code": ErrorCode.NONE,
                "log_dir": str(directory),
                "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
                "total_bytes": usage.total,
                "usable_bytes": usage.free,
            }
        ],
    }


async def describe_producers(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    """The idempotent producers the leader's log knows for each partition (its producer state,
    ``storage/producer_state.py``), with their epoch, last sequence and last timestamp."""
    topics = []
    for t in req["topics"]:
        parts = []
        for index in t["partition_indexes"]:
            part, error = broker.replicas.leader_partition(t["name"], index)
            if part is None:
                parts.append({"partition_index": index, "error_code": error, "active_producers": []})
                continue
            producers = [
                {
                    "producer_id": e.producer_id,
                    "producer_epoch": e.epoch,
                    "last_sequence": e.last_seq,
                    "last_timestamp": e.batches[-1].timestamp if e.batches else -1,
                    "coordinator_epoch": -1,
                    "current_txn_start_offset": -1,
                }
                for e in sorted(part.log.producer_entries(), key=lambda e: e.producer_id)
            ]
            parts.append(
                {"partition_index": index, "error_code": ErrorCode.NONE, "active_producers": producers}
            )
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}

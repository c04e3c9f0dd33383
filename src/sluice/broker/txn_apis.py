"""The transaction APIs (KIP-98): InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn and EndTxn (the transaction coordinator), TxnOffsetCommit (the group
coordinator) and WriteTxnMarkers (a coordinator to a partition's leader).

Each handler turns the request into a call on the coordinator and its answer into Kafka's
response; the decisions are in ``broker.txn_state``. Clients older than KIP-588 (versions
before the one that added PRODUCER_FENCED) are told INVALID_PRODUCER_EPOCH instead, as Kafka
tells them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sluice.broker import txn_markers
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.session import current_session

if TYPE_CHECKING:
    from sluice.broker.broker import Broker

log = logging.getLogger("sluice.txn_apis")

Body = dict[str, Any]

#: The first version of each API whose clients know PRODUCER_FENCED.
PRODUCER_FENCED_SINCE = {"init_producer_id": 4, "add_partitions": 2, "add_offsets": 2, "end_txn": 2}


def _fenced_for(error: ErrorCode, api: str, version: int) -> ErrorCode:
    if error is ErrorCode.PRODUCER_FENCED and version < PRODUCER_FENCED_SINCE[api]:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return error


async def init_transactional_producer_id(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """InitProducerId naming a transactional id (handlers.init_producer_id sends it here)."""
    pid, epoch = req.get("producer_id", -1), req.get("producer_epoch", -1)
    expected = (pid, epoch) if pid is not None and pid >= 0 else None
    error, producer_id, producer_epoch = await broker.txn_coordinator.init_producer_id(
        req["transactional_id"], req["transaction_timeout_ms"], expected
    )
    return {
        "throttle_time_ms": 0,
        "error_code": _fenced_for(error, "init_producer_id", header.api_version),
        "producer_id": producer_id,
        "producer_epoch": producer_epoch,
    }


def _unknown_partitions(broker: Broker, partitions: list[tuple[str, int]]) -> set[tuple[str, int]]:
    unknown = set()
    for topic, index in partitions:
        assignment = broker.metadata.topic(topic)
        if assignment is None or index not in assignment.replicas:
            unknown.add((topic, index))
    return unknown


def partition_results(topics: list[Body], errors: dict[tuple[str, int], ErrorCode]) -> list[Body]:
    """AddPartitionsToTxn's per-partition answer."""
    return [
        {
            "name": t["name"],
            "results_by_partition": [
                {"partition_index": p, "partition_error_code": errors[(t["name"], p)]}
                for p in t["partitions"]
            ],
        }
        for t in topics
    ]


async def add_partitions_to_txn(broker: Broker, header: RequestHeader, req: Body) -> Body:
    if header.api_version >= 4:
        return await _add_partitions_for_brokers(broker, req)
    topics = list(req["v3_and_below_topics"])
    partitions = [(t["name"], p) for t in topics for p in t["partitions"]]
    unknown = _unknown_partitions(broker, partitions)
    if unknown:
        # Kafka's rule: nothing is added while any partition is unknown; the others are told
        # they were not attempted.
        errors = {
            key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if key in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
            for key in partitions
        }
    else:
        error = await broker.txn_coordinator.add_partitions(
            req["v3_and_below_transactional_id"],
            req["v3_and_below_producer_id"],
            req["v3_and_below_producer_epoch"],
            partitions,
        )
        errors = dict.fromkeys(partitions, _fenced_for(error, "add_partitions", header.api_version))
    return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": partition_results(topics, errors)}


async def _add_partitions_for_brokers(broker: Broker, req: Body) -> Body:
    """AddPartitionsToTxn v4+, a broker's (the authorizer asks CLUSTER_ACTION): several
    transactions at once, each either added to as v3 adds, or, with ``verify_only``, only asked
    whether its ongoing transaction has added each partition (KIP-890: a partition's leader
    about to append a transactional batch; ``TransactionCoordinator.verify_partitions``)."""
    results = []
    for txn in req["transactions"]:
        tid = txn["transactional_id"]
        topics = list(txn["topics"])
        partitions = [(t["name"], p) for t in topics for p in t["partitions"]]
        unknown = _unknown_partitions(broker, partitions)
        if unknown:
            errors = {
                key: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                if key in unknown
                else ErrorCode.OPERATION_NOT_ATTEMPTED
                for key in partitions
            }
        elif txn["verify_only"]:
            errors = broker.txn_coordinator.verify_partitions(
                tid, txn["producer_id"], txn["producer_epoch"], partitions
            )
        else:
            error = await broker.txn_coordinator.add_partitions(
                tid, txn["producer_id"], txn["producer_epoch"], partitions
            )
            errors = dict.fromkeys(partitions, error)
        results.append({"transactional_id": tid, "topic_results": partition_results(topics, errors)})
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results_by_transaction": results}


async def add_offsets_to_txn(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """The group's ``__consumer_offsets`` partition joins the transaction: its TxnOffsetCommits
    are committed or dropped by the transaction's marker there."""
    if not req["group_id"]:
        error = ErrorCode.INVALID_GROUP_ID
    else:
        error = await broker.txn_coordinator.add_partitions(
            req["transactional_id"],
            req["producer_id"],
            req["producer_epoch"],
            [broker.txn_coordinator.offsets_partition(req["group_id"])],
        )
    return {"throttle_time_ms": 0, "error_code": _fenced_for(error, "add_offsets", header.api_version)}


async def end_txn(broker: Broker, header: RequestHeader, req: Body) -> Body:
    error = await broker.txn_coordinator.end_txn(
        req["transactional_id"], req["producer_id"], req["producer_epoch"], bool(req["committed"])
    )
    return {"throttle_time_ms": 0, "error_code": _fenced_for(error, "end_txn", header.api_version)}


async def write_txn_markers(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """A coordinator's markers for partitions this broker leads. Only brokers write markers
    (an abort discards another producer's records for every read_committed reader), so the
    request is the replication door's, like a follower's fetch: only on the inter-broker
    listener, from a broker (replica_access.may_act_as_replica, which with an authorizer is
    Kafka's CLUSTER_ACTION); anyone else gets CLUSTER_AUTHORIZATION_FAILED on every partition."""
    session = current_session.get()
    if not broker.replicas.may_replicate(session):
        log.info(
            "event=txn_markers_refused host=%s listener=%s principal=%s markers=%d",
            session.host, session.listener, session.principal, len(req["markers"]),
        )  # fmt: skip
        return _markers_answer(req, ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
    markers = []
    for m in req["markers"]:
        partitions = [(t["name"], p) for t in m["topics"] for p in t["partition_indexes"]]
        results = await txn_markers.write_local(
            broker,
            m["producer_id"],
            m["producer_epoch"],
            bool(m["transaction_result"]),
            m["coordinator_epoch"],
            partitions,
        )
        markers.append(
            {
                "producer_id": m["producer_id"],
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": p, "error_code": results[(t["name"], p)]}
                            for p in t["partition_indexes"]
                        ],
                    }
                    for t in m["topics"]
                ],
            }
        )
    return {"markers": markers}


def _markers_answer(req: Body, error: ErrorCode) -> Body:
    """``error`` for every partition of every marker of a WriteTxnMarkers request."""
    return {
        "markers": [
            {
                "producer_id": m["producer_id"],
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": p, "error_code": error} for p in t["partition_indexes"]
                        ],
                    }
                    for t in m["topics"]
                ],
            }
            for m in req["markers"]
        ]
    }


async def txn_offset_commit(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """Offsets committed in a transaction: held by the group coordinator until the
    transaction's marker reaches the group's partition (committed: applied; aborted: dropped)."""
    results = await broker.coordinator.commit_txn_offsets(req)
    return {
        "throttle_time_ms": 0,
        "topics": [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": results[(t["name"], p["partition_index"])],
                    }
                    for p in t["partitions"]
                ],
            }
            for t in req["topics"]
        ],
    }

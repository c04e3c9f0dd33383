"""The authorization guards of the admin APIs (issue 19), with Kafka's rules (KafkaApis):

===========================  ====================================================================
CreatePartitions             ALTER on each topic (TOPIC_AUTHORIZATION_FAILED)
AlterConfigs, Incremental-   ALTER_CONFIGS on the topic, or on the cluster for a broker resource
AlterConfigs                 (CLUSTER_AUTHORIZATION_FAILED)
DeleteRecords                DELETE on each topic
ElectLeaders                 ALTER on the cluster (every partition CLUSTER_AUTHORIZATION_FAILED)
AlterPartitionReassignments  ALTER on the cluster
ListPartitionReassignments   DESCRIBE on the cluster
DescribeCluster              none, as Kafka (the authorized operations are 0 without DESCRIBE on
                             the cluster: ``admin_cluster.cluster_operations``)
DescribeLogDirs              DESCRIBE on the cluster (else an empty answer, v3+ with the error)
OffsetDelete                 DELETE on the group (GROUP_AUTHORIZATION_FAILED), READ on each topic
DescribeProducers            READ on each topic
===========================  ====================================================================

A guard answers a request refused as a whole, or hands the handler the request less what the
principal may not touch and adds the refusals to the answer (``broker/authz.py``).
"""

from __future__ import annotations

from sluice.broker.authorizer import Check
from sluice.broker.authz import TOPIC_DENIED, Guard
from sluice.broker.context import Body, BrokerContext, Handler
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import Operation

CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


async def _create_partitions(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    topics = list(req["topics"])
    denied = check.denied_topics(Operation.ALTER, (t["name"] for t in topics))
    if not denied:
        return await handler(broker, header, req)
    results: dict[str, Body] = {}
    allowed = [t for t in topics if t["name"] not in denied]
    if allowed:
        response = await handler(broker, header, {**req, "topics": allowed})
        assert response is not None
        results = {r["name"]: r for r in response["results"]}
    refusal = {"error_code": TOPIC_DENIED, "error_message": "not authorized to alter this topic"}
    return {
        "throttle_time_ms": 0,
        "results": [results.get(t["name"], {"name": t["name"], **refusal}) for t in topics],
    }


async def _alter_configs(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    resources = list(req["resources"])
    refusals: dict[int, Body] = {}
    for i, r in enumerate(resources):
        rtype, name = r["resource_type"], r["resource_name"]
        if rtype == RESOURCE_TOPIC and not check.topic(Operation.ALTER_CONFIGS, name):
            refusals[i] = {"error_code": TOPIC_DENIED, "error_message": "not authorized to alter its configs"}
        elif rtype == RESOURCE_BROKER and not check.cluster(Operation.ALTER_CONFIGS):
            refusals[i] = {
                "error_code": CLUSTER_DENIED,
                "error_message": "not authorized to alter broker configs",
            }
    if not refusals:
        return await handler(broker, header, req)
    answered: list[Body] = []
    if len(refusals) < len(resources):
        response = await handler(
            broker, header, {**req, "resources": [r for i, r in enumerate(resources) if i not in refusals]}
        )
        assert response is not None
        answered = list(response["responses"])
    responses = []
    for i, r in enumerate(resources):
        if i in refusals:
            responses.append(
                {**refusals[i], "resource_type": r["resource_type"], "resource_name": r["resource_name"]}
            )
        else:
            responses.append(answered.pop(0))
    return {"throttle_time_ms": 0, "responses": responses}


async def _delete_records(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    denied = check.denied_topics(Operation.DELETE, (t["name"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    allowed = [t for t in req["topics"] if t["name"] not in denied]
    answered: list[Body] = []
    if allowed:
        response = await handler(broker, header, {**req, "topics": allowed})
        assert response is not None
        answered = list(response["topics"])
    return {
        "throttle_time_ms": 0,
        "topics": answered
        + [
            {
                "name": t["name"],
                "partitions": [
                    {"partition_index": p["partition_index"], "low_watermark": -1, "error_code": TOPIC_DENIED}
                    for p in t["partitions"]
                ],
            }
            for t in req["topics"]
            if t["name"] in denied
        ],
    }


async def _elect_leaders(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check.cluster(Operation.ALTER):
        return await handler(broker, header, req)
    return {
        "throttle_time_ms": 0,
        "error_code": CLUSTER_DENIED,
        "replica_election_results": [
            {
                "topic": t["topic"],
                "partition_result": [
                    {"partition_id": p, "error_code": CLUSTER_DENIED, "error_message": "not authorized"}
                    for p in t["partitions"]
                ],
            }
            for t in req.get("topic_partitions") or []
        ],
    }


def _cluster_op(op: Operation, refusal: Body) -> Guard:
    """A guard for an API refused as a whole without ``op`` on the cluster."""

    async def guard(
        handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
    ) -> Body | None:
        if check.cluster(op):
            return await handler(broker, header, req)
        return {"throttle_time_ms": 0, **refusal}

    return guard


async def _alter_partition_reassignments(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check.cluster(Operation.ALTER):
        return await handler(broker, header, req)
    message = "not authorized to reassign partitions: it needs ALTER on the cluster"
    # Kafka's refusal (AlterPartitionReassignmentsRequest.getErrorResponse) carries the code on
    # every partition named too, which is where clients read it
    return {
        "throttle_time_ms": 0,
        "error_code": CLUSTER_DENIED,
        "error_message": message,
        "responses": [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p["partition_index"],
                        "error_code": CLUSTER_DENIED,
                        "error_message": message,
                    }
                    for p in t["partitions"]
                ],
            }
            for t in req["topics"]
        ],
    }


async def _list_partition_reassignments(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check.cluster(Operation.DESCRIBE):
        return await handler(broker, header, req)
    # Kafka's refusal (ListPartitionReassignmentsRequest.getErrorResponse) repeats the partitions
    # asked about, with no replicas: nothing the client did not send
    return {
        "throttle_time_ms": 0,
        "error_code": CLUSTER_DENIED,
        "error_message": "not authorized to describe the cluster",
        "topics": [
            {"name": t["name"], "partitions": [{"partition_index": p} for p in t["partition_indexes"]]}
            for t in req.get("topics") or []
        ],
    }


_describe_log_dirs = _cluster_op(Operation.DESCRIBE, {"error_code": CLUSTER_DENIED, "results": []})


async def _offset_delete(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    def answer(topics: list[Body], error: ErrorCode) -> list[Body]:
        return [
            {
                "name": t["name"],
                "partitions": [
                    {"partition_index": p["partition_index"], "error_code": error} for p in t["partitions"]
                ],
            }
            for t in topics
        ]

    if not check.group(Operation.DELETE, req["group_id"]):
        # Kafka's refusal (OffsetDeleteRequest.getErrorResponse): the top-level code, no topics
        return {"error_code": GROUP_DENIED, "throttle_time_ms": 0, "topics": []}
    denied = check.denied_topics(Operation.READ, (t["name"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    refused = answer([t for t in req["topics"] if t["name"] in denied], TOPIC_DENIED)
    allowed = [t for t in req["topics"] if t["name"] not in denied]
    if not allowed:
        return {"error_code": ErrorCode.NONE, "throttle_time_ms": 0, "topics": refused}
    response = await handler(broker, header, {**req, "topics": allowed})
    assert response is not None
    response["topics"] = list(response["topics"]) + refused
    return response


async def _describe_producers(
    handler: Handler, broker: BrokerContext, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    denied = check.denied_topics(Operation.READ, (t["name"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    allowed = [t for t in req["topics"] if t["name"] not in denied]
    answered: list[Body] = []
    if allowed:
        response = await handler(broker, header, {**req, "topics": allowed})
        assert response is not None
        answered = list(response["topics"])
    return {
        "throttle_time_ms": 0,
        "topics": answered
        + [
            {
                "name": t["name"],
                "partitions": [
                    {
                        "partition_index": p,
                        "error_code": TOPIC_DENIED,
                        "error_message": "not authorized to read this topic",
                        "active_producers": [],
                    }
                    for p in t["partition_indexes"]
                ],
            }
            for t in req["topics"]
            if t["name"] in denied
        ],
    }


ADMIN_GUARDS: dict[int, Guard] = {
    ApiKey.CREATE_PARTITIONS: _create_partitions,
    ApiKey.ALTER_CONFIGS: _alter_configs,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _alter_configs,
    ApiKey.DELETE_RECORDS: _delete_records,
    ApiKey.ELECT_LEADERS: _elect_leaders,
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _alter_partition_reassignments,
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _list_partition_reassignments,
    ApiKey.DESCRIBE_LOG_DIRS: _describe_log_dirs,
    ApiKey.OFFSET_DELETE: _offset_delete,
    ApiKey.DESCRIBE_PRODUCERS: _describe_producers,
}
"""The guard of each admin API (``authz.guard_handlers`` wraps their handlers with these)."""

"""DescribeCluster (KIP-700): the brokers (at the addresses of the listener the request came in
on, as Metadata gives them), the controller and the cluster id, and, when asked, the operations
the principal may perform on the cluster. Like Metadata it needs no ACL (Kafka answers it to any
principal; the operations are 0 without DESCRIBE on the cluster)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sluice.broker.authorizer import session
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import SUPPORTED_OPERATIONS, Operation, Resource
from sluice.security.session import current_session

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

Body = dict[str, Any]
#: ``ClusterAuthorizedOperations`` when they were not asked for (Kafka's INT32_MIN).
NOT_ASKED = -(2**31)
#: DescribeCluster v1's endpoint types: brokers (1) or controllers (2; a ZooKeeper cluster has none).
ENDPOINT_BROKERS = 1


def cluster_operations(broker: BrokerContext) -> int:
    """The bit field of cluster operations the session's principal may perform (every one the
    cluster supports when no authorizer is configured, as Kafka answers); 0 to a principal that
    may not DESCRIBE the cluster, as Kafka answers DescribeCluster and Metadata v8-10 (KafkaApis:
    the operations only ``if authorize(DESCRIBE, CLUSTER)``)."""
    ops = authorized_operations(broker, Resource.cluster())
    return ops if ops & (1 << Operation.DESCRIBE) else 0


def authorized_operations(broker: BrokerContext, resource: Resource) -> int:
    """The bit field of the operations on ``resource`` the session's principal may perform
    (KIP-430: Metadata's topic, DescribeGroups' group and DescribeCluster's cluster operations);
    with no authorizer configured every operation the resource type supports, as Kafka answers."""
    ops = sorted(SUPPORTED_OPERATIONS[resource.type])
    authorizer = broker.authorizer
    if authorizer is not None:
        who = session()
        ops = [op for op in ops if authorizer.authorize(who, op, resource, quiet=True)]
    bits = 0
    for op in ops:
        bits |= 1 << int(op)
    return bits


async def describe_cluster(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    if header.api_version >= 1 and req.get("endpoint_type", ENDPOINT_BROKERS) != ENDPOINT_BROKERS:
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
            "error_message": "a ZooKeeper cluster has no controller endpoints; ask for brokers",
            "endpoint_type": req.get("endpoint_type"),
            "cluster_id": broker.metadata.cluster_id,
            "controller_id": -1,
            "brokers": [],
        }
    listener = current_session.get().listener
    brokers = [
        {
            "broker_id": reg.broker_id,
            "host": address[0],
            "port": address[1],
            "rack": reg.rack,
            "is_fenced": False,
        }
        for reg in sorted(broker.metadata.brokers().values(), key=lambda r: r.broker_id)
        if (address := reg.endpoint(listener)) is not None
    ]
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "endpoint_type": ENDPOINT_BROKERS,
        "cluster_id": broker.metadata.cluster_id,
        "controller_id": broker.metadata.controller_id,
        "brokers": brokers,
        "cluster_authorized_operations": (
            cluster_operations(broker) if req.get("include_cluster_authorized_operations") else NOT_ASKED
        ),
    }

"""DescribeAcls, CreateAcls and DeleteAcls (API keys 29-31): ACLs through the Kafka protocol, so
confluent-kafka's ``AdminClient.create_acls/describe_acls/delete_acls`` and Kafka's tools work.

Kafka's answers: SECURITY_DISABLED when the broker has no authorizer; CLUSTER_AUTHORIZATION_FAILED
without DESCRIBE (DescribeAcls) or ALTER (CreateAcls, DeleteAcls) on the cluster; INVALID_REQUEST
for a binding that cannot be stored, naming why. Writes go to ZooKeeper (``security.acl_store``)
and the answer waits, a few seconds at most, until this broker's own cache holds them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from sluice.broker.authorizer import BrokerAuthorizer, Check, session, wait_for_acls
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    validate_binding,
)

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

log = logging.getLogger("sluice.authz")

Body = dict[str, Any]
NO_AUTHORIZER = "no authorizer is configured on the broker (authorizer.class.name)"


def _enum(kind: Any, code: int) -> Any:
    try:
        return kind(code)
    except ValueError:
        return kind.UNKNOWN


def _filter(f: Body, version: int) -> AclBindingFilter:
    return AclBindingFilter(
        _enum(ResourceType, f["resource_type_filter"]),
        f.get("resource_name_filter"),
        _enum(PatternType, f.get("pattern_type_filter", 3)) if version >= 1 else PatternType.LITERAL,
        f.get("principal_filter"),
        f.get("host_filter"),
        _enum(Operation, f["operation"]),
        _enum(Permission, f["permission_type"]),
    )


def _authorizer(broker: BrokerContext) -> BrokerAuthorizer | None:
    return getattr(broker, "authorizer", None)


def _check(broker: BrokerContext, authorizer: BrokerAuthorizer, api: str) -> Check:
    return Check(authorizer, session(), api)


async def describe_acls(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    authorizer = _authorizer(broker)
    if authorizer is None:
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.SECURITY_DISABLED,
            "error_message": NO_AUTHORIZER,
            "resources": [],
        }
    if not _check(broker, authorizer, "DescribeAcls").cluster(Operation.DESCRIBE):
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "error_message": "DESCRIBE on the cluster is needed to list ACLs",
            "resources": [],
        }
    flt = _filter(req, header.api_version)
    problem = flt.invalid()
    if problem:
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": problem,
            "resources": [],
        }
    by_pattern: dict[ResourcePattern, list[AccessControlEntry]] = {}
    for b in authorizer.snapshot().bindings():
        if flt.matches(b):
            by_pattern.setdefault(b.pattern, []).append(b.entry)
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "resources": [
            {
                "resource_type": int(p.type),
                "resource_name": p.name,
                "pattern_type": int(p.pattern_type),
                "acls": [
                    {
                        "principal": e.principal,
                        "host": e.host,
                        "operation": int(e.operation),
                        "permission_type": int(e.permission),
                    }
                    for e in entries
                ],
            }
            for p, entries in by_pattern.items()
        ],
    }


async def create_acls(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    creations = list(req["creations"])

    def every(error: ErrorCode, message: str) -> Body:
        return {
            "throttle_time_ms": 0,
            "results": [{"error_code": error, "error_message": message} for _ in creations],
        }

    authorizer = _authorizer(broker)
    if authorizer is None:
        return every(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    if not _check(broker, authorizer, "CreateAcls").cluster(Operation.ALTER):
        return every(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is needed to create ACLs")
    results: list[Body] = []
    valid: list[AclBinding] = []
    for c in creations:
        binding = AclBinding(
            ResourcePattern(
                _enum(ResourceType, c["resource_type"]),
                c["resource_name"],
                _enum(PatternType, c.get("resource_pattern_type", 3))
                if header.api_version >= 1
                else PatternType.LITERAL,
            ),
            AccessControlEntry(
                c["principal"],
                c["host"],
                _enum(Operation, c["operation"]),
                _enum(Permission, c["permission_type"]),
            ),
        )
        problem = validate_binding(binding)
        results.append(
            {"error_code": ErrorCode.INVALID_REQUEST if problem else ErrorCode.NONE, "error_message": problem}
        )
        if not problem:
            valid.append(binding)
    if valid:
        try:
            added, version = await asyncio.to_thread(authorizer.acls.add, valid)
        except Exception as exc:  # ZooKeeper away: nothing, or not all, may have been stored
            log.warning("event=acl_create_failed error=%r", exc)
            for r in results:
                if r["error_code"] == ErrorCode.NONE:
                    r["error_code"] = ErrorCode.UNKNOWN_SERVER_ERROR
                    r["error_message"] = f"ACLs could not be stored in ZooKeeper: {exc}; try again"
            return {"throttle_time_ms": 0, "results": results}
        for b in added:
            log.info("event=acl_created principal=%s %s", session().principal, b.describe())
        await wait_for_acls(authorizer, version)
    return {"throttle_time_ms": 0, "results": results}


async def delete_acls(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    filters = [_filter(f, header.api_version) for f in req["filters"]]

    def every(error: ErrorCode, message: str) -> Body:
        return {
            "throttle_time_ms": 0,
            "filter_results": [
                {"error_code": error, "error_message": message, "matching_acls": []} for _ in filters
            ],
        }

    authorizer = _authorizer(broker)
    if authorizer is None:
        return every(ErrorCode.SECURITY_DISABLED, NO_AUTHORIZER)
    if not _check(broker, authorizer, "DeleteAcls").cluster(Operation.ALTER):
        return every(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER on the cluster is needed to delete ACLs")
    results: list[Body] = []
    valid: list[AclBindingFilter] = []
    for f in filters:
        problem = f.invalid()
        results.append(
            {
                "error_code": ErrorCode.INVALID_REQUEST if problem else ErrorCode.NONE,
                "error_message": problem,
                "matching_acls": [],
            }
        )
        if not problem:
            valid.append(f)
    if valid:
        try:
            removed, version = await asyncio.to_thread(authorizer.acls.remove, valid)
        except Exception as exc:
            log.warning("event=acl_delete_failed error=%r", exc)
            return every(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"ACLs could not be deleted in ZooKeeper: {exc}; try again"
            )
        for b in removed:
            log.info("event=acl_deleted principal=%s %s", session().principal, b.describe())
        for f, result in zip(filters, results, strict=True):
            if result["error_code"] != ErrorCode.NONE:
                continue
            result["matching_acls"] = [
                {
                    "error_code": ErrorCode.NONE,
                    "error_message": None,
                    "resource_type": int(b.pattern.type),
                    "resource_name": b.pattern.name,
                    "pattern_type": int(b.pattern.pattern_type),
                    "principal": b.entry.principal,
                    "host": b.entry.host,
                    "operation": int(b.entry.operation),
                    "permission_type": int(b.entry.permission),
                }
                for b in removed
                if f.matches(b)
            ]
        await wait_for_acls(authorizer, version)
    return {"throttle_time_ms": 0, "filter_results": results}

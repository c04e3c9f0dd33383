"""`sluice acl add|remove|list`: Kafka's ACLs, written to ZooKeeper directly (``--zookeeper``),
as Kafka's ``kafka-acls --authorizer-properties zookeeper.connect=...`` did. Brokers pick a change
up through their watch within moments; no broker needs to be running."""

from __future__ import annotations

from typing import Annotated

import typer

from sluice.cli.common import ZooKeeperOpt, console, fail, local_zookeeper, zookeeper_auth
from sluice.security.acl import (
    CLUSTER_NAME,
    WILDCARD,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    Operation,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    parse_enum,
)

acl_app = typer.Typer(
    no_args_is_help=True, help="Kafka ACLs: who may do what on which topic, group or the cluster."
)

AllowPrincipal = Annotated[
    list[str] | None, typer.Option("--allow-principal", help="User:name (User:* for everyone), repeatable")
]
DenyPrincipal = Annotated[list[str] | None, typer.Option("--deny-principal", help="User:name, repeatable")]
OperationOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--operation",
        help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
        "AlterConfigs, IdempotentWrite or All; repeatable",
    ),
]
TopicOpt = Annotated[list[str] | None, typer.Option("--topic", help="topic name (* for all), repeatable")]
GroupOpt = Annotated[list[str] | None, typer.Option("--group", help="consumer group (* for all), repeatable")]
ClusterOpt = Annotated[bool, typer.Option("--cluster", help="the cluster itself")]
TransactionalOpt = Annotated[
    list[str] | None, typer.Option("--transactional-id", help="transactional id, repeatable")
]
HostOpt = Annotated[str | None, typer.Option("--host", help="client address the ACL applies to (default *)")]


def _store(zookeeper: str | None):  # type: ignore[no-untyped-def]
    from sluice.cluster.zkstore import ZkStore
    from sluice.security.acl_store import AclStore

    zk = ZkStore(zookeeper or local_zookeeper(), connect_timeout_s=10.0, auth=zookeeper_auth(zookeeper))
    try:
        zk.start()
    except ConnectionError as exc:
        raise fail(str(exc)) from None
    return zk, AclStore(zk)


def _resources(
    topic: list[str] | None, group: list[str] | None, cluster: bool, transactional_id: list[str] | None
) -> list[tuple[ResourceType, str]]:
    found = [(ResourceType.TOPIC, t) for t in topic or []]
    found += [(ResourceType.GROUP, g) for g in group or []]
    found += [(ResourceType.TRANSACTIONAL_ID, t) for t in transactional_id or []]
    if cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return found


def _enum_or_exit(kind, text: str, what: str):  # type: ignore[no-untyped-def]
    try:
        return parse_enum(kind, text)
    except ValueError as exc:
        raise fail(f"{what}: {exc}", 2) from None


def _principals(allow: list[str] | None, deny: list[str] | None) -> list[tuple[str, Permission]]:
    return [(p, Permission.ALLOW) for p in allow or []] + [(p, Permission.DENY) for p in deny or []]


def _print(bindings: list[AclBinding]) -> None:
    for b in sorted(bindings):
        console.print(b.describe(), highlight=False, markup=False, soft_wrap=True)


@acl_app.command("add")
def acl_add(
    allow_principal: AllowPrincipal = None,
    deny_principal: DenyPrincipal = None,
    operation: OperationOpt = None,
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TransactionalOpt = None,
    resource_pattern_type: Annotated[
        str, typer.Option("--resource-pattern-type", help="literal or prefixed")
    ] = "literal",
    host: HostOpt = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Add ACLs: every principal x operation x resource given. Prints each ACL added."""
    from sluice.security.acl_store import AclError

    principals = _principals(allow_principal, deny_principal)
    resources = _resources(topic, group, cluster, transactional_id)
    if not principals or not operation or not resources:
        raise fail("give --allow-principal or --deny-principal, --operation, and a resource "
                   "(--topic, --group, --cluster or --transactional-id)", 2)  # fmt: skip
    ptype = _enum_or_exit(PatternType, resource_pattern_type, "--resource-pattern-type")
    if ptype not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise fail("--resource-pattern-type is literal or prefixed when adding", 2)
    ops = [_enum_or_exit(Operation, o, "--operation") for o in operation]
    bindings = [
        AclBinding(
            ResourcePattern(rtype, name, PatternType.LITERAL if rtype == ResourceType.CLUSTER else ptype),
            AccessControlEntry(principal, host or WILDCARD, op, permission),
        )
        for rtype, name in resources
        for principal, permission in principals
        for op in ops
    ]
    zk, store = _store(zookeeper)
    try:
        added, _ = store.add(bindings)
    except AclError as exc:
        raise fail(str(exc), 2) from None
    finally:
        zk.stop()
    _print(added)
    console.print(f"added={len(added)} already_present={len(bindings) - len(added)}", highlight=False)


def _filters(
    principals: list[tuple[str, Permission]],
    operations: list[Operation],
    resources: list[tuple[ResourceType, str]],
    ptype: PatternType,
    host: str | None,
) -> list[AclBindingFilter]:
    by_resource: list[tuple[ResourceType, str | None]] = list(resources) or [(ResourceType.ANY, None)]
    by_principal: list[tuple[str | None, Permission]] = list(principals) or [(None, Permission.ANY)]
    return [
        AclBindingFilter(rtype, name, ptype, principal, host, op, permission)
        for rtype, name in by_resource
        for principal, permission in by_principal
        for op in operations or [Operation.ANY]
    ]


@acl_app.command("remove")
def acl_remove(
    allow_principal: AllowPrincipal = None,
    deny_principal: DenyPrincipal = None,
    operation: OperationOpt = None,
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TransactionalOpt = None,
    resource_pattern_type: Annotated[
        str, typer.Option("--resource-pattern-type", help="literal, prefixed or any")
    ] = "literal",
    host: HostOpt = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Remove the ACLs of a resource; narrowed by the principals, operations and host given."""
    resources = _resources(topic, group, cluster, transactional_id)
    if not resources:
        raise fail("name the resource: --topic, --group, --cluster or --transactional-id", 2)
    ptype = _enum_or_exit(PatternType, resource_pattern_type, "--resource-pattern-type")
    ops = [_enum_or_exit(Operation, o, "--operation") for o in operation or []]
    filters = _filters(_principals(allow_principal, deny_principal), ops, resources, ptype, host)
    zk, store = _store(zookeeper)
    try:
        removed, _ = store.remove(filters)
    finally:
        zk.stop()
    _print(removed)
    console.print(f"removed={len(removed)}", highlight=False)


@acl_app.command("list")
def acl_list(
    topic: TopicOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = False,
    transactional_id: TransactionalOpt = None,
    principal: Annotated[str | None, typer.Option("--principal", help="only this principal's")] = None,
    resource_pattern_type: Annotated[
        str,
        typer.Option(
            "--resource-pattern-type", help="any, match (every ACL that applies), literal or prefixed"
        ),
    ] = "any",
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """List ACLs, one key=value line each: all of them, or those of the resources given."""
    resources = _resources(topic, group, cluster, transactional_id)
    ptype = _enum_or_exit(PatternType, resource_pattern_type, "--resource-pattern-type")
    filters = _filters([(principal, Permission.ANY)] if principal else [], [], resources, ptype, None)
    zk, store = _store(zookeeper)
    try:
        bindings = store.all()
    finally:
        zk.stop()
    _print([b for b in bindings if any(f.matches(b) for f in filters)])

"""The table of the differential authorization suite: one line a case.

A case is one request (an API at one version, built from the case's resource names) and the
ACLs it needs (``needs``: resource type and operation, Kafka's KafkaApis rules). Each case is
sent by several principals, each a SCRAM user of its own with its own ACLs (so no principal's
ACLs touch another's), made from ``needs`` by `principals`:

=================  ==========================================================================
none               no ACL at all
needed             exactly the ACLs ``needs`` names, LITERAL, host ``*``
wrong-op.<res>     one of them with a neighbouring operation (``NEIGHBOUR_OPERATION``: one that
                   does not imply the needed one, e.g. DESCRIBE for WRITE)
wrong-name.<res>   one of them on another name (the cluster's: ALL on a topic kafka-cluster)
prefixed           the non-cluster ones PREFIXED on a prefix of the name (it matches)
literal-prefix     the same prefix, LITERAL (it does not match)
wildcard           the non-cluster ones on the LITERAL name ``*``
deny.<res>         the needed ACLs and a DENY of one of them
other-host         the needed ACLs, allowed only from another host (192.0.2.1)
deny-other-host    the needed ACLs and a DENY of all of them from another host
=================  ==========================================================================

Cases that are not about ACLs (ApiVersions, the SASL exchange) name their principals themselves
(``variants``) and run a ``flow`` of their own. Resource names are ``az.<case>.t`` (topic),
``.g`` (group), ``.x`` (transactional id); a case with ``fresh`` gives each principal its own
(``az.<case>.<variant>.t``) where a request changes what the next principal would meet.
Adding a case is one `Case(...)` line in `CASES`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from sluice.protocol.api import ApiKey
from sluice.protocol.records import build_batch
from sluice.security.acl import CLUSTER_NAME, Operation, PatternType, Permission, ResourceType

R, OP = ResourceType, Operation
Body = dict[str, Any]

#: TEST-NET-1 (RFC 5737): no client of the suite connects from it
HOST_ELSEWHERE = "192.0.2.1"
#: What the suite's transactional and idempotent batches claim (no coordinator knows it)
PRODUCER_ID = 4242
#: A replica id no broker of either one-broker cluster has (a follower's claim)
CLAIMED_REPLICA = 2
#: the batches' timestamp (fixed: the runs compare alike)
T0 = 1_700_000_000_000
ZERO_UUID = uuid.UUID(int=0)

#: For each needed (resource type, operation), an operation beside it that does not grant it
#: (Kafka's implications: READ, WRITE, DELETE and ALTER grant DESCRIBE; ALTER_CONFIGS grants
#: DESCRIBE_CONFIGS). None: every operation of the type grants it (a group's DESCRIBE).
NEIGHBOUR_OPERATION: dict[tuple[ResourceType, Operation], Operation | None] = {
    (R.TOPIC, OP.READ): OP.WRITE,
    (R.TOPIC, OP.WRITE): OP.READ,
    (R.TOPIC, OP.DESCRIBE): OP.DESCRIBE_CONFIGS,
    (R.TOPIC, OP.CREATE): OP.DESCRIBE,
    (R.TOPIC, OP.DELETE): OP.DESCRIBE,
    (R.TOPIC, OP.ALTER): OP.ALTER_CONFIGS,
    (R.TOPIC, OP.ALTER_CONFIGS): OP.ALTER,
    (R.TOPIC, OP.DESCRIBE_CONFIGS): OP.DESCRIBE,
    (R.GROUP, OP.READ): OP.DESCRIBE,
    (R.GROUP, OP.DELETE): OP.READ,
    (R.GROUP, OP.DESCRIBE): None,
    (R.TRANSACTIONAL_ID, OP.WRITE): OP.DESCRIBE,
    (R.TRANSACTIONAL_ID, OP.DESCRIBE): None,
    (R.CLUSTER, OP.CREATE): OP.DESCRIBE,
    (R.CLUSTER, OP.DESCRIBE): OP.DESCRIBE_CONFIGS,
    (R.CLUSTER, OP.ALTER): OP.ALTER_CONFIGS,
    (R.CLUSTER, OP.ALTER_CONFIGS): OP.ALTER,
    (R.CLUSTER, OP.DESCRIBE_CONFIGS): OP.DESCRIBE,
    (R.CLUSTER, OP.CLUSTER_ACTION): OP.ALTER,
    (R.CLUSTER, OP.IDEMPOTENT_WRITE): OP.DESCRIBE,
}
_SHORT = {R.TOPIC: "topic", R.GROUP: "group", R.TRANSACTIONAL_ID: "txn", R.CLUSTER: "cluster"}


@dataclass(frozen=True, slots=True)
class Need:
    rtype: ResourceType
    op: Operation


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding, as CreateAcls sends it."""

    rtype: ResourceType
    name: str
    pattern: PatternType
    principal: str
    host: str
    op: Operation
    permission: Permission

    def creation(self) -> Body:
        return {
            "resource_type": int(self.rtype),
            "resource_name": self.name,
            "resource_pattern_type": int(self.pattern),
            "principal": self.principal,
            "host": self.host,
            "operation": int(self.op),
            "permission_type": int(self.permission),
        }


@dataclass(frozen=True, slots=True)
class Names:
    """The resource names one principal's request of a case uses."""

    topic: str
    group: str
    txn: str

    def of(self, rtype: ResourceType) -> str:
        return {R.TOPIC: self.topic, R.GROUP: self.group, R.TRANSACTIONAL_ID: self.txn}.get(
            rtype, CLUSTER_NAME
        )


@dataclass(frozen=True, slots=True)
class Principal:
    case: str
    variant: str
    #: the SCRAM user (``User:<user>``)
    user: str
    acls: tuple[Acl, ...]
    names: Names
    #: False: the user is never created (the SASL exchange of a name the cluster does not know)
    exists: bool = True


@dataclass(frozen=True, slots=True)
class Ctx:
    """What a request builder may use: the principal's names, the one broker's id, and what the
    case's ``before`` step answered."""

    names: Names
    user: str
    variant: str
    broker_id: int
    before: Body = field(default_factory=dict)


Build = Callable[[Ctx], Body]


@dataclass(frozen=True)
class Case:
    name: str
    api: ApiKey
    version: int
    needs: tuple[Need, ...]
    #: the request's body (None: the case runs a ``flow`` of its own)
    request: Build | None
    #: what the case shows (printed with its differences)
    about: str = ""
    #: resource kinds each principal gets its own of ("topic", "group")
    fresh: frozenset[str] = frozenset()
    #: the case's topic is created before the cases run (False: it never exists)
    topic_exists: bool = True
    #: the case's group exists (an offset committed by the admin) before the cases run
    group_exists: bool = False
    #: a step run as the case's owner (a principal with the needed ACLs) before each
    #: principal's request, on a connection of its own; its answer is ``Ctx.before``
    before: Callable[[Ctx], tuple[ApiKey, int, Body, Callable[[Body], Body]]] | None = None
    #: principals of a case that is not about ACLs: variant -> ACLs needed (as Need)
    variants: dict[str, tuple[Need, ...]] | None = None
    #: ("sasl-handshake" | "sasl-authenticate" | "api-versions"): the case's own exchange
    flow: str | None = None
    #: ACLs the admin adds before the cases run (the principal's names given)
    setup_acls: Callable[[Names], list[Acl]] | None = None
    #: fields compared besides the codes (KIP-430's authorized operations)
    fields: tuple[str, ...] = ()

    def names(self, variant: str) -> Names:
        shared = f"az.{self.name}"
        own = f"az.{self.name}.{variant}"
        return Names(
            topic=f"{own if 'topic' in self.fresh else shared}.t",
            group=f"{own if 'group' in self.fresh else shared}.g",
            txn=f"{shared}.x",
        )


def user_of(case: str, variant: str) -> str:
    return f"az.{case}.{variant}"


def _label(needs: tuple[Need, ...], i: int) -> str:
    need = needs[i]
    short = _SHORT[need.rtype]
    if sum(n.rtype == need.rtype for n in needs) > 1:
        return f"{short}-{need.op.name.lower().replace('_', '-')}"
    return short


def _allow(need: Need, names: Names, principal: str) -> Acl:
    return Acl(
        need.rtype, names.of(need.rtype), PatternType.LITERAL, principal, "*", need.op, Permission.ALLOW
    )


def principals(case: Case) -> list[Principal]:
    """Every principal the case is sent as (the module docstring's variants, or the case's own)."""
    out: list[Principal] = []

    def add(variant: str, acls: list[Acl], exists: bool = True) -> None:
        out.append(
            Principal(
                case.name, variant, user_of(case.name, variant), tuple(acls), case.names(variant), exists
            )
        )

    def needed(variant: str, needs: tuple[Need, ...] | None = None) -> list[Acl]:
        principal = f"User:{user_of(case.name, variant)}"
        return [_allow(n, case.names(variant), principal) for n in (case.needs if needs is None else needs)]

    if case.variants is not None:
        for variant, needs in case.variants.items():
            acls = needed(variant, needs)
            if variant == "deny-all":  # refused every operation on the cluster and every topic
                principal = f"User:{user_of(case.name, variant)}"
                acls += [
                    Acl(rtype, name, PatternType.LITERAL, principal, "*", OP.ALL, Permission.DENY)
                    for rtype, name in ((R.CLUSTER, CLUSTER_NAME), (R.TOPIC, "*"))
                ]
            add(variant, acls, exists=variant != "unknown-user")
        return out
    add("none", [])
    add("needed", needed("needed"))
    n = len(case.needs)
    for i in range(n):
        variant = f"wrong-op.{_label(case.needs, i)}"
        op = NEIGHBOUR_OPERATION[(case.needs[i].rtype, case.needs[i].op)]
        if op is not None:
            acls = needed(variant)
            acls[i] = replace(acls[i], op=op)
            add(variant, acls)
    for i in range(n):
        variant = f"wrong-name.{_label(case.needs, i)}"
        acls = needed(variant)
        if acls[i].rtype == R.CLUSTER:  # one cluster: its name on a topic, every operation
            acls[i] = replace(acls[i], rtype=R.TOPIC, op=OP.ALL)
        else:
            acls[i] = replace(acls[i], name=acls[i].name[:-1] + "z")
        add(variant, acls)
    if any(need.rtype != R.CLUSTER for need in case.needs):
        for variant, pattern, name in (
            ("prefixed", PatternType.PREFIXED, lambda a: a.name[:-1]),
            ("literal-prefix", PatternType.LITERAL, lambda a: a.name[:-1]),
            ("wildcard", PatternType.LITERAL, lambda a: "*"),
        ):
            add(
                variant,
                [
                    a if a.rtype == R.CLUSTER else replace(a, pattern=pattern, name=name(a))
                    for a in needed(variant)
                ],
            )
    for i in range(n):
        variant = f"deny.{_label(case.needs, i)}"
        acls = needed(variant)
        add(variant, [*acls, replace(acls[i], permission=Permission.DENY)])
    add("other-host", [replace(a, host=HOST_ELSEWHERE) for a in needed("other-host")])
    acls = needed("deny-other-host")
    add("deny-other-host", acls + [replace(a, host=HOST_ELSEWHERE, permission=Permission.DENY) for a in acls])
    return out


def owner(case: Case) -> Principal:
    """The principal a case's ``before`` step runs as: the needed ACLs on the shared names."""
    variant = "owner"
    acls = tuple(_allow(n, case.names(variant), f"User:{user_of(case.name, variant)}") for n in case.needs)
    return Principal(case.name, variant, user_of(case.name, variant), acls, case.names(variant))


# -- request bodies ---------------------------------------------------------------------------


def _batch(*, producer_id: int = -1, transactional: bool = False, sequence: int = -1) -> bytes:
    return build_batch(
        [(b"k", b"v")],
        timestamp_ms=T0,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence,
        transactional=transactional,
    )


def _produce(records: bytes, txn: bool = False) -> Build:
    return lambda c: {
        "transactional_id": c.names.txn if txn else None,
        "acks": -1,
        "timeout_ms": 10000,
        "topic_data": [{"name": c.names.topic, "partition_data": [{"index": 0, "records": records}]}],
    }


def _fetch(c: Ctx, *, replica_id: int = -1, session: tuple[int, int] = (0, -1), named: bool = True) -> Body:
    return {
        "replica_id": replica_id,
        "max_wait_ms": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": session[0],
        "session_epoch": session[1],
        "topics": [
            {
                "topic": c.names.topic,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ]
        if named
        else [],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def _open_fetch_session(c: Ctx) -> tuple[ApiKey, int, Body, Callable[[Body], Body]]:
    """The owner's full fetch asking for a session (epoch 0); Ctx.before gets its id."""

    def session(response: Body) -> Body:
        assert response["error_code"] == 0 and response["session_id"] != 0, response
        return {"session_id": response["session_id"]}

    return ApiKey.FETCH, 12, _fetch(c, session=(0, 0)), session


def _offsets(c: Ctx) -> list[Body]:
    return [
        {
            "name": c.names.topic,
            "partitions": [
                {
                    "partition_index": 0,
                    "committed_offset": 0,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            ],
        }
    ]


def _ofle(replica_id: int) -> Build:
    return lambda c: {
        "replica_id": replica_id,
        "topics": [
            {
                "topic": c.names.topic,
                "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}],
            }
        ],
    }


def _acl_filter(c: Ctx) -> Body:
    return {
        "resource_type_filter": int(R.TOPIC),
        "resource_name_filter": c.names.topic,
        "pattern_type_filter": int(PatternType.LITERAL),
        "principal_filter": f"User:{c.names.topic}.dummy",
        "host_filter": None,
        "operation": int(OP.ANY),
        "permission_type": int(Permission.ANY),
    }


def _dummy_acl(names: Names) -> list[Acl]:
    principal = f"User:{names.topic}.dummy"
    return [Acl(R.TOPIC, names.topic, PatternType.LITERAL, principal, "*", OP.READ, Permission.ALLOW)]


def _create_acl(rtype: ResourceType, pattern: PatternType, op: Operation, name: str | None = None) -> Build:
    return lambda c: {
        "creations": [
            Acl(
                rtype,
                name or c.names.topic,
                pattern,
                f"User:{c.names.topic}.dummy",
                "*",
                op,
                Permission.ALLOW,
            ).creation()
        ]
    }


def _configs(rtype: int, incremental: bool) -> Build:
    def build(c: Ctx) -> Body:
        topic = rtype == 2
        entry: Body = {"name": "retention.ms", "value": "86400000"}
        if incremental:
            entry["config_operation"] = 0
        return {
            "validate_only": True,
            "resources": [
                {
                    "resource_type": rtype,
                    "resource_name": c.names.topic if topic else str(c.broker_id),
                    "configs": [entry] if topic else [],
                }
            ],
        }

    return build


def _n(*needs: tuple[ResourceType, Operation]) -> tuple[Need, ...]:
    return tuple(Need(r, o) for r, o in needs)


T_READ, T_WRITE, T_DESCRIBE = (R.TOPIC, OP.READ), (R.TOPIC, OP.WRITE), (R.TOPIC, OP.DESCRIBE)
G_READ, G_DESCRIBE = (R.GROUP, OP.READ), (R.GROUP, OP.DESCRIBE)
X_WRITE = (R.TRANSACTIONAL_ID, OP.WRITE)


def _c(op: Operation) -> tuple[Need, ...]:
    return _n((R.CLUSTER, op))


A = ApiKey
VALIDATE = "validate_only"


def _topic_partitions(key: str = "partitions", index: str = "partition_index", **extra: Any) -> Build:
    """``{"topics": [{"name": <topic>, key: [{index: 0, **extra}]}]}``, the common body."""
    return lambda c: {"topics": [{"name": c.names.topic, key: [{index: 0, **extra}]}]}


def _with(build: Build, **fields: Any) -> Build:
    return lambda c: {**build(c), **fields}


def _one_topic(c: Ctx) -> Body:
    return {"topics": [{"name": c.names.topic, "num_partitions": 1, "replication_factor": 1}]}


def _group(**fields: Any) -> Build:
    return lambda c: {"group_id": c.names.group, **fields}


def _txn(**fields: Any) -> Build:
    return lambda c: {
        "transactional_id": c.names.txn,
        "producer_id": PRODUCER_ID,
        "producer_epoch": 0,
        **fields,
    }


def _named(c: Ctx, auto: bool = False, operations: bool = False) -> Body:
    return {
        "topics": [{"name": c.names.topic}],
        "allow_auto_topic_creation": auto,
        "include_topic_authorized_operations": operations,
    }


_INIT_IDEMPOTENT: Body = {
    "transactional_id": None,
    "transaction_timeout_ms": 60000,
    "producer_id": -1,
    "producer_epoch": -1,
}
_JOIN: Body = {
    "session_timeout_ms": 10000,
    "rebalance_timeout_ms": 10000,
    "member_id": "",
    "protocol_type": "consumer",
    "protocols": [{"name": "range", "metadata": b""}],
}
_SYNC: Body = {
    "generation_id": 1,
    "member_id": "m",
    "protocol_type": "consumer",
    "protocol_name": "range",
    "assignments": [],
}
_T: Any = {"timeout_ms": 10000}
DESCRIBE_CONFIGS, ALTER_CONFIGS = (R.TOPIC, OP.DESCRIBE_CONFIGS), (R.TOPIC, OP.ALTER_CONFIGS)

CASES: list[Case] = [
    # -- produce and fetch
    Case("produce", A.PRODUCE, 9, _n(T_WRITE), _produce(_batch())),
    Case("produce-two-batches", A.PRODUCE, 9, _n(T_WRITE), _produce(_batch() + _batch()),
         "two record batches in one partition (issue 33: a second batch)"),
    Case("produce-transactional", A.PRODUCE, 9, _n(X_WRITE, T_WRITE),
         _produce(_batch(producer_id=PRODUCER_ID, transactional=True, sequence=0), txn=True),
         "a transactional batch of a transaction no coordinator knows"),
    Case("produce-idempotent", A.PRODUCE, 9, _n(T_WRITE),
         _produce(_batch(producer_id=PRODUCER_ID + 1, sequence=0)),
         "an idempotent batch (KIP-679: WRITE is enough)"),
    Case("fetch", A.FETCH, 12, _n(T_READ), lambda c: _fetch(c)),
    Case("fetch-session-hijack", A.FETCH, 12, _n(T_READ),
         lambda c: _fetch(c, session=(c.before["session_id"], 1), named=False),
         "another principal's fetch session id, incremental (issue 33: session hijack)",
         before=_open_fetch_session),
    Case("fetch-replica-claim", A.FETCH, 12, _c(OP.CLUSTER_ACTION),
         lambda c: _fetch(c, replica_id=CLAIMED_REPLICA),
         "a Fetch claiming a follower's replica id on the client listener (issue 33: a replica-id claim)"),
    Case("list-offsets", A.LIST_OFFSETS, 7, _n(T_DESCRIBE),
         _with(_topic_partitions(current_leader_epoch=-1, timestamp=-1), replica_id=-1)),
    # -- metadata
    Case("metadata", A.METADATA, 12, _n(T_DESCRIBE), _named),
    Case("metadata-authorized-operations", A.METADATA, 12, _n(T_DESCRIBE),
         lambda c: _named(c, operations=True), "KIP-430", fields=("topic_authorized_operations",)),
    Case("metadata-all-topics", A.METADATA, 12, _n(T_DESCRIBE),
         lambda c: {"topics": None, "allow_auto_topic_creation": False},
         "topics=null: only those described are listed"),
    Case("metadata-missing-topic", A.METADATA, 12, _n(T_DESCRIBE), _named, topic_exists=False),
    Case("metadata-auto-create", A.METADATA, 12, _n(T_DESCRIBE, (R.TOPIC, OP.CREATE)),
         lambda c: _named(c, auto=True),
         "a missing topic, auto-created (both brokers run auto.create.topics.enable=true)",
         fresh=frozenset({"topic"}), topic_exists=False),
    # -- consumer groups
    Case("offset-commit", A.OFFSET_COMMIT, 8, _n(G_READ, T_READ),
         lambda c: {"group_id": c.names.group, "generation_id_or_member_epoch": -1, "topics": _offsets(c)}),
    Case("offset-fetch", A.OFFSET_FETCH, 7, _n(G_DESCRIBE, T_DESCRIBE),
         lambda c: {"group_id": c.names.group, "topics": [{"name": c.names.topic, "partition_indexes": [0]}]},
         group_exists=True),
    Case("offset-fetch-all-topics", A.OFFSET_FETCH, 7, _n(G_DESCRIBE, T_DESCRIBE), _group(topics=None),
         "topics=null: the committed topics described", group_exists=True),
    Case("find-coordinator-group", A.FIND_COORDINATOR, 4, _n(G_DESCRIBE),
         lambda c: {"key_type": 0, "coordinator_keys": [c.names.group]}),
    Case("find-coordinator-txn", A.FIND_COORDINATOR, 4, _n((R.TRANSACTIONAL_ID, OP.DESCRIBE)),
         lambda c: {"key_type": 1, "coordinator_keys": [c.names.txn]}),
    Case("join-group", A.JOIN_GROUP, 9, _n(G_READ), _group(**_JOIN)),
    Case("heartbeat", A.HEARTBEAT, 4, _n(G_READ), _group(generation_id=1, member_id="m")),
    Case("leave-group", A.LEAVE_GROUP, 5, _n(G_READ),
         _group(members=[{"member_id": "m", "group_instance_id": None}])),
    Case("sync-group", A.SYNC_GROUP, 5, _n(G_READ), _group(**_SYNC)),
    Case("describe-groups", A.DESCRIBE_GROUPS, 5, _n(G_DESCRIBE), lambda c: {"groups": [c.names.group]},
         group_exists=True),
    Case("describe-groups-authorized-operations", A.DESCRIBE_GROUPS, 5, _n(G_DESCRIBE),
         lambda c: {"groups": [c.names.group], "include_authorized_operations": True}, "KIP-430",
         group_exists=True, fields=("authorized_operations",)),
    Case("list-groups", A.LIST_GROUPS, 4, _n(G_DESCRIBE), lambda c: {"states_filter": []},
         "the groups listed: those described", group_exists=True),
    Case("list-groups-cluster", A.LIST_GROUPS, 4, _c(OP.DESCRIBE), lambda c: {"states_filter": []},
         "DESCRIBE on the cluster lists every group", group_exists=True),
    Case("delete-groups", A.DELETE_GROUPS, 2, _n((R.GROUP, OP.DELETE)),
         lambda c: {"groups_names": [c.names.group]}, fresh=frozenset({"group"}), group_exists=True),
    Case("offset-delete", A.OFFSET_DELETE, 0, _n((R.GROUP, OP.DELETE), T_READ),
         lambda c: {"group_id": c.names.group, **_topic_partitions()(c)},
         fresh=frozenset({"group"}), group_exists=True),
    # -- topics
    Case("create-topics-topic", A.CREATE_TOPICS, 7, _n((R.TOPIC, OP.CREATE)),
         _with(_one_topic, validate_only=True, **_T), VALIDATE, topic_exists=False),
    Case("create-topics-cluster", A.CREATE_TOPICS, 7, _c(OP.CREATE),
         _with(_one_topic, validate_only=True, **_T), VALIDATE, topic_exists=False),
    Case("delete-topics", A.DELETE_TOPICS, 6, _n((R.TOPIC, OP.DELETE)),
         lambda c: {"topics": [{"name": c.names.topic, "topic_id": ZERO_UUID}], **_T},
         fresh=frozenset({"topic"})),
    Case("delete-topics-missing", A.DELETE_TOPICS, 6, _n((R.TOPIC, OP.DELETE)),
         lambda c: {"topics": [{"name": c.names.topic, "topic_id": ZERO_UUID}], **_T}, topic_exists=False),
    Case("delete-records", A.DELETE_RECORDS, 2, _n((R.TOPIC, OP.DELETE)),
         _with(_topic_partitions(offset=0), **_T)),
    Case("create-partitions", A.CREATE_PARTITIONS, 3, _n((R.TOPIC, OP.ALTER)),
         lambda c: {"topics": [{"name": c.names.topic, "count": 2, "assignments": None}],
                    "validate_only": True, **_T}, VALIDATE),
    Case("describe-configs-topic", A.DESCRIBE_CONFIGS, 4, _n(DESCRIBE_CONFIGS),
         lambda c: {"resources": [{"resource_type": 2, "resource_name": c.names.topic,
                                   "configuration_keys": ["retention.ms"]}]}),
    Case("describe-configs-broker", A.DESCRIBE_CONFIGS, 4, _c(OP.DESCRIBE_CONFIGS),
         lambda c: {"resources": [{"resource_type": 4, "resource_name": str(c.broker_id),
                                   "configuration_keys": ["num.io.threads"]}]}),
    Case("alter-configs-topic", A.ALTER_CONFIGS, 2, _n(ALTER_CONFIGS), _configs(2, False), VALIDATE),
    Case("alter-configs-broker", A.ALTER_CONFIGS, 2, _c(OP.ALTER_CONFIGS), _configs(4, False),
         "validate_only, no keys"),
    Case("incremental-alter-configs-topic", A.INCREMENTAL_ALTER_CONFIGS, 1, _n(ALTER_CONFIGS),
         _configs(2, True), VALIDATE),
    Case("incremental-alter-configs-broker", A.INCREMENTAL_ALTER_CONFIGS, 1, _c(OP.ALTER_CONFIGS),
         _configs(4, True), "validate_only, no keys"),
    Case("describe-producers", A.DESCRIBE_PRODUCERS, 0, _n(T_READ),
         lambda c: {"topics": [{"name": c.names.topic, "partition_indexes": [0]}]}),
    Case("offset-for-leader-epoch", A.OFFSET_FOR_LEADER_EPOCH, 4, _n(T_DESCRIBE), _ofle(-1)),
    Case("offset-for-leader-epoch-cluster-action", A.OFFSET_FOR_LEADER_EPOCH, 4, _c(OP.CLUSTER_ACTION),
         _ofle(-1)),
    Case("offset-for-leader-epoch-replica-claim", A.OFFSET_FOR_LEADER_EPOCH, 4, _c(OP.CLUSTER_ACTION),
         _ofle(CLAIMED_REPLICA), "a follower's replica id claimed on the client listener"),
    Case("offset-for-leader-epoch-replica-claim-describe", A.OFFSET_FOR_LEADER_EPOCH, 4, _n(T_DESCRIBE),
         _ofle(CLAIMED_REPLICA), "the same claim from a principal with DESCRIBE on the topic"),
    # -- cluster administration
    Case("describe-cluster", A.DESCRIBE_CLUSTER, 1, _c(OP.DESCRIBE),
         lambda c: {"include_cluster_authorized_operations": True},
         "with the authorized operations (KIP-430)", fields=("cluster_authorized_operations",)),
    Case("describe-log-dirs", A.DESCRIBE_LOG_DIRS, 4, _c(OP.DESCRIBE),
         lambda c: {"topics": [{"topic": c.names.topic, "partitions": [0]}]}),
    Case("elect-leaders", A.ELECT_LEADERS, 2, _c(OP.ALTER),
         lambda c: {"election_type": 0, "topic_partitions": [{"topic": c.names.topic, "partitions": [0]}],
                    **_T}),
    Case("alter-partition-reassignments", A.ALTER_PARTITION_REASSIGNMENTS, 0, _c(OP.ALTER),
         _topic_partitions(replicas=None), "cancelling a reassignment that is not in progress"),
    Case("list-partition-reassignments", A.LIST_PARTITION_REASSIGNMENTS, 0, _c(OP.DESCRIBE),
         lambda c: {"topics": [{"name": c.names.topic, "partition_indexes": [0]}]}),
    Case("describe-user-scram-credentials", A.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, _c(OP.DESCRIBE),
         lambda c: {"users": [{"name": c.user}]}, "the principal's own credentials"),
    Case("alter-user-scram-credentials", A.ALTER_USER_SCRAM_CREDENTIALS, 0, _c(OP.ALTER),
         lambda c: {"deletions": [{"name": f"{c.names.topic}.nobody", "mechanism": 2}]},
         "deleting a credential nobody has"),
    # -- ACLs
    Case("describe-acls", A.DESCRIBE_ACLS, 3, _c(OP.DESCRIBE),
         lambda c: {"resource_type_filter": int(R.TOPIC), "resource_name_filter": c.names.topic,
                    "pattern_type_filter": int(PatternType.MATCH), "principal_filter": None,
                    "host_filter": None, "operation": int(OP.ANY), "permission_type": int(Permission.ANY)},
         setup_acls=_dummy_acl),
    Case("create-acls", A.CREATE_ACLS, 3, _c(OP.ALTER), _create_acl(R.TOPIC, PatternType.LITERAL, OP.READ),
         fresh=frozenset({"topic"}), topic_exists=False),
    Case("create-acls-prefixed-cluster", A.CREATE_ACLS, 3, _c(OP.ALTER),
         _create_acl(R.CLUSTER, PatternType.PREFIXED, OP.DESCRIBE, CLUSTER_NAME),
         "an ACL on the PREFIXED pattern kafka-cluster", fresh=frozenset({"topic"}), topic_exists=False),
    Case("create-acls-operation-of-another-type", A.CREATE_ACLS, 3, _c(OP.ALTER),
         _create_acl(R.TOPIC, PatternType.LITERAL, OP.CLUSTER_ACTION),
         "an ACL granting a topic CLUSTER_ACTION", fresh=frozenset({"topic"}), topic_exists=False),
    Case("delete-acls", A.DELETE_ACLS, 3, _c(OP.ALTER), lambda c: {"filters": [_acl_filter(c)]},
         fresh=frozenset({"topic"}), topic_exists=False, setup_acls=_dummy_acl),
    # -- transactions
    Case("init-producer-id-transactional", A.INIT_PRODUCER_ID, 4, _n(X_WRITE),
         lambda c: {**_INIT_IDEMPOTENT, "transactional_id": c.names.txn}),
    Case("init-producer-id-idempotent-cluster", A.INIT_PRODUCER_ID, 4, _c(OP.IDEMPOTENT_WRITE),
         lambda c: _INIT_IDEMPOTENT),
    Case("init-producer-id-idempotent-topic", A.INIT_PRODUCER_ID, 4, _n(T_WRITE), lambda c: _INIT_IDEMPOTENT,
         "KIP-679: WRITE on any topic"),
    Case("add-partitions-to-txn", A.ADD_PARTITIONS_TO_TXN, 3, _n(X_WRITE, T_WRITE),
         lambda c: {"v3_and_below_transactional_id": c.names.txn, "v3_and_below_producer_id": PRODUCER_ID,
                    "v3_and_below_producer_epoch": 0,
                    "v3_and_below_topics": [{"name": c.names.topic, "partitions": [0]}]}),
    Case("add-partitions-to-txn-verify", A.ADD_PARTITIONS_TO_TXN, 4, _c(OP.CLUSTER_ACTION),
         lambda c: {"transactions": [{**_txn(verify_only=True)(c),
                                      "topics": [{"name": c.names.topic, "partitions": [0]}]}]},
         "v4+, the brokers' verification (KIP-890)"),
    Case("add-offsets-to-txn", A.ADD_OFFSETS_TO_TXN, 3, _n(X_WRITE, G_READ),
         lambda c: _txn(group_id=c.names.group)(c)),
    Case("end-txn", A.END_TXN, 3, _n(X_WRITE), _txn(committed=False)),
    Case("txn-offset-commit", A.TXN_OFFSET_COMMIT, 3, _n(X_WRITE, G_READ, T_READ),
         lambda c: _txn(group_id=c.names.group, generation_id=-1, member_id="", topics=_offsets(c))(c)),
    Case("write-txn-markers", A.WRITE_TXN_MARKERS, 1, _c(OP.CLUSTER_ACTION),
         lambda c: {"markers": [{"producer_id": PRODUCER_ID, "producer_epoch": 0, "transaction_result": False,
                                 "topics": [{"name": c.names.topic, "partition_indexes": [0]}],
                                 "coordinator_epoch": 0}]},
         "on the client listener"),
    # -- no ACL involved: the connection's own APIs
    Case("api-versions", A.API_VERSIONS, 3, (), None, "before and after authentication",
         variants={"unauthenticated": (), "none": (), "deny-all": ()}, flow="api-versions"),
    Case("sasl-handshake", A.SASL_HANDSHAKE, 1, (), None, "the mechanism named",
         variants={"scram-sha-512": (), "scram-sha-256": (), "unsupported-mechanism": ()},
         flow="sasl-handshake"),
    Case("sasl-authenticate", A.SASL_AUTHENTICATE, 2, (), None, "SCRAM-SHA-512, each message's answer",
         variants={"known-user": (), "wrong-password": (), "unknown-user": ()}, flow="sasl-authenticate"),
]  # fmt: skip

_names = [c.name for c in CASES]
assert len(set(_names)) == len(_names), "case names are unique"
assert all("_" not in n for n in _names), "no '_' in names: Kafka refuses topic names that collide on '.'/'_'"

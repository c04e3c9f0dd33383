"""Authorization of every Kafka API on the broker, with Kafka's rules and error codes.

Off unless the broker's ``authorizer.class.name`` names :class:`sluice.security.acl.AclAuthorizer`;
then :class:`BrokerAuthorizer` holds the ACL cache (``security.acl_store``) and decides for the
session of the connection being served (``security.session.current_session``).

Each API's check is a *guard* here, wrapped around its handler by :func:`guard_handlers`, so the
handlers themselves stay as they are: a guard answers a request that is refused as a whole
(GROUP_AUTHORIZATION_FAILED for a group operation ...), or hands the handler the request
without the topics, groups or resources the principal may not touch and adds their refusals to
the answer. What each API needs follows Kafka's KafkaApis:

===================  ===========================================================================
Produce              WRITE on each topic; with transactional records, WRITE on the transactional id
Fetch (consumer)     READ on the topic of every partition served, named or only in the fetch session,
                     on every fetch: ``fetch_denied_topics``, asked by handlers.fetch once the
                     session is known (a follower's fetch is the replication door's: CLUSTER_ACTION)
ListOffsets          DESCRIBE on each topic
Metadata             DESCRIBE on each topic; topics without it are left out of an all-topics answer
                     and answered TOPIC_AUTHORIZATION_FAILED when named; auto-creation needs CREATE
                     on the cluster or the topic
OffsetCommit         READ on the group, READ on each topic
OffsetFetch          DESCRIBE on the group, DESCRIBE on each topic (others left out of an all-topics answer)
FindCoordinator      DESCRIBE on the group (or transactional id)
Join/Sync/Heartbeat/LeaveGroup   READ on the group
DescribeGroups       DESCRIBE on each group
ListGroups           DESCRIBE on the cluster, else only the groups with DESCRIBE
DeleteGroups         DELETE on each group
CreateTopics         CREATE on the cluster or on each topic
DeleteTopics         DELETE on each topic
InitProducerId       IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679); with a
                     transactional id, WRITE on it
AddPartitionsToTxn   WRITE on the transactional id, WRITE on each topic; v4+ (brokers: KIP-890's
                     verification) CLUSTER_ACTION on the cluster
AddOffsetsToTxn      WRITE on the transactional id, READ on the group
EndTxn               WRITE on the transactional id
TxnOffsetCommit      WRITE on the transactional id, READ on the group, READ on each topic
WriteTxnMarkers      CLUSTER_ACTION on the cluster (only brokers write markers)
OffsetForLeaderEpoch CLUSTER_ACTION on the cluster, else DESCRIBE on each topic (KIP-320)
DescribeConfigs      DESCRIBE_CONFIGS on the topic, or on the cluster for a broker
DescribeAcls         DESCRIBE on the cluster; CreateAcls and DeleteAcls: ALTER on the cluster
admin APIs           CreatePartitions, AlterConfigs, DeleteRecords, ElectLeaders ...: the guards
                     of ``broker/authz_admin.py``
===================  ===========================================================================

ApiVersions is always allowed. Each refusal is logged at DEBUG, and at INFO at most once a minute
per principal, operation and resource, and counted in ``sluice_authorization_denied_total``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sluice import metrics
from sluice.broker.produce_validation import has_transactional_records
from sluice.metrics import api_name
from sluice.protocol.api import ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import (
    AclAuthorizer,
    AclSnapshot,
    AuthorizerConfig,
    Operation,
    Resource,
    ResourceType,
)
from sluice.security.acl_store import AclCache, AclStore
from sluice.security.session import Session, current_session

if TYPE_CHECKING:
    from sluice.broker.broker import Broker
    from sluice.broker.config import BrokerConfig
    from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.authz")

Body = dict[str, Any]
Handler = Callable[["Broker", RequestHeader, Body], Awaitable[Body | None]]
ZERO_UUID = uuid.UUID(int=0)
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
#: At most one INFO line per (principal, operation, resource) this often; DEBUG has every one.
DENIAL_INFO_INTERVAL_S = 60.0
DENIAL_LOG_KEYS_MAX = 1000
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


class BrokerAuthorizer:
    """The broker's authorizer: the ACL cache, the decision, and the record of refusals.

    ``authorize(session, op, resource)`` is what any request path calls (the replication door
    calls it for follower fetches with CLUSTER_ACTION on the cluster)."""

    def __init__(self, config: AuthorizerConfig, store: ZkStore) -> None:
        self.acls = AclStore(store)
        self.cache = AclCache(self.acls)
        self.acl = AclAuthorizer(config, self.cache.snapshot)
        self._last_info: dict[tuple[str, Operation, ResourceType, str], float] = {}

    def start(self) -> None:
        """Load the ACLs and follow their changes (blocking: before the listener serves)."""
        self.cache.start()

    def snapshot(self) -> AclSnapshot:
        return self.cache.snapshot()

    def authorize(
        self, session: Session, op: Operation, resource: Resource, *, api: str = "", quiet: bool = False
    ) -> bool:
        """May the session's principal do ``op`` on ``resource``? A refusal is logged and
        counted unless ``quiet`` (a listing leaving out what the principal may not see)."""
        decision = self.acl.decide(session, op, resource)
        if not decision.allowed and not quiet:
            self._denied(session, op, resource, decision.reason, api)
        return decision.allowed

    def authorize_by_resource_type(
        self, session: Session, op: Operation, rtype: ResourceType, *, api: str = ""
    ) -> bool:
        allowed = self.acl.authorize_by_resource_type(session, op, rtype)
        if not allowed:
            self._denied(session, op, Resource(rtype, "*any*"), "no_resource_of_type_allowed", api)
        return allowed

    def _denied(self, session: Session, op: Operation, resource: Resource, reason: str, api: str) -> None:
        metrics.AUTHORIZATION_DENIED.labels(api or "unknown", resource.type.name.lower()).inc()
        args = (session.principal, session.host, api, op.name, resource.type.name, resource.name, reason)
        template = (
            "event=authorization_denied principal=%s host=%s api=%s operation=%s resource_type=%s "
            "resource=%s reason=%s"
        )
        key = (session.principal, op, resource.type, resource.name)
        now = time.monotonic()
        last = self._last_info.get(key)
        if last is not None and now - last < DENIAL_INFO_INTERVAL_S:
            log.debug(template, *args)
            return
        if len(self._last_info) >= DENIAL_LOG_KEYS_MAX:
            self._last_info.clear()
        self._last_info[key] = now
        log.info(template, *args)


def make_authorizer(config: BrokerConfig, store: ZkStore) -> BrokerAuthorizer | None:
    """The broker's authorizer, or None when ``authorizer.class.name`` is empty."""
    if not config.authorizer:
        return None
    assert config.authorizer == AclAuthorizer.CLASS_NAME, config.authorizer
    return BrokerAuthorizer(
        AuthorizerConfig(frozenset(config.super_users), config.allow_everyone_if_no_acl_found), store
    )


def session() -> Session:
    """The session being served, with the client's address when the network layer gave none."""
    s = current_session.get()
    if s.host:
        return s
    from sluice.broker.server import current_client_host

    host = current_client_host.get()
    if not host:
        return s
    return Session(s.principal, s.listener, s.protocol, host)


class Check:
    """The checks of one request: its session and API name bound once."""

    __slots__ = ("api", "authorizer", "session")

    def __init__(self, authorizer: BrokerAuthorizer, session: Session, api: str) -> None:
        self.authorizer = authorizer
        self.session = session
        self.api = api

    def __call__(self, op: Operation, rtype: ResourceType, name: str, *, quiet: bool = False) -> bool:
        return self.authorizer.authorize(self.session, op, Resource(rtype, name), api=self.api, quiet=quiet)

    def cluster(self, op: Operation, *, quiet: bool = False) -> bool:
        return self.authorizer.authorize(self.session, op, Resource.cluster(), api=self.api, quiet=quiet)

    def topic(self, op: Operation, name: str, *, quiet: bool = False) -> bool:
        return self(op, ResourceType.TOPIC, name, quiet=quiet)

    def group(self, op: Operation, name: str) -> bool:
        return self(op, ResourceType.GROUP, name)

    def denied_topics(self, op: Operation, names: Iterable[str]) -> set[str]:
        return {n for n in set(names) if not self.topic(op, n)}


Guard = Callable[[Handler, "Broker", RequestHeader, Body, Check], Awaitable[Body | None]]


# -- per-API guards ---------------------------------------------------------------------------


async def _produce(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    txn_id = req.get("transactional_id")
    # Kafka's rule, from each partition's first batch: with exactly one batch per partition
    # (produce_validation.records_refusal, in the handler) that is every batch appended.
    if has_transactional_records(req) and (
        txn_id is None or not check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id)
    ):
        if req["acks"] == 0:
            return None
        return {
            "throttle_time_ms": 0,
            "responses": [
                {
                    "name": t["name"],
                    "partition_responses": [
                        {
                            "index": p["index"],
                            "error_code": TXN_DENIED,
                            "base_offset": -1,
                            "log_append_time_ms": -1,
                            "log_start_offset": -1,
                            "error_message": None,
                        }
                        for p in t["partition_data"]
                    ],
                }
                for t in req["topic_data"]
            ],
        }
    denied = check.denied_topics(Operation.WRITE, (t["name"] for t in req["topic_data"]))
    if not denied:
        return await handler(broker, header, req)
    refused = [t for t in req["topic_data"] if t["name"] in denied]
    response = await handler(
        broker, header, {**req, "topic_data": [t for t in req["topic_data"] if t["name"] not in denied]}
    )
    if response is None:
        return None
    response["responses"] = list(response["responses"]) + [
        {
            "name": t["name"],
            "partition_responses": [
                {
                    "index": p["index"],
                    "error_code": TOPIC_DENIED,
                    "base_offset": -1,
                    "log_append_time_ms": -1,
                    "log_start_offset": -1,
                    "error_message": None,
                }
                for p in t["partition_data"]
            ],
        }
        for t in refused
    ]
    return response


def fetch_denied_topics(broker: Broker, topics: Iterable[str]) -> set[str]:
    """Of ``topics``, those the session's principal may not READ: a consumer's Fetch, asked by
    ``handlers.fetch`` on every request for every partition it would serve, named in the request
    or only in its fetch session (an incremental fetch names none). Empty while authorization is
    off. A follower's fetch is the replication door's (``replica_access``)."""
    authorizer: BrokerAuthorizer | None = getattr(broker, "authorizer", None)  # test stubs have none
    if authorizer is None:
        return set()
    return Check(authorizer, session(), api_name(ApiKey.FETCH)).denied_topics(Operation.READ, topics)


async def _list_offsets(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    denied = check.denied_topics(Operation.DESCRIBE, (t["name"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    refused = [t for t in req["topics"] if t["name"] in denied]
    response = await handler(
        broker, header, {**req, "topics": [t for t in req["topics"] if t["name"] not in denied]}
    )
    assert response is not None
    response["topics"] = list(response["topics"]) + [
        {
            "name": t["name"],
            "partitions": [
                {
                    "partition_index": p["partition_index"],
                    "error_code": TOPIC_DENIED,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": -1,
                    "old_style_offsets": [],
                }
                for p in t["partitions"]
            ],
        }
        for t in refused
    ]
    return response


async def _metadata(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    requested = req.get("topics")
    if requested is None:  # every topic: leave out those the principal may not describe, silently
        response = await handler(broker, header, req)
        assert response is not None
        response["topics"] = [
            t for t in response["topics"] if check.topic(Operation.DESCRIBE, t["name"], quiet=True)
        ]
        return response
    existing = broker.metadata.topics()
    auto_create = bool(req.get("allow_auto_topic_creation")) and broker.config.auto_create_topics
    keep: list[Body] = []
    refused: list[str] = []
    may_create_any: bool | None = None
    for t in requested:
        name = t.get("name")
        if name is None:  # by topic id: the handler resolves it, or says it is unknown
            keep.append(t)
            continue
        if not check.topic(Operation.DESCRIBE, name):
            refused.append(name)
            continue
        if auto_create and name not in existing:
            if may_create_any is None:
                may_create_any = check.cluster(Operation.CREATE, quiet=True)
            if not may_create_any and not check.topic(Operation.CREATE, name):
                refused.append(name)
                continue
        keep.append(t)
    if not refused:
        return await handler(broker, header, req)
    response = await handler(broker, header, {**req, "topics": keep})
    assert response is not None
    # Named and refused: answered whether it exists or not, so its existence is not disclosed.
    response["topics"] = list(response["topics"]) + [
        {"error_code": TOPIC_DENIED, "name": n, "topic_id": ZERO_UUID, "is_internal": False, "partitions": []}
        for n in refused
    ]
    return response


async def _offset_commit(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
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

    if not check.group(Operation.READ, req["group_id"]):
        return {"throttle_time_ms": 0, "topics": answer(req["topics"], GROUP_DENIED)}
    denied = check.denied_topics(Operation.READ, (t["name"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    refused = answer([t for t in req["topics"] if t["name"] in denied], TOPIC_DENIED)
    allowed = [t for t in req["topics"] if t["name"] not in denied]
    if not allowed:
        return {"throttle_time_ms": 0, "topics": refused}
    response = await handler(broker, header, {**req, "topics": allowed})
    assert response is not None
    response["topics"] = list(response["topics"]) + refused
    return response


async def _offset_fetch(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    requested = req.get("topics")

    def refused_topic(name: str, partitions: Iterable[int], error: ErrorCode) -> Body:
        return {
            "name": name,
            "partitions": [
                {
                    "partition_index": p,
                    "committed_offset": -1,
                    "committed_leader_epoch": -1,
                    "metadata": "",
                    "error_code": error,
                }
                for p in partitions
            ],
        }

    if not check.group(Operation.DESCRIBE, req["group_id"]):
        return {
            "throttle_time_ms": 0,
            "error_code": GROUP_DENIED,
            "topics": [
                refused_topic(t["name"], t["partition_indexes"], GROUP_DENIED) for t in requested or []
            ],
        }
    if requested is None:  # every committed topic: leave out those the principal may not describe
        response = await handler(broker, header, req)
        assert response is not None
        response["topics"] = [
            t for t in response["topics"] if check.topic(Operation.DESCRIBE, t["name"], quiet=True)
        ]
        return response
    denied = check.denied_topics(Operation.DESCRIBE, (t["name"] for t in requested))
    if not denied:
        return await handler(broker, header, req)
    response = await handler(
        broker, header, {**req, "topics": [t for t in requested if t["name"] not in denied]}
    )
    assert response is not None
    response["topics"] = list(response["topics"]) + [
        refused_topic(t["name"], t["partition_indexes"], TOPIC_DENIED)
        for t in requested
        if t["name"] in denied
    ]
    return response


async def _find_coordinator(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    def allowed(key: str) -> bool:
        if req.get("key_type", 0) == 1:
            return check(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key)
        return check.group(Operation.DESCRIBE, key)

    error = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED if req.get("key_type", 0) == 1 else GROUP_DENIED
    refusal = {"error_code": error, "error_message": None, "node_id": -1, "host": "", "port": -1}
    if header.api_version < 4:
        if allowed(req.get("key", "")):
            return await handler(broker, header, req)
        return {"throttle_time_ms": 0, **refusal, "coordinators": []}
    keys = list(req.get("coordinator_keys") or [])
    denied = {k for k in keys if not allowed(k)}
    if not denied:
        return await handler(broker, header, req)
    found: dict[str, Body] = {}
    if len(denied) < len(keys):
        response = await handler(
            broker, header, {**req, "coordinator_keys": [k for k in keys if k not in denied]}
        )
        assert response is not None
        found = {c["key"]: c for c in response["coordinators"]}
    coordinators = [found[k] if k not in denied and k in found else {"key": k, **refusal} for k in keys]
    return {"throttle_time_ms": 0, **refusal, "coordinators": coordinators}


def _group_read(refusal: Callable[[RequestHeader, Body], Body]) -> Guard:
    """A guard for an API acting on one group, refused as a whole without READ on it."""

    async def guard(
        handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
    ) -> Body | None:
        if check.group(Operation.READ, req["group_id"]):
            return await handler(broker, header, req)
        return {"throttle_time_ms": 0, "error_code": GROUP_DENIED, **refusal(header, req)}

    return guard


_join_group = _group_read(
    lambda h, r: {
        "generation_id": -1,
        "member_id": r.get("member_id", ""),
        "leader": "",
        "protocol_name": None if h.api_version >= 7 else "",
        "members": [],
    }
)
_sync_group = _group_read(lambda h, r: {"assignment": b""})
_heartbeat = _group_read(lambda h, r: {})
_leave_group = _group_read(lambda h, r: {"members": []})


async def _describe_groups(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    groups = list(req["groups"])
    denied = {g for g in groups if not check.group(Operation.DESCRIBE, g)}
    if not denied:
        return await handler(broker, header, req)
    found: dict[str, Body] = {}
    if len(denied) < len(groups):
        response = await handler(broker, header, {**req, "groups": [g for g in groups if g not in denied]})
        assert response is not None
        found = {g["group_id"]: g for g in response["groups"]}
    refusal = {
        "error_code": GROUP_DENIED,
        "group_state": "",
        "protocol_type": "",
        "protocol_data": "",
        "members": [],
    }
    return {
        "throttle_time_ms": 0,
        "groups": [found.get(g, {"group_id": g, **refusal}) for g in groups],
    }


async def _list_groups(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    response = await handler(broker, header, req)
    if response is None or check.cluster(Operation.DESCRIBE, quiet=True):
        return response
    response["groups"] = [
        g
        for g in response["groups"]
        if check(Operation.DESCRIBE, ResourceType.GROUP, g["group_id"], quiet=True)
    ]
    return response


async def _delete_groups(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    names = list(req["groups_names"])
    denied = {g for g in names if not check(Operation.DELETE, ResourceType.GROUP, g)}
    if not denied:
        return await handler(broker, header, req)
    results: dict[str, Body] = {}
    if len(denied) < len(names):
        response = await handler(
            broker, header, {**req, "groups_names": [g for g in names if g not in denied]}
        )
        assert response is not None
        results = {r["group_id"]: r for r in response["results"]}
    return {
        "throttle_time_ms": 0,
        "results": [results.get(g, {"group_id": g, "error_code": GROUP_DENIED}) for g in names],
    }


async def _create_topics(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check.cluster(Operation.CREATE, quiet=True):
        return await handler(broker, header, req)
    topics = list(req["topics"])
    denied = check.denied_topics(Operation.CREATE, (t["name"] for t in topics))
    if not denied:
        return await handler(broker, header, req)
    results: dict[str, Body] = {}
    if len(denied) < len(topics):
        response = await handler(
            broker, header, {**req, "topics": [t for t in topics if t["name"] not in denied]}
        )
        assert response is not None
        results = {r["name"]: r for r in response["topics"]}
    refusal = {
        "error_code": TOPIC_DENIED,
        "error_message": "not authorized to create this topic",
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": [],
        "topic_id": ZERO_UUID,
    }
    return {
        "throttle_time_ms": 0,
        "topics": [
            results[t["name"]] if t["name"] in results else {"name": t["name"], **refusal} for t in topics
        ],
    }


async def _delete_topics(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    by_name = list(req.get("topic_names") or [])
    by_entry = list(req.get("topics") or [])

    def name_of(t: Body) -> str | None:
        name = t.get("name")
        if name is None and t.get("topic_id") not in (None, ZERO_UUID):
            found = broker.metadata.topic_by_id(t["topic_id"])
            name = found.name if found else None
        return name

    names = by_name + [n for n in (name_of(t) for t in by_entry) if n is not None]
    denied = check.denied_topics(Operation.DELETE, names)
    if not denied:
        return await handler(broker, header, req)
    response = await handler(
        broker,
        header,
        {
            **req,
            "topic_names": [n for n in by_name if n not in denied],
            "topics": [t for t in by_entry if name_of(t) not in denied],
        },
    )
    assert response is not None
    response["responses"] = list(response["responses"]) + [
        {
            "name": n,
            "error_code": TOPIC_DENIED,
            "error_message": "not authorized to delete this topic",
            "topic_id": ZERO_UUID,
        }
        for n in sorted(denied)
    ]
    return response


async def _init_producer_id(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    txn_id = req.get("transactional_id")
    if txn_id is not None:
        if check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
            return await handler(broker, header, req)
        return {"throttle_time_ms": 0, "error_code": TXN_DENIED, "producer_id": -1, "producer_epoch": -1}
    if check.cluster(Operation.IDEMPOTENT_WRITE, quiet=True) or check.authorizer.authorize_by_resource_type(
        check.session, Operation.WRITE, ResourceType.TOPIC, api=check.api
    ):
        return await handler(broker, header, req)
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        "producer_id": -1,
        "producer_epoch": -1,
    }


async def _offset_for_leader_epoch(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if req.get("replica_id", -1) >= 0 or check.cluster(Operation.CLUSTER_ACTION, quiet=True):
        return await handler(broker, header, req)  # a follower's: the replication door decides
    denied = check.denied_topics(Operation.DESCRIBE, (t["topic"] for t in req["topics"]))
    if not denied:
        return await handler(broker, header, req)
    response = await handler(
        broker, header, {**req, "topics": [t for t in req["topics"] if t["topic"] not in denied]}
    )
    assert response is not None
    response["topics"] = list(response["topics"]) + [
        {
            "topic": t["topic"],
            "partitions": [
                {
                    "error_code": TOPIC_DENIED,
                    "partition": p["partition"],
                    "leader_epoch": -1,
                    "end_offset": -1,
                }
                for p in t["partitions"]
            ],
        }
        for t in req["topics"]
        if t["topic"] in denied
    ]
    return response


async def _describe_configs(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    resources = list(req["resources"])
    refusals: dict[int, Body] = {}
    for i, r in enumerate(resources):
        rtype, name = r["resource_type"], r["resource_name"]
        if rtype == RESOURCE_TOPIC and not check.topic(Operation.DESCRIBE_CONFIGS, name):
            refusals[i] = {
                "error_code": TOPIC_DENIED,
                "error_message": "not authorized to describe its configs",
            }
        elif rtype == RESOURCE_BROKER and not check.cluster(Operation.DESCRIBE_CONFIGS):
            refusals[i] = {
                "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "not authorized to describe broker configs",
            }
    if not refusals:
        return await handler(broker, header, req)
    answered: list[Body] = []
    if len(refusals) < len(resources):
        response = await handler(
            broker, header, {**req, "resources": [r for i, r in enumerate(resources) if i not in refusals]}
        )
        assert response is not None
        answered = list(response["results"])
    results = []
    for i, r in enumerate(resources):
        if i in refusals:
            results.append(
                {
                    **refusals[i],
                    "resource_type": r["resource_type"],
                    "resource_name": r["resource_name"],
                    "configs": [],
                }
            )
        else:
            results.append(answered.pop(0))
    return {"throttle_time_ms": 0, "results": results}


async def _add_partitions_to_txn(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    from sluice.broker.txn_apis import partition_results

    if header.api_version >= 4:  # only brokers send these (KIP-890's verification among them)
        if check.cluster(Operation.CLUSTER_ACTION):
            return await handler(broker, header, req)
        return {
            "throttle_time_ms": 0,
            "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            "results_by_transaction": [],
        }
    topics = list(req["v3_and_below_topics"])
    keys = [(t["name"], p) for t in topics for p in t["partitions"]]
    if not check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req["v3_and_below_transactional_id"]):
        errors = dict.fromkeys(keys, TXN_DENIED)
    else:
        denied = check.denied_topics(Operation.WRITE, (t["name"] for t in topics))
        if not denied:
            return await handler(broker, header, req)
        # Kafka's rule: nothing is added; the allowed partitions were not attempted.
        errors = {k: TOPIC_DENIED if k[0] in denied else ErrorCode.OPERATION_NOT_ATTEMPTED for k in keys}
    return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": partition_results(topics, errors)}


async def _add_offsets_to_txn(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if not check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req["transactional_id"]):
        return {"throttle_time_ms": 0, "error_code": TXN_DENIED}
    if not check.group(Operation.READ, req["group_id"]):
        return {"throttle_time_ms": 0, "error_code": GROUP_DENIED}
    return await handler(broker, header, req)


async def _end_txn(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req["transactional_id"]):
        return await handler(broker, header, req)
    return {"throttle_time_ms": 0, "error_code": TXN_DENIED}


async def _txn_offset_commit(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    def answer(topics: list[Body], error: Callable[[str], ErrorCode]) -> list[Body]:
        return [
            {
                "name": t["name"],
                "partitions": [
                    {"partition_index": p["partition_index"], "error_code": error(t["name"])}
                    for p in t["partitions"]
                ],
            }
            for t in topics
        ]

    topics = list(req["topics"])
    if not check(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req["transactional_id"]):
        return {"throttle_time_ms": 0, "topics": answer(topics, lambda _: TXN_DENIED)}
    if not check.group(Operation.READ, req["group_id"]):
        return {"throttle_time_ms": 0, "topics": answer(topics, lambda _: GROUP_DENIED)}
    denied = check.denied_topics(Operation.READ, (t["name"] for t in topics))
    if not denied:
        return await handler(broker, header, req)
    refused = answer([t for t in topics if t["name"] in denied], lambda _: TOPIC_DENIED)
    allowed = [t for t in topics if t["name"] not in denied]
    if not allowed:
        return {"throttle_time_ms": 0, "topics": refused}
    response = await handler(broker, header, {**req, "topics": allowed})
    assert response is not None
    response["topics"] = list(response["topics"]) + refused
    return response


async def _write_txn_markers(
    handler: Handler, broker: Broker, header: RequestHeader, req: Body, check: Check
) -> Body | None:
    if check.cluster(Operation.CLUSTER_ACTION):
        return await handler(broker, header, req)
    return {
        "markers": [
            {
                "producer_id": m["producer_id"],
                "topics": [
                    {
                        "name": t["name"],
                        "partitions": [
                            {"partition_index": p, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED}
                            for p in t["partition_indexes"]
                        ],
                    }
                    for t in m["topics"]
                ],
            }
            for m in req["markers"]
        ]
    }


GUARDS: dict[int, Guard] = {
    ApiKey.PRODUCE: _produce,
    ApiKey.LIST_OFFSETS: _list_offsets,
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _join_group,
    ApiKey.SYNC_GROUP: _sync_group,
    ApiKey.HEARTBEAT: _heartbeat,
    ApiKey.LEAVE_GROUP: _leave_group,
    ApiKey.DESCRIBE_GROUPS: _describe_groups,
    ApiKey.LIST_GROUPS: _list_groups,
    ApiKey.DELETE_GROUPS: _delete_groups,
    ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DELETE_TOPICS: _delete_topics,
    ApiKey.INIT_PRODUCER_ID: _init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _offset_for_leader_epoch,
    ApiKey.DESCRIBE_CONFIGS: _describe_configs,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: _add_offsets_to_txn,
    ApiKey.END_TXN: _end_txn,
    ApiKey.TXN_OFFSET_COMMIT: _txn_offset_commit,
    ApiKey.WRITE_TXN_MARKERS: _write_txn_markers,
}
"""The guard of each API; APIs without one check for themselves (the ACL APIs, and Fetch, whose
partitions are known only once its fetch session is: ``fetch_denied_topics``) or need no
authorization (ApiVersions, and the SASL handshake that comes before any principal)."""


def guarded(key: int, handler: Handler, guard: Guard) -> Handler:
    name = api_name(key)

    async def run(broker: Broker, header: RequestHeader, req: Body) -> Body | None:
        authorizer: BrokerAuthorizer | None = getattr(broker, "authorizer", None)  # test stubs have none
        if authorizer is None:
            return await handler(broker, header, req)
        return await guard(handler, broker, header, req, Check(authorizer, session(), name))

    run.__name__ = getattr(handler, "__name__", name)
    run.__doc__ = handler.__doc__
    return run


def guard_handlers(
    handlers: dict[int, Handler], guards: Mapping[int, Guard] | None = None
) -> dict[int, Handler]:
    """``handlers`` with each guarded API wrapped in its guard (``guards``: GUARDS and any more;
    a guard costs one attribute read while authorization is off)."""
    table = GUARDS if guards is None else guards
    return {key: guarded(key, h, table[key]) if key in table else h for key, h in handlers.items()}


async def wait_for_acls(authorizer: BrokerAuthorizer, version: int, timeout_s: float = 5.0) -> None:
    """Let this broker's cache catch up with an ACL write it just made (its answer then agrees
    with its next DescribeAcls)."""
    if version >= 0:
        await asyncio.to_thread(authorizer.cache.wait_for, version, timeout_s)

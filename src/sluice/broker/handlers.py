"""Request handlers: one coroutine per Kafka API, from a decoded request dict to a response dict.

Handlers validate what the client sent, call the replica manager or the admin paths, and
answer with the error codes real clients understand. A handler never raises for bad client
input; an exception out of a handler is a Sluice bug, logged by the server, which then closes
that one connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from sluice.broker import (
    acl_apis,
    admin_cluster,
    admin_configs,
    admin_groups,
    admin_partitions,
    admin_records,
    produce_validation,
    scram_apis,
    txn_apis,
    txn_verification,
)
from sluice.broker.admin import missing_topic_error, validate_topic_name
from sluice.broker.admin_cluster import authorized_operations
from sluice.broker.authz import GUARDS, fetch_denied_topics, guard_handlers
from sluice.broker.authz_admin import ADMIN_GUARDS
from sluice.broker.fetch_sessions import (
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    PartitionRequest,
    PartitionResult,
    SessionOwner,
)
from sluice.broker.fetch_sessions import (
    Kind as FetchKind,
)
from sluice.broker.replica_access import claimed_replica_id
from sluice.broker.replica_manager import ProduceResult
from sluice.metrics import TRAFFIC
from sluice.protocol.api import SUPPORTED, ApiKey, RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.security.acl import Resource, ResourceType
from sluice.security.session import current_session

if TYPE_CHECKING:
    from sluice.broker.broker import Broker
    from sluice.broker.replica_access import ReplicaClaim
    from sluice.broker.replica_manager import FetchResult
    from sluice.cluster.view import PartitionInfo
    from sluice.protocol.records import BatchHeader
    from sluice.storage.producer_state import VerificationGuard

log = logging.getLogger("sluice.handlers")

Body = dict[str, Any]
Handler = Callable[["Broker", RequestHeader, Body], Awaitable[Body | None]]

ZERO_UUID = uuid.UUID(int=0)
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4


DUPLICATE_MESSAGE = "the request names this partition more than once; send each partition once"


def duplicated(keys: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
    """The partitions a request names more than once. Such a partition is answered
    INVALID_REQUEST and not acted on (as Kafka answers ListOffsets): two fetch positions or two
    batches for one partition in one request have no defined order."""
    seen: set[tuple[str, int]] = set()
    twice: set[tuple[str, int]] = set()
    for key in keys:
        (twice if key in seen else seen).add(key)
    return twice


#: APIs the connection answers itself (broker/authentication.py), not a handler.
CONNECTION_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


async def api_versions(broker: Broker, header: RequestHeader, req: Body) -> Body:
    # Advertise only what this broker handles, so clients never pick an API it would refuse.
    return {
        "error_code": ErrorCode.NONE,
        "api_keys": [
            {"api_key": int(k), "min_version": lo, "max_version": hi}
            for k, (lo, hi) in sorted(SUPPORTED.items())
            if k in HANDLERS or k in CONNECTION_APIS
        ],
        "throttle_time_ms": 0,
    }


async def find_coordinator(broker: Broker, header: RequestHeader, req: Body) -> Body:
    keys = req.get("coordinator_keys") or []
    single = header.api_version < 4
    if single:
        keys = [req.get("key", "")]
    coordinators = []
    key_type = req.get("key_type", 0)
    finder = broker.txn_coordinator if key_type == 1 else broker.coordinator
    for key in keys:
        error, message, node, host, port = finder.find_coordinator(key, key_type)
        if node >= 0:  # the coordinator's address on the listener this client came in on
            reg = broker.metadata.brokers().get(node)
            address = reg.endpoint(current_session.get().listener) if reg is not None else None
            if address is None:
                error, message, node, host, port = ErrorCode.COORDINATOR_NOT_AVAILABLE, None, -1, "", -1
            else:
                host, port = address
        coordinators.append(
            {
                "key": key,
                "node_id": node,
                "host": host,
                "port": port,
                "error_code": error,
                "error_message": message,
            }
        )
    first = (
        coordinators[0]
        if coordinators
        else {
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": None,
            "node_id": -1,
            "host": "",
            "port": -1,
        }
    )
    return {
        "throttle_time_ms": 0,
        "error_code": first["error_code"],
        "error_message": first["error_message"],
        "node_id": first["node_id"],
        "host": first["host"],
        "port": first["port"],
        "coordinators": coordinators if not single else [],
    }


async def join_group(broker: Broker, header: RequestHeader, req: Body) -> Body:
    from sluice.broker.server import current_client_host

    response = await broker.coordinator.join(
        req, header.api_version, header.client_id or "", current_client_host.get()
    )
    response.setdefault("generation_id", -1)
    response.setdefault("protocol_name", None if header.api_version >= 7 else "")
    response.setdefault("leader", "")
    response.setdefault("members", [])
    response.setdefault("member_id", req["member_id"])
    if header.api_version < 7 and response.get("protocol_name") is None:
        response["protocol_name"] = ""
    response["throttle_time_ms"] = 0
    return response


async def sync_group(broker: Broker, header: RequestHeader, req: Body) -> Body:
    response = await broker.coordinator.sync(req)
    response.setdefault("assignment", b"")
    response["throttle_time_ms"] = 0
    return response


async def heartbeat(broker: Broker, header: RequestHeader, req: Body) -> Body:
    return {"throttle_time_ms": 0, "error_code": broker.coordinator.heartbeat(req)}


async def leave_group(broker: Broker, header: RequestHeader, req: Body) -> Body:
    if header.api_version < 3:
        members = [{"member_id": req["member_id"], "group_instance_id": None}]
    else:
        members = req["members"]
    error, results = broker.coordinator.leave(
        req["group_id"], [(m["member_id"], m.get("group_instance_id")) for m in members]
    )
    if error is ErrorCode.NONE and header.api_version < 3 and results:
        error = results[0]
    return {
        "throttle_time_ms": 0,
        "error_code": error,
        "members": [
            {
                "member_id": m["member_id"],
                "group_instance_id": m.get("group_instance_id"),
                "error_code": results[i] if i < len(results) else error,
            }
            for i, m in enumerate(members)
        ],
    }


def refused_commits(
    requested: Iterable[tuple[str, int]], partition_counts: Mapping[str, int]
) -> dict[tuple[str, int], ErrorCode]:
    """The partitions of an OffsetCommit that are answered without committing: one named twice
    (which of two offsets would win is undefined: neither is committed), and one of a topic or
    partition that does not exist (``partition_counts``: the topics that do), which Kafka
    answers UNKNOWN_TOPIC_OR_PARTITION and stores nothing for."""
    keys = list(requested)
    refused = dict.fromkeys(duplicated(keys), ErrorCode.INVALID_REQUEST)
    for name, index in keys:
        if (name, index) not in refused and not 0 <= index < partition_counts.get(name, 0):
            refused[(name, index)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return refused


async def offset_commit(broker: Broker, header: RequestHeader, req: Body) -> Body:
    names = {t["name"] for t in req["topics"]}
    counts = {n: a.partition_count for n in names if (a := broker.metadata.topic(n)) is not None}
    refused = refused_commits(
        ((t["name"], p["partition_index"]) for t in req["topics"] for p in t["partitions"]), counts
    )
    if refused:
        kept = [
            {
                **t,
                "partitions": [
                    p for p in t["partitions"] if (t["name"], p["partition_index"]) not in refused
                ],
            }
            for t in req["topics"]
        ]
        kept = [t for t in kept if t["partitions"]]
        results = await broker.coordinator.commit_offsets({**req, "topics": kept}) if kept else {}
        results.update(refused)
    else:
        results = await broker.coordinator.commit_offsets(req)
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


async def offset_fetch(broker: Broker, header: RequestHeader, req: Body) -> Body:
    requested = req.get("topics")
    topics = None if requested is None else [(t["name"], list(t["partition_indexes"])) for t in requested]
    error, found = broker.coordinator.fetch_offsets(req["group_id"], topics)
    unstable = broker.coordinator.unstable_offsets(req["group_id"]) if req.get("require_stable") else set()
    if error is not ErrorCode.NONE:
        return {
            "throttle_time_ms": 0,
            "error_code": error,
            "topics": [
                {
                    "name": name,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": error,
                        }
                        for p in parts
                    ],
                }
                for name, parts in (topics or [])
            ],
        }
    out = []
    for name, parts in found.items():
        out.append(
            {
                "name": name,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": om.offset if om else -1,
                        "committed_leader_epoch": om.leader_epoch if om else -1,
                        "metadata": (om.metadata if om and om.metadata is not None else ""),
                        "error_code": (
                            ErrorCode.UNSTABLE_OFFSET_COMMIT if (name, p) in unstable else ErrorCode.NONE
                        ),
                    }
                    for p, om in parts
                ],
            }
        )
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "topics": out}


async def describe_groups(broker: Broker, header: RequestHeader, req: Body) -> Body:
    groups = [broker.coordinator.describe(g) for g in req["groups"]]
    if req.get("include_authorized_operations"):
        for g in groups:
            g["authorized_operations"] = authorized_operations(
                broker, Resource(ResourceType.GROUP, g["group_id"])
            )
    return {"throttle_time_ms": 0, "groups": groups}


async def list_groups(broker: Broker, header: RequestHeader, req: Body) -> Body:
    groups = broker.coordinator.list_groups(list(req.get("states_filter") or []))
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "groups": groups}


async def delete_groups(broker: Broker, header: RequestHeader, req: Body) -> Body:
    results = []
    for group_id in req["groups_names"]:
        results.append({"group_id": group_id, "error_code": await broker.coordinator.delete_group(group_id)})
    return {"throttle_time_ms": 0, "results": results}


def topic_metadata(
    name: str, topic_id: uuid.UUID, infos: list[PartitionInfo], live: Mapping[int, object]
) -> Body:
    """One topic's entry in a Metadata answer.

    A topic is answered only once this broker holds the state of every partition: until then it
    is "being created" (topic-level LEADER_NOT_AVAILABLE, no partitions), which every client
    retries. A partition listed with leader -1 means offline, and librdkafka takes that for a
    fixed fact until its metadata cache ages out (metadata.max.age.ms, 15 minutes): a consumer
    that asked for watermarks during the short window between a topic's znode and its first
    state got "Unknown partition" for as long. Kafka has no such window either: a ZooKeeper-mode
    broker learns a new topic from the controller's UpdateMetadata, leaders already elected; a
    KRaft broker from one batch holding the topic and its partitions' leaders.
    """
    if not infos or any(info.state is None for info in infos):
        return {
            "error_code": ErrorCode.LEADER_NOT_AVAILABLE,
            "name": name,
            "topic_id": topic_id,
            "is_internal": name.startswith("__"),
            "partitions": [],
        }
    partitions = []
    for info in infos:
        state = info.state
        assert state is not None
        error = (
            ErrorCode.NONE if state.leader >= 0 and state.leader in live else ErrorCode.LEADER_NOT_AVAILABLE
        )
        partitions.append(
            {
                "error_code": error,
                "partition_index": info.partition,
                "leader_id": state.leader if error is ErrorCode.NONE else -1,
                "leader_epoch": state.leader_epoch,
                "replica_nodes": list(info.replicas),
                "isr_nodes": list(state.isr),
                "offline_replicas": [r for r in info.replicas if r not in live],
            }
        )
    return {
        "error_code": ErrorCode.NONE,
        "name": name,
        "topic_id": topic_id,
        "is_internal": name.startswith("__"),
        "partitions": partitions,
    }


async def metadata(broker: Broker, header: RequestHeader, req: Body) -> Body:
    cache = broker.metadata
    requested = req.get("topics")
    all_topics = cache.topics()
    names: list[str | None]
    if requested is None:
        names = list(sorted(all_topics))
    else:
        names = []
        for t in requested:
            name = t.get("name")
            if name is None and t.get("topic_id") not in (None, ZERO_UUID):
                found = cache.topic_by_id(t["topic_id"])
                name = found.name if found else None
            names.append(name)
    if requested and req.get("allow_auto_topic_creation") and broker.config.auto_create_topics:
        missing = [n for n in names if n and n not in all_topics and validate_topic_name(n) is None]
        if missing:
            await broker.admin.auto_create(missing)
            all_topics = cache.topics()
    live = cache.brokers()
    topics: list[Body] = []
    for name in names:
        assignment = all_topics.get(name) if name else None
        if assignment is None:
            # a name no topic can have is answered INVALID_TOPIC_EXCEPTION, final for clients
            error = missing_topic_error(name)[0] if name is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            topics.append(
                {
                    "error_code": error,
                    "name": name,
                    "topic_id": ZERO_UUID,
                    "is_internal": False,
                    "partitions": [],
                }
            )
            continue
        topics.append(
            topic_metadata(assignment.name, assignment.topic_id, cache.partitions(assignment.name), live)
        )
    if req.get("include_topic_authorized_operations"):
        for t in topics:
            if t["name"] is not None:
                t["topic_authorized_operations"] = authorized_operations(
                    broker, Resource(ResourceType.TOPIC, t["name"])
                )
    return {
        "throttle_time_ms": 0,
        "brokers": [  # their addresses on the listener this client came in on (Kafka's rule)
            {"node_id": b.broker_id, "host": a[0], "port": a[1], "rack": b.rack}
            for b in sorted(live.values(), key=lambda b: b.broker_id)
            if (a := b.endpoint(current_session.get().listener)) is not None
        ],
        "cluster_id": cache.cluster_id,
        "controller_id": cache.controller_id,
        "topics": topics,
    }


def _produce_partition_response(index: int, result: ProduceResult) -> Body:
    return {
        "index": index,
        "error_code": result.error,
        "base_offset": result.base_offset,
        "log_append_time_ms": result.log_append_time,
        "log_start_offset": result.log_start_offset,
        "error_message": result.message,
    }


def _produce_refusal(index: int, error: ErrorCode, message: str | None = None) -> Body:
    return _produce_partition_response(index, ProduceResult(error, message=message))


def _produce_refused_whole(req: Body, error: ErrorCode) -> Body | None:
    """Every partition answered ``error``, nothing appended (Kafka's answer to a request it
    refuses as a whole)."""
    if req["acks"] == 0:
        return None
    return {
        "responses": [
            {
                "name": t["name"],
                "partition_responses": [_produce_refusal(p["index"], error) for p in t["partition_data"]],
            }
            for t in req["topic_data"]
        ],
        "throttle_time_ms": 0,
    }


async def produce(broker: Broker, header: RequestHeader, req: Body) -> Body | None:
    """Produce: each partition's one batch checked (``produce_validation``), a transactional
    batch that would open its transaction verified with the transaction coordinator (KIP-890
    part 1, ``txn_verification``), then appended; acks=all answers wait for replication."""
    acks = req["acks"]
    txn_id = req.get("transactional_id")
    # Each partition's batch headers, read once (a producer's request: one header each).
    found = [
        [produce_validation.batches(pd["records"]) for pd in t["partition_data"]] for t in req["topic_data"]
    ]
    if txn_id is None and produce_validation.any_transactional_first(h for per in found for h in per):
        # Kafka refuses transactional records without a transactional id, authorizer or not:
        # there is no transaction a coordinator could know them by.
        return _produce_refused_whole(req, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    producers = produce_validation.transactional_producers(h for per_topic in found for h in per_topic)
    if len(producers) > 1:
        return _produce_refused_whole(req, ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    answers: dict[tuple[str, int], Body] = {}
    accepted: list[tuple[str, int, Any, BatchHeader]] = []
    twice = duplicated((t["name"], pd["index"]) for t in req["topic_data"] for pd in t["partition_data"])
    for topic, topic_found in zip(req["topic_data"], found, strict=True):
        name = topic["name"]
        for pd, headers in zip(topic["partition_data"], topic_found, strict=True):
            key = (name, pd["index"])
            if key in twice:
                answers[key] = _produce_refusal(pd["index"], ErrorCode.INVALID_REQUEST, DUPLICATE_MESSAGE)
            elif acks not in (0, 1, -1):
                answers[key] = _produce_refusal(pd["index"], ErrorCode.INVALID_REQUIRED_ACKS)
            elif name.startswith("__"):
                answers[key] = _produce_refusal(
                    pd["index"],
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"{name} is internal: only the broker writes to it",
                )
            elif broker.metadata.topic(name) is None:
                error, message = missing_topic_error(name)
                answers[key] = _produce_refusal(pd["index"], error, message)
            elif (
                refusal := produce_validation.records_refusal(pd["records"], headers, header.api_version)
            ) is not None or (
                refusal := produce_validation.claims_refusal(headers[0], name, pd["index"])
            ) is not None:
                answers[key] = _produce_refusal(pd["index"], ErrorCode.INVALID_RECORD, refusal)
            else:
                accepted.append((name, pd["index"], pd["records"], headers[0]))
    guards = await _verify_transactional(broker, txn_id, producers, accepted, answers)
    waits: list[tuple[str, int, ProduceResult]] = []
    appended = 0  # record bytes (sluice_bytes_in_total)
    for name, index, records, _batch in accepted:
        key = (name, index)
        if key in answers:
            continue  # refused by the transaction's verification
        result = broker.replicas.append(
            name, index, records, required_acks=acks, verification=guards.get(key)
        )
        if result.error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and broker.metadata.topic(name) is None:
            error, message = missing_topic_error(name)  # deleted while it was being verified
            result = ProduceResult(error, message=message)
        if result.error is ErrorCode.NONE:
            appended += len(records)
            if acks == -1:
                waits.append((name, index, result))
        answers[key] = _produce_partition_response(index, result)
    TRAFFIC.bytes_in += appended
    if waits:
        # Every partition was appended first; now wait for all of them to be replicated at once.
        timeout_s = max(0, req["timeout_ms"]) / 1000.0
        outcomes = await asyncio.gather(
            *(
                broker.replicas.wait_replicated(name, index, result, timeout_s)
                for name, index, result in waits
            )
        )
        for (name, index, _), outcome in zip(waits, outcomes, strict=True):
            answers[(name, index)] = _produce_partition_response(index, outcome)
    if acks == 0:
        return None
    return {
        "responses": [
            {
                "name": t["name"],
                "partition_responses": [answers[(t["name"], pd["index"])] for pd in t["partition_data"]],
            }
            for t in req["topic_data"]
        ],
        "throttle_time_ms": 0,
    }


async def _verify_transactional(
    broker: Broker,
    txn_id: str | None,
    producers: set[tuple[int, int]],
    accepted: list[tuple[str, int, Any, BatchHeader]],
    answers: dict[tuple[str, int], Body],
) -> dict[tuple[str, int], VerificationGuard]:
    """KIP-890 part 1: for each accepted partition whose transactional batch would open its
    producer's transaction there, take the partition's verification guard and ask the
    transaction coordinator whether the transaction has added the partition; a partition it has
    not (or that cannot be asked about) is answered here. The guards of the others, for their
    appends."""
    if not producers or txn_id is None:
        return {}
    ((producer_id, producer_epoch),) = producers
    guards: dict[tuple[str, int], VerificationGuard] = {}
    for name, index, _records, batch in accepted:
        if not batch.is_transactional or batch.producer_id < 0:
            continue
        guard, error = broker.replicas.begin_txn_verification(name, index, producer_id)
        if error is not ErrorCode.NONE:
            answers[(name, index)] = _produce_refusal(index, error)
        elif guard is not None:
            guards[(name, index)] = guard
    if not guards:
        return guards
    verdicts = await broker.txn_verifier.verify(txn_id, producer_id, producer_epoch, list(guards))
    for key, error in verdicts.items():
        if error is not ErrorCode.NONE:
            code, message = txn_verification.produce_answer(error)
            answers[key] = _produce_refusal(key[1], code, message)
            guards.pop(key, None)
    return guards


def _fetch_topic_name(broker: Broker, t: Body) -> str:
    name = t.get("topic") or ""
    if not name and t.get("topic_id") not in (None, ZERO_UUID):
        found = broker.metadata.topic_by_id(t["topic_id"])
        name = found.name if found else ""
    return str(name)


async def fetch(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """Long-poll fetch, in or out of an incremental fetch session (KIP-227, ``fetch_sessions``).

    Every partition of the session is read, named in this request or not: a follower's position
    in one it did not name is the one it last named (it names every partition whose log end
    moved), and the leader must see it fetch there to keep it in the ISR. Only the answer is
    incremental; the long poll waits on, and wakes for, every partition of the session.
    """
    loop = asyncio.get_running_loop()
    replica_id = claimed_replica_id(header.api_version, req)
    max_wait_s = max(0, req["max_wait_ms"]) / 1000.0
    if replica_id >= 0:
        max_wait_s = min(max_wait_s, broker.replicas.follower_wait_cap_s())
    deadline = loop.time() + max_wait_s
    min_bytes = max(0, req["min_bytes"])
    # fetch.max.bytes caps every answer, whatever the request asks (a Fetch asking for 2 GB
    # must not make the broker build one).
    cap = broker.config.fetch_max_bytes
    max_bytes = min(req["max_bytes"], cap) if req.get("max_bytes", 0) > 0 else cap
    requested: dict[tuple[str, int], PartitionRequest] = {}
    topic_ids: dict[str, Any] = {}
    # A request as a follower is judged by the replication door (replica_access) on every
    # partition it would touch: the named ones here, before any session is opened for them (a
    # refused one is answered with its error and joins no session), and every session partition
    # again where it is read.
    claim = broker.replicas.replica_claim(replica_id) if replica_id >= 0 else None
    if claim is not None and not claim.may_replicate:
        return _refused_replica_fetch(header, req, claim)
    refused: dict[tuple[str, int], ErrorCode] = {}
    # Fetch v13+ names topics by id (KIP-516): an id this broker does not know is answered
    # UNKNOWN_TOPIC_ID and joins no session (two unknown ids must not become one nameless topic).
    unknown_ids = [t for t in req["topics"] if header.api_version >= 13 and not _fetch_topic_name(broker, t)]
    known = [t for t in req["topics"] if not any(t is u for u in unknown_ids)]
    twice = duplicated((_fetch_topic_name(broker, t), p["partition"]) for t in known for p in t["partitions"])
    for t in known:
        name = _fetch_topic_name(broker, t)
        topic_ids[name] = t.get("topic_id", ZERO_UUID)
        for p in t["partitions"]:
            key = (name, p["partition"])
            if key in twice:
                refused[key] = ErrorCode.INVALID_REQUEST
                continue
            if claim is not None:
                refusal = broker.replicas.replica_refusal(claim, key, p.get("current_leader_epoch", -1))
                if refusal is not ErrorCode.NONE:
                    refused[key] = refusal
                    continue
                # A follower names a partition whenever its log start moved (fetch sessions):
                # DeleteRecords waits on what it says (Partition.low_watermark).
                broker.replicas.note_follower_log_start(key, replica_id, p.get("log_start_offset", -1))
            requested[key] = PartitionRequest(
                p["fetch_offset"],
                min(p["partition_max_bytes"], cap),
                p.get("current_leader_epoch", -1),
                p.get("log_start_offset", -1),
                p.get("last_fetched_epoch", -1),
            )
    if claim is not None and any(e is not ErrorCode.INVALID_REQUEST for e in refused.values()):
        _log_refused_claim(claim, refused)
    sessions = header.api_version >= 7
    forgotten = [
        (_fetch_topic_name(broker, t), index)
        for t in (req.get("forgotten_topics_data") or [] if sessions else [])
        for index in t["partitions"]
    ]
    session_id = req.get("session_id", INVALID_SESSION_ID) if sessions else INVALID_SESSION_ID
    session_epoch = req.get("session_epoch", FINAL_EPOCH) if sessions else FINAL_EPOCH
    if refused:
        # A refused partition keeps no position in a session, while the fetcher believes it
        # sent one: an incremental request would then never name it again and get the
        # session's stale position forever (a follower refused while its registration lapsed
        # looped on "batch below the expected offset"). So the request is served without a
        # session and closes the one it names: the next request is a full one, naming all.
        session_epoch = FINAL_EPOCH
    asker = current_session.get()
    context = broker.fetch_sessions.open(
        session_id,
        session_epoch,
        requested,
        forgotten,
        privileged=claim is not None,
        owner=SessionOwner(asker.principal, asker.listener, replica_id),
    )
    if context.error is not ErrorCode.NONE:
        return _fetch_response(context.error, INVALID_SESSION_ID, [])
    partitions = context.partitions
    # A consumer reads only what it may READ now, on every fetch: the partitions it named and,
    # in a session, every partition the session serves though this request does not name it.
    # A refused one stays in the session (Kafka's rule): answered TOPIC_AUTHORIZATION_FAILED
    # while refused, served from the position the consumer sent once READ is granted.
    # (A follower's fetch is the replication door's: replica_access, per partition read.)
    denied: dict[tuple[str, int], ErrorCode] = {}
    if claim is None and partitions:
        unreadable = fetch_denied_topics(broker, {key[0] for key, _ in partitions})
        if unreadable:
            denied = {
                key: ErrorCode.TOPIC_AUTHORIZATION_FAILED for key, _ in partitions if key[0] in unreadable
            }
            partitions = [(key, p) for key, p in partitions if key not in denied]
    read_committed = req.get("isolation_level", 0) == 1
    # A follower's incremental fetch skips the partitions its last read left quiet and that are
    # unchanged since (see Partition.quiet_mark): an idle follower of thousands of partitions
    # then costs a few attribute reads per partition instead of a read each.
    quiet_ok = replica_id >= 0 and context.kind is FetchKind.INCREMENTAL
    while True:
        total = 0
        has_error = False
        read: dict[tuple[str, int], FetchResult] = {}
        results: dict[tuple[str, int], PartitionResult] = {}
        now_ms = time.monotonic() * 1000
        for key, p in partitions:
            if quiet_ok:
                assert claim is not None
                mark = context.quiet_mark(key)
                if mark is not None and broker.replicas.refresh_quiet_follower(key, claim, mark, now_ms):
                    continue
            remaining = max_bytes - total
            result = broker.replicas.read(
                key[0],
                key[1],
                p.fetch_offset,
                min(p.max_bytes, max(0, remaining)),
                p.current_leader_epoch,
                min_one_batch=(total == 0),
                replica=claim,
                read_committed=read_committed and claim is None,
            )
            size = result.size
            total += size
            has_error = has_error or result.error != ErrorCode.NONE
            read[key] = result
            results[key] = PartitionResult(
                result.error,
                result.high_watermark,
                result.last_stable_offset if result.last_stable_offset >= 0 else result.high_watermark,
                result.log_start_offset,
                size > 0,
            )
            if quiet_ok:
                context.set_quiet(
                    key,
                    broker.replicas.quiet_follower_mark(key, replica_id, p.fetch_offset)
                    if result.error is ErrorCode.NONE and size == 0
                    else None,
                )
        for key, refusal in denied.items():
            results[key] = PartitionResult(refusal, -1, -1, -1, False)
        now = loop.time()
        if total >= min_bytes or has_error or now >= deadline or not partitions:
            break
        if replica_id >= 0 and context.has_news(results):
            break
        waiter: asyncio.Future[None] = loop.create_future()
        broker.replicas.add_waiter([key for key, _ in partitions], waiter)
        if replica_id >= 0:
            broker.replicas.add_follower_fetch_waiter(waiter)
        try:
            await asyncio.wait_for(waiter, timeout=deadline - now)
        except TimeoutError:
            # No partition of the request changed while it waited (records, HW and leadership
            # changes all wake it): the reads above stand, and reading every partition again
            # would double what an idle fetch costs.
            break
        if broker.stopping:
            break
        if replica_id >= 0 and broker.replicas.follower_wait_cap_s() < max_wait_s:
            # This broker took on a leadership while the poll waited: answer now, so that the
            # follower's next fetch can add a partition it is to follow from now on.
            break
    answer = context.answer(results)
    if answer.error is not ErrorCode.NONE:
        return _fetch_response(answer.error, INVALID_SESSION_ID, [])
    responses: dict[str, list[Body]] = {}
    unknown_answers = [
        {
            "topic": "",
            "topic_id": t["topic_id"],
            "partitions": [
                _fetch_error_partition(p["partition"], ErrorCode.UNKNOWN_TOPIC_ID, read_committed)
                for p in t["partitions"]
            ],
        }
        for t in unknown_ids
    ]
    for key, refusal in refused.items():
        responses.setdefault(key[0], []).append(_fetch_error_partition(key[1], refusal, read_committed))
    sent = 0
    for key in answer.partitions:
        if key in denied:
            responses.setdefault(key[0], []).append(
                _fetch_error_partition(key[1], denied[key], read_committed)
            )
            continue
        result = read[key]
        sent += result.size
        responses.setdefault(key[0], []).append(
            {
                "partition_index": key[1],
                "error_code": result.error,
                "high_watermark": result.high_watermark,
                "last_stable_offset": (
                    result.last_stable_offset if result.last_stable_offset >= 0 else result.high_watermark
                ),
                "log_start_offset": result.log_start_offset,
                "aborted_transactions": (
                    [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in result.aborted]
                    if read_committed
                    else None
                ),
                "preferred_read_replica": -1,
                "records": result.records.records if result.records is not None else b"",
            }
        )
    if replica_id < 0:  # a consumer's: replication is not bytes out (Kafka's BytesOutPerSec)
        TRAFFIC.bytes_out += sent
    return _fetch_response(
        ErrorCode.NONE,
        answer.session_id,
        [
            {
                "topic": name,
                # only v13+ carries ids (and a follower's fetch of thousands of topics is older)
                "topic_id": _topic_id(broker, name, topic_ids) if header.api_version >= 13 else ZERO_UUID,
                "partitions": parts,
            }
            for name, parts in responses.items()
        ]
        + unknown_answers,
    )


def _refused_replica_fetch(header: RequestHeader, req: Body, claim: ReplicaClaim) -> Body:
    """A Fetch claiming a replica id from a connection that may not replicate (replica_access):
    every partition it names is answered TOPIC_AUTHORIZATION_FAILED, as it named it, before any
    topic is looked up, so the answer is the same whether the topic exists or not; no session
    is opened or touched."""
    refused = {
        (str(t.get("topic") or t.get("topic_id")), int(p["partition"])): ErrorCode.TOPIC_AUTHORIZATION_FAILED
        for t in req["topics"]
        for p in t["partitions"]
    }
    if refused:
        _log_refused_claim(claim, refused)
    read_committed = req.get("isolation_level", 0) == 1
    denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
    return _fetch_response(
        ErrorCode.NONE,
        INVALID_SESSION_ID,
        [
            {
                "topic": t.get("topic", ""),
                "topic_id": t.get("topic_id", ZERO_UUID) if header.api_version >= 13 else ZERO_UUID,
                "partitions": [
                    _fetch_error_partition(p["partition"], denied, read_committed) for p in t["partitions"]
                ],
            }
            for t in req["topics"]
        ],
    )


def _topic_id(broker: Broker, name: str, named: Mapping[str, Any]) -> Any:
    """The id of a topic in a Fetch answer: the one the request named it by, else (a partition
    only in the fetch session) the topic's current id."""
    given = named.get(name, ZERO_UUID)
    if given not in (None, ZERO_UUID):
        return given
    assignment = broker.metadata.topic(name)
    return assignment.topic_id if assignment is not None else ZERO_UUID


#: Replica ids whose refused requests were last logged when (monotonic s): a client asking in a
#: loop, or a follower whose registration lapsed, logs once per REFUSAL_LOG_INTERVAL_S.
_refusals_logged: dict[int, float] = {}
REFUSAL_LOG_INTERVAL_S = 10.0


def _log_refused_claim(claim: ReplicaClaim, refused: Mapping[tuple[str, int], ErrorCode]) -> None:
    now = time.monotonic()
    if now - _refusals_logged.get(claim.replica_id, -REFUSAL_LOG_INTERVAL_S) < REFUSAL_LOG_INTERVAL_S:
        return
    if len(_refusals_logged) >= 1024:  # bounded: replica ids are whatever clients send
        _refusals_logged.clear()
    _refusals_logged[claim.replica_id] = now
    (topic, index), error = next(iter(refused.items()))
    log.info(
        "event=replica_request_refused replica_id=%d host=%s listener=%s principal=%s live=%s "
        "partitions=%d first=%s-%d error=%s",
        claim.replica_id,
        claim.session.host,
        claim.session.listener,
        claim.session.principal,
        claim.replica_id in claim.live_brokers,
        len(refused),
        topic,
        index,
        error.name,
    )


def _fetch_error_partition(index: int, error: ErrorCode, read_committed: bool) -> Body:
    return {
        "partition_index": index,
        "error_code": error,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": [] if read_committed else None,
        "preferred_read_replica": -1,
        "records": b"",
    }


def _fetch_response(error: ErrorCode, session_id: int, responses: list[Body]) -> Body:
    return {"throttle_time_ms": 0, "error_code": error, "session_id": session_id, "responses": responses}


async def list_offsets(broker: Broker, header: RequestHeader, req: Body) -> Body:
    topics = []
    twice = duplicated((t["name"], p["partition_index"]) for t in req["topics"] for p in t["partitions"])
    for t in req["topics"]:
        parts = []
        for p in t["partitions"]:
            if (t["name"], p["partition_index"]) in twice:
                error, ts, offset, epoch = ErrorCode.INVALID_REQUEST, -1, -1, -1
            else:
                error, ts, offset, epoch = broker.replicas.list_offset(
                    t["name"],
                    p["partition_index"],
                    p["timestamp"],
                    p.get("current_leader_epoch", -1),
                    read_committed=req.get("isolation_level", 0) == 1,
                )
            parts.append(
                {
                    "partition_index": p["partition_index"],
                    "error_code": error,
                    "timestamp": ts,
                    "offset": offset,
                    "leader_epoch": epoch,
                    "old_style_offsets": [offset] if offset >= 0 else [],
                }
            )
        topics.append({"name": t["name"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


async def offset_for_leader_epoch(broker: Broker, header: RequestHeader, req: Body) -> Body:
    """KIP-101/KIP-279: the end offset of a leader epoch, which a follower (or a consumer after
    a leader change) truncates to before fetching, so replicas never diverge (I2)."""
    replica_id = req.get("replica_id", -1)
    # A follower's question is judged by the replication door like its fetches (replica_access):
    # from a connection that may not replicate, every partition is refused alike, found or not.
    claim = broker.replicas.replica_claim(replica_id) if replica_id >= 0 else None
    if claim is not None and not claim.may_replicate:
        denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        named = {(t["topic"], p["partition"]): denied for t in req["topics"] for p in t["partitions"]}
        if named:
            _log_refused_claim(claim, named)
        return {
            "throttle_time_ms": 0,
            "topics": [
                {
                    "topic": t["topic"],
                    "partitions": [
                        {
                            "error_code": denied,
                            "partition": i["partition"],
                            "leader_epoch": -1,
                            "end_offset": -1,
                        }
                        for i in t["partitions"]
                    ],
                }
                for t in req["topics"]
            ],
        }
    topics = []
    for t in req["topics"]:
        parts = []
        for p in t["partitions"]:
            error, epoch, end_offset = broker.replicas.end_offset_for_epoch(
                t["topic"],
                p["partition"],
                p["leader_epoch"],
                p.get("current_leader_epoch", -1),
                replica=claim,
            )
            parts.append(
                {
                    "error_code": error,
                    "partition": p["partition"],
                    "leader_epoch": epoch,
                    "end_offset": end_offset,
                }
            )
        topics.append({"topic": t["topic"], "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


async def create_topics(broker: Broker, header: RequestHeader, req: Body) -> Body:
    results = await broker.admin.create_topics(
        req["topics"], req.get("timeout_ms", 30000), req.get("validate_only", False)
    )
    return {"throttle_time_ms": 0, "topics": results}


async def delete_topics(broker: Broker, header: RequestHeader, req: Body) -> Body:
    names: list[str] = list(req.get("topic_names") or [])
    for t in req.get("topics") or []:
        name = t.get("name")
        if name is None and t.get("topic_id") not in (None, ZERO_UUID):
            found = broker.metadata.topic_by_id(t["topic_id"])
            name = found.name if found else None
        if name is not None:
            names.append(name)
    results = await broker.admin.delete_topics(names, req.get("timeout_ms", 30000))
    return {"throttle_time_ms": 0, "responses": results}


async def init_producer_id(broker: Broker, header: RequestHeader, req: Body) -> Body:
    if req.get("transactional_id") is not None:
        return await txn_apis.init_transactional_producer_id(broker, header, req)
    pid = req.get("producer_id", -1)
    epoch = req.get("producer_epoch", -1)
    if pid is not None and pid >= 0:
        # KIP-360: an idempotent producer may bump its epoch to reset its sequence numbers.
        if epoch >= 32766:
            pid, epoch = await broker.producer_ids.next_id(), 0
        else:
            epoch += 1
    else:
        pid, epoch = await broker.producer_ids.next_id(), 0
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "producer_id": pid, "producer_epoch": epoch}


async def describe_configs(broker: Broker, header: RequestHeader, req: Body) -> Body:
    results = []
    for res in req["resources"]:
        rtype, rname = res["resource_type"], res["resource_name"]
        keys = res.get("configuration_keys")
        if rtype == RESOURCE_TOPIC:
            entries, error, message = broker.admin.describe_topic_config(rname)
        elif rtype == RESOURCE_BROKER:
            entries, error, message = admin_configs.describe_broker_config(broker, rname)
        else:
            entries, error, message = [], ErrorCode.INVALID_REQUEST, f"resource type {rtype} is not supported"
        if keys is not None:
            entries = [e for e in entries if e["name"] in keys]
        if not req.get("include_documentation"):
            # Kafka sends a config's documentation only when asked (DescribeConfigs v3+)
            entries = [{**e, "documentation": None} for e in entries]
        results.append(
            {
                "error_code": error,
                "error_message": message,
                "resource_type": rtype,
                "resource_name": rname,
                "configs": entries,
            }
        )
    return {"throttle_time_ms": 0, "results": results}


HANDLERS: dict[int, Handler] = {
    ApiKey.API_VERSIONS: api_versions,
    ApiKey.METADATA: metadata,
    ApiKey.PRODUCE: produce,
    ApiKey.FETCH: fetch,
    ApiKey.LIST_OFFSETS: list_offsets,
    ApiKey.CREATE_TOPICS: create_topics,
    ApiKey.DELETE_TOPICS: delete_topics,
    ApiKey.INIT_PRODUCER_ID: init_producer_id,
    ApiKey.DESCRIBE_CONFIGS: describe_configs,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: offset_for_leader_epoch,
    ApiKey.FIND_COORDINATOR: find_coordinator,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.SYNC_GROUP: sync_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.DESCRIBE_GROUPS: describe_groups,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.DELETE_GROUPS: delete_groups,
}
HANDLERS.update(
    {
        ApiKey.DESCRIBE_ACLS: acl_apis.describe_acls,
        ApiKey.CREATE_ACLS: acl_apis.create_acls,
        ApiKey.DELETE_ACLS: acl_apis.delete_acls,
        ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: scram_apis.describe_user_scram_credentials,
        ApiKey.ALTER_USER_SCRAM_CREDENTIALS: scram_apis.alter_user_scram_credentials,
    }
)
HANDLERS.update(
    {
        ApiKey.ADD_PARTITIONS_TO_TXN: txn_apis.add_partitions_to_txn,
        ApiKey.ADD_OFFSETS_TO_TXN: txn_apis.add_offsets_to_txn,
        ApiKey.END_TXN: txn_apis.end_txn,
        ApiKey.WRITE_TXN_MARKERS: txn_apis.write_txn_markers,
        ApiKey.TXN_OFFSET_COMMIT: txn_apis.txn_offset_commit,
        ApiKey.CREATE_PARTITIONS: admin_partitions.create_partitions,
        ApiKey.ELECT_LEADERS: admin_partitions.elect_leaders,
        ApiKey.ALTER_PARTITION_REASSIGNMENTS: admin_partitions.alter_partition_reassignments,
        ApiKey.LIST_PARTITION_REASSIGNMENTS: admin_partitions.list_partition_reassignments,
        ApiKey.ALTER_CONFIGS: admin_configs.alter_configs,
        ApiKey.INCREMENTAL_ALTER_CONFIGS: admin_configs.incremental_alter_configs,
        ApiKey.DELETE_RECORDS: admin_records.delete_records,
        ApiKey.DESCRIBE_LOG_DIRS: admin_records.describe_log_dirs,
        ApiKey.DESCRIBE_PRODUCERS: admin_records.describe_producers,
        ApiKey.DESCRIBE_CLUSTER: admin_cluster.describe_cluster,
        ApiKey.OFFSET_DELETE: admin_groups.offset_delete,
    }
)
# Authorization (broker/authz.py, broker/authz_admin.py) wraps each API's handler here, so the
# handlers above stay as they are; while no authorizer is configured a guard only reads
# broker.authorizer.
HANDLERS.update(guard_handlers(HANDLERS, {**GUARDS, **ADMIN_GUARDS}))


def now_ms() -> int:
    return int(time.time() * 1000)

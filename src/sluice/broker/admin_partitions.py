"""CreatePartitions (KIP-195), ElectLeaders (KIP-460), AlterPartitionReassignments and
ListPartitionReassignments (KIP-455): the handlers of the admin APIs the controller carries out.

Each request that changes the cluster is answered NOT_CONTROLLER by a broker that is not the
controller (Kafka's admin clients send these to the controller named in Metadata, and retry on
that answer); on the controller, it is handed to the controller's thread
(``Controller.run_admin``), which decides with the pure rules and writes through its fenced gate
(``cluster/admin_requests.py``). The handler then waits, up to the request's timeout, until this
broker's view shows the effect (new partitions with leaders), as Kafka answers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from sluice.cluster import admin_requests
from sluice.cluster.controller import Controller, ControllerTerm, NotControllerError
from sluice.cluster.election import PREFERRED, UNCLEAN
from sluice.cluster.reassignment import ReassignmentRequest, ongoing_reassignments
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

log = logging.getLogger("sluice.admin")

Body = dict[str, Any]
Key = tuple[str, int]
NOT_CONTROLLER_MESSAGE = "this broker is not the controller; ask the controller named in Metadata"
#: How long an admin request may wait for the controller's thread when it names no timeout.
DEFAULT_TIMEOUT_MS = 30_000


class _Refused(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


async def _on_controller(
    broker: BrokerContext, job: Callable[[Controller, ControllerTerm], Any], timeout_ms: int
) -> Any:
    """Run ``job`` on the controller's thread; _Refused with NOT_CONTROLLER or REQUEST_TIMED_OUT."""
    if not broker.controller.is_active:
        raise _Refused(ErrorCode.NOT_CONTROLLER, NOT_CONTROLLER_MESSAGE)
    future = broker.controller.run_admin(job)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), max(0.001, timeout_ms / 1000.0))
    except NotControllerError as exc:
        raise _Refused(ErrorCode.NOT_CONTROLLER, str(exc)) from None
    except TimeoutError:
        raise _Refused(
            ErrorCode.REQUEST_TIMED_OUT,
            "the controller did not get to the request within its timeout; it may still be carried out",
        ) from None


async def _wait_until(condition: Callable[[], bool], deadline: float) -> bool:
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _timeout_ms(req: Body) -> int:
    value = int(req.get("timeout_ms", DEFAULT_TIMEOUT_MS))
    return value if value > 0 else DEFAULT_TIMEOUT_MS


def _duplicates(names: Iterable[Any]) -> set[Any]:
    seen: set[Any] = set()
    twice: set[Any] = set()
    for name in names:
        (twice if name in seen else seen).add(name)
    return twice


# -- CreatePartitions --------------------------------------------------------------------------


def _has_leaders(broker: BrokerContext, topic: str, count: int) -> bool:
    """The view holds ``count`` partitions of ``topic``, each with a leader (and the ones this
    broker leads are led here already)."""
    parts = broker.metadata.partitions(topic)
    me = broker.config.broker_id
    return len(parts) >= count and all(
        p.state is not None
        and p.state.leader >= 0
        and (p.state.leader != me or broker.replicas.leads(topic, p.partition))
        for p in parts
    )


async def create_partitions(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    timeout_ms = _timeout_ms(req)
    deadline = time.monotonic() + timeout_ms / 1000.0
    validate_only = bool(req.get("validate_only"))
    twice = _duplicates(t["name"] for t in req["topics"])
    results: list[Body] = []
    for t in req["topics"]:
        name, count = t["name"], t["count"]
        if name in twice:
            results.append(_topic_result(name, ErrorCode.INVALID_REQUEST, "the topic is named twice"))
            continue
        raw = t.get("assignments")
        assignments = None if raw is None else [tuple(a["broker_ids"]) for a in raw]

        def job(controller: Controller, term: ControllerTerm, name: str = name, count: int = count,
                assignments: list[tuple[int, ...]] | None = assignments) -> Any:  # fmt: skip
            return admin_requests.add_partitions(
                controller, term, name, count, assignments, validate_only=validate_only
            )

        try:
            growth = await _on_controller(broker, job, max(1, int((deadline - time.monotonic()) * 1000)))
        except _Refused as refused:
            results.append(_topic_result(name, refused.error, refused.message))
            continue
        if growth.error is not ErrorCode.NONE:
            results.append(_topic_result(name, growth.error, growth.message))
            continue
        if not validate_only and not await _wait_until(partial(_has_leaders, broker, name, count), deadline):
            results.append(
                _topic_result(
                    name,
                    ErrorCode.REQUEST_TIMED_OUT,
                    "the partitions were added but not all have a leader yet; they will shortly",
                )
            )
            continue
        results.append(_topic_result(name, ErrorCode.NONE, None))
    return {"throttle_time_ms": 0, "results": results}


def _topic_result(name: str, error: ErrorCode, message: str | None) -> Body:
    return {"name": name, "error_code": error, "error_message": message}


# -- ElectLeaders --------------------------------------------------------------------------------


async def elect_leaders(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    election_type = int(req.get("election_type", PREFERRED)) if header.api_version >= 1 else PREFERRED
    requested = req.get("topic_partitions")
    wanted: list[Key] | None = (
        None if requested is None else [(t["topic"], int(p)) for t in requested for p in t["partitions"]]
    )
    if election_type not in (PREFERRED, UNCLEAN):
        return _elect_answer(header, ErrorCode.INVALID_REQUEST, wanted or [], {})

    def job(controller: Controller, term: ControllerTerm) -> Any:
        keys = admin_requests.all_partitions(controller) if wanted is None else wanted
        return admin_requests.elect_leaders(controller, term, keys, election_type)

    try:
        results = await _on_controller(broker, job, _timeout_ms(req))
    except _Refused as refused:
        return _elect_answer(header, refused.error, wanted or [], {}, refused.message)
    if wanted is None:
        # Every partition was asked about: those that needed no election are left out.
        results = {k: v for k, v in results.items() if v[0] is not ErrorCode.ELECTION_NOT_NEEDED}
    return _elect_answer(header, ErrorCode.NONE, list(results), results)


def _elect_answer(
    header: RequestHeader,
    error: ErrorCode,
    keys: list[Key],
    results: dict[Key, tuple[ErrorCode, str | None]],
    message: str | None = None,
) -> Body:
    by_topic: dict[str, list[Body]] = {}
    for topic, p in keys:
        code, why = results.get((topic, p), (error, message))
        by_topic.setdefault(topic, []).append({"partition_id": p, "error_code": code, "error_message": why})
    return {
        "throttle_time_ms": 0,
        # v0 has no top-level code: a refusal of the whole request is each partition's
        "error_code": error,
        "replica_election_results": [
            {"topic": topic, "partition_result": parts} for topic, parts in by_topic.items()
        ],
    }


# -- AlterPartitionReassignments, ListPartitionReassignments --------------------------------------


async def alter_partition_reassignments(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    requests = [
        ReassignmentRequest(
            t["name"], int(p["partition_index"]), None if p["replicas"] is None else tuple(p["replicas"])
        )
        for t in req["topics"]
        for p in t["partitions"]
    ]
    twice = _duplicates((r.topic, r.partition) for r in requests)
    allowed = [r for r in requests if (r.topic, r.partition) not in twice]
    allow_rf_change = bool(req.get("allow_replication_factor_change", True))

    def job(controller: Controller, term: ControllerTerm) -> Any:
        return admin_requests.alter_reassignments(
            controller, term, allowed, allow_replication_factor_change=allow_rf_change
        )

    try:
        results = await _on_controller(broker, job, _timeout_ms(req)) if allowed else {}
    except _Refused as refused:
        return {
            "throttle_time_ms": 0,
            "allow_replication_factor_change": allow_rf_change,
            "error_code": refused.error,
            "error_message": refused.message,
            "responses": [],
        }
    for key in twice:
        results[key] = (ErrorCode.INVALID_REQUEST, "the partition is named twice")
    by_topic: dict[str, list[Body]] = {}
    for r in requests:
        code, why = results[(r.topic, r.partition)]
        by_topic.setdefault(r.topic, []).append(
            {"partition_index": r.partition, "error_code": code, "error_message": why}
        )
    return {
        "throttle_time_ms": 0,
        "allow_replication_factor_change": allow_rf_change,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "responses": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
    }


async def list_partition_reassignments(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    """Answered by any broker from ``/admin/reassign_partitions`` and its view of the topics."""
    found = await asyncio.to_thread(broker.store.reassignment_request)
    pending = found[0] if found is not None else []
    requested = req.get("topics")
    wanted = (
        None
        if requested is None
        else {(t["name"], int(p)) for t in requested for p in t["partition_indexes"]}
    )
    by_topic: dict[str, list[Body]] = {}
    for o in ongoing_reassignments(pending, broker.metadata.topics()):
        if wanted is not None and (o.topic, o.partition) not in wanted:
            continue
        by_topic.setdefault(o.topic, []).append(
            {
                "partition_index": o.partition,
                "replicas": list(o.replicas),
                "adding_replicas": list(o.adding),
                "removing_replicas": list(o.removing),
            }
        )
    return {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "topics": [{"name": name, "partitions": parts} for name, parts in sorted(by_topic.items())],
    }

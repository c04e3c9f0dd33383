"""AlterConfigs and IncrementalAlterConfigs (KIP-339) for topics and brokers, and the broker
part of DescribeConfigs.

A topic's configs are written into its znode by compare-and-set (``ZkStore.update_topic_config``):
every broker follows the znode through its view and applies the change to its replicas at once
(``ReplicaManager.reconfigure``). A broker's dynamic configs go to ``/config/brokers/<id>``, the
cluster's to ``/config/brokers/<default>`` (``ZkStore.update_dynamic_broker_config``), which
every broker follows (``broker/dynamic_config.py``). What to store is decided by the pure
functions of ``broker/config_alteration.py``, validated whole before anything is written: an
unknown key or a bad value is answered INVALID_CONFIG naming the key, and nothing changes. The
answer waits (a few seconds at most) until this broker applies the change, so its next
DescribeConfigs shows it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.broker.admin import validate_topic_config, warn_deprecated_configs
from sluice.broker.config import BROKER_SETTINGS, log_default_keys
from sluice.broker.config_alteration import (
    SET,
    ConfigOp,
    ConfigRefusal,
    apply_full,
    apply_incremental,
    broker_config_refusal,
)
from sluice.cluster import layout
from sluice.cluster.layout import TopicAssignment
from sluice.protocol.api import RequestHeader
from sluice.protocol.errors import ErrorCode
from sluice.storage.config import known_topic_configs

if TYPE_CHECKING:
    from sluice.broker.context import BrokerContext

log = logging.getLogger("sluice.admin")

Body = dict[str, Any]
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
#: How long an answer waits for this broker to apply what it wrote.
APPLIED_WAIT_S = 10.0


async def alter_configs(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    return await _alter(broker, req, incremental=False)


async def incremental_alter_configs(broker: BrokerContext, header: RequestHeader, req: Body) -> Body:
    return await _alter(broker, req, incremental=True)


async def _alter(broker: BrokerContext, req: Body, *, incremental: bool) -> Body:
    validate_only = bool(req.get("validate_only"))
    keys = [(r["resource_type"], r["resource_name"]) for r in req["resources"]]
    twice = {k for k in keys if keys.count(k) > 1}
    responses = []
    for res in req["resources"]:
        rtype, rname = res["resource_type"], res["resource_name"]
        ops = [
            ConfigOp(c["name"], int(c.get("config_operation", SET)) if incremental else SET, c.get("value"))
            for c in res["configs"]
        ]
        error: ErrorCode
        message: str | None
        if (rtype, rname) in twice:
            error, message = ErrorCode.INVALID_REQUEST, "the resource is named twice in one request"
        elif rtype == RESOURCE_TOPIC:
            error, message = await _alter_topic(broker, rname, ops, incremental, validate_only)
        elif rtype == RESOURCE_BROKER:
            error, message = await _alter_broker(broker, rname, ops, incremental, validate_only)
        else:
            error, message = (
                ErrorCode.INVALID_REQUEST,
                f"resource type {rtype} cannot be altered here (topics: 2, brokers: 4)",
            )
        responses.append(
            {"error_code": error, "error_message": message, "resource_type": rtype, "resource_name": rname}
        )
    return {"throttle_time_ms": 0, "responses": responses}


def _new_config(current: dict[str, str], ops: list[ConfigOp], incremental: bool) -> dict[str, str]:
    if incremental:
        defaults = {k: v for k, (v, _) in known_topic_configs().items()}
        return apply_incremental(current, ops, defaults)
    return apply_full(ops)


async def _alter_topic(
    broker: BrokerContext, name: str, ops: list[ConfigOp], incremental: bool, validate_only: bool
) -> tuple[ErrorCode, str | None]:
    if broker.metadata.topic(name) is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"

    def change(current: TopicAssignment) -> dict[str, str] | None:
        new = _new_config(dict(current.config), ops, incremental)
        factor = min((len(r) for r in current.replicas.values()), default=1)
        problem = validate_topic_config(new, factor)
        if problem is not None:
            raise ConfigRefusal(f"{problem}; nothing was changed")
        return None if validate_only else new

    try:
        stored = await asyncio.to_thread(broker.store.update_topic_config, name, change)
    except ConfigRefusal as exc:
        return ErrorCode.INVALID_CONFIG, str(exc)
    if stored is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
    if not validate_only:
        log.info("event=topic_config_changed topic=%s config=%s", name, stored.config)
        warn_deprecated_configs(name, stored.config)
        await _wait(lambda: (t := broker.metadata.topic(name)) is not None and t.config == stored.config)
    return ErrorCode.NONE, None


async def _alter_broker(
    broker: BrokerContext, name: str, ops: list[ConfigOp], incremental: bool, validate_only: bool
) -> tuple[ErrorCode, str | None]:
    if name == "":
        entity = layout.DEFAULT_BROKER_ENTITY
    elif name.isdigit():
        entity = str(int(name))
    else:
        return (
            ErrorCode.INVALID_REQUEST,
            f"broker {name!r} is not a broker id (or '' for the cluster's defaults)",
        )
    dynamic = log_default_keys()
    static = frozenset(s.key for s in BROKER_SETTINGS) - frozenset(dynamic)
    cluster_default = entity == layout.DEFAULT_BROKER_ENTITY

    def change(current: dict[str, str]) -> dict[str, str] | None:
        new = _new_config(current, ops, incremental)
        problem = broker_config_refusal(new, dynamic, static, cluster_default=cluster_default)
        if problem is not None:
            raise ConfigRefusal(problem)
        return None if validate_only else new

    try:
        stored = await asyncio.to_thread(broker.store.update_dynamic_broker_config, entity, change)
    except ConfigRefusal as exc:
        # Kafka answers every refused broker config INVALID_REQUEST (its InvalidRequestException
        # around the ConfigException); a topic's INVALID_CONFIG
        return ErrorCode.INVALID_REQUEST, str(exc)
    if not validate_only:
        log.info("event=broker_config_changed entity=%s config=%s", entity, stored)
        if entity in (layout.DEFAULT_BROKER_ENTITY, str(broker.config.broker_id)):
            await _wait(lambda: broker.dynamic_config.holds(entity, stored))
    return ErrorCode.NONE, None


async def _wait(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + APPLIED_WAIT_S
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def describe_broker_config(broker: BrokerContext, name: str) -> tuple[list[Body], ErrorCode, str | None]:
    """DescribeConfigs of a broker: its static settings (read-only) and the log defaults Sluice
    changes live, with where each value comes from; ``""``: the cluster's dynamic defaults."""
    if name == "":
        return broker.dynamic_config.describe(""), ErrorCode.NONE, None
    entries, error, message = broker.admin.describe_broker_config(name)
    if error is not ErrorCode.NONE:
        return entries, error, message
    return sorted(entries + broker.dynamic_config.describe(name), key=lambda e: str(e["name"])), error, None

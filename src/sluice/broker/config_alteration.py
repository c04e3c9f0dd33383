"""What AlterConfigs and IncrementalAlterConfigs (KIP-339) make of a resource's configs: pure
functions from the configs set now and the request's operations to the configs to store, or a
refusal whose message names the key.

Topic configs live in the topic's znode; a broker's dynamic configs in ``/config/brokers/<id>``
and the cluster's in ``/config/brokers/<default>`` (Kafka's layout). Sluice changes broker
configs live only for the broker-level defaults of topic log settings (``log.retention.ms``,
``message.max.bytes``, ``min.insync.replicas`` ...); for every other key it answers as Kafka 3.9
does (``kafka_broker_configs``): Kafka's dynamic keys Sluice has nothing to change for are kept
without effect, the others refused saying why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sluice.broker import kafka_broker_configs as kb
from sluice.storage.config import LogConfig

#: IncrementalAlterConfigs' operations (Kafka's AlterConfigOp.OpType codes).
SET = 0
DELETE = 1
APPEND = 2
SUBTRACT = 3
OPERATION_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}

#: Configs whose value is a comma-separated list (APPEND and SUBTRACT apply to these only).
LIST_CONFIGS = frozenset({"cleanup.policy", "leader.replication.throttled.replicas",
                          "follower.replication.throttled.replicas"})  # fmt: skip


class ConfigRefusal(ValueError):
    """A request that would leave invalid configs: nothing is changed; the message names the key."""


@dataclass(frozen=True, slots=True)
class ConfigOp:
    """One entry of an alter request: IncrementalAlterConfigs' operation, or SET for every
    entry of AlterConfigs (which replaces the resource's whole set)."""

    name: str
    operation: int
    value: str | None


def apply_incremental(
    current: Mapping[str, str], ops: Sequence[ConfigOp], defaults: Mapping[str, str]
) -> dict[str, str]:
    """The configs after IncrementalAlterConfigs' ``ops`` (each on the result of those before
    it); ``defaults``: the value a list config has while unset, which APPEND and SUBTRACT start
    from."""
    seen: set[str] = set()
    out = dict(current)
    for op in ops:
        if op.name in seen:
            raise ConfigRefusal(f"config {op.name!r} is named twice in one request; name each key once")
        seen.add(op.name)
        if op.operation == SET:
            if op.value is None:
                raise ConfigRefusal(f"SET of config {op.name!r} needs a value")
            out[op.name] = op.value
        elif op.operation == DELETE:
            out.pop(op.name, None)
        elif op.operation in (APPEND, SUBTRACT):
            verb = OPERATION_NAMES[op.operation]
            if op.name not in LIST_CONFIGS:
                raise ConfigRefusal(f"{verb} applies to list configs only; {op.name!r} is not one (use SET)")
            items = _list(out.get(op.name, defaults.get(op.name, "")))
            given = _list(op.value or "")
            if op.operation == APPEND:
                items += [v for v in given if v not in items]
            else:
                items = [v for v in items if v not in given]
            out[op.name] = ",".join(items)
        else:
            raise ConfigRefusal(
                f"unknown operation {op.operation} for config {op.name!r} (SET 0, DELETE 1, APPEND 2, "
                "SUBTRACT 3)"
            )
    return out


def apply_full(ops: Sequence[ConfigOp]) -> dict[str, str]:
    """AlterConfigs: the request's entries become the resource's whole set (a null value leaves
    the key unset)."""
    names = [op.name for op in ops]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigRefusal(f"config(s) {twice} are named twice in one request; name each key once")
    return {op.name: op.value for op in ops if op.value is not None}


def _list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def broker_config_refusal(
    config: Mapping[str, str],
    live: Mapping[str, str],
    start_keys: frozenset[str],
    *,
    cluster_default: bool,
) -> str | None:
    """Why ``config`` cannot be a broker's dynamic configs (``cluster_default``: the cluster's,
    ``/config/brokers/<default>``), or None; Kafka's rule (``kafka_broker_configs``), with
    Sluice's answer for each of Kafka's dynamic keys. ``live``: the keys Sluice applies live,
    each to the topic config it is the default of; ``start_keys``: every other key a broker's
    configuration file takes, which Sluice reads at start only. A key neither Kafka nor Sluice
    knows is kept, as Kafka keeps it (for plugins); it changes nothing."""
    for key, value in sorted(config.items()):
        problem = _broker_key_refusal(key, value, live, start_keys, cluster_default)
        if problem is not None:
            return f"{problem}; nothing was changed"
    return None


def _broker_key_refusal(
    key: str, value: str, live: Mapping[str, str], start_keys: frozenset[str], cluster_default: bool
) -> str | None:
    restart = (
        f"broker config {key!r} is read from the brokers' configuration files when they start: set it "
        "there (or `sluice cluster up --override`) and restart them"
    )
    if key in live:
        try:
            LogConfig.from_topic_config({live[key]: value})
        except ValueError as exc:
            return f"Invalid value {value} for configuration {key}: {exc}"
        return None
    if key.startswith("listener.name."):
        return f"{restart} (Sluice changes no listener's settings while it runs)"
    entry = kb.KAFKA_DYNAMIC.get(key)
    if entry is None:
        if key in kb.KAFKA_STATIC or key in start_keys:
            return f"Cannot update these configs dynamically: {key} ({restart})"
        return None  # unknown to Kafka and Sluice: kept, as Kafka keeps it
    if entry.scope == kb.LISTENER:
        return (
            "These security configs can be dynamically updated only per-listener using the listener "
            f"prefix: {key}"
        )
    if cluster_default and entry.scope == kb.BROKER:
        return f"Cannot update these configs at default cluster level, broker id must be specified: {key}"
    wrong_type = kb.type_refusal(key, value, entry.type)
    if wrong_type is not None:
        return wrong_type
    if key in start_keys:
        return restart
    why = kb.SLUICE_REFUSED.get(key)
    if why is not None:
        return f"broker config {key!r} is not supported: {why}"
    return None  # INERT: taken, without effect (kafka_broker_configs.INERT says why)

"""Topics: list, describe (with each partition's health and log range), create, delete, configs.

Assignment, leadership and configs are read from ZooKeeper (what the controller decided);
log ranges from the partitions' leaders; creation and deletion go through the brokers' admin
API, so the same checks apply as for any Kafka client.
"""

from __future__ import annotations

import re
from typing import Any

from sluice.cluster.health import OFFLINE, UNDER_REPLICATED
from sluice.cluster.layout import INTERNAL_TOPICS
from sluice.service.context import Services
from sluice.service.errors import InvalidError, NotFoundError, ServiceError, UnavailableError
from sluice.service.health import partition_health

_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
SINGLE_REPLICA_RISK = (
    "replication factor 1 keeps one copy of every partition: when its broker stops or fails, the "
    "partition is offline (and its data lost if the disk is); drain the broker (`sluice broker drain`) "
    "before any maintenance"
)


def kafka_error_text(exc: BaseException) -> str:
    arg = exc.args[0] if exc.args else exc
    text = getattr(arg, "str", None)
    return text() if callable(text) else str(arg)


def _confluent_admin(svc: Services) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {"bootstrap.servers": svc.bootstrap, "log_level": 3, **svc.security.confluent_config()}
    )


def list_topics(svc: Services) -> list[dict[str, Any]]:
    topics = svc.zk.all_topics()
    health = partition_health(svc.zk, topics)
    out = []
    for name in sorted(topics):
        a = topics[name]
        mine = [h for h in health if h.topic == name]
        out.append(
            {
                "name": name,
                "partitions": a.partition_count,
                "replication_factor": max((len(r) for r in a.replicas.values()), default=0),
                "internal": name in INTERNAL_TOPICS,
                "offline": sum(h.status == OFFLINE for h in mine),
                "under_replicated": sum(h.status == UNDER_REPLICATED for h in mine),
            }
        )
    return out


def topic_configs(svc: Services, name: str) -> dict[str, str]:
    return dict(topic_settings(svc, name)["configs"])


def topic_settings(svc: Services, name: str) -> dict[str, Any]:
    """Partition count and configs from ZooKeeper alone (no broker round trip)."""
    a = svc.zk.topic(name)
    if a is None:
        raise NotFoundError(f"topic {name!r} does not exist")
    return {"partitions": a.partition_count, "configs": dict(a.config)}


def describe_topic(svc: Services, name: str) -> dict[str, Any]:
    from sluice.service.admin_client import AdminClient

    a = svc.zk.topic(name)
    if a is None:
        raise NotFoundError(f"topic {name!r} does not exist")
    health = partition_health(svc.zk, {name: a})
    tps = [(name, h.partition) for h in health if h.status != OFFLINE]
    starts: dict[tuple[str, int], int] = {}
    ends: dict[tuple[str, int], int] = {}
    if tps:
        try:
            with AdminClient(svc.bootstrap, timeout_s=5.0, security=svc.security) as admin:
                starts, ends = admin.offsets(tps, -2), admin.offsets(tps, -1)
        except Exception:  # the leaders are out of reach: the rest of the view still stands
            starts, ends = {}, {}
    partitions = []
    for h in health:
        lo, hi = starts.get((name, h.partition), -1), ends.get((name, h.partition), -1)
        partitions.append(
            {
                "partition": h.partition,
                "leader": h.leader,
                "replicas": list(h.replicas),
                "isr": list(h.isr),
                "log_start": lo if lo >= 0 else None,
                "log_end": hi if hi >= 0 else None,
                "status": h.status,
                "reason": h.reason,
            }
        )
    return {
        "name": name,
        "internal": name in INTERNAL_TOPICS,
        "topic_id": str(a.topic_id),
        "partitions": partitions,
        "configs": dict(a.config),
    }


def create_topic(
    svc: Services,
    name: str,
    partitions: int = 1,
    replication_factor: int = -1,
    configs: dict[str, str] | None = None,
    *,
    allow_single_replica: bool = False,
) -> dict[str, Any]:
    """Create a topic through the brokers. Replication factor 1 is refused unless allowed
    explicitly: it is how incident C's topic went offline."""
    from confluent_kafka.admin import NewTopic

    if not isinstance(name, str) or not _TOPIC.match(name) or name in (".", ".."):
        raise InvalidError(
            f"topic.name: {name!r} is not a legal topic name (1-249 of a-z A-Z 0-9 . _ -)", field="name"
        )
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidError(
            f"topic.partitions: must be an integer >= 1, not {partitions!r}", field="partitions"
        )
    if (
        not isinstance(replication_factor, int)
        or isinstance(replication_factor, bool)
        or (replication_factor < 1 and replication_factor != -1)
    ):
        raise InvalidError(
            f"topic.replication_factor: must be an integer >= 1 (or -1 for the cluster default), "
            f"not {replication_factor!r}",
            field="replication_factor",
        )
    if replication_factor == 1 and not allow_single_replica:
        raise InvalidError(
            f"{SINGLE_REPLICA_RISK}. Allow it explicitly (allow_single_replica) to create it anyway.",
            field="replication_factor",
        )
    cfg = {str(k): str(v) for k, v in (configs or {}).items()}
    admin = _confluent_admin(svc)  # kept referenced until the future resolves
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=cfg)],
        operation_timeout=30,
        request_timeout=40,
    )
    try:
        futures[name].result()
    except Exception as exc:
        text = kafka_error_text(exc)
        if "already exists" in text.lower() or "TOPIC_ALREADY_EXISTS" in text:
            from sluice.service.errors import ConflictError

            raise ConflictError(f"topic {name!r} was not created: {text}") from None
        raise ServiceError(f"topic {name!r} was not created: {text}") from None
    return {"name": name, "partitions": partitions, "replication_factor": replication_factor, "configs": cfg}


def refuse_internal(name: str) -> None:
    """Internal topics are never deleted (the brokers refuse it too, but older DeleteTopics
    versions carry no message)."""
    if name in INTERNAL_TOPICS:
        from sluice.broker.admin import internal_topic_refusal

        raise InvalidError(internal_topic_refusal(name), field="name")


def delete_topic(svc: Services, name: str) -> dict[str, Any]:
    refuse_internal(name)
    if svc.zk.topic(name) is None:
        raise NotFoundError(f"topic {name!r} does not exist")
    return delete_topic_via_brokers(svc, name)


def delete_topic_via_brokers(svc: Services, name: str) -> dict[str, Any]:
    """DeleteTopics through the brokers (no ZooKeeper needed: the CLI's path)."""
    refuse_internal(name)
    admin = _confluent_admin(svc)  # kept referenced until the future resolves
    futures = admin.delete_topics([name], operation_timeout=30, request_timeout=40)
    try:
        futures[name].result()
    except Exception as exc:
        raise UnavailableError(f"topic {name!r} was not deleted: {kafka_error_text(exc)}") from None
    return {"deleted": name}


def alter_topic_configs(
    svc: Services, name: str, set_configs: dict[str, str], delete_keys: list[str] | None = None
) -> dict[str, Any]:
    """Set and delete topic configs through the brokers (IncrementalAlterConfigs), applied live
    to every replica. The brokers validate the whole change first: an unknown key or a bad value
    is refused naming the key, and nothing changes."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    deleted = list(dict.fromkeys(delete_keys or []))
    both = sorted(set(set_configs) & set(deleted))
    if both:
        raise InvalidError(f"config(s) {both} are both set and deleted; give each key once", field="configs")
    if not set_configs and not deleted:
        raise InvalidError("nothing to change: give configs to set or keys to delete", field="configs")
    entries = [
        ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET) for k, v in set_configs.items()
    ] + [ConfigEntry(k, "", incremental_operation=AlterConfigOpType.DELETE) for k in deleted]
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    admin = _confluent_admin(svc)  # kept referenced until the future resolves
    try:
        admin.incremental_alter_configs([resource], request_timeout=40)[resource].result()
    except Exception as exc:
        text = kafka_error_text(exc)
        if "does not exist" in text or "UNKNOWN_TOPIC" in text:
            raise NotFoundError(f"topic {name!r} was not changed: {text}") from None
        raise InvalidError(f"topic {name!r} was not changed: {text}", field="configs") from None
    return {"name": name, "set": dict(set_configs), "deleted": deleted}


def add_partitions(svc: Services, name: str, partitions: int) -> dict[str, Any]:
    """Grow a topic to ``partitions`` partitions through the controller (CreatePartitions).
    Keys hash to partitions by their count, so records of one key written before and after the
    change land in different partitions (Kafka's behaviour)."""
    from confluent_kafka.admin import NewPartitions

    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidError(
            f"topic.partitions: must be an integer >= 1, not {partitions!r}", field="partitions"
        )
    admin = _confluent_admin(svc)  # kept referenced until the future resolves
    try:
        admin.create_partitions([NewPartitions(name, partitions)], operation_timeout=30, request_timeout=40)[
            name
        ].result()
    except Exception as exc:
        text = kafka_error_text(exc)
        if "does not exist" in text or "UNKNOWN_TOPIC" in text:
            raise NotFoundError(f"topic {name!r} was not changed: {text}") from None
        raise InvalidError(f"topic {name!r} was not changed: {text}", field="partitions") from None
    return {"name": name, "partitions": partitions}

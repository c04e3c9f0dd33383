"""Topic administration on behalf of clients: create, delete, describe configs.

Creation validates everything first (name, counts, assignment, every config value), then
writes the topic's znode; the controller gives its partitions leaders, and the request waits
(up to its timeout) until this broker's metadata shows them, as Kafka does.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from sluice.cluster.assignment import AssignmentError, assign_replicas
from sluice.cluster.layout import INTERNAL_TOPICS, TopicAssignment
from sluice.cluster.zkstore import TopicExistsError
from sluice.protocol.errors import ErrorCode
from sluice.storage.config import LogConfig, known_topic_configs

if TYPE_CHECKING:
    from sluice.broker.config import BrokerConfig
    from sluice.broker.metadata import MetadataCache
    from sluice.broker.replica_manager import ReplicaManager
    from sluice.cluster.zkstore import ZkStore

log = logging.getLogger("sluice.admin")

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
TOPIC_NAME_MAX = 249
CONFIG_SOURCE_TOPIC = 1
CONFIG_SOURCE_DEFAULT = 5
CONFIG_SOURCE_STATIC_BROKER = 4

#: Topic configs that are not log configs but that Sluice knows and validates.
REPLICATION_CONFIGS: dict[str, tuple[str, str]] = {
    "min.insync.replicas": ("1", "Fewest in-sync replicas that must have a record before acks=all succeeds."),
    "unclean.leader.election.enable": ("false", "Allow an out-of-sync replica to lead (may lose data)."),
}


#: Words that make a config key a secret (Kafka's password-typed keys: ssl.key.password,
#: sasl.jaas.config, ssl.keystore.password, delegation.token.secret.key ...).
_SECRET_WORDS = ("password", "secret", "jaas", "credential", "token", "private", "keystore.key")
#: Keys never described although not secrets: where the cluster's ZooKeeper is (a client that can
#: reach it could rewrite every ACL and partition state).
_UNDESCRIBED_KEYS = frozenset({"zookeeper.connect"})


def hidden_config(name: str) -> bool:
    """Whether DescribeConfigs leaves a config key out: the one rule for every resource."""
    lowered = name.lower()
    return lowered in _UNDESCRIBED_KEYS or any(word in lowered for word in _SECRET_WORDS)


def validate_topic_name(name: str) -> str | None:
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if len(name) > TOPIC_NAME_MAX:
        return f"topic name is {len(name)} characters long; the limit is {TOPIC_NAME_MAX}"
    if not TOPIC_NAME.match(name):
        return f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def missing_topic_error(name: str | None) -> tuple[ErrorCode, str]:
    """Kafka's answer for a topic a request names that does not exist: a name no topic can ever
    have is INVALID_TOPIC_EXCEPTION, which clients treat as final; any other name is
    UNKNOWN_TOPIC_OR_PARTITION, which they retry (it may be being created)."""
    problem = validate_topic_name(name or "")
    if problem is not None:
        return ErrorCode.INVALID_TOPIC_EXCEPTION, f"{problem}; no topic can have this name"
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"


def warn_deprecated_configs(topic: str, config: Mapping[str, str]) -> None:
    """Kafka 3.x takes message.format.version and ignores it with a warning (KIP-724: records
    are always written in the v2 format); Sluice does the same, once per change."""
    if "message.format.version" in config:
        log.warning(
            "event=topic_config_ignored topic=%s key=message.format.version value=%s "
            "reason='deprecated since Kafka 3.0: records are always stored in the v2 format'",
            topic,
            config["message.format.version"],
        )


def validate_topic_config(config: dict[str, str], replication_factor: int) -> str | None:
    known = known_topic_configs()
    for key in config:
        if key not in known and key not in REPLICATION_CONFIGS:
            return f"unknown topic config {key!r}"
    try:
        LogConfig.from_topic_config({k: v for k, v in config.items() if k not in REPLICATION_CONFIGS})
    except ValueError as exc:
        return str(exc)
    if "min.insync.replicas" in config:
        try:
            mir = int(config["min.insync.replicas"])
        except ValueError:
            return f"min.insync.replicas must be an integer, got {config['min.insync.replicas']!r}"
        if mir < 1:
            return f"min.insync.replicas must be at least 1, got {mir}"
        if mir > replication_factor:
            return (
                f"min.insync.replicas={mir} is larger than the replication factor {replication_factor}: "
                "no acks=all write could ever succeed"
            )
    if config.get("unclean.leader.election.enable", "false") not in ("true", "false"):
        return "unclean.leader.election.enable must be true or false"
    return None


def internal_topic_refusal(name: str) -> str:
    return (
        f"{name} is an internal topic and cannot be deleted: it holds the membership and committed "
        "offsets of every consumer group, and deleting it would lose them for all groups. Nothing "
        "was deleted. To drop one group's offsets, delete that group (DeleteGroups) or reset them "
        "with `sluice group reset-offsets`."
    )


CONFIG_TYPE_UNKNOWN = 0
#: DescribeConfigs' ConfigType of each topic config (Kafka's ConfigDef.Type ids: BOOLEAN 1,
#: STRING 2, INT 3, SHORT 4, LONG 5, DOUBLE 6, LIST 7), as Kafka's TopicConfig declares them:
#: clients show it (kafka-python's describe_configs, the Java AdminClient's ConfigEntry.type()).
TOPIC_CONFIG_TYPES = {
    **dict.fromkeys(
        [
            "cleanup.policy",
            "follower.replication.throttled.replicas",
            "leader.replication.throttled.replicas",
        ],
        7,
    ),
    **dict.fromkeys(["compression.type", "message.format.version", "message.timestamp.type"], 2),
    **dict.fromkeys(
        [
            "index.interval.bytes",
            "max.message.bytes",
            "min.insync.replicas",
            "segment.bytes",
            "segment.index.bytes",
            "compression.gzip.level",
            "compression.lz4.level",
            "compression.zstd.level",
        ],
        3,
    ),
    **dict.fromkeys(
        [
            "delete.retention.ms",
            "file.delete.delay.ms",
            "flush.messages",
            "flush.ms",
            "local.retention.bytes",
            "local.retention.ms",
            "max.compaction.lag.ms",
            "message.timestamp.after.max.ms",
            "message.timestamp.before.max.ms",
            "message.timestamp.difference.max.ms",
            "min.compaction.lag.ms",
            "retention.bytes",
            "retention.ms",
            "segment.jitter.ms",
            "segment.ms",
        ],
        5,
    ),
    **dict.fromkeys(
        [
            "message.downconversion.enable",
            "preallocate",
            "remote.storage.enable",
            "unclean.leader.election.enable",
        ],
        1,
    ),
    "min.cleanable.dirty.ratio": 6,
}


class AdminHost(Protocol):
    """What TopicAdmin needs of the broker: its configuration, ZooKeeper to write topics to, the
    view to wait on, and the replicas to tell whether this broker leads a partition yet."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def store(self) -> ZkStore: ...

    @property
    def metadata(self) -> MetadataCache: ...

    @property
    def replicas(self) -> ReplicaManager: ...


class TopicAdmin:
    def __init__(self, broker: AdminHost):
        self.broker = broker

    def default_replication_factor(self, live: int) -> int:
        configured = self.broker.config.default_replication_factor
        return configured if configured > 0 else max(1, min(3, live))

    async def create_topics(
        self, topics: list[dict[str, Any]], timeout_ms: int, validate_only: bool
    ) -> list[dict[str, Any]]:
        results = []
        created: list[str] = []
        seen: set[str] = set()
        for t in topics:
            name = t["name"]
            if name in seen:
                results.append(
                    self._create_error(name, ErrorCode.INVALID_REQUEST, "topic listed twice in one request")
                )
                continue
            seen.add(name)
            outcome = await self._create_one(t, validate_only)
            results.append(outcome)
            if outcome["error_code"] == ErrorCode.NONE and not validate_only:
                created.append(name)
        if created:
            await self._wait_for(lambda: all(self._has_leaders(n) for n in created), timeout_ms)
            for r in results:
                if r["name"] in created and not self._has_leaders(r["name"]):
                    r["error_code"] = ErrorCode.REQUEST_TIMED_OUT
                    r["error_message"] = "topic was created but its partitions have no leader yet"
        return results

    def _create_error(self, name: str, code: ErrorCode, message: str) -> dict[str, Any]:
        return {
            "name": name,
            "error_code": code,
            "error_message": message,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": [],
            "topic_id": uuid.UUID(int=0),
        }

    async def _create_one(self, t: dict[str, Any], validate_only: bool) -> dict[str, Any]:
        name = t["name"]
        problem = validate_topic_name(name)
        if problem:
            return self._create_error(name, ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if self.broker.metadata.topic(name) is not None:
            return self._create_error(name, ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        live = sorted(self.broker.metadata.brokers())
        config = {c["name"]: c["value"] for c in t.get("configs") or [] if c.get("value") is not None}
        manual = t.get("assignments") or []
        if manual:
            if t.get("num_partitions", -1) != -1 or t.get("replication_factor", -1) != -1:
                return self._create_error(
                    name, ErrorCode.INVALID_REQUEST, "give either an explicit assignment or counts, not both"
                )
            replicas = {a["partition_index"]: tuple(a["broker_ids"]) for a in manual}
            if sorted(replicas) != list(range(len(replicas))):
                return self._create_error(
                    name, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partition indexes must be 0..N-1"
                )
            sizes = {len(r) for r in replicas.values()}
            if len(sizes) != 1 or any(len(set(r)) != len(r) for r in replicas.values()):
                return self._create_error(
                    name,
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    "every partition needs the same number of distinct replicas",
                )
            unknown = {b for r in replicas.values() for b in r} - set(live)
            if unknown:
                return self._create_error(
                    name,
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"assignment names brokers that are not live: {sorted(unknown)}",
                )
            rf = sizes.pop()
        else:
            partitions = t.get("num_partitions", -1)
            partitions = self.broker.config.num_partitions if partitions == -1 else partitions
            rf = t.get("replication_factor", -1)
            rf = self.default_replication_factor(len(live)) if rf == -1 else rf
            if partitions < 1:
                return self._create_error(
                    name,
                    ErrorCode.INVALID_PARTITIONS,
                    f"number of partitions must be at least 1, got {partitions}",
                )
            if rf < 1:
                return self._create_error(
                    name,
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor must be at least 1, got {rf}",
                )
            try:
                replicas = assign_replicas(
                    live, partitions, rf, start_index=zlib.crc32(name.encode()) % max(1, len(live))
                )
            except AssignmentError as exc:
                return self._create_error(name, ErrorCode.INVALID_REPLICATION_FACTOR, str(exc))
        if rf >= 3 and "min.insync.replicas" not in config:
            # Cluster default for replicated topics (incident A): an acks=all write must reach
            # at least two replicas, so one failure cannot lose it.
            config["min.insync.replicas"] = "2"
        problem = validate_topic_config(config, rf)
        if problem:
            return self._create_error(name, ErrorCode.INVALID_CONFIG, problem)
        assignment = TopicAssignment(name, uuid.uuid4(), replicas, config)
        if not validate_only:
            try:
                await asyncio.to_thread(self.broker.store.create_topic, assignment)
            except TopicExistsError as exc:
                return self._create_error(name, ErrorCode.TOPIC_ALREADY_EXISTS, str(exc))
            log.info(
                "event=topic_created topic=%s partitions=%d replication_factor=%d config=%s",
                name,
                len(replicas),
                rf,
                config,
            )
            warn_deprecated_configs(name, config)
        return {
            "name": name,
            "topic_id": assignment.topic_id,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "num_partitions": len(replicas),
            "replication_factor": rf,
            "configs": [
                {
                    "name": k,
                    "value": v,
                    "read_only": False,
                    "config_source": CONFIG_SOURCE_TOPIC,
                    "is_sensitive": False,
                }
                for k, v in sorted(config.items())
            ],
        }

    async def auto_create(self, names: list[str]) -> None:
        await self.create_topics(
            [{"name": n, "num_partitions": -1, "replication_factor": -1} for n in names], 5000, False
        )

    def _has_leaders(self, name: str) -> bool:
        parts = self.broker.metadata.partitions(name)
        me = self.broker.config.broker_id
        return bool(parts) and all(
            p.state is not None
            and p.state.leader >= 0
            and (p.state.leader != me or self.broker.replicas.leads(name, p.partition))
            for p in parts
        )

    async def _wait_for(self, condition: Any, timeout_ms: int) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0, timeout_ms) / 1000.0
        while not condition():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def delete_topics(self, names: list[str], timeout_ms: int) -> list[dict[str, Any]]:
        results = []
        marked = []
        for name in names:
            assignment = self.broker.metadata.topic(name)
            if name in INTERNAL_TOPICS:
                log.warning("event=internal_topic_deletion_refused topic=%s", name)
                results.append(
                    {
                        "name": name,
                        "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        "error_message": internal_topic_refusal(name),
                        "topic_id": assignment.topic_id if assignment else uuid.UUID(int=0),
                    }
                )
                continue
            if assignment is None:
                results.append(
                    {
                        "name": name,
                        "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        "error_message": f"topic {name!r} does not exist",
                        "topic_id": uuid.UUID(int=0),
                    }
                )
                continue
            await asyncio.to_thread(self.broker.store.mark_topic_for_deletion, name)
            log.info("event=topic_marked_for_deletion topic=%s", name)
            marked.append(name)
            results.append(
                {
                    "name": name,
                    "error_code": ErrorCode.NONE,
                    "error_message": None,
                    "topic_id": assignment.topic_id,
                }
            )
        if marked:
            done = await self._wait_for(
                lambda: all(self.broker.metadata.topic(n) is None for n in marked), timeout_ms
            )
            if not done:
                for r in results:
                    if r["name"] in marked and self.broker.metadata.topic(r["name"]) is not None:
                        r["error_code"] = ErrorCode.REQUEST_TIMED_OUT
        return results

    def describe_topic_config(self, name: str) -> tuple[list[dict[str, Any]], ErrorCode, str | None]:
        assignment = self.broker.metadata.topic(name)
        if assignment is None:
            return [], ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        entries = []
        catalogue = dict(known_topic_configs())
        catalogue.update(REPLICATION_CONFIGS)
        for key, (default, doc) in sorted(catalogue.items()):
            overridden = key in assignment.config
            entries.append(
                {
                    "name": key,
                    "value": assignment.config[key] if overridden else default,
                    "read_only": False,
                    "is_default": not overridden,
                    "config_source": CONFIG_SOURCE_TOPIC if overridden else CONFIG_SOURCE_DEFAULT,
                    "is_sensitive": False,
                    "synonyms": [],
                    "config_type": TOPIC_CONFIG_TYPES.get(key, CONFIG_TYPE_UNKNOWN),
                    "documentation": doc,
                }
            )
        return [e for e in entries if not hidden_config(str(e["name"]))], ErrorCode.NONE, None

    def describe_broker_config(self, name: str) -> tuple[list[dict[str, Any]], ErrorCode, str | None]:
        cfg = self.broker.config
        if name not in ("", str(cfg.broker_id)):
            return [], ErrorCode.INVALID_REQUEST, f"this is broker {cfg.broker_id}, not {name}"
        values = {
            "broker.id": str(cfg.broker_id),
            "log.dirs": str(cfg.data_dir),
            "num.partitions": str(cfg.num_partitions),
            "auto.create.topics.enable": str(cfg.auto_create_topics).lower(),
            "socket.request.max.bytes": str(cfg.socket_request_max_bytes),
            "zookeeper.connect": cfg.zookeeper,
            "offsets.topic.num.partitions": str(cfg.offsets_topic_partitions),
            "transaction.state.log.num.partitions": str(cfg.transaction_state_partitions),
            "transaction.max.timeout.ms": str(cfg.transaction_max_timeout_ms),
            "max.incremental.fetch.session.cache.slots": str(cfg.fetch_session_cache_slots),
        }
        return (
            [
                {
                    "name": k,
                    "value": v,
                    "read_only": True,
                    "is_default": False,
                    "config_source": CONFIG_SOURCE_STATIC_BROKER,
                    "is_sensitive": False,
                    "synonyms": [],
                    "config_type": 0,
                    "documentation": None,
                }
                for k, v in sorted(values.items())
                if not hidden_config(k)
            ],
            ErrorCode.NONE,
            None,
        )

"""Broker configuration: what one broker process needs to know about itself and its cluster.

A broker is configured by a ``.properties`` file in the spirit of Kafka's ``server.properties``
(``sluice broker start --config broker.properties [--override key=value ...]``);
:data:`BROKER_SETTINGS` lists every key it accepts, with Kafka's names, and
:meth:`BrokerConfig.from_properties` refuses any other key and any bad value, naming it, before
the broker touches its data directory or ZooKeeper.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice import properties as props
from sluice.cluster.zkstore import parse_zookeeper_connect
from sluice.metrics import METRICS_PORT_DOC, parse_metrics_port
from sluice.security.acl import AclAuthorizer, parse_super_users
from sluice.storage.config import LogConfig

#: Kafka's default for ``socket.request.max.bytes``: frames above it close the connection.
SOCKET_REQUEST_MAX_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    broker_id: int
    data_dir: Path
    zookeeper: str
    host: str = "127.0.0.1"
    port: int = 9092
    #: The address clients are told to use (Kafka's ``advertised.listeners``); by default the
    #: listener's own.
    advertised_host: str | None = None
    advertised_port: int | None = None
    rack: str | None = None
    zk_session_timeout_s: float = 6.0
    socket_request_max_bytes: int = SOCKET_REQUEST_MAX_BYTES
    #: Partitions of a topic created without a count (Kafka's ``num.partitions``).
    num_partitions: int = 1
    #: ``-1``: min(3, live brokers), which is Kafka's behaviour for ``default.replication.factor``
    #: on a cluster of three or more and the only workable value on a smaller one.
    default_replication_factor: int = -1
    auto_create_topics: bool = False
    offsets_topic_partitions: int = 50
    #: ``-1``: min(3, live brokers) when ``__consumer_offsets`` is created.
    offsets_topic_replication_factor: int = -1
    #: The log settings of a topic that does not set them itself (Kafka's ``log.retention.ms``,
    #: ``log.segment.bytes``, ``min.insync.replicas`` ... at broker level).
    log_defaults: LogConfig = field(default_factory=LogConfig)
    #: How long the first rebalance of an empty group waits for more members (Kafka's
    #: ``group.initial.rebalance.delay.ms``, 3000 there; shorter here for quick starts).
    group_initial_rebalance_delay_ms: int = 500
    #: A follower that has not caught up for this long leaves the ISR (Kafka's
    #: ``replica.lag.time.max.ms``; 30 s there, tighter here so failover tests stay short).
    replica_lag_time_max_ms: int = 10_000
    isr_check_interval_ms: int = 500
    #: On SIGTERM, move leadership to other in-sync replicas before stopping.
    controlled_shutdown: bool = True
    controlled_shutdown_timeout_s: float = 15.0
    flush_check_interval_ms: int = 1000
    #: How often changed high watermarks are checkpointed (Kafka's default too).
    hw_checkpoint_interval_ms: int = 5000
    retention_check_interval_ms: int = 60_000
    #: Incremental fetch sessions the broker keeps (Kafka's
    #: ``max.incremental.fetch.session.cache.slots``), and how long one may go unused before it
    #: expires or, once that old, gives its slot to a more valuable one (Kafka's fixed 120 s).
    fetch_session_cache_slots: int = 1000
    fetch_session_eviction_ms: int = 120_000
    #: Period of the controller's leaderless-partition sweep (I5).
    controller_sweep_interval_s: float = 2.0
    #: The Prometheus endpoint's port, on the listener's host (``metrics.port``): None serves
    #: none, 0 a free port (sluice.metrics).
    metrics_port: int | None = None
    #: The authorizer (``authorizer.class.name``): empty, every request is allowed; or
    #: ``sluice.security.acl.AclAuthorizer``, Kafka's ACLs (sluice.security.acl).
    authorizer: str = ""
    #: Principals allowed everything (``super.users``, ``User:a;User:b``).
    super_users: frozenset[str] = frozenset()
    #: A resource without any ACL is open to everyone (``allow.everyone.if.no.acl.found``).
    allow_everyone_if_no_acl_found: bool = False

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    def __post_init__(self) -> None:
        if self.broker_id < 0:
            raise ValueError(f"broker id must be >= 0, got {self.broker_id}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if self.advertised[0] in ("", "0.0.0.0", "::"):
            raise ValueError(
                f"listeners binds {self.host or 'every address'!r}, which clients cannot connect "
                "to: set advertised.listeners=PLAINTEXT://<host clients use>:<port>"
            )

    @classmethod
    def from_properties(cls, values: Mapping[str, str], *, source: str = "broker config") -> BrokerConfig:
        """A broker's configuration from ``.properties`` keys (file and overrides merged).

        Raises ``properties.ConfigError`` naming the key for an unknown key, a bad value, or a
        missing ``broker.id``, ``log.dirs`` or ``zookeeper.connect``."""
        log_keys = {k: v for k, v in values.items() if k in _LOG_DEFAULT_KEYS}
        rest = {k: v for k, v in values.items() if k not in _LOG_DEFAULT_KEYS}
        if "log.dir" in rest and "log.dirs" not in rest:
            rest["log.dirs"] = rest.pop("log.dir")
        elif "log.dir" in rest:
            rest.pop("log.dir")  # Kafka too prefers log.dirs when both are given
        fields_: dict[str, Any] = props.resolve(
            BROKER_SETTINGS, rest, source=source, required=("broker.id", "log.dirs", "zookeeper.connect")
        )
        host, port = fields_.pop("listener", ("127.0.0.1", 9092))
        fields_["host"], fields_["port"] = host, port
        if "advertised" in fields_:
            fields_["advertised_host"], fields_["advertised_port"] = fields_.pop("advertised")
        if "zk_session_timeout_ms" in fields_:
            fields_["zk_session_timeout_s"] = fields_.pop("zk_session_timeout_ms") / 1000.0
        for key, raw in log_keys.items():  # one at a time, so the error names the broker key
            try:
                LogConfig.from_topic_config({_LOG_DEFAULT_KEYS[key]: raw})
            except ValueError as exc:
                raise props.ConfigError(f"{source}: bad value {raw!r} for {key!r}: {exc}") from None
        fields_["log_defaults"] = LogConfig.from_topic_config(
            {_LOG_DEFAULT_KEYS[k]: v for k, v in log_keys.items()}
        )
        try:
            return cls(**fields_)
        except ValueError as exc:
            raise props.ConfigError(f"{source}: {exc}") from None


def parse_listener(raw: str) -> tuple[str, int]:
    """``PLAINTEXT://host:port`` -> (host, port); an empty host binds every address."""
    scheme, sep, rest = raw.strip().partition("://")
    if not sep:
        raise ValueError("expected PLAINTEXT://host:port")
    if "," in rest:
        raise ValueError("one listener per broker: give a single PLAINTEXT://host:port")
    if scheme.upper() != "PLAINTEXT":
        raise ValueError(f"listener protocol {scheme!r} is not supported; use PLAINTEXT")
    host, colon, port_s = rest.rpartition(":")
    if not colon:
        raise ValueError("expected PLAINTEXT://host:port (no port given)")
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"port {port_s!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is out of 1..65535")
    return (host or "0.0.0.0", port)


def _parse_log_dirs(raw: str) -> Path:
    dirs = [d.strip() for d in raw.split(",") if d.strip()]
    if not dirs:
        raise ValueError("must name a directory")
    if len(dirs) > 1:
        raise ValueError("a broker keeps one data directory: give one path (run more brokers for more disks)")
    return Path(dirs[0]).expanduser().resolve()


def _parse_authorizer(raw: str) -> str:
    name = raw.strip()
    if name not in ("", AclAuthorizer.CLASS_NAME):
        raise ValueError(f"the authorizer is {AclAuthorizer.CLASS_NAME} (ACLs), or empty for none")
    return name


def _parse_rack(raw: str) -> str | None:
    return raw.strip() or None


#: Broker-level defaults of topic log settings: the broker key and the topic key it stands for.
_LOG_DEFAULT_KEYS: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.index.interval.bytes": "index.interval.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.message.timestamp.type": "message.timestamp.type",
    "min.insync.replicas": "min.insync.replicas",
}

_int = props.integer
BROKER_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting("broker.id", "broker_id", _int(0, 2**31 - 1), "this broker's id, unique in the cluster"),
    props.Setting("listeners", "listener", parse_listener, "PLAINTEXT://host:port the broker binds"),
    props.Setting(
        "advertised.listeners", "advertised", parse_listener, "PLAINTEXT://host:port clients are told to use"
    ),
    props.Setting("log.dirs", "data_dir", _parse_log_dirs, "the broker's data directory"),
    props.Setting(
        "zookeeper.connect",
        "zookeeper",
        parse_zookeeper_connect,
        "host:port[,host:port...][/chroot] (chroot /sluice)",
    ),
    props.Setting(
        "zookeeper.session.timeout.ms",
        "zk_session_timeout_ms",
        _int(1000, 600_000),
        "ZooKeeper session timeout",
    ),
    props.Setting("broker.rack", "rack", _parse_rack, "rack of this broker (replica placement)"),
    props.Setting(
        "num.partitions", "num_partitions", _int(1, 100_000), "partitions of an auto-created topic"
    ),
    props.Setting(
        "default.replication.factor",
        "default_replication_factor",
        _int(-1, 32),
        "replication factor of a topic created without one (-1: min(3, live brokers))",
    ),
    props.Setting(
        "auto.create.topics.enable", "auto_create_topics", props.boolean, "create unknown topics on metadata"
    ),
    props.Setting(
        "offsets.topic.num.partitions",
        "offsets_topic_partitions",
        _int(1, 1000),
        "partitions of __consumer_offsets",
    ),
    props.Setting(
        "offsets.topic.replication.factor",
        "offsets_topic_replication_factor",
        _int(-1, 32),
        "replication factor of __consumer_offsets (-1: min(3, live brokers))",
    ),
    props.Setting(
        "group.initial.rebalance.delay.ms",
        "group_initial_rebalance_delay_ms",
        _int(0, 300_000),
        "wait for more members before a new group's first rebalance",
    ),
    props.Setting(
        "replica.lag.time.max.ms",
        "replica_lag_time_max_ms",
        _int(100, 3_600_000),
        "a lagging follower leaves the ISR",
    ),
    props.Setting(
        "controlled.shutdown.enable", "controlled_shutdown", props.boolean, "move leadership away on SIGTERM"
    ),
    props.Setting(
        "socket.request.max.bytes",
        "socket_request_max_bytes",
        _int(1024, 2**31 - 1),
        "largest request accepted",
    ),
    props.Setting(
        "max.incremental.fetch.session.cache.slots",
        "fetch_session_cache_slots",
        _int(0, 1_000_000),
        "incremental fetch sessions kept",
    ),
    props.Setting("metrics.port", "metrics_port", parse_metrics_port, METRICS_PORT_DOC),
    props.Setting(
        "authorizer.class.name",
        "authorizer",
        _parse_authorizer,
        f"empty (no authorization) or {AclAuthorizer.CLASS_NAME} (ACLs)",
    ),
    props.Setting(
        "super.users", "super_users", parse_super_users, "User:name;User:other: principals allowed everything"
    ),
    props.Setting(
        "allow.everyone.if.no.acl.found",
        "allow_everyone_if_no_acl_found",
        props.boolean,
        "a resource without any ACL is open to every principal (default false)",
    ),
    *(
        props.Setting(k, "_log_default", str, f"default of the topic config {v}")
        for k, v in _LOG_DEFAULT_KEYS.items()
    ),
)

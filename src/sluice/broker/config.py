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
from sluice.broker.listeners import (
    Listener,
    advertised_for,
    parse_endpoints,
    parse_protocol_map,
    resolve_listeners,
)
from sluice.broker.log_cleaner import CleanerSettings
from sluice.cluster.zkstore import ZK_AUTH_SETTINGS, ZkAuth, parse_zookeeper_connect, pop_zk_auth
from sluice.metrics import METRICS_PORT_DOC, parse_metrics_port
from sluice.security.acl import AclAuthorizer, parse_super_users
from sluice.security.client import ClientSecurity
from sluice.security.sasl import DEFAULT_MECHANISMS, SUPPORTED_MECHANISMS
from sluice.security.tls import CLIENT_AUTH, ServerTls
from sluice.storage.config import LogConfig

#: Kafka's default for ``socket.request.max.bytes``: frames above it close the connection.
SOCKET_REQUEST_MAX_BYTES = 100 * 1024 * 1024
#: Kafka's default for ``fetch.max.bytes``: the most a Fetch answer carries, whatever it asks.
FETCH_MAX_BYTES = 55 * 1024 * 1024
#: Sluice's default ``offsets.topic.segment.bytes`` (Kafka's is 100 MiB). A new coordinator
#: replays what the cleaner left plus the segments not cleaned yet, the active one at least, so
#: this bounds what a coordinator move replays beyond the live groups: about 7,000 commits per
#: partition (tens of ms). Smaller leaves less (bench/offsets.py: 100 KiB leaves 0.35 % of
#: 1,000,000 commits) but also bounds one group record (its members and assignments): 1 MiB
#: keeps Kafka's max.message.bytes as that ceiling. Coordinator writes are cut to fit it.
OFFSETS_TOPIC_SEGMENT_BYTES = 1024 * 1024
#: How long a stopping broker waits for the controller to move leadership off it.
CONTROLLED_SHUTDOWN_TIMEOUT_S = 15.0


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
    #: KIP-392's ``replica.selector.class``: empty, consumers read from leaders (Kafka's
    #: default); RACK_AWARE_SELECTOR, a leader points a consumer at an in-sync follower in its
    #: rack (``client.rack``). Followers serve consumers that fetch from them either way.
    replica_selector: str = ""
    zk_session_timeout_s: float = 6.0
    #: ZooKeeper digest credentials and ACLs (``zookeeper.set.acl``, ``zookeeper.auth.*``);
    #: None: no credentials, znodes open to every client (a cluster without ACLs).
    zk_auth: ZkAuth | None = None
    socket_request_max_bytes: int = SOCKET_REQUEST_MAX_BYTES
    #: Open connections, in all and from one address (Kafka's ``max.connections`` and
    #: ``max.connections.per.ip``, unlimited there; bounded here so that a client cannot take
    #: every descriptor), and per-address exceptions (``max.connections.per.ip.overrides``).
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    max_connections_per_ip_overrides: Mapping[str, int] = field(default_factory=dict)
    #: Bytes of requests being read or waiting to be handled, across connections (Kafka's
    #: ``queued.max.request.bytes``; -1 there, unbounded; None here means the same).
    queued_max_request_bytes: int | None = 512 * 1024 * 1024
    #: A connection with nothing in flight this long is closed (Kafka's ``connections.max.idle.ms``).
    connections_max_idle_ms: int = 600_000
    #: A request must arrive whole within this long of its first byte (a slow-loris holds a
    #: connection with a frame it never finishes); Sluice's own key.
    socket_request_read_timeout_ms: int = 60_000
    #: The most one Fetch answer carries, a consumer's or a follower's (Kafka's ``fetch.max.bytes``).
    fetch_max_bytes: int = FETCH_MAX_BYTES
    #: Members of one group (Kafka's ``group.max.size``, unlimited there), and groups this broker
    #: coordinates (Sluice's own ``group.max.count``): JoinGroup past either is refused.
    group_max_size: int = 1_000
    group_max_count: int = 10_000
    #: Partitions of a topic created without a count (Kafka's ``num.partitions``).
    num_partitions: int = 1
    #: ``-1``: min(3, live brokers), which is Kafka's behaviour for ``default.replication.factor``
    #: on a cluster of three or more and the only workable value on a smaller one.
    default_replication_factor: int = -1
    auto_create_topics: bool = False
    offsets_topic_partitions: int = 50
    #: ``-1``: min(3, live brokers) when ``__consumer_offsets`` is created.
    offsets_topic_replication_factor: int = -1
    #: ``segment.bytes`` of ``__consumer_offsets`` when it is created (Kafka's
    #: ``offsets.topic.segment.bytes``, 100 MiB there): a new coordinator replays the cleaned log
    #: and the segments not cleaned yet, at least the active one, so this bounds its load time.
    offsets_topic_segment_bytes: int = OFFSETS_TOPIC_SEGMENT_BYTES
    #: A group's committed offsets expire this long after the group became empty, and a
    #: group's offsets of topics it no longer subscribes to this long after their commit
    #: (KIP-211; ``offsets.retention.minutes``, 7 days, or Sluice's ``offsets.retention.ms``).
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000
    offsets_retention_check_interval_ms: int = 600_000
    #: The log cleaner of compacted topics (``log.cleaner.*``; broker/log_cleaner.py).
    cleaner: CleanerSettings = field(default_factory=CleanerSettings)
    #: ``__transaction_state``: partitions, replication factor (``-1``: min(3, live brokers)) and
    #: min.insync.replicas (at most its replication factor), as Kafka's
    #: ``transaction.state.log.*``.
    transaction_state_partitions: int = 50
    transaction_state_replication_factor: int = -1
    transaction_state_min_isr: int = 2
    #: The longest transaction.timeout.ms a producer may ask for (``transaction.max.timeout.ms``).
    transaction_max_timeout_ms: int = 900_000
    #: How often the coordinator aborts transactions past their timeout
    #: (``transaction.abort.timed.out.transaction.cleanup.interval.ms``).
    transaction_abort_interval_ms: int = 10_000
    #: A transactional id unused this long is forgotten (``transactional.id.expiration.ms``).
    transactional_id_expiration_ms: int = 604_800_000
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
    controlled_shutdown_timeout_s: float = CONTROLLED_SHUTDOWN_TIMEOUT_S
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
    #: The controller gives leadership back to preferred replicas (Kafka's
    #: ``auto.leader.rebalance.enable``, ``leader.imbalance.check.interval.seconds`` and
    #: ``leader.imbalance.per.broker.percentage``, with Kafka's defaults).
    auto_leader_rebalance: bool = True
    leader_imbalance_check_interval_s: int = 300
    leader_imbalance_per_broker_percentage: int = 10
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

    #: Every listener the broker binds (``listeners`` with ``listener.security.protocol.map``);
    #: empty: one PLAINTEXT listener on host:port. host/port/advertised_* are the inter-broker
    #: listener's.
    listeners: tuple[Listener, ...] = ()
    #: (name, host, port) clients of each listener are told to use (``advertised.listeners``).
    advertised_listeners: tuple[tuple[str, str, int], ...] = ()
    #: The listener brokers fetch from each other on (``inter.broker.listener.name``).
    inter_broker_listener: str | None = None
    #: TLS of the SSL and SASL_SSL listeners (``ssl.keystore.location`` ...).
    tls: ServerTls | None = None
    #: Mechanisms SASL listeners offer (``sasl.enabled.mechanisms``).
    sasl_mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS
    #: What this broker authenticates with on a SASL inter-broker listener
    #: (``sasl.mechanism.inter.broker.protocol``, ``inter.broker.sasl.username``/``password``).
    inter_broker_sasl_mechanism: str = "SCRAM-SHA-512"
    inter_broker_username: str | None = None
    inter_broker_password: str | None = field(default=None, repr=False)
    #: A failed authentication is answered this much later (``connection.failed.authentication.delay.ms``).
    failed_authentication_delay_ms: int = 100
    #: A connection on a SASL listener that has not authenticated by then is closed
    #: (``authentication.timeout.ms``).
    authentication_timeout_ms: int = 10_000
    #: KIP-368: an authenticated SASL session lasts this long (told to the client in
    #: SaslAuthenticate's session_lifetime_ms); the client re-authenticates on the connection
    #: before then, and a request after it is closed instead of answered. 0: sessions never end
    #: (Kafka's ``connections.max.reauth.ms``, 0 by default there too).
    connections_max_reauth_ms: int = 0

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @property
    def bound_listeners(self) -> tuple[Listener, ...]:
        return self.listeners or (Listener("PLAINTEXT", "PLAINTEXT", self.host, self.port),)

    @property
    def inter_broker(self) -> Listener:
        name = self.inter_broker_listener
        return next((lst for lst in self.bound_listeners if lst.name == name), self.bound_listeners[0])

    def inter_broker_client(self) -> ClientSecurity:
        """How this broker connects to the others' inter-broker listener: its protocol, the
        broker user's SCRAM credentials, and the CAs of ssl.truststore.location."""
        lst = self.inter_broker
        return ClientSecurity(
            lst.protocol,
            self.inter_broker_sasl_mechanism,
            self.inter_broker_username if lst.sasl else None,
            self.inter_broker_password if lst.sasl else None,
            self.tls.truststore if self.tls is not None and lst.tls else None,
        )

    def advertised_endpoints(self) -> dict[str, tuple[str, str, int]]:
        """listener name -> (protocol, host, port) as clients are told (what /brokers/ids holds)."""
        given = {n: (h, p) for n, h, p in self.advertised_listeners}
        return {
            lst.name: (lst.protocol, *given.get(lst.name, (lst.host, lst.port)))
            for lst in self.bound_listeners
        }

    def __post_init__(self) -> None:
        if self.broker_id < 0:
            raise ValueError(f"broker id must be >= 0, got {self.broker_id}")
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        if (
            self.queued_max_request_bytes is not None
            and self.queued_max_request_bytes < self.socket_request_max_bytes
        ):
            raise ValueError(
                f"queued.max.request.bytes ({self.queued_max_request_bytes}) is below "
                f"socket.request.max.bytes ({self.socket_request_max_bytes}), so the largest request "
                "could never be read: raise it, or lower socket.request.max.bytes"
            )
        if self.advertised[0] in ("", "0.0.0.0", "::"):
            raise ValueError(
                f"listeners binds {self.host or 'every address'!r}, which clients cannot connect "
                "to: set advertised.listeners=PLAINTEXT://<host clients use>:<port>"
            )
        if any(lst.tls for lst in self.bound_listeners) and self.tls is None:
            raise ValueError(
                "an SSL or SASL_SSL listener needs ssl.keystore.location (a PEM file with the "
                "broker's certificate chain and private key)"
            )
        if self.inter_broker.sasl and not (self.inter_broker_username and self.inter_broker_password):
            raise ValueError(
                f"the inter-broker listener {self.inter_broker.name} is {self.inter_broker.protocol}: "
                "set inter.broker.sasl.username and inter.broker.sasl.password (a user made with "
                "`sluice user add`)"
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
            BROKER_SETTINGS, rest, source=source, required=BROKER_REQUIRED
        )
        try:
            _listener_fields(fields_)
        except ValueError as exc:
            raise props.ConfigError(f"{source}: {exc}") from None
        if fields_.get("queued_max_request_bytes") == -1:
            fields_["queued_max_request_bytes"] = None
        if "zk_session_timeout_ms" in fields_:
            fields_["zk_session_timeout_s"] = fields_.pop("zk_session_timeout_ms") / 1000.0
        fields_["zk_auth"] = pop_zk_auth(fields_, source)
        _cleaner_fields(fields_)
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


def _cleaner_fields(fields_: dict[str, Any]) -> None:
    """log.cleaner.* -> ``cleaner``; offsets.retention.minutes/ms -> ``offsets_retention_ms``
    (in place; the ms key wins when both are given)."""
    keys = ("enabled", "processes", "io_bytes_per_s", "backoff_ms", "dedupe_buffer_bytes")
    given = {k: fields_.pop(f"cleaner_{k}") for k in keys if f"cleaner_{k}" in fields_}
    if given:
        fields_["cleaner"] = CleanerSettings(**given)
    minutes = fields_.pop("offsets_retention_minutes", None)
    if minutes is not None and "offsets_retention_ms" not in fields_:
        fields_["offsets_retention_ms"] = minutes * 60_000


def _non_negative_float(raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not value >= 0:
        raise ValueError("must be >= 0")
    return value


def _listener_fields(fields_: dict[str, Any]) -> None:
    """listeners, advertised.listeners, the protocol map, the inter-broker listener's name and
    the TLS keys -> BrokerConfig's fields (in place)."""
    endpoints = fields_.pop("listener", (("PLAINTEXT", "127.0.0.1", 9092),))
    listeners = resolve_listeners(endpoints, fields_.pop("protocol_map", {}))
    advertised = fields_.pop("advertised", ())
    advertised_for(listeners, advertised)  # refuses unknown names and unusable addresses
    name = fields_.get("inter_broker_listener") or ("PLAINTEXT" if any(
        lst.name == "PLAINTEXT" for lst in listeners) else listeners[0].name)  # fmt: skip
    inter = next((lst for lst in listeners if lst.name == name), None)
    if inter is None:
        raise ValueError(f"inter.broker.listener.name={name} names no listener of listeners")
    fields_["inter_broker_listener"] = name
    fields_["listeners"], fields_["advertised_listeners"] = listeners, tuple(advertised)
    fields_["host"], fields_["port"] = inter.host, inter.port
    for n, h, p in advertised:
        if n == name:
            fields_["advertised_host"], fields_["advertised_port"] = h, p
    keystore = fields_.pop("ssl_keystore", None)
    tls = (fields_.pop("ssl_key_password", None), fields_.pop("ssl_truststore", None),
           fields_.pop("ssl_client_auth", "none"))  # fmt: skip
    if keystore is not None:
        fields_["tls"] = ServerTls(keystore, *tls)


def _parse_mechanisms(raw: str) -> tuple[str, ...]:
    names = tuple(m.strip().upper() for m in raw.split(",") if m.strip())
    unknown = [m for m in names if m not in SUPPORTED_MECHANISMS]
    if unknown or not names:
        raise ValueError(f"use some of {', '.join(SUPPORTED_MECHANISMS)}")
    return names


def _parse_scram_mechanism(raw: str) -> str:
    value = raw.strip().upper()
    if value not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ValueError("use SCRAM-SHA-256 or SCRAM-SHA-512")
    return value


def _parse_client_auth(raw: str) -> str:
    value = raw.strip().lower()
    if value not in CLIENT_AUTH:
        raise ValueError(f"use one of {', '.join(CLIENT_AUTH)}")
    return value


def _existing_file(raw: str) -> Path:
    path = Path(raw).expanduser()
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    return path


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


def parse_ip_overrides(raw: str) -> dict[str, int]:
    """``host:count[,host:count...]`` (Kafka's ``max.connections.per.ip.overrides``)."""
    overrides: dict[str, int] = {}
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        host, colon, count = item.rpartition(":")
        if not colon or not host:
            raise ValueError(f"expected host:count, got {item!r}")
        try:
            overrides[host.strip("[]")] = int(count)
        except ValueError:
            raise ValueError(f"count {count!r} of {host!r} is not a number") from None
        if overrides[host.strip("[]")] < 0:
            raise ValueError(f"count of {host!r} must be >= 0")
    return overrides


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


#: Kafka's rack-aware replica selector (KIP-392), the one Sluice implements.
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"


def _parse_replica_selector(raw: str) -> str:
    name = raw.strip()
    if name not in ("", RACK_AWARE_SELECTOR):
        raise ValueError(f"Sluice's replica selector is {RACK_AWARE_SELECTOR}, or empty for leaders only")
    return name


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
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    # Kafka's other broker defaults of topic configs (its LogConfig synonyms), dynamic in Kafka too
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "log.message.timestamp.difference.max.ms": "message.timestamp.difference.max.ms",
    "log.roll.jitter.ms": "segment.jitter.ms",
    "log.index.size.max.bytes": "segment.index.bytes",
    "log.preallocate": "preallocate",
    "log.message.downconversion.enable": "message.downconversion.enable",
    "log.segment.delete.delay.ms": "file.delete.delay.ms",
    "log.local.retention.ms": "local.retention.ms",
    "log.local.retention.bytes": "local.retention.bytes",
}


def log_default_keys() -> dict[str, str]:
    """The broker keys that are defaults of topic log settings (broker key -> topic key): the
    broker configs Sluice changes while brokers run (``/config/brokers``)."""
    return dict(_LOG_DEFAULT_KEYS)


_int = props.integer
#: The keys a broker cannot start without.
BROKER_REQUIRED = ("broker.id", "log.dirs", "zookeeper.connect")
BROKER_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting("broker.id", "broker_id", _int(0, 2**31 - 1), "this broker's id, unique in the cluster"),
    props.Setting(
        "listeners",
        "listener",
        parse_endpoints,
        "NAME://host:port[,...] the broker binds (PLAINTEXT://, SASL_SSL://)",
    ),
    props.Setting(
        "advertised.listeners",
        "advertised",
        parse_endpoints,
        "NAME://host:port[,...] clients are told to use",
    ),
    props.Setting(
        "listener.security.protocol.map",
        "protocol_map",
        parse_protocol_map,
        "NAME:PROTOCOL[,...] for listener names that are not a protocol",
    ),
    props.Setting(
        "inter.broker.listener.name", "inter_broker_listener", props.non_empty, "the listener brokers use"
    ),
    props.Setting(
        "ssl.keystore.location", "ssl_keystore", _existing_file, "PEM file: certificate chain and private key"
    ),
    props.Setting("ssl.key.password", "ssl_key_password", str, "password of an encrypted private key"),
    props.Setting(
        "ssl.truststore.location",
        "ssl_truststore",
        _existing_file,
        "PEM file of CAs (mTLS, inter-broker TLS)",
    ),
    props.Setting("ssl.client.auth", "ssl_client_auth", _parse_client_auth, "none, requested or required"),
    props.Setting("sasl.enabled.mechanisms", "sasl_mechanisms", _parse_mechanisms, "PLAIN,SCRAM-SHA-256,..."),
    props.Setting(
        "sasl.mechanism.inter.broker.protocol",
        "inter_broker_sasl_mechanism",
        _parse_scram_mechanism,
        "SCRAM-SHA-256 or SCRAM-SHA-512",
    ),
    props.Setting(
        "inter.broker.sasl.username", "inter_broker_username", props.non_empty, "inter-broker user"
    ),
    props.Setting("inter.broker.sasl.password", "inter_broker_password", props.non_empty, "its password"),
    props.Setting(
        "connection.failed.authentication.delay.ms",
        "failed_authentication_delay_ms",
        _int(0, 60_000),
        "delay before a failed authentication is answered",
    ),
    props.Setting(
        "authentication.timeout.ms",
        "authentication_timeout_ms",
        _int(100, 3_600_000),
        "a SASL connection not authenticated by then is closed",
    ),
    props.Setting(
        "connections.max.reauth.ms",
        "connections_max_reauth_ms",
        _int(0, 2**62),
        "KIP-368: a SASL session lasts this long unless the client re-authenticates (0: forever)",
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
    *ZK_AUTH_SETTINGS,
    props.Setting(
        "broker.rack", "rack", _parse_rack, "rack of this broker (Metadata; follower fetching, KIP-392)"
    ),
    props.Setting(
        "replica.selector.class",
        "replica_selector",
        _parse_replica_selector,
        f"empty (consumers read from leaders) or {RACK_AWARE_SELECTOR} (from a replica in their rack)",
    ),
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
        "offsets.topic.segment.bytes",
        "offsets_topic_segment_bytes",
        _int(1024, 2**31 - 1),
        "segment.bytes of __consumer_offsets when it is created (bounds a new coordinator's load)",
    ),
    props.Setting(
        "offsets.retention.minutes",
        "offsets_retention_minutes",
        _int(1, 2**31 - 1),
        "committed offsets of an empty group expire this long after it became empty (KIP-211)",
    ),
    props.Setting(
        "offsets.retention.ms",
        "offsets_retention_ms",
        _int(1, 2**62),
        "Sluice's own: offsets.retention.minutes in milliseconds (wins over it)",
    ),
    props.Setting(
        "offsets.retention.check.interval.ms",
        "offsets_retention_check_interval_ms",
        _int(1, 2**31 - 1),
        "how often the coordinator looks for expired offsets",
    ),
    props.Setting("log.cleaner.enable", "cleaner_enabled", props.boolean, "clean compacted topics"),
    props.Setting(
        "log.cleaner.threads",
        "cleaner_processes",
        _int(1, 64),
        "cleaner processes (Kafka's threads: a process each here, so the event loop keeps its core)",
    ),
    props.Setting(
        "log.cleaner.io.max.bytes.per.second",
        "cleaner_io_bytes_per_s",
        _non_negative_float,
        "bytes the cleaner reads and writes per second, all processes together (0: unbounded)",
    ),
    props.Setting(
        "log.cleaner.backoff.ms",
        "cleaner_backoff_ms",
        _int(10, 2**31 - 1),
        "how often the cleaner looks for logs to clean when it found none",
    ),
    props.Setting(
        "log.cleaner.dedupe.buffer.size",
        "cleaner_dedupe_buffer_bytes",
        _int(1024 * 1024, 2**62),
        "memory for the cleaner's key maps, all processes together",
    ),
    props.Setting(
        "transaction.state.log.num.partitions",
        "transaction_state_partitions",
        _int(1, 1000),
        "partitions of __transaction_state",
    ),
    props.Setting(
        "transaction.state.log.replication.factor",
        "transaction_state_replication_factor",
        _int(-1, 32),
        "replication factor of __transaction_state (-1: min(3, live brokers))",
    ),
    props.Setting(
        "transaction.state.log.min.isr",
        "transaction_state_min_isr",
        _int(1, 32),
        "min.insync.replicas of __transaction_state (at most its replication factor)",
    ),
    props.Setting(
        "transaction.max.timeout.ms",
        "transaction_max_timeout_ms",
        _int(1, 2**31 - 1),
        "the longest transaction.timeout.ms a producer may ask for",
    ),
    props.Setting(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "transaction_abort_interval_ms",
        _int(10, 3_600_000),
        "how often transactions past their timeout are aborted",
    ),
    props.Setting(
        "transactional.id.expiration.ms",
        "transactional_id_expiration_ms",
        _int(1, 2**31 - 1),
        "a transactional id unused this long is forgotten",
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
    props.Setting("max.connections", "max_connections", _int(1, 2**31 - 1), "open connections, in all"),
    props.Setting(
        "max.connections.per.ip",
        "max_connections_per_ip",
        _int(0, 2**31 - 1),
        "open connections from one address",
    ),
    props.Setting(
        "max.connections.per.ip.overrides",
        "max_connections_per_ip_overrides",
        parse_ip_overrides,
        "host:count[,host:count...]: per-address exceptions to max.connections.per.ip",
    ),
    props.Setting(
        "queued.max.request.bytes",
        "queued_max_request_bytes",
        _int(-1, 2**62),
        "bytes of requests being read or queued, all connections together (-1: unbounded)",
    ),
    props.Setting(
        "connections.max.idle.ms", "connections_max_idle_ms", _int(1000, 2**31 - 1), "close idle connections"
    ),
    props.Setting(
        "socket.request.read.timeout.ms",
        "socket_request_read_timeout_ms",
        _int(1000, 2**31 - 1),
        "a request must arrive whole within this long of its first byte",
    ),
    props.Setting(
        "fetch.max.bytes", "fetch_max_bytes", _int(1024, 2**31 - 1), "most bytes one Fetch answer carries"
    ),
    props.Setting("group.max.size", "group_max_size", _int(1, 2**31 - 1), "members of one consumer group"),
    props.Setting("group.max.count", "group_max_count", _int(1, 2**31 - 1), "groups this broker coordinates"),
    props.Setting(
        "max.incremental.fetch.session.cache.slots",
        "fetch_session_cache_slots",
        _int(0, 1_000_000),
        "incremental fetch sessions kept",
    ),
    props.Setting("metrics.port", "metrics_port", parse_metrics_port, METRICS_PORT_DOC),
    props.Setting(
        "auto.leader.rebalance.enable",
        "auto_leader_rebalance",
        props.boolean,
        "the controller moves leadership back to preferred replicas",
    ),
    props.Setting(
        "leader.imbalance.check.interval.seconds",
        "leader_imbalance_check_interval_s",
        _int(1, 86_400),
        "how often the controller checks leadership balance",
    ),
    props.Setting(
        "leader.imbalance.per.broker.percentage",
        "leader_imbalance_per_broker_percentage",
        _int(0, 100),
        "a broker's share of its preferred partitions led elsewhere that starts a rebalance",
    ),
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

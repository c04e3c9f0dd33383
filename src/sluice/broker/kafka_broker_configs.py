"""Kafka 3.9's broker configs, for AlterConfigs and IncrementalAlterConfigs of a broker (or of the
cluster's defaults), and what Sluice does with each key a Kafka broker changes while it runs.

Kafka answers these requests by one rule (its DynamicBrokerConfig): a key it reads only at start
is refused ("Cannot update these configs dynamically"), a listener's TLS store only with a
listener prefix, a per-broker key only for a broker id, a value not of the key's type is
refused; every other key is taken, a key Kafka does not know included (it keeps it for plugins).
Every refusal is INVALID_REQUEST. Sluice answers by the same rule, with what each of Kafka's
dynamic keys means here (``SLUICE``):

- ``LIVE``: the broker-level default of a topic log setting, applied at once
  (``broker.config.log_default_keys``, ``broker/dynamic_config.py``);
- ``INERT``: accepted and kept in ``/config/brokers``, shown by DescribeConfigs, and without
  effect because Sluice has nothing it would change (Kerberos, thread pools, tiered storage ...):
  taking it is the truth, as Kafka takes a key for a plugin it does not load;
- a key Sluice reads from its configuration file (``BROKER_SETTINGS``: listeners, SASL
  mechanisms, connection limits, the cleaner's processes) or one whose value would change what
  Sluice does (TLS and principal settings, connection rates, producer id expiry): refused,
  INVALID_REQUEST, saying why and what to do instead (docs/COMPATIBILITY.md lists them).

``KAFKA_DYNAMIC`` and ``KAFKA_STATIC`` were read from a Kafka 3.9.1 broker's own DescribeConfigs
(its read-only flag and config type) and the scopes from its answers to validate-only
IncrementalAlterConfigs (tests/conformance/differential/wire.py ``broker_configs`` checks them
against the peer, key by key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BROKER",
    "CLUSTER",
    "CONFIG_TYPES",
    "INERT",
    "INERT_DEFAULTS",
    "KAFKA_DYNAMIC",
    "KAFKA_STATIC",
    "LISTENER",
    "SLUICE_REFUSED",
    "DynamicKey",
    "type_refusal",
]

#: A dynamic key's scope in Kafka: the cluster's defaults or one broker; one broker only (its
#: listeners, SASL and TLS settings); or a listener's TLS stores, only with a
#: ``listener.name.<listener>.`` prefix.
CLUSTER: Final = "cluster"
BROKER: Final = "broker"
LISTENER: Final = "listener"


@dataclass(frozen=True, slots=True)
class DynamicKey:
    name: str
    #: Kafka's ConfigDef type: BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD
    type: str
    scope: str


_DYNAMIC: Final[dict[str, tuple[str, str]]] = {
    "advertised.listeners": ("STRING", BROKER),
    "background.threads": ("INT", CLUSTER),
    "compression.gzip.level": ("INT", CLUSTER),
    "compression.lz4.level": ("INT", CLUSTER),
    "compression.type": ("STRING", CLUSTER),
    "compression.zstd.level": ("INT", CLUSTER),
    "listener.security.protocol.map": ("STRING", BROKER),
    "listeners": ("STRING", BROKER),
    "log.cleaner.backoff.ms": ("LONG", CLUSTER),
    "log.cleaner.dedupe.buffer.size": ("LONG", CLUSTER),
    "log.cleaner.delete.retention.ms": ("LONG", CLUSTER),
    "log.cleaner.io.buffer.load.factor": ("DOUBLE", CLUSTER),
    "log.cleaner.io.buffer.size": ("INT", CLUSTER),
    "log.cleaner.io.max.bytes.per.second": ("DOUBLE", CLUSTER),
    "log.cleaner.max.compaction.lag.ms": ("LONG", CLUSTER),
    "log.cleaner.min.cleanable.ratio": ("DOUBLE", CLUSTER),
    "log.cleaner.min.compaction.lag.ms": ("LONG", CLUSTER),
    "log.cleaner.threads": ("INT", CLUSTER),
    "log.cleanup.policy": ("LIST", CLUSTER),
    "log.flush.interval.messages": ("LONG", CLUSTER),
    "log.flush.interval.ms": ("LONG", CLUSTER),
    "log.index.interval.bytes": ("INT", CLUSTER),
    "log.index.size.max.bytes": ("INT", CLUSTER),
    "log.local.retention.bytes": ("LONG", CLUSTER),
    "log.local.retention.ms": ("LONG", CLUSTER),
    "log.message.downconversion.enable": ("BOOLEAN", CLUSTER),
    "log.message.timestamp.after.max.ms": ("LONG", CLUSTER),
    "log.message.timestamp.before.max.ms": ("LONG", CLUSTER),
    "log.message.timestamp.difference.max.ms": ("LONG", CLUSTER),
    "log.message.timestamp.type": ("STRING", CLUSTER),
    "log.preallocate": ("BOOLEAN", CLUSTER),
    "log.retention.bytes": ("LONG", CLUSTER),
    "log.retention.ms": ("LONG", CLUSTER),
    "log.roll.jitter.ms": ("LONG", CLUSTER),
    "log.roll.ms": ("LONG", CLUSTER),
    "log.segment.bytes": ("INT", CLUSTER),
    "log.segment.delete.delay.ms": ("LONG", CLUSTER),
    "max.connection.creation.rate": ("INT", CLUSTER),
    "max.connections": ("INT", CLUSTER),
    "max.connections.per.ip": ("INT", CLUSTER),
    "max.connections.per.ip.overrides": ("STRING", CLUSTER),
    "message.max.bytes": ("INT", CLUSTER),
    "metric.reporters": ("LIST", CLUSTER),
    "min.insync.replicas": ("INT", CLUSTER),
    "num.io.threads": ("INT", CLUSTER),
    "num.network.threads": ("INT", CLUSTER),
    "num.recovery.threads.per.data.dir": ("INT", CLUSTER),
    "num.replica.fetchers": ("INT", CLUSTER),
    "principal.builder.class": ("CLASS", BROKER),
    "producer.id.expiration.ms": ("INT", CLUSTER),
    "remote.fetch.max.wait.ms": ("INT", CLUSTER),
    "remote.log.index.file.cache.total.size.bytes": ("LONG", CLUSTER),
    "remote.log.manager.copy.max.bytes.per.second": ("LONG", CLUSTER),
    "remote.log.manager.fetch.max.bytes.per.second": ("LONG", CLUSTER),
    "sasl.enabled.mechanisms": ("LIST", BROKER),
    "sasl.jaas.config": ("PASSWORD", BROKER),
    "sasl.kerberos.kinit.cmd": ("STRING", BROKER),
    "sasl.kerberos.min.time.before.relogin": ("LONG", BROKER),
    "sasl.kerberos.principal.to.local.rules": ("LIST", BROKER),
    "sasl.kerberos.service.name": ("STRING", BROKER),
    "sasl.kerberos.ticket.renew.jitter": ("DOUBLE", BROKER),
    "sasl.kerberos.ticket.renew.window.factor": ("DOUBLE", BROKER),
    "sasl.login.refresh.buffer.seconds": ("SHORT", BROKER),
    "sasl.login.refresh.min.period.seconds": ("SHORT", BROKER),
    "sasl.login.refresh.window.factor": ("DOUBLE", BROKER),
    "sasl.login.refresh.window.jitter": ("DOUBLE", BROKER),
    "sasl.mechanism.inter.broker.protocol": ("STRING", BROKER),
    "ssl.cipher.suites": ("LIST", BROKER),
    "ssl.client.auth": ("STRING", BROKER),
    "ssl.enabled.protocols": ("LIST", BROKER),
    "ssl.endpoint.identification.algorithm": ("STRING", BROKER),
    "ssl.engine.factory.class": ("CLASS", BROKER),
    "ssl.key.password": ("PASSWORD", LISTENER),
    "ssl.keymanager.algorithm": ("STRING", BROKER),
    "ssl.keystore.certificate.chain": ("PASSWORD", LISTENER),
    "ssl.keystore.key": ("PASSWORD", LISTENER),
    "ssl.keystore.location": ("STRING", LISTENER),
    "ssl.keystore.password": ("PASSWORD", LISTENER),
    "ssl.keystore.type": ("STRING", LISTENER),
    "ssl.protocol": ("STRING", BROKER),
    "ssl.provider": ("STRING", BROKER),
    "ssl.secure.random.implementation": ("STRING", BROKER),
    "ssl.trustmanager.algorithm": ("STRING", BROKER),
    "ssl.truststore.certificates": ("PASSWORD", LISTENER),
    "ssl.truststore.location": ("STRING", LISTENER),
    "ssl.truststore.password": ("PASSWORD", LISTENER),
    "ssl.truststore.type": ("STRING", LISTENER),
    "transaction.partition.verification.enable": ("BOOLEAN", CLUSTER),
    "unclean.leader.election.enable": ("BOOLEAN", CLUSTER),
}

#: Every config a Kafka 3.9 broker changes while it runs, with its type and scope.
KAFKA_DYNAMIC: Final[dict[str, DynamicKey]] = {
    name: DynamicKey(name, kind, scope) for name, (kind, scope) in _DYNAMIC.items()
}

#: Every config a Kafka 3.9 broker reads only at start ("Cannot update these configs dynamically").
KAFKA_STATIC: Final[frozenset[str]] = frozenset(
    [
        "alter.config.policy.class.name",
        "alter.log.dirs.replication.quota.window.num",
        "alter.log.dirs.replication.quota.window.size.seconds",
        "authorizer.class.name",
        "auto.create.topics.enable",
        "auto.include.jmx.reporter",
        "auto.leader.rebalance.enable",
        "broker.heartbeat.interval.ms",
        "broker.id",
        "broker.id.generation.enable",
        "broker.rack",
        "broker.session.timeout.ms",
        "client.quota.callback.class",
        "connection.failed.authentication.delay.ms",
        "connections.max.idle.ms",
        "connections.max.reauth.ms",
        "control.plane.listener.name",
        "controlled.shutdown.enable",
        "controlled.shutdown.max.retries",
        "controlled.shutdown.retry.backoff.ms",
        "controller.listener.names",
        "controller.quorum.append.linger.ms",
        "controller.quorum.bootstrap.servers",
        "controller.quorum.election.backoff.max.ms",
        "controller.quorum.election.timeout.ms",
        "controller.quorum.fetch.timeout.ms",
        "controller.quorum.request.timeout.ms",
        "controller.quorum.retry.backoff.ms",
        "controller.quorum.voters",
        "controller.quota.window.num",
        "controller.quota.window.size.seconds",
        "controller.socket.timeout.ms",
        "create.topic.policy.class.name",
        "default.replication.factor",
        "delegation.token.expiry.check.interval.ms",
        "delegation.token.expiry.time.ms",
        "delegation.token.master.key",
        "delegation.token.max.lifetime.ms",
        "delegation.token.secret.key",
        "delete.records.purgatory.purge.interval.requests",
        "delete.topic.enable",
        "early.start.listeners",
        "eligible.leader.replicas.enable",
        "fetch.max.bytes",
        "fetch.purgatory.purge.interval.requests",
        "group.consumer.assignors",
        "group.consumer.heartbeat.interval.ms",
        "group.consumer.max.heartbeat.interval.ms",
        "group.consumer.max.session.timeout.ms",
        "group.consumer.max.size",
        "group.consumer.min.heartbeat.interval.ms",
        "group.consumer.min.session.timeout.ms",
        "group.consumer.session.timeout.ms",
        "group.coordinator.append.linger.ms",
        "group.coordinator.rebalance.protocols",
        "group.coordinator.threads",
        "group.initial.rebalance.delay.ms",
        "group.max.session.timeout.ms",
        "group.max.size",
        "group.min.session.timeout.ms",
        "group.share.delivery.count.limit",
        "group.share.heartbeat.interval.ms",
        "group.share.max.groups",
        "group.share.max.heartbeat.interval.ms",
        "group.share.max.record.lock.duration.ms",
        "group.share.max.session.timeout.ms",
        "group.share.max.size",
        "group.share.min.heartbeat.interval.ms",
        "group.share.min.record.lock.duration.ms",
        "group.share.min.session.timeout.ms",
        "group.share.partition.max.record.locks",
        "group.share.record.lock.duration.ms",
        "group.share.session.timeout.ms",
        "initial.broker.registration.timeout.ms",
        "inter.broker.listener.name",
        "inter.broker.protocol.version",
        "kafka.metrics.polling.interval.secs",
        "kafka.metrics.reporters",
        "leader.imbalance.check.interval.seconds",
        "leader.imbalance.per.broker.percentage",
        "log.cleaner.enable",
        "log.dir",
        "log.dir.failure.timeout.ms",
        "log.dirs",
        "log.flush.offset.checkpoint.interval.ms",
        "log.flush.scheduler.interval.ms",
        "log.flush.start.offset.checkpoint.interval.ms",
        "log.message.format.version",
        "log.retention.check.interval.ms",
        "log.retention.hours",
        "log.retention.minutes",
        "log.roll.hours",
        "log.roll.jitter.hours",
        "max.incremental.fetch.session.cache.slots",
        "max.request.partition.size.limit",
        "metadata.log.dir",
        "metadata.log.max.record.bytes.between.snapshots",
        "metadata.log.max.snapshot.interval.ms",
        "metadata.log.segment.bytes",
        "metadata.log.segment.ms",
        "metadata.max.idle.interval.ms",
        "metadata.max.retention.bytes",
        "metadata.max.retention.ms",
        "metrics.num.samples",
        "metrics.recording.level",
        "metrics.sample.window.ms",
        "node.id",
        "num.partitions",
        "num.replica.alter.log.dirs.threads",
        "offset.metadata.max.bytes",
        "offsets.commit.required.acks",
        "offsets.commit.timeout.ms",
        "offsets.load.buffer.size",
        "offsets.retention.check.interval.ms",
        "offsets.retention.minutes",
        "offsets.topic.compression.codec",
        "offsets.topic.num.partitions",
        "offsets.topic.replication.factor",
        "offsets.topic.segment.bytes",
        "password.encoder.cipher.algorithm",
        "password.encoder.iterations",
        "password.encoder.key.length",
        "password.encoder.keyfactory.algorithm",
        "password.encoder.old.secret",
        "password.encoder.secret",
        "process.roles",
        "producer.purgatory.purge.interval.requests",
        "queued.max.request.bytes",
        "queued.max.requests",
        "quota.window.num",
        "quota.window.size.seconds",
        "remote.log.manager.copier.thread.pool.size",
        "remote.log.manager.copy.quota.window.num",
        "remote.log.manager.copy.quota.window.size.seconds",
        "remote.log.manager.expiration.thread.pool.size",
        "remote.log.manager.fetch.quota.window.num",
        "remote.log.manager.fetch.quota.window.size.seconds",
        "remote.log.manager.task.interval.ms",
        "remote.log.manager.thread.pool.size",
        "remote.log.metadata.custom.metadata.max.bytes",
        "remote.log.metadata.manager.class.name",
        "remote.log.metadata.manager.class.path",
        "remote.log.metadata.manager.impl.prefix",
        "remote.log.metadata.manager.listener.name",
        "remote.log.reader.max.pending.tasks",
        "remote.log.reader.threads",
        "remote.log.storage.manager.class.name",
        "remote.log.storage.manager.class.path",
        "remote.log.storage.manager.impl.prefix",
        "remote.log.storage.system.enable",
        "replica.fetch.backoff.ms",
        "replica.fetch.max.bytes",
        "replica.fetch.min.bytes",
        "replica.fetch.response.max.bytes",
        "replica.fetch.wait.max.ms",
        "replica.high.watermark.checkpoint.interval.ms",
        "replica.lag.time.max.ms",
        "replica.selector.class",
        "replica.socket.receive.buffer.bytes",
        "replica.socket.timeout.ms",
        "replication.quota.window.num",
        "replication.quota.window.size.seconds",
        "request.timeout.ms",
        "reserved.broker.max.id",
        "sasl.client.callback.handler.class",
        "sasl.login.callback.handler.class",
        "sasl.login.class",
        "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms",
        "sasl.login.retry.backoff.max.ms",
        "sasl.login.retry.backoff.ms",
        "sasl.mechanism.controller.protocol",
        "sasl.oauthbearer.clock.skew.seconds",
        "sasl.oauthbearer.expected.audience",
        "sasl.oauthbearer.expected.issuer",
        "sasl.oauthbearer.jwks.endpoint.refresh.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.max.ms",
        "sasl.oauthbearer.jwks.endpoint.retry.backoff.ms",
        "sasl.oauthbearer.jwks.endpoint.url",
        "sasl.oauthbearer.scope.claim.name",
        "sasl.oauthbearer.sub.claim.name",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.server.callback.handler.class",
        "sasl.server.max.receive.size",
        "security.inter.broker.protocol",
        "security.providers",
        "socket.connection.setup.timeout.max.ms",
        "socket.connection.setup.timeout.ms",
        "socket.listen.backlog.size",
        "socket.receive.buffer.bytes",
        "socket.request.max.bytes",
        "socket.send.buffer.bytes",
        "ssl.allow.dn.changes",
        "ssl.allow.san.changes",
        "ssl.principal.mapping.rules",
        "telemetry.max.bytes",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "transaction.max.timeout.ms",
        "transaction.remove.expired.transaction.cleanup.interval.ms",
        "transaction.state.log.load.buffer.size",
        "transaction.state.log.min.isr",
        "transaction.state.log.num.partitions",
        "transaction.state.log.replication.factor",
        "transaction.state.log.segment.bytes",
        "transactional.id.expiration.ms",
        "zookeeper.clientCnxnSocket",
        "zookeeper.connect",
        "zookeeper.connection.timeout.ms",
        "zookeeper.max.in.flight.requests",
        "zookeeper.metadata.migration.enable",
        "zookeeper.session.timeout.ms",
        "zookeeper.set.acl",
        "zookeeper.ssl.cipher.suites",
        "zookeeper.ssl.client.enable",
        "zookeeper.ssl.crl.enable",
        "zookeeper.ssl.enabled.protocols",
        "zookeeper.ssl.endpoint.identification.algorithm",
        "zookeeper.ssl.keystore.location",
        "zookeeper.ssl.keystore.password",
        "zookeeper.ssl.keystore.type",
        "zookeeper.ssl.ocsp.enable",
        "zookeeper.ssl.protocol",
        "zookeeper.ssl.truststore.location",
        "zookeeper.ssl.truststore.password",
        "zookeeper.ssl.truststore.type",
    ]
)

_NO_GSSAPI = "Sluice offers no GSSAPI (Kerberos) mechanism, so no Kerberos login happens"
_NO_OAUTH = "the login refresh is OAUTHBEARER's, a mechanism Sluice does not offer"
_NO_POOL = (
    "Sluice has no such thread pool or buffer: a broker serves requests on one event loop and "
    "cleans logs in processes of their own (log.cleaner.threads)"
)
_NO_REMOTE = "Sluice has no tiered storage: every segment stays on the brokers' disks"

#: Kafka's dynamic keys Sluice takes without effect, and why that is the truth.
INERT: Final[dict[str, str]] = {
    **dict.fromkeys(
        [
            "sasl.kerberos.kinit.cmd",
            "sasl.kerberos.min.time.before.relogin",
            "sasl.kerberos.principal.to.local.rules",
            "sasl.kerberos.service.name",
            "sasl.kerberos.ticket.renew.jitter",
            "sasl.kerberos.ticket.renew.window.factor",
        ],
        _NO_GSSAPI,
    ),
    **dict.fromkeys(
        [
            "sasl.login.refresh.buffer.seconds",
            "sasl.login.refresh.min.period.seconds",
            "sasl.login.refresh.window.factor",
            "sasl.login.refresh.window.jitter",
        ],
        _NO_OAUTH,
    ),
    **dict.fromkeys(
        [
            "background.threads",
            "num.io.threads",
            "num.network.threads",
            "num.recovery.threads.per.data.dir",
            "num.replica.fetchers",
            "log.cleaner.io.buffer.size",
            "log.cleaner.io.buffer.load.factor",
        ],
        _NO_POOL,
    ),
    "metric.reporters": (
        "Sluice's metrics are its Prometheus endpoint (metrics.port); it loads no reporter classes"
    ),
    **dict.fromkeys(
        [
            "remote.fetch.max.wait.ms",
            "remote.log.index.file.cache.total.size.bytes",
            "remote.log.manager.copy.max.bytes.per.second",
            "remote.log.manager.fetch.max.bytes.per.second",
        ],
        _NO_REMOTE,
    ),
}

#: Kafka's defaults of the INERT keys (DescribeConfigs shows them while unset; None: no value).
INERT_DEFAULTS: Final[dict[str, str | None]] = {
    "background.threads": "10",
    "log.cleaner.io.buffer.load.factor": "0.9",
    "log.cleaner.io.buffer.size": "524288",
    "metric.reporters": "",
    "num.io.threads": "8",
    "num.network.threads": "3",
    "num.recovery.threads.per.data.dir": "1",
    "num.replica.fetchers": "1",
    "remote.fetch.max.wait.ms": "500",
    "remote.log.index.file.cache.total.size.bytes": "1073741824",
    "remote.log.manager.copy.max.bytes.per.second": "9223372036854775807",
    "remote.log.manager.fetch.max.bytes.per.second": "9223372036854775807",
    "sasl.kerberos.kinit.cmd": "/usr/bin/kinit",
    "sasl.kerberos.min.time.before.relogin": "60000",
    "sasl.kerberos.principal.to.local.rules": "DEFAULT",
    "sasl.kerberos.service.name": None,
    "sasl.kerberos.ticket.renew.jitter": "0.05",
    "sasl.kerberos.ticket.renew.window.factor": "0.8",
    "sasl.login.refresh.buffer.seconds": "300",
    "sasl.login.refresh.min.period.seconds": "60",
    "sasl.login.refresh.window.factor": "0.8",
    "sasl.login.refresh.window.jitter": "0.05",
}

#: DescribeConfigs' ConfigType codes (KIP-569).
CONFIG_TYPES: Final = {
    "BOOLEAN": 1, "STRING": 2, "INT": 3, "SHORT": 4, "LONG": 5, "DOUBLE": 6, "LIST": 7, "CLASS": 8,
    "PASSWORD": 9,
}  # fmt: skip

_OWN_SECURITY = (
    "Sluice's TLS and SASL settings are its own (the broker's configuration file: listeners, "
    "ssl.keystore.location, ssl.client.auth, sasl.enabled.mechanisms) and are read at start; "
    "taking this value would not change how clients are authenticated"
)

#: Kafka's dynamic keys Sluice refuses although Kafka takes them: the value would change what
#: Sluice does, and Sluice cannot (docs/COMPATIBILITY.md). Keys Sluice reads from its own
#: configuration file are refused too, by ``broker.config.BROKER_SETTINGS``.
SLUICE_REFUSED: Final[dict[str, str]] = {
    **dict.fromkeys(
        [
            "principal.builder.class",
            "sasl.jaas.config",
            "ssl.cipher.suites",
            "ssl.enabled.protocols",
            "ssl.endpoint.identification.algorithm",
            "ssl.engine.factory.class",
            "ssl.keymanager.algorithm",
            "ssl.protocol",
            "ssl.provider",
            "ssl.secure.random.implementation",
            "ssl.trustmanager.algorithm",
        ],
        _OWN_SECURITY,
    ),
    "max.connection.creation.rate": (
        "Sluice does not limit the rate of new connections; it limits open connections "
        "(max.connections, max.connections.per.ip in the broker's configuration file)"
    ),
    "producer.id.expiration.ms": (
        "Sluice never expires an idempotent producer's state (storage/producer_state.py), so a "
        "retry is never appended twice however late it comes"
    ),
    "transaction.partition.verification.enable": (
        "whether a partition leader verifies a transactional batch with the transaction "
        "coordinator is not configurable in Sluice"
    ),
    "unclean.leader.election.enable": (
        "Sluice reads unclean.leader.election.enable per topic only (a topic config, by "
        "AlterConfigs of the topic), never as a broker default"
    ),
}

_INT_RANGES: Final = {"INT": 2**31, "SHORT": 2**15, "LONG": 2**63}


def type_refusal(key: str, raw: str, kind: str) -> str | None:
    """Why ``raw`` is not a value of Kafka's config type ``kind`` (Kafka's words), or None."""
    value = raw.strip()
    if kind == "BOOLEAN":
        if value.lower() not in ("true", "false"):
            return f"Invalid value {raw} for configuration {key}: Expected value to be either true or false"
    elif kind in _INT_RANGES:
        bound = _INT_RANGES[kind]
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or not -bound <= number < bound:
            return f"Invalid value {raw} for configuration {key}: Not a number of type {kind}"
    elif kind == "DOUBLE":
        try:
            ok = not math.isnan(float(value))
        except ValueError:
            ok = False
        if not ok:
            return f"Invalid value {raw} for configuration {key}: Not a number of type DOUBLE"
    return None

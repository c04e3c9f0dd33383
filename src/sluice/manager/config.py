"""The manager's configuration: ``sluice manager start --config manager.properties``.

:data:`MANAGER_SETTINGS` lists every key; a bad key or value is refused, named, before the
manager connects anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice import properties as props
from sluice.cluster.zkstore import (
    ZK_AUTH_SETTINGS,
    ZkAuth,
    host_ports,
    parse_zookeeper_connect,
    pop_zk_auth,
)
from sluice.security.client import CLIENT_SETTINGS, PLAINTEXT, ClientSecurity, pop_client_security
from sluice.service.context import DEFAULT_WORKER_GROUP


@dataclass(frozen=True, slots=True)
class ManagerConfig:
    bootstrap: str
    zookeeper: str
    #: ZooKeeper digest credentials (``zookeeper.set.acl``, ``zookeeper.auth.*``); None: none
    zk_auth: ZkAuth | None = None
    host: str = "127.0.0.1"
    #: 0: any free port
    port: int = 8090
    #: None: /metrics on the manager's own port only (with a viewer's credentials)
    metrics_port: int | None = None
    #: the address the separate metrics port binds (it asks for no credentials)
    metrics_host: str = "127.0.0.1"
    worker_group: str = DEFAULT_WORKER_GROUP
    token_ttl_s: int = 12 * 3600
    sample_interval_ms: int = 5000
    alarm_interval_ms: int = 5000
    #: None: host name and port
    name: str | None = None
    #: Kafka's client keys: how the manager's broker calls (topics, groups, lag) authenticate
    security: ClientSecurity = PLAINTEXT

    @classmethod
    def from_properties(cls, values: Mapping[str, str], *, source: str = "manager config") -> ManagerConfig:
        fields: dict[str, Any] = props.resolve(
            MANAGER_SETTINGS, values, source=source, required=("bootstrap.servers", "zookeeper.connect")
        )
        if "token_ttl_minutes" in fields:
            fields["token_ttl_s"] = fields.pop("token_ttl_minutes") * 60
        fields["zk_auth"] = pop_zk_auth(fields, source)
        fields["security"] = pop_client_security(fields, source)
        return cls(**fields)


MANAGER_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting("bootstrap.servers", "bootstrap", host_ports, "host:port[,host:port...] of brokers"),
    props.Setting("zookeeper.connect", "zookeeper", parse_zookeeper_connect, "the cluster's ZooKeeper"),
    *ZK_AUTH_SETTINGS,
    props.Setting("manager.host", "host", props.non_empty, "address the console and API listen on"),
    props.Setting("manager.port", "port", props.integer(0, 65535), "port of the console and API (0: any)"),
    props.Setting(
        "metrics.port",
        "metrics_port",
        props.integer(0, 65535),
        "a separate Prometheus port, without credentials",
    ),
    props.Setting(
        "metrics.host", "metrics_host", props.non_empty, "the address metrics.port binds (127.0.0.1)"
    ),
    props.Setting("worker.group", "worker_group", props.non_empty, "the sync workers' group.id"),
    props.Setting("token.ttl.minutes", "token_ttl_minutes", props.integer(1, 60 * 24 * 30), "login lifetime"),
    props.Setting("sample.interval.ms", "sample_interval_ms", props.integer(500, 600_000), "lag sampling"),
    props.Setting("alarm.interval.ms", "alarm_interval_ms", props.integer(500, 600_000), "alarm evaluation"),
    props.Setting("manager.name", "name", props.non_empty, "this manager's name among several"),
    *CLIENT_SETTINGS,
)

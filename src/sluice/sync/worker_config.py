"""A sync worker's configuration: ``sluice worker start --config worker.properties``.

:data:`WORKER_SETTINGS` lists every key a worker accepts; :meth:`WorkerConfig.from_properties`
refuses any other key and any bad value, naming it, before the worker connects anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice import properties as props
from sluice.cluster.zkstore import (
    ZK_AUTH_SETTINGS,
    ZkAuth,
    host_ports,
    parse_zookeeper_connect,
    pop_zk_auth,
)
from sluice.metrics import METRICS_PORT_DOC, parse_metrics_port
from sluice.security.client import CLIENT_SETTINGS, PLAINTEXT, ClientSecurity, pop_client_security
from sluice.security.secrets import (
    DEFAULT_ENV_PREFIX,
    DEFAULT_SCOPE,
    DEFAULT_SECRETS_DIR,
    SecretScope,
    check_env_prefix,
    check_secrets_dir,
)

DEFAULT_GROUP = "sluice-workers"


def _spark_master(raw: str) -> str:
    value = raw.strip()
    if not (value.startswith(("local", "spark://", "yarn", "k8s://"))):
        raise ValueError("expected local[N], local[*], spark://host:port, yarn or k8s://...")
    return value


def _path(raw: str) -> Path:
    return Path(props.non_empty(raw)).expanduser()


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    bootstrap: str
    zookeeper: str | None = None
    #: ZooKeeper digest credentials (``zookeeper.set.acl``, ``zookeeper.auth.*``); None: none
    zk_auth: ZkAuth | None = None
    group: str = DEFAULT_GROUP
    #: None: host name and a random suffix (sync.worker.worker_name)
    name: str | None = None
    work_dir: Path = Path(".sluice/worker")
    #: None: local[*]
    spark_master: str | None = None
    session_timeout_s: float = 10.0
    #: the Prometheus endpoint (sluice.metrics): None serves none, 0 a free port
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    #: Kafka's client keys: how the worker's group membership, capture producers, apply reads
    #: (driver and executors) and admin calls authenticate to the brokers
    security: ClientSecurity = PLAINTEXT
    #: what its tasks' secret references may name here (``secrets.dir``, ``secrets.env.prefix``)
    secret_scope: SecretScope = DEFAULT_SCOPE

    @classmethod
    def from_properties(cls, values: Mapping[str, str], *, source: str = "worker config") -> WorkerConfig:
        """A worker's configuration from ``.properties`` keys; ConfigError names a bad key."""
        fields: dict[str, Any] = props.resolve(
            WORKER_SETTINGS, values, source=source, required=("bootstrap.servers",)
        )
        if "session_timeout_ms" in fields:
            fields["session_timeout_s"] = fields.pop("session_timeout_ms") / 1000.0
        fields["zk_auth"] = pop_zk_auth(fields, source)
        fields["security"] = pop_client_security(fields, source)
        fields["secret_scope"] = SecretScope(
            fields.pop("secrets_dir", DEFAULT_SECRETS_DIR),
            fields.pop("secrets_env_prefix", DEFAULT_ENV_PREFIX),
        )
        return cls(**fields)


WORKER_SETTINGS: tuple[props.Setting, ...] = (
    props.Setting("bootstrap.servers", "bootstrap", host_ports, "host:port[,host:port...] of brokers"),
    props.Setting("zookeeper.connect", "zookeeper", parse_zookeeper_connect, "where task definitions live"),
    *ZK_AUTH_SETTINGS,
    props.Setting("group.id", "group", props.non_empty, "workers of one group share its tasks"),
    props.Setting("worker.name", "name", props.non_empty, "this worker's name, unique in its group"),
    props.Setting("work.dir", "work_dir", _path, "working directory (Spark checkpoints)"),
    props.Setting("spark.master", "spark_master", _spark_master, "Spark master URL (default local[*])"),
    props.Setting(
        "session.timeout.ms",
        "session_timeout_ms",
        props.integer(1000, 600_000),
        "worker group session timeout",
    ),
    props.Setting("metrics.port", "metrics_port", parse_metrics_port, METRICS_PORT_DOC),
    props.Setting("metrics.host", "metrics_host", props.non_empty, "address the metrics endpoint binds"),
    props.Setting(
        "secrets.dir",
        "secrets_dir",
        check_secrets_dir,
        f"a task's `{{file: PATH}}` secret must be a file under it (default {DEFAULT_SECRETS_DIR})",
    ),
    props.Setting(
        "secrets.env.prefix",
        "secrets_env_prefix",
        check_env_prefix,
        f"a task's `{{env: NAME}}` secret must be a variable named so (default {DEFAULT_ENV_PREFIX})",
    ),
    *CLIENT_SETTINGS,
)

"""Kafka Connect in distributed mode, with Debezium's MySQL connector on its plugin path, as a
peer that writes into Sluice (issue 20).

The jars are Apache Kafka's and Debezium's own, fetched by ``scripts/peers.sh`` (versions pinned
in ``bench/peers/connect/pom.xml``) into ``.peers/connect-<version>/libs`` (the worker) and
``.peers/connect-<version>/plugins/debezium-connector-mysql`` (the connector, isolated by
Connect's plugin class loader); nothing of them is part of Sluice. Debezium's JDBC sink connector
(``bench/peers/connect-jdbc/pom.xml``, ``.peers/connect-jdbc-<version>/plugins``) is a second
directory on the worker's plugin path when it is fetched: the peer pipeline MariaDB -> Debezium
-> Kafka -> JDBC sink -> PostgreSQL that issue 36 measures Sluice against
(`debezium_jdbc_sink_config`). A worker keeps everything it
writes under one directory::

    worker.properties   the distributed worker's configuration (written by ``start``)
    log4j.properties    where it logs
    connect.log         its log (Connect's and Debezium's)
    stdout.log          the JVM's own output (a failed start's exception lands here too)
    worker.pid          the running JVM

The worker's state (connector configs, source offsets, statuses) lives in three Kafka topics of
the cluster it is pointed at; Connect requires them compacted (``cleanup.policy=compact``) and
refuses to start otherwise. ``ConnectWorker.stop`` sends SIGTERM (Connect stops its tasks and
flushes offsets), then SIGKILL after a grace; ``kill`` is kill -9.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.ops.ports import free_ports
from sluice.ops.processes import pid_alive
from sluice.ops.zookeeper import find_java

__all__ = [
    "CONNECT_VERSION",
    "DEBEZIUM_VERSION",
    "JDBC_SINK_VERSION",
    "ConnectError",
    "ConnectWorker",
    "connect_home",
    "debezium_jdbc_sink_config",
    "debezium_mysql_config",
    "jdbc_sink_home",
    "schema_converters",
]

log = logging.getLogger("sluice.peers.connect")

#: Pinned in ``bench/peers/connect/pom.xml`` (Debezium 3.6.1 is built against Kafka 4.3.0).
CONNECT_VERSION = "4.3.0"
DEBEZIUM_VERSION = "3.6.1.Final"
HEAP = "-Xmx512m"
_MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectDistributed"
MYSQL_CONNECTOR = "io.debezium.connector.mysql.MySqlConnector"
#: Pinned in ``bench/peers/connect-jdbc/pom.xml``: Maven Central has no JDBC sink of 3.6.1.Final,
#: 3.6.0.Final is the newest of the MySQL connector's line
JDBC_SINK_VERSION = "3.6.0.Final"
JDBC_SINK_CONNECTOR = "io.debezium.connector.jdbc.JdbcSinkConnector"
_JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"


class ConnectError(Exception):
    """A Connect worker cannot be started, reached or configured; the message says what next."""


def _project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _fetched(name: str, what: str) -> Path:
    """``.peers/<name>`` (``SLUICE_PEERS_DIR`` overrides ``.peers``) once scripts/peers.sh has
    finished it; else ConnectError naming ``what`` and the set-up step."""
    base = Path(os.environ.get("SLUICE_PEERS_DIR") or _project_root() / ".peers")
    home = base / name
    if not (home / ".complete").is_file():
        raise ConnectError(
            f"{what} not fetched (no {home}): run scripts/peers.sh (needs Maven and Maven Central)"
        )
    return home


def connect_home(version: str = CONNECT_VERSION) -> Path:
    """``.peers/connect-<version>``, holding ``libs`` and ``plugins``; ConnectError naming the
    set-up step when it is not fetched."""
    return _fetched(f"connect-{version}", f"Kafka Connect {version} and Debezium are")


def jdbc_sink_home(version: str = JDBC_SINK_VERSION) -> Path:
    """``.peers/connect-jdbc-<version>``, holding ``plugins/debezium-connector-jdbc``;
    ConnectError naming the set-up step when it is not fetched."""
    return _fetched(f"connect-jdbc-{version}", f"Debezium's JDBC sink connector {version} is")


def plugin_path(version: str = CONNECT_VERSION) -> str:
    """The worker's ``plugin.path``: Debezium's MySQL connector, and the JDBC sink's directory
    when it is fetched."""
    paths = [str(connect_home(version) / "plugins")]
    try:
        paths.append(str(jdbc_sink_home() / "plugins"))
    except ConnectError:
        pass
    return ",".join(paths)


def schema_converters() -> dict[str, str]:
    """A connector's own converters with schemas in every record (JSON with ``schema`` and
    ``payload``): the JDBC sink builds and evolves its tables from them, so the source connector
    that feeds it writes them too (a worker's default converters stay schemaless)."""
    return {
        "key.converter": _JSON_CONVERTER,
        "value.converter": _JSON_CONVERTER,
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
    }


def debezium_jdbc_sink_config(
    *,
    url: str,
    user: str,
    password: str,
    topics_regex: str,
    tasks: int = 1,
    batch_size: int = 500,
) -> dict[str, str]:
    """Debezium's JDBC sink connector writing the change events of the topics ``topics_regex``
    matches into the database of the JDBC ``url`` (e.g. ``jdbc:postgresql://127.0.0.1:5432/db``):
    upsert on the record key (the source's primary key), deletes and truncates applied, tables
    created and widened from the records' schemas (``schema.evolution=basic``), each table named
    as the source's (``${source.table}``). The records carry their schemas
    (`schema_converters`)."""
    return {
        "connector.class": JDBC_SINK_CONNECTOR,
        "tasks.max": str(tasks),
        "topics.regex": topics_regex,
        "connection.url": url,
        "connection.username": user,
        "connection.password": password,
        "insert.mode": "upsert",
        "primary.key.mode": "record_key",
        "delete.enabled": "true",
        "truncate.enabled": "true",
        "schema.evolution": "basic",
        "collection.name.format": "${source.table}",
        "batch.size": str(batch_size),
        "use.time.zone": "UTC",
        **schema_converters(),
    }


def worker_properties(
    bootstrap: str,
    port: int,
    plugin_path: Path | str,
    *,
    group_id: str = "sluice-connect",
    topic_prefix: str = "connect",
    replication_factor: int = 3,
    schemas_enable: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """A distributed worker's configuration: JSON converters, its three internal topics
    (``<prefix>-configs``, ``-offsets``, ``-status``) at ``replication_factor``, a REST listener on
    127.0.0.1:``port``, offsets flushed every second. ``extra`` overrides any of it."""
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": str(schemas_enable).lower(),
        "value.converter.schemas.enable": str(schemas_enable).lower(),
        "config.storage.topic": f"{topic_prefix}-configs",
        "offset.storage.topic": f"{topic_prefix}-offsets",
        "status.storage.topic": f"{topic_prefix}-status",
        "config.storage.replication.factor": str(replication_factor),
        "offset.storage.replication.factor": str(replication_factor),
        "status.storage.replication.factor": str(replication_factor),
        "offset.storage.partitions": "5",
        "status.storage.partitions": "1",
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": str(port),
        "plugin.path": str(plugin_path),
        # the producer that writes change events: every record on every in-sync replica
        "producer.acks": "all",
        "producer.enable.idempotence": "true",
    }
    props.update(extra or {})
    return props


def debezium_mysql_config(
    *,
    host: str,
    port: int,
    user: str,
    password: str,
    database: str,
    server_id: int,
    topic_prefix: str,
    bootstrap: str,
    history_topic: str,
    tables: list[str] | None = None,
    partitions: int = 3,
) -> dict[str, str]:
    """The Debezium MySQL connector's configuration for one database: an initial snapshot, then
    the binlog; one task (Debezium's MySQL connector never has more); its schema history in
    ``history_topic`` of the same cluster."""
    config = {
        "connector.class": MYSQL_CONNECTOR,
        "tasks.max": "1",
        "database.hostname": host,
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.server.id": str(server_id),
        "topic.prefix": topic_prefix,
        "database.include.list": database,
        "snapshot.mode": "initial",
        "include.schema.changes": "false",
        # truncates too (Debezium skips them by default): the target must lose those rows
        "skipped.operations": "none",
        "schema.history.internal.kafka.bootstrap.servers": bootstrap,
        "schema.history.internal.kafka.topic": history_topic,
        # Sluice creates no topic on a metadata request: the worker creates each table's topic
        # (Connect's topic.creation, KIP-158) replicated 3 ways, min.insync.replicas 2
        "topic.creation.default.replication.factor": "3",
        "topic.creation.default.partitions": str(partitions),
        "topic.creation.default.min.insync.replicas": "2",
    }
    if tables:
        config["table.include.list"] = ",".join(f"{database}.{t}" for t in tables)
    return config


_LOG4J = """log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={path}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.reflections=ERROR
log4j.logger.org.apache.kafka.clients.consumer.internals=WARN
log4j.logger.org.apache.kafka.clients.producer.internals=WARN
"""


@dataclass
class ConnectWorker:
    """One distributed Connect worker (a JVM in its own session), its files under ``directory``.

    ``start`` writes the properties and returns once the REST API answers; ``start(wait=False)``
    returns at once (for a start that is expected to fail: see ``wait_exit``)."""

    directory: Path
    bootstrap: str
    group_id: str = "sluice-connect"
    topic_prefix: str = "connect"
    replication_factor: int = 3
    schemas_enable: bool = False
    extra: dict[str, str] = field(default_factory=dict)
    version: str = CONNECT_VERSION
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.directory = Path(self.directory).resolve()
        if not self.port:
            self.port = free_ports(1)[0]

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "connect.log"

    def log_text(self) -> str:
        """The worker's log and its JVM output, for messages and assertions."""
        parts = []
        for p in (self.log_path, self.directory / "stdout.log"):
            try:
                parts.append(p.read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(parts)

    def start(self, *, wait: bool = True, timeout_s: float = 120) -> ConnectWorker:
        if self.proc is not None and self.proc.poll() is None:
            raise ConnectError(
                f"the Connect worker in {self.directory} is already running (pid {self.proc.pid})"
            )
        home = connect_home(self.version)
        java = find_java()
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        props = worker_properties(
            self.bootstrap,
            self.port,
            plugin_path(self.version),
            group_id=self.group_id,
            topic_prefix=self.topic_prefix,
            replication_factor=self.replication_factor,
            schemas_enable=self.schemas_enable,
            extra=self.extra,
        )
        (d / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (d / "log4j.properties").write_text(_LOG4J.format(path=self.log_path))
        cmd = [
            java,
            HEAP,
            "-XX:+UseG1GC",
            "-XX:TieredStopAtLevel=1",  # a 2-core machine: quick start over peak speed
            f"-Dlog4j.configuration=file:{d / 'log4j.properties'}",
            "-cp",
            f"{home / 'libs'}/*",
            _MAIN_CLASS,
            str(d / "worker.properties"),
        ]
        with (d / "stdout.log").open("ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        (d / "worker.pid").write_text(str(self.proc.pid))
        log.info("event=connect_worker_started pid=%d rest=%s dir=%s", self.proc.pid, self.rest_url, d)
        if wait:
            try:
                self.wait_ready(timeout_s)
            except BaseException:
                self.stop(grace_s=5)
                raise
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until the REST API lists connectors (the worker has joined its group and read its
        config topic); a worker that exits meanwhile raises with the end of its log."""
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.running():
                raise ConnectError(
                    f"the Connect worker exited during start; its log ends:\n{self.log_text()[-3000:]}"
                )
            try:
                self.request("GET", "/connectors", timeout_s=5)
                return
            except (ConnectError, OSError) as exc:
                last = str(exc)
            time.sleep(0.5)
        raise ConnectError(
            f"the Connect worker did not answer in {timeout_s:.0f} s ({last}); see {self.directory}"
        )

    def wait_exit(self, timeout_s: float) -> int | None:
        """The worker's exit code once it exits, or None if it still runs after ``timeout_s``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def request(self, method: str, path: str, body: Any = None, timeout_s: float = 30) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.rest_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ConnectError(f"Connect REST {method} {path} answered {exc.code}: {detail}") from None
        return json.loads(raw) if raw else None

    def put_connector(self, name: str, config: dict[str, str]) -> Any:
        """Create or update connector ``name`` (PUT /connectors/<name>/config, idempotent)."""
        return self.request("PUT", f"/connectors/{name}/config", config)

    def status(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/connectors/{name}/status")
        return result

    def wait_running(self, name: str, timeout_s: float = 120) -> dict[str, Any]:
        """Until connector ``name`` and all its tasks are RUNNING; a FAILED one raises with its
        trace."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.status(name)
            except (ConnectError, OSError) as exc:
                last = str(exc)
            else:
                states = [last["connector"]["state"], *(t["state"] for t in last.get("tasks", []))]
                if "FAILED" in states:
                    traces = [
                        last["connector"].get("trace"),
                        *(t.get("trace") for t in last.get("tasks", [])),
                    ]
                    trace = next((t for t in traces if t), "")
                    raise ConnectError(f"connector {name} FAILED:\n{trace[:3000]}")
                if last.get("tasks") and set(states) == {"RUNNING"}:
                    return dict(last)
            time.sleep(0.5)
        raise ConnectError(f"connector {name} not RUNNING after {timeout_s:.0f} s (last status: {last})")

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM (Connect stops its tasks and commits their offsets), SIGKILL after
        ``grace_s``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("event=connect_worker_killed pid=%d reason='no exit %.0f s after SIGTERM'",
                            self.proc.pid, grace_s)  # fmt: skip
                self.proc.kill()
                self.proc.wait(10)
        log.info("event=connect_worker_stopped pid=%d code=%s", self.proc.pid, self.proc.returncode)
        self.proc = None

    def kill(self) -> None:
        """kill -9: no offset flush, no leave-group; the next start resumes from the last
        committed offsets."""
        if self.proc is not None and pid_alive(self.proc.pid):
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

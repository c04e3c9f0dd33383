"""Sync tasks: a definition stored once in ZooKeeper, run by whichever worker holds it.

ZooKeeper layout (under the cluster's chroot):

    /tasks/{id}              the definition (JSON; created from YAML by `sluice task create`,
                             replaced by `sluice task update`)
    /task_epochs/{id}        the fencing epoch counter: every start of an execution takes the
                             next value with a compare-and-set, so two executions never share one.
                             It outlives the task: a task deleted and created again under the same
                             id goes on from the epoch its target already holds
    /tasks/{id}/control      what operators asked for: paused, restart count, restart position,
                             re-snapshot requests not yet served
    /tasks/{id}/status       ephemeral, owned by the running execution: execution id, epoch,
                             worker, positions and lag (gone when the execution's session is);
                             written only by the execution with the newest epoch
    /tasks/{id}/alarms/      persistent sequential alarms (duplicate executions, errors)
    /tasks/{id}/executions/  persistent sequential, one per execution (`execution-N`): execution
                             id, epoch, worker, started, ended (None while it runs), outcome
                             (running, stopped, failed, superseded, fenced) and error; written at
                             its start and updated in place at its end; the newest
                             EXECUTIONS_KEPT are kept. Created with the task (a task created
                             before the history gets it at its next execution)

    /config/secret_scope     the cluster's secret scope, {"dir", "env_prefix"}: what a task's
                             `{file:}` and `{env:}` references may name (absent: the defaults,
                             /etc/sluice/secrets and SLUICE_SECRET_)

A definition is validated before it is stored; errors name the bad field
(`task.source.port: must be an integer in 1..65535`). Secrets are references
(`password: {env: SLUICE_SECRET_SHOP_DB}` or `{file: /etc/sluice/secrets/shop}`, security/secrets.py),
resolved by the worker when it starts the task (`resolved`, within the worker's own scope); a new
definition with a plain-text secret, or a reference outside the cluster's scope (`check_scope`), is
refused. Definitions stored before references may hold plain text: they are read and run as they
are, and the worker warns at each start.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson

from sluice.cluster.zkstore import FencingCounter, update_znode
from sluice.security.secrets import (
    PLAIN,
    Secret,
    SecretRef,
    SecretRefError,
    SecretScope,
    parse_ref,
    resolve,
    revealed,
    url_has_password,
)
from sluice.sync.dead_letters import dead_letter_topic
from sluice.sync.schema import POLICIES
from sluice.sync.sources.mysql_values import ZERO_DATE_POLICIES
from sluice.sync.targets.mapping import ColumnMapping, MappingError

TASKS = "/tasks"
EPOCHS = "/task_epochs"
SECRET_SCOPE = "/config/secret_scope"
#: executions kept in a task's history; the oldest go first
EXECUTIONS_KEPT = 50
EXECUTION_OUTCOMES = ("running", "stopped", "failed", "superseded", "fenced")
#: How long one best-effort ZooKeeper call (a task's history, clearing its status at its stop)
#: is waited on: kazoo holds a call while it reconnects, for good without ZooKeeper.
BEST_EFFORT_CALL_S = 2.0
_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_PG_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
SOURCE_KINDS = ("mysql", "mariadb", "postgresql", "generator")
#: sources that capture a database's changes (a transactions topic, tables named)
DATABASE_SOURCES = ("mysql", "mariadb", "postgresql")


def parse_duration(text: str) -> float:
    """Seconds from "1s", "500ms" or "2.5"; ValueError unless positive."""
    raw = text.strip().lower()
    if raw.endswith("ms"):
        value = float(raw[:-2]) / 1000
    elif raw.endswith("s"):
        value = float(raw[:-1])
    else:
        value = float(raw)
    if not value > 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return value


def redact(url: str) -> str:
    """A connection URL without its password, for printing."""
    scheme, sep, rest = url.partition("://")
    creds, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in creds:
        return url
    return f"{scheme}://{creds.split(':', 1)[0]}:***@{host}"


class TaskSpecError(ValueError):
    """A task definition with a bad field; the message names the field."""


class TaskNotFoundError(KeyError):
    pass


@dataclass
class SourceSpec:
    kind: str
    host: str = "127.0.0.1"
    port: int = 3306
    user: str = "root"
    #: a reference in a definition; a resolved Secret in the worker that runs the task
    password: SecretRef | Secret | None = None
    database: str = ""
    server_id: int | None = None
    # postgresql: the publication and logical replication slot (default `sluice_<task>`, created
    # when missing), and the schema of table names given without one (default public)
    publication: str = ""
    slot: str = ""
    schema: str = ""
    # postgresql: install a DDL event trigger (needs a superuser) so an ALTER TABLE reaches the
    # capture when it commits, not at the table's next change
    ddl_trigger: bool = False
    # generator
    rate: float = 1000.0
    skew: float = 2.0
    seed: int = 1


@dataclass
class TaskSpec:
    id: str
    source: SourceSpec
    target: str
    tables: list[str] = field(default_factory=list)
    topic: str = "{task}.changes"  # "{task}" and "{table}" are replaced
    mapping: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    #: the target's password (`target: {url: ..., password: {env: ...}}`); the URL holds none
    target_password: SecretRef | Secret | None = None

    def topic_for(self, table: str) -> str:
        return self.topic.replace("{task}", self.id).replace("{table}", table)

    def transactions_topic(self) -> str:
        """Where a MySQL/MariaDB capture writes its transaction boundaries (cuts) and, with the
        option transaction_metadata, BEGIN/END records (sync/sources/transactions.py)."""
        return f"{self.id}.transactions"

    def topics(self) -> list[str]:
        if "{table}" in self.topic:
            return sorted({self.topic_for(t) for t in self.tables})
        return [self.topic_for("")]

    def dlq_topic(self) -> str:
        """Where the changes the target refused go under `on_refused: dlq` (sync.dead_letters)."""
        return dead_letter_topic(self.id)

    def to_doc(self, *, shown: bool = False) -> dict[str, Any]:
        """The definition as stored (`shown=False`) or as the API and the CLI show it: secrets as
        their references, plain text of an old definition as ***, the target URL's password as
        ***. Never of a resolved spec: its secrets are values."""

        def secret(value: SecretRef | Secret | None) -> Any:
            assert not isinstance(value, Secret), "a resolved definition is never stored or shown"
            return None if value is None else value.shown() if shown else value.stored()

        source = {**asdict(self.source), "password": secret(self.source.password)}
        if source["password"] is None:
            del source["password"]
        url = redact(self.target) if shown else self.target
        target: Any = (
            url if self.target_password is None else {"url": url, "password": secret(self.target_password)}
        )
        doc = {**asdict(self), "source": source, "target": target}
        del doc["target_password"]
        return doc

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_doc())

    def plain_text_secrets(self) -> list[str]:
        """The fields of a definition stored before references that still hold plain text."""
        fields = []
        if isinstance(self.source.password, SecretRef) and self.source.password.kind == PLAIN:
            fields.append("task.source.password")
        if url_has_password(self.target):
            fields.append("task.target")
        return fields

    def secrets(self) -> list[str]:
        """The plain-text passwords of a definition stored before references, to scrub from any
        text that may be shown or logged (resolved references are scrubbed by `scrub` itself)."""
        found = []
        if isinstance(self.source.password, SecretRef) and self.source.password.kind == PLAIN:
            found.append(self.source.password.name)
        creds = self.target.partition("://")[2].rpartition("@")[0]
        if ":" in creds:
            found.append(creds.split(":", 1)[1])
        return [f for f in found if f]

    @classmethod
    def from_json(cls, data: bytes) -> TaskSpec:
        return parse_spec(orjson.loads(data), stored=True)


def check_scope(spec: TaskSpec, scope: SecretScope) -> None:
    """TaskSpecError naming the field and the rule unless every secret reference of `spec` is in
    `scope` (the cluster's, when a task is defined)."""
    try:
        scope.check(_ref(spec.source.password), "task.source.password")
        scope.check(_ref(spec.target_password), "task.target.password")
    except SecretRefError as exc:
        raise TaskSpecError(str(exc)) from None


def _ref(value: SecretRef | Secret | None) -> SecretRef | None:
    assert not isinstance(value, Secret), "a definition's scope is checked before it is resolved"
    return value


def resolved(spec: TaskSpec, scope: SecretScope, environ: Any = None) -> TaskSpec:
    """A copy of `spec` with its secrets read here, on the worker that runs it, within this
    worker's `scope` (SecretError names the task, the field and the missing variable or file, or
    the rule a reference breaks). Old plain text resolves to itself."""

    def one(value: SecretRef | Secret | None, name: str) -> Secret | None:
        if value is None or isinstance(value, Secret):
            return value
        return resolve(value, task=spec.id, field=name, scope=scope, environ=environ)

    source = replace(spec.source, password=one(spec.source.password, "task.source.password"))
    return replace(spec, source=source, target_password=one(spec.target_password, "task.target.password"))


#: the password of a URL (`scheme://user:password@host`), wherever a message quotes one
#: (up to the authority's last @: a password may hold an unencoded @)
_URL_PASSWORD = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)\S*@(?=[^@/\s]*(?:[/\s?#]|$))")


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret replaced by ***, every secret this process resolved too
    (security.secrets.revealed), and the password of any URL in it (a task's definition may be
    gone, or a driver may quote a URL the definition did not name)."""
    for secret in sorted(set(secrets) | revealed(), key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return _URL_PASSWORD.sub(r"\1***@", text)


_OPTIONS = {
    "trigger": str,
    "max_records_per_trigger": int,
    "spark_master": str,
    "partitions": int,
    "replication_factor": int,
    # MySQL/MariaDB: tables with at least this many rows are snapshotted by a Spark job in key
    # ranges of `snapshot_chunk_rows`, read in parallel; re-snapshots read chunks of that size
    "snapshot_parallel_rows": int,
    "snapshot_chunk_rows": int,
    # a change the target refuses: stop the query (the default) or dead-letter it (sync.dead_letters)
    "on_refused": str,
    # what the target does with a schema change from the source (sync/targets/evolution.py)
    "schema_change_policy": str,
    # MySQL/MariaDB: "true" writes BEGIN/END records to {task}.transactions and
    # source.transaction into each change (as Debezium's provide.transaction.metadata)
    "transaction_metadata": str,
    # MySQL/MariaDB: how often an idle capture writes its position (position markers and a cut)
    "heartbeat_interval": str,
    # MySQL/MariaDB: zero and invalid dates (0000-00-00, 2024-02-30): null, or stop the capture
    # (sync/sources/mysql_values.py)
    "zero_dates": str,
    # PostgreSQL: the slot session's logical_decoding_work_mem (e.g. 64MB; default the server's):
    # a transaction in progress past it is streamed to the capture in blocks, not spilled on the
    # primary's disk (sync/sources/postgresql.py)
    "logical_decoding_work_mem": str,
    # Delta target: compact each table's small files (OPTIMIZE) every this many batches
    # (sync/targets/delta.py; default 100)
    "optimize_every": int,
}
#: the values an enum option may take (the first is its default)
_OPTION_VALUES: dict[str, tuple[str, ...]] = {
    "on_refused": ("stop", "dlq"),
    "schema_change_policy": POLICIES,
    "transaction_metadata": ("false", "true"),
    "zero_dates": ZERO_DATE_POLICIES,
}


def parse_spec(doc: Any, *, stored: bool = False) -> TaskSpec:
    """Validate a task definition (a mapping, e.g. from YAML) into a TaskSpec. Plain-text secrets
    are refused, naming the field and how to write it, unless `stored` (read from ZooKeeper: a
    definition stored before references)."""
    if not isinstance(doc, dict):
        raise TaskSpecError("task: must be a mapping with id, source, target")
    unknown = set(doc) - {"id", "source", "target", "tables", "topic", "mapping", "options"}
    if unknown:
        raise TaskSpecError(f"task: unknown field(s) {', '.join(sorted(unknown))}")
    task_id = doc.get("id")
    if not isinstance(task_id, str) or not _ID.match(task_id):
        raise TaskSpecError("task.id: must be 1-63 lowercase letters, digits, '.', '_' or '-'")
    target, target_password = _parse_target(doc.get("target"), stored)
    source = _parse_source(doc.get("source"), stored)
    tables = doc.get("tables", [])
    if not isinstance(tables, list) or not all(isinstance(t, str) and t for t in tables):
        raise TaskSpecError("task.tables: must be a list of table names")
    if source.kind in DATABASE_SOURCES and not tables:
        raise TaskSpecError(f"task.tables: a {source.kind} source needs the tables to capture")
    topic = doc.get("topic", "{task}.changes")
    if not isinstance(topic, str) or not topic:
        raise TaskSpecError("task.topic: must be a topic name, with optional {task} and {table}")
    if "{table}" in topic and not tables:
        raise TaskSpecError("task.topic: {table} needs the list of tables")
    mapping = doc.get("mapping", {}) or {}
    try:
        ColumnMapping.from_config(mapping)
    except MappingError as exc:
        raise TaskSpecError(f"task.{exc}") from None
    options = doc.get("options", {}) or {}
    if not isinstance(options, dict):
        raise TaskSpecError("task.options: must be a mapping")
    for name, value in options.items():
        kind = _OPTIONS.get(name)
        if kind is None:
            raise TaskSpecError(f"task.options.{name}: unknown option (known: {', '.join(sorted(_OPTIONS))})")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise TaskSpecError(f"task.options.{name}: must be {'an integer' if kind is int else 'a string'}")
        if kind is int and isinstance(value, int) and value < 1:
            raise TaskSpecError(f"task.options.{name}: must be a positive integer, not {value}")
        if name in _OPTION_VALUES and value not in _OPTION_VALUES[name]:
            raise TaskSpecError(
                f"task.options.{name}: must be one of {', '.join(_OPTION_VALUES[name])}, not {value!r}"
            )
        if name == "logical_decoding_work_mem" and not re.fullmatch(r"[1-9][0-9]*(kB|MB|GB)", str(value)):
            raise TaskSpecError(f"task.options.{name}: must be a size like 64MB or 512kB, not {value!r}")
        if name == "optimize_every" and not target.startswith("delta:"):
            raise TaskSpecError(f"task.options.{name}: compacts a Delta target's files; this target is none")
        if name in ("trigger", "heartbeat_interval"):
            try:
                parse_duration(str(value))
            except ValueError:
                raise TaskSpecError(
                    f"task.options.{name}: must be a duration like 1s or 500ms, not {value!r}"
                ) from None
    return TaskSpec(
        task_id, source, target, list(tables), topic, dict(mapping), dict(options), target_password
    )


_TARGET_FORMS = (
    "task.target: must be sqlite:///path, postgresql://user@host:port/db, mysql://user@host:port/db, "
    "or {url: postgresql://user@host:port/db, password: {env: SLUICE_SECRET_SHOP_PG}} "
    "delta:///path/to/lake (`type: postgresql|mysql|sqlite|delta` may name the kind)"
)
#: target kinds and the URL schemes each takes
TARGET_SCHEMES = {
    "sqlite": ("sqlite:///",),
    "postgresql": ("postgresql://", "postgres://"),
    "mysql": ("mysql://", "mariadb://"),
    "delta": ("delta:",),
}


def _parse_target(doc: Any, stored: bool) -> tuple[str, SecretRef | None]:
    """The target URL and its password's reference: a URL, or `{url: ..., password: {env: ...}}`.
    A password inside the URL is refused (it would be stored and shown with the URL)."""
    password: SecretRef | None = None
    kind = None
    if isinstance(doc, dict):
        unknown = set(doc) - {"type", "url", "password"}
        if unknown:
            raise TaskSpecError(
                f"task.target: unknown field(s) {', '.join(sorted(unknown))} (known: type, url, password)"
            )
        kind = doc.get("type")
        if kind is not None and kind not in TARGET_SCHEMES:
            raise TaskSpecError(f"task.target.type: one of {', '.join(TARGET_SCHEMES)}, not {kind!r}")
        try:
            password = parse_ref(doc.get("password"), "task.target.password", stored=stored)
        except SecretRefError as exc:
            raise TaskSpecError(str(exc)) from None
        doc = doc.get("url")
    if not isinstance(doc, str) or not doc.startswith(sum(TARGET_SCHEMES.values(), ())):
        raise TaskSpecError(_TARGET_FORMS)
    if kind is not None and not doc.startswith(TARGET_SCHEMES[kind]):
        raise TaskSpecError(
            f"task.target.url: a {kind} target's URL starts with {' or '.join(TARGET_SCHEMES[kind])}"
        )
    if password is not None and doc.startswith(("sqlite:", "delta:")):
        raise TaskSpecError(
            f"task.target.password: a {doc.split(':', 1)[0]} target has no password: remove it"
        )
    if not stored and url_has_password(doc):
        raise TaskSpecError(
            "task.target: a password in the URL is refused (it would be stored in ZooKeeper in plain "
            "text): write the URL without it and name the password, `target: {url: "
            "postgresql://user@host:5432/db, password: {env: SLUICE_SECRET_SHOP_PG}}` "
            "(or {file: /etc/sluice/secrets/shop-pg})"
        )
    return doc, password


def _parse_source(doc: Any, stored: bool) -> SourceSpec:
    if not isinstance(doc, dict):
        raise TaskSpecError(
            "task.source: must be a mapping with kind (mysql, mariadb, postgresql or generator)"
        )
    kind = doc.get("kind")
    if kind not in SOURCE_KINDS:
        raise TaskSpecError(f"task.source.kind: must be one of {', '.join(SOURCE_KINDS)}, not {kind!r}")
    known = set(SourceSpec.__dataclass_fields__)
    unknown = set(doc) - known
    if unknown:
        raise TaskSpecError(f"task.source: unknown field(s) {', '.join(sorted(unknown))}")
    try:
        password = parse_ref(doc.get("password"), "task.source.password", stored=stored)
    except SecretRefError as exc:
        raise TaskSpecError(str(exc)) from None
    if kind == "postgresql":  # PostgreSQL's own defaults where the definition is silent
        doc = {"port": 5432, "user": "postgres", **doc}
    spec = SourceSpec(**{**doc, "password": password})
    if not isinstance(spec.port, int) or isinstance(spec.port, bool) or not 1 <= spec.port <= 65535:
        raise TaskSpecError("task.source.port: must be an integer in 1..65535")
    for name in ("host", "user", "database"):
        if not isinstance(getattr(spec, name), str):
            raise TaskSpecError(f"task.source.{name}: must be a string")
    if kind in DATABASE_SOURCES and not spec.database:
        raise TaskSpecError(f"task.source.database: a {kind} source needs the database name")
    for name in ("publication", "slot", "schema"):
        value = getattr(spec, name)
        if value and (kind != "postgresql" or not isinstance(value, str) or not _PG_NAME.match(value)):
            raise TaskSpecError(
                f"task.source.{name}: only a postgresql source has one, and it must be 1-63 lower-case "
                "letters, digits and _, not starting with a digit"
            )
    if not isinstance(spec.ddl_trigger, bool) or (spec.ddl_trigger and kind != "postgresql"):
        raise TaskSpecError("task.source.ddl_trigger: true or false, and only a postgresql source has one")
    sid = spec.server_id
    if sid is not None and (not isinstance(sid, int) or not 1 <= sid < 2**32):
        raise TaskSpecError("task.source.server_id: must be an integer in 1..4294967295")
    for name in ("rate", "skew"):
        if not isinstance(getattr(spec, name), (int, float)) or getattr(spec, name) < 0:
            raise TaskSpecError(f"task.source.{name}: must be a non-negative number")
    return spec


@dataclass
class Control:
    paused: bool = False
    restarts: int = 0
    from_position: str | None = None
    #: re-snapshot requests not yet served (sync/sources/resnapshot.py): {"id", "table", "where",
    #: "keys", "delete_absent", "requested"}; a control znode written before them has none
    snapshots: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, data: bytes) -> Control:
        doc = orjson.loads(data)
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})


class TaskStore:
    """Task definitions, epochs, control, status and alarms in ZooKeeper (a kazoo client on
    the cluster's chroot)."""

    def __init__(self, client: Any) -> None:
        from kazoo.retry import KazooRetry

        self.zk = client
        # Every call retries through connection loss and session expiry (kazoo opens a new
        # session): a worker paused past its ZooKeeper session must come back and step down,
        # not die on its first call. Repeating a call whose reply was lost is harmless here:
        # at worst an epoch number is skipped or an alarm is recorded twice.
        self._retry = KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0, deadline=30.0, ignore_expire=True)
        self._call(self.zk.ensure_path, TASKS)
        self._call(self.zk.ensure_path, EPOCHS)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self._retry.copy()(fn, *args, **kwargs)

    @property
    def connected(self) -> bool:
        """Whether the session is connected now (a call made otherwise waits for a reconnection)."""
        return bool(self.zk.connected)

    def _path(self, task_id: str, *rest: str) -> str:
        return "/".join([TASKS, task_id, *rest])

    def create(self, spec: TaskSpec) -> None:
        from kazoo.exceptions import NodeExistsError

        # The epoch counter first and on its own: it may exist from an earlier task of this id.
        update_znode(self.zk, self._epoch_path(spec.id), lambda data: None if data is not None else b"0")
        tx = self.zk.transaction()
        tx.create(self._path(spec.id), spec.to_json())
        tx.create(self._path(spec.id, "control"), orjson.dumps(asdict(Control())))
        tx.create(self._path(spec.id, "alarms"), b"")
        tx.create(self._path(spec.id, "executions"), b"")
        results = tx.commit()
        for r in results:
            if isinstance(r, NodeExistsError):
                raise TaskSpecError(f"task.id: a task named {spec.id!r} exists already") from None
            if isinstance(r, Exception):
                raise r

    def update(self, spec: TaskSpec, snapshots: list[dict[str, Any]] | None = None) -> Control:
        """Replace a task's definition and restart its execution (under a new epoch) with it;
        `snapshots` (re-snapshot requests, e.g. of tables it adds) go in with the restart."""
        from kazoo.exceptions import NoNodeError

        try:
            self._call(self.zk.set, self._path(spec.id), spec.to_json())
        except NoNodeError:
            raise TaskNotFoundError(spec.id) from None

        def restart(current: Control) -> None:
            current.restarts += 1
            # requests for tables the task no longer captures would wait for ever
            kept = [r for r in current.snapshots if r.get("table") in spec.tables]
            current.snapshots = [*kept, *(snapshots or [])]

        return self._update_control(spec.id, restart)

    def ids(self) -> list[str]:
        return sorted(self._call(self.zk.get_children, TASKS))

    def secret_scope(self) -> SecretScope:
        """The cluster's secret scope (`SECRET_SCOPE`), or the defaults when none was set."""
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self._call(self.zk.get, SECRET_SCOPE)
        except NoNodeError:
            return SecretScope()
        return SecretScope.from_doc(orjson.loads(data))

    def set_secret_scope(self, scope: SecretScope) -> None:
        """Set the cluster's secret scope. Definitions stored already are not checked again here:
        each worker checks every reference against its own scope when it resolves it."""
        data = orjson.dumps(scope.to_doc())
        self._call(update_znode, self.zk, SECRET_SCOPE, lambda _: data)

    def get(self, task_id: str) -> TaskSpec:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self._call(self.zk.get, self._path(task_id))
        except NoNodeError:
            raise TaskNotFoundError(task_id) from None
        return TaskSpec.from_json(data)

    def delete(self, task_id: str) -> None:
        """Remove the task (its epoch counter stays: see the module docstring)."""
        from kazoo.exceptions import NoNodeError

        try:
            self._call(self.zk.delete, self._path(task_id), recursive=True)
        except NoNodeError:
            raise TaskNotFoundError(task_id) from None

    def _epoch_path(self, task_id: str) -> str:
        return f"{EPOCHS}/{task_id}"

    def next_epoch(self, task_id: str, at_least: int = 0) -> int:
        """Take the next fencing epoch: one more than both the counter and `at_least` (the epoch
        the task's target already holds, so an epoch never goes back for a pipeline name even if
        the counter was lost)."""

        counter = FencingCounter(self.zk, self._epoch_path(task_id))
        return int(self._call(counter.take, at_least)[0])

    def epoch(self, task_id: str) -> int:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self._call(self.zk.get, self._epoch_path(task_id))
        except NoNodeError:
            return 0
        return int(data or b"0")

    def control(self, task_id: str) -> Control:
        data, _ = self._call(self.zk.get, self._path(task_id, "control"))
        return Control.from_json(data)

    def set_control(self, task_id: str, **changes: Any) -> Control:
        def apply(current: Control) -> None:
            for k, v in changes.items():
                setattr(current, k, v)

        return self._update_control(task_id, apply)

    def _update_control(self, task_id: str, change: Callable[[Control], None]) -> Control:
        """One atomic read-modify-write of the task's control znode; the control written."""

        def apply(data: bytes | None) -> bytes:
            if data is None:
                raise TaskNotFoundError(task_id)
            current = Control.from_json(data)
            change(current)
            return orjson.dumps(asdict(current))

        return Control.from_json(self._call(update_znode, self.zk, self._path(task_id, "control"), apply))

    def add_snapshots(self, task_id: str, requests: list[dict[str, Any]]) -> Control:
        """Queue re-snapshot requests for the running capture. No restart: a restart stops the
        execution, and the capture serves requests while it streams."""

        def add(current: Control) -> None:
            current.snapshots = [*current.snapshots, *requests]

        return self._update_control(task_id, add)

    def snapshot_done(self, task_id: str, request_id: str) -> Control:
        """Remove a served re-snapshot request."""

        def remove(current: Control) -> None:
            current.snapshots = [r for r in current.snapshots if r.get("id") != request_id]

        return self._update_control(task_id, remove)

    def publish_status(self, task_id: str, status: dict[str, Any]) -> bool:
        """Create or update the task's ephemeral status znode for the execution `status` names,
        unless an execution with a newer epoch owns it (then False). Conditional on the version
        read, so a superseded execution never overwrites the status of the one that replaced it.
        A deleted task's status is not written (False): creating it would bring the task's znode
        back, empty, and a worker would go on running a task nobody can see or delete (an
        execution published between `task delete` and its worker stopping it)."""
        from kazoo.exceptions import NoNodeError

        data = orjson.dumps(status)

        def ours(current: bytes | None) -> bytes | None:
            if current is not None:
                other = orjson.loads(current)
                if other.get("execution") != status.get("execution") and int(other.get("epoch") or 0) > int(
                    status.get("epoch") or 0
                ):
                    return None
            return data

        try:
            written = self._call(
                update_znode, self.zk, self._path(task_id, "status"), ours, ephemeral=True, makepath=False
            )
        except NoNodeError:
            return False  # the task was deleted
        return bool(written == data)

    def clear_status(self, task_id: str, execution: str, timeout_s: float = BEST_EFFORT_CALL_S) -> None:
        """Remove the status znode if it is still this execution's (a clean stop), so that the
        next execution does not mistake a stopped one for a live duplicate. Best effort, one
        try, each call waited on for `timeout_s` at most (KazooTimeoutError): a znode left
        behind goes with its session anyway."""
        from kazoo.exceptions import BadVersionError, NoNodeError

        path = self._path(task_id, "status")
        try:
            data, stat = self.zk.get_async(path).get(timeout=timeout_s)
            if orjson.loads(data).get("execution") == execution:
                self.zk.delete_async(path, version=stat.version).get(timeout=timeout_s)
        except (NoNodeError, BadVersionError):
            pass

    def status(self, task_id: str) -> dict[str, Any] | None:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self._call(self.zk.get, self._path(task_id, "status"))
        except NoNodeError:
            return None
        result: dict[str, Any] = orjson.loads(data)
        return result

    def record_source_objects(self, task_id: str, objects: dict[str, str]) -> None:
        """The source objects the task created (a PostgreSQL slot and publication): `sluice task
        delete` drops these and no others."""
        self._call(self.zk.ensure_path, self._path(task_id, "source_objects"))
        self._call(self.zk.set, self._path(task_id, "source_objects"), orjson.dumps(objects))

    def source_objects(self, task_id: str) -> dict[str, str]:
        from kazoo.exceptions import NoNodeError

        try:
            data, _ = self._call(self.zk.get, self._path(task_id, "source_objects"))
        except NoNodeError:
            return {}
        doc = orjson.loads(data) if data else {}
        return {str(k): str(v) for k, v in doc.items()} if isinstance(doc, dict) else {}

    def raise_alarm(self, task_id: str, kind: str, detail: dict[str, Any]) -> None:
        self._call(
            self.zk.create,
            self._path(task_id, "alarms", "alarm-"),
            orjson.dumps({"kind": kind, "at": time.time(), **detail}),
            sequence=True,
        )

    def alarms(self, task_id: str) -> list[dict[str, Any]]:
        out = []
        for child in sorted(self._call(self.zk.get_children, self._path(task_id, "alarms"))):
            data, _ = self._call(self.zk.get, self._path(task_id, "alarms", child))
            out.append(orjson.loads(data))
        return out

    def record_execution(
        self,
        task_id: str,
        entry: dict[str, Any],
        *,
        node: str | None = None,
        timeout_s: float = BEST_EFFORT_CALL_S,
    ) -> str:
        """Write one execution's entry in the task's history and return its znode's name: a new
        entry (the oldest beyond EXECUTIONS_KEPT removed), or, given `node` (what the first call
        returned), that entry updated in place. History is for people: each ZooKeeper call is
        tried once and waited on for `timeout_s` at most, so a task never waits long on it; the
        caller logs a failure (raised) and goes on."""
        from kazoo.exceptions import NodeExistsError, NoNodeError

        assert entry.get("outcome") in EXECUTION_OUTCOMES, entry
        parent = self._path(task_id, "executions")
        data = orjson.dumps(entry)
        if node is not None:
            self.zk.set_async(f"{parent}/{node}", data).get(timeout=timeout_s)
            return node
        try:
            path = self.zk.create_async(f"{parent}/execution-", data, sequence=True).get(timeout=timeout_s)
        except NoNodeError:
            # A task created before the history. Its parent only: never makepath, so a task
            # deleted meanwhile is not brought back as an empty znode.
            try:
                self.zk.create_async(parent, b"").get(timeout=timeout_s)
            except NodeExistsError:
                pass
            path = self.zk.create_async(f"{parent}/execution-", data, sequence=True).get(timeout=timeout_s)
        children = sorted(self.zk.get_children_async(parent).get(timeout=timeout_s))
        for old in children[: max(0, len(children) - EXECUTIONS_KEPT)]:
            try:
                self.zk.delete_async(f"{parent}/{old}").get(timeout=timeout_s)
            except NoNodeError:
                pass  # another worker trimmed it
        name: str = path.rsplit("/", 1)[1]
        return name

    def executions(self, task_id: str) -> list[dict[str, Any]]:
        """The task's recent executions, oldest first (at most EXECUTIONS_KEPT)."""
        from kazoo.exceptions import NoNodeError

        parent = self._path(task_id, "executions")
        try:
            children = sorted(self._call(self.zk.get_children, parent))
        except NoNodeError:
            return []  # created before the history, and not run since
        out = []
        for child in children:
            try:
                data, _ = self._call(self.zk.get, f"{parent}/{child}")
            except NoNodeError:
                continue  # trimmed meanwhile
            out.append(orjson.loads(data))
        return out

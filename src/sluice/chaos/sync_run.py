"""`sluice chaos sync`: a MariaDB source under a seeded workload, captured by two sync tasks
(one to SQLite, one to PostgreSQL) on two worker processes, through seeded faults; then
quiescence and a full comparison of the source with each target (invariant I8).

One seed's run:

1. a database on the MariaDB server with five tables and their first rows (sync_workload: two
   of them hold a column of every type of the type catalog); the server's time zone is not UTC
   (`TIMESTAMP_ZONE`), as in the type-matrix test;
   a PostgreSQL database, reached by its task through a TCP proxy (so it can refuse
   connections), and a SQLite file; a 3-broker drill cluster with its own ZooKeeper;
2. the two tasks, defined as in a task.yaml (kept in the seed's directory), and two
   `sluice worker start` processes with Spark on `local[1]`; wait until both tasks have
   applied their snapshot;
3. the workload and the fault schedule (sync_faults) for `duration_s` seconds;
4. quiescence: the workload stops, every fault is healed, a last transaction on a table no task
   captures marks the binlog's end, and each task must have captured to there and applied
   everything in its topic (applied offsets = log end offsets), within a deadline (a task that
   makes no progress at all for `stall_s` is given up on earlier, with the reason);
5. every table, every row by primary key, source against each target (sync_compare).

Each seed's report says which column types the workload met: types with a value (not NULL)
written by a statement the server ran during the faults (the binlog's path), in the first rows
(the snapshot's), and left in the source at the end (compared); and how many of the types' edge
values it wrote. The line before the last, `chaos-sync types=41/41 edge_values=143/143`, gives
the fewest any seed met by the binlog. The run's last line is
`chaos-sync verdict=pass missing=0 extra=0 different=0`, with the counts summed over both
targets and every seed; anything else wrong (a task that did not catch up, a worker that exited
by itself, the workload failing) makes it `verdict=fail` too.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sluice.chaos.harness import CHROOT, DrillCluster
from sluice.chaos.sync_faults import (
    WORKER_SESSION_S,
    Injected,
    SyncFault,
    SyncFaultInjector,
    WorkerProcess,
    make_sync_schedule,
)
from sluice.chaos.sync_workload import (
    CATALOG_TABLES,
    KEYS,
    MARKER_TABLE,
    TABLES,
    SyncWorkload,
    WorkloadRunner,
    WorkloadStats,
)
from sluice.chaos.tcp_proxy import TcpProxy
from sluice.chaos.type_catalog import TIMESTAMP_ZONE
from sluice.chaos.workload_values import RANDOM, TYPE_NAMES
from sluice.clients import close_within
from sluice.ops.mariadb import LocalMariaDB
from sluice.ops.ports import free_port
from sluice.ops.postgres import LocalPostgres
from sluice.sync.backoff import RETRY_MAX_S
from sluice.sync.compare import TableSchema, TargetComparison, compare_table, table_schema
from sluice.sync.sources.mysql_base import BinlogPosition, column_types
from sluice.sync.targets import open_target
from sluice.sync.targets.base import POS_COLUMN
from sluice.sync.tasks import SourceSpec, TaskStore, parse_spec

log = logging.getLogger("sluice.chaos.sync")

GROUP = "chaos-sync-workers"
PG_TASK = "chaos-pg"
SQLITE_TASK = "chaos-sqlite"
MYSQL_TASK = "chaos-mysql"
DELTA_TASK = "chaos-delta"
#: `--target`: what the task beside the PostgreSQL one writes to
SECOND_TARGETS = ("sqlite", "mysql", "delta")
WORKERS = ("w1", "w2")
SPARK_MASTER = "local[1]"
TRIGGER = "500ms"
START_TIMEOUT_S = 240.0
#: No progress at all for this long is a stall: longer than a failing task's longest backoff
#: before the worker starts it again (sync.backoff.RETRY_MAX_S), so a task that is retrying is
#: never given up on. While the tasks start (Spark, the snapshot, a first attempt that failed
#: because a topic was still being created) only START_TIMEOUT_S counts.
STALL_S = RETRY_MAX_S + 15.0
HEARTBEAT_S = 5.0  # while waiting for the captures: a transaction on a table no task captures
#: A raised exception's last traceback line: `psycopg.errors.X: ...` or `ValueError: ...`.
_EXCEPTION_LINE = re.compile(r"^(?:(?:[a-z_]\w*\.)+[A-Z]\w*|[A-Z]\w*(?:Error|Exception)): ")

Out = Callable[[str], None]


@dataclass
class TaskCatchUp:
    task: str
    caught_up: bool
    detail: str


@dataclass
class SeedReport:
    seed: int
    schedule: list[SyncFault]
    workload: WorkloadStats | None = None
    injected: list[Injected] = field(default_factory=list)
    skipped: list[Injected] = field(default_factory=list)
    catch_up: list[TaskCatchUp] = field(default_factory=list)
    comparisons: list[TargetComparison] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    alarms: dict[str, int] = field(default_factory=dict)
    types: tuple[str, ...] = ()  # the catalog types the workload's tables hold
    edge_values: int = 0  # how many edge values of those types it can draw
    snapshot_met: set[tuple[str, int]] = field(default_factory=set)  # in the first rows
    types_at_end: set[str] = field(default_factory=set)  # not NULL in a compared source row

    def types_met(self) -> set[str]:
        """Catalog types with a value written during the faults (not NULL), by the binlog's path."""
        return {t for t, _ in self.workload.met} if self.workload is not None else set()

    def edges_met(self) -> set[tuple[str, int]]:
        return {m for m in self.workload.met if m[1] != RANDOM} if self.workload is not None else set()

    @property
    def missing(self) -> int:
        return sum(c.missing for c in self.comparisons)

    @property
    def extra(self) -> int:
        return sum(c.extra for c in self.comparisons)

    @property
    def different(self) -> int:
        return sum(c.different for c in self.comparisons)

    @property
    def ok(self) -> bool:
        return not self.problems and len(self.comparisons) == 2 and all(c.ok for c in self.comparisons)


def types_line(reports: list[SeedReport]) -> str:
    """How many catalog types and edge values the workload met by the binlog: the fewest of any
    seed, of how many its tables hold."""
    if not reports:
        return "chaos-sync types=0/0 edge_values=0/0"
    fewest = min(reports, key=lambda r: (len(r.types_met()), len(r.edges_met())))
    return (
        f"chaos-sync types={len(fewest.types_met())}/{len(fewest.types)} "
        f"edge_values={len(fewest.edges_met())}/{fewest.edge_values}"
    )


def verdict_line(reports: list[SeedReport]) -> str:
    """The run's last line: counts summed over every seed and both targets."""
    missing = sum(r.missing for r in reports)
    extra = sum(r.extra for r in reports)
    different = sum(r.different for r in reports)
    ok = bool(reports) and all(r.ok for r in reports)
    line = (
        f"chaos-sync verdict={'pass' if ok else 'fail'} missing={missing} extra={extra} different={different}"
    )
    if not ok:
        line += f" problems={sum(len(r.problems) for r in reports)}"
    return line


# --- the source ---------------------------------------------------------------------------------


def _connect(db: LocalMariaDB, database: str | None = None, **extra: Any) -> Any:
    import pymysql

    return pymysql.connect(**db.connect_args(database), charset="utf8mb4", **extra)


def _master_position(db: LocalMariaDB) -> BinlogPosition:
    rows = db.execute("SHOW MASTER STATUS")
    return BinlogPosition(str(rows[0][0]), int(str(rows[0][1])))


def create_source(db: LocalMariaDB, database: str, workload: SyncWorkload) -> None:
    """The workload's database, made again: its tables and first rows (`SyncWorkload.initial`)."""
    db.execute(
        f"DROP DATABASE IF EXISTS `{database}`",
        f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    )
    conn = _connect(db, database, autocommit=True)
    try:
        with conn.cursor() as cur:
            for sql in workload.initial():
                cur.execute(sql)
    finally:
        conn.close()


def source_schema(db: LocalMariaDB, database: str) -> list[TableSchema]:
    """The captured tables' columns and their comparisons, from the source's column types."""
    spec = SourceSpec(kind="mariadb", port=db.port, user="root", database=database)
    types = column_types(spec, list(TABLES))
    return [table_schema(table, types.get(table, {}), KEYS[table]) for table in TABLES]


def source_rows(db: LocalMariaDB, database: str, schema: TableSchema) -> list[dict[str, Any]]:
    """Every row of a table as the database itself gives each value (sync/compare.py)."""
    import pymysql.cursors

    conn = _connect(db, database, cursorclass=pymysql.cursors.DictCursor)
    try:
        with conn.cursor() as cur:
            cur.execute(schema.reference_select())
            return list(cur.fetchall())
    finally:
        conn.close()


def target_rows(url: str, table: str) -> list[dict[str, Any]]:
    """A target table's rows as its driver gives each value; PostgreSQL's jsonb as the
    document's text. (Target.read_rows gives jsonb parsed, and a document that is a JSON string,
    `"str"`, then reads as the text `str`, which is no JSON: compare.py cannot tell the two.)"""
    if not url.startswith("postgres"):
        with open_target(url) as target:
            return list(target.read_rows(table).values())
    import psycopg

    with psycopg.connect(url) as conn:
        cols = conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
            "to_regclass(%s) AND attnum > 0 AND NOT attisdropped AND attname <> %s ORDER BY attnum",
            (f'"{table}"', POS_COLUMN),
        ).fetchall()
        if not cols:
            return []
        select = ", ".join(f'"{c}"::text' if t == "jsonb" else f'"{c}"' for c, t in cols)
        rows = conn.execute(f'SELECT {select} FROM "{table}"').fetchall()
    return [dict(zip([c for c, _ in cols], r, strict=True)) for r in rows]


# --- the log ------------------------------------------------------------------------------------


class LogEnds:
    """End offsets of a task's topic partitions (one consumer for the run)."""

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Consumer

        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "chaos-sync-ends", "log_level": 0}
        )

    def of(self, topic: str) -> dict[tuple[str, int], int]:
        from confluent_kafka import TopicPartition

        meta = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return {}
        return {
            (topic, p): int(
                self.consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
            )
            for p in sorted(meta.partitions)
        }

    def close(self) -> None:
        close_within(self.consumer)


# --- one seed -----------------------------------------------------------------------------------


@dataclass
class _Task:
    id: str
    target_url: str  # what the task writes through
    direct_url: str  # the same target, read by the harness directly (not through the proxy)
    dialect: str


@dataclass
class _Progress:
    """What a task has done, as the harness sees it: its status znode, its target, the log."""

    execution: str | None
    captured: str | None
    applied: dict[tuple[str, int], int]
    ends: dict[tuple[str, int], int]
    status_error: str | None
    status_age_s: float | None

    def behind(self) -> int:
        return sum(max(0, end - self.applied.get(tp, 0)) for tp, end in self.ends.items())


class SeedRun:
    def __init__(
        self,
        directory: Path,
        seed: int,
        *,
        duration_s: float,
        fault_kinds: tuple[str, ...],
        statement_kinds: tuple[str, ...],
        value_kinds: tuple[str, ...],
        mariadb: LocalMariaDB,
        postgres: LocalPostgres,
        out: Out,
        types: tuple[str, ...] = TYPE_NAMES,
        catch_up_timeout_s: float = 240.0,
        stall_s: float = STALL_S,
        second_target: str = "sqlite",
    ) -> None:
        self.directory = directory
        self.second_target = second_target
        self.seed = seed
        self.duration_s = duration_s
        self.fault_kinds = fault_kinds
        self.workload = SyncWorkload(seed, statement_kinds, value_kinds, types)
        self.mariadb = mariadb
        self.postgres = postgres
        self.out = out
        self.catch_up_timeout_s = catch_up_timeout_s
        self.stall_s = stall_s
        self.database = f"chaos_sync_{seed}"
        self.report = SeedReport(
            seed, make_sync_schedule(seed, duration_s, fault_kinds), types=types,
            edge_values=len(self.workload.edge_values()), snapshot_met=self.workload.initial_met(),
        )  # fmt: skip
        self.workers: dict[str, WorkerProcess] = {}

    def say(self, text: str) -> None:
        self.out(f"seed {self.seed}: {text}")

    # -- set-up ----------------------------------------------------------------------------------
    def _create_source(self) -> None:
        create_source(self.mariadb, self.database, self.workload)

    def _task_doc(self, task_id: str, target: str) -> dict[str, Any]:
        return {
            "id": task_id,
            "source": {"kind": "mariadb", "host": "127.0.0.1", "port": self.mariadb.port, "user": "root",
                       "database": self.database},
            "tables": list(TABLES),
            "topic": "{task}.changes",
            "target": target,
            "options": {"trigger": TRIGGER, "partitions": 3},
        }  # fmt: skip

    def _create_tasks(self, store: TaskStore, tasks: list[_Task]) -> None:
        for task in tasks:
            path = self.directory / f"{task.id}.yaml"
            path.write_text(yaml.safe_dump(self._task_doc(task.id, task.target_url), sort_keys=False))
            store.create(parse_spec(yaml.safe_load(path.read_text())))

    # -- progress --------------------------------------------------------------------------------
    def _progress(self, store: TaskStore, task: _Task, ends: LogEnds) -> _Progress:
        status = store.status(task.id) or {}
        with open_target(task.direct_url) as target:
            applied = target.applied_offsets(task.id)
        updated = status.get("updated")
        return _Progress(
            execution=status.get("execution"),
            captured=status.get("captured_position"),
            applied=applied,
            ends=ends.of(f"{task.id}.changes"),
            status_error=status.get("error") or status.get("lag_error"),
            status_age_s=None if updated is None else round(time.time() - float(updated), 1),
        )

    @staticmethod
    def _captured_to(p: _Progress, end: BinlogPosition) -> bool:
        return bool(p.captured) and BinlogPosition.parse(str(p.captured)) >= end  # "" until a snapshot

    @classmethod
    def _done(cls, p: _Progress, end: BinlogPosition) -> bool:
        return cls._captured_to(p, end) and bool(p.ends) and p.behind() == 0

    def _wait_caught_up(
        self, store: TaskStore, tasks: list[_Task], end: BinlogPosition, timeout_s: float, ends: LogEnds,
        stall_s: float | None = None,
    ) -> list[TaskCatchUp]:  # fmt: skip
        """Each task captured to `end` and applied all of its topic, or why not (deadline, or no
        progress at all for `stall_s`, default `self.stall_s`)."""
        stall_s = self.stall_s if stall_s is None else stall_s
        started = time.monotonic()
        deadline = started + timeout_s
        heartbeat_at = started + HEARTBEAT_S
        result: dict[str, TaskCatchUp] = {}
        last: dict[str, tuple[Any, float]] = {}
        seen: dict[str, _Progress] = {}
        errors: dict[str, str] = {}
        while len(result) < len(tasks) and time.monotonic() < deadline:
            for task in tasks:
                if task.id in result:
                    continue
                try:
                    p = self._progress(store, task, ends)
                except Exception as exc:  # the log or a target is failing over: look again
                    errors[task.id] = repr(exc)
                    continue
                seen[task.id] = p
                now = time.monotonic()
                if self._done(p, end):
                    result[task.id] = TaskCatchUp(task.id, True, f"caught up in {now - started:.1f}s")
                    continue
                # The stall clock runs only while an execution is running and has captured
                # something (starting Spark and the snapshot take a while, and are not stalls); a
                # new execution, a captured position or an applied offset moving restart it.
                # Capturing past `end` (heartbeats) is no progress towards it.
                captured = p.captured if not self._captured_to(p, end) else "end"
                mark = (p.execution, captured, sorted(p.applied.items()), sum(p.ends.values()))
                if not p.captured or task.id not in last or last[task.id][0] != mark:
                    last[task.id] = (mark, now)
                elif now - last[task.id][1] > stall_s:
                    result[task.id] = TaskCatchUp(
                        task.id,
                        False,
                        f"stalled: no progress for {stall_s:.0f}s; " + self._why(task, p, end),
                    )
            if time.monotonic() >= heartbeat_at:
                # A capture reports its position at transaction ends; one that resumed from a
                # binlog position on an idle source has none to report until the next one.
                self._heartbeat()
                heartbeat_at = time.monotonic() + HEARTBEAT_S
            time.sleep(0.5)
        for task in tasks:
            if task.id not in result:
                p_or = seen.get(task.id)
                why = self._why(task, p_or, end) if p_or else f"never readable: {errors.get(task.id)}"
                result[task.id] = TaskCatchUp(task.id, False, f"not caught up within {timeout_s:.0f}s; {why}")
        return [result[t.id] for t in tasks]

    def _why(self, task: _Task, p: _Progress, end: BinlogPosition) -> str:
        parts = [
            f"captured to {p.captured or 'nothing'} of {end.text()}",
            f"{p.behind()} records in the log not applied (applied {sum(p.applied.values())} of "
            f"{sum(p.ends.values())})",
        ]
        if p.status_age_s is not None and p.status_age_s > 10:
            parts.append(f"status last published {p.status_age_s:.0f}s ago")
        if p.status_error:
            parts.append(f"status error: {p.status_error[:200]}")
        hint = self._worker_error(task.id)
        if hint:
            parts.append(f"worker log: {hint}")
        return "; ".join(parts)

    def _worker_error(self, task_id: str) -> str | None:
        """What a worker logged last that says why: the last exception raised (its
        `module.Error: message` line), else the last ERROR line naming this task."""
        exception: str | None = None
        error: str | None = None
        for w in self.workers.values():
            for line in w.log_tail(2000):
                text = line.strip()
                if _EXCEPTION_LINE.match(text):
                    exception = f"{w.name}: {text[:300]}"
                elif "ERROR" in text and task_id in text:
                    error = f"{w.name}: {text[:300]}"
        return exception or error

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> SeedReport:
        report = self.report
        self.say(
            f"schedule ({self.duration_s:.0f}s, faults {','.join(self.fault_kinds) or 'none'}): "
            f"{len(report.schedule)} faults"
        )
        for fault in report.schedule:
            self.out(f"  {fault.describe()}")
        self.say(self._workload_line())
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        with ExitStack() as stack:
            self._create_source()
            stack.callback(self._drop_source)
            pg_direct = self.postgres.create_database(self.database)
            stack.callback(self._drop_target_database)
            proxy = TcpProxy("127.0.0.1", free_port(), "127.0.0.1", self.postgres.port).start()
            stack.callback(proxy.stop)
            sqlite_path = self.directory / "target.db"
            tasks = [
                self._second_task(sqlite_path),
                _Task(
                    PG_TASK, f"postgresql://postgres@{proxy.address}/{self.database}", pg_direct, "postgresql"
                ),
            ]
            dc = DrillCluster(self.directory / "cluster", 3, session_timeout_s=6.0).start()
            stack.callback(dc.stop)
            assert dc.store is not None and dc.zk is not None
            store = TaskStore(dc.store.client)
            self._create_tasks(store, tasks)
            argv = ["--group", GROUP, "--session-timeout", str(WORKER_SESSION_S),
                    "--spark-master", SPARK_MASTER, "-b", dc.bootstrap,
                    "--zookeeper", f"{dc.zk.connect_string}{CHROOT}",
                    "--dir", str(self.directory / "workers")]  # fmt: skip
            for name in WORKERS:
                self.workers[name] = WorkerProcess(name, self.directory, argv).start()
            stack.callback(self._stop_workers)
            ends = LogEnds(dc.bootstrap)
            stack.callback(ends.close)
            injector = SyncFaultInjector(
                dc, self.workers, proxy, sqlite_path, lambda t: (store.status(t) or {}).get("worker"),
                PG_TASK, tasks[0].id, [f"{t.id}.changes" for t in tasks], GROUP, self.seed,
            )  # fmt: skip
            stack.callback(injector.heal_all)

            t0 = time.monotonic()
            started = self._wait_caught_up(
                store, tasks, self._source_position(), START_TIMEOUT_S, ends, stall_s=START_TIMEOUT_S
            )
            if all(s.caught_up for s in started):
                self.say(f"both tasks running, snapshot applied ({time.monotonic() - t0:.0f}s)")
            for s in started:
                if not s.caught_up:
                    # Go on all the same: the other target is still worth testing.
                    report.problems.append(f"task {s.task} did not start and apply its snapshot: {s.detail}")
                    self.say(f"task {s.task} did not start and apply its snapshot: {s.detail}")
            self._workload_and_faults(injector)
            self._quiesce(dc, injector)
            end = self._mark_end()
            report.catch_up = self._wait_caught_up(store, tasks, end, self.catch_up_timeout_s, ends)
            report.problems.extend(f"task {c.task}: {c.detail}" for c in report.catch_up if not c.caught_up)
            report.alarms = {t.id: len(store.alarms(t.id)) for t in tasks}
            self._compare(tasks)
        self._summarise()
        return report

    def _workload_line(self) -> str:
        values = ",".join(self.workload.value_kinds) or "plain only"
        left_out = [t for t in TYPE_NAMES if t not in self.workload.types]
        types = f"all {len(TYPE_NAMES)}" if not left_out else f"all but {','.join(left_out)}"
        return f"statements: {','.join(self.workload.kinds)}; values: {values}; column types: {types}"

    def _second_task(self, sqlite_path: Path) -> _Task:
        """The task beside the PostgreSQL one: into SQLite, or (`--target mysql`) into a database
        of its own on the MariaDB server."""
        if self.second_target == "mysql":
            name = f"{self.database}_target"
            self.mariadb.execute(f"DROP DATABASE IF EXISTS `{name}`", f"CREATE DATABASE `{name}`")
            url = f"mysql://root@127.0.0.1:{self.mariadb.port}/{name}"
            return _Task(MYSQL_TASK, url, url, "mysql")
        if self.second_target == "delta":  # Delta tables under the seed's directory
            url = f"delta://{self.directory / 'lake'}"
            return _Task(DELTA_TASK, url, url, "delta")
        sqlite_url = f"sqlite:///{sqlite_path}"
        return _Task(SQLITE_TASK, sqlite_url, sqlite_url, "sqlite")

    def _source_position(self) -> Any:
        return _master_position(self.mariadb)

    def _start_workload(self) -> Any:
        """The workload's runner, started (its `stop` event, and `finish()` for its stats)."""
        return WorkloadRunner(lambda: _connect(self.mariadb, self.database), self.workload).start()

    def _workload_and_faults(self, injector: SyncFaultInjector) -> None:
        runner = self._start_workload()
        injector.start(self.report.schedule)
        try:
            runner.stop.wait(self.duration_s)
        finally:
            self.report.workload = runner.finish()
            injector.finish()
            self.report.injected = injector.injected
            self.report.skipped = injector.skipped
        if self.report.workload.error:
            self.report.problems.append(self.report.workload.error)
        if injector.error:
            self.report.problems.append(injector.error)

    def _quiesce(self, dc: DrillCluster, injector: SyncFaultInjector) -> None:
        injector.heal_all()
        self.report.problems.extend(injector.exited)
        if not dc.wait_quiescent(90):
            self.report.problems.append(
                "the cluster did not heal within 90 s (a partition led by a dead broker, or an ISR not full)"
            )

    def _heartbeat(self) -> None:
        self.mariadb.execute(
            f"INSERT INTO `{MARKER_TABLE}` (note) VALUES ('heartbeat')", database=self.database
        )

    def _mark_end(self) -> BinlogPosition:
        """A last transaction, on a table no task captures: the binlog position both captures must
        reach (the workload may have ended on DDL, which moves no captured position)."""
        self.mariadb.execute(f"INSERT INTO `{MARKER_TABLE}` (note) VALUES ('end')", database=self.database)
        return _master_position(self.mariadb)

    def _compare(self, tasks: list[_Task]) -> None:
        schemas = source_schema(self.mariadb, self.database)
        source = {s.name: source_rows(self.mariadb, self.database, s) for s in schemas}
        self.report.types_at_end = {
            column.removeprefix("c_")
            for table in CATALOG_TABLES
            for row in source[table]
            for column, value in row.items()
            if column.startswith("c_") and value is not None
        }
        for task in tasks:
            label = f"{task.dialect} ({task.id})"
            try:
                got = {s.name: target_rows(task.direct_url, s.name) for s in schemas}
            except Exception as exc:
                self.report.problems.append(f"cannot read target {label}: {exc}")
                continue
            comparison = TargetComparison(label)
            for schema in schemas:
                comparison.tables.append(
                    compare_table(schema, source[schema.name], got[schema.name], task.dialect)
                )
            self.report.comparisons.append(comparison)

    def _summarise(self) -> None:
        r = self.report
        if r.workload is not None:
            w = r.workload
            kinds = " ".join(f"{k}={n}" for k, n in w.steps.items())
            self.say(
                f"workload: {sum(w.steps.values())} transactions ({kinds}), {w.statements} statements, "
                f"{w.rejected} rejected (duplicate key), {w.idle_s:.1f}s idle"
            )
        if r.workload is not None:
            self.say(
                f"column types met: {len(r.types_met())} of {len(r.types)} by the binlog during the faults "
                f"({len(r.edges_met())} of {r.edge_values} edge values), "
                f"{len({t for t, _ in r.snapshot_met})} in the snapshot's rows, "
                f"{len(r.types_at_end)} not NULL in the source at the end"
            )
            unmet = [t for t in r.types if t not in r.types_met()]
            if unmet:
                self.say(f"column types not met by the binlog: {', '.join(unmet)}")
        self.say(f"faults injected: {len(r.injected)} events, {len(r.skipped)} faults skipped")
        for ev in r.injected:
            self.out(f"  {ev.at_s:5.1f}s {ev.what}")
        for ev in r.skipped:
            self.out(f"  {ev.at_s:5.1f}s skipped: {ev.what}")
        for c in r.catch_up:
            self.say(f"task {c.task}: {c.detail}")
        if r.alarms:
            self.say("alarms: " + ", ".join(f"{t}={n}" for t, n in r.alarms.items()))
        for comparison in r.comparisons:
            for line in comparison.lines():
                self.out(f"seed {self.seed}: {line}" if not line.startswith(" ") else line)
        for problem in r.problems:
            self.say(f"problem: {problem}")
        self.say(
            f"{'pass' if r.ok else 'fail'}: missing={r.missing} extra={r.extra} different={r.different} "
            f"problems={len(r.problems)}"
        )

    # -- clean-up --------------------------------------------------------------------------------
    def _stop_workers(self) -> None:
        for w in self.workers.values():
            w.stop()

    def _drop_source(self) -> None:
        try:
            self.mariadb.execute(
                f"DROP DATABASE IF EXISTS `{self.database}`",
                f"DROP DATABASE IF EXISTS `{self.database}_target`",
            )
        except Exception as exc:
            log.warning("event=drop_source_failed database=%s error=%r", self.database, exc)

    def _drop_target_database(self) -> None:
        import psycopg

        try:
            with psycopg.connect(self.postgres.url(), autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        except Exception as exc:
            log.warning("event=drop_target_failed database=%s error=%r", self.database, exc)


@contextmanager
def servers(
    directory: Path, mariadb: LocalMariaDB | None, postgres: LocalPostgres | None
) -> Iterator[tuple[LocalMariaDB, LocalPostgres]]:
    """The given servers, or private ones under `directory` (removed afterwards)."""
    with ExitStack() as stack:
        if mariadb is None:
            # Off UTC, as in the type-matrix test: TIMESTAMPs must still arrive in UTC.
            mariadb = LocalMariaDB(
                directory / "mariadb", extra_args=(f"--default-time-zone={TIMESTAMP_ZONE}",)
            )
            stack.callback(mariadb.remove)
            mariadb.start()
        if postgres is None:
            postgres = LocalPostgres(directory / "postgres")
            stack.callback(postgres.remove)
            postgres.start()
        yield mariadb, postgres


def run_sync_chaos(
    directory: Path,
    seeds: list[int],
    *,
    duration_s: float,
    fault_kinds: tuple[str, ...],
    statement_kinds: tuple[str, ...],
    value_kinds: tuple[str, ...],
    types: tuple[str, ...] = TYPE_NAMES,
    mariadb: LocalMariaDB | None = None,
    postgres: LocalPostgres | None = None,
    out: Out = print,
    keep: bool = False,
    catch_up_timeout_s: float = 240.0,
    second_target: str = "sqlite",
) -> list[SeedReport]:
    """Every seed in turn (servers shared, everything else fresh per seed); prints as it goes,
    ending with `verdict_line`. Directories are removed afterwards unless `keep`."""
    for kind in fault_kinds:  # fail before starting anything
        make_sync_schedule(0, 0, (kind,))
    SyncWorkload(0, statement_kinds, value_kinds, types)
    reports: list[SeedReport] = []
    if second_target == "delta":  # the harness reads the Delta target with a Spark of its own
        from sluice.pipeline.session import spark_session

        spark_session("local[1]", app="chaos-sync-harness")
    directory = directory.resolve()
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        with servers(directory, mariadb, postgres) as (db, pg):
            for seed in seeds:
                run = SeedRun(
                    directory / f"seed-{seed}", seed, duration_s=duration_s, fault_kinds=fault_kinds,
                    statement_kinds=statement_kinds, value_kinds=value_kinds, mariadb=db, postgres=pg,
                    out=out, catch_up_timeout_s=catch_up_timeout_s, types=types, second_target=second_target,
                )  # fmt: skip
                try:
                    reports.append(run.run())
                except Exception as exc:  # a step of the harness itself failed: a failed seed
                    log.exception("event=chaos_sync_seed_failed seed=%d", seed)
                    run.report.problems.append(f"the run stopped: {exc!r}")
                    run.say(f"fail: the run stopped: {exc!r}")
                    reports.append(run.report)
                finally:
                    if not keep:
                        shutil.rmtree(run.directory, ignore_errors=True)
    finally:
        if created and not keep:
            try:
                directory.rmdir()  # only if nothing else was put there
            except OSError:
                pass
    out(types_line(reports))
    out(verdict_line(reports))
    return reports


__all__ = ["SeedReport", "run_sync_chaos", "types_line", "verdict_line"]

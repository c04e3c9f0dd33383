"""The whole pipeline beside the stack it replaces: MariaDB -> Sluice (log, capture, Spark apply)
-> PostgreSQL against MariaDB -> Debezium's MySQL connector -> Apache Kafka -> Debezium's JDBC
sink -> PostgreSQL, the same workload through each, measured in the same run (issue 36).

Each stack is what a user would run, started fresh for each round in a directory of its own:

- sluice: ``cluster up`` of ``--brokers`` brokers and one sync worker (its Spark driver on
  ``local[*]``), one task defined as a task.yaml would (``sluice task create``): the source's two
  tables, a topic of 3 partitions, the task's default trigger, the PostgreSQL target.
- debezium: a Kafka 3.9.1 cluster of ``--brokers`` brokers (``sluice.peers.kafka``), one Kafka
  Connect worker in distributed mode (``sluice.peers.connect``) running Debezium's MySQL connector
  (initial snapshot, then the binlog; topics of 3 partitions, replication 3) and Debezium's JDBC
  sink connector (upsert on the key, deletes on, ``schema.evolution=basic``, ``--sink-tasks``
  tasks), JSON with schemas between them.

One private MariaDB (the source; it reports 8.0.2-MariaDB-<version> because Debezium's connector
refuses MariaDB's own version string, see bench/capture.py) and one private PostgreSQL serve both
stacks; every round gives each stack its own new source database and target database.

A round, for each stack in turn (the first stack alternates from round to round):

1. the source: ``events`` (BIGINT key, seq, VARCHAR, DECIMAL, INT, DATETIME(3), TEXT) filled
   with ``--snapshot-rows`` rows, and ``fresh`` (one marker row per source transaction);
2. the stack starts and snapshots; ``snapshot_rows_s`` is the rows over the time from the
   task / connectors being created to the target holding them all (the stack's start-up before
   that is not counted);
3. a warm-up at the first rate (``--warmup-s``, not measured);
4. for each rate of ``--rates``: ``--rate-s`` seconds of transactions at that many changes per
   second (60 % inserts, 30 % updates, 10 % deletes, multi-row statements, one marker row per
   transaction); a marker's freshness is the time from its transaction's COMMIT returning to the
   marker being visible in the target (polled every 50 ms); p50 / p99 over the rate's markers,
   and the rate the writer reached;
5. the backlog: the stack is paused (``sluice task pause`` / Connect's pause of both
   connectors), ``--backlog`` changes are written as fast as the source takes them, the stack is
   resumed, and ``backlog_rows_s`` is the changes over the time from the resume to the target
   equal to the source (its row count and the sum of ``seq``); ``backlog_first_change_s`` is the
   part of that time before the target's first change (the stack starting its work again);
6. the check: every row of ``events``, source against target (missing, extra, different);
7. the stack's processes: CPU seconds (user + system, the stack's whole process trees: brokers,
   ZooKeeper, workers with their Spark JVMs and Python workers / the Connect JVM) over steps 3 to
   5, and their peak memory (the sum of PSS, sampled every second) over the round.

The source and target databases' own processes are the same for both stacks and not counted.

Every figure is the median of the rounds, printed per stack and then as
``FIGURE ratio sluice/debezium=R`` (for freshness, CPU and memory below 1 favours Sluice).

``--faults`` runs the fault comparison instead: for each seed of ``--seeds``, each stack with
two workers takes the same workload for ``--duration`` seconds under the same seeded schedule
(fault_schedule: kill -9 of a broker, of the worker running the pipeline and of its Spark driver,
a SIGSTOP of that worker past its group session; killed processes start again after 10 s; seed 0
is the control, no faults); then everything runs again, the target is given until it equals the
source or stops moving (``--quiet-s``), and every row is checked. The workload is by default
``sluice chaos sync``'s (``--workload chaos``: its five tables, every statement kind, every
column type of the catalog with its edge values, seeded; ``--types`` narrows the types), checked
as ``sluice chaos sync`` checks (sync/compare.py: each value as the source database gives it);
``--workload events`` is the figures' workload at ``--fault-rate``. Per seed and stack: a
``faults stack=S round=...`` line with ``missing= extra= different=``, the stack's own word on
its pipeline at the end (``faults-state``: the task's state / the connectors' and their tasks'
states and first error line), the columns that differ (``faults-columns``) and a few examples;
then per stack ``faults stack=S seeds=N failed=F missing=M extra=E different=D`` (a stack with no
Spark driver skips that fault, saying so). The control tells a stack's type mapping from what the
faults did.

Usage: .venv/bin/python bench/e2e.py [--against sluice,debezium] [--rates 1000,5000,20000]
       [--rate-s 30] [--backlog 1000000] [--snapshot-rows 100000] [--rounds 3] [--json]
       .venv/bin/python bench/e2e.py --faults [--seeds 0..3] [--duration 120] [--types ...]
Needs scripts/peers.sh's Kafka, Connect, Debezium MySQL and JDBC sink jars for the debezium stack.
Prints figures; asserts nothing but that each stack's target reached the source.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import yaml

import versus
from sluice.chaos import sync_workload as chaos
from sluice.chaos.sync_run import create_source, source_rows, source_schema, target_rows
from sluice.chaos.workload_values import TYPE_NAMES
from sluice.ops import launcher
from sluice.ops.mariadb import LocalMariaDB, _binary
from sluice.ops.postgres import LocalPostgres
from sluice.ops.processes import pid_alive
from sluice.peers.connect import (
    ConnectWorker,
    debezium_jdbc_sink_config,
    debezium_mysql_config,
    schema_converters,
)
from sluice.peers.kafka import peer_down, peer_up
from sluice.sync.compare import TargetComparison, compare_table

STACKS = ("sluice", "debezium")
TABLES = ("events", "fresh")
EVENTS_DDL = (
    "CREATE TABLE events (id BIGINT PRIMARY KEY, seq BIGINT NOT NULL, name VARCHAR(64) NOT NULL, "
    "amount DECIMAL(12,2), qty INT, at DATETIME(3), note TEXT)"
)
FRESH_DDL = "CREATE TABLE fresh (seq BIGINT PRIMARY KEY)"
INSERT_SHARE, UPDATE_SHARE = 0.6, 0.3  # the rest deletes
POLL_S = 0.05
#: the writer's transactions per second at a fixed rate (each carries rate / TX_PER_S changes)
TX_PER_S = 50
#: a stack that shows no progress towards the source for this long has failed the round
STALL_S = 180.0


def progress(text: str) -> None:
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


# --- the stacks' processes ------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, bytes]]:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry.name)] = (ppid, cmdline)
    return out


def stack_pids(directory: Path) -> set[int]:
    """Every process whose command line names ``directory`` (brokers, ZooKeeper, workers, the
    Connect JVM: each is started on files there), and all their descendants (a worker's Spark
    JVM and Python workers)."""
    table = _proc_table()
    mark = str(directory).encode()
    pids = {pid for pid, (_, cmd) in table.items() if mark in cmd and pid != os.getpid()}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in pids:
                pids.add(child)
                todo.append(child)
    return pids


class StackMeter:
    """Samples a stack's processes every second: CPU seconds (utime+stime, and cutime+cstime for
    children it reaped) per process, and the sum of their PSS (peak kept)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._hz = os.sysconf("SC_CLK_TCK")
        self._cpu: dict[tuple[int, int], float] = {}  # (pid, start time) -> CPU seconds, last seen
        self._base: dict[tuple[int, int], float] = {}
        self.peak_pss_mb = 0.0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stack-meter", daemon=True)

    def start(self) -> StackMeter:
        self._thread.start()
        return self

    def _sample(self) -> None:
        pss = 0.0
        pids = stack_pids(self.directory)
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                key = (pid, int(fields[19]))  # starttime: a reused pid is another process
                self._cpu[key] = sum(int(x) for x in fields[11:15]) / self._hz
                with open(f"/proc/{pid}/smaps_rollup") as f:
                    for line in f:
                        if line.startswith("Pss:"):
                            pss += int(line.split()[1]) / 1024
                            break
            except (OSError, ValueError, IndexError):
                continue
        self.peak_pss_mb = max(self.peak_pss_mb, pss)
        self.peak_processes = max(self.peak_processes, len(pids))

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._sample()

    def mark(self) -> None:
        """Start counting CPU from now."""
        self._sample()
        self._base = dict(self._cpu)

    def cpu_s(self) -> float:
        """CPU seconds of the stack's processes since `mark` (a process started since counts
        whole)."""
        self._sample()
        return sum(v - self._base.get(k, 0.0) for k, v in self._cpu.items())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# --- the workload --------------------------------------------------------------------------------


def mysql(db: LocalMariaDB, database: str) -> Any:
    return pymysql.connect(**db.connect_args(database), autocommit=False)  # type: ignore[arg-type]


def fill_source(db: LocalMariaDB, database: str, rows: int) -> None:
    db.execute(f"DROP DATABASE IF EXISTS `{database}`", f"CREATE DATABASE `{database}`")
    db.execute(EVENTS_DDL, FRESH_DDL, database=database)
    step = 100_000
    for lo in range(0, rows, step):
        hi = min(lo + step, rows)
        db.execute(
            "INSERT INTO events SELECT seq, seq, CONCAT('name-', seq), (seq % 100000) / 100, seq % 1000, "
            "'2026-01-01 00:00:00' + INTERVAL seq SECOND, CONCAT('note ', seq) "
            f"FROM seq_{lo + 1}_to_{hi}",
            database=database,
        )
    db.execute("INSERT INTO fresh VALUES (0)", database=database)


@dataclass
class Writer:
    """Transactions of inserts, updates and deletes on ``events`` with one marker row in
    ``fresh`` each; ``committed[marker] = the time COMMIT returned``."""

    db: LocalMariaDB
    database: str
    next_id: int
    seed: int
    live: list[int] = field(default_factory=list)
    seq: int = 0
    marker: int = 0
    committed: dict[int, float] = field(default_factory=dict)
    changes: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.conn = mysql(self.db, self.database)
        self.seq = self.next_id

    def transaction(self, size: int) -> None:
        r = self.rng
        n_ins = max(1, round(size * INSERT_SHARE))
        n_upd = min(len(self.live) // 2, round(size * UPDATE_SHARE))
        n_del = min(len(self.live) // 4, size - n_ins - n_upd)
        picked = r.sample(range(len(self.live)), n_upd + n_del)
        upd = [self.live[i] for i in picked[:n_upd]]
        dele = sorted(picked[n_upd:], reverse=True)
        gone = []
        for i in dele:  # swap-pop, highest index first so the others stay valid
            gone.append(self.live[i])
            self.live[i] = self.live[-1]
            self.live.pop()
        new = list(range(self.next_id, self.next_id + n_ins))
        self.next_id += n_ins
        self.live.extend(new)
        rows = []
        for key in new + upd:
            self.seq += 1
            rows.append(
                f"({key}, {self.seq}, 'name-{key}-{self.seq}', {r.randrange(10**9) / 100:.2f}, "
                f"{r.randrange(-1000, 1000)}, NOW(3), 'note {self.seq}')"
            )
        self.marker += 1
        with self.conn.cursor() as cur:
            cur.execute("INSERT INTO events VALUES " + ",".join(rows[:n_ins]))
            if upd:
                cur.execute(
                    "INSERT INTO events VALUES " + ",".join(rows[n_ins:]) + " ON DUPLICATE KEY UPDATE "
                    "seq = VALUES(seq), name = VALUES(name), amount = VALUES(amount), qty = VALUES(qty), "
                    "at = VALUES(at), note = VALUES(note)"
                )
            if gone:
                cur.execute(f"DELETE FROM events WHERE id IN ({','.join(map(str, gone))})")
            cur.execute(f"INSERT INTO fresh VALUES ({self.marker})")
        self.conn.commit()
        self.committed[self.marker] = time.time()
        self.changes += n_ins + len(upd) + len(gone)

    def at_rate(self, rate: float, seconds: float) -> tuple[int, int, float]:
        """Transactions at ``rate`` changes/s for ``seconds``: (first marker, last marker, rate
        reached)."""
        # At most TX_PER_S transactions a second: the source syncs its redo log and binlog at each
        # commit (about 10 ms here), so one writer of small transactions reached 185 changes/s.
        size = max(2, round(rate / TX_PER_S))
        first, start_changes = self.marker + 1, self.changes
        t0 = time.monotonic()
        while (now := time.monotonic()) - t0 < seconds:
            due = t0 + (self.changes - start_changes) / rate
            if due > now:
                time.sleep(due - now)
            self.transaction(size)
        return first, self.marker, (self.changes - start_changes) / (time.monotonic() - t0)

    def backlog(self, changes: int, size: int = 1000) -> None:
        target = self.changes + changes
        while self.changes < target:
            self.transaction(min(size, target - self.changes))

    def close(self) -> None:
        self.conn.close()


class Watcher:
    """Polls the target's ``fresh`` table every POLL_S: ``seen[marker] = when it was first
    visible``."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[int, float] = {}
        self._low = 0  # every marker up to here is seen
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        conn: Any = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
                rows = conn.execute("SELECT seq FROM fresh WHERE seq > %s", (self._low,)).fetchall()
                now = time.time()
                for (seq,) in rows:
                    self.seen.setdefault(int(seq), now)
                while self._low + 1 in self.seen:
                    self._low += 1
                self.error = None
            except psycopg.Error as exc:  # the table is not there yet, or the server restarts
                self.error = str(exc).strip()
                if conn is not None:
                    conn.close()
                    conn = None
            self._stop.wait(POLL_S)
        if conn is not None:
            conn.close()

    def wait_for(self, markers: range, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(m in self.seen for m in markers):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def source_sums(db: LocalMariaDB, database: str) -> tuple[int, int]:
    ((count, total),) = db.execute("SELECT COUNT(*), COALESCE(SUM(seq), 0) FROM events", database=database)
    return int(count), int(total)  # type: ignore[call-overload]


def target_sums(url: str) -> tuple[int, int] | None:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            row = conn.execute("SELECT COUNT(*), COALESCE(SUM(seq), 0) FROM events").fetchone()
    except psycopg.Error:
        return None
    assert row is not None
    return int(row[0]), int(row[1])


def wait_equal(db: LocalMariaDB, database: str, url: str, what: str) -> tuple[float, float]:
    """Until the target's count and sum of seq equal the source's: (when the target first
    changed, when it was first seen equal), wall-clock. Raises when nothing moves for
    STALL_S."""
    want = source_sums(db, database)
    last, moved = target_sums(url), time.monotonic()
    first = float("nan")
    while True:
        got = target_sums(url)
        if got == want:
            return (time.time() if math.isnan(first) else first), time.time()
        if got != last:
            if math.isnan(first):  # the first change seen
                first = time.time()
            last, moved = got, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            raise RuntimeError(f"{what}: the target stopped at {last} (count, sum of seq) of {want}")
        time.sleep(0.25)


def check(db: LocalMariaDB, database: str, url: str) -> tuple[int, int, int]:
    """(missing, extra, different) rows of ``events``, by key, on seq, name and qty."""
    source = {
        int(r[0]): (int(r[1]), str(r[2]), r[3])  # type: ignore[call-overload]
        for r in db.execute("SELECT id, seq, name, qty FROM events", database=database)
    }
    with psycopg.connect(url) as conn:
        target = {
            int(r[0]): (int(r[1]), str(r[2]), r[3])
            for r in conn.execute("SELECT id, seq, name, qty FROM events").fetchall()
        }
    missing = len(source.keys() - target.keys())
    extra = len(target.keys() - source.keys())
    different = sum(1 for k in source.keys() & target.keys() if source[k] != target[k])
    return missing, extra, different


# --- the stacks ----------------------------------------------------------------------------------


class Stack:
    """One stack's processes and its pipeline; ``--faults`` kills, pauses and restarts them."""

    name = ""

    def __init__(
        self, directory: Path, args: argparse.Namespace, db: LocalMariaDB, pg: LocalPostgres, workers: int = 1
    ) -> None:
        self.directory = directory
        self.args = args
        self.db = db
        self.pg = pg
        self.workers = workers

    def start(self) -> None:
        raise NotImplementedError

    def create_pipeline(self, database: str, target_db: str, tables: tuple[str, ...] = TABLES) -> None:
        raise NotImplementedError

    def state(self) -> str:
        """What the stack says of its pipeline now, one line (its task's or connectors' state)."""
        raise NotImplementedError

    def pause(self) -> None:
        raise NotImplementedError

    def resume(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    # --- faults: brokers and workers by index
    def broker_pids(self) -> list[int]:
        raise NotImplementedError

    def restart_broker(self, index: int) -> None:
        raise NotImplementedError

    def worker_pids(self) -> list[int]:
        """Each worker's main process, the leader of its process group (a signal to the group
        reaches its Spark JVM and Python workers too); -1 for one not running."""
        raise NotImplementedError

    def restart_worker(self, index: int) -> None:
        raise NotImplementedError

    def pipeline_worker(self) -> int | None:
        """The index of the worker running the pipeline (its apply) now; None if not known."""
        raise NotImplementedError

    def driver_pid(self, index: int) -> int | None:
        """Worker ``index``'s Spark driver JVM; None where the stack has none."""
        return None

    def _continue_all(self) -> None:
        """SIGCONT to every worker's group: one a fault left stopped must be able to stop."""
        for pid in self.worker_pids():
            if pid > 0:
                try:
                    os.killpg(pid, signal.SIGCONT)
                except OSError:
                    pass


class SluiceStack(Stack):
    name = "sluice"
    cluster: Any = None
    task = "e2e"

    def start(self) -> None:
        self.cluster = launcher.cluster_up(
            self.directory / "cluster", self.args.brokers, workers=self.workers
        )

    def _sluice(self, *argv: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "sluice.cli", *argv, "--zookeeper", self.cluster.zookeeper],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"sluice {' '.join(argv)} failed: {out.stderr.strip()[-2000:]}")
        return out.stdout

    def create_pipeline(self, database: str, target_db: str, tables: tuple[str, ...] = TABLES) -> None:
        doc = {
            "id": self.task,
            "source": {"kind": "mariadb", "host": "127.0.0.1", "port": self.db.port, "user": "root",
                       "database": database},
            "tables": list(tables),
            "topic": "{task}.changes",
            "target": self.pg.url(target_db),
            "options": {"partitions": 3},
        }  # fmt: skip
        path = self.directory / "task.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self._sluice("task", "create", "--file", str(path))

    def pause(self) -> None:
        self._sluice("task", "pause", self.task)

    def state(self) -> str:
        from sluice.cluster.zkstore import close, connect
        from sluice.sync.tasks import TaskStore

        zk = connect(self.cluster.zookeeper, auth=self.cluster.zk_auth())
        try:
            status = TaskStore(zk).status(self.task) or {}
        finally:
            close(zk)
        keys = ("state", "execution", "worker", "attempts", "error")
        return " ".join(f"{k}={str(status[k])[:300]!r}" for k in keys if status.get(k) not in (None, ""))

    def resume(self) -> None:
        self._sluice("task", "resume", self.task)

    def stop(self) -> None:
        if self.cluster is not None:
            self._continue_all()
            launcher.cluster_down(Path(self.cluster.directory))

    def broker_pids(self) -> list[int]:
        return [b.pid for b in self.cluster.brokers]

    def restart_broker(self, index: int) -> None:
        launcher.restart_broker(self.cluster, self.cluster.brokers[index])

    def worker_pids(self) -> list[int]:
        if self.cluster is None:
            return []
        return [w.pid if pid_alive(w.pid) else -1 for w in self.cluster.workers]

    def restart_worker(self, index: int) -> None:
        w = self.cluster.workers[index]
        try:
            os.waitpid(w.pid, 0)  # reap it: our child, killed
        except ChildProcessError:
            pass
        launcher.start_worker_process(self.cluster, w)
        self.cluster.save()

    def pipeline_worker(self) -> int | None:
        from sluice.cluster.zkstore import close, connect
        from sluice.sync.tasks import TaskStore

        zk = connect(self.cluster.zookeeper, auth=self.cluster.zk_auth())
        try:
            name = (TaskStore(zk).status(self.task) or {}).get("worker")
        finally:
            close(zk)
        names = [w.name for w in self.cluster.workers]
        return names.index(name) if name in names else None

    def driver_pid(self, index: int) -> int | None:
        from sluice.chaos.sync_faults import spark_driver_pid

        return spark_driver_pid(self.cluster.workers[index].pid)


def sink_config(
    args: argparse.Namespace,
    pg_port: int,
    database: str,
    target_db: str,
    tables: tuple[str, ...],
    prefix: str,
) -> dict[str, str]:
    """The JDBC sink's configuration: Debezium's defaults, or with ``--sink-batch-size`` and
    ``--sink-rewrite-batched`` the tuned variant (bigger batches, fed by as big a poll, and the
    PostgreSQL driver rewriting a batch of inserts into multi-row statements)."""
    url = f"jdbc:postgresql://127.0.0.1:{pg_port}/{target_db}"
    if args.sink_rewrite_batched:
        url += "?reWriteBatchedInserts=true"
    sink = debezium_jdbc_sink_config(
        url=url, user="postgres", password="",
        topics_regex=rf"{prefix}\.{database}\.({'|'.join(tables)})", tasks=args.sink_tasks,
        batch_size=args.sink_batch_size,
    )  # fmt: skip
    if args.sink_batch_size > 500:  # the consumer hands the task 500 records a poll by default
        sink["consumer.override.max.poll.records"] = str(args.sink_batch_size)
    return sink


class DebeziumStack(Stack):
    name = "debezium"
    peer: Any = None
    SOURCE, SINK, PREFIX = "e2e-source", "e2e-sink", "e2e"

    def start(self) -> None:
        self.peer = peer_up(self.directory / "kafka", self.args.brokers)
        rf = min(3, self.args.brokers)
        self.connect = [
            ConnectWorker(
                self.directory / f"connect-{i + 1}", self.peer.bootstrap_servers, replication_factor=rf
            )
            for i in range(self.workers)
        ]
        for w in self.connect:
            w.start()

    def _rest(self) -> ConnectWorker:
        """A running worker (any forwards what the group's leader must do)."""
        for w in self.connect:
            if w.running():
                return w
        raise RuntimeError("no Connect worker is running")

    def create_pipeline(self, database: str, target_db: str, tables: tuple[str, ...] = TABLES) -> None:
        rf = min(3, self.args.brokers)
        source = debezium_mysql_config(
            host="127.0.0.1", port=self.db.port, user="root", password="", database=database,
            server_id=5400 + random.randrange(1000), topic_prefix=self.PREFIX,
            bootstrap=self.peer.bootstrap_servers, history_topic=f"{self.PREFIX}.history",
            tables=list(tables), partitions=3,
        )  # fmt: skip
        source.update(schema_converters())
        source["topic.creation.default.replication.factor"] = str(rf)
        source["topic.creation.default.min.insync.replicas"] = str(min(2, rf))
        # The tables' topics exist before the sink subscribes: a topic its pattern matches only
        # later is found at the consumer's next metadata refresh (metadata.max.age.ms, 5 minutes)
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.peer.bootstrap_servers, "log_level": 0})
        names = [f"{self.PREFIX}.{database}.{t}" for t in tables]
        config = {"min.insync.replicas": str(min(2, rf))}
        for future in admin.create_topics([NewTopic(n, 3, rf, config=config) for n in names]).values():
            future.result(60)
        sink = sink_config(self.args, self.pg.port, database, target_db, tables, self.PREFIX)
        rest = self._rest()
        rest.put_connector(self.SOURCE, source)
        rest.put_connector(self.SINK, sink)
        rest.wait_running(self.SOURCE)
        rest.wait_running(self.SINK)

    def state(self) -> str:
        parts = []
        for name in (self.SOURCE, self.SINK):
            try:
                status = self._rest().status(name)
            except Exception as exc:
                parts.append(f"{name}=unknown({exc})")
                continue
            tasks = status.get("tasks", [])
            states = ",".join(str(t.get("state")) for t in tasks)
            parts.append(f"{name}={status.get('connector', {}).get('state')}/{states}")
            for t in tasks:
                if t.get("trace"):
                    first = str(t["trace"]).strip().splitlines()[0][:300]
                    parts.append(f"{name}.task{t.get('id')}.error={first!r}")
        return " ".join(parts)

    def pause(self) -> None:
        for name in (self.SOURCE, self.SINK):
            self._rest().request("PUT", f"/connectors/{name}/pause")

    def resume(self) -> None:
        for name in (self.SOURCE, self.SINK):
            self._rest().request("PUT", f"/connectors/{name}/resume")

    def stop(self) -> None:
        self._continue_all()
        for w in getattr(self, "connect", []):
            w.stop(grace_s=20)
        if self.peer is not None:
            peer_down(Path(self.peer.directory))

    def broker_pids(self) -> list[int]:
        return [b.pid for b in self.peer.brokers]

    def restart_broker(self, index: int) -> None:
        from sluice.peers.kafka import restart_broker

        restart_broker(self.peer, self.peer.brokers[index].broker_id)

    def worker_pids(self) -> list[int]:
        return [
            w.proc.pid if w.running() and w.proc is not None else -1 for w in getattr(self, "connect", [])
        ]

    def restart_worker(self, index: int) -> None:
        w = self.connect[index]
        if w.proc is not None:
            w.proc.wait(10)  # killed: reap it
        w.proc = None
        w.start()  # the same directory and REST port

    def pipeline_worker(self) -> int | None:
        """The worker running the sink's first task (its ``worker_id`` is the REST host:port)."""
        try:
            tasks = self._rest().status(self.SINK).get("tasks", [])
        except Exception:
            return None
        ports = [c.port for c in self.connect]
        for t in sorted(tasks, key=lambda t: int(t.get("id", 0))):
            port = int(str(t.get("worker_id", ":0")).rsplit(":", 1)[1])
            if port in ports:
                return ports.index(port)
        return None


@dataclass
class RoundResult:
    stack: str
    round: int
    figures: dict[str, float] = field(default_factory=dict)
    checked: tuple[int, int, int] | None = None
    error: str | None = None
    state: str = ""  # what the stack said of its pipeline at the end (fault runs)
    detail: list[str] = field(default_factory=list)  # the checker's lines (fault runs)
    columns: dict[str, int] = field(default_factory=dict)  # table.column -> rows different there

    def line(self) -> str:
        parts = [f"e2e stack={self.stack} round={self.round + 1}"]
        parts += [f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in self.figures.items()]
        if self.checked is not None:
            parts += [
                f"missing={self.checked[0]}",
                f"extra={self.checked[1]}",
                f"different={self.checked[2]}",
            ]
        if self.error:
            parts.append(f"error={self.error!r}")
        return " ".join(parts)


def run_round(
    kind: type[Stack], args: argparse.Namespace, root: Path, db: LocalMariaDB, pg: LocalPostgres, rnd: int
) -> RoundResult:
    result = RoundResult(kind.name, rnd)
    database = f"e2e_{kind.name}_{rnd}"
    directory = root / f"{kind.name}-{rnd}"
    directory.mkdir(parents=True)
    stack = kind(directory, args, db, pg)
    meter = StackMeter(directory)
    watcher: Watcher | None = None
    writer: Writer | None = None
    try:
        progress(f"{kind.name} round {rnd + 1}: source {database}, {args.snapshot_rows:,} rows")
        fill_source(db, database, args.snapshot_rows)
        url = pg.create_database(database)
        progress(f"{kind.name} round {rnd + 1}: starting the stack")
        stack.start()
        meter.start()
        t0 = time.time()
        stack.create_pipeline(database, database)
        _, done = wait_equal(db, database, url, "snapshot")
        result.figures["snapshot_rows_s"] = args.snapshot_rows / (done - t0)
        progress(f"{kind.name}: snapshot applied, {result.figures['snapshot_rows_s']:,.0f} rows/s")
        watcher = Watcher(url).start()
        writer = Writer(
            db, database, args.snapshot_rows + 1, seed=rnd, live=list(range(1, args.snapshot_rows + 1))
        )
        rates = args.rate_list
        writer.at_rate(rates[0], args.warmup_s)
        meter.mark()
        for rate in rates:
            first, last, reached = writer.at_rate(rate, args.rate_s)
            ok = watcher.wait_for(range(first, last + 1), STALL_S)
            if not ok:  # far behind, still moving: its real freshness, and the next rate starts level
                wait_equal(db, database, url, f"the changes at {rate}/s")
                ok = watcher.wait_for(range(first, last + 1), STALL_S)
            fresh = [
                watcher.seen[m] - writer.committed[m] for m in range(first, last + 1) if m in watcher.seen
            ]
            result.figures[f"rate_reached@{rate}"] = reached
            result.figures[f"freshness_p50_s@{rate}"] = pct(fresh, 0.50)
            result.figures[f"freshness_p99_s@{rate}"] = pct(fresh, 0.99) if ok else float("inf")
            progress(
                f"{kind.name} @{rate}/s (reached {reached:,.0f}): freshness p50 "
                f"{pct(fresh, 0.5):.2f}s p99 {pct(fresh, 0.99):.2f}s{'' if ok else ' (markers missing)'}"
            )
        if args.backlog:
            stack.pause()
            time.sleep(3)  # pause takes effect
            progress(f"{kind.name}: paused, writing a backlog of {args.backlog:,} changes")
            writer.backlog(args.backlog)
            t1 = time.time()
            stack.resume()
            first_change, done = wait_equal(db, database, url, "backlog")
            result.figures["backlog_rows_s"] = args.backlog / (done - t1)
            result.figures["backlog_first_change_s"] = first_change - t1
            progress(f"{kind.name}: backlog applied, {result.figures['backlog_rows_s']:,.0f} changes/s")
        result.figures["cpu_s"] = meter.cpu_s()
        result.figures["rss_mb"] = meter.peak_pss_mb
        result.figures["processes"] = float(meter.peak_processes)
        wait_equal(db, database, url, "the end")
        result.checked = check(db, database, url)
    except Exception as exc:  # a failed round is reported, the run goes on
        result.error = f"{type(exc).__name__}: {exc}"[:500]
        progress(f"{kind.name} round {rnd + 1} failed: {result.error}")
    finally:
        if watcher is not None:
            watcher.stop()
        if writer is not None:
            writer.close()
        meter.stop()
        stack.stop()
        db.execute(f"DROP DATABASE IF EXISTS `{database}`")
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print(result.line(), flush=True)
    return result


# --- the same faults on both stacks ----------------------------------------------------------------

FAULT_KINDS = ("broker", "worker", "driver", "pause")
#: how long a killed broker or worker stays down; a paused worker stays stopped past its group
#: session (10 s for Sluice's workers and for Connect's) by PAUSE_S
DOWN_S = 10.0
PAUSE_S = 25.0


def fault_schedule(
    seed: int, duration_s: float, kinds: tuple[str, ...] = FAULT_KINDS
) -> list[tuple[float, str]]:
    """Each kind once, in a seeded order, spread over the run: (seconds from the start, kind).
    Seed 0 has no faults: the control run (what a stack gets wrong without any)."""
    if seed == 0:
        return []
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    slot = duration_s / (len(order) + 1)
    return [(round(slot * (i + 0.5) + rng.uniform(0, slot / 2), 1), kind) for i, kind in enumerate(order)]


class Injector:
    """Runs a schedule against a stack in a thread: kill -9 of a broker (started again after
    DOWN_S), of the worker running the pipeline (the same), of that worker's Spark driver (the
    worker starts a new one; a stack without one skips it, saying so), SIGSTOP of that worker
    for PAUSE_S (past its session: the group moves the pipeline) then SIGCONT."""

    def __init__(self, stack: Stack, schedule: list[tuple[float, str]], seed: int) -> None:
        self.stack = stack
        self.schedule = schedule
        self.rng = random.Random(seed)
        self.events: list[str] = []
        self.error: str | None = None
        self._t0 = 0.0
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def say(self, text: str) -> None:
        line = f"{time.monotonic() - self._t0:6.1f}s {text}"
        self.events.append(line)
        progress(f"{self.stack.name} fault: {line}")

    def start(self) -> Injector:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for at, kind in self.schedule:
                delay = self._t0 + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                getattr(self, f"_{kind}")()
        except Exception as exc:  # the run reports it
            self.error = f"{type(exc).__name__}: {exc}"
            self.say(f"the injector failed: {self.error}")

    def _broker(self) -> None:
        index = self.rng.randrange(len(self.stack.broker_pids()))
        pid = self.stack.broker_pids()[index]
        os.kill(pid, signal.SIGKILL)
        self.say(f"kill -9 broker {index + 1} (pid {pid})")
        time.sleep(DOWN_S)
        self.stack.restart_broker(index)
        self.say(f"broker {index + 1} started again")

    def _worker_kill(self, index: int) -> None:
        pid = self.stack.worker_pids()[index]
        if pid > 0:
            os.killpg(pid, signal.SIGKILL)
        self.say(f"kill -9 worker {index + 1} (pid {pid}, its whole process group)")
        time.sleep(DOWN_S)
        self.stack.restart_worker(index)
        self.say(f"worker {index + 1} started again")

    def _worker(self) -> None:
        self._worker_kill(self._pipeline_worker())

    def _pipeline_worker(self) -> int:
        index = self.stack.pipeline_worker()
        return self.rng.randrange(self.stack.workers) if index is None else index

    def _driver(self) -> None:
        index = self._pipeline_worker()
        pid = self.stack.driver_pid(index)
        if pid is None:
            self.say(f"skipped: worker {index + 1} of {self.stack.name} runs no Spark driver")
            return
        os.kill(pid, signal.SIGKILL)
        self.say(f"kill -9 the Spark driver of worker {index + 1} (pid {pid})")

    def _pause(self) -> None:
        index = self._pipeline_worker()
        pid = self.stack.worker_pids()[index]
        if pid <= 0:
            self.say(f"skipped: worker {index + 1} is not running")
            return
        os.killpg(pid, signal.SIGSTOP)
        self.say(f"SIGSTOP worker {index + 1} (pid {pid}) for {PAUSE_S:.0f}s")
        time.sleep(PAUSE_S)
        os.killpg(pid, signal.SIGCONT)
        self.say(f"SIGCONT worker {index + 1}")

    def finish(self) -> None:
        """Wait for the schedule's end; then every process of the stack runs again."""
        self._thread.join()
        self.stack._continue_all()
        for index, pid in enumerate(self.stack.worker_pids()):
            if pid <= 0:
                self.stack.restart_worker(index)
                self.say(f"worker {index + 1} started again at the end")


def compare_chaos(db: LocalMariaDB, database: str, url: str, label: str) -> TargetComparison:
    """Every row of every table of the chaos workload, source against target, each value as the
    source database gives it and as `sync/compare.py` normalises it (`sluice chaos sync`'s
    checker); a table the target does not have counts its rows missing."""
    comparison = TargetComparison(label)
    for schema in source_schema(db, database):
        try:
            got = target_rows(url, schema.name)
        except psycopg.Error:
            got = []
        comparison.tables.append(compare_table(schema, source_rows(db, database, schema), got, "postgresql"))
    return comparison


def settle(db: LocalMariaDB, database: str, url: str, label: str, quiet_s: float) -> TargetComparison:
    """Compares until the target equals the source, or until the comparison has not changed for
    ``quiet_s`` (the stack has stopped moving): the last comparison. An empty target (a stack
    still starting: Spark, Connect's tasks) is given STALL_S more before that counts."""
    last: tuple[str, ...] = ()
    t0 = since = time.monotonic()
    while True:
        comparison = compare_chaos(db, database, url, label)
        if comparison.ok:
            return comparison
        seen = tuple(comparison.lines(examples=10**6))
        empty = comparison.compared == comparison.missing and not comparison.extra
        now = time.monotonic()
        if seen != last:
            last, since = seen, now
        elif now - since > quiet_s and (not empty or now - t0 > quiet_s + STALL_S):
            return comparison
        time.sleep(2.0)


def different_columns(comparison: TargetComparison) -> dict[str, int]:
    """table.column -> how many rows differ in that column."""
    out: dict[str, int] = {}
    for t in comparison.tables:
        for _, cols in t.different:
            for column, _, _ in cols:
                out[f"{t.table}.{column}"] = out.get(f"{t.table}.{column}", 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def run_faults(
    kind: type[Stack], args: argparse.Namespace, root: Path, db: LocalMariaDB, pg: LocalPostgres, seed: int
) -> RoundResult:
    """One seed's fault run on one stack: two workers, the workload for ``--duration`` seconds
    under the seeded schedule (seed 0: no faults, the control), then every process running
    again, the target given until it stops moving, and every row checked."""
    result = RoundResult(kind.name, seed - 1)
    database = f"e2e_faults_{kind.name}_{seed}"
    directory = root / f"faults-{kind.name}-{seed}"
    directory.mkdir(parents=True)
    stack = kind(directory, args, db, pg, workers=2)
    writer: Writer | None = None
    runner: chaos.WorkloadRunner | None = None
    schedule = fault_schedule(seed, args.duration)
    label = f"{kind.name} seed {seed}"
    try:
        progress(f"{label}: " + (", ".join(f"{k}@{at:g}s" for at, k in schedule) or "no faults (control)"))
        url = pg.create_database(database)
        if args.workload == "chaos":
            workload = chaos.SyncWorkload(seed, values=args.value_kinds, types=args.type_list)
            create_source(db, database, workload)
            stack.start()
            stack.create_pipeline(database, database, chaos.TABLES)
            snap = settle(db, database, url, label, args.quiet_s)
            result.figures["snapshot_wrong"] = float(snap.missing + snap.extra + snap.different)
            progress(f"{label}: snapshot {'equal' if snap.ok else 'settled unequal'}: {snap.lines()[0]}")
            runner = chaos.WorkloadRunner(
                lambda: pymysql.connect(**db.connect_args(database), charset="utf8mb4"),  # type: ignore[arg-type]
                workload, rate_per_s=args.chaos_tx_s,
            )  # fmt: skip
            injector = Injector(stack, schedule, seed).start()
            runner.start()
            runner.stop.wait(args.duration)
            stats = runner.finish()
            runner = None
            if stats.error:
                raise RuntimeError(stats.error)
            result.figures["statements"] = float(stats.statements)
        else:
            fill_source(db, database, args.snapshot_rows)
            stack.start()
            stack.create_pipeline(database, database)
            wait_equal(db, database, url, "snapshot")
            writer = Writer(
                db, database, args.snapshot_rows + 1, seed=seed, live=list(range(1, args.snapshot_rows + 1))
            )
            injector = Injector(stack, schedule, seed).start()
            _, _, reached = writer.at_rate(args.fault_rate, args.duration)
            result.figures["rate_reached"] = reached
        injector.finish()
        result.figures["faults"] = float(len(injector.events))
        if injector.error:
            result.error = injector.error
        t = time.time()
        if args.workload == "chaos":
            comparison = settle(db, database, url, label, args.quiet_s)
            result.figures["settled_s"] = time.time() - t
            result.checked = (comparison.missing, comparison.extra, comparison.different)
            result.detail = comparison.lines(examples=3)
            result.columns = different_columns(comparison)
        else:
            wait_equal(db, database, url, "after the faults")
            result.figures["caught_up_s"] = time.time() - t
            result.checked = check(db, database, url)
        result.state = stack.state()
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:500]
        progress(f"{label} failed: {result.error}")
        try:  # what the target holds all the same: the rows wrong when the stack gave up
            if args.workload == "chaos":
                comparison = compare_chaos(db, database, pg.url(database), label)
                result.checked = (comparison.missing, comparison.extra, comparison.different)
                result.detail = comparison.lines(examples=3)
            else:
                result.checked = check(db, database, pg.url(database))
            result.state = stack.state()
        except Exception:
            pass
    finally:
        if runner is not None:
            runner.finish()
        if writer is not None:
            writer.close()
        stack.stop()
        db.execute(f"DROP DATABASE IF EXISTS `{database}`")
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    print("faults " + result.line().removeprefix("e2e "), flush=True)
    if result.state:
        print(f"faults-state stack={kind.name} seed={seed} {result.state}", flush=True)
    if result.columns:
        cols = ",".join(f"{c}:{n}" for c, n in result.columns.items())
        print(f"faults-columns stack={kind.name} seed={seed} {cols}", flush=True)
    for line in result.detail:
        print(f"# {kind.name} seed {seed} {line}", flush=True)
    return result


#: the figures compared, and whether lower is better (printed ratios are sluice/debezium either way)
def figure_names(rates: list[int]) -> list[str]:
    names = ["backlog_rows_s", "backlog_first_change_s", "snapshot_rows_s"]
    for rate in rates:
        names += [f"freshness_p50_s@{rate}", f"freshness_p99_s@{rate}", f"rate_reached@{rate}"]
    return [*names, "cpu_s", "rss_mb", "processes"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--against", default="sluice,debezium", help="comma-separated: sluice, debezium")
    ap.add_argument("--rates", default="1000,5000,20000", help="changes/s, comma-separated")
    ap.add_argument("--rate-s", type=float, default=30.0, help="measured seconds at each rate")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured seconds at the first rate")
    ap.add_argument("--backlog", type=int, default=1_000_000, help="changes written while paused (0: none)")
    ap.add_argument("--snapshot-rows", type=int, default=100_000)
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--sink-tasks", type=int, default=3, help="the JDBC sink's tasks.max (3 partitions)")
    ap.add_argument(
        "--sink-batch-size", type=int, default=500, help="the JDBC sink's batch.size (500, its default)"
    )
    ap.add_argument(
        "--sink-rewrite-batched",
        action="store_true",
        help="the JDBC sink's PostgreSQL driver rewrites batched inserts (reWriteBatchedInserts=true)",
    )
    ap.add_argument("--rounds", type=int, default=3)
    g = ap.add_argument_group("the fault comparison (--faults): the same seeded faults on each stack")
    g.add_argument("--faults", action="store_true", help="run the fault comparison instead of the figures")
    g.add_argument("--seeds", default="1", help="fault schedules, e.g. 1..3 or 1,4")
    g.add_argument("--duration", type=float, default=120.0, help="seconds of workload under faults")
    g.add_argument(
        "--workload", choices=("chaos", "events"), default="chaos",
        help="chaos: sluice chaos sync's randomized workload (every statement kind, every column type "
        "and edge value); events: the figures' events workload at --fault-rate",
    )  # fmt: skip
    g.add_argument("--types", default="all", help="chaos: the catalog column types, comma-separated (all)")
    g.add_argument(
        "--values", default="all",
        help="chaos: value kinds as sluice chaos sync takes them (all, or e.g. --values=-invalid-date)",
    )  # fmt: skip
    g.add_argument("--chaos-tx-s", type=float, default=12.0, help="chaos: transactions per second")
    g.add_argument("--fault-rate", type=int, default=1000, help="events: changes/s during the faults")
    g.add_argument(
        "--quiet-s", type=float, default=120.0,
        help="chaos: a target unchanged this long and still unequal has stopped moving: checked as it is",
    )  # fmt: skip
    ap.add_argument("--keep", action="store_true", help="keep the stacks' directories")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args(argv)
    args.stacks = [s.strip() for s in args.against.split(",") if s.strip()]
    if not args.stacks or set(args.stacks) - set(STACKS) or len(set(args.stacks)) != len(args.stacks):
        ap.error(f"--against takes {' and/or '.join(STACKS)}, comma-separated, each once")
    try:
        args.rate_list = [int(r) for r in args.rates.split(",") if r.strip()]
    except ValueError:
        ap.error("--rates takes whole changes/s, comma-separated")
    if not args.rate_list or min(args.rate_list) <= 0:
        ap.error("--rates needs at least one rate above 0")
    if args.rounds < 1 or args.brokers < 1:
        ap.error("--rounds and --brokers must be at least 1")
    try:
        if ".." in args.seeds:
            lo, hi = (int(x) for x in args.seeds.split(".."))
            args.seed_list = list(range(lo, hi + 1))
        else:
            args.seed_list = [int(x) for x in args.seeds.split(",") if x.strip()]
    except ValueError:
        ap.error("--seeds takes N, N..M or N,M,...")
    try:
        kinds = chaos.VALUE_KINDS
        args.value_kinds = (
            () if args.values.strip() == "none" else chaos.parse_kinds(args.values, kinds, "value kind")
        )
    except ValueError as exc:
        ap.error(str(exc))
    if args.types == "all":
        args.type_list = TYPE_NAMES
    else:
        args.type_list = tuple(t.strip() for t in args.types.split(",") if t.strip())
        unknown = set(args.type_list) - set(TYPE_NAMES)
        if unknown or not args.type_list:
            ap.error(f"--types takes some of {', '.join(TYPE_NAMES)} (unknown: {', '.join(sorted(unknown))})")
    if args.faults and (args.brokers < 3 or not args.seed_list):
        ap.error("--faults needs --brokers 3 or more (a broker is killed) and at least one seed")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_sigterm(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)  # tear down as on Ctrl-C
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-e2e-"))
    kinds = {"sluice": SluiceStack, "debezium": DebeziumStack}
    results: list[RoundResult] = []
    version = subprocess.run(
        [_binary("mariadbd", "mysqld"), "--version"], capture_output=True, text=True
    ).stdout
    reported = "8.0.2-MariaDB-" + version.split("Ver ", 1)[1].split()[0] if "Ver " in version else None
    db = LocalMariaDB(root / "mariadb", extra_args=(f"--version={reported}",) if reported else ()).start()
    pg = LocalPostgres(root / "postgres").start()
    try:
        print(f"command: {' '.join(sys.argv)}", flush=True)
        if args.faults:
            print(f"e2e faults mariadb={reported} brokers={args.brokers} seeds={args.seeds} "
                  f"duration={args.duration:g} workload={args.workload} types={len(args.type_list)} "
                  f"values={','.join(args.value_kinds) or 'none'} "
                  f"chaos_tx_s={args.chaos_tx_s:g} quiet_s={args.quiet_s:g} sink_tasks={args.sink_tasks} "
                  f"load={load()}", flush=True)  # fmt: skip
        else:
            print(f"e2e mariadb={reported} brokers={args.brokers} rates={args.rates} rate_s={args.rate_s:g} "
                  f"backlog={args.backlog} snapshot_rows={args.snapshot_rows} rounds={args.rounds} "
                  f"sink_tasks={args.sink_tasks} sink_batch_size={args.sink_batch_size} "
                  f"sink_rewrite_batched={args.sink_rewrite_batched} load={load()}", flush=True)  # fmt: skip
        if args.faults:
            for i, seed in enumerate(args.seed_list):
                for name in versus.round_orders(args.stacks, i + 1)[i]:
                    results.append(run_faults(kinds[name], args, root, db, pg, seed))
        else:
            for rnd, order in enumerate(versus.round_orders(args.stacks, args.rounds)):
                for name in order:
                    results.append(run_round(kinds[name], args, root, db, pg, rnd))
    except KeyboardInterrupt:
        progress("interrupted")
        return 130
    finally:
        db.remove()
        pg.remove()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.faults:
        for stack in args.stacks:
            runs = [r for r in results if r.stack == stack]
            wrong = [r.checked for r in runs if r.checked is not None]
            m, e, d = (sum(w[i] for w in wrong) for i in range(3))
            failed = sum(1 for r in runs if r.error or r.checked is None)
            print(
                f"faults stack={stack} seeds={len(runs)} failed={failed} missing={m} extra={e} different={d}",
                flush=True,
            )
        return 0
    medians: dict[str, dict[str, float]] = {}
    for name in figure_names(args.rate_list):
        for stack in args.stacks:
            values = [r.figures[name] for r in results if r.stack == stack and name in r.figures]
            medians.setdefault(name, {})[stack] = statistics.median(values) if values else float("nan")
    for stack in args.stacks:
        wrong = [r.checked for r in results if r.stack == stack and r.checked is not None]
        failed = sum(1 for r in results if r.stack == stack and r.error)
        m, e, d = (sum(w[i] for w in wrong) for i in range(3))
        print(
            f"check stack={stack} rounds={len(wrong)} failed_rounds={failed} "
            f"missing={m} extra={e} different={d}"
        )
    if len(args.stacks) == 2:
        versus.print_figures(
            [(name, v["sluice"], v["debezium"]) for name, v in medians.items()], digits=2, peer="debezium"
        )
    else:
        for name, v in medians.items():
            print(f"{name} {args.stacks[0]}={v[args.stacks[0]]:.2f}")
    print(f"e2e load={load()}", flush=True)
    if args.json:
        print(json.dumps(versus.finite({"argv": sys.argv[1:], "rounds": [r.__dict__ for r in results],
                                        "medians": medians})))  # fmt: skip
    return 0 if all(r.error is None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

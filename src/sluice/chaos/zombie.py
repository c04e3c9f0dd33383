"""Incident D as a drill: a sync task runs twice at once after its worker was paused past its
session, and the zombie tries to write stale state.

Real pieces throughout: a private MariaDB with a row binlog, the drill's 3-broker cluster, two
`sluice worker start` processes in one group, and a SQLite target. The pauses are real SIGSTOPs;
to land each one at the instant that matters, the paused worker stops itself at an armed pause
point (`sluice.test_switches.pause_point`, armed for that worker alone with
`test_switches.armed`), exactly as a GC pause would stop it there, and the drill sends SIGCONT
later.

Phase 1 (the zombie's capture): worker 1 has read update S2 from the binlog and is about to
produce it when it stops. Its session expires, worker 2 takes the task under a newer epoch,
captures S2 and then S3, and applies them. Worker 1 resumes and produces the S2 it was holding:
stale changes written to the log after newer ones. Only the version guard keeps them from
overwriting S3 in the target (S3 was overwritten by S2 in the incident).

Phase 2 (the zombie's apply): worker 2, now running the task, has read S4 from the log and is
about to commit it to the target when it stops. Worker 1 takes the task, applies S4 and S5.
Worker 2 resumes in the middle of its write: only the target's fence refuses its commit.

Verdict: the duplicate execution was detected both times, the stale commit was refused, the
stale captured changes overwrote nothing, and the target equals the source after each phase.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from sluice import test_switches
from sluice.chaos.harness import CHROOT, DrillCluster
from sluice.chaos.results import Check, IncidentResult
from sluice.clients import close_within
from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.envelope import key_text
from sluice.sync.targets import open_target
from sluice.sync.tasks import TaskStore, parse_spec
from sluice.sync.truth import Truth, compare

TASK = "zombie"
GROUP = "zombie-workers"
ROWS = 40
SESSION_S = 6.0
STEP_TIMEOUT_S = 120.0
#: A worker joins its group once its Spark driver is up (cli/tasks.py warms it first, so a task
#: moved to it starts at once); two drivers starting side by side on a starved machine (two
#: busy loops beside the test suite, load 10) took more than STEP_TIMEOUT_S.
WORKERS_START_TIMEOUT_S = 300.0


class DrillStepError(RuntimeError):
    """A step of the drill did not happen in time; the verdict reports which."""


def _wait(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except Exception as exc:  # a broker or the target is busy failing over: try again
            last = exc
        time.sleep(0.1)
    raise DrillStepError(f"{what}: not within {timeout_s:.0f} s" + (f" (last error: {last})" if last else ""))


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class _Worker:
    """One `sluice worker start` process, armed with the drill's switches and a pause-point
    directory of its own."""

    def __init__(
        self,
        name: str,
        directory: Path,
        bootstrap: str,
        zookeeper: str,
        switches: test_switches.Switches,
        config: Path | None = None,
    ) -> None:
        """``config``: a worker.properties with the cluster's credentials (security on)."""
        self.name = name
        self.pause_dir = directory / f"{name}-pause"
        self.pause_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = directory / f"{name}.log"
        self._armed = ExitStack()
        env = self._armed.enter_context(test_switches.armed(replace(switches, pause_dir=str(self.pause_dir))))
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "worker", "start", "--group", GROUP,
                 *(["--config", str(config)] if config is not None else []),
                 "--name", name, "--session-timeout", str(SESSION_S), "-b", bootstrap,
                 "--zookeeper", zookeeper, "--dir", str(directory / "workers")],
                stdout=out, stderr=out, env={**os.environ, **env},
            )  # fmt: skip

    def arm(self, point: str) -> None:
        assert point in test_switches.PAUSE_POINTS, point
        (self.pause_dir / point).touch()

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def signal_stop(self) -> None:
        """Ask it to stop (resuming it first if paused); `stop` waits for it."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop it and wait (kill -9 after a minute)."""
        self.signal_stop()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._armed.close()


#: `--target`: where the drill's task applies (sqlite; mysql: a database on the drill's MariaDB;
#: delta: Delta tables under the drill's directory, read here with a Spark of the drill's own)
TARGETS = ("sqlite", "mysql", "delta")
MYSQL_TARGET_DB = "zombie_target"


class _Drill:
    def __init__(self, dc: DrillCluster, db: LocalMariaDB, root: Path, target: str = "sqlite") -> None:
        assert dc.store is not None and dc.zk is not None
        self.dc = dc
        self.db = db
        self.root = root
        self.store = TaskStore(dc.store.client)
        self.zookeeper = f"{dc.zk.connect_string}{CHROOT}"
        self.target = target
        if target == "mysql":
            self.target_url = f"mysql://root@127.0.0.1:{db.port}/{MYSQL_TARGET_DB}"
        elif target == "delta":
            self.target_url = f"delta://{root / 'lake'}"
        else:
            self.target_url = f"sqlite:///{root / 'target.db'}"
        self.topic = f"{TASK}.changes"
        self.workers: dict[str, _Worker] = {}
        self.result = IncidentResult("zombie-task")
        self.worker_config = self._secure_workers()
        self.client = dc.client_security.confluent_config()

    def _secure_workers(self) -> Path | None:
        """Security on: the workers run as the cluster's worker user, whose ACLs this drill's
        worker group gets too, with its ZooKeeper credential; their owner-only configuration."""
        cluster = self.dc.cluster
        assert cluster is not None and self.dc.store is not None
        if cluster.security == "none":
            return None
        from sluice.ops import launcher
        from sluice.security.acl import worker_acls
        from sluice.security.acl_store import AclStore

        AclStore(self.dc.store).add(worker_acls(f"User:{launcher.WORKER_USER}", worker_group=GROUP))
        path = cluster.worker_security().write(self.root / "worker-security.properties")
        with path.open("a") as f:
            f.writelines(f"{line}\n" for line in launcher.zookeeper_auth_lines(cluster))
        return path

    # -- the source --------------------------------------------------------------------------------
    def create_source(self) -> None:
        self.db.execute(f"DROP DATABASE IF EXISTS {TASK}", f"CREATE DATABASE {TASK}")
        self.db.execute(
            "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL, state VARCHAR(8) NOT NULL)",
            "INSERT INTO accounts VALUES " + ", ".join(f"({i}, 100, 'S0')" for i in range(1, ROWS + 1)),
            database=TASK,
        )

    def write(self, state: str) -> None:
        """One source transaction: every row moves to `state`."""
        self.db.execute(f"UPDATE accounts SET state = '{state}', balance = balance + 1", database=TASK)
        self.dc.note(f"source: every row set to {state}")

    def source_rows(self) -> dict[str, dict[str, Any]]:
        rows = self.db.execute("SELECT id, balance, state FROM accounts", database=TASK)
        return {key_text({"id": r[0]}): {"id": r[0], "balance": r[1], "state": r[2]} for r in rows}

    # -- the target --------------------------------------------------------------------------------
    def create_target(self) -> None:
        import sqlite3

        if self.target == "delta":  # the worker makes its tables; offsets_went_backwards reads them
            from sluice.pipeline.session import spark_session

            spark_session("local[1]", app="zombie-drill")
            return
        if self.target == "mysql":
            self.db.execute(
                f"DROP DATABASE IF EXISTS {MYSQL_TARGET_DB}", f"CREATE DATABASE {MYSQL_TARGET_DB}"
            )
            open_target(self.target_url).close()  # the _sluice_* tables
            self.db.execute(
                "CREATE TABLE audit_offsets_backwards (topic VARCHAR(255), `partition` INT, old BIGINT, "
                "new BIGINT)",
                "CREATE TRIGGER audit_offsets BEFORE UPDATE ON _sluice_offsets FOR EACH ROW BEGIN "
                "IF NEW.next_offset < OLD.next_offset THEN INSERT INTO audit_offsets_backwards VALUES "
                "(OLD.topic, OLD.`partition`, OLD.next_offset, NEW.next_offset); END IF; END",
                database=MYSQL_TARGET_DB,
            )
            return
        open_target(self.target_url).close()  # the _sluice_* tables
        conn = sqlite3.connect(self.target_url[len("sqlite:///") :])
        conn.executescript(
            "CREATE TABLE audit_offsets_backwards (topic TEXT, partition INTEGER, old INTEGER, new INTEGER);"
            "CREATE TRIGGER audit_offsets BEFORE UPDATE ON _sluice_offsets "
            "WHEN NEW.next_offset < OLD.next_offset BEGIN "
            "INSERT INTO audit_offsets_backwards VALUES (OLD.topic, OLD.partition, OLD.next_offset, "
            "NEW.next_offset); END;"
        )
        conn.close()

    def target_equals_source(self) -> tuple[bool, str]:
        with open_target(self.target_url) as t:
            got = {"accounts": t.read_rows("accounts")}
        cmp = compare(Truth(tables={"accounts": self.source_rows()}, key_columns={"accounts": ["id"]}), got)
        totals = cmp.totals()
        self.result.target_rows_wrong = (totals["missing"], totals["extra"], totals["different"])
        return cmp.ok, cmp.summary()

    def offsets_went_backwards(self) -> list[tuple[Any, ...]]:
        import sqlite3

        if self.target == "mysql":
            return self.db.execute("SELECT * FROM audit_offsets_backwards", database=MYSQL_TARGET_DB)
        if self.target == "delta":  # its offsets are appended: every row in commit order
            from sluice.sync.targets.delta import DeltaTarget

            with open_target(self.target_url) as t:
                assert isinstance(t, DeltaTarget)
                return appended_out_of_order(t.offsets_log(TASK))

        conn = sqlite3.connect(self.target_url[len("sqlite:///") :])
        try:
            return list(conn.execute("SELECT * FROM audit_offsets_backwards"))
        finally:
            conn.close()

    def caught_up(self) -> bool:
        """The target has applied everything in the log."""
        from confluent_kafka import Consumer, TopicPartition

        with open_target(self.target_url) as t:
            applied = t.applied_offsets(TASK)
        consumer = Consumer(
            {
                "bootstrap.servers": self.dc.bootstrap,
                "group.id": "zombie-drill",
                "log_level": 0,
                **self.client,
            }
        )
        try:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            for p in meta.partitions:
                high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                if high > applied.get((self.topic, p), 0):
                    return False
            return True
        finally:
            close_within(consumer)

    def stale_log_writes(self) -> list[str]:
        """Records written to a partition by an older epoch after a newer epoch had written there:
        what a zombie capture put into the log."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.dc.bootstrap, "group.id": "zombie-drill",
                             "enable.auto.commit": False, "log_level": 0, **self.client})  # fmt: skip
        stale: list[str] = []
        try:
            meta = consumer.list_topics(self.topic, timeout=10).topics[self.topic]
            for p in sorted(meta.partitions):
                high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                consumer.assign([TopicPartition(self.topic, p, 0)])
                newest_epoch, offset = 0, -1
                while offset < high - 1:
                    msg = consumer.poll(10)
                    if msg is None:
                        raise DrillStepError(f"cannot read {self.topic}[{p}] to {high}")
                    if msg.error() is not None:
                        continue
                    offset = int(msg.offset() or 0)
                    source = orjson.loads(msg.value() or b"{}").get("source", {})
                    epoch = int(source.get("epoch", 0))
                    if epoch < newest_epoch:
                        stale.append(f"{self.topic}[{p}]@{offset}: epoch {epoch} after epoch {newest_epoch}")
                    newest_epoch = max(newest_epoch, epoch)
            return stale
        finally:
            close_within(consumer)

    # -- the task and its workers ------------------------------------------------------------------
    def create_task(self) -> None:
        spec = parse_spec({
            "id": TASK,
            "source": {"kind": "mariadb", "host": "127.0.0.1", "port": self.db.port, "user": "root",
                       "database": TASK},
            "tables": ["accounts"], "topic": self.topic, "target": self.target_url,
            "options": {"trigger": "500ms", "partitions": 3},
        })  # fmt: skip
        self.store.create(spec)

    def start_worker(self, name: str) -> _Worker:
        worker = _Worker(
            name, self.root, self.dc.bootstrap, self.zookeeper, self.dc.switches, self.worker_config
        )
        self.workers[name] = worker
        self.dc.note(f"worker {name} started (pid {worker.proc.pid})")
        return worker

    def running_on(self, name: str, newer_than: int = 0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            status = self.store.status(TASK) or {}
            if status.get("worker") == name and int(status.get("epoch", 0)) > newer_than:
                return status
            return None

        status: dict[str, Any] = _wait(ready, STEP_TIMEOUT_S, f"the task to run on {name}")
        return status

    def group_has(self, names: set[str]) -> None:
        from sluice.service.group_view import describe_group

        def members() -> bool:
            view = describe_group(self.dc.bootstrap, GROUP, self.dc.client_security)
            return view.state == "Stable" and {m.client_id for m in view.members} == names

        _wait(members, WORKERS_START_TIMEOUT_S, f"workers {', '.join(sorted(names))} to form the group")

    def pause_at(self, worker: _Worker, point: str, then: Callable[[], None]) -> None:
        worker.arm(point)
        then()
        _wait(lambda: _stopped(worker.proc.pid), STEP_TIMEOUT_S, f"{worker.name} to pause at {point}")
        self.dc.note(f"{worker.name} paused (SIGSTOP) at {point}")

    def wait_target_equal(self, what: str) -> None:
        _wait(lambda: self.target_equals_source()[0], STEP_TIMEOUT_S, what)

    def alarms(self, kind: str, execution: str) -> list[dict[str, Any]]:
        out = []
        for alarm in self.store.alarms(TASK):
            if alarm.get("kind") != kind:
                continue
            if execution in (alarm.get("executions") or []) or alarm.get("execution") == execution:
                out.append(alarm)
        return out

    # -- the phases --------------------------------------------------------------------------------
    def phase(self, n: int, zombie: _Worker, heir: _Worker, point: str, states: tuple[str, str]) -> None:
        stale_state, new_state = states
        check = self.result.checks.append
        before = self.running_on(zombie.name)
        self.pause_at(zombie, point, lambda: self.write(stale_state))
        after = self.running_on(heir.name, newer_than=int(before["epoch"]))
        self.dc.note(
            f"the task moved to {heir.name}: execution {after['execution']} epoch {after['epoch']} "
            f"(the paused one: {before['execution']} epoch {before['epoch']})"
        )
        self.write(new_state)
        self.wait_target_equal(f"phase {n}: the target to reach {new_state} from {heir.name}")
        zombie.resume()
        self.dc.note(f"{zombie.name} resumed (SIGCONT): two executions of the task at once")
        zombie_id, heir_id = str(before["execution"]), str(after["execution"])

        found = _wait_for_value(
            lambda: [a for a in self.alarms("duplicate-execution", zombie_id) if heir_id in a["executions"]],
            60,
        )
        check(Check(
            f"phase {n}: the duplicate execution was detected",
            bool(found),
            "; ".join(f"{a['executions']} on {a['workers']}, epochs {a['epochs']}, found by the "
                      f"{a.get('found_by')}" for a in found[:2]) or "no duplicate-execution alarm names both",
        ))  # fmt: skip
        if point == "apply-commit":
            # The zombie's commit is the first thing it does on waking (the duplicate execution
            # was found after that): a refusal is on record by now or within moments.
            refused = _wait_for_value(lambda: self.alarms("stale-commit-refused", zombie_id), 10)
            check(Check(
                f"phase {n}: the zombie's stale commit was refused by the target",
                bool(refused),
                "; ".join(f"epoch {a['epoch']} refused, the target holds epoch {a['target_epoch']}"
                          for a in refused[:1]) or f"{zombie.name}'s commit of {stale_state} was not refused",
            ))  # fmt: skip
        else:
            stale = _wait_for_value(self.stale_log_writes, 60)
            check(Check(
                f"phase {n}: the zombie's capture wrote stale changes into the log (the fault happened)",
                bool(stale),
                f"{len(stale)} records, e.g. {stale[0]}" if stale else "none: the fault was not injected",
            ))  # fmt: skip
        _wait(self.caught_up, STEP_TIMEOUT_S, f"phase {n}: the target to apply everything in the log")
        ok, summary = self.target_equals_source()
        check(Check(
            f"phase {n}: the target equals the source ({new_state}) after the zombie's writes",
            ok, summary.replace("\n", "; "),
        ))  # fmt: skip

    def run(self) -> IncidentResult:
        self.create_source()
        self.create_target()
        self.create_task()
        # Both start at once (each spends seconds starting Spark); whichever the group gives the
        # task to is the one paused first.
        workers = [self.start_worker("w1"), self.start_worker("w2")]
        self.group_has({"w1", "w2"})
        owner = str(_wait(lambda: (self.store.status(TASK) or {}).get("worker"), STEP_TIMEOUT_S, "an owner"))
        self.write("S1")
        self.wait_target_equal("the target to reach S1 (snapshot, then binlog)")
        first, second = sorted(workers, key=lambda w: w.name != owner)
        self.phase(1, first, second, "capture-produce", ("S2", "S3"))
        self.group_has({"w1", "w2"})
        self.phase(2, second, first, "apply-commit", ("S4", "S5"))
        backwards = self.offsets_went_backwards()
        self.result.checks.append(
            Check("the applied offsets never went backwards", not backwards, f"{len(backwards)} went back")
        )
        return self.result


Appended = tuple[int, str, int, int, int]  # version, topic, partition, next_offset, epoch


def appended_out_of_order(appended: list[Appended]) -> list[Appended]:
    """Of offsets appended in commit order, (version, topic, partition, next_offset, epoch), the
    rows an earlier commit had gone past: an older epoch than one committed before, or a lower
    offset than the partition's before (what a zombie's commit would leave)."""
    back = []
    highest: dict[tuple[str, int], int] = {}
    newest_epoch, before = 0, 0  # the newest epoch of all rows so far, of the earlier commits'
    last_version = -1
    for row in appended:
        version, topic, partition, next_offset, epoch = row
        if version != last_version:
            before, last_version = newest_epoch, version
        if epoch < before or next_offset < highest.get((topic, partition), -1):
            back.append(row)
        newest_epoch = max(newest_epoch, epoch)
        highest[(topic, partition)] = max(next_offset, highest.get((topic, partition), -1))
    return back


def _wait_for_value(produce: Callable[[], list[Any]], timeout_s: float) -> list[Any]:
    """`produce()` once it is non-empty, or its last (empty) value at the deadline."""
    deadline = time.monotonic() + timeout_s
    value: list[Any] = []
    while time.monotonic() < deadline:
        try:
            value = produce()
        except DrillStepError:
            value = []
        if value:
            return value
        time.sleep(0.2)
    return value


def zombie_task(dc: DrillCluster, rng: random.Random, target: str = "sqlite") -> IncidentResult:
    root = dc.directory / "zombie"
    root.mkdir(parents=True, exist_ok=True)
    db = LocalMariaDB(root / "mariadb").start()
    drill = _Drill(dc, db, root, target)
    if target != "sqlite":
        drill.result.name = f"zombie-task target={target}"
    try:
        return drill.run()
    except DrillStepError as exc:
        drill.result.checks.append(Check("the drill ran to its end", False, str(exc)))
        return drill.result
    finally:
        for worker in drill.workers.values():
            worker.signal_stop()
        for worker in drill.workers.values():
            worker.stop()
        db.remove()
        drill.result.timeline = dc.events

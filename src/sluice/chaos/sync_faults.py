"""Faults for `sluice chaos sync`: a seeded schedule, and the processes and servers it hits.

Fault kinds (`SYNC_FAULT_KINDS`):

    worker-kill         kill -9 of a worker's process group, restarted after the fault's
                        duration. The Spark driver lives inside the worker (PySpark's JVM and
                        its Python workers are in the same process group), so this is also the
                        kill -9 of the driver in the middle of a micro-batch.
    worker-pause        SIGSTOP of a worker's process group for longer than its group session
                        (how a long GC pause looks), then SIGCONT: its tasks move and it wakes
                        up as a zombie.
    driver-kill         kill -9 of a worker's Spark driver JVM alone, in the middle of its
                        micro-batches: the worker lives on, its tasks' apply queries fail, and
                        their retries run on a new JVM (pipeline.session.DriverSession).
    driver-pause        SIGSTOP of a worker's Spark driver JVM alone, past the worker's group
                        session (a long GC pause of the driver): the worker keeps heartbeating,
                        so its tasks stay where they are and go on after SIGCONT.
    broker-kill         kill -9 of one broker (leader of a task topic's partition, controller,
                        coordinator of the workers' group, or any), restarted afterwards.
    broker-pause        SIGSTOP/SIGCONT of one broker.
    target-pg-down      the PostgreSQL target refuses connections: the task reaches it through
                        a TCP proxy that drops every connection and refuses new ones.
    target-sqlite-lock  another process holds an exclusive lock on the SQLite target's file.
    source-walsender-kill  kill -9 of a PostgreSQL source's walsender (`--source postgresql`):
                        the server ends every session and recovers from its WAL.

Broker faults come one at a time and the cluster is let to heal after each, so two of three
replicas stay in sync (min.insync.replicas=2). The schedule depends only on the seed, the
duration and the fault kinds (`make_sync_schedule`); which worker or broker a role names is
decided when the fault is due, from the same seed.
"""

from __future__ import annotations

import logging
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluice.chaos.harness import DrillCluster
from sluice.chaos.tcp_proxy import TcpProxy

log = logging.getLogger("sluice.chaos.sync")

SYNC_FAULT_KINDS = (
    "worker-kill", "worker-pause", "driver-kill", "driver-pause", "broker-kill", "broker-pause",
    "target-pg-down", "target-sqlite-lock",
)  # fmt: skip
#: faults of a source's own, for the runs of that source (`--source postgresql`)
SOURCE_FAULT_KINDS = ("source-walsender-kill",)
WORKER_ROLES = ("pg-task-owner", "sqlite-task-owner", "any")
BROKER_ROLES = ("leader", "controller", "coordinator", "any")

#: Workers' group session; a pause must outlast it for the tasks to move.
WORKER_SESSION_S = 6.0


@dataclass(frozen=True, slots=True)
class SyncFault:
    at_s: float  # seconds after the workload starts
    kind: str
    role: str  # who it hits (a worker or broker role); "target" for the target faults
    duration_s: float

    def describe(self) -> str:
        return f"{self.at_s:5.1f}s {self.kind} ({self.role}) for {self.duration_s:.1f}s"


def make_sync_schedule(seed: int, duration_s: float, kinds: tuple[str, ...]) -> list[SyncFault]:
    """Faults one after another, each healed before the next; a function of its arguments only.
    Kinds are dealt from a shuffled deck: every kind comes once before any comes again, so even a
    short run meets as many different faults as it has room for."""
    for kind in kinds:
        if kind not in SYNC_FAULT_KINDS + SOURCE_FAULT_KINDS:
            raise ValueError(
                f"unknown fault {kind!r}; choose from {', '.join(SYNC_FAULT_KINDS + SOURCE_FAULT_KINDS)}"
            )
    if not kinds:
        return []
    rng = random.Random(f"sync-faults/{seed}")
    out: list[SyncFault] = []
    t = 3.0
    deck: list[str] = []
    while t < duration_s - 3.0 and len(out) < 1000:
        if not deck:
            deck = list(dict.fromkeys(kinds))
            rng.shuffle(deck)
        kind = deck.pop()
        if kind.startswith(("worker", "driver")):
            role = rng.choice(WORKER_ROLES)
        elif kind.startswith("broker"):
            role = rng.choice(BROKER_ROLES)
        else:
            role = "source" if kind.startswith("source") else "target"
        if kind in ("worker-pause", "driver-pause"):
            length = WORKER_SESSION_S + rng.uniform(2.0, 6.0)
        elif kind == "worker-kill":
            length = rng.uniform(3.0, 10.0)
        else:
            length = rng.uniform(2.0, 8.0)
        out.append(SyncFault(round(t, 1), kind, role, round(length, 1)))
        t += length + rng.uniform(3.0, 6.0)
    return out


# --- the processes ------------------------------------------------------------------------------


class WorkerProcess:
    """One `sluice worker start` process in a process group of its own (with its Spark JVM)."""

    def __init__(self, name: str, directory: Path, argv: list[str]) -> None:
        self.name = name
        self.directory = directory
        self.argv = argv
        self.log_path = directory / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.killed = False  # by a fault, on purpose

    def start(self) -> WorkerProcess:
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sluice.cli", "worker", "start", "--name", self.name, *self.argv],
                stdout=out, stderr=out, start_new_session=True, env={**os.environ, "COLUMNS": "200"},
            )  # fmt: skip
        self.paused = False
        self.killed = False
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def driver_pid(self) -> int | None:
        """The worker's Spark driver JVM, if it runs one now."""
        return spark_driver_pid(self.proc.pid) if self.running and self.proc is not None else None

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=30)
        self.paused = False
        self.killed = True

    def pause(self) -> None:
        self._signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (after SIGCONT), then kill -9 of the whole group after `timeout_s`; anything
        left in the group (a JVM that outlived its driver) goes too."""
        if self.proc is None:
            return
        self.resume()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("event=worker_not_reaped worker=%s pid=%d", self.name, self.proc.pid)

    def log_tail(self, lines: int = 400) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return []


class SqliteLockHolder:
    """Another process holding an exclusive lock on a SQLite file until `release`."""

    SCRIPT = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n"
        "c.execute('ROLLBACK')\n"
    )

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None

    def acquire(self, timeout_s: float = 60.0) -> bool:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", self.SCRIPT, str(self.path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        return bool(ready) and self.proc.stdout.readline().strip() == b"locked"

    def release(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# --- injecting ----------------------------------------------------------------------------------


@dataclass
class Injected:
    at_s: float
    what: str


@dataclass
class SyncFaultInjector:
    """Carries out a schedule against the run's pieces; `heal_all` undoes whatever is still on."""

    dc: DrillCluster
    workers: dict[str, WorkerProcess]
    pg_proxy: TcpProxy
    sqlite_path: Path
    task_owner: Callable[[str], str | None]  # task id -> the worker running it now
    pg_task: str
    sqlite_task: str
    topics: list[str]
    worker_group: str
    seed: int
    injected: list[Injected] = field(default_factory=list)
    skipped: list[Injected] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: SqliteLockHolder | None = None
    _paused_driver: int | None = None
    _t0: float = 0.0
    _thread: threading.Thread | None = None
    _rng: random.Random = field(default_factory=random.Random)
    error: str | None = None
    #: workers found dead that no fault had killed (a worker process that exited by itself)
    exited: list[str] = field(default_factory=list)
    #: the source's own faults (`source-*`): carries one out, says what it did (None: skipped)
    source_fault: Callable[[SyncFault], str | None] | None = None

    def start(self, schedule: list[SyncFault]) -> SyncFaultInjector:
        self._t0 = time.monotonic()
        self._rng = random.Random(f"sync-targets/{self.seed}")
        self._thread = threading.Thread(target=self._run, args=(schedule,), name="sync-faults", daemon=True)
        self._thread.start()
        return self

    def finish(self, timeout_s: float = 120.0) -> None:
        """Stop injecting (a fault in progress is healed at once) and heal everything."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.heal_all()

    def _note(self, what: str) -> None:
        at = time.monotonic() - self._t0
        self.injected.append(Injected(round(at, 1), what))
        log.info("event=sync_fault t=%.1f what=%r", at, what)

    def _run(self, schedule: list[SyncFault]) -> None:
        try:
            for fault in schedule:
                if self.stop.wait(max(0.0, self._t0 + fault.at_s - time.monotonic())):
                    return
                self._apply(fault)
        except Exception as exc:  # reported in the verdict: an injection that went wrong
            self.error = f"fault injection failed: {exc!r}"
            log.exception("event=sync_fault_failed")

    def _hold(self, seconds: float) -> None:
        self.stop.wait(seconds)

    def _apply(self, fault: SyncFault) -> None:
        if fault.kind.startswith("worker"):
            name = self._worker(fault.role)
            if name is None:
                self.skipped.append(Injected(fault.at_s, f"{fault.kind}: no worker is {fault.role} now"))
                return
            w = self.workers[name]
            tasks = [t for t in (self.pg_task, self.sqlite_task) if self.task_owner(t) == name]
            runs = f"running {', '.join(tasks)}" if tasks else "running no task"
            if fault.kind == "worker-kill":
                w.kill()
                self._note(f"kill -9 worker {name} ({runs}; its Spark driver with it)")
                self._hold(fault.duration_s)
                w.start()
                self._note(f"restarted worker {name}")
            else:
                w.pause()
                self._note(f"SIGSTOP worker {name} ({runs}) for {fault.duration_s:.1f}s, past its session")
                self._hold(fault.duration_s)
                w.resume()
                self._note(f"SIGCONT worker {name}")
        elif fault.kind.startswith("driver"):
            name = self._worker(fault.role)
            pid = None if name is None else self.workers[name].driver_pid()
            if name is None or pid is None:
                self.skipped.append(
                    Injected(fault.at_s, f"{fault.kind}: no Spark driver of a {fault.role} now")
                )
                return
            tasks = [t for t in (self.pg_task, self.sqlite_task) if self.task_owner(t) == name]
            runs = f"running {', '.join(tasks)}" if tasks else "running no task"
            if fault.kind == "driver-kill":
                _signal_pid(pid, signal.SIGKILL)
                self._note(
                    f"kill -9 the Spark driver JVM (pid {pid}) of worker {name} ({runs}); the worker lives on"
                )
            else:
                _signal_pid(pid, signal.SIGSTOP)
                self._paused_driver = pid
                self._note(f"SIGSTOP the Spark driver JVM (pid {pid}) of worker {name} ({runs}) for "
                           f"{fault.duration_s:.1f}s, past the worker's session")  # fmt: skip
                self._hold(fault.duration_s)
                _signal_pid(pid, signal.SIGCONT)
                self._paused_driver = None
                self._note(f"SIGCONT the Spark driver JVM of worker {name}")
        elif fault.kind.startswith("broker"):
            broker = self._broker(fault.role)
            if broker < 0:
                self.skipped.append(Injected(fault.at_s, f"{fault.kind}: no {fault.role} broker now"))
                return
            if fault.kind == "broker-kill":
                self.dc.kill(broker)
                self._note(f"kill -9 broker {broker} ({fault.role})")
                self._hold(fault.duration_s)
                self.dc.restart(broker)
                self._note(f"restarted broker {broker}")
            else:
                self.dc.pause(broker)
                self._note(f"SIGSTOP broker {broker} ({fault.role}) for {fault.duration_s:.1f}s")
                self._hold(fault.duration_s)
                self.dc.resume(broker)
                self._note(f"SIGCONT broker {broker}")
            # Let it rejoin the ISR before the next fault: two of three replicas must stay in sync.
            self.dc.wait_quiescent(60)
        elif fault.kind.startswith("source"):
            done = self.source_fault(fault) if self.source_fault is not None else None
            if done is None:
                what = "no such source in this run" if self.source_fault is None else "nothing to hit now"
                self.skipped.append(Injected(fault.at_s, f"{fault.kind}: {what}"))
                return
            self._note(done)
            self._hold(fault.duration_s)
        elif fault.kind == "target-pg-down":
            self.pg_proxy.set_mode("drop")
            self._note(f"PostgreSQL target refuses connections for {fault.duration_s:.1f}s")
            self._hold(fault.duration_s)
            self.pg_proxy.set_mode("pass")
            self._note("PostgreSQL target accepts connections again")
        elif fault.kind == "target-sqlite-lock":
            self._lock = SqliteLockHolder(self.sqlite_path)
            if not self._lock.acquire():
                self._lock.release()
                self._lock = None
                self.skipped.append(
                    Injected(fault.at_s, "target-sqlite-lock: the lock was not granted in 60 s")
                )
                return
            self._note(
                f"another process holds an exclusive lock on the SQLite target for {fault.duration_s:.1f}s"
            )
            self._hold(fault.duration_s)
            self._lock.release()
            self._lock = None
            self._note("SQLite target lock released")

    def _worker(self, role: str) -> str | None:
        if role == "pg-task-owner":
            return self.task_owner(self.pg_task)
        if role == "sqlite-task-owner":
            return self.task_owner(self.sqlite_task)
        running = sorted(n for n, w in self.workers.items() if w.running and not w.paused)
        return self._rng.choice(running) if running else None

    def _broker(self, role: str) -> int:
        if role == "leader":
            topic = self._rng.choice(sorted(self.topics))
            return self.dc.leader_of(topic, self._rng.randrange(3))
        if role == "controller":
            return self.dc.controller()
        if role == "coordinator":
            return self.dc.coordinator_of(self.worker_group)
        return self.dc.random_broker(self._rng)

    def heal_all(self) -> None:
        """Every worker running and awake, every broker up, both targets reachable."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self.pg_proxy.mode != "pass":
            self.pg_proxy.set_mode("pass")
        if self._paused_driver is not None:
            _signal_pid(self._paused_driver, signal.SIGCONT)
            self._paused_driver = None
        for name, w in sorted(self.workers.items()):
            if w.paused:
                w.resume()
            if not w.running:
                if not w.killed and w.proc is not None:
                    self.exited.append(f"worker {name} exited by itself (exit code {w.proc.returncode})")
                    self._note(
                        f"worker {name} had exited by itself (exit code {w.proc.returncode}); restarted"
                    )
                w.start()
        self.dc.heal_all()


def spark_driver_pid(parent_pid: int) -> int | None:
    """The Spark driver JVM a process started: its child process running java (PySpark starts
    the JVM as a direct child of the Python driver)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces, so split after its closing paren
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent_pid and comm == "java":
            return int(entry.name)
    return None


def _signal_pid(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

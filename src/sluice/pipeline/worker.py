"""Workers: a group of processes that share the sync tasks and take over from each other.

Membership uses the brokers' group protocol with a protocol type of its own, `sluice-worker`
(as Kafka Connect's workers use `connect`): JoinGroup, SyncGroup, Heartbeat, LeaveGroup. The
leader assigns the tasks in ZooKeeper with `assignment.assign` (balanced and sticky); each
member's JoinGroup metadata says which tasks it runs now. A member that dies or stays paused
past its session is dropped by the coordinator, and the next generation gives its tasks to the
others. A change to the set of tasks makes the leader rejoin, which starts a new generation.

Each started task is a `TaskExecution` (pipeline.execution) under a new fencing epoch. A task that
fails to start, or whose execution fails later (its target refuses connections, its source is
down, its topic cannot be created during a failover, its Spark query ended), is stopped,
reported through `on_failure` (an alarm, in production, with the attempt and the delay) and
started again after a backoff (sync.backoff) that doubles with each failure in a row, up to
`RETRY_MAX_S`; the count starts again only once an execution of the task commits a batch, or
an operator changes the task (`sluice task update`, `restart`, `resume`: a failed task waiting
for its retry is then started at once). The worker and its other tasks go on. A task
superseded by a newer execution elsewhere is not retried here: the worker rejoins, and the
group decides who runs it.

A stop (SIGTERM, `cluster down`) ends within :func:`stop_bound_s` whatever ZooKeeper does. kazoo
holds a call made while it reconnects until the connection is back, and retries the connection
forever: without ZooKeeper, the worker's loop waited for good in a task's status check and never
saw the stop (issue 32). At stop, the worker's session is closed once ZooKeeper is unreachable
(`ZkStore.close_when_unreachable`), which ends the call in progress and fails the later ones at
once; a loop still in a call after LOOP_EXIT_SESSIONS session timeouts (whatever it waits on) is
left there, on its own thread. The tasks then stop all at once, their apply queries and captures
on a deadline, and leave their status and history to the session when ZooKeeper does not answer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from sluice.bounded import in_background, run_within
from sluice.cluster.zkstore import SESSION_TIMEOUT_S, ZOOKEEPER_CLOSE_MIN_S, ZOOKEEPER_UNREACHABLE, ZkStore
from sluice.pipeline.execution import SUPERSEDED
from sluice.protocol.api import ApiKey
from sluice.protocol.errors import ErrorCode
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.sync.assignment import assign
from sluice.sync.backoff import Backoff
from sluice.sync.wire_client import WireClient, WireError

log = logging.getLogger("sluice.worker")

PROTOCOL_TYPE = "sluice-worker"
PROTOCOL = "sticky-balanced"
JOIN_V, SYNC_V, HEARTBEAT_V, LEAVE_V, FIND_V = 9, 5, 4, 5, 4
RETRIABLE = {
    ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    ErrorCode.NOT_COORDINATOR,
    ErrorCode.REBALANCE_IN_PROGRESS,
}

#: A stop's shares of time (:func:`stop_bound_s`). The loop gets this many ZooKeeper session
#: timeouts to see the stop and leave the call it is in (kazoo notices a server gone silent
#: within 2/3 of the session timeout, and the session's close, `ZkStore.close_when_unreachable`,
#: then waits out a connection attempt in progress, one session timeout at most; with ZooKeeper
#: refusing connections, at once); a loop still in its call then is left there on its thread.
LOOP_EXIT_SESSIONS = 2.0
#: Every running task stops at once, within
#: TASKS_STOP_S: its apply query and capture thread (execution.HALT_S, on one deadline), then its
#: status reads' close and its status and history in ZooKeeper (bounded calls, made only while
#: ZooKeeper answers); a task still stopping then is left to its thread.
TASKS_STOP_S = 15.0
#: LeaveGroup (the group then moves the tasks at once, not after this worker's session) and the
#: heartbeat thread's end.
LEAVE_GROUP_S = 5.0
#: The Spark driver's stop (`DriverSession.stop`, by the CLI once the worker's run has ended).
SPARK_STOP_S = 10.0


def stop_bound_s(zk_session_timeout_s: float = SESSION_TIMEOUT_S) -> float:
    """The longest a worker's stop takes, from SIGTERM to exit, whatever ZooKeeper does:

    - LOOP_EXIT_SESSIONS session timeouts for the loop to leave the call it is in (a ZooKeeper
      call, a task's start); past them the stop goes on without it;
    - TASKS_STOP_S, LEAVE_GROUP_S and SPARK_STOP_S;
    - ZOOKEEPER_CLOSE_MIN_S for the session's close (ZooKeeper expires one left closing).

    Each share is a deadline the stop keeps (what has not ended by then is left on a daemon
    thread), so the sum holds whatever the calls wait on. 43 s with the worker's 6 s ZooKeeper
    session. `cluster down` SIGKILLs a worker only past it."""
    return (
        LOOP_EXIT_SESSIONS * zk_session_timeout_s
        + TASKS_STOP_S
        + LEAVE_GROUP_S
        + SPARK_STOP_S
        + ZOOKEEPER_CLOSE_MIN_S
    )


class Membership:
    """One worker's membership of the group, on its own connection to the coordinator."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        name: str,
        session_timeout_ms: int = 10_000,
        rebalance_timeout_ms: int = 30_000,
        security: ClientSecurity = PLAINTEXT,
    ) -> None:
        self.bootstrap = bootstrap
        #: every connection to the brokers (finding the coordinator, joining, heartbeats) uses it
        self.security = security
        self.group = group
        self.name = name
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.conn: WireClient | None = None
        self.hb_conn: WireClient | None = None  # heartbeats have their own connection

    def _find(self) -> tuple[str, int]:
        deadline = time.monotonic() + 60
        while True:
            try:
                for server in self.bootstrap.split(","):
                    with WireClient.connect(server, timeout_s=10, security=self.security) as w:
                        r = w.request(
                            ApiKey.FIND_COORDINATOR, FIND_V, {"key_type": 0, "coordinator_keys": [self.group]}
                        )
                    (c,) = r["coordinators"]
                    if c["error_code"] == ErrorCode.NONE:
                        return c["host"], int(c["port"])
            except (OSError, WireError):
                pass
            if time.monotonic() > deadline:
                raise ConnectionError(f"no group coordinator for {self.group} on {self.bootstrap}")
            time.sleep(0.5)

    def _coordinator(self) -> WireClient:
        if self.conn is None:
            host, port = self._find()
            timeout = self.rebalance_timeout_ms / 1000 + 10
            self.conn = WireClient(host, port, client_id=self.name, timeout_s=timeout, security=self.security)
        return self.conn

    def reset_connection(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def join(self, metadata: bytes) -> dict[str, Any]:
        """Join (or rejoin) and return the JoinGroup response of the new generation."""
        while True:
            try:
                r = self._coordinator().request(
                    ApiKey.JOIN_GROUP,
                    JOIN_V,
                    {
                        "group_id": self.group, "session_timeout_ms": self.session_timeout_ms,
                        "rebalance_timeout_ms": self.rebalance_timeout_ms, "member_id": self.member_id,
                        "group_instance_id": None, "protocol_type": PROTOCOL_TYPE,
                        "protocols": [{"name": PROTOCOL, "metadata": metadata}], "reason": None,
                    },
                )  # fmt: skip
            except (OSError, WireError):
                self.reset_connection()
                time.sleep(0.5)
                continue
            err = r["error_code"]
            if err == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = r["member_id"]
                continue
            if err == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                continue
            if err in RETRIABLE:
                if err == ErrorCode.NOT_COORDINATOR:
                    self.reset_connection()
                time.sleep(0.2)
                continue
            if err != ErrorCode.NONE:
                raise RuntimeError(f"JoinGroup failed: {ErrorCode(err).name}")
            self.generation = r["generation_id"]
            self.leader = r["leader"]
            return r

    def sync(self, assignments: dict[str, bytes] | None) -> tuple[int, bytes]:
        plan = sorted((assignments or {}).items())
        try:
            r = self._coordinator().request(
                ApiKey.SYNC_GROUP,
                SYNC_V,
                {
                    "group_id": self.group, "generation_id": self.generation, "member_id": self.member_id,
                    "group_instance_id": None, "protocol_type": PROTOCOL_TYPE, "protocol_name": PROTOCOL,
                    "assignments": [{"member_id": m, "assignment": a} for m, a in plan],
                },
            )  # fmt: skip
        except (OSError, WireError):
            self.reset_connection()
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE), b""
        return r["error_code"], r["assignment"] or b""

    def heartbeat(self) -> int:
        """One heartbeat, on the heartbeat connection (a JoinGroup may be blocking the other)."""
        try:
            if self.hb_conn is None:
                host, port = self._find()
                self.hb_conn = WireClient(
                    host, port, client_id=self.name, timeout_s=10, security=self.security
                )
            r = self.hb_conn.request(
                ApiKey.HEARTBEAT,
                HEARTBEAT_V,
                {"group_id": self.group, "generation_id": self.generation, "member_id": self.member_id,
                 "group_instance_id": None},
            )  # fmt: skip
        except (OSError, WireError, ConnectionError):
            if self.hb_conn is not None:
                self.hb_conn.close()
                self.hb_conn = None
            return int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return int(r["error_code"])

    def leave(self, timeout_s: float | None = None) -> None:
        """LeaveGroup, so that the group moves this member's tasks at once (otherwise after its
        session); with ``timeout_s``, waited on that long at most (a coordinator that does not
        answer, or none to find), then the member is left for its session to end."""
        if timeout_s is None:
            self._leave()
        elif not run_within(self._leave, timeout_s, name="leave-group"):
            log.warning(
                "event=leave_group_timed_out group=%s member=%s waited_s=%.0f action=%r", self.group,
                self.member_id, timeout_s, "the coordinator drops this member when its session ends",
            )  # fmt: skip

    def _leave(self) -> None:
        if not self.member_id:
            return
        try:
            self._coordinator().request(
                ApiKey.LEAVE_GROUP,
                LEAVE_V,
                {"group_id": self.group,
                 "members": [{"member_id": self.member_id, "group_instance_id": None, "reason": "stopping"}]},
            )  # fmt: skip
        except (OSError, WireError):
            pass
        self.reset_connection()
        if self.hb_conn is not None:
            self.hb_conn.close()
            self.hb_conn = None


@dataclass
class Retry:
    """A task that failed here: when to start it again, and why it failed."""

    attempts: int  # its failures in a row (sync.backoff)
    at: float  # time.monotonic()
    error: str


@dataclass
class _Streak:
    """A task's failures in a row here, and what an operator had last asked of it when they
    began (`Worker.revision`): once that changes, the count starts again."""

    backoff: Backoff
    revision: object


class Worker:
    """Runs the tasks the group assigns to it until `stop` is set.

    `start_task(task_id)` returns an object with `stop()`, `relinquish()` (stop after losing
    the group session), `alive()`, `tick()`, `error` and, optionally, `batches_committed` (a
    TaskExecution in production; tests may pass their own). `on_failure(task_id, error,
    attempts, retry_in_s)` hears of every failure (the CLI raises an alarm); it must not raise.
    `revision(task_id)`, if given, is what an operator last asked of the task (the CLI: its
    control's restart count and pause); a change starts its failures in a row again.
    `zookeeper`: the session the tasks' ZooKeeper calls use, closed at stop once ZooKeeper is
    unreachable (module docstring)."""

    def __init__(
        self,
        membership: Membership,
        list_tasks: Callable[[], list[str]],
        start_task: Callable[[str], Any],
        *,
        tasks_changed: threading.Event | None = None,
        stop: threading.Event | None = None,
        on_failure: Callable[[str, str, int, float], None] | None = None,
        describe_error: Callable[[str, BaseException | str], str] | None = None,
        revision: Callable[[str], object] | None = None,
        zookeeper: ZkStore | None = None,
    ) -> None:
        self.membership = membership
        self.zookeeper = zookeeper
        self.list_tasks = list_tasks
        self.start_task = start_task
        self.tasks_changed = tasks_changed or threading.Event()
        self.stop = stop or threading.Event()
        self.on_failure = on_failure
        # How an exception or an execution's error is shown (the CLI scrubs the task's passwords).
        self.describe_error = describe_error or _describe
        self.running: dict[str, Any] = {}
        #: tasks waiting to be started again
        self.failed: dict[str, Retry] = {}
        #: each task's failures in a row: kept through starts that succeed, dropped once one of
        #: its executions commits a batch, an operator changes it, or it leaves this worker
        self.streaks: dict[str, _Streak] = {}
        self.revision = revision
        self.assigned: list[str] = []
        self.generations = 0
        self._rejoin_requested = False
        #: when the stop began (time.monotonic()), once it has
        self.stop_began: float | None = None
        self._stop_seen_lock = threading.Lock()

    def _metadata(self) -> bytes:
        return orjson.dumps({"worker": self.membership.name, "tasks": sorted(self.running)})

    def _rebalance(self) -> None:
        m = self.membership
        joined = m.join(self._metadata())
        assignments: dict[str, bytes] | None = None
        if m.leader == m.member_id:
            current = {}
            for member in joined["members"]:
                try:
                    current[member["member_id"]] = orjson.loads(member["metadata"]).get("tasks", [])
                except (orjson.JSONDecodeError, AttributeError):
                    current[member["member_id"]] = []
            plan = assign(self.list_tasks(), current)
            assignments = {mid: orjson.dumps(ts) for mid, ts in plan.items()}
            self.tasks_changed.clear()
        err, data = m.sync(assignments)
        if err != ErrorCode.NONE:
            return  # a new rebalance began; the loop rejoins
        self.assigned = orjson.loads(data) if data else []
        self.generations += 1
        self._apply_assignment()

    def _apply_assignment(self) -> None:
        for task_id in sorted(set(self.running) - set(self.assigned)):
            log.info("task %s moves away: stopping it", task_id)
            self._stop_quietly(task_id, self.running.pop(task_id))
        for task_id in sorted(set(self.failed) - set(self.assigned)):
            del self.failed[task_id]  # someone else's now
        for task_id in sorted(set(self.streaks) - set(self.assigned)):
            del self.streaks[task_id]
        for task_id in self.assigned:
            if task_id not in self.running and task_id not in self.failed:
                log.info("task %s assigned: starting it", task_id)
                self._start(task_id)

    def _start(self, task_id: str) -> None:
        """Start a task; a failure is reported and retried later, never raised."""
        if self.stop.is_set():  # leaving: the group gives the task to another worker
            return
        try:
            self.running[task_id] = self.start_task(task_id)
        except Exception as exc:
            self._failed(task_id, self.describe_error(task_id, exc))
            return
        self.failed.pop(task_id, None)

    def _revision_of(self, task_id: str) -> object:
        """What an operator last asked of the task, or None (not known: ZooKeeper out of reach)."""
        if self.revision is None:
            return None
        try:
            return self.revision(task_id)
        except Exception as exc:
            log.info("event=task_revision_unread task=%s error=%r", task_id, exc)
            return None

    def _changed(self, task_id: str, streak: _Streak) -> bool:
        revision = self._revision_of(task_id)
        return revision is not None and revision != streak.revision

    def _failed(self, task_id: str, error: str) -> None:
        if self.stop.is_set():
            # The stop cut it short (it may have closed the ZooKeeper session under the start):
            # no retry here, and no alarm: the group gives the task to another worker.
            log.info("event=task_start_abandoned task=%s reason=stopping error=%s", task_id, error)
            return
        # Counted across starts that succeeded: an execution that starts and then fails (its
        # query's Spark Python worker could not connect back) is the next attempt, not the first.
        streak = self.streaks.get(task_id)
        if streak is None or self._changed(task_id, streak):
            streak = self.streaks[task_id] = _Streak(Backoff(), self._revision_of(task_id))
        delay = streak.backoff.failed()
        attempts = streak.backoff.attempts
        self.failed[task_id] = Retry(attempts, time.monotonic() + delay, error)
        log.error(
            "event=task_failed task=%s attempts=%d retry_in_s=%.1f error=%s", task_id, attempts, delay, error
        )
        if self.on_failure is not None:
            try:
                self.on_failure(task_id, error, attempts, delay)
            except Exception as exc:  # reporting must not stop the worker
                log.warning("event=task_failure_report_failed task=%s error=%s", task_id, exc)

    def _stop_quietly(self, task_id: str, execution: Any) -> None:
        try:
            execution.stop()
        except Exception as exc:
            log.warning("event=task_stop_failed task=%s error=%s", task_id, self.describe_error(task_id, exc))

    def _check_executions(self) -> None:
        """Each heartbeat: tick every running execution; one that failed is stopped and retried
        after a backoff; one that was superseded is stopped and the worker rejoins."""
        for task_id, execution in list(self.running.items()):
            try:
                execution.tick()
            except Exception as exc:  # ZooKeeper or the log unreachable for now
                if self.stop.is_set():  # the stop may have closed the session under it: expected
                    log.info("event=task_check_ended_at_stop task=%s error=%r", task_id, exc)
                    continue
                log.warning("task %s: status check failed, will retry: %s", task_id,
                            self.describe_error(task_id, exc))  # fmt: skip
            if getattr(execution, "batches_committed", 0) > 0 and task_id in self.streaks:
                log.info("event=task_progressed task=%s failures_in_a_row=%d", task_id,
                         self.streaks.pop(task_id).backoff.attempts)  # fmt: skip
            error = getattr(execution, "error", None)
            if error is None:
                continue
            del self.running[task_id]
            self._stop_quietly(task_id, execution)
            if error == SUPERSEDED:
                self._rejoin_requested = True
            else:
                self._failed(task_id, self.describe_error(task_id, str(error)))
        if self.stop.is_set():  # leaving: no retry, nor its revision read from ZooKeeper
            return
        now = time.monotonic()
        for task_id, retry in sorted(self.failed.items()):
            if task_id not in self.assigned or task_id in self.running:
                continue
            streak = self.streaks.get(task_id)
            if retry.at > now and streak is not None and self._changed(task_id, streak):
                # The operator updated, restarted or resumed it: try the task as it is now, at
                # once, counting its failures from 1 again.
                log.info("event=task_changed task=%s: starting it now", task_id)
                del self.streaks[task_id]
            elif retry.at > now:
                continue
            log.info("event=task_retry task=%s attempt=%d", task_id, retry.attempts + 1)
            self._start(task_id)

    def run(self) -> None:
        """Heartbeats run on their own thread, so that starting or stopping a task (which can
        take seconds: Spark) never costs the worker its session, and the loop on its own too, so
        that the stop waits for it at most `loop_exit_s`. Returns once `stop` is set, the loop
        has left or been left, the tasks are stopped and the group left: within `loop_exit_s` +
        TASKS_STOP_S + LEAVE_GROUP_S of the stop (module docstring). An exception that ended the
        loop is raised then."""
        m = self.membership
        interval = m.session_timeout_ms / 1000 / 4
        rejoin = threading.Event()
        expired = threading.Event()
        rejoin.set()

        def beat() -> None:
            while not self.stop.wait(interval):
                err = m.heartbeat()
                if err != ErrorCode.NONE:
                    log.info("event=heartbeat_answer group=%s member=%s generation=%d error=%s", m.group,
                             m.member_id, m.generation, ErrorCode(err).name)  # fmt: skip
                if err in (ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION):
                    rejoin.set()
                elif err in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                    expired.set()
                    rejoin.set()

        heart = threading.Thread(target=beat, name="heartbeat", daemon=True)
        heart.start()
        in_background(self._watch_stop, name="stop-watch")
        failure: list[BaseException] = []

        def loop() -> None:
            try:
                self._loop(rejoin, expired, interval)
            except BaseException as exc:  # raised by run(), once the tasks are stopped
                failure.append(exc)
            finally:
                self.stop.set()  # an exception ends the run too: the heartbeats and the watch end with it

        # The loop runs on a thread of its own, so that the stop never waits on a call the loop is
        # in for longer than LOOP_EXIT_SESSIONS session timeouts, whatever that call waits on.
        loop_done = in_background(loop, name="worker-loop")
        try:
            while not self.stop.wait(1.0):  # (a timeout: the signal handler runs between waits)
                pass
            self._stop_seen()
            waited_s = self.loop_exit_s()
            if not loop_done.wait(waited_s):
                log.warning(
                    "event=worker_loop_stop_timed_out worker=%s waited_s=%.1f action=%r", m.name, waited_s,
                    "the loop is left in its call on its thread; stopping the tasks, leaving the group",
                )  # fmt: skip
        finally:
            self.stop.set()
            self._stop_all_tasks()
            left_by = time.monotonic() + LEAVE_GROUP_S
            m.leave(timeout_s=LEAVE_GROUP_S)
            heart.join(timeout=max(0.0, left_by - time.monotonic()))
        if failure:
            raise failure[0]

    def loop_exit_s(self) -> float:
        """How long the stop waits for the loop to see it (LOOP_EXIT_SESSIONS session timeouts of
        the ZooKeeper session it may be waiting on)."""
        session_s = self.zookeeper.session_timeout_s if self.zookeeper is not None else SESSION_TIMEOUT_S
        return LOOP_EXIT_SESSIONS * session_s

    def _loop(self, rejoin: threading.Event, expired: threading.Event, interval: float) -> None:
        while not self.stop.is_set():
            try:
                self._pass(rejoin, expired)
            except ZOOKEEPER_UNREACHABLE as exc:
                if not self.stop.is_set():
                    raise
                # The stop closed the session under a call (close_when_unreachable): expected.
                log.info("event=worker_loop_left_at_stop worker=%s error=%r", self.membership.name, exc)
                return
            self.stop.wait(interval)

    def _pass(self, rejoin: threading.Event, expired: threading.Event) -> None:
        """One pass of the loop: step down after a lost group session, rejoin when asked, tick
        the running tasks and retry the failed ones."""
        m = self.membership
        if expired.is_set():
            # The session expired (we were paused or cut off): the others run our tasks now. Stop
            # ours, then rejoin as a new member.
            expired.clear()
            for task_id in sorted(self.running):
                execution = self.running.pop(task_id)
                try:
                    execution.relinquish()
                except Exception as exc:  # it is stopped either way
                    log.warning("task %s: stepping down failed: %s", task_id,
                                self.describe_error(task_id, exc))  # fmt: skip
                    self._stop_quietly(task_id, execution)
            self.failed.clear()
            self.streaks.clear()
            m.member_id = ""
        if self.tasks_changed.is_set() and m.leader == m.member_id:
            rejoin.set()
        if self._rejoin_requested:
            self._rejoin_requested = False
            rejoin.set()
        if rejoin.is_set():
            rejoin.clear()
            self._rebalance()
        self._check_executions()

    def _watch_stop(self) -> None:
        """On its own thread: once the stop begins, have the ZooKeeper session closed as soon as
        ZooKeeper is unreachable, so that no call of the stop (nor the one the loop may be in)
        waits on it."""
        self.stop.wait()
        self._stop_seen()
        log.info("event=worker_stopping worker=%s", self.membership.name)
        if self.zookeeper is not None:
            self.zookeeper.close_when_unreachable(on_close=self._log_zookeeper_unreachable_at_stop)

    def _stop_seen(self) -> None:
        """Note when the stop began, once: the watch and the run's own thread both see it, in
        either order (the run may end before the watch's thread has run at all)."""
        with self._stop_seen_lock:
            if self.stop_began is None:
                self.stop_began = time.monotonic()

    def _log_zookeeper_unreachable_at_stop(self) -> None:
        """The one line for a stop without ZooKeeper: an expected case, never a traceback."""
        z = self.zookeeper
        assert z is not None
        log.warning(
            "event=zookeeper_unreachable_at_stop worker=%s zookeeper=%s session_timeout_s=%.1f action=%r",
            self.membership.name, z.address, z.session_timeout_s,
            "closing the ZooKeeper session so that no call waits on it; the tasks' status znodes go when "
            "ZooKeeper expires it, their history entries say running; stopping the tasks, leaving the group",
        )  # fmt: skip

    def _stop_all_tasks(self) -> None:
        """Stop every running task at once and wait for them TASKS_STOP_S at most; a task still
        stopping then is left to its thread (a daemon)."""
        running, self.running = self.running, {}
        deadline = time.monotonic() + TASKS_STOP_S
        stopping = {
            task_id: in_background(partial(self._stop_quietly, task_id, execution), name=f"stop-{task_id}")
            for task_id, execution in sorted(running.items())
        }
        for task_id, stopped in stopping.items():
            if not stopped.wait(max(0.0, deadline - time.monotonic())):
                log.warning(
                    "event=task_stop_timed_out task=%s waited_s=%.0f action=%r", task_id, TASKS_STOP_S,
                    "left stopping on its thread; the worker goes on leaving",
                )  # fmt: skip


def _describe(_task_id: str, error: BaseException | str) -> str:
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


def worker_name() -> str:
    import socket

    return f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"

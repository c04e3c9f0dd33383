"""One execution of a sync task on a worker: capture into the log, apply to the target.

Starting takes a new fencing epoch (`TaskStore.next_epoch`) and publishes an ephemeral status
znode (execution id, epoch, worker). The task ran twice at once (incident D) when either side
sees the other:

- the new execution finds another execution's status still there (its worker's ZooKeeper
  session is alive although the group gave the task to us), or
- an execution finds a newer epoch taken (it was paused or cut off past its group session),
  or the target refuses its commit (`StaleEpochError`: the new execution claimed the target).

Either way a `duplicate-execution` alarm records both execution ids, both workers and the time
window in which both ran, and the older execution stops. A refused commit is recorded on its
own too (`stale-commit-refused`), with the epoch refused and the epoch that holds the target.
The apply query claims the target under our epoch when it starts, so from then on nothing the
older execution still has in flight can commit.

Every execution is recorded in the task's history (`TaskStore.record_execution`) at its start and
again, in the same entry, at its end with its outcome: stopped, failed, superseded (it stepped
down for a newer one) or fenced (the target refused its commit). A failure to record is logged
and never fails or holds up the task. The worker's metrics (sluice.metrics: lag, commit time,
refused commits, duplicate executions) are updated here and removed when the worker stops
running the task.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice import metrics, test_switches
from sluice.bounded import run_within
from sluice.clients import close_within
from sluice.cluster.zkstore import ZOOKEEPER_UNREACHABLE
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.security.secrets import DEFAULT_SCOPE, SecretScope, resolved_only
from sluice.sync.tasks import DATABASE_SOURCES, TaskSpec, TaskStore, parse_duration, resolved, scrub

log = logging.getLogger("sluice.execution")

#: The error of an execution that stepped down because a newer one runs the task elsewhere.
SUPERSEDED = "superseded by a newer execution"
#: How often a MySQL/MariaDB task's needed and oldest binlog files are looked at (seconds).
#: the default of the task option slot_retained_alarm_bytes (PostgreSQL sources)
SLOT_RETAINED_ALARM_BYTES = 1 << 30


def slot_alarm(retained: int, wal_status: str, limit: int, raised: bool) -> tuple[bool, bool]:
    """Whether to raise the `slot-wal-retained` alarm now, and whether it stays raised: once
    past `limit` bytes or at risk of losing WAL, and not again until back under half the limit."""
    at_risk = wal_status in ("unreserved", "lost")
    if retained > limit or at_risk:
        return not raised, True
    return False, raised and retained >= limit / 2


BINLOG_CHECK_S = 30.0
#: A stopping execution waits this long, on one deadline, for its apply query (the micro-batch in
#: flight) and its capture thread; past it they are left to end on their own threads (daemons),
#: and a commit they still make is refused by the target once a newer epoch claims it.
HALT_S = 10.0
#: Of HALT_S, the micro-batch in flight gets this long to commit before the query's stop cancels
#: its Spark job (`ApplyQuery.stop`).
BATCH_WAIT_S = 5.0
#: ... and this long for its status reads' consumer to close (librdkafka may wait on a broker).
STATUS_CONSUMER_CLOSE_S = 3.0


#: Change topics: records carry the source's commit time, so the broker stamps its append time
#: for retention and the time index (a capture days behind must not see its records expire).
CHANGE_TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}


def ensure_topics(
    bootstrap: str,
    topics: list[str],
    partitions: int,
    replication: int | None,
    security: ClientSecurity = PLAINTEXT,
    config: dict[str, str] = CHANGE_TOPIC_CONFIG,
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **security.confluent_config()})
    existing = set(admin.list_topics(timeout=15).topics)
    missing = [t for t in topics if t not in existing]
    if not missing:
        return
    brokers = len(admin.list_topics(timeout=15).brokers)
    rf = replication or min(3, brokers)
    for future in admin.create_topics([NewTopic(t, partitions, rf, config=config) for t in missing]).values():
        try:
            future.result()
        except Exception as exc:  # created meanwhile by another execution
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


class TaskExecution:
    def __init__(
        self,
        task_id: str,
        store: TaskStore,
        *,
        worker: str,
        bootstrap: str,
        spark: Callable[[str | None], Any],
        workdir: Path,
        switches: test_switches.Switches = test_switches.OFF,
        security: ClientSecurity = PLAINTEXT,
        secret_scope: SecretScope = DEFAULT_SCOPE,
    ) -> None:
        self.task_id = task_id
        self.switches = switches
        #: what the task's secret references may name on this worker (its secrets.dir and
        #: secrets.env.prefix), checked again at every start whatever the definition was checked with
        self.secret_scope = secret_scope
        self.store = store
        self.worker = worker
        self.bootstrap = bootstrap
        #: how the execution's capture, apply query, status reads and topic creation authenticate
        self.security = security
        # The worker's Spark session, asked for at each start with the task's spark_master option:
        # a driver JVM that died since the last start is replaced, and a task wanting another
        # master than the driver's is refused, naming both (pipeline.session.DriverSession).
        self.spark_session = spark
        self.spark: Any = None
        self.workdir = workdir
        self.spec: TaskSpec = store.get(task_id)
        self.control = store.control(task_id)
        self.stop_event = threading.Event()
        self.capture_thread: threading.Thread | None = None
        self.capture: Any = None
        self.query: Any = None
        self.error: str | None = None
        self.started = time.time()
        self.epoch = 0
        self.execution = ""
        #: this execution's entry in the task's history (None: not recorded, or ended)
        self._history_node: str | None = None
        #: the target refused a commit of this execution (a newer epoch holds its fence)
        self._fenced = False
        #: batches this object's apply queries committed to the target (the batch thread counts
        #: them): progress, which starts the worker's count of failures in a row again
        self.batches_committed = 0
        self._consumer: Any = None
        # The binlog report (_binlog_report): when last looked at, what it found, the file last
        # alarmed for, and a paused task's resume position read from the log
        self._binlog_checked = -BINLOG_CHECK_S
        self._binlog: dict[str, Any] = {}
        self._binlog_alarmed = ""
        self._paused_resume: str | None = None
        # Status reads use their own target connection: the apply query's is busy on the batch
        # thread, and one connection cannot hold two transactions at once.
        self._status_target: Any = None
        #: the offsets after this execution's last commit (`Target.status_from_commits`)
        self._committed: dict[tuple[str, int], int] | None = None
        try:
            self._start()
        except BaseException as exc:
            self.error = self.error or f"start failed: {exc}"
            self.stop()  # nothing half-started keeps running (a capture thread, a query)
            raise

    # --- lifecycle -------------------------------------------------------------------------------
    def _target(self) -> Any:
        if self._status_target is None:
            from sluice.sync.targets import open_target

            self._status_target = open_target(
                self.spec.target, password=resolved_only(self.spec.target_password)
            )
        return self._status_target

    def _start(self) -> None:
        self.stop_event = threading.Event()
        # The definition as it is now (`sluice task update` restarts us), its secret references
        # read here, on the worker that runs it: a missing variable or file fails the start,
        # named (an alarm, retries with backoff), and never a value.
        spec = self.store.get(self.task_id)
        plain = spec.plain_text_secrets()
        if plain:
            log.warning(
                "task %s: event=plain_text_secret fields=%s: the definition was stored before secret "
                "references and still runs as it is; update it with `password: {env: NAME}` or "
                "`{file: PATH}` (sluice task update --file)", self.task_id, ",".join(plain),
            )  # fmt: skip
        self.spec = resolved(spec, self.secret_scope)
        self.spark = self.spark_session(self.spec.options.get("spark_master"))
        # Past every epoch the target has seen, too: a task deleted and created again, or a
        # counter lost with its ZooKeeper, must not come back under an epoch the target refuses.
        self.epoch = self.store.next_epoch(
            self.task_id, at_least=self._target().fence_epoch(self.spec.id) or 0
        )
        self.execution = uuid.uuid4().hex[:12]
        self.started = time.time()
        self._fenced = False
        self._paused_resume = None  # read again if this execution is paused
        self._record_start()
        other = self.store.status(self.task_id)
        if other and other.get("execution") != self.execution and not other.get("paused"):
            self._raise_duplicate_alarm(
                {
                    "executions": [other.get("execution"), self.execution],
                    "workers": [other.get("worker"), self.worker],
                    "epochs": [other.get("epoch"), self.epoch],
                    "window": [self.started, None],
                    "found_by": "new execution",
                    "detail": "the previous execution's worker still holds its ZooKeeper session; "
                    "the target refuses its commits once our apply query has claimed it",
                },
            )
            log.warning("task %s: duplicate execution: %s on %s is still registered", self.task_id,
                        other.get("execution"), other.get("worker"))  # fmt: skip
        self._publish({})
        if self.control.paused:
            return
        spec = self.spec
        opts = spec.options
        ensure_topics(
            self.bootstrap, spec.topics(), int(opts.get("partitions", 3)), opts.get("replication_factor"),
            self.security,
        )  # fmt: skip
        if opts.get("on_refused") == "dlq":  # only then: a task that stops on refusals has no use for it
            from sluice.sync.dead_letters import DEAD_LETTER_PARTITIONS, DEAD_LETTER_TOPIC_CONFIG

            ensure_topics(
                self.bootstrap, [spec.dlq_topic()], DEAD_LETTER_PARTITIONS, opts.get("replication_factor"),
                self.security, DEAD_LETTER_TOPIC_CONFIG,
            )  # fmt: skip
        if spec.source.kind in DATABASE_SOURCES:  # small: one partition, replicated like the rest
            ensure_topics(self.bootstrap, [spec.transactions_topic()], 1, opts.get("replication_factor"),
                          self.security)  # fmt: skip
        self._start_capture()
        self._start_apply()

    def _start_capture(self) -> None:
        spec = self.spec
        opts = spec.options
        if spec.source.kind in ("mysql", "mariadb"):
            from sluice.sync.sources.mysql import (
                HEARTBEAT_S,
                PARALLEL_SNAPSHOT_ROWS,
                SNAPSHOT_CHUNK_ROWS,
                MySqlCapture,
                recover_position,
            )

            client = self.security.confluent_config()
            start = self.control.from_position or recover_position(self.bootstrap, spec.topics(), client)
            runner = None
            if self.spark is not None:
                from sluice.pipeline.snapshot import run_snapshot_chunks

                spark, stop = self.spark, self.stop_event

                def runner(chunks: list[Any]) -> list[Any]:
                    return run_snapshot_chunks(spark, chunks, stop=stop)

            self.capture = MySqlCapture(
                spec.source, spec.tables, spec.topic_for, self.bootstrap, name=spec.id, epoch=self.epoch,
                execution=self.execution, start=start, stop=self.stop_event,
                still_owner=self._still_owner, snapshot_runner=runner, switches=self.switches,
                snapshot_parallel_rows=int(opts.get("snapshot_parallel_rows", PARALLEL_SNAPSHOT_ROWS)),
                snapshot_chunk_rows=int(opts.get("snapshot_chunk_rows", SNAPSHOT_CHUNK_ROWS)),
                producer_config=client, transactions_topic=spec.transactions_topic(),
                transaction_metadata=opts.get("transaction_metadata", "false") == "true",
                heartbeat_s=parse_duration(str(opts.get("heartbeat_interval", HEARTBEAT_S))),
                snapshot_requests=lambda: self.store.control(self.task_id).snapshots,
                snapshot_done=lambda request: self.store.snapshot_done(self.task_id, request),
                on_history_change=self._on_history_change, zero_dates=opts.get("zero_dates", "null"),
            )  # fmt: skip
            target = self.capture.run
        elif spec.source.kind == "postgresql":
            from sluice.sync.sources.mysql_base import PARALLEL_SNAPSHOT_ROWS, SNAPSHOT_CHUNK_ROWS
            from sluice.sync.sources.postgresql import HEARTBEAT_S as PG_HEARTBEAT_S
            from sluice.sync.sources.postgresql import PgCapture
            from sluice.sync.sources.postgresql import recover_position as pg_recover
            from sluice.sync.sources.resnapshot import new_request

            client = self.security.confluent_config()
            start = self.control.from_position or pg_recover(self.bootstrap, spec.topics(), client)
            pg_runner = None
            if self.spark is not None:
                from sluice.pipeline.snapshot import run_snapshot_chunks
                from sluice.sync.sources.pg_snapshot import read_pg_chunk

                spark, stop = self.spark, self.stop_event

                def pg_runner(chunks: list[Any]) -> list[Any]:
                    return run_snapshot_chunks(spark, chunks, stop=stop, read=read_pg_chunk)

            task_id = self.task_id
            self.capture = PgCapture(
                spec.source, spec.tables, spec.topic_for, self.bootstrap, name=spec.id, epoch=self.epoch,
                execution=self.execution, start=start, stop=self.stop_event, still_owner=self._still_owner,
                switches=self.switches, producer_config=client, transactions_topic=spec.transactions_topic(),
                transaction_metadata=opts.get("transaction_metadata", "false") == "true",
                heartbeat_s=parse_duration(str(opts.get("heartbeat_interval", PG_HEARTBEAT_S))),
                on_created=lambda objects: self.store.record_source_objects(task_id, objects),
                created=lambda: self.store.source_objects(task_id),
                snapshot_requests=lambda: self.store.control(task_id).snapshots,
                snapshot_done=lambda request: self.store.snapshot_done(task_id, request),
                snapshot_chunk_rows=int(opts.get("snapshot_chunk_rows", SNAPSHOT_CHUNK_ROWS)),
                snapshot_parallel_rows=int(opts.get("snapshot_parallel_rows", PARALLEL_SNAPSHOT_ROWS)),
                snapshot_runner=pg_runner,
                on_history_change=self._on_history_change,
                decoding_work_mem=opts.get("logical_decoding_work_mem"),
                ask_snapshot=lambda table: self.store.add_snapshots(task_id, [new_request(table)]),
            )  # fmt: skip
            target = self.capture.run
        else:
            from sluice.sync.sources.generator import GeneratorConfig, run_generator

            src = spec.source
            config = GeneratorConfig(
                topic=spec.topic.replace("{task}", spec.id), rate=src.rate, skew=src.skew, seed=src.seed,
                duration_s=None, name=spec.id,
                start_pos=_next_generator_pos(self.bootstrap, spec.topics(), self.security),
            )  # fmt: skip
            client = self.security.confluent_config()

            def target() -> None:
                run_generator(self.bootstrap, config, stop=self.stop_event, producer_config=client)

        def run() -> None:
            try:
                target()
            except Exception as exc:
                self.error = f"capture failed: {exc}"
                log.error("task %s: %s", self.task_id, self.error)

        self.capture_thread = threading.Thread(target=run, name=f"capture-{spec.id}", daemon=True)
        self.capture_thread.start()

    def _still_owner(self) -> bool:
        """No newer epoch taken (asked by the capture before each binlog pass)."""
        try:
            return bool(self.store.epoch(self.task_id) <= self.epoch)
        except Exception:  # ZooKeeper out of reach: go on; the target's guards still hold
            return True

    def _start_apply(self) -> None:
        from sluice.pipeline.apply import ApplyQuery

        config = apply_config(
            self.spec, self.bootstrap, self.epoch, self.workdir, self.switches, self.security, self.execution
        )
        self.query = ApplyQuery(
            self.spark, config, on_error=self._on_commit_error, on_batch=self._on_batch,
            on_dead_letters=self._on_dead_letters,
        )  # fmt: skip
        self.query.start()

    def _on_batch(self, report: Any) -> None:
        """On the batch thread, after each micro-batch's commit (never raises: it would fail the
        batch)."""
        self.batches_committed += 1  # one writer, this thread; the worker only reads it
        try:
            metrics.TASK_APPLY_BATCH_SECONDS.labels(self.task_id).observe(report.commit_s)
            offsets = report.result.offsets
            self._committed = {(t, p): o for t, parts in offsets.items() for p, o in parts.items()}
        except Exception:
            log.warning("task %s: recording the batch's metrics failed", self.task_id, exc_info=True)

    def _on_dead_letters(self, letters: list[Any]) -> None:
        """On the batch thread, after a commit that dead-lettered changes: the alarm and metric."""
        metrics.TASK_DEAD_LETTERS.labels(self.task_id).inc(len(letters))
        first = letters[0]
        self._alarm_from_batch(
            "dead-letters",
            {
                "count": len(letters), "table": first.table, "error": first.error,
                "execution": self.execution, "topic": self.spec.dlq_topic(),
                "detail": f"{len(letters)} change(s) the target refused are in {self.spec.dlq_topic()}; "
                f"fix the target or the data, then `sluice dlq replay {self.task_id}`",
            },
        )  # fmt: skip

    def _alarm_from_batch(self, kind: str, detail: dict[str, Any]) -> None:
        """An alarm raised on the batch thread, whose commit is done (or refused) already:
        ZooKeeper out of reach is one line, never a traceback (the worker may be stopping, its
        session closed under the call)."""
        try:
            self.store.raise_alarm(self.task_id, kind, detail)
        except ZOOKEEPER_UNREACHABLE as exc:
            log.warning("task %s: event=alarm_not_recorded kind=%s execution=%s reason=zookeeper_unreachable "
                        "error=%r", self.task_id, kind, self.execution, exc)  # fmt: skip

    def _on_history_change(self, info: dict[str, Any]) -> None:
        """On the capture's thread: the source's history changed under the task (RESET MASTER, a
        promoted replica; a PostgreSQL slot gone or lost) and the capture went on in the new one;
        the alarm says where, and whether it could prove that no change was missed."""
        from sluice.sync.sources.binlog_history import HISTORY_CHANGED

        if "what" in info:  # the source said what happened (PostgreSQL)
            detail = (f"{info['what']}; rows deleted in between may remain in the target: run `sluice "
                      f"task verify {self.task_id} --repair`")  # fmt: skip
        else:
            what = (
                "the capture went on from its GTID state: no change was missed"
                if info["continuous"]
                else "the server did not have the capture's GTID state, so changes made between the last "
                "one captured and the change of history may be missing from the target; run `sluice task "
                f"verify {self.task_id} --repair`"
            )
            detail = f"the source's binlog history changed at {info['left_at']}; {what}"
        self.store.raise_alarm(
            self.task_id, HISTORY_CHANGED,
            {**info, "execution": self.execution, "detail": f"{detail} (reading on at {info['went_on_at']})"},
        )  # fmt: skip

    def _on_commit_error(self, exc: BaseException) -> None:
        """On the batch thread: a refused stale commit is recorded at once, whatever else this
        execution is doing (it may be stepping down already)."""
        from sluice.sync.targets import StaleEpochError
        from sluice.sync.targets.evolution import SchemaChangeStopped

        if isinstance(exc, SchemaChangeStopped):
            self._schema_change_stopped(exc)
            return
        if not isinstance(exc, StaleEpochError):
            return
        self._fenced = True
        metrics.TASK_COMMITS_REFUSED.labels(self.task_id).inc()
        self._alarm_from_batch(
            "stale-commit-refused",
            {
                "execution": self.execution, "worker": self.worker, "epoch": exc.epoch,
                "target_epoch": exc.current, "detail": str(exc),
            },
        )  # fmt: skip
        log.warning("task %s: stale commit refused: execution %s epoch %d, the target holds epoch %d",
                    self.task_id, self.execution, exc.epoch, exc.current)  # fmt: skip

    def _schema_change_stopped(self, exc: Any) -> None:
        """Policy `stop` met a schema change: pause the task (nothing of the batch was committed)
        and raise the alarm with what changed and what to do."""
        try:
            self.store.set_control(self.task_id, paused=True)
            self.store.raise_alarm(self.task_id, "schema-change-stopped", exc.detail())
        except Exception:  # ZooKeeper out of reach: the query stops on the error all the same
            log.warning("task %s: recording the schema change stop failed", self.task_id, exc_info=True)
        log.warning("event=schema_change_stopped task=%s table=%s position=%d change=%s ddl=%r",
                    self.task_id, exc.table, exc.pos, exc.change.kind, exc.ddl[:200])  # fmt: skip

    def stop(self) -> None:
        """Stop for good: the worker no longer runs the task here, so its series go too."""
        self._halt()
        metrics.forget_task(self.task_id)

    def _halt(self) -> None:
        """Stop this execution (a restart starts the next one on the same object): its apply
        query and capture within HALT_S, then its status and history in ZooKeeper (bounded
        calls, and none without a connection)."""
        deadline = time.monotonic() + HALT_S
        self.stop_event.set()  # the capture stops too while the query does
        if self.query is not None:
            query, self.query = self.query, None
            if not run_within(lambda: self._stop_query(query), HALT_S, name=f"stop-apply-{self.task_id}"):
                log.warning(
                    "task %s: event=apply_query_stop_timed_out execution=%s waited_s=%.0f action=%r",
                    self.task_id, self.execution, HALT_S,
                    "left to end on its own thread; a commit it still makes is refused once a newer "
                    "epoch claims the target",
                )  # fmt: skip
        if self.capture_thread is not None:
            self.capture_thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if self.capture_thread.is_alive():
                log.warning(
                    "task %s: event=capture_stop_timed_out execution=%s waited_s=%.0f action=%r",
                    self.task_id, self.execution, HALT_S,
                    "left to end on its own thread; what it still produces is under this epoch",
                )  # fmt: skip
            self.capture_thread = None
        if self._consumer is not None:
            close_within(self._consumer, STATUS_CONSUMER_CLOSE_S)
            self._consumer = None
        if self._status_target is not None:
            self._status_target.close()
            self._status_target = None
        self._end_in_zookeeper()

    def _stop_query(self, query: Any) -> None:
        try:
            query.stop(batch_wait_s=BATCH_WAIT_S)
        except Exception as exc:  # it is stopped as far as it goes; the next start begins anew
            log.warning("task %s: event=apply_query_stop_failed execution=%s error=%r",
                        self.task_id, self.execution, exc)  # fmt: skip

    def _end_in_zookeeper(self) -> None:
        """Clear this execution's status (unless it was superseded: the status is the newer
        one's then) and complete its history entry. Only while ZooKeeper answers, each call
        waited on at most tasks.BEST_EFFORT_CALL_S: kazoo would hold them until it reconnects.
        Without ZooKeeper both are left: the status znode goes with the worker's session, and the
        entry still says running."""
        clear = bool(self.execution) and self.error != SUPERSEDED
        if not clear and self._history_node is None:
            return
        if not self.store.connected:
            self._history_node = None
            log.info(
                "task %s: event=execution_end_not_recorded execution=%s outcome=%s "
                "reason=zookeeper_unreachable detail=%r", self.task_id, self.execution, self._outcome(),
                "its status znode goes when the worker's ZooKeeper session does; its history entry "
                "says running",
            )  # fmt: skip
            return
        if clear:
            try:
                self.store.clear_status(self.task_id, self.execution)
            except Exception as exc:  # ZooKeeper out of reach: the znode goes with the session
                log.info("task %s: status left for its session to remove: %r", self.task_id, exc)
        self._record_end()

    def alive(self) -> bool:
        return self.error is None

    # --- each heartbeat --------------------------------------------------------------------------
    def tick(self) -> None:
        from sluice.sync.targets import StaleEpochError

        control = self.store.control(self.task_id)
        if control.paused != self.control.paused or control.restarts != self.control.restarts:
            log.info("task %s: control changed (%s), restarting the execution", self.task_id, control)
            self._halt()
            self.control = control
            self.error = None
            try:
                self._start()
            except Exception as exc:  # the worker retries this task with a backoff
                self.error = f"restart failed: {exc}"
                self._halt()
            return
        newest = self.store.epoch(self.task_id)
        if newest > self.epoch and not self.error:
            newer = self.store.status(self.task_id) or {}
            if newer.get("execution") not in (None, self.execution):
                # A newer execution started elsewhere (we were paused, or cut off): step down
                # before our next commit is refused.
                self._step_down(newer, f"epoch {newest} was taken after ours ({self.epoch})")
                return
        failure = self.query.failure() if self.query is not None else None
        if isinstance(failure, StaleEpochError):
            self._step_down(self.store.status(self.task_id) or {}, str(failure))
            return
        if failure is not None and self.error is None:
            # The target refused connections, a record was refused, ...: the worker stops this
            # execution and starts a new one after a backoff.
            self.error = (
                f"apply failed: {str(failure).splitlines()[0] if str(failure) else type(failure).__name__}"
            )
        progress = self._progress()
        if "lag_records" in progress:
            metrics.TASK_LAG_RECORDS.labels(self.task_id).set(progress["lag_records"])
            metrics.TASK_LAG_SECONDS.labels(self.task_id).set(progress["lag_seconds"])
        self._publish(progress)

    def relinquish(self) -> None:
        """The worker lost its group session (it was paused or cut off): the task is someone
        else's now. If a newer execution has started meanwhile, both ran at once: step down with
        the alarm; otherwise just stop."""
        if self.error is None and self.store.epoch(self.task_id) > self.epoch:
            newer = self.store.status(self.task_id) or {}
            self._step_down(newer, "this worker's group session expired and a newer epoch was taken")
            return
        self.stop()

    def _step_down(self, newer: dict[str, Any], detail: str) -> None:
        """A newer execution owns the task: record the duplicate execution and stop."""
        self._raise_duplicate_alarm(
            {
                "executions": [self.execution, newer.get("execution")],
                "workers": [self.worker, newer.get("worker")],
                "epochs": [self.epoch, newer.get("epoch", self.store.epoch(self.task_id))],
                # both ran from the newer one's start until this one stops, now
                "window": [newer.get("started"), time.time()],
                "found_by": "superseded execution",
                "detail": detail,
            },
        )
        log.warning("task %s: execution %s superseded: %s", self.task_id, self.execution, detail)
        self.error = SUPERSEDED
        self.stop()

    def _raise_duplicate_alarm(self, detail: dict[str, Any]) -> None:
        self.store.raise_alarm(self.task_id, "duplicate-execution", detail)
        metrics.TASK_DUPLICATE_EXECUTIONS.labels(self.task_id).inc()

    def _outcome(self) -> str:
        if self._fenced:
            return "fenced"
        if self.error == SUPERSEDED:
            return "superseded"
        return "failed" if self.error else "stopped"

    def _record_start(self) -> None:
        """Open this execution's entry in the task's history (outcome running)."""
        self._history_node = self._write_history(self._history_entry(None, "running", None), None)

    def _record_end(self) -> None:
        """Complete this execution's entry, in place, once it has stopped (once)."""
        node, self._history_node = self._history_node, None
        if node is not None:
            error = scrub(self.error, self.spec.secrets()) if self.error else None
            self._write_history(self._history_entry(time.time(), self._outcome(), error), node)

    def _history_entry(self, ended: float | None, outcome: str, error: str | None) -> dict[str, Any]:
        return {
            "execution": self.execution, "epoch": self.epoch, "worker": self.worker, "started": self.started,
            "ended": ended, "outcome": outcome, "error": error,
        }  # fmt: skip

    def _write_history(self, entry: dict[str, Any], node: str | None) -> str | None:
        """Best effort (TaskStore.record_execution bounds the wait): a failure is logged and
        the task goes on; the entry's znode name, or None."""
        try:
            return self.store.record_execution(self.task_id, entry, node=node)
        except Exception as exc:
            log.warning("task %s: execution %s not recorded in the task's history (%s): %r",
                        self.task_id, self.execution, entry["outcome"], exc)  # fmt: skip
            return None

    def _publish(self, extra: dict[str, Any]) -> None:
        status = {
            "execution": self.execution, "epoch": self.epoch, "worker": self.worker, "started": self.started,
            "paused": self.control.paused, "updated": time.time(), "error": self.error, **extra,
        }  # fmt: skip
        self.store.publish_status(self.task_id, status)  # refused if a newer execution owns it

    def _slot_report(self) -> dict[str, Any]:
        """PostgreSQL: the WAL the task's replication slot holds on the source (a paused task's
        too), looked at every BINLOG_CHECK_S. Past the task option `slot_retained_alarm_bytes`
        (default 1 GiB), or once the server says the slot may lose WAL it needs (`wal_status`
        unreserved or lost), a `slot-wal-retained` alarm is raised, again only after it fell below
        half of that."""
        if self.spec.source.kind != "postgresql":
            return {}
        now = time.monotonic()
        if now - self._binlog_checked < BINLOG_CHECK_S:
            return self._binlog
        self._binlog_checked = now
        from sluice.sync.sources.postgresql import slot_state

        try:
            state = slot_state(self.spec.source, self.spec.id)
        except Exception as exc:  # the source is out of reach: try again later
            log.info("task %s: event=slot_check_failed error=%r", self.task_id, str(exc))
            return self._binlog
        self._binlog = state
        retained = int(state.get("pg_wal_retained_bytes") or 0)
        limit = int(self.spec.options.get("slot_retained_alarm_bytes", SLOT_RETAINED_ALARM_BYTES))
        due, armed = slot_alarm(
            retained, str(state.get("slot_wal_status")), limit, bool(self._binlog_alarmed)
        )
        self._binlog_alarmed = "slot" if armed else ""
        if due:
            detail = {
                **state,
                "limit_bytes": limit,
                "paused": self.control.paused,
                "execution": self.execution,
            }
            self.store.raise_alarm(self.task_id, "slot-wal-retained", detail)
            log.warning(
                "task %s: event=slot_wal_retained slot=%s retained_bytes=%d wal_status=%s: the slot holds "
                "that much WAL on the source; resume the task (or let it catch up), or the server's disk "
                "fills (or, with max_slot_wal_keep_size, the slot is lost and the task starts over)",
                self.task_id, state.get("slot"), retained, state.get("slot_wal_status"),
            )  # fmt: skip
        return self._binlog

    def _binlog_report(self) -> dict[str, Any]:
        """MySQL/MariaDB: the binlog file the task needs to resume from (a paused task's too: read
        from the log once) and the oldest on the server, looked at every BINLOG_CHECK_S. A needed
        file among the two oldest, or gone, raises a `binlog-purge-risk` alarm (once per file)
        before the server purges what the task still has to read."""
        if self.spec.source.kind not in ("mysql", "mariadb"):
            return {}
        now = time.monotonic()
        if now - self._binlog_checked < BINLOG_CHECK_S:
            return self._binlog
        self._binlog_checked = now
        from sluice.sync.sources.mysql import binary_logs, purge_risk, recover_position
        from sluice.sync.sources.mysql_base import SNAPSHOT, BinlogPosition

        try:
            if self.capture is not None:
                resume: str | None = self.capture.resume_position()
            else:  # paused: nothing moves the position until it resumes
                if self._paused_resume is None:
                    client = self.security.confluent_config()
                    self._paused_resume = recover_position(self.bootstrap, self.spec.topics(), client) or ""
                resume = self._paused_resume
            if not resume or resume.startswith(SNAPSHOT):
                self._binlog = {}
                return self._binlog
            needed = BinlogPosition.parse(resume).file
            logs = binary_logs(self.spec.source)
        except Exception as exc:  # the source or the log is out of reach: try again later
            log.info("task %s: event=binlog_check_failed error=%r", self.task_id, str(exc))
            return self._binlog
        self._binlog = {"needed_binlog": needed, "oldest_binlog": logs[0] if logs else ""}
        risk = purge_risk(needed, logs)
        if risk is not None and needed != self._binlog_alarmed:
            self._binlog_alarmed = needed
            detail = {"needed_binlog": needed, "oldest_binlogs": logs[:2], "risk": risk,
                      "paused": self.control.paused, "execution": self.execution}  # fmt: skip
            self.store.raise_alarm(self.task_id, "binlog-purge-risk", detail)
            log.warning(
                "task %s: event=binlog_purge_risk needed_binlog=%s oldest_binlogs=%s risk=%s: the task "
                "still has to read %s; keep the server from purging it (resume the task, or raise "
                "expire_logs_days / binlog_expire_logs_seconds), or it must start over from a snapshot",
                self.task_id, needed, ",".join(logs[:2]), risk, needed,
            )  # fmt: skip
        return self._binlog

    def _progress(self) -> dict[str, Any]:
        from confluent_kafka import Consumer, TopicPartition

        out: dict[str, Any] = {}
        if self.capture is not None:
            out["captured_position"] = self.capture.stats.position
        out.update(self._binlog_report())
        out.update(self._slot_report())
        if self.query is None:
            return out
        try:
            committed = self._committed
            if committed is not None and self._target().status_from_commits:
                applied = dict(committed)  # no Spark job each tick beside the batches'
            else:
                applied = self._target().applied_offsets(self.spec.id)
        except Exception:
            # The connection is gone (the target restarted, a network cut): a new one next time.
            target, self._status_target = self._status_target, None
            try:
                target.close()
            except Exception:
                pass
            raise
        out["applied_offsets"] = {f"{t}[{p}]": o for (t, p), o in sorted(applied.items())}
        if self._consumer is None:
            self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "sluice-status",
                                       "enable.auto.commit": False, "log_level": 0,
                                       **self.security.confluent_config()})  # fmt: skip
        lag = 0
        oldest: int | None = None
        try:
            for topic in self.spec.topics():
                meta = self._consumer.list_topics(topic, timeout=5).topics.get(topic)
                for p in meta.partitions if meta else []:
                    high = self._consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                    at = applied.get((topic, p), 0)
                    if high > at:
                        lag += high - at
                        self._consumer.assign([TopicPartition(topic, p, at)])
                        msg = self._consumer.poll(2)
                        if msg is not None and msg.error() is None:
                            ts = _source_time_ms(msg.value(), msg.timestamp()[1])
                            oldest = ts if oldest is None else min(oldest, ts)
        except Exception as exc:  # the log is failing over: report what we have
            out["lag_error"] = str(exc)
        out["lag_records"] = lag
        out["lag_seconds"] = 0.0 if oldest is None else round(max(0.0, time.time() - oldest / 1000), 1)
        return out


def apply_config(
    spec: TaskSpec,
    bootstrap: str,
    epoch: int,
    workdir: Path,
    switches: test_switches.Switches = test_switches.OFF,
    security: ClientSecurity = PLAINTEXT,
    execution: str = "",
) -> Any:
    """The apply query of a task: its topics into its target under `epoch`, refusing any event
    that names a table outside the task's `tables` (or one of Sluice's own)."""
    from sluice.pipeline.apply import ApplyConfig
    from sluice.sync.targets import ColumnMapping

    return ApplyConfig(
        bootstrap=bootstrap, target=spec.target, target_password=resolved_only(spec.target_password),
        topics=spec.topics(), pipeline=spec.id, epoch=epoch,
        checkpoint=workdir / spec.id / "checkpoint",
        trigger_s=parse_duration(str(spec.options.get("trigger", "1s"))),
        mapping=ColumnMapping.from_config(spec.mapping),
        max_records_per_trigger=spec.options.get("max_records_per_trigger"), tables=spec.tables or None,
        switches=switches, security=security,
        on_refused=spec.options.get("on_refused", "stop"), dead_letter_topic=spec.dlq_topic(),
        execution=execution,
        schema_change_policy=str(spec.options.get("schema_change_policy", "evolve")),
        optimize_every=spec.options.get("optimize_every"),
        transaction_topic=spec.transactions_topic() if spec.source.kind in DATABASE_SOURCES else None,
    )  # fmt: skip


def _source_time_ms(value: bytes | None, fallback_ms: int) -> int:
    """The source commit time of a change (`source.ts_ms`): lag is measured from when the change
    happened at the source, not from when it reached the log (change topics are stamped with
    their append time)."""
    import orjson

    try:
        ts = orjson.loads(value or b"{}")["source"]["ts_ms"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return fallback_ms
    return ts if isinstance(ts, int) and not isinstance(ts, bool) else fallback_ms


def _next_generator_pos(bootstrap: str, topics: list[str], security: ClientSecurity = PLAINTEXT) -> int:
    """One past the highest source position in the topics' last records (1 when empty)."""
    from sluice.sync.sources import last_envelopes

    return 1 + max(
        (
            int(doc.get("source", {}).get("pos", 0))
            for doc in last_envelopes(bootstrap, topics, security.confluent_config())
        ),
        default=0,
    )

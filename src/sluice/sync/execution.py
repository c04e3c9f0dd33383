"""One execution of a sync task on a worker: capture into the log, apply to the target.

Starting takes a new fencing epoch (`TaskStore.next_epoch`) and publishes an ephemeral status
znode (execution id, epoch, worker). If a status of another execution is still there, its
worker's session is alive although the task was given to us: a duplicate execution, recorded
as an alarm with both execution ids, both workers and the time window. The apply query runs
under our epoch, so once we commit, the other execution's commits are refused by the target;
when that happens to us (`StaleEpochError`), we were superseded: we stop and record it too.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from sluice.sync.tasks import TaskSpec, TaskStore, parse_duration

log = logging.getLogger("sluice.execution")


def ensure_topics(bootstrap: str, topics: list[str], partitions: int, replication: int | None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    existing = set(admin.list_topics(timeout=15).topics)
    missing = [t for t in topics if t not in existing]
    if not missing:
        return
    brokers = len(admin.list_topics(timeout=15).brokers)
    rf = replication or min(3, brokers)
    for future in admin.create_topics([NewTopic(t, partitions, rf) for t in missing]).values():
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
        spark: Any,
        workdir: Path,
    ) -> None:
        self.task_id = task_id
        self.store = store
        self.worker = worker
        self.bootstrap = bootstrap
        self.spark = spark
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
        self._consumer: Any = None
        self._start()

    # --- lifecycle -------------------------------------------------------------------------------
    def _start(self) -> None:
        self.stop_event = threading.Event()
        self.epoch = self.store.next_epoch(self.task_id)
        self.execution = uuid.uuid4().hex[:12]
        self.started = time.time()
        other = self.store.status(self.task_id)
        if other and other.get("execution") != self.execution and not other.get("paused"):
            self.store.raise_alarm(
                self.task_id,
                "duplicate-execution",
                {
                    "executions": [other.get("execution"), self.execution],
                    "workers": [other.get("worker"), self.worker],
                    "epochs": [other.get("epoch"), self.epoch],
                    "window": [other.get("started"), self.started],
                    "detail": "the previous execution's worker still holds its session; "
                    "its commits are refused from our first commit on",
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
            self.bootstrap, spec.topics(), int(opts.get("partitions", 3)), opts.get("replication_factor")
        )
        self._start_capture()
        self._start_apply()

    def _start_capture(self) -> None:
        spec = self.spec
        if spec.source.kind in ("mysql", "mariadb"):
            from sluice.sync.sources.mysql import MySqlCapture, recover_position

            start = self.control.from_position or recover_position(self.bootstrap, spec.topics())
            self.capture = MySqlCapture(
                spec.source, spec.tables, spec.topic_for, self.bootstrap, name=spec.id, epoch=self.epoch,
                execution=self.execution, start=start, stop=self.stop_event,
            )  # fmt: skip
            target = self.capture.run
        else:
            from sluice.sync.sources.generator import GeneratorConfig, run_generator

            src = spec.source
            config = GeneratorConfig(
                topic=spec.topic.replace("{task}", spec.id), rate=src.rate, skew=src.skew, seed=src.seed,
                duration_s=None, name=spec.id, start_pos=_next_generator_pos(self.bootstrap, spec.topics()),
            )  # fmt: skip

            def target() -> None:
                run_generator(self.bootstrap, config, stop=self.stop_event)

        def run() -> None:
            try:
                target()
            except Exception as exc:
                self.error = f"capture failed: {exc}"
                log.error("task %s: %s", self.task_id, self.error)

        self.capture_thread = threading.Thread(target=run, name=f"capture-{spec.id}", daemon=True)
        self.capture_thread.start()

    def _start_apply(self) -> None:
        from sluice.pipeline.apply import ApplyConfig, ApplyQuery
        from sluice.sync.targets import ColumnMapping

        spec = self.spec
        seconds = parse_duration(str(spec.options.get("trigger", "1s")))
        self.query = ApplyQuery(
            self.spark,
            ApplyConfig(
                bootstrap=self.bootstrap, target=spec.target, topics=spec.topics(), pipeline=spec.id,
                epoch=self.epoch, checkpoint=self.workdir / spec.id / "checkpoint", trigger_s=seconds,
                mapping=ColumnMapping.from_config(spec.mapping),
                max_records_per_trigger=spec.options.get("max_records_per_trigger"),
            ),
        )  # fmt: skip
        self.query.start()

    def stop(self) -> None:
        self.stop_event.set()
        if self.query is not None:
            self.query.stop()
            self.query = None
        if self.capture_thread is not None:
            self.capture_thread.join(timeout=60)
            self.capture_thread = None
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def alive(self) -> bool:
        return self.error is None

    # --- each heartbeat --------------------------------------------------------------------------
    def tick(self) -> None:
        from sluice.sync.targets import StaleEpochError

        control = self.store.control(self.task_id)
        if control.paused != self.control.paused or control.restarts != self.control.restarts:
            log.info("task %s: control changed (%s), restarting the execution", self.task_id, control)
            self.stop()
            self.control = control
            self.error = None
            self._start()
            return
        newest = self.store.epoch(self.task_id)
        if newest > self.epoch and not self.error:
            newer = self.store.status(self.task_id) or {}
            if newer.get("execution") not in (None, self.execution):
                # A newer execution started elsewhere (we were paused, or cut off): step down
                # before our next commit is refused.
                self._step_down(newer, f"epoch {newest} was taken after ours ({self.epoch})")
                return
        if self.query is not None and isinstance(self.query.error, StaleEpochError):
            self._step_down(self.store.status(self.task_id) or {}, str(self.query.error))
            return
        self._publish(self._progress())

    def _step_down(self, newer: dict[str, Any], detail: str) -> None:
        """A newer execution owns the task: record the `superseded` alarm and stop."""
        self.store.raise_alarm(
            self.task_id,
            "superseded",
            {
                "executions": [self.execution, newer.get("execution")],
                "workers": [self.worker, newer.get("worker")],
                "epochs": [self.epoch, newer.get("epoch")],
                "window": [self.started, time.time()],
                "detail": detail,
            },
        )
        log.warning("task %s: execution %s superseded: %s", self.task_id, self.execution, detail)
        self.error = "superseded by a newer execution"
        self.stop()

    def _publish(self, extra: dict[str, Any]) -> None:
        status = {
            "execution": self.execution, "epoch": self.epoch, "worker": self.worker, "started": self.started,
            "paused": self.control.paused, "updated": time.time(), "error": self.error, **extra,
        }  # fmt: skip
        current = self.store.status(self.task_id)
        if (
            current is not None
            and current.get("execution") not in (None, self.execution)
            and current.get("epoch", 0) > self.epoch
        ):
            return  # a newer execution owns the status
        self.store.publish_status(self.task_id, status)

    def _progress(self) -> dict[str, Any]:
        from confluent_kafka import Consumer, TopicPartition

        out: dict[str, Any] = {}
        if self.capture is not None:
            out["captured_position"] = self.capture.stats.position
        if self.query is None:
            return out
        applied = self.query.target.applied_offsets(self.spec.id)
        out["applied_offsets"] = {f"{t}[{p}]": o for (t, p), o in sorted(applied.items())}
        if self._consumer is None:
            self._consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "sluice-status",
                                       "enable.auto.commit": False, "log_level": 0})  # fmt: skip
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
                            ts = msg.timestamp()[1]
                            oldest = ts if oldest is None else min(oldest, ts)
        except Exception as exc:  # the log is failing over: report what we have
            out["lag_error"] = str(exc)
        out["lag_records"] = lag
        out["lag_seconds"] = 0.0 if oldest is None else round(max(0.0, time.time() - oldest / 1000), 1)
        return out


def _next_generator_pos(bootstrap: str, topics: list[str]) -> int:
    """One past the highest source position in the topics' last records (1 when empty)."""
    from sluice.sync.sources import last_envelopes

    return 1 + max(
        (int(doc.get("source", {}).get("pos", 0)) for doc in last_envelopes(bootstrap, topics)), default=0
    )

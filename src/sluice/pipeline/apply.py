"""Apply topics to a target: a Structured Streaming query over the `sluice` source whose
micro-batches are each applied in one target transaction (`Target.apply`). With PostgreSQL each
read task stages its collapsed changes in the target and returns a summary, and the driver
commits the batch from the summaries (`Target.apply_staged`, sync/targets/staging.py): no row
passes through the driver.

Exactly-once in effect comes from the target, not from Spark: the target stores the next offset
per partition in the same transaction as the rows, so a micro-batch Spark replays after a crash
(its commit log lags the target by at most one batch) is recognised and skipped, and the version
guard keeps any row from going back to an older source position. The fencing epoch is taken when
the query starts (`Target.claim`); a commit after a newer execution has claimed the pipeline is
rolled back and the query stops with `StaleEpochError`.

The target's offsets are the position of record and the Spark checkpoint a cache of it: with no
checkpoint the query starts from the target's offsets, and a checkpoint that is ahead of the
target (the target was restored from a backup, say) is removed on start
(`reconcile_checkpoint`), since resuming from it would skip records the target never got.

The query reads the log through Sluice's own source (`source_format="sluice"`, the default:
pipeline/source.py) or through Spark's own Kafka source (`source_format="kafka"`,
spark-sql-kafka-0-10, in a session started with `spark_session(kafka_connector=True)`). Both get
the same starting offsets from the target (the Kafka source's `startingOffsets` JSON names every
partition it reads: stored offset, or -2 for earliest), both keep only committed records
(read_committed), and both hand `_apply_batch` the same columns: with the Kafka source the
envelopes are parsed and collapsed in the executors by `mapInArrow(map_to_changes)`, as the
sluice source's `decode=envelope` does. Only the sluice source can end micro-batches on source
transaction boundaries (`transaction_topic`).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sluice import test_switches
from sluice.security.client import PLAINTEXT, ClientSecurity
from sluice.security.secrets import Secret
from sluice.sync.dead_letters import DeadLetter, DeadLetterWriter
from sluice.sync.targets import ApplyResult, ColumnMapping, Target, open_target

log = logging.getLogger("sluice.apply")


@dataclass
class ApplyConfig:
    bootstrap: str
    target: str
    topics: list[str] | None = None
    pattern: str | None = None
    pipeline: str | None = None
    epoch: int | None = None
    checkpoint: Path | None = None
    trigger_s: float = 1.0
    available_now: bool = False
    max_records_per_trigger: int | None = None
    max_records_per_partition: int | None = None
    #: the sluice source's minRecordsPerPartition: smaller ranges share a task
    min_records_per_partition: int | None = None
    mapping: ColumnMapping = field(default_factory=ColumnMapping)
    starting_offsets: str | None = None
    #: the source tables this pipeline applies; records of any other table fail the batch
    #: (None: any table that is not one of Sluice's own)
    tables: list[str] | None = None
    #: the target's password, resolved by the worker (prints as ***; the URL holds none)
    target_password: Secret | None = None
    #: the process's test switches (all off outside tests: `test_switches.for_process`)
    switches: test_switches.Switches = test_switches.OFF
    #: how the query's reads (driver and executors) authenticate to the brokers
    security: ClientSecurity = PLAINTEXT
    #: a change the target refuses: "stop" fails the batch; "dlq" produces it to
    #: `dead_letter_topic` and commits the rest (sync.dead_letters), under this execution id
    on_refused: str = "stop"
    dead_letter_topic: str | None = None
    execution: str = ""
    #: the task's schema_change_policy: evolve, ignore or stop (sync/targets/evolution.py)
    schema_change_policy: str = "evolve"
    #: a Delta target's compaction: OPTIMIZE every this many batches (None: the target's default)
    optimize_every: int | None = None
    #: the capture's transactions topic: each micro-batch ends on a source transaction boundary
    #: in every partition (the source's option transactionTopic), so the target, committing a
    #: batch in one transaction, never shows part of a source transaction. None: batches end
    #: wherever the log does (the generator's topics have no transactions)
    transaction_topic: str | None = None
    #: which Spark source reads the log: "sluice" (Sluice's own Python Data Source) or "kafka"
    #: (Spark's spark-sql-kafka-0-10; the session must have the connector)
    source_format: str = "sluice"
    #: the records' envelope: "sluice" (Sluice's capture) or "debezium" (Debezium's MySQL
    #: connector in Kafka Connect, JSON converter; sync/debezium.py, deploy/debezium/)
    envelope: str = "sluice"

    def pipeline_name(self) -> str:
        if self.pipeline:
            return self.pipeline
        return "apply:" + (",".join(sorted(self.topics or [])) if self.topics else f"/{self.pattern}/")


@dataclass
class BatchReport:
    batch_id: int
    result: ApplyResult
    committed_at: float
    freshness_ms: list[int]  # commit time minus each applied record's source timestamp
    took_s: float  # the whole batch function
    collect_s: float  # reading the batch from Spark into the driver as Arrow
    commit_s: float  # the target's transaction (Target.apply)
    #: bytes of the batch's result the driver received and held (the Arrow table `toArrow` built)
    result_bytes: int = 0


class ApplyQuery:
    """One apply query. `start()` starts the stream; `stop()` ends it (waiting for the commit in
    flight, and with `batch_wait_s` for the micro-batch in flight). The pipeline is claimed,
    under a new or given fencing epoch, when it is built."""

    def __init__(
        self,
        spark: Any,
        config: ApplyConfig,
        *,
        on_batch: Callable[[BatchReport], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        on_dead_letters: Callable[[list[DeadLetter]], None] | None = None,
        keep_freshness: bool = False,
    ) -> None:
        if not config.topics and not config.pattern:
            raise ValueError("give topics or a topic pattern to apply")
        check_source_format(config)
        if config.envelope not in ("sluice", "debezium"):
            raise ValueError(f"envelope must be sluice or debezium, not {config.envelope!r}")
        self.spark = spark
        self.config = config
        self.on_batch = on_batch
        self.on_error = on_error  # called on the batch thread when a commit fails
        self.keep_freshness = keep_freshness
        self.pipeline = config.pipeline_name()
        # after each commit that dead-lettered changes (the execution's alarm and metric)
        self.on_dead_letters = on_dead_letters
        self.dead_letters = dead_letter_writer(config, self.pipeline)
        self.target: Target = open_target(
            config.target,
            config.mapping,
            tables=config.tables,
            password=config.target_password,
            switches=config.switches,
            schema_change_policy=config.schema_change_policy,
            **({"optimize_every": config.optimize_every} if config.optimize_every else {}),
        )
        self.epoch = self.target.claim(self.pipeline, config.epoch)
        #: where the read tasks stage the changes, once started (a target that stages in
        #: executors), else None: the batch's changes come to the driver
        self.staging: Any = None
        self.query: Any = None
        self.error: BaseException | None = None
        self.batches = 0
        self.applied_records = 0
        self.notes: list[str] = []
        self._lock = threading.Lock()
        #: under _lock: whether a micro-batch is in `_apply_batch`, and whether `stop` began
        self._batch_state = threading.Condition(self._lock)
        self._in_batch = False
        self._stopping = False

    def _starting_offsets(self) -> str:
        if self.config.starting_offsets:
            return self.config.starting_offsets
        stored = self.target.applied_offsets(self.pipeline)
        if self.config.source_format == "kafka":
            return kafka_starting_offsets(stored, self._partitions())
        if not stored:
            return "earliest"
        doc: dict[str, dict[str, int]] = {}
        for (t, p), o in sorted(stored.items()):
            doc.setdefault(t, {})[str(p)] = o
        return orjson.dumps(doc).decode()

    def _partitions(self) -> list[tuple[str, int]]:
        """The topic-partitions the query reads now (the brokers' metadata)."""
        from sluice.pipeline.source import _LogView

        c = self.config
        options = {"bootstrap.servers": c.bootstrap, **c.security.properties()}
        options.update(
            {"subscribe": ",".join(c.topics)} if c.topics else {"subscribePattern": c.pattern or ""}
        )
        view = _LogView(options)
        try:
            return view.partitions()
        finally:
            view.close()

    def reconcile_checkpoint(self) -> str | None:
        """Remove the Spark checkpoint if it committed batches the target does not have (the
        query keeps no state in it, so resuming from the target's offsets loses nothing)."""
        ckpt = self.config.checkpoint
        if ckpt is None or not (ckpt / "commits").is_dir():
            return None
        committed = sorted(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())
        if not committed:
            return None
        stored = self.target.applied_offsets(self.pipeline)
        try:
            lines = (ckpt / "offsets" / str(committed[-1])).read_text().splitlines()
            spark_offsets = {
                (t, int(p)): int(o) for t, parts in orjson.loads(lines[2]).items() for p, o in parts.items()
            }
        except (OSError, IndexError, ValueError, AttributeError):
            spark_offsets = None  # unreadable: trust the target
        if spark_offsets is not None and all(stored.get(tp, 0) >= o for tp, o in spark_offsets.items()):
            return None
        shutil.rmtree(ckpt)
        note = (
            f"checkpoint {ckpt} is ahead of the target (its batch {committed[-1]} is not in the "
            f"target's offsets); removed it, resuming from the target's offsets"
        )
        self.notes.append(note)
        return note

    def _apply_batch(self, df: Any, batch_id: int) -> None:
        """foreachBatch: commit one micro-batch to the target in one transaction. A target the
        executors can stage in (PostgreSQL) gets the rows from them and the driver only their
        summaries (`_stage_and_commit`); any other target gets the batch from the driver. Once
        `stop` has begun, a batch commits nothing (`stop`)."""
        with self._batch_state:
            if self._stopping:
                log.info("event=batch_not_applied_at_stop pipeline=%s batch=%d", self.pipeline, batch_id)
                return
            self._in_batch = True
        try:
            self._apply_one(df, batch_id)
        finally:
            with self._batch_state:
                self._in_batch = False
                self._batch_state.notify_all()

    def _apply_one(self, df: Any, batch_id: int) -> None:
        t0 = time.monotonic()
        sink = None
        if self.dead_letters is not None:
            sink = self.dead_letters.sink(self.pipeline, self.epoch, self.config.execution)
        try:
            if self.staging is not None:
                result, collected, held, stamps = self._stage_and_commit(df, batch_id, sink)
            else:
                records = df.toArrow()
                collected = time.monotonic()
                held, stamps = records.nbytes, records
                result = self.target.apply(self.pipeline, self.epoch, records, on_refused=sink)
            commit_s = time.monotonic() - collected
        except BaseException as exc:
            self.error = exc
            if self.on_error is not None:
                try:
                    self.on_error(exc)
                except Exception:  # reporting must not hide the error itself
                    log.exception("reporting a failed commit failed")
            raise
        committed = time.time()
        freshness: list[int] = []
        if self.keep_freshness:
            freshness = freshness_ms(stamps, int(committed * 1000))
        with self._lock:
            self.batches += 1
            self.applied_records += result.records - result.skipped
        if sink is not None and sink.letters and self.on_dead_letters is not None:
            try:
                self.on_dead_letters(sink.letters)
            except Exception:  # the batch is committed, its dead letters are in their topic
                log.exception("reporting dead letters failed")
        if self.on_batch is not None:
            self.on_batch(
                BatchReport(
                    batch_id,
                    result,
                    committed,
                    freshness,
                    time.monotonic() - t0,
                    collected - t0,
                    commit_s,
                    result_bytes=held,
                )
            )

    def _stage_and_commit(self, df: Any, batch_id: int, sink: Any) -> tuple[ApplyResult, float, int, Any]:
        """The read tasks have COPYed the batch's changes into the execution's staging table;
        the driver collects their summaries (a few rows per task) and commits
        (sync/targets/staging.py). Returns the result, when the summaries arrived, their bytes,
        and the summaries."""
        summaries = df.toArrow()
        collected = time.monotonic()
        test_switches.crash_point(self.config.switches, "after-staging")
        result = self.target.apply_staged(self.pipeline, self.epoch, batch_id, summaries, on_refused=sink)
        return result, collected, summaries.nbytes, summaries

    def start(self) -> None:
        c = self.config
        self.reconcile_checkpoint()
        if self.target.stages_in_executors:
            from sluice.sync.targets.staging import StageSpec

            table = self.target.prepare_staging(self.pipeline, self.epoch)
            password = c.target_password
            self.staging = StageSpec(c.target, table, None if password is None else password.reveal())
        records = self._kafka_records() if c.source_format == "kafka" else self._sluice_records()
        writer = records.writeStream.foreachBatch(self._apply_batch).queryName(
            self.pipeline.replace(":", "_").replace("/", "_").replace(",", "_")
        )
        if c.checkpoint is not None:
            writer = writer.option("checkpointLocation", str(c.checkpoint))
        if c.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{int(c.trigger_s * 1000)} milliseconds")
        self.query = writer.start()

    def _kafka_records(self) -> Any:
        """The changes to apply, read by Spark's own Kafka source: one Spark partition per
        topic-partition, parsed and collapsed there (CHANGES_SCHEMA, as `decode=envelope`)."""
        from sluice.pipeline.source import CHANGES_SCHEMA
        from sluice.sync.changes import map_to_changes

        c = self.config
        reader = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", c.bootstrap)
            # only committed records, as the sluice source reads (Spark's default reads aborted
            # transactions' records too)
            .option("kafka.isolation.level", "read_committed")
            # a record deleted by retention before the query read it fails the query, as with
            # the sluice source's default
            .option("failOnDataLoss", "true")
        )
        reader = (
            reader.option("subscribe", ",".join(c.topics))
            if c.topics
            else reader.option("subscribePattern", c.pattern)
        )
        reader = reader.option("startingOffsets", self._starting_offsets())
        if c.max_records_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(c.max_records_per_trigger))
        records = reader.load().select("value", "topic", "partition", "offset", "timestamp")
        if self.staging is not None:  # parsed, collapsed and staged in one Python worker per task
            from sluice.sync.targets.staging import SUMMARY_DDL, map_and_stage

            return records.mapInArrow(map_and_stage(self.staging), SUMMARY_DDL)
        return records.mapInArrow(map_to_changes, CHANGES_SCHEMA)

    def _sluice_records(self) -> Any:
        c = self.config
        reader = self.spark.readStream.format("sluice").option("bootstrap.servers", c.bootstrap)
        # Executors authenticate with these too; Spark redacts the password in plans and the UI.
        reader = reader.options(**c.security.properties())
        reader = (
            reader.option("subscribe", ",".join(c.topics))
            if c.topics
            else reader.option("subscribePattern", c.pattern)
        )
        reader = reader.option("startingOffsets", self._starting_offsets())
        if c.max_records_per_trigger:
            reader = reader.option("maxRecordsPerTrigger", str(c.max_records_per_trigger))
        if c.max_records_per_partition:
            reader = reader.option("maxRecordsPerPartition", str(c.max_records_per_partition))
        if c.min_records_per_partition:
            reader = reader.option("minRecordsPerPartition", str(c.min_records_per_partition))
        # tasks of equal size, a multiple of the slots (source.even_tasks)
        reader = reader.option("taskSlots", str(self.spark.sparkContext.defaultParallelism))
        if c.transaction_topic:
            reader = reader.option("transactionTopic", c.transaction_topic)
        # Envelopes are parsed and collapsed in the executors, one task per input partition; the
        # driver gets the newest change per row with the columns applying needs (sync.changes).
        reader = reader.option("decode", "debezium" if c.envelope == "debezium" else "envelope")
        if self.staging is not None:  # and staged there: the driver gets each task's summary
            reader = reader.options(**self.staging.options())
        return reader.load()

    def failure(self) -> BaseException | None:
        """Why the running query ended, or None while it runs (or was never started)."""
        if self.error is not None:
            return self.error
        if self.query is None:
            return None
        try:
            if self.query.isActive:
                return None
            exc = self.query.exception()
        except Exception as raised:  # the driver JVM went away (killed, out of memory)
            return raised
        return exc if exc is not None else RuntimeError("the apply query stopped")

    def finished(self) -> bool:
        """Whether the query ended by itself without an error (an `available_now` query that
        applied what the log held)."""
        if self.error is not None or self.query is None:
            return False
        try:
            return not self.query.isActive and self.query.exception() is None
        except Exception:  # the driver JVM went away
            return False

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for the query to end (True) or the timeout (False). A failed commit ends the
        query and is raised here as itself (StaleEpochError, BadEventError, ...)."""
        try:
            if timeout_s is None:
                self.query.awaitTermination()
                return True
            return bool(self.query.awaitTermination(timeout_s))
        except Exception:
            if self.error is not None:
                raise self.error from None
            raise

    def stop(self, batch_wait_s: float = 0.0) -> None:
        """Stop the query, waiting for the commit in flight. A micro-batch that begins from now
        on commits nothing: the next start reads its records again, from the target's offsets
        (the checkpoint ahead of them is removed then: `reconcile_checkpoint`). With
        ``batch_wait_s``, the batch in flight gets that long to end first: stopping the query
        cancels its Spark job otherwise, which fails the batch (py4j logs its traceback, Spark
        the query's error)."""
        with self._batch_state:
            self._stopping = True
            self._batch_state.wait_for(lambda: not self._in_batch, timeout=batch_wait_s)
        if self.query is not None:
            try:
                self.query.stop()
            except Exception:
                pass  # it failed or stopped already
        if self.dead_letters is not None:
            self.dead_letters.close()
        if self.staging is not None:
            try:
                self.target.drop_staging(self.pipeline, self.epoch)
            except Exception:  # the next execution's start drops it
                log.warning(
                    "event=staging_left pipeline=%s epoch=%d", self.pipeline, self.epoch, exc_info=True
                )
        self.target.close()


SOURCE_FORMATS = ("sluice", "kafka")


def check_source_format(config: ApplyConfig) -> None:
    """Refuse a source format, or a setting of the query, that the source cannot honour."""
    if config.source_format not in SOURCE_FORMATS:
        raise ValueError(
            f"source format must be one of {', '.join(SOURCE_FORMATS)}, not {config.source_format!r}"
        )
    if config.source_format != "kafka":
        return
    if config.transaction_topic:
        raise ValueError(
            "the kafka source format cannot end micro-batches on source transaction boundaries "
            "(transaction_topic): a batch could commit part of a source transaction to the target; "
            "use the sluice source format for this pipeline"
        )
    if config.security.protocol != "PLAINTEXT":
        raise ValueError(
            f"the kafka source format reads over PLAINTEXT only for now (security.protocol="
            f"{config.security.protocol}): use the sluice source format with secured brokers"
        )
    if config.envelope != "sluice":
        raise ValueError(
            f"the kafka source format parses Sluice's envelope only (envelope={config.envelope}): "
            "use the sluice source format for Debezium's change events"
        )
    if config.max_records_per_partition or config.min_records_per_partition:
        raise ValueError(
            "max_records_per_partition and min_records_per_partition shape the sluice source's "
            "tasks; the kafka source format reads one Spark partition per topic-partition: leave "
            "them unset"
        )


def kafka_starting_offsets(stored: dict[tuple[str, int], int], partitions: list[tuple[str, int]]) -> str:
    """Spark's Kafka source's `startingOffsets` for a query resuming from the target's offsets.

    Spark's Kafka source refuses specific offsets that do not name every partition it reads
    ("you must specify all TopicPartitions"), nor names one it does not read: each partition read
    now gets its stored next offset, or -2 (earliest) when the target has none for it."""
    doc: dict[str, dict[str, int]] = {}
    for t, p in sorted(partitions):
        doc.setdefault(t, {})[str(p)] = stored.get((t, p), -2)
    if not doc:
        return "earliest"  # nothing matches yet (a pattern): Spark finds the topics later
    return orjson.dumps(doc).decode()


def freshness_ms(batch: Any, committed_ms: int) -> list[int]:
    """Commit time minus the source timestamp of each change of a batch: from the changes
    themselves (the driver held them), or from the executors' histograms (staged)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not batch.num_rows:
        return []
    if "ts_bucket_ms" in batch.column_names:
        from sluice.sync.targets import staging

        return staging.freshness_ms(batch, committed_ms)
    ms = pc.cast(pc.cast(batch["timestamp"], pa.timestamp("ms", tz="UTC")), pa.int64())
    return list(pc.subtract(committed_ms, ms).to_pylist())


def dead_letter_writer(config: ApplyConfig, pipeline: str) -> DeadLetterWriter | None:
    """The producer of the query's dead letters (`on_refused: dlq`), or None (`stop`)."""
    if config.on_refused == "stop":
        return None
    if config.on_refused != "dlq" or not config.dead_letter_topic:
        raise ValueError(
            f"on_refused must be stop, or dlq with a dead-letter topic, not {config.on_refused!r}"
        )
    return DeadLetterWriter(
        config.bootstrap, config.dead_letter_topic, pipeline, config.security.confluent_config()
    )

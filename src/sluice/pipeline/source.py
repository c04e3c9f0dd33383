"""The log as a PySpark Python Data Source: `spark.readStream.format("sluice")`, and
`spark.read.format("sluice")` for batch jobs.

Rows carry the log's coordinates and raw bytes (key, value, topic, partition, offset,
timestamp), as Spark's Kafka source does; what they mean is left to the query.

Options
    bootstrap.servers       Sluice brokers (`kafka.bootstrap.servers` is accepted too)
    subscribe               comma-separated topics, or
    subscribePattern        a regular expression over topic names
    startingOffsets         earliest (default) | latest | {"topic": {"0": 42, ...}}
    endingOffsets           batch reads only: latest (default) | {"topic": {"0": 99}}
    maxRecordsPerTrigger    read limit per micro-batch (default: everything available)
    maxRecordsPerPartition  a topic-partition range larger than this is split (default 200000)
    minRecordsPerPartition  ranges smaller than this are read together, one after the other, by
                            one task holding about this many records (default 20000; at most
                            maxRecordsPerPartition): a small micro-batch is then one task, one
                            Python worker and one wave of the job, not one task per partition
    taskSlots               the task slots the query runs on (the apply query passes Spark's
                            default parallelism): each batch is cut into tasks of equal size, a
                            multiple of this many of at most maxRecordsPerPartition records, or
                            fewer (down to one) of at least minRecordsPerPartition; no slot then
                            idles while a last task runs alone (default: one task per range)
    failOnDataLoss          true (default): fail when the next offset was already deleted by
                            retention (when the query plans a batch, or while an executor reads
                            it); false: skip ahead to the log start and go on
    security.protocol, sasl.mechanism, sasl.username, sasl.password, ssl.ca.location
                            Kafka's client keys (`kafka.`-prefixed accepted too): how the
                            driver and every executor authenticate to the brokers. Spark
                            redacts option values whose key says "password" in plans and the
                            UI (spark.redaction.regex); Sluice never logs them
    stage.url, stage.table, stage.password
                            with decode: each task COPYs its collapsed changes into this
                            PostgreSQL table under a token of its own and returns its summary
                            rows (sync/targets/staging.py SUMMARY_DDL) instead of the changes,
                            so no change passes through the driver (the apply query sets these)
    decode                  none (default): raw records | envelope: each input partition parses
                            the change envelopes (sluice.sync.changes) and returns the newest
                            change per row, with the columns of CHANGE_SCHEMA; parsing and
                            collapsing then happen in the executors, in parallel |
                            debezium: the same, from Debezium MySQL connector records (JSON
                            converter, schemas.enable true or false), each translated to
                            Sluice's envelope first (sluice.sync.debezium)
    transactionTopic        streams only: a capture's transactions topic (`{task}.transactions`,
                            sync/sources/transactions.py). Each micro-batch then ends at a cut
                            read from it, a transaction boundary in every partition: the newest
                            cut (with maxRecordsPerTrigger, the newest within the limit, and at
                            least one, so a transaction larger than the limit is still read
                            whole), never beyond the high watermark, never below the batch's
                            start. Until the first cut the batches are empty; a restarted query
                            finds the newest cut at the topic's tail. A partition no cut names
                            is not read. A source transaction and the events of one DDL
                            statement (with a table it reads again) are each one group, so each
                            lands in one micro-batch, whole; the initial snapshot is cut in
                            steps of the task's snapshot_chunk_rows

Offsets are `{"topic": {"partition": next_offset}}`, built in sorted order so the same position
always serialises to the same JSON. Only committed records are read, in both of Kafka's senses:
every client of the source is read_committed, so "latest" is each partition's last stable
offset (below the high watermark and below every open transaction), and the reads skip the
transaction markers (control batches) and the records of aborted transactions. A range's last
offsets may be such records: a read ends where the consumer's position passes the range's end,
not at a record of its own.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.clients import close_within

if TYPE_CHECKING:
    from sluice.sync.targets.staging import StageSpec

SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
    ]
)
CHANGES_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("table", StringType()),
        StructField("key", StringType()),
        StructField("pos", LongType()),
        StructField("op", StringType()),
        StructField("after", StringType()),
        StructField("records", IntegerType()),
        StructField("binary", StringType()),
        StructField("types", StringType()),
    ]
)
DEFAULT_SPLIT = 200_000
DEFAULT_PACK = 20_000
BATCH_ROWS = 32_768
STALL_TIMEOUT_S = 120.0

Offsets = dict[str, dict[str, int]]

log = logging.getLogger("sluice.source")


class SluiceSourceError(RuntimeError):
    pass


class Range(InputPartition):
    """One Spark task's share: offsets [start, end) of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class Ranges(InputPartition):
    """One Spark task's share made of small ranges, read one after the other (`pack_ranges`)."""

    def __init__(self, ranges: Sequence[Range]) -> None:
        super().__init__(tuple(r.value for r in ranges))
        self.ranges = tuple(ranges)


def one_task(share: Sequence[Range]) -> InputPartition:
    """The input partition of one task reading `share`: its range, or its ranges in turn."""
    return share[0] if len(share) == 1 else Ranges(share)


def task_ranges(part: InputPartition) -> tuple[Range, ...]:
    """The ranges one task reads."""
    if isinstance(part, Ranges):
        return part.ranges
    if isinstance(part, Range):
        return (part,)
    raise TypeError(f"not an input partition of the sluice source: {part!r}")


class SluiceDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sluice"

    def schema(self) -> StructType | str:
        options = dict(self.options)
        if _stage_spec(options) is not None:
            from sluice.sync.targets.staging import SUMMARY_DDL

            return SUMMARY_DDL
        return CHANGES_SCHEMA if _decode(options) else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return SluiceBatchReader(dict(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return SluiceStreamReader(dict(self.options), schema)


# --- options -----------------------------------------------------------------------------------


def _opt(options: dict[str, str], name: str, default: str | None = None) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    return lowered.get(name.lower(), default)


def _bootstrap(options: dict[str, str]) -> str:
    servers = _opt(options, "bootstrap.servers") or _opt(options, "kafka.bootstrap.servers")
    if not servers:
        raise SluiceSourceError('the sluice source needs option "bootstrap.servers" (host:port,...)')
    return servers


def _client_config(options: dict[str, str]) -> dict[str, str]:
    """confluent-kafka's security keys from the client keys among the options."""
    from sluice.properties import ConfigError
    from sluice.security.client import CLIENT_KEYS, ClientSecurity

    values = {}
    for key in CLIENT_KEYS:
        value = _opt(options, key) or _opt(options, f"kafka.{key}")
        if value:
            values[key] = value
    try:
        return ClientSecurity.from_properties(values).confluent_config()
    except ConfigError as exc:
        raise SluiceSourceError(str(exc)) from None


def _stage_spec(options: dict[str, str]) -> StageSpec | None:
    """Where the readers stage their changes (`stage.*` options), or None: they return them."""
    from sluice.sync.targets.staging import StageSpec

    try:
        spec = StageSpec.from_options(options)
    except ValueError as exc:
        raise SluiceSourceError(str(exc)) from None
    if spec is not None and not _decode(options):
        raise SluiceSourceError(
            "the stage.* options need decode=envelope or decode=debezium: only changes are staged"
        )
    return spec


def _decode(options: dict[str, str]) -> bool:
    return _decode_mode(options) != "none"


def _decode_mode(options: dict[str, str]) -> str:
    raw = (_opt(options, "decode", "none") or "none").lower()
    if raw not in ("none", "envelope", "debezium"):
        raise SluiceSourceError(f"option decode must be none, envelope or debezium, not {raw!r}")
    return raw


def _fail_on_data_loss(options: dict[str, str]) -> bool:
    raw = (_opt(options, "failOnDataLoss", "true") or "true").lower()
    if raw not in ("true", "false"):
        raise SluiceSourceError(f"option failOnDataLoss must be true or false, not {raw!r}")
    return raw == "true"


def data_lost(topic: str, partition: int, next_offset: int, log_start: int) -> str:
    return (
        f"{topic}[{partition}]: offsets {next_offset}..{log_start - 1} were deleted by retention before "
        f"this query read them (the log now starts at {log_start}); those records are lost to this "
        f"query. Set failOnDataLoss=false to skip ahead to the log start."
    )


def _int_opt(options: dict[str, str], name: str, default: int | None) -> int | None:
    raw = _opt(options, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SluiceSourceError(f"option {name} must be a positive integer, not {raw!r}") from None
    if value <= 0:
        raise SluiceSourceError(f"option {name} must be a positive integer, not {raw!r}")
    return value


def _parse_offsets_option(name: str, raw: str) -> Offsets:
    import orjson

    try:
        doc = orjson.loads(raw)
        out = {str(t): {str(int(p)): int(o) for p, o in parts.items()} for t, parts in doc.items()}
    except Exception:
        raise SluiceSourceError(
            f'option {name} must be earliest, latest or JSON like {{"topic": {{"0": 42}}}}, not {raw!r}'
        ) from None
    return out


def _sorted_offsets(pairs: dict[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (topic, partition), offset in sorted(pairs.items()):
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def _flat(offsets: Offsets) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class _DriverClient:
    """A consumer of the driver's, made when first used and never pickled with its owner."""

    #: the consumer's group id and its settings beyond the common ones
    GROUP = ""
    SETTINGS: dict[str, Any] = {}

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.bootstrap = _bootstrap(options)
        self._consumer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None
        return state

    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": self.GROUP,
                    "enable.auto.commit": False,
                    # Latest offsets are the last stable offsets: a plan never ends inside an
                    # open transaction (librdkafka's default too; said here because it matters).
                    "isolation.level": "read_committed",
                    # Leaders move when a broker dies: look again soon rather than in 5 minutes.
                    "topic.metadata.refresh.interval.ms": 2000,
                    "log_level": 0,
                    **self.SETTINGS,
                    **_client_config(self.options),
                }
            )
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            close_within(self._consumer)
            self._consumer = None


class _LogView(_DriverClient):
    """Driver-side view of the log: which partitions match, and their offsets."""

    GROUP = "sluice-spark-planner"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        subscribe = _opt(options, "subscribe")
        pattern = _opt(options, "subscribePattern")
        if bool(subscribe) == bool(pattern):
            raise SluiceSourceError('give exactly one of the options "subscribe" and "subscribePattern"')
        self.topics = [t.strip() for t in subscribe.split(",") if t.strip()] if subscribe else None
        self.pattern = re.compile(pattern) if pattern else None

    def partitions(self) -> list[tuple[str, int]]:
        meta = self.consumer().list_topics(timeout=30)
        out: list[tuple[str, int]] = []
        for name, topic in meta.topics.items():
            if name.startswith("__"):
                continue
            if self.topics is not None and name not in self.topics:
                continue
            if self.pattern is not None and not self.pattern.fullmatch(name):
                continue
            if topic.error is not None:
                continue
            out.extend((name, p) for p in topic.partitions)
        if self.topics is not None:
            missing = set(self.topics) - {t for t, _ in out}
            if missing:
                raise SluiceSourceError(
                    f"topic(s) not found on {self.bootstrap}: {', '.join(sorted(missing))}"
                )
        return sorted(out)

    def watermarks(self, tps: Sequence[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        from confluent_kafka import TopicPartition

        c = self.consumer()
        out = {}
        for topic, partition in tps:
            deadline = time.monotonic() + 60
            while True:
                try:
                    low, high = c.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=2, cached=False
                    )
                    break
                except Exception as exc:  # leader moving: retry for a while
                    if time.monotonic() > deadline:
                        raise SluiceSourceError(
                            f"cannot read the offsets of {topic}[{partition}]: {exc}"
                        ) from exc
                    time.sleep(0.2)
            out[(topic, partition)] = (int(low), int(high))
        return out

    def resolve(self, spec: str | None, default: str) -> Offsets:
        spec = spec or default
        tps = self.partitions()
        if spec in ("earliest", "latest"):
            marks = self.watermarks(tps)
            return _sorted_offsets({tp: marks[tp][0 if spec == "earliest" else 1] for tp in tps})
        given = _flat(_parse_offsets_option("startingOffsets/endingOffsets", spec))
        marks = self.watermarks(tps)
        return _sorted_offsets({tp: given.get(tp, marks[tp][0]) for tp in tps})


def plan_ranges(
    start: Offsets, end: Offsets, split: int, pack: int = 0, slots: int = 0
) -> list[InputPartition]:
    """Input partitions for [start, end). With `slots` (the task slots the query runs on):
    `even_tasks`. Otherwise one per topic-partition, split every `split` records, and with
    `pack`, ranges smaller than min(pack, split) records share tasks (`pack_ranges`)."""
    begin = _flat(start)
    whole = [
        Range(topic, partition, begin.get((topic, partition), 0), stop)
        for (topic, partition), stop in sorted(_flat(end).items())
        if begin.get((topic, partition), 0) < stop
    ]
    if slots:
        return even_tasks(whole, split, pack, slots)
    out: list[Range] = []
    for r in whole:
        for offset in range(r.start, r.end, split):
            out.append(Range(r.topic, r.partition, offset, min(r.end, offset + split)))
    return pack_ranges(out, min(pack, split)) if pack else list(out)


def even_tasks(ranges: Sequence[Range], split: int, pack: int, slots: int) -> list[InputPartition]:
    """The batch's records (`ranges` one after the other) cut into tasks of equal size: as
    many as a multiple of `slots` holding at most `split` records each, or fewer, down to one,
    when that would make tasks of fewer than `pack` records. Three partitions on two slots are
    then two or four tasks, not three of which one runs alone while the other slot idles; a
    task may read the end of one partition and the start of the next."""
    total = sum(r.end - r.start for r in ranges)
    if not total:
        return []
    fewest = -(-total // split)  # tasks of at most `split` records
    n = slots * -(-fewest // slots)  # a multiple of the slots
    least = min(pack, split)
    if total < n * least:  # small tasks: fewer of them (a multiple of the slots if more)
        n = max(1, total // least)
        if n > slots:
            n -= n % slots
        n = max(n, fewest)
    out: list[InputPartition] = []
    queue = list(ranges)
    for i in range(n):
        want = (i + 1) * total // n - i * total // n
        share: list[Range] = []
        while want:
            r = queue[0]
            take = min(want, r.end - r.start)
            share.append(Range(r.topic, r.partition, r.start, r.start + take))
            want -= take
            if take == r.end - r.start:
                queue.pop(0)
            else:
                queue[0] = Range(r.topic, r.partition, r.start + take, r.end)
        out.append(one_task(share))
    return out


def pack_ranges(ranges: Sequence[Range], least: int) -> list[InputPartition]:
    """Ranges of `least` records or more stay a task each; smaller ones are gathered, in order,
    into tasks of at least `least` records (the last may hold fewer). A Spark task has a fixed
    cost (scheduling, a Python worker, a wave of the job when tasks outnumber slots) that a few
    thousand records do not repay."""
    out: list[InputPartition] = []
    share: list[Range] = []
    held = 0
    for r in ranges:
        if r.end - r.start >= least:
            out.append(r)
            continue
        share.append(r)
        held += r.end - r.start
        if held >= least:
            out.append(one_task(share))
            share, held = [], 0
    if share:
        out.append(one_task(share))
    return out


def limit_offsets(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Advance at most `max_rows` records in all, shared in proportion to what each partition has."""
    begin = _flat(start)
    avail = {tp: max(0, hi - begin.get(tp, 0)) for tp, hi in _flat(latest).items()}
    total = sum(avail.values())
    if total <= max_rows:
        return latest
    out = {}
    budget = max_rows
    for tp, n in sorted(avail.items()):
        share = min(n, max(1 if n else 0, n * max_rows // total), budget)
        budget -= share
        out[tp] = begin.get(tp, 0) + share
    return _sorted_offsets(out)


# --- readers ------------------------------------------------------------------------------------


def read_partition(options: dict[str, str], schema: StructType, part: InputPartition) -> Iterator[Any]:
    """What one Spark task returns for one input partition (runs in executors): its ranges,
    one after the other, each parsed and collapsed on its own with `decode`; with `stage.*`
    options, the task's staging summary instead (the changes go to the target from here,
    sync/targets/staging.py)."""
    spec = _stage_spec(options)
    batches = _read_ranges(options, schema, task_ranges(part), _decode(options))
    if spec is None:
        return batches
    from sluice.sync.targets.staging import stage_changes

    return stage_changes(spec)(batches)


def _read_ranges(
    options: dict[str, str], schema: StructType, ranges: Sequence[Range], decode: bool
) -> Iterator[Any]:
    for r in ranges:
        yield from read_changes(options, r) if decode else read_range(options, schema, r)


def read_changes(options: dict[str, str], part: Range) -> Iterator[Any]:
    """Offsets [start, end) of one partition, parsed as change envelopes and collapsed to the
    newest change per row as they arrive (no raw Arrow batch in between)."""
    from sluice.sync.changes import ChangeBuilder, no_cyclic_gc

    builder = ChangeBuilder(collapse=True)
    topic, partition = part.topic, part.partition
    add = builder.add
    debezium = _decode_mode(options) == "debezium"
    if debezium:
        from sluice.sync.debezium import to_envelope_bytes
    with no_cyclic_gc():
        for msgs in _consume_range(options, part):
            for m in msgs:
                value = m.value()
                if debezium:  # Debezium's record (key and value) as Sluice's envelope
                    value = to_envelope_bytes(m.key(), value, f"{topic}[{partition}]@{m.offset()}")
                    if value is None:  # a tombstone changes no row
                        continue
                add(value, topic, partition, m.offset(), m.timestamp()[1])
        batch = builder.batch() if len(builder) else None
    if batch is not None:
        yield batch


def _consume_range(options: dict[str, str], part: Range) -> Iterator[list[Any]]:
    """Lists of messages with offsets in [start, end) of one partition, in order.

    The consumer never jumps on its own (``auto.offset.reset=error``): when the next offset is
    gone, retention deleted it after the range was planned, and the read fails with a message
    saying which records are lost, or (``failOnDataLoss=false``) goes on from the log start.
    """
    from confluent_kafka import KafkaError, TopicPartition

    fail_on_data_loss = _fail_on_data_loss(options)
    consumer = _reader_consumer(_bootstrap(options), _client_config(options), part.topic)
    try:
        tp = TopicPartition(part.topic, part.partition, part.start)
        consumer.assign([tp])
        next_offset = part.start
        last_progress = time.monotonic()
        while next_offset < part.end:
            msgs = consumer.consume(num_messages=min(BATCH_ROWS, part.end - next_offset), timeout=1.0)
            if not msgs:
                # The rest of the range may hold no record to deliver (transaction markers,
                # aborted records): the consumer's position has passed them.
                position = consumer.position([tp])[0].offset
                if position > next_offset:
                    next_offset = position
                    last_progress = time.monotonic()
                    continue
                if time.monotonic() - last_progress > STALL_TIMEOUT_S:
                    raise SluiceSourceError(
                        f"no progress reading {part.topic}[{part.partition}] at offset {next_offset} "
                        f"(range {part.start}..{part.end}) for {STALL_TIMEOUT_S:.0f} s"
                    )
                continue
            last_progress = time.monotonic()
            good = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        next_offset = _skip_lost(consumer, part, next_offset, fail_on_data_loss, err)
                        break  # whatever else this call returned was fetched for the old position
                    raise SluiceSourceError(f"reading {part.topic}[{part.partition}]: {err}")
                off = m.offset()
                if off >= part.end:
                    next_offset = part.end
                    break
                good.append(m)
                next_offset = off + 1
            yield good
    finally:
        consumer.unassign()


def _skip_lost(consumer: Any, part: Range, next_offset: int, fail_on_data_loss: bool, err: Any) -> int:
    """``next_offset`` is out of the log's range: raise, or move the consumer to the log start
    and return where reading goes on (``part.end`` when nothing of the range is left)."""
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(
        TopicPartition(part.topic, part.partition), timeout=10, cached=False
    )
    if next_offset >= low:
        # Not retention: the offset is past the log end (records the range was planned over
        # are gone from the log, e.g. after an unclean leader election).
        raise SluiceSourceError(
            f"{part.topic}[{part.partition}]: offset {next_offset} is no longer in the log "
            f"(it holds {low}..{high - 1}; {err}); the records this query planned to read from "
            f"there are lost. Restart the query from offsets that exist."
        )
    if fail_on_data_loss:
        raise SluiceSourceError(data_lost(part.topic, part.partition, next_offset, low))
    resume = min(low, part.end)
    log.warning(
        "event=data_loss_skipped topic=%s partition=%d lost_from=%d lost_to=%d range_end=%d",
        part.topic,
        part.partition,
        next_offset,
        resume - 1,
        part.end,
    )
    if resume < part.end:
        consumer.assign([TopicPartition(part.topic, part.partition, resume)])
    return resume


def read_range(options: dict[str, str], schema: StructType, part: Range) -> Iterator[Any]:
    """Read offsets [start, end) of one partition as Arrow record batches of raw records."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    for msgs in _consume_range(options, part):
        if not msgs:
            continue
        n = len(msgs)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([m.key() for m in msgs], pa.binary()),
                pa.array([m.value() for m in msgs], pa.binary()),
                pa.array([part.topic] * n, pa.string()),
                pa.array([part.partition] * n, pa.int32()),
                pa.array([m.offset() for m in msgs], pa.int64()),
                pa.array([m.timestamp()[1] for m in msgs], pa.int64())
                .cast(pa.timestamp("ms"))
                .cast(pa.timestamp("us", tz="UTC")),
            ],
            schema=arrow_schema,
        )


# One consumer per Python worker process, bootstrap list and client security, kept between tasks:
# Spark reuses its Python workers, and connecting plus fetching metadata for every task would
# cost more than reading a small micro-batch.
_CONSUMERS: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
# The topics whose metadata each of those consumers has (by the consumer's cache key).
_KNOWN_TOPICS: dict[tuple[str, tuple[tuple[str, str], ...]], set[str]] = {}


def _reader_consumer(bootstrap: str, client: dict[str, str], topic: str) -> Any:
    """This Python worker's consumer for `bootstrap` and `client`, knowing `topic`'s leaders."""
    cache_key = (bootstrap, tuple(sorted(client.items())))
    consumer = _CONSUMERS.get(cache_key)
    if consumer is None:
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "sluice-spark-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                # Transaction markers and aborted records are skipped, and nothing past the last
                # stable offset is fetched.
                "isolation.level": "read_committed",
                "fetch.max.bytes": 64 * 1024 * 1024,
                "max.partition.fetch.bytes": 16 * 1024 * 1024,
                # A fetch for a range's end waits this long at the broker, and the next range's
                # first fetch waits for it when both partitions lead on one broker.
                "fetch.wait.max.ms": 10,
                "topic.metadata.refresh.interval.ms": 2000,
                # Never jump over a range (librdkafka's default jumps to the latest offset):
                # a deleted offset is reported to _consume_range, which knows failOnDataLoss.
                "auto.offset.reset": "error",
                "log_level": 0,
                **client,
            }
        )
        _CONSUMERS[cache_key] = consumer
    known = _KNOWN_TOPICS.setdefault(cache_key, set())
    if topic not in known:
        # Assigned a partition of a topic it has no metadata for, librdkafka finds the leader on
        # a later metadata refresh: the first fetch came 0.45-0.8 s late when measured. Asking
        # for the topic's metadata first takes a round trip.
        from confluent_kafka import KafkaException

        try:
            consumer.list_topics(topic, timeout=10)
            known.add(topic)
        except KafkaException as exc:  # the fetch finds the leader by itself, later
            log.info("event=reader_metadata_unavailable topic=%s error=%r", topic, str(exc))
    return consumer


class SluiceBatchReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.split = _int_opt(options, "maxRecordsPerPartition", DEFAULT_SPLIT) or DEFAULT_SPLIT
        self.pack = _int_opt(options, "minRecordsPerPartition", DEFAULT_PACK) or DEFAULT_PACK
        self.slots = _int_opt(options, "taskSlots", 0) or 0

    def partitions(self) -> Sequence[InputPartition]:
        view = _LogView(self.options)
        try:
            start = view.resolve(_opt(self.options, "startingOffsets"), "earliest")
            end = view.resolve(_opt(self.options, "endingOffsets"), "latest")
        finally:
            view.close()
        return plan_ranges(start, end, self.split, self.pack, self.slots)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, self.schema, partition)


def transaction_end(
    begin: dict[tuple[str, int], int],
    high: dict[tuple[str, int], int],
    cuts: Sequence[dict[tuple[str, int], int]],
    max_rows: int | None,
) -> dict[tuple[str, int], int]:
    """Where a micro-batch starting at `begin` ends, given the cuts known (oldest first): the
    newest cut that lies within the high watermarks (`high`), or with `max_rows` the newest one
    within that many records, and at least the first that moves at all. Every partition of
    `begin` ends at the cut's offset, or stays at its start when the cut names it not or lower.
    No usable cut: the batch is empty (`begin`)."""
    ends = []
    for cut in cuts:
        if any(nxt > high.get(tp, 0) for tp, nxt in cut.items() if tp in begin):
            continue  # not all of it is readable yet (a lagging high watermark): never split
        end = {tp: max(at, cut.get(tp, at)) for tp, at in begin.items()}
        if end != begin:
            ends.append(end)
    if not ends:
        return dict(begin)
    if max_rows is None:
        return ends[-1]
    best = ends[0]
    for end in ends[1:]:
        if sum(end[tp] - at for tp, at in begin.items()) <= max_rows:
            best = end
    return best


class _CutLog(_DriverClient):
    """Driver-side reader of a transactions topic: the cuts published since the query started
    (and, at the start, the newest one before), numbered in the order they were written."""

    #: records read back from the topic's end to find the newest cut at start; grows 4x a step
    TAIL_WINDOW = 256
    #: cuts kept in memory at most (the oldest, already passed by the batches, go first)
    KEPT_MAX = 10_000
    GROUP = "sluice-spark-cuts"
    SETTINGS = {"enable.partition.eof": False, "auto.offset.reset": "earliest"}

    def __init__(self, options: dict[str, str], topic: str) -> None:
        super().__init__(options)
        self.topic = topic
        self.cuts: list[tuple[int, dict[tuple[str, int], int]]] = []  # (number, cut)
        self.numbered = 0
        self.next_offset: int | None = None

    def refresh(self) -> None:
        """Read the cuts written since the last call (the first call: the newest one there is)."""
        from confluent_kafka import TopicPartition

        try:
            low, high = self.consumer().get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=10, cached=False
            )
        except Exception as exc:
            raise SluiceSourceError(
                f"cannot read the transactions topic {self.topic} (option transactionTopic): {exc}; "
                "it is created with the task's topics: check that it exists"
            ) from exc
        if self.next_offset is None:
            stop, window = high, self.TAIL_WINDOW
            while stop > low and not self.cuts:
                start = max(low, stop - window)
                found = self._read(start, stop)
                if found:
                    self._add(found[-1:])
                stop, window = start, window * 4
            self.next_offset = high
            return
        start = max(self.next_offset, low)
        if start < high:
            self._add(self._read(start, high))
        self.next_offset = max(self.next_offset, high)

    def _add(self, cuts: list[dict[tuple[str, int], int]]) -> None:
        for cut in cuts:
            self.numbered += 1
            self.cuts.append((self.numbered, cut))
        del self.cuts[: -self.KEPT_MAX]

    def passed(self, begin: dict[tuple[str, int], int]) -> None:
        """Forget cuts the batches have passed (all at or below `begin`), except the newest."""
        keep = [c for c in self.cuts[:-1] if any(nxt > begin.get(tp, 0) for tp, nxt in c[1].items())]
        self.cuts = keep + self.cuts[-1:]

    def _read(self, start: int, stop: int) -> list[dict[tuple[str, int], int]]:
        from confluent_kafka import TopicPartition

        from sluice.sync.sources.transactions import parse_cut

        consumer = self.consumer()
        consumer.assign([TopicPartition(self.topic, 0, start)])
        found = []
        at = start
        deadline = time.monotonic() + STALL_TIMEOUT_S
        try:
            while at < stop:
                msgs = consumer.consume(num_messages=min(1000, stop - at), timeout=1.0)
                for m in msgs:
                    if m.error() is not None:
                        continue
                    if m.offset() >= stop:
                        at = stop
                        break
                    cut = parse_cut(m.value())
                    if cut is not None:
                        found.append(cut)
                    at = m.offset() + 1
                if time.monotonic() > deadline:
                    raise SluiceSourceError(
                        f"no progress reading the transactions topic {self.topic} at offset {at} "
                        f"(up to {stop}) for {STALL_TIMEOUT_S:.0f} s"
                    )
        finally:
            consumer.unassign()
        return found


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self.view = _LogView(options)
        self.split = _int_opt(options, "maxRecordsPerPartition", DEFAULT_SPLIT) or DEFAULT_SPLIT
        self.pack = _int_opt(options, "minRecordsPerPartition", DEFAULT_PACK) or DEFAULT_PACK
        self.slots = _int_opt(options, "taskSlots", 0) or 0
        self.max_per_trigger = _int_opt(options, "maxRecordsPerTrigger", None)
        self.fail_on_data_loss = _fail_on_data_loss(options)
        self.available_now: Offsets | None = None
        self.latest: Offsets | None = None
        topic = _opt(options, "transactionTopic")
        self.cut_log = _CutLog(options, topic) if topic else None
        #: with availableNow and cuts: the number of the newest cut known when it was asked for
        self.available_cuts: int | None = None

    def initialOffset(self) -> dict:
        return self.view.resolve(_opt(self.options, "startingOffsets"), "earliest")

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_per_trigger is not None:
            return ReadMaxRows(self.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        if self.cut_log is not None:
            self.cut_log.refresh()
            self.available_cuts = self.cut_log.numbered
            return
        self.available_now = self.view.resolve("latest", "latest")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tps = self.view.partitions()
        marks = self.view.watermarks(tps)
        begin = _flat(start)
        for tp in tps:
            low = marks[tp][0]
            at = begin.get(tp, low)
            if at < low:
                if self.fail_on_data_loss:
                    raise SluiceSourceError(data_lost(tp[0], tp[1], at, low))
                log.warning(
                    "event=data_loss_skipped topic=%s partition=%d lost_from=%d lost_to=%d",
                    tp[0],
                    tp[1],
                    at,
                    low - 1,
                )
                begin[tp] = low
            elif tp not in begin:
                begin[tp] = low
        latest = {tp: max(marks[tp][1], begin[tp]) for tp in tps}
        self.latest = _sorted_offsets(latest)
        if self.cut_log is not None:
            return _sorted_offsets(self._cut_end(begin, latest, limit))
        if self.available_now is not None:
            cap = _flat(self.available_now)
            latest = {tp: min(hi, max(cap.get(tp, begin[tp]), begin[tp])) for tp, hi in latest.items()}
        end = _sorted_offsets(latest)
        if isinstance(limit, ReadMaxRows):
            end = limit_offsets(_sorted_offsets(begin), end, limit.max_rows)
        return end

    def _cut_end(
        self, begin: dict[tuple[str, int], int], latest: dict[tuple[str, int], int], limit: ReadLimit
    ) -> dict[tuple[str, int], int]:
        assert self.cut_log is not None
        self.cut_log.refresh()
        self.cut_log.passed(begin)
        upto = self.available_cuts
        cuts = [cut for n, cut in self.cut_log.cuts if upto is None or n <= upto]
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return transaction_end(begin, latest, cuts, max_rows)

    def reportLatestOffset(self) -> dict | None:
        return self.latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return plan_ranges(start, end, self.split, self.pack, self.slots)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, self.schema, partition)

    def stop(self) -> None:
        self.view.close()
        if self.cut_log is not None:
            self.cut_log.close()

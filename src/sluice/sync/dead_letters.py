"""Dead letters: the changes a task's target refused, kept in the task's topic `{task}.dlq`.

Under the task option `on_refused: dlq`, a change the target refuses (a constraint violation, a
value its column cannot hold, a mapping error such as a failed cast) does not stop the task:
`Target.apply` isolates it and hands it here inside the batch's transaction, it is produced
with acks=all and acknowledged before that transaction commits, and the rest of the batch
commits. So every record is applied, in the dead-letter topic, or the query stops: a produce
that fails fails the batch (nothing of it committed), and a crash after the produce and before
the commit produces the same dead letter again when the batch is replayed. Readers therefore
de-duplicate by the change's source coordinates (topic, partition, offset, position), keeping
the newest entry (`dedupe`).

One record per refused change, keyed by the change's record key, its value JSON:

    {"task": "shop", "pipeline": "shop", "error": "IntegrityError: CHECK constraint failed: qty >= 0",
     "table": "orders", "key": {"id": 7}, "op": "u", "pos": 1234, "after": {...} | null,
     "binary": [...] | null, "source": {"topic": "shop.changes", "partition": 2, "offset": 41},
     "records": 3, "epoch": 12, "execution": "a1b2c3d4e5f6", "failed_at_ms": 1763800000123}

`records` is how many log records the (collapsed) change stands for. The topic has one
partition (offsets name a dead letter on their own: `sluice dlq show ID OFFSET`) and keeps its
records forever (`retention.ms=-1`): a dead letter is data not yet in the target.

`replay` re-applies dead letters through `Target.apply` under the pipeline `{task}.dlq-replay`
with a newly claimed epoch: the version guard keeps a replayed change from overwriting a newer
row, the target's offsets for that pipeline (over the dead-letter topic's offsets) make a second
replay skip what the first applied, and a change refused again is produced to the topic again
with the new error (and replayed by the next replay).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pyarrow as pa

from sluice.sync.changes import CHANGE_SCHEMA
from sluice.sync.targets.base import Refusal, Target

log = logging.getLogger("sluice.dead_letters")

#: A dead letter is data the target does not have yet: it never expires.
DEAD_LETTER_TOPIC_CONFIG = {"retention.ms": "-1", "retention.bytes": "-1"}
DEAD_LETTER_PARTITIONS = 1
#: How long a batch waits for its dead letters' acknowledgements before it fails.
PRODUCE_TIMEOUT_S = 60.0


class DeadLetterError(RuntimeError):
    """Dead letters could not be produced or read; the message says which and what to do."""


def dead_letter_topic(task: str) -> str:
    return f"{task}.dlq"


def replay_pipeline(task: str) -> str:
    """The pipeline name replays commit under (its own fence and offsets in the target)."""
    return f"{task}.dlq-replay"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One refused change: what it was, where it came from, and why the target refused it."""

    task: str
    pipeline: str
    error: str
    table: str
    key: str  # canonical key text (envelope.key_text)
    op: str
    pos: int
    after: str | None  # JSON object text; None for a delete
    binary: str | None  # JSON list of the columns holding base64 bytes
    source_topic: str
    source_partition: int
    source_offset: int
    records: int
    epoch: int
    execution: str
    failed_at_ms: int
    types: str | None = None  # the change's table's column types (JSON), when its source named them

    @classmethod
    def from_refusal(
        cls, refusal: Refusal, *, task: str, pipeline: str, epoch: int, execution: str
    ) -> DeadLetter:
        c = refusal.change
        return cls(
            task=task, pipeline=pipeline, error=refusal.error, table=c["table"], key=c["key"], op=c["op"],
            pos=int(c["pos"]), after=c["after"], binary=c["binary"], source_topic=c["topic"],
            source_partition=int(c["partition"]), source_offset=int(c["offset"]),
            records=int(c["records"] or 1), epoch=epoch, execution=execution,
            failed_at_ms=int(time.time() * 1000), types=c.get("types"),
        )  # fmt: skip

    def identity(self) -> tuple[str, int, int, int]:
        """The same change, however often it was dead-lettered (a batch replayed, a replay)."""
        return (self.source_topic, self.source_partition, self.source_offset, self.pos)

    def record_key(self) -> bytes:
        """The change's own record key (`envelope.record_key`): same row, same partition."""
        return orjson.dumps([self.table, orjson.loads(self.key)], option=orjson.OPT_SORT_KEYS)

    def to_doc(self) -> dict[str, Any]:
        return {
            "task": self.task, "pipeline": self.pipeline, "error": self.error, "table": self.table,
            "key": orjson.loads(self.key), "op": self.op, "pos": self.pos,
            "after": None if self.after is None else orjson.loads(self.after),
            "binary": None if self.binary is None else orjson.loads(self.binary),
            "source": {"topic": self.source_topic, "partition": self.source_partition,
                       "offset": self.source_offset},
            "records": self.records, "epoch": self.epoch, "execution": self.execution,
            "failed_at_ms": self.failed_at_ms,
            **({"types": orjson.loads(self.types)} if self.types is not None else {}),
        }  # fmt: skip

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_doc())

    @classmethod
    def from_doc(cls, doc: Any, where: str) -> DeadLetter:
        try:
            src = doc["source"]
            return cls(
                task=str(doc["task"]), pipeline=str(doc["pipeline"]), error=str(doc["error"]),
                table=str(doc["table"]), key=_text(doc["key"]), op=str(doc["op"]), pos=int(doc["pos"]),
                after=None if doc["after"] is None else orjson.dumps(doc["after"]).decode(),
                binary=None if doc.get("binary") is None else orjson.dumps(doc["binary"]).decode(),
                source_topic=str(src["topic"]), source_partition=int(src["partition"]),
                source_offset=int(src["offset"]), records=int(doc.get("records") or 1),
                epoch=int(doc["epoch"]), execution=str(doc.get("execution") or ""),
                failed_at_ms=int(doc["failed_at_ms"]),
                types=None if doc.get("types") is None else orjson.dumps(doc["types"]).decode(),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise DeadLetterError(f"record at {where} is not a dead letter ({exc!r})") from None


def _text(key: Any) -> str:
    return orjson.dumps(key, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(frozen=True, slots=True)
class Entry:
    """A dead letter where it sits in the dead-letter topic."""

    partition: int
    offset: int
    letter: DeadLetter

    def label(self) -> str:
        """The entry's name for `sluice dlq show`: its offset (partition:offset beyond 0)."""
        return str(self.offset) if self.partition == 0 else f"{self.partition}:{self.offset}"


class DeadLetterWriter:
    """Produces dead letters idempotently with acks=all and waits for every acknowledgement."""

    def __init__(
        self, bootstrap: str, topic: str, task: str, client: dict[str, str] | None = None,
        timeout_s: float = PRODUCE_TIMEOUT_S,
    ) -> None:  # fmt: skip
        from confluent_kafka import Producer

        self.topic = topic
        self.task = task
        self.timeout_s = timeout_s
        conf = {
            "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000), "log_level": 0, **(client or {}),
        }  # fmt: skip
        self._producer = Producer(conf)

    def write(self, letters: list[DeadLetter]) -> None:
        """Produce `letters` and return once the log acknowledged each; DeadLetterError if any
        was not (the caller's transaction then rolls back: nothing is lost, the batch retries)."""
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        for letter in letters:
            while True:
                try:
                    self._producer.produce(
                        self.topic, letter.to_json(), letter.record_key(), on_delivery=delivered
                    )
                    break
                except BufferError:  # the local queue is full: let deliveries (or timeouts) free it
                    self._producer.poll(0.1)
        left = self._producer.flush(self.timeout_s)
        if left or failed:
            raise DeadLetterError(
                f"task {self.task}: {left or len(failed)} of {len(letters)} dead letter(s) not "
                f"acknowledged by topic {self.topic} "
                f"({failed[0] if failed else f'no answer within {self.timeout_s:g} s'}); "
                "the batch was not committed and will be retried: check the brokers and the topic"
            )
        for d in letters:
            log.warning(
                "event=dead_letter task=%s table=%s key=%s pos=%d source=%s[%d]@%d topic=%s error=%r",
                d.task, d.table, d.key, d.pos, d.source_topic, d.source_partition, d.source_offset,
                self.topic, d.error,
            )  # fmt: skip

    def sink(self, pipeline: str, epoch: int, execution: str) -> DeadLetterSink:
        """A refusal sink (`Target.apply`'s `on_refused`) for one batch."""
        return DeadLetterSink(self, pipeline, epoch, execution)

    def close(self) -> None:
        self._producer.flush(self.timeout_s)


class DeadLetterSink:
    """Turns one batch's refusals into dead letters, produces them, and keeps them for the
    alarm raised once the batch has committed."""

    def __init__(self, writer: DeadLetterWriter, pipeline: str, epoch: int, execution: str) -> None:
        self.writer = writer
        self.pipeline = pipeline
        self.epoch = epoch
        self.execution = execution
        self.letters: list[DeadLetter] = []

    def __call__(self, refused: list[Refusal]) -> None:
        letters = [
            DeadLetter.from_refusal(
                r, task=self.writer.task, pipeline=self.pipeline, epoch=self.epoch, execution=self.execution
            )
            for r in refused
        ]
        self.writer.write(letters)
        self.letters.extend(letters)


def read_entries(bootstrap: str, topic: str, client: dict[str, str] | None = None) -> list[Entry]:
    """Every record of the dead-letter topic up to its end now, in (partition, offset) order;
    DeadLetterError if the topic does not exist or a partition cannot be read."""
    from confluent_kafka import Consumer, TopicPartition

    from sluice.clients import close_within

    conf = {
        "bootstrap.servers": bootstrap, "group.id": "sluice-dlq", "enable.auto.commit": False,
        "log_level": 0, **(client or {}),
    }  # fmt: skip
    consumer = Consumer(conf)
    out: list[Entry] = []
    try:
        meta = consumer.list_topics(topic, timeout=15).topics.get(topic)
        if meta is None or meta.error is not None:
            raise DeadLetterError(f"no dead-letter topic {topic} (nothing was ever dead-lettered)")
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            deadline = time.monotonic() + 60
            at = low
            while at < high:
                msg = consumer.poll(1.0)
                if msg is None:
                    if time.monotonic() > deadline:
                        raise DeadLetterError(f"cannot read {topic}[{p}] past offset {at} (up to {high})")
                    continue
                if msg.error() is not None:
                    raise DeadLetterError(f"cannot read {topic}[{p}]: {msg.error()}")
                offset = int(msg.offset() or 0)
                where = f"{topic}[{p}]@{offset}"
                try:
                    doc = orjson.loads(msg.value() or b"")
                except orjson.JSONDecodeError:
                    raise DeadLetterError(f"record at {where} is not a dead letter (not JSON)") from None
                out.append(Entry(p, offset, DeadLetter.from_doc(doc, where)))
                at = offset + 1
    finally:
        close_within(consumer)
    return out


def dedupe(entries: Iterable[Entry]) -> list[Entry]:
    """One entry per refused change (`DeadLetter.identity`): the newest, i.e. the one with the
    latest error (a replay's), in topic order."""
    newest: dict[tuple[str, int, int, int], Entry] = {}
    for e in entries:
        known = newest.get(e.letter.identity())
        if known is None or (e.partition, e.offset) > (known.partition, known.offset):
            newest[e.letter.identity()] = e
    return sorted(newest.values(), key=lambda e: (e.partition, e.offset))


@dataclass(frozen=True, slots=True)
class ReplayResult:
    replayed: int  # applied (or kept out by the version guard: the target has newer data)
    refused_again: int  # produced to the dead-letter topic again, with the new error
    skipped: int  # applied by an earlier replay


def replay(
    target: Target, entries: list[Entry], topic: str, writer: DeadLetterWriter, execution: str
) -> ReplayResult:
    """Re-apply dead letters (`dedupe`d) to the task's target in one transaction under a newly
    claimed epoch of the pipeline `{task}.dlq-replay`; see the module docstring."""
    pipeline = replay_pipeline(writer.task)
    epoch = target.claim(pipeline)
    by_place = {(e.partition, e.offset): e for e in entries}

    def refused_again(refused: list[Refusal]) -> None:
        now = int(time.time() * 1000)
        writer.write([
            replace(by_place[(r.change["partition"], r.change["offset"])].letter, error=r.error,
                    pipeline=pipeline, epoch=epoch, execution=execution, failed_at_ms=now)
            for r in refused
        ])  # fmt: skip

    result = target.apply(pipeline, epoch, changes_table(entries, topic), on_refused=refused_again)
    applied = result.records - result.skipped - result.refused
    return ReplayResult(replayed=applied, refused_again=result.refused, skipped=result.skipped)


def changes_table(entries: list[Entry], topic: str) -> pa.Table:
    """Dead letters as changes (`CHANGE_SCHEMA`) at their places in the dead-letter topic, each
    counting as one record (so the target's offsets remember which were replayed)."""
    letters = [e.letter for e in entries]
    return pa.table(
        {
            "topic": pa.array([topic] * len(entries), pa.string()),
            "partition": pa.array([e.partition for e in entries], pa.int32()),
            "offset": pa.array([e.offset for e in entries], pa.int64()),
            "timestamp": pa.array([d.failed_at_ms for d in letters], pa.int64())
            .cast(pa.timestamp("ms"))
            .cast(CHANGE_SCHEMA.field("timestamp").type),
            "table": pa.array([d.table for d in letters], pa.string()),
            "key": pa.array([d.key for d in letters], pa.string()),
            "pos": pa.array([d.pos for d in letters], pa.int64()),
            "op": pa.array([d.op for d in letters], pa.string()),
            "after": pa.array([d.after for d in letters], pa.string()),
            "records": pa.array([1] * len(entries), pa.int32()),
            "binary": pa.array([d.binary for d in letters], pa.string()),
            "types": pa.array([d.types for d in letters], pa.string()),
        },
        schema=CHANGE_SCHEMA,
    )

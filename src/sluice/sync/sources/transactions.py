"""Source transactions in the log: consistent cuts, and BEGIN/END metadata.

A capture writes each row change of a source transaction to the partition of its row, so one
transaction lands in several partitions, pipelined with the transactions around it. The apply
query must never end a micro-batch inside one (the target would show half of it), so the
capture tells it where transactions end: a *cut* is, for every partition of the capture's
topics, the offset after the last record of a transaction that is in the log with every
transaction before it. A micro-batch that ends at a cut in every partition holds whole
transactions only.

How a cut is known. Each group of records (a source transaction, a snapshot, a DDL statement's
events, a set of position markers) is a `Group`; every delivery report names the offset its
record got. When the oldest groups are finished (no more records to come) and every record of
them is acknowledged, they are folded into the cut (`Transactions.advance`): each partition one
of them wrote to moves to 1 + the highest offset written there; a partition none of them
touched keeps its value. Groups are folded strictly in order, so a cut never passes a
transaction whose records are not all in the log, even when a later one was acknowledged first.
The same folding gives the capture's resume position: the start of the oldest group left.

The capture publishes cuts to its task's transactions topic (`{task}.transactions`, one
partition), coalesced: at most one per `interval_s` while busy, and one when it goes idle. A
record there is JSON with a `type`:

    cut    {"type": "cut", "offsets": {"topic": {"0": next_offset}}, "position": "...",
            "gtid": "...", "ts_ms": ...}
            (`position`: where the last transaction in the cut ends, a place to resume from;
            `gtid`: the source's GTID state there, when the server gives GTIDs: MariaDB's
            `domain-server-seq` per domain, MySQL's `uuid:1-n` per source, comma-separated)
    begin  {"type": "begin", "id": "...", "ts_ms": ...}                 (task option
    end    {"type": "end", "id": "...", "event_count": n,                transaction_metadata)
            "data_collections": [{"data_collection": "db.table", "event_count": n}], "ts_ms": ...}

The apply query's source (pipeline/source.py, option transactionTopic) reads the cuts and ignores
the rest.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluice.sync.sources.binlog_history import apply_gtid, state_text

#: (topic, partition) -> next offset
Offsets = dict[tuple[str, int], int]

CUT, BEGIN, END = "cut", "begin", "end"
#: at most one cut record per this many seconds while the capture is busy
CUT_INTERVAL_S = 0.05


@dataclass(slots=True, eq=False)
class Group:
    """The records of one source transaction (or snapshot, DDL statement, set of markers)."""

    #: where the group starts in the source (a restart from here captures it again)
    start: str
    #: where it ends (known once it is finished)
    end: str = ""
    #: records produced and not yet acknowledged
    unacked: int = 0
    #: no more records will be added
    done: bool = False
    #: 1 + the highest acknowledged offset per partition written to
    offsets: Offsets = field(default_factory=dict)
    #: the source transaction's GTID, if the server gave one
    gtid: str = ""
    #: transaction metadata: its id, and change counts in all and per table
    id: str = ""
    events: int = 0
    per_table: dict[str, int] = field(default_factory=dict)

    def order(self, collection: str) -> dict[str, Any]:
        """The next change's place in this transaction (`source.transaction` of its envelope)."""
        self.events += 1
        n = self.per_table.get(collection, 0) + 1
        self.per_table[collection] = n
        return {"id": self.id, "total_order": self.events, "data_collection_order": n}


def fold(cut: Offsets, groups: Iterable[Group]) -> Offsets:
    """The cut after `groups` (in order), starting from `cut`: each partition a group wrote to
    moves to 1 + its highest offset there (never back); the others keep their value."""
    out = dict(cut)
    for group in groups:
        for tp, nxt in group.offsets.items():
            if nxt > out.get(tp, 0):
                out[tp] = nxt
    return out


def steps(begin: Offsets, end: Offsets, rows: int) -> list[Offsets]:
    """Cuts from `begin` to `end` about `rows` records apart, the last one `end`: for records
    that belong to no source transaction (a snapshot's rows), so a reader with a record limit
    reads them in batches of about that size rather than in one."""
    assert rows > 0
    gap = {tp: max(0, nxt - begin.get(tp, 0)) for tp, nxt in end.items()}
    count = -(-sum(gap.values()) // rows)  # ceil
    return [
        {tp: max(begin.get(tp, 0), nxt - gap[tp] + gap[tp] * k // count) for tp, nxt in end.items()}
        for k in range(1, count + 1)
    ]


class Transactions:
    """The capture's groups in flight, its cut and its resume position. Not thread-safe: the
    capture calls it under its lock (delivery reports run in whichever thread polls)."""

    def __init__(self, resume: str, cut: Offsets | None = None) -> None:
        self.pending: deque[Group] = deque()
        self.cut: Offsets = dict(cut or {})
        #: the start of the oldest group left, or the end of the last one folded
        self.resume = resume
        #: the end of the last group folded into the cut
        self.position = ""
        #: the cut moved since it was last taken (`take`)
        self.moved = False
        #: the GTID state at `position` (binlog_history.apply_gtid)
        self.gtids: dict[str, str] = {}

    def begin(self, start: str, gtid: str = "") -> Group:
        group = Group(start=start, gtid=gtid, id=gtid or start)
        self.pending.append(group)
        self.resume = self.pending[0].start
        return group

    def produced(self, group: Group) -> None:
        group.unacked += 1

    def acked(self, group: Group, topic: str, partition: int, offset: int) -> None:
        assert group.unacked > 0, "an acknowledgement for a record never produced"
        group.unacked -= 1
        tp = (topic, partition)
        if offset + 1 > group.offsets.get(tp, 0):
            group.offsets[tp] = offset + 1
        self.advance()

    def finish(self, group: Group, end: str) -> None:
        group.done = True
        group.end = end
        self.advance()

    def advance(self) -> None:
        """Fold finished, fully acknowledged groups from the front into the cut."""
        folded = []
        while self.pending and self.pending[0].done and self.pending[0].unacked == 0:
            folded.append(self.pending.popleft())
        if folded:
            self.cut = fold(self.cut, folded)
            self.position = self.resume = folded[-1].end
            self.moved = True
            for group in folded:
                apply_gtid(self.gtids, group.gtid)
        if self.pending:
            self.resume = self.pending[0].start

    def raise_to(self, offsets: Offsets, position: str) -> None:
        """Everything below `offsets` is whole (records written by other producers, e.g. a
        parallel snapshot's, once they all are flushed): the cut moves up to them."""
        self.cut = fold(self.cut, [Group(start=position, offsets=offsets)])
        self.position = position
        self.moved = True

    def take(self) -> tuple[Offsets, str, str] | None:
        """The cut, its position and GTID state if it moved since the last take, else None."""
        if not self.moved:
            return None
        self.moved = False
        return dict(self.cut), self.position, state_text(self.gtids)


# --- records of the transactions topic ---------------------------------------------------------


def cut_record(cut: Offsets, position: str, gtid: str = "", ts_ms: int | None = None) -> bytes:
    offsets: dict[str, dict[str, int]] = {}
    for (topic, partition), nxt in sorted(cut.items()):
        offsets.setdefault(topic, {})[str(partition)] = nxt
    now = int(time.time() * 1000) if ts_ms is None else ts_ms
    doc = {"type": CUT, "offsets": offsets, "position": position, **({"gtid": gtid} if gtid else {})}
    return orjson.dumps({**doc, "ts_ms": now})


def begin_record(group: Group, ts_ms: int) -> bytes:
    return orjson.dumps({"type": BEGIN, "id": group.id, "ts_ms": ts_ms})


def end_record(group: Group, database: str, ts_ms: int) -> bytes:
    collections = [
        {"data_collection": f"{database}.{table}", "event_count": n}
        for table, n in sorted(group.per_table.items())
    ]
    doc = {"type": END, "id": group.id, "event_count": group.events, "data_collections": collections}
    return orjson.dumps({**doc, "ts_ms": ts_ms})


def parse_cut(value: bytes | None) -> Offsets | None:
    """The offsets of a cut record; None for any other record of the topic (BEGIN, END)."""
    try:
        doc = orjson.loads(value or b"{}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != CUT or not isinstance(doc.get("offsets"), dict):
        return None
    try:
        return {(str(t), int(p)): int(o) for t, parts in doc["offsets"].items() for p, o in parts.items()}
    except (AttributeError, TypeError, ValueError):
        return None


# --- the log around it --------------------------------------------------------------------------


def high_watermarks(bootstrap: str, topics: list[str], client: dict[str, Any] | None = None) -> Offsets:
    """The next offset of every partition of `topics` (those that exist)."""
    from confluent_kafka import Consumer, TopicPartition

    from sluice.clients import close_within

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "sluice-cuts", "enable.auto.commit": False,
         "log_level": 0, **(client or {})}
    )  # fmt: skip
    try:
        meta = consumer.list_topics(timeout=15)
        out: Offsets = {}
        for topic in topics:
            t = meta.topics.get(topic)
            for p in sorted(t.partitions) if t is not None and t.error is None else []:
                out[(topic, p)] = int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
        return out
    finally:
        close_within(consumer)


class TransactionLog:
    """Writes cuts (coalesced) and BEGIN/END records to the transactions topic with the
    capture's producer."""

    def __init__(self, topic: str, *, metadata: bool = False, interval_s: float = CUT_INTERVAL_S) -> None:
        self.topic = topic
        self.metadata = metadata
        self.interval_s = interval_s
        self._last = 0.0
        self.cuts = 0

    def due(self) -> bool:
        """The last cut is `interval_s` old: a moved cut may be written again."""
        return time.monotonic() - self._last >= self.interval_s

    def write_cut(self, producer: Any, cut: Offsets, position: str, gtid: str = "") -> None:
        self._produce(producer, cut_record(cut, position, gtid))
        self._last = time.monotonic()
        self.cuts += 1

    def begin(self, producer: Any, group: Group, ts_ms: int) -> None:
        if self.metadata:
            self._produce(producer, begin_record(group, ts_ms))

    def end(self, producer: Any, group: Group, database: str, ts_ms: int) -> None:
        if self.metadata:
            self._produce(producer, end_record(group, database, ts_ms))

    def _produce(self, producer: Any, value: bytes) -> None:
        while True:
            try:
                producer.produce(self.topic, value, partition=0)
                return
            except BufferError:
                producer.poll(0.05)

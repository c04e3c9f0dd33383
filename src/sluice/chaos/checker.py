"""The checker: compares what a verifiable producer had acknowledged with what a verifiable
consumer read back. Pure: histories in, a verdict per topic out.

Values are ``{writer}:{partition}:{seq}`` with ``seq`` increasing per writer and partition, so
a value identifies one produce call, and order can be judged without trusting offsets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Ack:
    topic: str
    partition: int
    offset: int
    value: str
    broker: int  # the leader the producer believed it wrote to (-1 if unknown)


@dataclass(frozen=True, slots=True)
class Read:
    topic: str
    partition: int
    offset: int
    value: str


@dataclass(frozen=True, slots=True)
class LostRecord:
    value: str
    partition: int
    offset: int
    broker: int


@dataclass
class TopicVerdict:
    topic: str
    acknowledged: int = 0
    read: int = 0
    lost: list[LostRecord] = field(default_factory=list)
    #: value -> every (partition, offset) it was read at, for values read more than once
    duplicated: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    #: (partition, offset, value, previous value of the same writer) where seq went backwards
    out_of_order: list[tuple[int, int, str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicated and not self.out_of_order


def parse_value(value: str) -> tuple[str, int, int] | None:
    writer, _, rest = value.rpartition(":")
    writer, _, partition = writer.rpartition(":")
    try:
        return writer, int(partition), int(rest)
    except ValueError:
        return None


def check(acks: Iterable[Ack], reads: Iterable[Read]) -> dict[str, TopicVerdict]:
    verdicts: dict[str, TopicVerdict] = {}

    def verdict(topic: str) -> TopicVerdict:
        if topic not in verdicts:
            verdicts[topic] = TopicVerdict(topic)
        return verdicts[topic]

    seen: dict[tuple[str, str], list[tuple[int, int]]] = {}
    by_partition: dict[tuple[str, int], list[Read]] = {}
    for r in reads:
        v = verdict(r.topic)
        v.read += 1
        seen.setdefault((r.topic, r.value), []).append((r.partition, r.offset))
        by_partition.setdefault((r.topic, r.partition), []).append(r)
    for (topic, value), where in seen.items():
        distinct = sorted(set(where))
        # Read at two places in the log: appended twice. (The same offset read twice is a
        # consumer re-delivery, not a duplicate in the log.)
        if len(distinct) > 1:
            verdict(topic).duplicated[value] = distinct
    for a in acks:
        v = verdict(a.topic)
        v.acknowledged += 1
        if (a.topic, a.value) not in seen:
            v.lost.append(LostRecord(a.value, a.partition, a.offset, a.broker))
    for (topic, partition), rs in by_partition.items():
        highest: dict[str, tuple[int, str]] = {}
        values_here: set[str] = set()
        for offset, value in sorted({(r.offset, r.value) for r in rs}):
            parsed = parse_value(value)
            if parsed is None:
                continue
            writer, _, seq = parsed
            prev = highest.get(writer)
            if value in values_here:
                continue  # a duplicate, reported as such
            values_here.add(value)
            if prev is not None and seq < prev[0]:
                verdict(topic).out_of_order.append((partition, offset, value, prev[1]))
            if prev is None or seq > prev[0]:
                highest[writer] = (seq, value)
    for v in verdicts.values():
        v.lost.sort(key=lambda x: (x.partition, x.offset))
    return verdicts

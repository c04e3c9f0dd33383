"""Helpers for the transaction tests: reading a topic as read_committed and read_uncommitted
consumers see it, and waiting until every transaction on it has ended."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from sluice.clients import close_within
from tests.support.cluster import wait_until


def _consumer(bootstrap: str, isolation: str, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{isolation}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "topic.metadata.refresh.interval.ms": 1000,
            "log_level": 0,
            **extra,
        }
    )


def watermarks(bootstrap: str, topic: str, partitions: int, isolation: str) -> list[int]:
    """The latest offset of each partition as a client of ``isolation`` is told it (ListOffsets:
    the high watermark for read_uncommitted, the last stable offset for read_committed)."""
    c = _consumer(bootstrap, isolation)
    try:
        return [
            c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(partitions)
        ]
    finally:
        close_within(c)


def wait_stable(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60) -> list[int]:
    """Wait until no transaction is open on ``topic`` (its last stable offsets equal its high
    watermarks); returns them."""

    def stable() -> list[int] | None:
        hw = watermarks(bootstrap, topic, partitions, "read_uncommitted")
        lso = watermarks(bootstrap, topic, partitions, "read_committed")
        return hw if hw == lso else None

    return wait_until(stable, timeout_s, f"every transaction on {topic} to end")


def read_values(
    bootstrap: str, topic: str, partitions: Iterable[int], isolation: str, timeout_s: float = 60
) -> list[bytes]:
    """Every value a consumer of ``isolation`` reads from the start of each partition to the
    end it is told (EOF), in partition order."""
    parts = list(partitions)
    c = _consumer(bootstrap, isolation)
    out: dict[int, list[bytes]] = {p: [] for p in parts}
    try:
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(parts):
            assert time.monotonic() < deadline, f"reading {topic} did not reach its end in {timeout_s} s"
            m = c.poll(0.5)
            if m is None:
                continue
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                    continue
                raise AssertionError(f"reading {topic}: {err}")
            at_end.discard(m.partition())
            value = m.value()
            assert value is not None
            out[m.partition()].append(value)
    finally:
        close_within(c)
    return [v for p in parts for v in out[p]]

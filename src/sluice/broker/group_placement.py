"""Where a group's coordinator lives: the leader of one partition of ``__consumer_offsets``.

The partition is ``abs(hash(group_id)) % partitions`` with Java's ``String.hashCode`` and
Kafka's ``Utils.abs`` (which maps Integer.MIN_VALUE to 0, unlike ``Math.abs``), so that Kafka
tools and Sluice agree on the placement. Pure.
"""

from __future__ import annotations

from sluice.cluster.layout import OFFSETS_TOPIC as OFFSETS_TOPIC

INT32_MIN = -(2**31)


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, 32-bit two's complement wrap-around."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: the absolute value, except Integer.MIN_VALUE (which has none in
    32 bits) maps to 0. Not ``n & 0x7fffffff``, which is the producer partitioner's rule."""
    return 0 if n == INT32_MIN else abs(n)


def partition_for_group(group_id: str, partitions: int) -> int:
    assert partitions > 0
    return kafka_abs(java_string_hash(group_id)) % partitions

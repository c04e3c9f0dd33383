"""Which partitions of an OffsetCommit are answered without being committed (handlers.refused_commits)."""

from __future__ import annotations

from sluice.broker.handlers import refused_commits
from sluice.protocol.errors import ErrorCode


def test_a_missing_topic_or_partition_is_unknown_and_a_partition_named_twice_is_invalid() -> None:
    requested = [("t", 0), ("t", 1), ("t", 2), ("t", -1), ("absent", 0), ("t", 0)]
    assert refused_commits(requested, {"t": 2}) == {
        ("t", 0): ErrorCode.INVALID_REQUEST,
        ("t", 2): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("t", -1): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("absent", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }


def test_partitions_that_exist_are_left_to_the_coordinator() -> None:
    assert refused_commits([("t", 0), ("t", 1), ("u", 0)], {"t": 2, "u": 1}) == {}

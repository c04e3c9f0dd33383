"""Configs applied without a restart (issue 19): a topic's config and the broker's dynamic log
defaults reach the replicas' logs at once (``ReplicaManager.reconfigure``), with Kafka's
precedence (the topic's own value, the broker's dynamic value, the cluster's, the file's)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from sluice.broker.dynamic_config import effective_log_defaults
from sluice.broker.partition import Partition
from sluice.broker.replica_manager import ReplicaManager
from sluice.cluster.layout import TopicAssignment
from sluice.storage.config import LONG_MAX, LogConfig
from sluice.storage.errors import RecordTooLargeError
from tests.unit._storage_helpers import batch


def test_a_brokers_own_dynamic_value_wins_over_the_clusters_and_the_files() -> None:
    static = LogConfig(retention_ms=1000, max_message_bytes=5000)
    both, ignored = effective_log_defaults(
        static, {"log.retention.ms": "2000", "message.max.bytes": "6000"}, {"log.retention.ms": "3000"}
    )
    assert (both.retention_ms, both.max_message_bytes, ignored) == (3000, 6000, [])
    cluster_only, _ = effective_log_defaults(static, {"log.retention.ms": "2000"}, {})
    assert cluster_only.retention_ms == 2000
    bad, ignored = effective_log_defaults(static, {"log.retention.ms": "soon", "num.partitions": "3"}, {})
    assert bad.retention_ms == 1000 and ignored == ["log.retention.ms"], "named, not applied"
    # a key kept without effect (Kafka's broker keys Sluice takes, or unknown ones) is no log default
    kept, ignored = effective_log_defaults(static, {"sasl.kerberos.min.time.before.relogin": "58000"}, {})
    assert (kept, ignored) == (static, [])


class Metadata:
    def __init__(self) -> None:
        self.topics: dict[str, TopicAssignment] = {}

    def topic(self, name: str) -> TopicAssignment | None:
        return self.topics.get(name)

    def brokers(self) -> dict[int, Any]:
        return {}


def test_a_config_change_reaches_a_running_replicas_log(tmp_path: Path) -> None:
    metadata = Metadata()
    manager = ReplicaManager(1, tmp_path, metadata)  # type: ignore[arg-type]
    topic_id = uuid.uuid4()
    metadata.topics["t"] = TopicAssignment("t", topic_id, {0: (1,)}, {})
    part = Partition.open(tmp_path, "t", 0, topic_id, {}, broker_id=1)
    part.become_leader(0, (1,), (1,), 0.0)
    manager.partitions[("t", 0)] = part
    part.append(batch(1, value=b"x" * 3000))

    metadata.topics["t"] = TopicAssignment(
        "t", topic_id, {0: (1,)}, {"max.message.bytes": "1000", "flush.ms": "10"}
    )
    assert manager.reconfigure("t") == 1
    assert part.config == {"max.message.bytes": "1000", "flush.ms": "10"}
    with pytest.raises(RecordTooLargeError):
        part.append(batch(1, value=b"x" * 3000))
    assert ("t", 0) in manager.partitions.timed_flush, "a flush.ms set live is flushed by the flusher"

    manager.log_defaults = LogConfig(max_message_bytes=500, min_insync_replicas=2)
    metadata.topics["t"] = TopicAssignment("t", topic_id, {0: (1,)}, {"max.message.bytes": "1000"})
    assert manager.reconfigure() == 1
    assert part.log.config.max_message_bytes == 1000, "the topic's own value wins over the broker's default"
    assert part.min_insync_replicas == 2 and part.log.config.flush_ms == LONG_MAX
    assert ("t", 0) not in manager.partitions.timed_flush
    assert manager.reconfigure() == 0, "nothing changed, nothing done"
    manager.close_all()

"""Change topics are stamped with the broker's append time, so retention counts from when a
change reached the log, not from when the source committed it (a capture running days behind
must not see its records deleted as soon as their segment rolls)."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from sluice.clients import close_within
from sluice.pipeline.execution import ensure_topics
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.timeout(120)

TEN_DAYS_MS = 10 * 24 * 3600 * 1000


def test_sync_creates_change_topics_with_log_append_time(cluster: TestCluster) -> None:
    """Before, ``ensure_topics`` created them with CreateTime:
    ``AssertionError: assert 'CreateTime' == 'LogAppendTime'``."""
    ensure_topics(cluster.bootstrap, ["shop.changes"], 2, None)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    (future,) = admin.describe_configs([ConfigResource("topic", "shop.changes")]).values()
    assert future.result(30)["message.timestamp.type"].value == "LogAppendTime"

    before_ms = int(time.time() * 1000)
    delivered: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "log_level": 0})
    producer.produce(
        "shop.changes",
        value=b"{}",
        partition=0,
        timestamp=before_ms - TEN_DAYS_MS,  # a change committed ten days ago
        on_delivery=lambda err, msg: delivered.append(msg.timestamp()),
    )
    assert producer.flush(30) == 0
    after_ms = int(time.time() * 1000)
    ((kind, stamped),) = delivered
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before_ms <= stamped <= after_ms

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "ts", "log_level": 0})
    consumer.assign([TopicPartition("shop.changes", 0, 0)])
    try:
        msg = consumer.poll(30)
        assert msg is not None and msg.error() is None
        assert msg.timestamp() == (TIMESTAMP_LOG_APPEND_TIME, stamped)
    finally:
        close_within(consumer)

"""Change sources: each turns a source's changes into envelopes (`sluice.sync.envelope`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sluice.clients import close_within


class LogTailError(RuntimeError):
    """The last record of a partition could not be read (the source cannot know where it was)."""


def last_envelopes(
    bootstrap: str, topics: list[str], client: dict[str, str] | None = None
) -> Iterator[dict[str, Any]]:
    """The last envelope of every non-empty partition of `topics`: where a restarted source
    picks up from the log itself."""
    import orjson
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-recover",
            "enable.auto.commit": False,
            "log_level": 0,
            **(client or {}),  # confluent-kafka's security keys (ClientSecurity.confluent_config)
        }
    )
    try:
        meta = consumer.list_topics(timeout=15)
        for topic in topics:
            t = meta.topics.get(topic)
            if t is None or t.error is not None:
                continue
            for p in sorted(t.partitions):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, p, high - 1)])
                msg = consumer.poll(10)
                if msg is None or msg.error() is not None:
                    raise LogTailError(f"cannot read the last record of {topic}[{p}] to recover the position")
                doc = orjson.loads(msg.value() or b"{}")
                yield doc if isinstance(doc, dict) else {}
    finally:
        close_within(consumer)

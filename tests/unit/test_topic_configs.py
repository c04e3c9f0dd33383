"""Every topic config Kafka 3.9 defines is honoured, accepted for what Sluice does anyway, or
refused naming what Sluice does not do (storage/config.py, storage/topic_configs.py)."""

from __future__ import annotations

import pytest

from sluice.storage.config import LogConfig, known_topic_configs

#: Kafka 3.9's topic configs (TopicConfig and LogConfig's CONFIG definitions).
KAFKA_39 = {
    "cleanup.policy", "compression.gzip.level", "compression.lz4.level", "compression.type",
    "compression.zstd.level", "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms",
    "follower.replication.throttled.replicas", "index.interval.bytes",
    "leader.replication.throttled.replicas",
    "local.retention.bytes", "local.retention.ms", "max.compaction.lag.ms", "max.message.bytes",
    "message.downconversion.enable", "message.format.version", "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms", "message.timestamp.difference.max.ms", "message.timestamp.type",
    "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas", "preallocate",
    "remote.log.copy.disable", "remote.log.delete.on.disable", "remote.storage.enable", "retention.bytes",
    "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
}  # fmt: skip
#: The log cleaner's, which come with compaction (another change).
COMPACTION = {
    "delete.retention.ms",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
}


def test_every_kafka_topic_config_but_the_cleaners_is_known_with_kafkas_default() -> None:
    known = known_topic_configs()
    assert set(known) >= KAFKA_39 - COMPACTION, sorted(KAFKA_39 - COMPACTION - set(known))
    assert set(known) <= KAFKA_39, sorted(set(known) - KAFKA_39)
    defaults = {k: v for k, (v, _doc) in known.items()}
    assert defaults["compression.type"] == "producer"
    assert defaults["message.timestamp.before.max.ms"] == str(2**63 - 1)
    assert defaults["segment.index.bytes"] == "10485760"
    assert defaults["remote.storage.enable"] == "false"
    assert defaults["local.retention.ms"] == "-2"
    assert all(doc for _v, doc in known.values())


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("file.delete.delay.ms", "0"),
        ("file.delete.delay.ms", "600000"),
        ("preallocate", "false"),
        ("message.format.version", "0.10.2-IV0"),
        ("message.format.version", "3.9"),
        ("message.downconversion.enable", "true"),
        ("leader.replication.throttled.replicas", ""),
        ("remote.storage.enable", "false"),
        ("local.retention.ms", "86400000"),
        ("local.retention.bytes", "-2"),
        ("remote.log.copy.disable", "true"),
        ("remote.log.delete.on.disable", "true"),
    ],
)
def test_a_value_that_means_what_sluice_does_is_accepted(key: str, value: str) -> None:
    assert LogConfig.from_topic_config({key: value}) == LogConfig()


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("preallocate", "true", "does not preallocate"),
        ("remote.storage.enable", "TRUE", "tiered storage is not supported"),
        ("leader.replication.throttled.replicas", "*", "replication throttling"),
        ("follower.replication.throttled.replicas", "0:1, 1:2", "replication throttling"),
        ("preallocate", "yes", "must be true or false"),
        ("file.delete.delay.ms", "-1", "must be >= 0"),
        ("local.retention.ms", "-3", "must be >= -2"),
        ("message.format.version", "three", "Kafka version"),
        ("leader.replication.throttled.replicas", "0-1", "partition:broker"),
        ("segment.index.bytes", "3", "must be >= 4"),
        ("segment.jitter.ms", "-1", "must be >= 0"),
        ("message.timestamp.after.max.ms", "-5", "must be >= 0"),
    ],
)
def test_a_value_sluice_does_not_do_or_a_malformed_one_is_refused_naming_the_key(
    key: str, value: str, why: str
) -> None:
    with pytest.raises(ValueError) as raised:
        LogConfig.from_topic_config({key: value})
    assert key in str(raised.value) and why in str(raised.value), raised.value


def test_message_format_version_takes_the_version_names_kafka_3_9_takes() -> None:
    """librdkafka's and confluent-kafka's tests create topics with message.format.version
    0.10.0.0, which Kafka 3.9.1 takes (as 0.10.0); Sluice's pattern refused four parts.
    tests/conformance/test_differential.py compares every name with the peer."""
    from sluice.storage.topic_configs import kafka_version_known

    for taken in ("0.10.0.0", "0.10.0", "0.10.0-IV1", "0.10.0.0.0", "1.1.1", "2.8", "3.0-IV1", "3.9-IV0",
                  "4.0-IV1", " 3.0 ", "0.8.0"):  # fmt: skip
        assert kafka_version_known(taken), taken
        LogConfig.from_topic_config({"message.format.version": taken})
    for refused in ("2.9", "4.0", "4.0-IV2", "3.9-IV1", "0.7.0", "", "latest", "3.0-IV"):
        assert not kafka_version_known(refused), refused

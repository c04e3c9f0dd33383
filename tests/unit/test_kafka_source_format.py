"""The apply query on Spark's own Kafka source: the starting offsets it is given from the
target's, the settings it refuses, and which of the connector's jars the session loads."""

from __future__ import annotations

import orjson
import pytest

from sluice.pipeline.apply import ApplyConfig, check_source_format, kafka_starting_offsets
from sluice.pipeline.session import _artifact
from sluice.security.client import ClientSecurity


def test_starting_offsets_name_every_partition_read_and_only_those() -> None:
    stored = {("a", 0): 42, ("a", 2): 7, ("gone", 0): 99}
    doc = orjson.loads(kafka_starting_offsets(stored, [("a", 0), ("a", 1), ("a", 2), ("b", 0)]))
    # stored next offsets where the target has them, -2 (earliest) elsewhere; "gone" is not read
    assert doc == {"a": {"0": 42, "1": -2, "2": 7}, "b": {"0": -2}}


def test_starting_offsets_with_nothing_to_read_yet_are_earliest() -> None:
    assert kafka_starting_offsets({}, []) == "earliest"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"transaction_topic": "t.transactions"}, "transaction boundaries"),
        ({"security": ClientSecurity("SASL_PLAINTEXT", "SCRAM-SHA-512", "u", "p")}, "PLAINTEXT only"),
        ({"max_records_per_partition": 1000}, "one Spark partition per topic-partition"),
        ({"min_records_per_partition": 1000}, "one Spark partition per topic-partition"),
        ({"source_format": "parquet"}, "must be one of sluice, kafka"),
        ({"envelope": "debezium"}, "parses Sluice's envelope only"),
    ],
)
def test_settings_the_kafka_source_cannot_honour_are_refused(change: dict[str, object], message: str) -> None:
    config = ApplyConfig(bootstrap="b:1", target="sqlite:///x", topics=["t"], source_format="kafka")
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=message):
        check_source_format(config)


def test_the_sluice_source_keeps_its_settings() -> None:
    config = ApplyConfig(
        bootstrap="b:1",
        target="sqlite:///x",
        topics=["t"],
        transaction_topic="t.tx",
        max_records_per_partition=9,
    )
    check_source_format(config)


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("spark-token-provider-kafka-0-10_2.13-4.2.0.jar", "spark-token-provider-kafka-0-10_2.13"),
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("zstd-jni-1.5.6-9.jar", "zstd-jni"),
        ("scala-library-2.13.15.jar", "scala-library"),
    ],
)
def test_jar_names_give_their_artifact(jar: str, artifact: str) -> None:
    assert _artifact(jar) == artifact

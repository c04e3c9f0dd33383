"""Answers compared key by key and value by value (issue 33, item 7): what a broker answers for
each of Kafka's broker config keys, for each name of a Kafka version as ``message.format.version``,
and which records of a refused batch librdkafka fails. Each function observes one cluster; the
tests in ``test_differential.py`` call it on Kafka and on Sluice and compare."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.protocol.api import ApiKey
from sluice.sync.wire_client import WireClient

#: The broker both clusters' configs are altered on (Kafka's peer brokers and Sluice's test
#: brokers are both numbered from 1).
BROKER = "1"
#: A value of each Kafka config type, for a key whose Kafka default is null.
SAMPLE = {"BOOLEAN": "true", "STRING": "x", "INT": "1", "SHORT": "1", "LONG": "1", "DOUBLE": "0.5",
          "LIST": "", "CLASS": "java.lang.Object", "PASSWORD": "secret"}  # fmt: skip
_TYPES = {1: "BOOLEAN", 2: "STRING", 3: "INT", 4: "SHORT", 5: "LONG", 6: "DOUBLE", 7: "LIST", 8: "CLASS",
          9: "PASSWORD"}  # fmt: skip
SET, DELETE = 0, 1


def broker_configs(bootstrap: str) -> dict[str, dict[str, Any]]:
    """Every config of broker ``BROKER`` as its DescribeConfigs v4 gives it: name -> value,
    read-only, type name, source."""
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        r = w.request(
            ApiKey.DESCRIBE_CONFIGS,
            4,
            {
                "resources": [{"resource_type": 4, "resource_name": BROKER, "configuration_keys": None}],
                "include_synonyms": False,
                "include_documentation": False,
            },
        )
    (result,) = r["results"]
    assert result["error_code"] == 0, result
    return {
        c["name"]: {
            "value": c["value"],
            "read_only": c["read_only"],
            "type": _TYPES.get(c["config_type"], "UNKNOWN"),
            "source": c["config_source"],
        }
        for c in result["configs"]
    }


def alter_broker(
    bootstrap: str, entity: str, ops: list[tuple[str, int, str | None]], *, validate_only: bool
) -> tuple[int, str | None]:
    """IncrementalAlterConfigs of one broker (``""``: the cluster's defaults): (error, message)."""
    with WireClient.connect(bootstrap, timeout_s=30) as w:
        r = w.request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 4,
                        "resource_name": entity,
                        "configs": [{"name": k, "config_operation": o, "value": v} for k, o, v in ops],
                    }
                ],
                "validate_only": validate_only,
            },
        )
    (answer,) = r["responses"]
    return answer["error_code"], answer["error_message"]


def broker_key_answers(bootstrap: str, values: dict[str, str]) -> dict[tuple[str, str], int]:
    """For each key, the error code of a validate-only SET of ``values[key]`` on broker
    ``BROKER`` and on the cluster's defaults: ``{("broker"|"cluster", key): code}``."""
    answers: dict[tuple[str, str], int] = {}
    for key, value in sorted(values.items()):
        for scope, entity in (("broker", BROKER), ("cluster", "")):
            answers[(scope, key)] = alter_broker(bootstrap, entity, [(key, SET, value)], validate_only=True)[
                0
            ]
    return answers


def described(bootstrap: str, key: str, want: str | None = None, timeout_s: float = 20) -> dict[str, Any]:
    """Broker ``BROKER``'s DescribeConfigs entry of ``key`` (value, read-only, source), once its
    value is ``want`` (Kafka applies a change after answering it, Sluice before)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with WireClient.connect(bootstrap, timeout_s=15) as w:
            r = w.request(
                ApiKey.DESCRIBE_CONFIGS,
                4,
                {
                    "resources": [{"resource_type": 4, "resource_name": BROKER, "configuration_keys": [key]}],
                    "include_synonyms": False,
                    "include_documentation": False,
                },
            )
        entries = [c for c in r["results"][0]["configs"] if c["name"] == key]
        got = {"value": entries[0]["value"], "read_only": entries[0]["read_only"],
               "source": entries[0]["config_source"]} if entries else {}  # fmt: skip
        if want is None or got.get("value") == want or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def create_topics(
    bootstrap: str, topics: dict[str, dict[str, str]], *, validate_only: bool
) -> dict[str, tuple[int, str | None]]:
    """CreateTopics of every ``{name: configs}`` in one request (one partition, one replica):
    name -> (error, message), asked of the controller."""
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        meta = w.request(ApiKey.METADATA, 1, {"topics": []})
    controller = next(b for b in meta["brokers"] if b["node_id"] == meta["controller_id"])
    with WireClient.connect(f"{controller['host']}:{controller['port']}", timeout_s=60) as w:
        r = w.request(
            ApiKey.CREATE_TOPICS,
            5,
            {
                "topics": [
                    {
                        "name": name,
                        "num_partitions": 1,
                        "replication_factor": 1,
                        "assignments": [],
                        "configs": [{"name": k, "value": v} for k, v in configs.items()],
                    }
                    for name, configs in topics.items()
                ],
                "timeout_ms": 30000,
                "validate_only": validate_only,
            },
        )
    return {t["name"]: (t["error_code"], t["error_message"]) for t in r["topics"]}


def topic_config(bootstrap: str, topic: str, key: str) -> list[Any]:
    """(value, source) of one config of a topic, as DescribeConfigs gives it."""
    with WireClient.connect(bootstrap, timeout_s=15) as w:
        r = w.request(
            ApiKey.DESCRIBE_CONFIGS,
            1,
            {
                "resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": [key]}],
                "include_synonyms": False,
            },
        )
    return [[c["value"], c["config_source"]] for c in r["results"][0]["configs"] if c["name"] == key]


def alter_topic(bootstrap: str, topic: str, key: str, value: str, *, incremental: bool) -> int:
    """AlterConfigs (the topic's whole set: just this key) or IncrementalAlterConfigs SET of one
    key of a topic: the error code."""
    config: dict[str, Any] = {"name": key, "value": value}
    if incremental:
        config["config_operation"] = SET
    with WireClient.connect(bootstrap, timeout_s=30) as w:
        r = w.request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS if incremental else ApiKey.ALTER_CONFIGS,
            1,
            {
                "resources": [{"resource_type": 2, "resource_name": topic, "configs": [config]}],
                "validate_only": False,
            },
        )
    return int(r["responses"][0]["error_code"])


def librdkafka_record_failures(bootstrap: str, topic: str) -> list[list[Any]]:
    """Four records in one batch (linger long, one flush) to a new compacted topic, records 1
    and 3 without keys: each record's key and the error librdkafka reports for it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(30)
    deadline = time.monotonic() + 20
    while admin.list_topics(topic, timeout=10).topics[topic].error is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} has no leader after 20 s")
        time.sleep(0.2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 60_000, "acks": "all"})
    failures: list[list[Any]] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        failures.append([msg.key(), None if err is None else err.name()])

    for i, key in enumerate([b"k0", None, b"k2", None]):
        producer.produce(topic, key=key, value=b"v%d" % i, partition=0, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    return failures

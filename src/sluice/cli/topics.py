"""`sluice topic`, `sluice produce` and `sluice consume`: topics and console clients."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sluice.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CommandConfig,
    client_security,
    console,
    err,
    fail,
)
from sluice.clients import close_within

topic_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete topics.")


def _admin(bootstrap: str, command_config: Path | None):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **_client(command_config, bootstrap)})


def _client(command_config: Path | None, bootstrap: str) -> dict[str, str]:
    """The confluent-kafka keys of the command's client security (--command-config)."""
    return client_security(command_config, bootstrap).confluent_config()


def _services(bootstrap: str, command_config: Path | None):  # type: ignore[no-untyped-def]
    from sluice.service.context import Services

    return Services(None, bootstrap, security=client_security(command_config, bootstrap))


def _parse_configs(configs: list[str]) -> dict[str, str]:
    result = {}
    for item in configs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--config takes key=value, got {item!r}")
        result[key] = value
    return result


@topic_app.command("create")
def topic_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p")] = 1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", help="-1: cluster default")
    ] = -1,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="key=value, repeatable")] = None,
    allow_single_replica: Annotated[
        bool,
        typer.Option(
            "--allow-single-replica", help="Allow replication factor 1 (no copy survives a failure)"
        ),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    from sluice.service.errors import ServiceError
    from sluice.service.topics import SINGLE_REPLICA_RISK, create_topic

    cfg = _parse_configs(config or [])
    if replication_factor == 1:
        if not allow_single_replica:
            raise fail(f"{SINGLE_REPLICA_RISK}. Pass --allow-single-replica to create it anyway.")
        err.print(f"[yellow]warning:[/] {SINGLE_REPLICA_RISK}")
    try:
        create_topic(
            _services(bootstrap, command_config),
            name,
            partitions,
            replication_factor,
            cfg,
            allow_single_replica=True,
        )
    except ServiceError as exc:
        raise fail(str(exc)) from None
    console.print(f"created topic {name} with {partitions} partition(s)")


@topic_app.command("alter")
def topic_alter(
    name: str,
    config: Annotated[
        list[str] | None, typer.Option("--config", "-c", help="key=value to set, repeatable")
    ] = None,
    delete_config: Annotated[
        list[str] | None, typer.Option("--delete-config", help="key to return to its default, repeatable")
    ] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """Change a topic's configs, live on every replica (nothing changes if any is refused)."""
    from sluice.service.errors import ServiceError
    from sluice.service.topics import alter_topic_configs

    try:
        done = alter_topic_configs(
            _services(bootstrap, command_config), name, _parse_configs(config or []), delete_config or []
        )
    except ServiceError as exc:
        raise fail(str(exc)) from None
    changes = [f"{k}={v}" for k, v in done["set"].items()] + [f"{k} deleted" for k in done["deleted"]]
    console.print(f"altered topic {name}: {', '.join(changes)}", soft_wrap=True)


@topic_app.command("add-partitions")
def topic_add_partitions(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p", help="the new partition count")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """Grow a topic to --partitions partitions (records of a key written afterwards may go to
    another partition than before: keys hash by the partition count)."""
    from sluice.service.errors import ServiceError
    from sluice.service.topics import add_partitions

    try:
        add_partitions(_services(bootstrap, command_config), name, partitions)
    except ServiceError as exc:
        raise fail(str(exc)) from None
    console.print(f"topic {name} has {partitions} partition(s)")


def _kafka_error_text(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    text = getattr(arg, "str", None)
    return text() if callable(text) else str(arg)


@topic_app.command("list")
def topic_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, command_config: CommandConfig = None) -> None:
    md = _admin(bootstrap, command_config).list_topics(timeout=15)
    for name in sorted(md.topics):
        print(name)


@topic_app.command("delete")
def topic_delete(
    name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, command_config: CommandConfig = None
) -> None:
    from sluice.service.errors import ServiceError
    from sluice.service.topics import delete_topic_via_brokers

    try:
        delete_topic_via_brokers(_services(bootstrap, command_config), name)
    except ServiceError as exc:
        raise fail(str(exc)) from None
    console.print(f"deleted topic {name}")


@topic_app.command("describe")
def topic_describe(
    name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, command_config: CommandConfig = None
) -> None:
    """Per partition: leader, replicas, ISR, log start and end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    from sluice.cluster.health import OFFLINE, OK, classify_partition
    from sluice.cluster.layout import PartitionState

    md = _admin(bootstrap, command_config).list_topics(topic=name, timeout=15)
    topic = md.topics.get(name)
    if topic is None or (topic.error is not None and topic.error.code() == 3):
        raise fail(f"topic {name!r} does not exist")
    live = set(md.brokers)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-cli",
            "enable.auto.commit": False,
            "log_level": 3,
            **_client(command_config, bootstrap),
        }
    )
    table = Table(title=f"topic {name} ({len(topic.partitions)} partitions)")
    for col in ("partition", "leader", "replicas", "isr", "log start", "log end", "status"):
        table.add_column(col)
    try:
        for pid in sorted(topic.partitions):
            p = topic.partitions[pid]
            start = end = "-"
            state = PartitionState(p.leader, 0, tuple(p.isrs) or tuple(p.replicas), 0)
            health = classify_partition(name, pid, state, p.replicas, live)
            status = "ok" if health.status == OK else f"[{'red' if health.status == OFFLINE else 'yellow'}]"
            if health.status != OK:
                status += f"{health.status}[/]: {health.reason}"
            if health.status != OFFLINE:
                try:
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(name, pid), timeout=10)
                    start, end = str(lo), str(hi)
                except Exception as exc:
                    status = f"[yellow]offsets unavailable[/]: {_kafka_error_text(exc)}"
            table.add_row(str(pid), str(p.leader), str(p.replicas), str(p.isrs), start, end, status)
    finally:
        close_within(consumer)
    console.print(table)


def produce(
    topic: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    key_separator: Annotated[
        str | None, typer.Option(help="Split each line into key and value at this string")
    ] = None,
    acks: Annotated[str, typer.Option()] = "all",
    command_config: CommandConfig = None,
) -> None:
    """Send each line of standard input as one record (idempotent, acks=all by default)."""
    from confluent_kafka import Producer

    failures: list[str] = []
    sent = 0

    def on_delivery(error: object, msg: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": acks == "all",
            "linger.ms": 5,
            "log_level": 3,
            **_client(command_config, bootstrap),
        }
    )
    for line in sys.stdin:
        line = line.rstrip("\n")
        key: str | None = None
        if key_separator is not None and key_separator in line:
            key, line = line.split(key_separator, 1)
        while True:
            try:
                producer.produce(
                    topic,
                    value=line.encode(),
                    key=key.encode() if key is not None else None,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
        producer.poll(0)
    remaining = producer.flush(60)
    if failures or remaining:
        raise fail(f"{len(failures) + remaining} of {sent} record(s) were not acknowledged: {failures[:3]}")
    err.print(f"{sent} record(s) acknowledged")


def consume(
    topic: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
    max_messages: Annotated[
        int, typer.Option("--max-messages", help="Stop after N records (0: run until Ctrl-C)")
    ] = 0,
    timeout: Annotated[
        float, typer.Option(help="Stop after this many seconds without a record (0: never)")
    ] = 0,
    print_key: Annotated[bool, typer.Option("--print-key")] = False,
    command_config: CommandConfig = None,
) -> None:
    """Print records of TOPIC by partition assignment (no consumer group)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-console",
            "enable.auto.commit": False,
            "log_level": 3,
            "enable.partition.eof": False,
            **_client(command_config, bootstrap),
        }
    )
    md = consumer.list_topics(topic, timeout=15)
    if topic not in md.topics or md.topics[topic].error is not None:
        close_within(consumer)
        raise fail(f"topic {topic!r} does not exist")
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in sorted(md.topics[topic].partitions)])
    count = 0
    last = time.monotonic()
    try:
        while max_messages <= 0 or count < max_messages:
            msg = consumer.poll(0.5)
            if msg is None:
                if timeout and time.monotonic() - last > timeout:
                    break
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise fail(f"consume failed: {error.str()}")
            last = time.monotonic()
            raw_value, raw_key = msg.value(), msg.key()
            value = raw_value.decode(errors="replace") if raw_value is not None else "null"
            if print_key:
                key = raw_key.decode(errors="replace") if raw_key is not None else "null"
                print(f"{key}\t{value}")
            else:
                print(value)
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        close_within(consumer)
    err.print(f"{count} record(s) consumed")

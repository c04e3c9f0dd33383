"""A consumer-group member in its own process, so that a test can ``kill -9`` it.

    python -m tests.support.group_member --client confluent|kafka-python|aiokafka \\
        --bootstrap HOST:PORT --topic T --group G --out FILE

It subscribes to one topic and, per batch: appends what it processed to ``--out`` and flushes,
then commits the next offset of each partition synchronously (at least once: a crash between
the two only repeats records). Lines of ``--out``:

    A 0,1,2         the member's assignment changed to these partitions ("A -": none)
    R p offset v    processed the record with value v at offset of partition p
    C p offset      a commit of offset for partition p succeeded

SIGTERM (or SIGINT) closes the consumer cleanly, which leaves the group.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading
from collections.abc import Iterable
from typing import IO, Any

from sluice.clients import close_within

stop = threading.Event()


class Journal:
    def __init__(self, path: str):
        self.f: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def assignment(self, partitions: Iterable[int]) -> None:
        ps = sorted(partitions)
        self.f.write("A " + (",".join(map(str, ps)) if ps else "-") + "\n")
        self.f.flush()

    def processed(self, records: Iterable[tuple[int, int, bytes]]) -> None:
        self.f.write("".join(f"R {p} {o} {v.decode()}\n" for p, o, v in records))
        self.f.flush()

    def committed(self, offsets: dict[int, int]) -> None:
        self.f.write("".join(f"C {p} {o}\n" for p, o in sorted(offsets.items())))
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def next_offsets(records: list[tuple[int, int, bytes]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for p, o, _ in records:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def run_confluent(args: argparse.Namespace, journal: Journal) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": args.client_id,
            "enable.auto.commit": False,
            "auto.offset.reset": args.auto_offset_reset,
            "session.timeout.ms": args.session_timeout_ms,
            "heartbeat.interval.ms": args.heartbeat_interval_ms,
            "max.poll.interval.ms": args.max_poll_interval_ms,
        }
    )

    def on_assign(c: Any, partitions: list[Any]) -> None:
        journal.assignment(tp.partition for tp in partitions)

    def on_revoke(c: Any, partitions: list[Any]) -> None:
        journal.assignment([])

    consumer.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
    try:
        while not stop.is_set():
            msgs = consumer.consume(500, timeout=0.2)
            records = []
            for m in msgs:
                if m.error() is not None:
                    print(f"consume error: {m.error()}", file=sys.stderr, flush=True)
                    continue
                p, o, v = m.partition(), m.offset(), m.value()
                assert p is not None and o is not None and v is not None
                records.append((p, o, v))
            if not records:
                continue
            journal.processed(records)
            offsets = next_offsets(records)
            try:
                consumer.commit(
                    offsets=[TopicPartition(args.topic, p, o) for p, o in offsets.items()],
                    asynchronous=False,
                )
            except KafkaException as exc:
                print(f"commit failed: {exc}", file=sys.stderr, flush=True)
                continue
            journal.committed(offsets)
    finally:
        close_within(consumer)


def run_kafka_python(args: argparse.Namespace, journal: Journal) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.errors import KafkaError
    from kafka.structs import OffsetAndMetadata, TopicPartition

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked: Any) -> None:
            journal.assignment([])

        def on_partitions_assigned(self, assigned: Any) -> None:
            journal.assignment(tp.partition for tp in assigned)

    consumer = KafkaConsumer(
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        client_id=args.client_id,
        enable_auto_commit=False,
        auto_offset_reset=args.auto_offset_reset,
        session_timeout_ms=args.session_timeout_ms,
        heartbeat_interval_ms=args.heartbeat_interval_ms,
        max_poll_interval_ms=args.max_poll_interval_ms,
    )
    consumer.subscribe([args.topic], listener=Listener())
    try:
        while not stop.is_set():
            batch = consumer.poll(timeout_ms=200, max_records=500)
            records = [(tp.partition, m.offset, m.value) for tp, ms in batch.items() for m in ms]
            if not records:
                continue
            journal.processed(records)
            offsets = next_offsets(records)
            try:
                consumer.commit(
                    {
                        TopicPartition(args.topic, p): OffsetAndMetadata(o, None, -1)
                        for p, o in offsets.items()
                    }
                )
            except KafkaError as exc:
                print(f"commit failed: {exc!r}", file=sys.stderr, flush=True)
                continue
            journal.committed(offsets)
    finally:
        close_within(consumer)


def run_aiokafka(args: argparse.Namespace, journal: Journal) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.errors import KafkaError
    from aiokafka.structs import TopicPartition

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            journal.assignment([])

        async def on_partitions_assigned(self, assigned: Any) -> None:
            journal.assignment(tp.partition for tp in assigned)

    async def main() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            client_id=args.client_id,
            enable_auto_commit=False,
            auto_offset_reset=args.auto_offset_reset,
            session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=args.heartbeat_interval_ms,
            max_poll_interval_ms=args.max_poll_interval_ms,
        )
        consumer.subscribe([args.topic], listener=Listener())
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200, max_records=500)
                records = [(tp.partition, m.offset, m.value) for tp, ms in batch.items() for m in ms]
                if not records:
                    continue
                journal.processed(records)
                offsets = next_offsets(records)
                try:
                    await consumer.commit({TopicPartition(args.topic, p): o for p, o in offsets.items()})
                except KafkaError as exc:
                    print(f"commit failed: {exc!r}", file=sys.stderr, flush=True)
                    continue
                journal.committed(offsets)
        finally:
            await consumer.stop()

    asyncio.run(main())


RUNNERS = {"confluent": run_confluent, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--client", choices=sorted(RUNNERS), required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--client-id", default="group-member")
    ap.add_argument("--auto-offset-reset", default="earliest")
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=1000)
    ap.add_argument("--max-poll-interval-ms", type=int, default=20000)
    args = ap.parse_args(argv)

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    journal = Journal(args.out)
    try:
        RUNNERS[args.client](args, journal)
    finally:
        journal.close()


if __name__ == "__main__":
    main()

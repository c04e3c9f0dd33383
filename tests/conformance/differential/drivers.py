"""One driver per client library, all answering the same operations with the same shapes:
``driver.call(op, bootstrap, **args)`` returns ``{"ok": result}`` or ``{"error": name}`` (the
error's name as that client reports it: librdkafka's for confluent-kafka, kafka-python's error
class message, Kafka's ``Errors`` name for the Java client). A scenario compares one client's
observations of Kafka with the same client's observations of Sluice."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Protocol

from sluice.clients import close_within

#: The prefix of an error that is not the client's answer but the driver's own fault (a Python
#: TypeError, a Java ClassCastException): a comparison fails on it, whatever both sides saw.
DRIVER_FAULT = "DRIVER:"

#: How long a driver waits for a fetch to gather what it asked for, or for a group to settle.
WAIT_S = 20.0

#: Every group member's session.timeout.ms: Kafka's and the clients' default since Kafka 3.0
#: (KIP-735). In two CI failures a kafka-python member went more than 10 s (the value before)
#: without a heartbeat and was evicted mid-scenario (its later LeaveGroup: UNKNOWN_MEMBER_ID).
#: No step waits for a session to expire: members leave by LeaveGroup.
SESSION_TIMEOUT_MS = 45_000


class Driver(Protocol):
    name: str

    def call(self, op: str, bootstrap: str, **args: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...


class _PythonDriver:
    name = ""

    def __init__(self) -> None:
        self.members: dict[str, Any] = {}
        self.admins: dict[str, Any] = {}

    def call(self, op: str, bootstrap: str, **args: Any) -> dict[str, Any]:
        try:
            return {"ok": getattr(self, f"op_{op}")(bootstrap, **args)}
        except Exception as exc:
            return {"error": self.error_name(exc), "detail": f"{type(exc).__name__}: {exc}"}

    def error_name(self, exc: Exception) -> str:
        raise NotImplementedError

    def close(self) -> None:
        for m in self.members.values():
            self._close_member(m)
        self.members.clear()

    def _close_member(self, member: Any) -> None:
        member.close()

    def op_poll_members(self, bootstrap: str, partitions: int) -> dict[str, list[int]]:
        """Poll every member until their assignments cover ``partitions`` partitions, each once,
        with every member holding some while there are enough to go round, unchanged over 5
        samples 0.2 s apart; answers each member's sorted assignment. Without the second
        condition a member that has joined but whose rebalance is still running (the others hold
        everything from the generation before) looked settled, and the steps after it raced the
        rebalance.

        Each member polls in a thread of its own, without pause, as an application runs its
        consumer. Polled one after the other, kafka-python 3.0.12 members livelocked in about
        one run of three, against Kafka and against Sluice alike: its join_group_async drops a
        join that completed between two of the member's polls (a done ``_join_task`` is
        replaced by a fresh JoinGroup), so a rebalance that ended while the other member was
        being polled started another one, and the other member rejoined in turn (DEBUG log: a
        SyncGroup answered, then at the member's next poll "(Re-)joining group")."""
        members = sorted(self.members.items())
        latest: dict[str, list[int]] = {}
        failed: list[Exception] = []
        stop = threading.Event()

        def keep_polling(handle: str, member: Any) -> None:
            try:
                while not stop.is_set():
                    latest[handle] = self._poll_assignment(member)
            except Exception as exc:  # the client's answer: raised in the caller below
                failed.append(exc)

        threads = [threading.Thread(target=keep_polling, args=m, daemon=True) for m in members]
        for t in threads:
            t.start()
        deadline = time.monotonic() + WAIT_S
        stable, last = 0, None
        try:
            while time.monotonic() < deadline:
                time.sleep(0.2)
                if failed:
                    raise failed[0]
                now = {handle: latest[handle] for handle, _ in members if handle in latest}
                flat = [p for ps in now.values() for p in ps]
                holding = sum(1 for ps in now.values() if ps)
                settled = (
                    len(now) == len(members)
                    and len(flat) == partitions
                    and len(set(flat)) == partitions
                    and holding == min(partitions, len(now))
                    and now == last
                )
                stable = stable + 1 if settled else 0
                last = now
                if stable >= 5:
                    return now
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT_S)
        raise AssertionError(f"members never settled: {last}")

    def _poll_assignment(self, member: Any) -> list[int]:
        raise NotImplementedError

    def op_leave(self, bootstrap: str, member: str) -> str:
        self._close_member(self.members.pop(member))
        return "NONE"


class ConfluentDriver(_PythonDriver):
    """confluent-kafka (librdkafka)."""

    name = "confluent"

    def error_name(self, exc: Exception) -> str:
        from confluent_kafka import KafkaError, KafkaException

        if isinstance(exc, KafkaException) and isinstance(exc.args[0], KafkaError):
            return str(exc.args[0].name())
        return f"{DRIVER_FAULT}{type(exc).__name__}"

    def _admin(self, bootstrap: str) -> Any:
        """One AdminClient per cluster, kept: a dropped one fails its pending futures (_DESTROY)."""
        from confluent_kafka.admin import AdminClient

        if bootstrap not in self.admins:
            self.admins[bootstrap] = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        return self.admins[bootstrap]

    def op_create_topic(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None = None,
    ) -> str:
        from confluent_kafka.admin import NewTopic

        t = NewTopic(topic, partitions, replication_factor, config=configs or {})
        self._admin(bootstrap).create_topics([t], operation_timeout=20)[topic].result(30)
        return "NONE"

    def op_delete_topic(self, bootstrap: str, topic: str) -> str:
        self._admin(bootstrap).delete_topics([topic], operation_timeout=20)[topic].result(30)
        return "NONE"

    def op_create_partitions(self, bootstrap: str, topic: str, count: int) -> str:
        from confluent_kafka.admin import NewPartitions

        self._admin(bootstrap).create_partitions([NewPartitions(topic, count)], operation_timeout=20)[
            topic
        ].result(30)
        return "NONE"

    def op_metadata(self, bootstrap: str, topic: str) -> dict[str, Any]:
        from confluent_kafka import KafkaError, KafkaException

        t = self._admin(bootstrap).list_topics(topic, timeout=15).topics[topic]
        if t.error is not None:
            raise KafkaException(KafkaError(t.error.code()))
        parts = [
            {"partition": p.id, "replicas": len(p.replicas), "isr": len(p.isrs)}
            for p in sorted(t.partitions.values(), key=lambda p: p.id)
        ]
        return {"partitions": parts}

    def op_describe_configs(self, bootstrap: str, topic: str, names: list[str]) -> dict[str, Any]:
        from confluent_kafka.admin import ConfigResource, ConfigSource

        r = ConfigResource(ConfigResource.Type.TOPIC, topic)
        entries = self._admin(bootstrap).describe_configs([r])[r].result(30)
        return {
            n: None
            if n not in entries
            else [str(entries[n].value), ConfigSource(entries[n].source).name, entries[n].is_read_only]
            for n in names
        }

    def op_describe_cluster(self, bootstrap: str) -> dict[str, Any]:
        d = self._admin(bootstrap).describe_cluster(request_timeout=20).result(30)
        return {
            "nodes": len(d.nodes),
            "controller": d.controller is not None,
            "cluster_id": bool(d.cluster_id),
        }

    def op_produce(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        records: list[dict[str, Any]],
        idempotent: bool = False,
    ) -> list[int]:
        from confluent_kafka import KafkaException, Producer

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": idempotent,
                "linger.ms": 5,
                "message.max.bytes": 4 << 20,
                "message.timeout.ms": 30000,
                "retries": 2**31 - 1 if idempotent else 0,
                "log_level": 0,
            }
        )
        results: list[Any] = [None] * len(records)

        def report(i: int) -> Any:
            def on_delivery(err: Any, msg: Any) -> None:
                results[i] = err if err is not None else msg.offset()

            return on_delivery

        for i, r in enumerate(records):
            value = r["value"] * r.get("value_repeat", 1) if r["value"] is not None else None
            producer.produce(
                topic,
                value=None if value is None else value.encode(),
                key=None if r.get("key") is None else r["key"].encode(),
                partition=partition,
                headers=[(k, None if v is None else v.encode()) for k, v in r.get("headers", [])],
                timestamp=r.get("timestamp") or 0,
                on_delivery=report(i),
            )
        producer.flush(40)
        for res in results:
            if not isinstance(res, int):
                raise KafkaException(res)
        return results

    def op_fetch(
        self, bootstrap: str, topic: str, partition: int, offset: int, count: int
    ) -> list[dict[str, Any]]:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"probe-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "allow.auto.create.topics": False,
                "log_level": 0,
            }
        )
        try:
            c.assign([TopicPartition(topic, partition, offset)])
            got: list[dict[str, Any]] = []
            deadline = time.monotonic() + WAIT_S
            while len(got) < count and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    raise KafkaException(m.error())
                ts_type, ts = m.timestamp()
                got.append(
                    {
                        "offset": m.offset(),
                        "key": None if m.key() is None else m.key().decode(),
                        "value": None if m.value() is None else m.value().decode(),
                        "headers": [[k, None if v is None else v.decode()] for k, v in (m.headers() or [])],
                        "timestamp": ts,
                        "timestamp_type": {1: "CREATE_TIME", 2: "LOG_APPEND_TIME"}.get(
                            ts_type, "NO_TIMESTAMP_TYPE"
                        ),
                    }
                )
            return got
        finally:
            close_within(c, 10)

    def op_list_offsets(
        self, bootstrap: str, topic: str, partition: int, spec: str, timestamp: int | None = None
    ) -> dict[str, int]:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        s = {
            "earliest": OffsetSpec.earliest,
            "latest": OffsetSpec.latest,
            "max_timestamp": OffsetSpec.max_timestamp,
        }.get(spec, lambda: OffsetSpec.for_timestamp(timestamp))()
        tp = TopicPartition(topic, partition)
        info = self._admin(bootstrap).list_offsets({tp: s}, request_timeout=20)[tp].result(30)
        return {"offset": info.offset, "timestamp": info.timestamp}

    def op_commit(
        self, bootstrap: str, topic: str, partition: int, group: str, offset: int, metadata: str | None = None
    ) -> str:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, "log_level": 0}
        )
        try:
            tp = TopicPartition(topic, partition, offset, metadata=metadata or "")
            for r in c.commit(offsets=[tp], asynchronous=False) or []:
                if r.error is not None:
                    from confluent_kafka import KafkaException

                    raise KafkaException(r.error)
            return "NONE"
        finally:
            close_within(c, 10)

    def op_committed(self, bootstrap: str, group: str) -> dict[str, Any]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        r = (
            self._admin(bootstrap)
            .list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group]
            .result(30)
        )
        return {
            f"{tp.topic}-{tp.partition}": [tp.offset, tp.metadata or ""]
            for tp in r.topic_partitions
            if tp.offset >= 0
        }

    def op_join(self, bootstrap: str, topic: str, group: str, member: str) -> str:
        from confluent_kafka import Consumer

        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 500,
                "log_level": 0,
            }
        )
        c.subscribe([topic])
        self.members[member] = c
        return "NONE"

    def _poll_assignment(self, member: Any) -> list[int]:
        member.poll(0.1)
        return sorted(tp.partition for tp in member.assignment())

    def _close_member(self, member: Any) -> None:
        close_within(member, 15)

    def op_describe_group(self, bootstrap: str, group: str) -> dict[str, Any]:
        d = self._admin(bootstrap).describe_consumer_groups([group])[group].result(30)
        return {
            "state": d.state.name,
            "protocol": d.partition_assignor,
            "assignments": sorted(
                (sorted(tp.partition for tp in m.assignment.topic_partitions) for m in d.members), key=str
            ),
        }


class KafkaPythonDriver(_PythonDriver):
    """kafka-python (pure Python)."""

    name = "kafka-python"

    def error_name(self, exc: Exception) -> str:
        import kafka.errors

        if isinstance(exc, kafka.errors.KafkaError):
            return str(getattr(exc, "message", None) or type(exc).__name__)
        return f"{DRIVER_FAULT}{type(exc).__name__}"

    def _admin(self, bootstrap: str) -> Any:
        from kafka import KafkaAdminClient

        return KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)

    def _with_admin(self, bootstrap: str, f: Any) -> Any:
        a = self._admin(bootstrap)
        try:
            return f(a)
        finally:
            a.close()

    def op_create_topic(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None = None,
    ) -> str:
        spec = {
            topic: {
                "num_partitions": partitions,
                "replication_factor": replication_factor,
                "configs": configs or {},
            }
        }
        self._with_admin(bootstrap, lambda a: a.create_topics(spec, timeout_ms=20000))
        return "NONE"

    def op_delete_topic(self, bootstrap: str, topic: str) -> str:
        self._with_admin(bootstrap, lambda a: a.delete_topics([topic], timeout_ms=20000))
        return "NONE"

    def op_create_partitions(self, bootstrap: str, topic: str, count: int) -> str:
        self._with_admin(bootstrap, lambda a: a.create_partitions({topic: count}, timeout_ms=20000))
        return "NONE"

    def op_metadata(self, bootstrap: str, topic: str) -> Any:
        return self._with_admin(bootstrap, lambda a: a.describe_topics([topic]))

    def op_describe_configs(self, bootstrap: str, topic: str, names: list[str]) -> Any:
        from kafka.admin import ConfigResource, ConfigResourceType

        r = ConfigResource(ConfigResourceType.TOPIC, topic, configs={n: None for n in names})
        return self._with_admin(bootstrap, lambda a: a.describe_configs([r], config_filter="all"))

    def op_describe_cluster(self, bootstrap: str) -> Any:
        d = self._with_admin(bootstrap, lambda a: a.describe_cluster())
        return {
            "nodes": len(d["brokers"]),
            "controller": d.get("controller_id", -1) >= 0,
            "cluster_id": bool(d["cluster_id"]),
        }

    def op_produce(
        self,
        bootstrap: str,
        topic: str,
        partition: int,
        records: list[dict[str, Any]],
        idempotent: bool = False,
    ) -> list[int]:
        from kafka import KafkaProducer

        p = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=idempotent,
            linger_ms=5,
            max_request_size=4 << 20,
            retries=2**31 - 1 if idempotent else 0,
            request_timeout_ms=15000,
        )
        try:
            futures = []
            for r in records:
                value = r["value"] * r.get("value_repeat", 1) if r["value"] is not None else None
                futures.append(
                    p.send(
                        topic,
                        value=None if value is None else value.encode(),
                        key=None if r.get("key") is None else r["key"].encode(),
                        partition=partition,
                        # kafka-python cannot send a null header value: an empty one instead
                        headers=[(k, b"" if v is None else v.encode()) for k, v in r.get("headers", [])],
                        timestamp_ms=r.get("timestamp"),
                    )
                )
            p.flush(40)
            return [f.get(timeout=30).offset for f in futures]
        finally:
            p.close(10)

    def op_fetch(
        self, bootstrap: str, topic: str, partition: int, offset: int, count: int
    ) -> list[dict[str, Any]]:
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="none",
            allow_auto_create_topics=False,
        )  # fmt: skip
        try:
            tp = TopicPartition(topic, partition)
            c.assign([tp])
            c.seek(tp, offset)
            got: list[dict[str, Any]] = []
            deadline = time.monotonic() + WAIT_S
            while len(got) < count and time.monotonic() < deadline:
                for records in c.poll(200).values():
                    for m in records:
                        got.append(
                            {
                                "offset": m.offset,
                                "key": None if m.key is None else m.key.decode(),
                                "value": None if m.value is None else m.value.decode(),
                                "headers": [[k, None if v is None else v.decode()] for k, v in m.headers],
                                "timestamp": m.timestamp,
                                "timestamp_type": ["CREATE_TIME", "LOG_APPEND_TIME"][m.timestamp_type],
                            }
                        )
            return got
        finally:
            c.close()

    def op_list_offsets(
        self, bootstrap: str, topic: str, partition: int, spec: str, timestamp: int | None = None
    ) -> Any:
        from kafka import TopicPartition
        from kafka.admin import OffsetSpec

        s = {
            "earliest": OffsetSpec.EARLIEST,
            "latest": OffsetSpec.LATEST,
            "max_timestamp": OffsetSpec.MAX_TIMESTAMP,
        }.get(spec, timestamp)
        tp = TopicPartition(topic, partition)
        r = self._with_admin(bootstrap, lambda a: a.list_partition_offsets({tp: s}))
        info = r[tp]
        return {"offset": info.offset, "timestamp": info.timestamp}

    def op_commit(
        self, bootstrap: str, topic: str, partition: int, group: str, offset: int, metadata: str | None = None
    ) -> str:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        try:
            c.commit(
                {TopicPartition(topic, partition): OffsetAndMetadata(offset, metadata or "", -1)},
                timeout_ms=2000,
            )
            return "NONE"
        finally:
            c.close()

    def op_committed(self, bootstrap: str, group: str) -> dict[str, Any]:
        r = self._with_admin(bootstrap, lambda a: a.list_group_offsets({group: None}))
        offsets = r.get(group, r)
        return {f"{tp.topic}-{tp.partition}": [om.offset, om.metadata] for tp, om in offsets.items()}

    def op_join(self, bootstrap: str, topic: str, group: str, member: str) -> str:
        from kafka import KafkaConsumer

        c = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=500, metadata_max_age_ms=1000,
        )  # fmt: skip
        # kafka-python's group leader assigns from its own metadata: one that joins before its
        # metadata names the topic's partitions assigns nothing ("No partition metadata") until
        # its metadata refreshes. Loaded first, on either cluster.
        deadline = time.monotonic() + WAIT_S
        while not c.partitions_for_topic(topic) and time.monotonic() < deadline:
            time.sleep(0.1)
        c.subscribe([topic])
        self.members[member] = c
        return "NONE"

    def _poll_assignment(self, member: Any) -> list[int]:
        member.poll(100)
        return sorted(tp.partition for tp in member.assignment())

    def op_describe_group(self, bootstrap: str, group: str) -> Any:
        return self._with_admin(bootstrap, lambda a: a.describe_groups([group]))


class JavaDriver:
    """Kafka's Java client: ClientProbe.java in one JVM, commands as JSON lines on stdin."""

    name = "java"

    def __init__(self, libs: Path, build_dir: Path) -> None:
        source = Path(__file__).resolve().parents[1] / "java" / "ClientProbe.java"
        classpath = f"{libs}/*"
        subprocess.run(
            ["javac", "-d", str(build_dir), "-cp", classpath, str(source)],
            check=True,
            capture_output=True,
            timeout=120,
        )
        self._stderr = (build_dir / "probe-stderr.log").open("wb")
        self.proc = subprocess.Popen(
            ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", f"{build_dir}:{classpath}", "ClientProbe"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        assert self._read() == {"ready": True}

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"ClientProbe exited (code {self.proc.poll()}); see {self._stderr.name}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, op: str, bootstrap: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, "bootstrap": bootstrap, **args}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()

"""Real Kafka clients against a SASL_SSL cluster made by ``sluice cluster up --security sasl_ssl``
(issue 17, acceptance 1 and 7).

One 3-broker cluster for the module, started by the real CLI on the test ZooKeeper. With the
``client.properties`` it prints, confluent-kafka (SCRAM-SHA-512), kafka-python (SCRAM-SHA-256),
aiokafka (PLAIN) and kcat (SCRAM-SHA-512, ``-F``) each produce 100,000 records to a replicated
topic and read them all back; with a wrong password each reports an authentication error; a
user with only READ on one topic cannot produce to it and does not see another topic.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.clients import close_within
from sluice.ops.launcher import ZOOKEEPER_AUTH_FILE, LocalCluster
from sluice.properties import read_properties
from sluice.security.client import ClientSecurity
from tests.support.cluster import wait_until

pytestmark = pytest.mark.timeout(900)

RECORDS = 100_000
PARTITIONS = 3
KCAT = "/usr/bin/kcat"
CLIENT_KEYS = {"security.protocol", "sasl.mechanism", "sasl.username", "sasl.password", "ssl.ca.location"}
READER, READER_PASSWORD = "reader", "reader-password-17"


@dataclass(frozen=True)
class SecureCluster:
    cluster: LocalCluster
    up_output: str
    properties: Path

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def admin(self) -> ClientSecurity:
        return ClientSecurity.from_file(self.properties)

    def security(self, **changes: Any) -> ClientSecurity:
        """The admin's settings with some changed (another mechanism, user or password)."""
        a = self.admin
        values = {"protocol": a.protocol, "mechanism": a.mechanism, "username": a.username,
                  "password": a.password, "ca_location": a.ca_location, **changes}  # fmt: skip
        return ClientSecurity(**values)


def sluice(*args: str, env: dict[str, str] | None = None, timeout_s: float = 180) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "sluice.cli", *args],
        capture_output=True, text=True, timeout=timeout_s, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, (
        f"sluice {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def secure(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    directory = tmp_path_factory.mktemp("secure-cluster")
    chroot = f"{zookeeper}/t-{uuid.uuid4().hex[:10]}"
    try:
        out = sluice("cluster", "up", "--brokers", "3", "--security", "sasl_ssl", "--dir", str(directory),
                     "--zookeeper", chroot)  # fmt: skip
        printed = [
            line.split("=", 1)[1] for line in out.splitlines() if line.startswith("client.properties=")
        ]
        assert len(printed) == 1, f"cluster up printed no client.properties= line:\n{out}"
        yield SecureCluster(LocalCluster.load(directory), out, Path(printed[0]))
    finally:
        subprocess.run([sys.executable, "-m", "sluice.cli", "cluster", "down", "--dir", str(directory)],
                       capture_output=True, timeout=120)  # fmt: skip


# ------------------------------------------------------------------------------------ helpers


def value_of(i: int) -> bytes:
    return f"v{i:07d}".encode()


def expected() -> dict[int, list[int]]:
    return {p: list(range(p, RECORDS, PARTITIONS)) for p in range(PARTITIONS)}


def assert_intact(read: dict[int, list[int]]) -> None:
    want = expected()
    for p in range(PARTITIONS):
        got = read.get(p, [])
        assert len(got) == len(want[p]), f"partition {p}: read {len(got)}, produced {len(want[p])}"
        assert got == want[p], f"partition {p}: values differ or are out of order"


def admin_client(c: SecureCluster, security: ClientSecurity | None = None) -> AdminClient:
    return AdminClient({"bootstrap.servers": c.bootstrap, **(security or c.admin).confluent_config()})


def create_topic(c: SecureCluster, name: str, partitions: int = PARTITIONS) -> None:
    admin = admin_client(c)  # held: a collected client cancels its requests
    admin.create_topics([NewTopic(name, partitions, 3)], operation_timeout=30)[name].result(timeout=40)


def read_with_confluent(c: SecureCluster, topic: str, security: ClientSecurity) -> dict[int, list[int]]:
    consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         **security.confluent_config()})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    eof: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while len(eof) < PARTITIONS and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=1.0):
                error, partition, value = msg.error(), msg.partition(), msg.value()
                assert partition is not None
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        eof.add(partition)
                        continue
                    raise AssertionError(error.str())
                assert value is not None
                eof.discard(partition)
                read[partition].append(int(value[1:]))
    finally:
        close_within(consumer)
    return read


def kafka_python_config(security: ClientSecurity) -> dict[str, Any]:
    """client.properties in kafka-python's (and aiokafka's) argument names."""
    return {"security_protocol": security.protocol, "sasl_mechanism": security.mechanism,
            "sasl_plain_username": security.username, "sasl_plain_password": security.password}  # fmt: skip


def kcat(
    c: SecureCluster, properties: Path, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([KCAT, "-F", str(properties), "-b", c.bootstrap, *args],
                          capture_output=True, timeout=timeout_s)  # fmt: skip


# -------------------------------------------------------------------- the printed properties


def test_cluster_up_prints_owner_only_client_properties_for_the_admin(secure: SecureCluster) -> None:
    assert secure.properties == Path(secure.cluster.directory) / "client.properties"
    assert secure.properties.stat().st_mode & 0o777 == 0o600, "the file holds a password: owner only"
    values = read_properties(secure.properties)
    assert set(values) == CLIENT_KEYS
    assert values["security.protocol"] == "SASL_SSL" and values["sasl.mechanism"] == "SCRAM-SHA-512"
    assert values["sasl.username"] == "admin" and len(values["sasl.password"]) >= 16
    assert Path(values["ssl.ca.location"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert values["sasl.password"] not in secure.up_output, "cluster up must not print the password"


# -------------------------------------------------------------- 100,000 records, four clients


def test_confluent_kafka_round_trip_with_scram_sha_512(secure: SecureCluster) -> None:
    topic = "sec-confluent"
    create_topic(secure, topic)
    producer = Producer({"bootstrap.servers": secure.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, **secure.admin.confluent_config()})  # fmt: skip
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, value=value_of(i), partition=i % PARTITIONS, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0
    assert errors == []
    assert_intact(read_with_confluent(secure, topic, secure.admin))


def test_kafka_python_round_trip_with_scram_sha_256(secure: SecureCluster) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = "sec-kafka-python"
    create_topic(secure, topic)
    security = secure.security(mechanism="SCRAM-SHA-256")
    tls = {"ssl_cafile": str(security.ca_location)}
    producer = KafkaProducer(bootstrap_servers=secure.bootstrap, acks="all", linger_ms=5,
                             batch_size=256 * 1024, **kafka_python_config(security), **tls)  # fmt: skip
    try:
        futures = [producer.send(topic, value=value_of(i), partition=i % PARTITIONS) for i in range(RECORDS)]
        producer.flush(timeout=120)
        for f in futures:
            f.get(timeout=30)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=secure.bootstrap, group_id=None, enable_auto_commit=False,
                             max_partition_fetch_bytes=4 * 1024 * 1024, **kafka_python_config(security),
                             **tls)  # fmt: skip
    tps = [KTP(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    idle = 0
    while sum(map(len, read.values())) < RECORDS and idle < 20:
        batch = consumer.poll(timeout_ms=1000, max_records=20_000)
        idle = 0 if batch else idle + 1
        for tp, msgs in batch.items():
            read[tp.partition].extend(int(m.value[1:]) for m in msgs)
    close_within(consumer)
    assert_intact(read)


def test_aiokafka_round_trip_with_plain(secure: SecureCluster) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context
    from aiokafka.structs import TopicPartition as ATP

    topic = "sec-aiokafka"
    create_topic(secure, topic)
    security = secure.security(mechanism="PLAIN")

    async def run() -> dict[int, list[int]]:
        settings = {"bootstrap_servers": secure.bootstrap, **kafka_python_config(security),
                    "ssl_context": create_ssl_context(cafile=str(security.ca_location))}  # fmt: skip
        producer = AIOKafkaProducer(acks="all", linger_ms=5, max_batch_size=256 * 1024, **settings)
        await producer.start()
        try:
            futs = [
                await producer.send(topic, value=value_of(i), partition=i % PARTITIONS)
                for i in range(RECORDS)
            ]
            await producer.flush()
            await asyncio.wait_for(asyncio.gather(*futs), 120)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(group_id=None, enable_auto_commit=False,
                                    max_partition_fetch_bytes=4 * 1024 * 1024, **settings)  # fmt: skip
        await consumer.start()
        read: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        try:
            tps = [ATP(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            idle = 0
            while sum(map(len, read.values())) < RECORDS and idle < 20:
                batch = await consumer.getmany(timeout_ms=1000, max_records=20_000)
                idle = 0 if batch else idle + 1
                for tp, msgs in batch.items():
                    read[tp.partition].extend(int(m.value[1:]) for m in msgs)
        finally:
            await consumer.stop()
        return read

    assert_intact(asyncio.run(run()))


def test_kcat_round_trip_with_the_client_properties_file(secure: SecureCluster, tmp_path: Path) -> None:
    topic = "sec-kcat"
    create_topic(secure, topic)
    for p in range(PARTITIONS):
        lines = tmp_path / f"{p}.txt"
        lines.write_bytes(b"".join(value_of(i) + b"\n" for i in expected()[p]))
        done = kcat(secure, secure.properties, "-P", "-t", topic, "-p", str(p), "-X", "acks=all",
                    "-X", "linger.ms=5", "-l", str(lines))  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    read: dict[int, list[int]] = {}
    for p in range(PARTITIONS):
        done = kcat(secure, secure.properties, "-C", "-t", topic, "-p", str(p), "-o", "beginning", "-e", "-q",
                    "-f", "%s\n")  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        read[p] = [int(v[1:]) for v in done.stdout.split(b"\n") if v]
    assert_intact(read)


# ------------------------------------------------------------------------ a wrong password


def wrong_password_reports_authentication(client: str, c: SecureCluster, tmp_path: Path, caplog: Any) -> str:
    """Connect with a wrong password; return the client's authentication error (fails if it
    reports none)."""
    wrong = c.security(password="not-the-admin-password")
    if client == "confluent-kafka":
        errors: list[KafkaError] = []
        producer = Producer({"bootstrap.servers": c.bootstrap, "error_cb": errors.append,
                             **wrong.confluent_config()})  # fmt: skip
        wait_until(lambda: producer.poll(0.2) is not None and errors, 20, "confluent-kafka's error callback")
        assert errors[0].code() == KafkaError._AUTHENTICATION, errors
        return errors[0].str()
    if client == "kafka-python":
        from kafka import KafkaProducer
        from kafka.errors import KafkaTimeoutError, SaslAuthenticationFailedError

        # kafka-python 3.0 retries bootstrap until its deadline, then raises a timeout; the
        # authentication error is the one it logs for each attempt.
        with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError):
            KafkaProducer(bootstrap_servers=c.bootstrap, bootstrap_timeout_ms=4000,
                          ssl_cafile=str(wrong.ca_location), **kafka_python_config(wrong))  # fmt: skip
        auth = [a for r in caplog.records for a in (r.args if isinstance(r.args, tuple) else ())
                if isinstance(a, SaslAuthenticationFailedError)]  # fmt: skip
        assert auth, [r.getMessage() for r in caplog.records][-5:]
        return str(auth[0])
    if client == "aiokafka":
        from aiokafka.conn import create_conn
        from aiokafka.errors import SaslAuthenticationFailed
        from aiokafka.helpers import create_ssl_context

        host, port = c.bootstrap.split(",")[0].rsplit(":", 1)

        async def connect() -> None:
            context = create_ssl_context(cafile=str(wrong.ca_location))
            conn = await create_conn(host, int(port), ssl_context=context, **kafka_python_config(wrong))
            conn.close()

        with pytest.raises(SaslAuthenticationFailed) as raised:
            asyncio.run(connect())
        return str(raised.value)
    assert client == "kcat"
    bad = wrong.write(tmp_path / "wrong.properties")
    done = kcat(c, bad, "-L", "-m", "4", timeout_s=30)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode != 0 and "SASL authentication error" in stderr, stderr[-1000:]
    return next(line for line in stderr.splitlines() if "SASL authentication error" in line)


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python", "aiokafka", "kcat"])
def test_a_wrong_password_is_an_authentication_error(
    secure: SecureCluster, client: str, tmp_path: Path, caplog: Any
) -> None:
    message = wrong_password_reports_authentication(client, secure, tmp_path, caplog)
    assert "invalid user name or password" in message, message


# ------------------------------------------------------------------------------ authorization


def test_a_read_only_user_cannot_produce_and_does_not_see_other_topics(secure: SecureCluster) -> None:
    create_topic(secure, "readable", 1)
    create_topic(secure, "secret", 1)
    zk = secure.cluster.zookeeper
    # /config/users and /acls take the cluster's ZooKeeper credential (cluster up wrote it)
    zk_auth = {"SLUICE_ZOOKEEPER_AUTH_FILE": str(Path(secure.cluster.directory) / ZOOKEEPER_AUTH_FILE)}
    sluice("user", "add", READER, "--zookeeper", zk, env={"SLUICE_USER_PASSWORD": READER_PASSWORD, **zk_auth})
    sluice("acl", "add", "--allow-principal", f"User:{READER}", "--operation", "Read", "--topic", "readable",
           "--zookeeper", zk, env=zk_auth)  # fmt: skip
    reader = secure.security(username=READER, password=READER_PASSWORD)
    admin = admin_client(secure, reader)

    def visible() -> set[str]:
        return set(admin.list_topics(timeout=10).topics)

    # READ implies DESCRIBE: the topic appears once the brokers have the ACL.
    seen = wait_until(lambda: "readable" in visible() and visible(), 30, "the reader to see topic readable")
    assert "secret" not in seen, seen
    assert "secret" not in visible()
    # Asked for by name, it is refused, and nothing about it (its partitions) is told.
    described = admin.list_topics(topic="secret", timeout=10).topics.get("secret")
    if described is not None:
        assert described.error is not None, "the reader was told about topic secret"
        assert described.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, described.error
        assert not described.partitions

    errors: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": secure.bootstrap, "message.timeout.ms": 10_000,
                         **reader.confluent_config()})  # fmt: skip
    producer.produce("readable", value=b"not allowed", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert len(errors) == 1 and errors[0] is not None, errors
    assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, errors[0]

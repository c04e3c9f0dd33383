"""Log compaction end to end (issue 19, acceptance 1): a compacted topic written with 1,000 keys x
100 versions and rolled segments is cleaned by the broker's cleaner; every key reads back, with
confluent-kafka, at its last value at its original offset; tombstoned keys are gone after
``delete.retention.ms``; the log is smaller on disk than the same records in a topic that is not
compacted. Then the same after a kill -9 of the broker in the middle of a clean, and a restart.

One broker for the module; its cleaner looks every 200 ms and is throttled to 4 MB/s, so that a
clean lasts long enough to be killed in (storage/cleaner.py's ``.cleaned`` files are on disk).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from sluice.ops.launcher import pid_alive
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(240)

KEYS = 1000
VERSIONS = 100
#: every tenth key ends with a tombstone
TOMBSTONED = frozenset(range(0, KEYS, 10))
SEGMENT_BYTES = 64 * 1024
DELETE_RETENTION_MS = 3000
SETTINGS = {
    "log.cleaner.backoff.ms": "200",
    "log.cleaner.io.max.bytes.per.second": str(4_000_000),
}


@pytest.fixture(scope="module")
def cluster(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = TestCluster(zookeeper, tmp_path_factory.mktemp("compaction"), 1, broker_settings=SETTINGS)
    try:
        yield c
    finally:
        c.down()


def _create(cluster: TestCluster, name: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(name, 1, 1, config=config)], operation_timeout=30)[name].result(60)


def _compacted(cluster: TestCluster, name: str) -> None:
    _create(
        cluster,
        name,
        {
            "cleanup.policy": "compact",
            "segment.bytes": str(SEGMENT_BYTES),
            "delete.retention.ms": str(DELETE_RETENTION_MS),
            "min.cleanable.dirty.ratio": "0.01",
        },
    )


def _key(k: int) -> bytes:
    return f"key-{k:04d}".encode()


def _produce(cluster: TestCluster, topics: list[str]) -> dict[bytes, tuple[int, bytes | None]]:
    """Every key's versions, version by version, then the tombstones, then filler records of
    one key so that the segments holding the tombstones roll (only rolled segments are cleaned);
    returns each key's last (offset, value) in the first topic, from the delivery reports."""
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "linger.ms": 20,
            "enable.idempotence": True,
            "batch.size": 16384,
        }
    )
    last: dict[bytes, tuple[int, bytes | None]] = {}
    errors: list[str] = []

    def delivered(err: KafkaError | None, msg: object) -> None:
        if err is not None:
            errors.append(str(err))
        elif msg.topic() == topics[0]:  # type: ignore[attr-defined]
            last[msg.key()] = (msg.offset(), msg.value())  # type: ignore[attr-defined]

    def send(key: bytes, value: bytes | None) -> None:
        for topic in topics:
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)

    for v in range(VERSIONS):
        for k in range(KEYS):
            send(_key(k), f"{k}:{v}".encode())
        producer.poll(0)
    for k in sorted(TOMBSTONED):
        send(_key(k), None)
    for i in range(2 * SEGMENT_BYTES // 100):
        send(b"filler", f"{i:0100d}".encode())
    assert producer.flush(60) == 0, "records still unacknowledged after 60 s"
    assert not errors, errors[:3]
    assert len(last) == KEYS + 1
    return last


def _read_all(
    cluster: TestCluster, topic: str, isolation: str = "read_committed"
) -> list[tuple[int, bytes | None, bytes | None]]:
    """(offset, key, value) of every record of the topic's partition, with confluent-kafka
    (``isolation``: its isolation.level, librdkafka's default read_committed unless told)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"reader-{topic}-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "log_level": 0,
        }
    )
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise AssertionError(f"read error: {msg.error()}")
            out.append((msg.offset(), msg.key(), msg.value()))
        raise AssertionError(f"{topic}: no end of partition after 60 s ({len(out)} records read)")
    finally:
        consumer.close()


def _partition_dir(cluster: TestCluster, topic: str) -> Path:
    return Path(cluster.broker(1).data_dir) / f"{topic}-0"


def _log_bytes(cluster: TestCluster, topic: str) -> int:
    return sum(p.stat().st_size for p in _partition_dir(cluster, topic).glob("*.log"))


def _compacted_as_expected(
    cluster: TestCluster, topic: str, last: dict[bytes, tuple[int, bytes | None]]
) -> bool:
    """True once the topic reads as fully cleaned: every key once below the filler, at its last
    offset and value, and no tombstoned key at all. An assertion error (retried by wait_until)
    says what still differs."""
    records = _read_all(cluster, topic)
    seen: dict[bytes, list[tuple[int, bytes | None]]] = {}
    for offset, key, value in records:
        assert key is not None, f"a record without a key at {offset}"
        seen.setdefault(key, []).append((offset, value))
    for k in range(KEYS):
        key = _key(k)
        if k in TOMBSTONED:
            assert key not in seen, f"{key!r} tombstoned, still read as {seen[key][-3:]}"
        else:
            assert seen.get(key) == [last[key]], (
                f"{key!r} reads {seen.get(key, [])[-3:]}, expected {last[key]}"
            )
    offsets = [o for o, _k, _v in records]
    assert offsets == sorted(offsets), "offsets out of order"
    return True


def test_compacted_topic_keeps_every_keys_last_value_at_its_offset(cluster: TestCluster) -> None:
    _compacted(cluster, "compacted")
    _create(cluster, "uncompacted", {"segment.bytes": str(SEGMENT_BYTES)})
    last = _produce(cluster, ["compacted", "uncompacted"])

    wait_until(lambda: _compacted_as_expected(cluster, "compacted", last), 90, "the log to be compacted")
    compacted, whole = _log_bytes(cluster, "compacted"), _log_bytes(cluster, "uncompacted")
    assert compacted < whole / 5, f"compacted log {compacted} bytes, the same records uncompacted {whole}"
    assert "event=log_cleaned partition=compacted-0" in cluster.log_text(1)
    # The topic that is not compacted keeps every record (its cleanup.policy is delete).
    assert (
        len(_read_all(cluster, "uncompacted")) == KEYS * VERSIONS + len(TOMBSTONED) + 2 * SEGMENT_BYTES // 100
    )


def test_a_record_without_a_key_is_refused_by_a_compacted_topic(cluster: TestCluster) -> None:
    _compacted(cluster, "keyless")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    errors: list[KafkaError | None] = []
    producer.produce("keyless", b"no key", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    producer.produce("keyless", b"keyed", b"k", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD, errors
    assert errors[1] is None, errors
    assert [(k, v) for _o, k, v in _read_all(cluster, "keyless")] == [(b"k", b"keyed")]


def test_kill_9_in_the_middle_of_a_clean_loses_nothing(cluster: TestCluster) -> None:
    """The broker is killed while its cleaner process writes crash-0's cleaned segments; the
    cleaner process dies with it (without PR_SET_PDEATHSIG it wrote on, orphaned: "timed out after
    2.0 s waiting for the broker's cleaner process to be gone"), and the restarted broker recovers
    the log and cleans it again, every key at its last value. storage's unit tests crash at every
    step of the swap (tests/unit/test_cleaner.py)."""
    _compacted(cluster, "crash")
    directory = _partition_dir(cluster, "crash")
    broker = cluster.broker(1)
    session = os.getsid(broker.pid)

    def cleaning() -> list[str]:
        return [p.name for p in directory.glob("*.cleaned")]

    # The cleaner process writes the .cleaned segments; the broker's event loop then swaps them
    # in. The broker is stopped (SIGSTOP) the moment they appear, so the swap cannot happen
    # while the test looks; on a loaded machine the swap may already be done by then, and the
    # round is let go on with more writes, so the kill always lands with the files in place.
    try:
        caught: list[str] = []
        for _round in range(20):
            last = _produce(cluster, ["crash"])
            wait_until(cleaning, 60, "the cleaner to be writing crash-0's cleaned segments", interval_s=0.005)
            os.kill(broker.pid, signal.SIGSTOP)
            caught = cleaning()
            if caught:
                break
            os.kill(broker.pid, signal.SIGCONT)  # the swap came first: another round
        assert caught, "the broker never stopped with crash-0's clean half done in 20 rounds"
        cluster.kill(1, signal.SIGKILL)
        # The cleaner process dies with the broker: nothing writes into the log while it is down.
        wait_until(lambda: not _session_processes(session), 2.0, "the broker's cleaner process to be gone")
        assert cleaning(), f"the clean's files went while the broker was stopped (saw {caught})"
    finally:  # the broker back for the module's next tests, whatever happened
        if pid_alive(cluster.broker(1).pid):
            os.kill(cluster.broker(1).pid, signal.SIGCONT)
        else:
            cluster.restart(1)
    wait_until(
        lambda: _compacted_as_expected(cluster, "crash", last), 90, "the log to be compacted after restart"
    )


def _session_processes(session: int) -> list[int]:
    """Processes still in a session (a killed broker's started its cleaner processes in its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == session and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def test_a_compacted_topic_written_in_transactions_reads_committed_after_cleaning(
    cluster: TestCluster,
) -> None:
    """Rounds of 200 keys, one transaction each, every other one aborted, then the log cleaned
    by the broker: a read_committed reader reads each key's last committed value (an aborted
    newer one never hides it), aborted records are gone from the log (read_uncommitted finds
    none), and the transaction coordinator's own __transaction_state is compacted."""
    _compacted(cluster, "txn-compacted")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": "compaction-txn",
            "batch.size": 16384,
            "log_level": 0,
        }
    )
    producer.init_transactions(60)
    keys = 200
    committed: dict[bytes, bytes] = {}
    for rnd in range(12):
        abort = rnd % 2 == 1
        producer.begin_transaction()
        for k in range(keys):
            value = f"{'aborted' if abort else 'committed'}-{rnd}-{k}-{'x' * 200}".encode()
            producer.produce("txn-compacted", value, _key(k))
            if not abort:
                committed[_key(k)] = value
            producer.poll(0)
        if abort:
            # Sent first: abort_transaction drops what is still queued in the client.
            assert producer.flush(60) == 0
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
    producer.begin_transaction()
    for i in range(2 * SEGMENT_BYTES // 100):  # rolls the segments that hold the rounds
        producer.produce("txn-compacted", f"{i:0100d}".encode(), b"filler")
    producer.commit_transaction(60)

    def cleaned() -> bool:
        everything = _read_all(cluster, "txn-compacted", "read_uncommitted")
        aborted = [o for o, _k, v in everything if v is not None and v.startswith(b"aborted")]
        assert not aborted, f"{len(aborted)} aborted records still in the log"
        return True

    wait_until(cleaned, 90, "the aborted records to be cleaned away")
    got: dict[bytes, list[bytes | None]] = {}
    for _o, key, value in _read_all(cluster, "txn-compacted", "read_committed"):
        assert key is not None
        got.setdefault(key, []).append(value)
    assert {k: v[-1] for k, v in got.items() if k != b"filler"} == committed
    assert all(len(v) == 1 for k, v in got.items() if k != b"filler"), "one record per key once cleaned"

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "__transaction_state")
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"


@pytest.mark.timeout(300)
def test_readers_through_repeated_cleans_never_miss_a_keys_latest_value(cluster: TestCluster) -> None:
    """Issue 35: a consumer's record sets are sent from the segment files (sendfile), and the
    cleaner replaces those files under it. Here a producer keeps writing new versions of 300
    keys (500-byte values, 1 MiB segments: Fetch answers large enough for the zero-copy path)
    while consumers read the topic from the beginning again and again, and the cleaner cleans
    it again and again. Every read must show, for every key, a version at least as new as the
    last one acknowledged before the read began, each key's versions never going back, offsets
    in order; at least one clean must end while a read runs, and the answers must have gone
    out from the files (sluice_fetch_record_bytes_sent_total{path="zero_copy"})."""
    import threading

    from tests.integration.test_metrics import scrape, value

    topic = "read-while-cleaning"
    keys = 300
    _create(
        cluster,
        topic,
        {
            "cleanup.policy": "compact",
            "segment.bytes": str(1024 * 1024),
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "600000",
        },
    )
    url = cluster.cluster.brokers[0].metrics_url
    assert url is not None
    sent_before = value(scrape(url), "sluice_fetch_record_bytes_sent_total", path="zero_copy")
    acked: dict[bytes, int] = {}
    errors: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 20, "log_level": 0})

        def delivered(err: KafkaError | None, msg: object) -> None:
            if err is not None:
                errors.append(str(err))
                return
            version = int(msg.value().split(b":")[1])  # type: ignore[attr-defined]
            acked[msg.key()] = max(acked.get(msg.key(), -1), version)  # type: ignore[attr-defined]

        for version in range(400):  # bounded: about 60 MB at most
            if stop.is_set():
                break
            for k in range(keys):
                value_ = f"{k}:{version}:".encode().ljust(500, b".")
                while True:
                    try:
                        producer.produce(topic, value_, _key(k), on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(60)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    reads = overlapped = 0
    deadline = time.monotonic() + 150
    try:
        wait_until(lambda: len(acked) == keys, 60, "every key written once")
        while time.monotonic() < deadline and (reads < 4 or overlapped < 1):
            floor = dict(acked)
            cleans = cluster.log_text(1).count(f"event=log_cleaned partition={topic}-0")
            records = _read_all(cluster, topic)
            reads += 1
            if cluster.log_text(1).count(f"event=log_cleaned partition={topic}-0") > cleans:
                overlapped += 1
            offsets = [o for o, _k, _v in records]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), "offsets out of order"
            latest: dict[bytes, int] = {}
            for offset, key, record in records:
                assert key is not None and record is not None, f"a record without key or value at {offset}"
                version = int(record.split(b":")[1])
                assert version >= latest.get(key, -1), f"{key!r} went back to version {version} at {offset}"
                latest[key] = version
            missed = {k: (latest.get(k), v) for k, v in floor.items() if latest.get(k, -1) < v}
            assert not missed, (
                f"read {reads}: keys behind what was acknowledged before it: {list(missed.items())[:5]}"
            )
    finally:
        stop.set()
        writer.join(90)
    assert not errors, errors[:3]
    assert overlapped >= 1, f"no clean ended during any of {reads} reads"
    sent = value(scrape(url), "sluice_fetch_record_bytes_sent_total", path="zero_copy") - sent_before
    assert sent >= 1024 * 1024, f"only {sent:.0f} record bytes were sent from the files"

"""Spark's own Kafka source and sink (spark-sql-kafka-0-10, fetched by scripts/peers.sh)
on Sluice: batch and streaming reads with startingOffsets, endingOffsets, failOnDataLoss and
kafka.group.id behaving as against Kafka, the Kafka sink writing into Sluice, and the apply query
on the Kafka source (`sluice apply --source-format kafka`) ending equal to the truth through
kill -9 of its driver around commits and of a broker."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from sluice import test_switches
from sluice.clients import close_within
from sluice.pipeline.session import ConnectorMissingError, kafka_connector_jars
from sluice.sync.sources.generator import GeneratorConfig, GeneratorStats, run_generator
from sluice.sync.truth import Truth
from tests.integration.test_pipeline import (
    assert_equals_truth,
    audited_target,
    create_topic,
    end_offsets,
    generated_topic,
    wait_applied,
)
from tests.support.cluster import TestCluster, wait_until
from tests.support.processes import CommandTree

PER_PARTITION = 100
PARTITIONS = 3


@pytest.fixture(scope="module")
def connector() -> None:
    try:
        kafka_connector_jars()
    except ConnectorMissingError as exc:
        pytest.skip(f"Spark's Kafka connector is not fetched: {exc}")


@pytest.fixture
def kspark(spark: Any, connector: None) -> Any:
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    assert "spark-sql-kafka-0-10" in jars, f"the test session was started without the connector: {jars!r}"
    return spark


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    """`count` records per partition, record i of partition p keyed k{p}-{i} with value v{p}-{i}."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
    for i in range(first, first + count):
        for p in range(PARTITIONS):
            producer.produce(topic, key=f"k{p}-{i}", value=f"v{p}-{i}", partition=p, headers=[("h", b"x")])
    assert producer.flush(30) == 0


def expected(topic: str, p: int, offsets: range) -> list[tuple[str, int, int, str, str]]:
    return [(topic, p, o, f"k{p}-{o}", f"v{p}-{o}") for o in offsets]


def rows_of(df: Any) -> list[tuple[str, int, int, str, str]]:
    return sorted(
        (r.topic, r.partition, r.offset, bytes(r.key).decode(), bytes(r.value).decode()) for r in df.collect()
    )


def test_spark_kafka_source_and_sink_on_sluice(kspark: Any, cluster: TestCluster, tmp_path: Path) -> None:
    spark, bootstrap = kspark, cluster.bootstrap
    create_topic(bootstrap, "kread", PARTITIONS, 1)
    produce(bootstrap, "kread", 0, PER_PARTITION)
    opts = {"kafka.bootstrap.servers": bootstrap, "subscribe": "kread"}

    # Batch, earliest to latest (the defaults), headers included: every record once, as produced.
    df = spark.read.format("kafka").options(**opts, includeHeaders="true").load()
    everything = [r for p in range(PARTITIONS) for r in expected("kread", p, range(PER_PARTITION))]
    assert rows_of(df) == everything
    headers = df.select("headers").first().headers
    assert [(h.key, bytes(h.value)) for h in headers] == [("h", b"x")]

    # Specific offsets, with -2 (earliest) and -1 (latest) per partition.
    part = spark.read.format("kafka").options(
        **opts,
        startingOffsets='{"kread": {"0": 10, "1": -2, "2": 95}}',
        endingOffsets='{"kread": {"0": 20, "1": 5, "2": -1}}',
    )
    assert rows_of(part.load()) == (
        expected("kread", 0, range(10, 20))
        + expected("kread", 1, range(5))
        + expected("kread", 2, range(95, 100))
    )
    # Spark refuses "latest" as a batch start, against Kafka and Sluice alike.
    with pytest.raises(Exception, match="can't be latest for batch queries"):
        spark.read.format("kafka").options(
            **opts, startingOffsets='{"kread": {"0": -1, "1": -2, "2": -2}}'
        ).load()

    # kafka.group.id: Spark's consumers read under the given group and never commit in it.
    grouped = spark.read.format("kafka").options(**opts, **{"kafka.group.id": "spark-reader"}).load()
    assert grouped.count() == PARTITIONS * PER_PARTITION
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-reader", "log_level": 0})
    try:
        committed = c.committed([TopicPartition("kread", p) for p in range(PARTITIONS)], timeout=10)
        assert all(tp.offset < 0 for tp in committed), committed  # OFFSET_INVALID: nothing committed
    finally:
        close_within(c)

    # Streaming, bounded batches, then from its checkpoint only what came after.
    ckpt = tmp_path / "stream-ckpt"
    seen: list[tuple[int, int]] = []
    sizes: list[int] = []

    def run_stream() -> None:
        def batch(b: Any, _id: int) -> None:
            got = [(r.partition, r.offset) for r in b.select("partition", "offset").collect()]
            sizes.append(len(got))
            seen.extend(got)

        q = (
            spark.readStream.format("kafka")
            .options(**opts, startingOffsets="earliest", maxOffsetsPerTrigger="120")
            .load()
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120)

    run_stream()
    assert sorted(seen) == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)]
    assert max(sizes) <= 120 and len(sizes) >= 3
    produce(bootstrap, "kread", PER_PARTITION, 10)
    seen.clear()
    run_stream()
    assert sorted(seen) == [
        (p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION, PER_PARTITION + 10)
    ]

    # The Kafka sink writes into Sluice: a stream copied from kread, and a batch write.
    create_topic(bootstrap, "kout", PARTITIONS, 1)
    q = (
        spark.readStream.format("kafka")
        .options(**opts, startingOffsets="earliest")
        .load()
        .selectExpr("key", "value", "partition")
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", "kout")
        .option("checkpointLocation", str(tmp_path / "sink-ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    spark.createDataFrame([("extra", "one")], "key string, value string").write.format("kafka").option(
        "kafka.bootstrap.servers", bootstrap
    ).option("topic", "kout").save()
    copied = spark.read.format("kafka").options(**{**opts, "subscribe": "kout"}).load()
    pairs = sorted((bytes(r.key).decode(), bytes(r.value).decode()) for r in copied.collect())
    source_pairs = sorted((k, v) for _, _, _, k, v in everything) + sorted(
        (f"k{p}-{i}", f"v{p}-{i}")
        for p in range(PARTITIONS)
        for i in range(PER_PARTITION, PER_PARTITION + 10)
    )
    assert pairs == sorted([*source_pairs, ("extra", "one")])
    # the sink kept each record's partition (the column "partition" was written)
    assert all(r.key.decode().startswith(f"k{r.partition}-") for r in copied.collect() if r.key != b"extra")

    # failOnDataLoss: the records before offset 50 of partition 0 deleted (DeleteRecords).
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    deleted = admin.delete_records([TopicPartition("kread", 0, 50)], request_timeout=30)
    for fut in deleted.values():
        fut.result(30)
    lost = '{"kread": {"0": 10, "1": -2, "2": -2}}'
    ends = '{"kread": {"0": 60, "1": 0, "2": 0}}'
    with pytest.raises(Exception, match="failOnDataLoss"):
        spark.read.format("kafka").options(**opts, startingOffsets=lost, endingOffsets=ends).load().collect()
    skipped = spark.read.format("kafka").options(
        **opts, startingOffsets=lost, endingOffsets=ends, failOnDataLoss="false"
    )
    assert rows_of(skipped.load()) == expected("kread", 0, range(50, 60))
    earliest = spark.read.format("kafka").options(**opts, endingOffsets=ends).load()
    assert rows_of(earliest) == expected("kread", 0, range(50, 60))

    def stream_from(offset_json: str, fail_on_data_loss: str) -> tuple[list[int], BaseException | None]:
        got: list[int] = []
        q = (
            spark.readStream.format("kafka")
            .options(**opts, startingOffsets=offset_json, failOnDataLoss=fail_on_data_loss)
            .load()
            .where("partition = 0")
            .writeStream.foreachBatch(lambda b, _id: got.extend(r.offset for r in b.collect()))
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(120)
        except Exception as exc:
            return got, exc
        return got, None

    got, error = stream_from(lost, "false")
    assert error is None and sorted(got) == list(range(50, PER_PARTITION + 10))
    got, error = stream_from(lost, "true")
    assert error is not None and "failOnDataLoss" in str(error), error


# --- the apply query on Spark's Kafka source, through kill -9 ------------------------------------


def start_apply(
    bootstrap: str, url: str, ckpt: Path, log: Path, armed: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, **(armed or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "sluice.ops.cli", "apply", "-b", bootstrap, "--topics", "kcrash.changes",
         "--target", url, "--pipeline", "kcrash", "--checkpoint", str(ckpt), "--trigger", "1s",
         "--max-records-per-trigger", "3000", "--source-format", "kafka"],
        stdout=subprocess.DEVNULL, stderr=log.open("ab"), env=env,
    )  # fmt: skip


@pytest.fixture
def three_brokers(make_cluster: Any) -> Iterator[TestCluster]:
    yield make_cluster(3)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_apply_on_the_kafka_source_through_kill_9_of_driver_and_broker(
    connector: None, three_brokers: TestCluster, tmp_path: Path
) -> None:
    cluster = three_brokers
    bootstrap = cluster.bootstrap
    create_topic(bootstrap, "kcrash.changes")
    db_path = tmp_path / "target.db"
    url = audited_target(db_path)
    ckpt = tmp_path / "checkpoint"
    truth_path = tmp_path / "truth.json"
    gen: dict[str, GeneratorStats] = {}
    gen_error: list[BaseException] = []

    def generate() -> None:
        try:
            stats, _ = run_generator(
                bootstrap,
                GeneratorConfig(topic="kcrash.changes", rate=1000, duration_s=40, seed=17),
                truth_path=truth_path,
            )
        except BaseException as exc:
            gen_error.append(exc)
            raise
        gen["stats"] = stats

    producer = threading.Thread(target=generate, daemon=True)
    producer.start()

    # 1. The driver dies right before its 3rd target commit; 2. a new one right after its 2nd,
    #    before Spark records the batch as done: Spark's checkpoint then lags the target, the
    #    Kafka source replays that batch, and the target must skip it.
    for n, crash in enumerate(["before-commit:3", "after-commit:2"]):
        log = tmp_path / f"apply-{n}.log"
        with test_switches.armed(test_switches.Switches(crash_at=crash)) as armed:
            proc = start_apply(bootstrap, url, ckpt, log, armed)
            assert proc.wait(timeout=180) == -signal.SIGKILL, log.read_text()[-3000:]
        text = log.read_text()
        assert f"event=test_switch_on name=crash_at value={crash}" in text
        assert "(source kafka)" in text

    # 3. A driver on the checkpoint: the Kafka source replays the batch the after-commit crash
    #    left uncommitted in Spark's commit log, and the target recognises it as applied.
    replay_log = tmp_path / "apply-replay.log"
    proc = start_apply(bootstrap, url, ckpt, replay_log)
    try:
        wait_until(lambda: "batch " in replay_log.read_text(), 120, "the restarted query to commit a batch")
    finally:
        CommandTree(proc).stop(60)  # SIGTERM; after a minute, kill -9 of it and its driver JVM
    replayed = [
        int(m.replace(",", "")) for m in re.findall(r"\(([\d,]+) already applied\)", replay_log.read_text())
    ]
    assert replayed and replayed[0] > 0, "the batch of the after-commit crash was not replayed"

    # 4. A driver with no checkpoint at all (the target's offsets are the only position left:
    #    the Kafka source must start from them), through kill -9 of a broker.
    shutil.rmtree(ckpt)
    final_log = tmp_path / "apply-final.log"
    proc = start_apply(bootstrap, url, ckpt, final_log)
    try:
        wait_until(lambda: "batch " in final_log.read_text(), 120, "the restarted query to commit a batch")
        victim = cluster.cluster.brokers[0].broker_id
        cluster.kill(victim)
        time.sleep(4)
        cluster.restart(victim)
        producer.join(timeout=120)
        assert "stats" in gen, f"the generator failed: {gen_error or 'still running after 120 s'}"
        wait_applied(url, "kcrash", end_offsets(bootstrap, "kcrash.changes"))
    finally:
        CommandTree(proc).stop(60)  # SIGTERM; after a minute, kill -9 of it and its driver JVM

    truth = Truth.load(truth_path)
    assert_equals_truth(url, truth)
    assert truth.events == gen["stats"].events

    db = sqlite3.connect(db_path)
    twice = db.execute(
        "SELECT tbl, key, pos, count(*) FROM audit_writes GROUP BY tbl, key, pos HAVING count(*) > 1 LIMIT 5"
    ).fetchall()
    assert twice == [], f"row versions written more than once: {twice}"
    backwards = db.execute("SELECT * FROM audit_offsets WHERE new < old").fetchall()
    assert backwards == [], f"applied offsets went backwards: {backwards}"
    # The first batch of the last driver started where the target's offsets were, not earlier
    # (nothing of it already applied) and not later (the truth comparison above).
    first = re.search(r"batch \d+: ([\d,]+) records \(([\d,]+) already applied\)", final_log.read_text())
    assert first is not None and first.group(2) == "0", final_log.read_text()[-2000:]


def test_apply_on_the_kafka_source_stages_into_postgresql(
    kspark: Any, three_brokers: TestCluster, postgres_url: str, tmp_path: Path
) -> None:
    """With Spark's Kafka source, each task parses, collapses and stages in one Python worker
    (`staging.map_and_stage`): the driver gets summaries only, the target ends equal to the
    truth, and no staging is left once the query stops."""
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
    from tests.support.staging import staged

    bootstrap = three_brokers.bootstrap
    truth_path = tmp_path / "truth.json"
    stats = generated_topic(bootstrap, "kstage.changes", 6_000, 23, truth_path)
    reports: list[BatchReport] = []
    config = ApplyConfig(
        bootstrap=bootstrap, target=postgres_url, topics=["kstage.changes"], checkpoint=tmp_path / "ck",
        available_now=True, source_format="kafka", max_records_per_trigger=2_000,
    )  # fmt: skip
    query = ApplyQuery(kspark, config, on_batch=reports.append)
    try:
        query.start()
        assert query.await_termination(180)
        assert list(staged(postgres_url).values()) == [0]  # this execution's table, emptied
    finally:
        query.stop()
    assert_equals_truth(postgres_url, Truth.load(truth_path))
    assert staged(postgres_url) == {}
    assert sum(r.result.records for r in reports) == stats.events
    # 2,000 changes a batch would be about 86 KB through the driver; a summary is a few rows
    assert len(reports) >= 3 and max(r.result_bytes for r in reports) < 16_000, [
        r.result_bytes for r in reports
    ]

"""The Spark source reads committed data only: transaction markers and aborted records are
skipped, nothing at or past a partition's last stable offset is read (an open transaction holds
a batch read at its first offset), and a range ending on markers or aborted records ends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import TestCluster
from tests.support.transactions import wait_stable, watermarks

pytestmark = pytest.mark.timeout(240)


def test_the_spark_source_reads_committed_transactions_only(
    spark: Any, make_cluster: Callable[..., TestCluster]
) -> None:
    cluster = make_cluster(
        1, broker_settings={"transaction.state.log.num.partitions": "2", "offsets.topic.num.partitions": "2"}
    )
    bootstrap = cluster.bootstrap
    topic = "txn-source"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "spark-txn", "log_level": 0})
    p.init_transactions(30)
    committed: set[bytes] = set()
    for txn in range(6):
        p.begin_transaction()
        values = {f"{txn}:{i}".encode() for i in range(4)}
        for i, v in enumerate(sorted(values)):
            p.produce(topic, value=v, partition=i % 2)
        if txn % 2:
            p.flush(30)
            p.abort_transaction(30)  # the last transaction of the run: a range ends on it
        else:
            p.commit_transaction(30)
            committed |= values
    wait_stable(bootstrap, topic, 2)
    opts = {"bootstrap.servers": bootstrap, "subscribe": topic}
    rows = spark.read.format("sluice").options(**opts, maxRecordsPerPartition="5").load().collect()
    assert sorted(r.value for r in rows) == sorted(committed)

    # An open transaction: the batch read stops at its first offset (the last stable offset).
    p.begin_transaction()
    p.produce(topic, value=b"open", partition=0)
    p.flush(30)
    lso = watermarks(bootstrap, topic, 2, "read_committed")
    assert lso[0] < watermarks(bootstrap, topic, 2, "read_uncommitted")[0]
    rows = spark.read.format("sluice").options(**opts).load().collect()
    assert sorted(r.value for r in rows) == sorted(committed)
    assert all(r.offset < lso[r.partition] for r in rows)

    # A stream started now reads it once it commits, and nothing aborted.
    batches: list[list[bytes]] = []
    p.commit_transaction(30)
    wait_stable(bootstrap, topic, 2)
    q = (
        spark.readStream.format("sluice")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(lambda b, _id: batches.append([r.value for r in b.collect()]))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(120)
    assert sorted(v for b in batches for v in b) == sorted(committed | {b"open"})

"""The Spark source never skips a range silently: a read whose next offset retention deleted
fails with a message naming what was lost, unless ``failOnDataLoss=false`` (then it reads on
from the log start).

Before, the executors' consumer fell back to librdkafka's default ``auto.offset.reset``
(latest): the deleted range was answered with nothing until the stall timeout, and a range
followed by newer records would have been skipped without a word. The first check failed with
``SluiceSourceError: no progress reading lossy[0] at offset 0 (range 0..200) for 5 s``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sluice.pipeline import source
from sluice.pipeline.source import SCHEMA, Range, SluiceSourceError, read_partition
from tests.support.cluster import TestCluster

pytestmark = pytest.mark.timeout(240)

RECORDS = 200


def _delete_oldest_segments(partition_dir: Path) -> int:
    """What retention leaves on disk: the oldest half of the segments gone. Returns the new log
    start offset."""
    logs = sorted(partition_dir.glob("*.log"))
    assert len(logs) >= 4, logs
    for seg in logs[: len(logs) // 2]:
        for suffix in (".log", ".index", ".timeindex"):
            seg.with_suffix(suffix).unlink(missing_ok=True)
    return int(logs[len(logs) // 2].stem)


def _offsets(batches: list[Any]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_reader_fails_on_deleted_offsets_unless_told_to_skip(
    cluster: TestCluster, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(source, "STALL_TIMEOUT_S", 5.0)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    topic = NewTopic("lossy", 1, 1, config={"segment.bytes": "2048"})
    admin.create_topics([topic], operation_timeout=30)["lossy"].result(60)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 0, "log_level": 0})
    for i in range(RECORDS):
        producer.produce("lossy", value=f"record-{i:04d}".encode(), partition=0)
        producer.flush(10)  # one batch per record: many small segments
    cluster.stop(1)
    start = _delete_oldest_segments(Path(cluster.broker(1).data_dir) / "lossy-0")
    cluster.restart(1)

    options = {"bootstrap.servers": cluster.bootstrap, "subscribe": "lossy"}
    whole = Range("lossy", 0, 0, RECORDS)
    with pytest.raises(SluiceSourceError, match=rf"lossy\[0\]: offsets 0\.\.{start - 1} .*deleted") as lost:
        list(read_partition(options, SCHEMA, whole))
    assert "failOnDataLoss=false" in str(lost.value)

    skipping = {**options, "failOnDataLoss": "false"}
    assert _offsets(list(read_partition(skipping, SCHEMA, whole))) == list(range(start, RECORDS))
    assert list(read_partition(skipping, SCHEMA, Range("lossy", 0, 0, start))) == []

    # The same through a Spark query: the loss fails it, with the same message.
    from_zero = '{"lossy": {"0": 0}}'
    query = spark.read.format("sluice").options(**options, startingOffsets=from_zero)
    with pytest.raises(Exception, match=r"deleted"):
        query.load().collect()
    read = spark.read.format("sluice").options(**skipping, startingOffsets=from_zero).load()
    assert sorted(r.offset for r in read.select("offset").collect()) == list(range(start, RECORDS))

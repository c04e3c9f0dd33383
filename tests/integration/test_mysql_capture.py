"""MariaDB capture: snapshot plus binlog under concurrent writes, a restart from the position
recovered from the log, and clear errors for the usual misconfigurations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources.mysql import (
    BinlogPosition,
    CaptureError,
    MySqlCapture,
    check_position,
    check_source,
    recover_position,
)
from sluice.sync.targets import open_target
from sluice.sync.tasks import SourceSpec
from sluice.sync.truth import Truth, compare
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.mysql_source import KEYS, Writer, create_database, master_position, source_rows

TABLES = list(KEYS)


def read_all(bootstrap: str, topic: str, partitions: int = 3) -> pa.Table:
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "t", "enable.auto.commit": False, "log_level": 0}
    )
    rows: dict[str, list[object]] = {k: [] for k in ("topic", "partition", "offset", "value", "timestamp")}
    try:
        for p in range(partitions):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            c.assign([TopicPartition(topic, p, low)])
            got = low
            while got < high:
                for m in c.consume(1000, timeout=5):
                    if m.error() is None:
                        for k, v in (("topic", topic), ("partition", p), ("offset", m.offset()),
                                     ("value", m.value()), ("timestamp", m.timestamp()[1])):  # fmt: skip
                            rows[k].append(v)
                        got = m.offset() + 1
    finally:
        c.close()
    return pa.table(
        {
            "topic": pa.array(rows["topic"], pa.string()),
            "partition": pa.array(rows["partition"], pa.int32()),
            "offset": pa.array(rows["offset"], pa.int64()),
            "value": pa.array(rows["value"], pa.binary()),
            "timestamp": pa.array(rows["timestamp"], pa.int64()),
        }
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_snapshot_then_binlog_with_a_restart_from_the_recovered_position(
    mariadb: LocalMariaDB,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    cluster = make_cluster(1)
    bootstrap = cluster.bootstrap
    create_topic(bootstrap, "shop.changes", 3, 1)
    create_database(mariadb, "shop1")
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="shop1")
    writer = Writer(mariadb, "shop1", transactions=400)
    writer.start()  # the snapshot is taken while transactions commit

    def capture(start: str | None, stop: threading.Event) -> tuple[threading.Thread, MySqlCapture]:
        cap = MySqlCapture(
            spec, TABLES, lambda _t: "shop.changes", bootstrap, name="shop", start=start, stop=stop
        )
        th = threading.Thread(target=cap.run, daemon=True)
        th.start()
        return th, cap

    stop1 = threading.Event()
    t1, cap1 = capture(None, stop1)
    wait_until(lambda: writer.done >= 150 and cap1.stats.changes > 50, 120, "capture under way")
    stop1.set()
    t1.join(60)
    assert cap1.stats.snapshot_rows >= 800

    resume = recover_position(bootstrap, ["shop.changes"])
    assert resume is not None and resume != "snapshot"
    stop2 = threading.Event()
    t2, cap2 = capture(resume, stop2)
    writer.join(120)
    assert writer.error is None
    end = BinlogPosition.parse(master_position(mariadb))
    wait_until(
        lambda: cap2.stats.position and BinlogPosition.parse(cap2.stats.position) >= end, 120, "catch up"
    )
    stop2.set()
    t2.join(60)

    url = (
        f"sqlite:///{tmp_path / 'target.db'}" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    )
    records = read_all(bootstrap, "shop.changes")
    with open_target(url) as t:
        e = t.claim("shop")
        for batch in records.to_batches(max_chunksize=700):
            t.apply("shop", e, pa.Table.from_batches([batch]))
        got = {table: t.read_rows(table) for table in TABLES}
    truth = Truth(tables=source_rows(mariadb, "shop1"), key_columns=KEYS)
    cmp = compare(truth, got)
    assert cmp.ok, cmp.summary()
    assert "tier" in next(iter(got["customers"].values()))  # the added column reached the target


def test_clear_errors_for_format_privileges_and_purged_binlogs(mariadb: LocalMariaDB) -> None:
    create_database(mariadb, "shop2", rows=1)
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="shop2")
    info = check_source(spec)
    assert "mariadb" in info["version"].lower()

    mariadb.execute("SET GLOBAL binlog_format = 'STATEMENT'")
    try:
        with pytest.raises(CaptureError, match="binlog_format is STATEMENT, capture needs ROW"):
            check_source(spec)
    finally:
        mariadb.execute("SET GLOBAL binlog_format = 'ROW'")

    mariadb.execute(
        "CREATE USER IF NOT EXISTS 'reader'@'127.0.0.1' IDENTIFIED BY 'pw'",
        "GRANT SELECT ON shop2.* TO 'reader'@'127.0.0.1'",
    )
    weak = SourceSpec(kind="mariadb", port=mariadb.port, user="reader", password="pw", database="shop2")
    with pytest.raises(CaptureError, match="lacks privileges to read the binlog"):
        check_source(weak)

    first = mariadb.execute("SHOW BINARY LOGS")[0][0]
    gone = BinlogPosition(first.rsplit(".", 1)[0] + ".000000", 4)
    with pytest.raises(
        CaptureError, match=r"mysql-bin\.000000 needed to resume from mysql-bin\.000000:4 has been purged"
    ):
        check_position(spec, gone)
    time.sleep(0)

"""MariaDB capture: snapshot plus binlog under concurrent writes, a restart from the position
recovered from the log, and clear errors for the usual misconfigurations."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from sluice.clients import close_within
from sluice.ops.mariadb import LocalMariaDB
from sluice.security.secrets import Secret
from sluice.sync.envelope import key_text
from sluice.sync.sources.mysql import (
    BinlogPosition,
    CaptureError,
    MySqlCapture,
    check_position,
    check_source,
    recover_position,
)
from sluice.sync.sources.mysql_snapshot import SnapshotChunk
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
                # consume() waits for all it asks for or the timeout: ask for what is left
                for m in c.consume(min(1000, high - got), timeout=5):
                    if m.error() is None:
                        for k, v in (("topic", topic), ("partition", p), ("offset", m.offset()),
                                     ("value", m.value()), ("timestamp", m.timestamp()[1])):  # fmt: skip
                            rows[k].append(v)
                        got = m.offset() + 1
    finally:
        close_within(c)
    return pa.table(
        {
            "topic": pa.array(rows["topic"], pa.string()),
            "partition": pa.array(rows["partition"], pa.int32()),
            "offset": pa.array(rows["offset"], pa.int64()),
            "value": pa.array(rows["value"], pa.binary()),
            "timestamp": pa.array(rows["timestamp"], pa.int64()),
        }
    )


@contextmanager
def running(cap: MySqlCapture) -> Iterator[MySqlCapture]:
    """The capture on its own thread; stopped and joined on the way out."""
    th = threading.Thread(target=cap.run, daemon=True)
    th.start()
    try:
        yield cap
    finally:
        cap.stop.set()
        th.join(60)


def wait_caught_up(cap: MySqlCapture, server: LocalMariaDB, timeout_s: float) -> None:
    """Until the capture has read the binlog up to the server's position now."""
    end = BinlogPosition.parse(master_position(server))
    wait_until(
        lambda: cap.stats.position and BinlogPosition.parse(cap.stats.position) >= end, timeout_s, "catch up"
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
    wait_caught_up(cap2, mariadb, 120)
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
    weak = SourceSpec(
        kind="mariadb", port=mariadb.port, user="reader", password=Secret("pw"), database="shop2"
    )
    with pytest.raises(CaptureError, match="lacks privileges to read the binlog"):
        check_source(weak)

    first = mariadb.execute("SHOW BINARY LOGS")[0][0]
    gone = BinlogPosition(first.rsplit(".", 1)[0] + ".000000", 4)
    with pytest.raises(
        CaptureError, match=r"mysql-bin\.000000 needed to resume from mysql-bin\.000000:4 has been purged"
    ):
        check_position(spec, gone)
    time.sleep(0)


BIG_ROWS = 24_000


def _fill_big_table(server: LocalMariaDB, database: str) -> None:
    server.execute("CREATE TABLE events (id BIGINT PRIMARY KEY, kind VARCHAR(16), n INT)", database=database)
    for start in range(1, BIG_ROWS + 1, 4000):
        values = ", ".join(f"({i}, 'k{i % 7}', {i})" for i in range(start, min(start + 4000, BIG_ROWS + 1)))
        server.execute(f"INSERT INTO events VALUES {values}", database=database)
    server.execute("ANALYZE TABLE events", database=database)


class BigTableWriter(threading.Thread):
    """Updates, deletes and inserts across the whole key range of `events`."""

    def __init__(self, server: LocalMariaDB, database: str, transactions: int) -> None:
        super().__init__(daemon=True)
        self.server, self.database, self.transactions = server, database, transactions
        self.error: BaseException | None = None

    def run(self) -> None:
        import random

        rng = random.Random(5)
        try:
            for n in range(self.transactions):
                k = rng.randrange(1, BIG_ROWS + 1)
                self.server.execute(
                    f"UPDATE events SET n = n + 1, kind = 'u{n % 5}' WHERE id = {k}",
                    f"DELETE FROM events WHERE id = {rng.randrange(1, BIG_ROWS + 1)}",
                    f"INSERT INTO events VALUES ({BIG_ROWS + 1 + n}, 'new', {n})",
                    database=self.database,
                )
        except BaseException as exc:  # reported by the test
            self.error = exc


def _apply_log_tables(
    bootstrap: str, topic: str, url: str, pipeline: str, tables: list[str] = TABLES
) -> dict[str, dict[str, dict[str, object]]]:
    """Apply everything in the topic to the target in batches; return the tables' rows there."""
    records = read_all(bootstrap, topic)
    with open_target(url) as t:
        e = t.claim(pipeline)
        for batch in records.to_batches(max_chunksize=5000):
            t.apply(pipeline, e, pa.Table.from_batches([batch]))
        return {table: t.read_rows(table) for table in tables}


def _apply_log(
    bootstrap: str, topic: str, url: str, pipeline: str
) -> dict[str, dict[str, dict[str, object]]]:
    return _apply_log_tables(bootstrap, topic, url, pipeline, [*TABLES, "events"])


def test_large_tables_are_snapshotted_by_spark_in_key_ranges_under_writes(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path, spark: object
) -> None:
    """A table over the threshold is read by a Spark job in key ranges, each in its own
    consistent snapshot, while transactions commit; the small tables go through the capture's
    own snapshot; after the binlog catches up the target equals the source."""
    from sluice.pipeline.snapshot import run_snapshot_chunks

    cluster = make_cluster(1)
    bootstrap = cluster.bootstrap
    create_topic(bootstrap, "big.changes", 3, 1)
    create_database(mariadb, "big1")
    _fill_big_table(mariadb, "big1")
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="big1")
    ran: list[int] = []

    def runner(chunks: list[SnapshotChunk]) -> list[object]:
        ran.append(len(chunks))
        assert {c.table for c in chunks} == {"events"}  # the small tables stay in the capture
        return list(run_snapshot_chunks(spark, chunks))

    writers = [Writer(mariadb, "big1", transactions=300), BigTableWriter(mariadb, "big1", 300)]
    for w in writers:
        w.start()
    cap = MySqlCapture(
        spec, [*TABLES, "events"], lambda _t: "big.changes", bootstrap, name="big",
        snapshot_runner=runner, snapshot_parallel_rows=5000, snapshot_chunk_rows=3000,
    )  # fmt: skip
    with running(cap):
        for w in writers:
            w.join(240)
            assert w.error is None, w.error
        wait_caught_up(cap, mariadb, 180)
    assert ran and ran[0] >= 6, ran  # 24k rows in ranges of about 3k
    assert cap.stats.snapshot_rows >= BIG_ROWS
    got = _apply_log(bootstrap, "big.changes", f"sqlite:///{tmp_path / 'target.db'}", "big")
    truth = source_rows(mariadb, "big1")
    conn_rows = mariadb.execute("SELECT id, kind, n FROM events", database="big1")
    truth["events"] = {key_text({"id": i}): {"id": i, "kind": k, "n": n} for i, k, n in conn_rows}
    cmp = compare(Truth(tables=truth, key_columns={**KEYS, "events": ["id"]}), got)
    assert cmp.ok, cmp.summary()


def test_a_snapshot_cut_short_starts_over_reading_the_binlog_from_where_it_began(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path, spark: object
) -> None:
    """The first snapshot stops half way, its rows already in the log; rows it wrote are then
    deleted. The restarted capture must see those deletes (it streams from the first
    snapshot's start, recovered from the log), or the target would keep the deleted rows."""
    from sluice.pipeline.snapshot import run_snapshot_chunks

    cluster = make_cluster(1)
    bootstrap = cluster.bootstrap
    create_topic(bootstrap, "cut.changes", 3, 1)
    create_database(mariadb, "cut1", rows=50)
    _fill_big_table(mariadb, "cut1")
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="cut1")
    stop1 = threading.Event()

    def half(chunks: list[SnapshotChunk]) -> list[object]:
        done = list(run_snapshot_chunks(spark, chunks[: len(chunks) // 2]))
        stop1.set()  # cut short, as a worker stopping or dying would
        return done

    cap1 = MySqlCapture(spec, [*TABLES, "events"], lambda _t: "cut.changes", bootstrap, name="cut",
                        stop=stop1, snapshot_runner=half, snapshot_parallel_rows=5000,
                        snapshot_chunk_rows=3000)  # fmt: skip
    with pytest.raises(CaptureError, match="stopped during the snapshot"):
        cap1.run()
    deleted = mariadb.execute("SELECT id FROM events WHERE id <= 3000 AND id % 3 = 0", database="cut1")
    assert deleted
    mariadb.execute("DELETE FROM events WHERE id <= 3000 AND id % 3 = 0", database="cut1")
    resume = recover_position(bootstrap, ["cut.changes"])
    assert resume is not None and resume.startswith("snapshot@"), resume
    cap2 = MySqlCapture(spec, [*TABLES, "events"], lambda _t: "cut.changes", bootstrap, name="cut",
                        start=resume, snapshot_runner=lambda c: run_snapshot_chunks(spark, c),
                        snapshot_parallel_rows=5000, snapshot_chunk_rows=3000)  # fmt: skip
    with running(cap2):
        wait_caught_up(cap2, mariadb, 180)
    got = _apply_log(bootstrap, "cut.changes", f"sqlite:///{tmp_path / 'target.db'}", "cut")
    assert not {key_text({"id": i}) for (i,) in deleted} & set(got["events"])
    assert len(got["events"]) == BIG_ROWS - len(deleted)


def test_a_column_added_with_a_default_reaches_every_existing_row(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """ALTER TABLE ... ADD COLUMN ... DEFAULT fills the column in for every row without writing
    a row event; the capture reads the table again, so the target has the default too."""
    cluster = make_cluster(1)
    bootstrap = cluster.bootstrap
    create_topic(bootstrap, "ddl.changes", 3, 1)
    create_database(mariadb, "ddl1", rows=60)
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="ddl1")
    cap = MySqlCapture(spec, TABLES, lambda _t: "ddl.changes", bootstrap, name="ddl")
    with running(cap):
        wait_until(lambda: cap.stats.snapshot_rows >= 180 and cap.stats.position, 60, "the snapshot")
        mariadb.execute(
            "UPDATE customers SET balance = 1 WHERE id = 1",
            "ALTER TABLE customers ADD COLUMN region VARCHAR(8) NOT NULL DEFAULT 'eu'",
            "UPDATE customers SET region = 'us' WHERE id = 2",
            "DELETE FROM customers WHERE id = 3",
            database="ddl1",
        )
        wait_caught_up(cap, mariadb, 60)
    got = _apply_log_tables(bootstrap, "ddl.changes", f"sqlite:///{tmp_path / 'target.db'}", "ddl")
    cmp = compare(Truth(tables=source_rows(mariadb, "ddl1"), key_columns=KEYS), got)
    assert cmp.ok, cmp.summary()
    regions = {row["region"] for row in got["customers"].values()}
    assert regions == {"eu", "us"}
    # customers read again after the ALTER, as they are by then (one of the 60 deleted)
    assert cap.stats.snapshot_rows >= 180 + 59

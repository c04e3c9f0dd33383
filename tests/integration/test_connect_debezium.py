"""Kafka Connect in distributed mode, with Debezium's MySQL connector, writing into Sluice (issue
20): the worker keeps its config, offset and status topics in Sluice (compacted), Debezium reads
a private MariaDB's binlog (ROW, GTIDs on, as MariaDB always has them), and Sluice's apply query
(``envelope=debezium``, sync/debezium.py) applies the change events to PostgreSQL.

- The long test runs a bounded workload (inserts, updates, deletes, key changes) while one Sluice
  broker of three is killed -9 (and started again) and the Connect worker is killed -9 and started
  again; the target then equals the source, every row compared.
- The refusal test shows Connect checking what Sluice reports: with its internal topics created
  ``cleanup.policy=delete`` the worker refuses to start and says why.

Skipped only when scripts/peers.sh could not fetch Connect's and Debezium's jars.

MariaDB reports its version as 8.0.2-MariaDB-...: Debezium 3.6's MySQL connector takes MariaDB
10.11 for MySQL 10.11, asks SHOW BINARY LOG STATUS (MySQL 8.4's statement, unknown to MariaDB)
and stops; bench/capture.py does the same for the same reason.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.ops.postgres import LocalPostgres
from sluice.peers.connect import ConnectError, ConnectWorker, connect_home, debezium_mysql_config
from sluice.sync.targets import open_target
from sluice.sync.truth import Truth, compare
from tests.integration.test_capture_statements import source_rows
from tests.integration.test_mysql_capture import read_all
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until

pytestmark = pytest.mark.timeout(600)

DB = "shop"
SCHEMA = [
    "CREATE TABLE accounts (id INT PRIMARY KEY, owner VARCHAR(40), balance BIGINT)",
    "CREATE TABLE moves (a INT, b INT, amount INT, PRIMARY KEY (a, b))",
]
KEYS = {"accounts": ["id"], "moves": ["a", "b"]}
PREFIX = "dbz"
TOPICS = [f"{PREFIX}.{DB}.{t}" for t in KEYS]


def _home_or_skip() -> Path:
    try:
        return connect_home()
    except ConnectError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def brokers(zookeeper: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    _home_or_skip()
    cluster = TestCluster(zookeeper, tmp_path_factory.mktemp("connect-brokers"), 3)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def source(tmp_path: Path) -> Iterator[LocalMariaDB]:
    version = "10.11"
    server = LocalMariaDB(tmp_path / "mariadb", extra_args=(f"--version=8.0.2-MariaDB-{version}",))
    server.start()
    try:
        server.execute(f"CREATE DATABASE {DB}")
        server.execute(*SCHEMA, database=DB)
        yield server
    finally:
        server.remove()


class Workload:
    """Bounded writes to the source: ``transactions`` transactions of inserts, updates, deletes
    and primary-key changes, at most ``max_s`` seconds; ``progress`` counts the committed ones."""

    def __init__(self, server: LocalMariaDB, transactions: int, max_s: float, seed: int = 20) -> None:
        self.server, self.transactions, self.max_s = server, transactions, max_s
        self.rng = random.Random(seed)
        self.progress = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def _run(self) -> None:
        try:
            conn = pymysql.connect(**self.server.connect_args(DB))  # type: ignore[arg-type]
            deadline = time.monotonic() + self.max_s
            with conn.cursor() as cur:
                for i in range(self.transactions):
                    if time.monotonic() > deadline:
                        break
                    self._transaction(cur, 1000 + i)
                    conn.commit()
                    self.progress += 1
                    time.sleep(0.02)
            conn.close()
        except BaseException as exc:  # the test reports it
            self.error = exc

    def _transaction(self, cur: Any, n: int) -> None:
        r = self.rng
        cur.execute("INSERT INTO accounts VALUES (%s, %s, %s)", (n, f"owner {n}", r.randrange(1000)))
        cur.execute("INSERT INTO moves VALUES (%s, %s, %s)", (n % 50, n, r.randrange(100)))
        cur.execute(
            "UPDATE accounts SET balance = balance + %s WHERE id = %s", (r.randrange(50), r.randrange(1, n))
        )
        cur.execute("UPDATE accounts SET balance = balance - 1 WHERE id = %s", (n,))  # the same row twice
        if n % 3 == 0:
            cur.execute("DELETE FROM accounts WHERE id = %s", (r.randrange(1, n),))
        if n % 7 == 0:
            cur.execute("UPDATE moves SET amount = amount + 1 WHERE a = %s", (n % 50,))  # several rows
        if n % 11 == 0:  # a primary-key change: Debezium writes a delete and a create
            cur.execute("UPDATE accounts SET id = id + 100000 WHERE id = %s", (n - 5,))
        if n % 13 == 0:
            cur.execute("DELETE FROM moves WHERE a = %s AND b < %s", (n % 50, n - 100))
        if n == 1300:  # between the two kills: Debezium's truncate (op t), maybe replayed
            cur.execute("TRUNCATE TABLE moves")


def _seed(server: LocalMariaDB, rows: int) -> None:
    values = ", ".join(f"({i}, 'owner {i}', {i * 10})" for i in range(1, rows + 1))
    server.execute(f"INSERT INTO accounts VALUES {values}", database=DB)


def _connector(server: LocalMariaDB, brokers: TestCluster) -> dict[str, str]:
    return debezium_mysql_config(
        host="127.0.0.1", port=server.port, user="root", password="", database=DB, server_id=5401,
        topic_prefix=PREFIX, bootstrap=brokers.bootstrap, history_topic=f"{PREFIX}.history",
        tables=list(KEYS),
    )  # fmt: skip


def _topics_exist(bootstrap: str, names: list[str]) -> bool:
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=5)
    return all(n in meta.topics and not meta.topics[n].error for n in names)


def _target_rows(url: str) -> dict[str, dict[str, dict[str, Any]]]:
    with open_target(url) as t:
        out = {}
        for table in KEYS:
            try:
                out[table] = t.read_rows(table)
            except Exception:  # not created yet
                out[table] = {}
        return out


def _replays(bootstrap: str) -> tuple[int, int]:
    """Change records in the table topics, and how many of them repeat an earlier one (the same
    change written again by a worker that restarted from older committed offsets)."""
    seen: set[bytes] = set()
    total = 0
    for topic in TOPICS:
        for value in read_all(bootstrap, topic).column("value").to_pylist():
            if value is None:
                continue
            doc = orjson.loads(value)
            doc.pop("ts_ms", None), doc.pop("ts_us", None), doc.pop("ts_ns", None)
            total += 1
            seen.add(topic.encode() + orjson.dumps(doc, option=orjson.OPT_SORT_KEYS))
    return total, total - len(seen)


@pytest.mark.slow
def test_debezium_through_connect_into_sluice_survives_broker_and_worker_kills(
    spark: Any, brokers: TestCluster, source: LocalMariaDB, postgres: LocalPostgres, tmp_path: Path
) -> None:
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery

    t0 = time.monotonic()
    _seed(source, 200)  # read by Debezium's snapshot (op r)
    target = postgres.create_database("dbz_target")
    worker = ConnectWorker(
        tmp_path / "worker", brokers.bootstrap, group_id="dbz-workers", topic_prefix="dbz-connect"
    )
    query = None
    workload = Workload(source, transactions=600, max_s=90)
    try:
        for topic in TOPICS:  # as deploy/debezium/topics.sh may: `moves` gets no snapshot row
            create_topic(brokers.bootstrap, topic)
        worker.start()
        worker.put_connector("shop", _connector(source, brokers))
        worker.wait_running("shop")
        wait_until(lambda: _topics_exist(brokers.bootstrap, TOPICS), 60, "Debezium's table topics")
        query = ApplyQuery(
            spark,
            ApplyConfig(
                bootstrap=brokers.bootstrap, target=target, topics=TOPICS, pipeline="dbz-shop",
                checkpoint=tmp_path / "checkpoint", trigger_s=1.0, envelope="debezium",
            ),
        )  # fmt: skip
        query.start()
        workload.thread.start()
        wait_until(lambda: workload.progress >= 150, 60, "the workload's first 150 transactions")
        brokers.kill(2)  # kill -9 of one broker of three, under the writes
        wait_until(lambda: workload.progress >= 250, 60, "writes with broker 2 down")
        worker.kill()  # kill -9 of the Connect worker: no offset flush, so Debezium replays
        time.sleep(2)
        worker.start()
        brokers.restart(2)
        worker.wait_running("shop")
        workload.thread.join(120)
        assert workload.error is None, workload.error
        assert not workload.thread.is_alive(), "the workload did not end"
        truth = Truth(tables=source_rows(source, DB, KEYS), key_columns=KEYS)
        last: list[Any] = [None]

        def caught_up() -> bool:
            failure = query.failure() if query is not None else None
            assert failure is None, f"the apply query failed: {failure}"
            last[0] = compare(truth, _target_rows(target))
            return bool(last[0].ok)

        try:
            wait_until(caught_up, 180, "the target to equal the source", interval_s=2)
        except Exception:
            raise AssertionError(f"target differs from the source: {last[0] and last[0].summary()}") from None
        rows = sum(len(v) for v in truth.tables.values())
        records, replayed = _replays(brokers.bootstrap)
        print(
            f"connect_debezium transactions={workload.progress} rows={rows} records={records} "
            f"replayed={replayed} took_s={time.monotonic() - t0:.1f}"
        )
        assert workload.progress == 600 and rows > 500
    finally:
        if query is not None:
            query.stop()
        worker.stop(grace_s=10)


def test_connect_refuses_internal_topics_that_are_not_compacted(brokers: TestCluster, tmp_path: Path) -> None:
    """Connect reads each internal topic's cleanup.policy from Sluice (DescribeConfigs) and will
    not keep its offsets in a topic that deletes them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": brokers.bootstrap, "log_level": 0})
    names = {"configs": 1, "offsets": 5, "status": 1}
    futures = admin.create_topics(
        [NewTopic(f"refuse-{n}", p, 3, config={"cleanup.policy": "delete"}) for n, p in names.items()],
        operation_timeout=30,
    )
    for f in futures.values():
        f.result()
    worker = ConnectWorker(tmp_path / "worker", brokers.bootstrap, group_id="refuse", topic_prefix="refuse")
    try:
        worker.start(wait=False)
        # Connect gives up in about 10 s (its herder thread exits, the worker shuts down), then
        # its JVM takes ~45 s more to exit (an executor that does not stop in time): the refusal
        # is read from its log, not waited out.
        gave_up = "Uncaught exception in herder work thread, exiting"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and worker.running() and gave_up not in worker.log_text():
            time.sleep(0.5)
        text = worker.log_text()
        assert gave_up in text, f"Connect started on delete-policy topics; its log ends:\n{text[-2000:]}"
        assert "is required to have 'cleanup.policy=compact'" in text, text[-3000:]
        assert "found the topic currently has 'cleanup.policy=delete'" in text, text[-3000:]

        def rest_gone() -> bool:
            try:
                worker.request("GET", "/connectors", timeout_s=2)
            except OSError:
                return True
            return False

        wait_until(rest_gone, 30, "the refusing worker's REST API to stop", interval_s=0.5)
    finally:
        worker.stop(grace_s=2)

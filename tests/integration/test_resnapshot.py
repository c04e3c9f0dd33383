"""Re-snapshots while streaming (sync/sources/resnapshot.py): a table read again in key-range
chunks by the running capture, under concurrent updates, deletes and inserts, ends equal to the
source; composite keys split; the binlog goes on between chunks; listed keys are repaired; and
a table added to a running task is snapshotted, alone."""

from __future__ import annotations

import itertools
import random
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.envelope import key_text
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.sources.resnapshot import new_request
from sluice.sync.tasks import SourceSpec
from sluice.sync.truth import Truth, compare
from tests.integration.test_mysql_capture import _apply_log_tables, read_all, running, wait_caught_up
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.mysql_source import master_position


class Requests:
    """The control znode's request list, in memory: what the capture reads and marks done."""

    def __init__(self, *requests: dict[str, Any]) -> None:
        self.pending = list(requests)
        self.lock = threading.Lock()

    def __call__(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.pending)

    def done(self, request_id: str) -> None:
        with self.lock:
            self.pending = [r for r in self.pending if r["id"] != request_id]


def items_table(server: LocalMariaDB, db: str, rows: int) -> None:
    """`items` with `rows` rows, filled in one statement from MariaDB's sequence engine."""
    server.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    server.execute(
        "CREATE TABLE items (id BIGINT PRIMARY KEY, v INT, note VARCHAR(32))",
        f"INSERT INTO items SELECT seq, seq % 1000, CONCAT('n', seq) FROM seq_1_to_{rows}",
        "CREATE TABLE ticks (id INT PRIMARY KEY AUTO_INCREMENT, at DOUBLE)",
        database=db,
    )


class ItemsWriter(threading.Thread):
    """Updates, deletes and inserts all over `items` until stopped (one change per statement)."""

    def __init__(self, server: LocalMariaDB, db: str, rows: int) -> None:
        super().__init__(daemon=True)
        self.server, self.db, self.rows = server, db, rows
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        import pymysql

        rng = random.Random(7)
        try:
            conn = pymysql.connect(**self.server.connect_args(self.db), autocommit=True)  # type: ignore[arg-type]
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    k = rng.randrange(1, self.rows + 1)
                    r = rng.random()
                    if r < 0.5:
                        note = f"u{self.done}"
                        cur.execute("UPDATE items SET v = v + 1, note = %s WHERE id = %s", (note, k))
                    elif r < 0.8:
                        cur.execute("DELETE FROM items WHERE id = %s", (k,))
                    else:
                        cur.execute("REPLACE INTO items VALUES (%s, -1, 'again')", (k,))
                    self.done += 1
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


KEYS = {"items": ["id"], "parts": ["sku", "line"]}


def assert_target_equals_source(
    bootstrap: str, topic: str, tmp_path: Path, server: LocalMariaDB, db: str, table: str
) -> int:
    """Apply everything in the topic to a SQLite target; its `table` must equal the source's.
    Returns the source's row count."""
    import pymysql.cursors

    got = _apply_log_tables(bootstrap, topic, f"sqlite:///{tmp_path / 't.db'}", db, [table])
    conn = pymysql.connect(**server.connect_args(db), cursorclass=pymysql.cursors.DictCursor)  # type: ignore[arg-type]
    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM {table}")
        want = {key_text({k: row[k] for k in KEYS[table]}): dict(row) for row in cur.fetchall()}
    conn.close()
    cmp = compare(Truth(tables={table: want}, key_columns={table: KEYS[table]}), got)
    assert cmp.ok, cmp.summary()
    return len(want)


def ops_in_log(bootstrap: str, topic: str, partitions: int = 3) -> list[dict[str, Any]]:
    """Every envelope of a topic (of a one-partition topic: in log order)."""
    return [orjson.loads(v) for v in read_all(bootstrap, topic, partitions).column("value").to_pylist()]


def _capture(
    mariadb: LocalMariaDB, db: str, tables: list[str], topic: str, bootstrap: str, requests: Requests,
    *, start: str | None, chunk_rows: int,
) -> MySqlCapture:  # fmt: skip
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    return MySqlCapture(
        spec, tables, lambda _t: topic, bootstrap, name=db, start=start, snapshot_chunk_rows=chunk_rows,
        snapshot_requests=requests, snapshot_done=requests.done,
    )  # fmt: skip


def test_a_resnapshot_under_concurrent_updates_and_deletes_ends_equal_to_the_source(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """The capture streams from after the table was filled, so the target learns its rows only
    from the re-snapshot, while a writer updates, deletes and re-inserts rows everywhere. Chunk
    rows at their snapshot's position and the binlog's changes reconcile in the target's version
    guard. (Labelling chunk rows above their snapshot loses the deletes made after it: seen.)"""
    rows = 200_000
    cluster = make_cluster(1)
    db, topic = f"rs{rows}", f"rs{rows}.changes"
    create_topic(cluster.bootstrap, topic, 3, 1)
    items_table(mariadb, db, rows)
    requests = Requests(new_request("items"))
    writer = ItemsWriter(mariadb, db, rows)
    cap = _capture(mariadb, db, ["items"], topic, cluster.bootstrap, requests,
                   start=master_position(mariadb), chunk_rows=rows // 8)  # fmt: skip
    with running(cap):
        writer.start()
        wait_until(lambda: not requests() or cap.stats.errors, 240, "the re-snapshot served")
        writer.stop.set()
        writer.join(30)
        assert writer.error is None, writer.error
        assert not cap.stats.errors, cap.stats.errors
        wait_caught_up(cap, mariadb, 120)
    assert writer.done > 100  # the writes ran during the re-snapshot
    assert_target_equals_source(cluster.bootstrap, topic, tmp_path, mariadb, db, "items")


def test_a_composite_key_table_is_resnapshotted_in_keyset_chunks(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """(sku VARCHAR, line INT) keys, read 40 rows a chunk across sku boundaries, with a `where`
    request too; rows deleted and updated meanwhile come out right. A request whose `where` the
    source refuses is dropped, not served again and again (with it raised as a capture error
    the capture stopped and the other requests waited: seen)."""
    cluster = make_cluster(1)
    db, topic = "rscomp", "rscomp.changes"
    create_topic(cluster.bootstrap, topic, 3, 1)
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    values = ", ".join(f"('s{s:02d}', {line}, {s * line})" for s in range(20) for line in range(1, 26))
    mariadb.execute(
        "CREATE TABLE parts (sku VARCHAR(16), line INT, qty INT, PRIMARY KEY (sku, line))",
        f"INSERT INTO parts VALUES {values}",
        database=db,
    )
    bad = new_request("parts", where="no_such_column > 1")  # dropped with an error; the rest go on
    requests = Requests(bad, new_request("parts"), new_request("parts", where="line <= 3"))
    cap = _capture(mariadb, db, ["parts"], topic, cluster.bootstrap, requests,
                   start=master_position(mariadb), chunk_rows=40)  # fmt: skip
    with running(cap):
        wait_until(lambda: cap.stats.snapshot_rows >= 80, 60, "the first chunks")
        mariadb.execute(
            "DELETE FROM parts WHERE sku = 's19' AND line > 20",
            "UPDATE parts SET qty = -1 WHERE line = 2",
            database=db,
        )
        wait_until(lambda: not requests(), 120, "the requests served or dropped")
        wait_caught_up(cap, mariadb, 60)
    rows = assert_target_equals_source(cluster.bootstrap, topic, tmp_path, mariadb, db, "parts")
    assert rows == 500 - 5
    envelopes = ops_in_log(cluster.bootstrap, topic)
    chunk_rows = [e for e in envelopes if e["op"] == "r"]
    assert cap.resnapshots.chunks >= 13 + 1  # 500 rows in chunks of 40, then the where request
    assert cap.resnapshots.served == 2
    assert len([e for e in chunk_rows if e["key"]["line"] <= 3]) >= 2 * 60 - 5  # the where request too


def test_a_resnapshot_does_not_stall_the_binlog(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster]
) -> None:
    """While a table is read again in many chunks, changes of another table keep reaching the
    log between them (one partition: log order is capture order). Serving every chunk in one
    go holds every tick back until the last chunk: seen failing with chunks_per_pass raised."""
    cluster = make_cluster(1)
    db, topic = "rsstall", "rsstall.changes"
    create_topic(cluster.bootstrap, topic, 1, 1)
    items_table(mariadb, db, 30_000)
    requests = Requests(new_request("items"))
    cap = _capture(mariadb, db, ["items", "ticks"], topic, cluster.bootstrap, requests,
                   start=master_position(mariadb), chunk_rows=2000)  # fmt: skip
    stop = threading.Event()

    def ticks() -> None:
        while not stop.wait(0.02):
            mariadb.execute("INSERT INTO ticks (at) VALUES (UNIX_TIMESTAMP(NOW(6)))", database=db)

    ticker = threading.Thread(target=ticks, daemon=True)
    with running(cap):
        ticker.start()
        wait_until(lambda: not requests(), 120, "the re-snapshot served")
        stop.set()
        ticker.join(10)
        wait_caught_up(cap, mariadb, 60)
    log = ops_in_log(cluster.bootstrap, topic, partitions=1)
    order = [e["op"] + ("" if e["op"] == "r" else e["table"]) for e in log]
    first, last = order.index("r"), len(order) - 1 - order[::-1].index("r")
    between = [o for o in order[first:last] if o == "cticks"]
    assert cap.resnapshots.chunks >= 15  # 30k rows, 2k a chunk
    assert len(between) >= 5, f"{len(between)} ticks reached the log during the re-snapshot"


def test_listed_keys_are_read_again_and_absent_ones_deleted(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """Rows changed behind the binlog's back (sql_log_bin=0): a request with their keys and
    delete_absent puts the target right: the updated row read again, the deleted one deleted,
    the inserted one added."""
    cluster = make_cluster(1)
    db, topic = "rskeys", "rskeys.changes"
    create_topic(cluster.bootstrap, topic, 3, 1)
    items_table(mariadb, db, 50)
    requests = Requests()
    cap = _capture(mariadb, db, ["items"], topic, cluster.bootstrap, requests, start=None, chunk_rows=100)
    with running(cap):
        wait_until(lambda: cap.stats.snapshot_rows >= 50 and cap.stats.position, 60, "the snapshot")
        mariadb.execute(
            "SET SESSION sql_log_bin = 0",
            "UPDATE items SET v = 999 WHERE id = 7",
            "DELETE FROM items WHERE id = 8",
            "INSERT INTO items VALUES (51, 51, 'new')",
            database=db,
        )
        keys = [{"id": 7}, {"id": 8}, {"id": 51}]
        requests.pending.append(new_request("items", keys=keys, delete_absent=True))
        wait_until(lambda: not requests(), 60, "the repair served")
        wait_caught_up(cap, mariadb, 60)
    assert_target_equals_source(cluster.bootstrap, topic, tmp_path, mariadb, db, "items")
    deletes = [e for e in ops_in_log(cluster.bootstrap, topic) if e["op"] == "d"]
    assert [e["key"] for e in deletes] == [{"id": 8}]


ADD_TASK = """
id: {id}
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: {db}}}
tables: [{tables}]
topic: "{id}.changes"
target: {target}
options: {{trigger: 500ms, partitions: 1, replication_factor: 1}}
"""


def test_task_snapshot_and_an_added_table_queue_requests(zookeeper: str, tmp_path: Path) -> None:
    """`sluice task snapshot` queues a request without a restart (a restart would stop the
    stream); a table outside the task is refused with the fix named; `sluice task update` adding
    a table queues its re-snapshot in the same control write as the restart; a control znode
    from before requests still loads."""
    from sluice.cluster.zkstore import ZkStore
    from sluice.sync.tasks import TaskStore
    from tests.integration.test_tasks import sluice

    zk_address = f"{zookeeper.split('/')[0]}/t-{uuid.uuid4().hex[:8]}"
    spec = tmp_path / "t.yaml"
    spec.write_text(ADD_TASK.format(id="addt", port=3306, db="shop", tables="items", target="sqlite:///x.db"))
    assert sluice("task", "create", "--file", str(spec), zk=zk_address).returncode == 0
    zk = ZkStore(zk_address)
    zk.start()
    try:
        store = TaskStore(zk.client)
        zk.client.set("/tasks/addt/control", b'{"paused": false, "restarts": 0, "from_position": null}')
        assert store.control("addt").snapshots == []

        asked = sluice("task", "snapshot", "addt", "--table", "items", "--where", "id > 5", zk=zk_address)
        assert asked.returncode == 0, asked.stderr
        control = store.control("addt")
        assert control.restarts == 0 and len(control.snapshots) == 1
        request = control.snapshots[0]
        assert asked.stdout.strip() == f"snapshot={request['id']} table=items"
        assert (request["table"], request["where"], request["keys"]) == ("items", "id > 5", None)

        refused = sluice("task", "snapshot", "addt", "--table", "orders", zk=zk_address)
        assert refused.returncode == 2
        assert (
            "'orders' is not one of task 'addt'" in refused.stderr and "sluice task update" in refused.stderr
        )

        spec.write_text(
            ADD_TASK.format(id="addt", port=3306, db="shop", tables="items, orders", target="sqlite:///x.db")
        )
        assert sluice("task", "update", "--file", str(spec), zk=zk_address).returncode == 0
        control = store.control("addt")
        assert control.restarts == 1
        assert [(r["table"], r["where"], r["keys"]) for r in control.snapshots] == [
            ("items", "id > 5", None),
            ("orders", None, None),
        ]
        store.snapshot_done("addt", request["id"])
        assert [r["table"] for r in store.control("addt").snapshots] == ["orders"]
    finally:
        zk.stop()


@pytest.mark.slow
def test_a_table_added_to_a_running_task_is_snapshotted_alone(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """A worker runs a task on `items`; `sluice task update` adds `ticks`, which holds rows from
    before: they reach the target through a re-snapshot of ticks only (no row of items is read
    again), changes to both go on, and the request is gone once served."""
    import subprocess
    import sys

    from tests.integration.test_workers import create_task, start_worker, stop_worker

    cluster = make_cluster(1)
    db = "rsadd"
    items_table(mariadb, db, 500)
    mariadb.execute("INSERT INTO ticks (at) SELECT seq FROM seq_1_to_300", database=db)
    url = f"sqlite:///{tmp_path / 't.db'}"
    task = ADD_TASK.format(id=db, port=mariadb.port, db=db, tables="items", target=url)
    zk, store = create_task(task, tmp_path, cluster.zookeeper)
    worker = start_worker("wa1", cluster.bootstrap, cluster.zookeeper, tmp_path)

    def rows(table: str) -> int:
        from sluice.sync.targets import open_target

        with open_target(url) as t:
            return len(t.read_rows(table))

    try:
        wait_until(lambda: rows("items") == 500, 180, "the task's snapshot")
        spec = tmp_path / "added.yaml"
        spec.write_text(ADD_TASK.format(id=db, port=mariadb.port, db=db, tables="items, ticks", target=url))
        updated = subprocess.run(
            [sys.executable, "-m", "sluice.ops.cli", "task", "update", "--file", str(spec),
             "--zookeeper", cluster.zookeeper], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert updated.returncode == 0, updated.stderr
        mariadb.execute(
            "UPDATE items SET v = -1 WHERE id = 1", "INSERT INTO ticks (at) VALUES (-1)", database=db
        )
        wait_until(lambda: rows("ticks") == 301, 180, "the added table's rows and its new row")
        wait_until(lambda: not store.control(db).snapshots, 60, "the request marked done")
        log = ops_in_log(cluster.bootstrap, f"{db}.changes", partitions=1)
        snapshot_rows = [e["table"] for e in log if e["op"] == "r"]
        # ticks as they were when read (the new row in them, or not yet); items not read again
        assert snapshot_rows.count("items") == 500 and snapshot_rows.count("ticks") in (300, 301)
        assert snapshot_rows.index("ticks") > max(i for i, t in enumerate(snapshot_rows) if t == "items")
    finally:
        stop_worker(worker)
        zk.stop()


def test_a_resnapshot_cut_short_is_served_again_and_the_restart_streams_on(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """The capture stops two chunks into a re-snapshot: the request is still pending, and the
    position recovered from the log is a binlog position (the chunk groups resume where the
    stream reads on), not a cut-short initial snapshot, which would read every table again.
    The next capture serves the request from its start; rows deleted in between stay deleted.
    (Chunk groups resuming at `snapshot`: recovered `snapshot`, seen.)"""
    from sluice.sync.sources.mysql import recover_position
    from sluice.sync.sources.mysql_base import BinlogPosition

    cluster = make_cluster(1)
    db, topic = "rscut", "rscut.changes"
    create_topic(cluster.bootstrap, topic, 3, 1)
    items_table(mariadb, db, 20_000)
    requests = Requests(new_request("items"))
    first = _capture(mariadb, db, ["items"], topic, cluster.bootstrap, requests,
                     start=master_position(mariadb), chunk_rows=6000)  # fmt: skip
    with running(first):
        wait_until(lambda: first.resnapshots.chunks >= 2, 60, "two chunks")
    assert len(requests()) == 1
    mariadb.execute("DELETE FROM items WHERE id <= 3000 AND id % 7 = 0", database=db)
    recovered = recover_position(cluster.bootstrap, [topic])
    assert recovered is not None and BinlogPosition.parse(recovered), recovered
    second = _capture(
        mariadb, db, ["items"], topic, cluster.bootstrap, requests, start=recovered, chunk_rows=6000
    )
    with running(second):
        wait_until(lambda: not requests(), 60, "the request served again")
        wait_caught_up(second, mariadb, 60)
    assert second.resnapshots.chunks == 4  # from the start again
    assert_target_equals_source(cluster.bootstrap, topic, tmp_path, mariadb, db, "items")


@pytest.mark.slow  # a Spark session of its own when run alone: 45 s here
def test_the_initial_snapshot_splits_a_composite_key_table_for_spark(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path, spark: Any
) -> None:
    """A large table with a (VARCHAR, INT) key is read by the Spark key-range job in keyset
    ranges (planned with `plan_ranges`) while rows are updated and deleted; the target ends
    equal to the source. (Before, only single integer keys were split and this table was read
    whole: the runner got no ranges, seen.)"""
    from sluice.pipeline.snapshot import run_snapshot_chunks
    from sluice.sync.sources.mysql_snapshot import SnapshotChunk

    cluster = make_cluster(1)
    db, topic = "rsspark", "rsspark.changes"
    create_topic(cluster.bootstrap, topic, 3, 1)
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE parts (sku VARCHAR(16), line INT, qty INT, PRIMARY KEY (sku, line))",
        "INSERT INTO parts SELECT CONCAT('s', LPAD(seq DIV 40, 4, '0')), seq MOD 40, seq FROM seq_0_to_11999",
        "ANALYZE TABLE parts",
        database=db,
    )
    ranges: list[SnapshotChunk] = []

    def runner(chunks: list[SnapshotChunk]) -> list[object]:
        ranges.extend(chunks)
        return list(run_snapshot_chunks(spark, chunks))

    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database=db)
    cap = MySqlCapture(spec, ["parts"], lambda _t: topic, cluster.bootstrap, name=db, snapshot_runner=runner,
                       snapshot_parallel_rows=5000, snapshot_chunk_rows=2000)  # fmt: skip
    stop = threading.Event()

    def writes() -> None:
        rng = random.Random(3)
        while not stop.wait(0.005):
            sku = f"s{rng.randrange(300):04d}"
            mariadb.execute(f"UPDATE parts SET qty = -qty WHERE sku = '{sku}' AND line = {rng.randrange(40)}",
                            f"DELETE FROM parts WHERE sku = '{sku}' AND line = {rng.randrange(40)}",
                            database=db)  # fmt: skip

    writer = threading.Thread(target=writes, daemon=True)
    writer.start()
    try:
        with running(cap):
            wait_until(lambda: ranges and cap.stats.position, 120, "the snapshot")
            stop.set()
            writer.join(10)
            wait_caught_up(cap, mariadb, 60)
    finally:
        stop.set()
    assert len(ranges) >= 6 and ranges[0].keys == ("sku", "line") and ranges[0].lo is None
    assert all(a.hi == b.lo for a, b in itertools.pairwise(ranges)) and ranges[-1].hi is None
    assert_target_equals_source(cluster.bootstrap, topic, tmp_path, mariadb, db, "parts")

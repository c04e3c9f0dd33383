"""Transaction-consistent apply: a reader polling the target while MariaDB transactions that
span every partition are captured and applied never sees one partially applied; BEGIN/END
metadata; heartbeats of an idle source.

Every transaction sets the same new batch number on every row and moves an amount between two
rows, so a consistent state has one batch number on all rows and the starting total. Without
the cuts (no transactionTopic) micro-batches end wherever maxRecordsPerTrigger puts them and
the reader sees mixed batch numbers: the slow variant shows the test can fail.
"""

from __future__ import annotations

import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pymysql
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources.mysql import MySqlCapture, recover_position
from sluice.sync.sources.mysql_base import BinlogPosition
from sluice.sync.tasks import SourceSpec
from tests.integration.test_mysql_capture import read_all, running
from tests.integration.test_pipeline import create_topic
from tests.support.cluster import TestCluster, wait_until
from tests.support.mysql_source import master_position

ROWS = 30
BALANCE = 1000
TRANSACTIONS = 40


def _setup(server: LocalMariaDB, cluster: TestCluster, name: str, db: str) -> tuple[str, SourceSpec]:
    """Topics {name}.changes (3 partitions) and {name}.transactions, and database `db`."""
    create_topic(cluster.bootstrap, f"{name}.changes", 3, 1)
    create_topic(cluster.bootstrap, f"{name}.transactions", 1, 1)
    _create(server, db)
    return cluster.bootstrap, SourceSpec(kind="mariadb", port=server.port, user="root", database=db)


def _create(server: LocalMariaDB, db: str) -> None:
    server.execute(f"DROP DATABASE IF EXISTS `{db}`", f"CREATE DATABASE `{db}`")
    server.execute(
        "CREATE TABLE accounts (id INT PRIMARY KEY, batch INT NOT NULL, balance BIGINT NOT NULL)",
        "CREATE TABLE elsewhere (id INT PRIMARY KEY, n INT)",
        "INSERT INTO accounts VALUES " + ", ".join(f"({i}, 0, {BALANCE})" for i in range(1, ROWS + 1)),
        database=db,
    )


class Writer(threading.Thread):
    """TRANSACTIONS transactions, each: every row to batch n, then a transfer between two rows."""

    def __init__(self, server: LocalMariaDB, db: str) -> None:
        super().__init__(daemon=True)
        self.server, self.db = server, db
        self.error: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        rng = random.Random(18)
        try:
            conn = pymysql.connect(**self.server.connect_args(self.db))  # type: ignore[arg-type]
            with conn.cursor() as cur:
                for n in range(1, TRANSACTIONS + 1):
                    a, b = rng.sample(range(1, ROWS + 1), 2)
                    amount = rng.randrange(1, 50)
                    cur.execute("UPDATE accounts SET batch = %s", (n,))
                    cur.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, a))
                    cur.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, b))
                    conn.commit()
                    self.done = n
                    time.sleep(0.05)
            conn.close()
        except BaseException as exc:  # reported by the test
            self.error = exc


class Poller(threading.Thread):
    """Reads the target's rows over and over; records every state that is not consistent."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.polls = 0
        self.states: set[int] = set()
        self.bad: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                rows = self._read()
            except (sqlite3.OperationalError, psycopg.errors.UndefinedTable):  # no table yet
                time.sleep(0.01)
                continue
            self.polls += 1
            if not rows:
                continue
            batches = {r[0] for r in rows}
            total = sum(r[1] for r in rows)
            if len(rows) != ROWS or len(batches) != 1 or total != ROWS * BALANCE:
                self.bad.append(f"{len(rows)} rows, batches {sorted(batches)}, total {total}")
            else:
                self.states.add(next(iter(batches)))
            time.sleep(0.005)

    def _read(self) -> list[Any]:
        query = "SELECT batch, balance FROM accounts"
        if self.url.startswith("sqlite:///"):
            db = sqlite3.connect(f"file:{self.url[len('sqlite:///') :]}?mode=ro", uri=True, timeout=5)
            try:
                return db.execute(query).fetchall()
            finally:
                db.close()
        with psycopg.connect(self.url) as pg:
            return pg.execute(query).fetchall()


@pytest.mark.parametrize(
    ("cuts", "kind"),
    [
        (True, "sqlite"),
        pytest.param(True, "postgresql", marks=pytest.mark.slow),
        pytest.param(False, "sqlite", marks=pytest.mark.slow),
    ],
)
def test_a_reader_never_sees_half_a_source_transaction(
    spark: Any,
    mariadb: LocalMariaDB,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    request: pytest.FixtureRequest,
    cuts: bool,
    kind: str,
) -> None:
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery

    db = f"txc{int(cuts)}"
    bootstrap, spec = _setup(mariadb, make_cluster(1), "acct", db)
    cap = MySqlCapture(
        spec, ["accounts"], lambda _t: "acct.changes", bootstrap, name="acct",
        transactions_topic="acct.transactions", transaction_metadata=True,
    )  # fmt: skip
    url = (
        f"sqlite:///{tmp_path / 'target.db'}" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    )
    query = ApplyQuery(
        spark,
        ApplyConfig(
            bootstrap=bootstrap,
            target=url,
            topics=["acct.changes"],
            pipeline="acct",
            trigger_s=0.1,
            max_records_per_trigger=70,
            tables=["accounts"],
            transaction_topic="acct.transactions" if cuts else None,
        ),
    )
    writer, poller = Writer(mariadb, db), Poller(url)
    with running(cap):
        wait_until(lambda: cap.stats.position != "", 60, "snapshot taken")
        query.start()
        poller.start()
        try:
            wait_until(lambda: 0 in poller.states or poller.bad, 120, "the snapshot applied")
            writer.start()
            writer.join(120)
            assert writer.error is None and writer.done == TRANSACTIONS
            wait_until(lambda: TRANSACTIONS in poller.states or (poller.bad and not cuts), 120, "all applied")
        finally:
            poller.stop.set()
            poller.join(10)
            query.stop()
    assert query.error is None
    if not cuts:
        assert poller.bad, "without cuts the reader should have seen a transaction split"
        return
    assert not poller.bad, (
        f"{len(poller.bad)} of {poller.polls} polls saw half a transaction: {poller.bad[:5]}"
    )
    assert len(poller.states) >= 5, f"too few states seen to mean anything: {sorted(poller.states)}"

    # BEGIN/END metadata beside the cuts, and each change's place in its transaction
    meta = [orjson.loads(v) for v in read_all(bootstrap, "acct.transactions", 1)["value"].to_pylist()]
    ends = [m for m in meta if m["type"] == "end"]
    begins = {m["id"] for m in meta if m["type"] == "begin"}
    assert len(ends) == TRANSACTIONS and {e["id"] for e in ends} == begins
    assert all(re.fullmatch(r"\d+-\d+-\d+", e["id"]) for e in ends), ends[0]  # MariaDB GTIDs
    per_tx = ROWS + 2
    assert all(e["event_count"] == per_tx for e in ends)
    assert all(
        e["data_collections"] == [{"data_collection": f"{db}.accounts", "event_count": per_tx}] for e in ends
    )
    cuts = [m for m in meta if m["type"] == "cut"]
    assert len(cuts) >= 2 and cuts[-1]["gtid"] == ends[-1]["id"]  # where a GTID resume would start
    changes = [orjson.loads(v) for v in read_all(bootstrap, "acct.changes")["value"].to_pylist()]
    orders = sorted(
        c["source"]["transaction"]["total_order"]
        for c in changes
        if c["source"].get("transaction", {}).get("id") == ends[0]["id"]
    )
    assert orders == list(range(1, per_tx + 1))
    assert all(c["source"]["gtid"] == c["source"]["transaction"]["id"] for c in changes if c["op"] == "u")


def test_an_idle_source_still_moves_its_position(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster]
) -> None:
    """Writes only to a table the task does not capture: heartbeats put position markers (and a
    cut over them) near the binlog's end, so a restart resumes there."""
    bootstrap, spec = _setup(mariadb, make_cluster(1), "idle", "txidle")
    cap = MySqlCapture(
        spec, ["accounts"], lambda _t: "idle.changes", bootstrap, name="idle",
        transactions_topic="idle.transactions", heartbeat_s=0.5, snapshot_chunk_rows=10,
    )  # fmt: skip
    with running(cap):
        wait_until(lambda: recover_position(bootstrap, ["idle.changes"]) is not None, 60, "snapshot taken")
        first = str(recover_position(bootstrap, ["idle.changes"]))
        for i in range(20):
            mariadb.execute(f"INSERT INTO elsewhere VALUES ({i}, {i})", database="txidle")
        end = BinlogPosition.parse(master_position(mariadb))
        assert BinlogPosition.parse(first) < end

        def resumes_at_end() -> bool:
            at = recover_position(bootstrap, ["idle.changes"])
            return at is not None and BinlogPosition.parse(at) >= end

        wait_until(resumes_at_end, 30, "a heartbeat's position markers")
    assert cap.stats.changes == 0
    cuts = [orjson.loads(v) for v in read_all(bootstrap, "idle.transactions", 1)["value"].to_pylist()]
    ends = read_all(bootstrap, "idle.changes")
    newest: dict[str, int] = {}
    for p, off in zip(ends["partition"].to_pylist(), ends["offset"].to_pylist(), strict=True):
        newest[str(p)] = max(newest.get(str(p), 0), off + 1)
    assert cuts[-1]["offsets"]["idle.changes"] == newest  # the markers are inside the last cut
    # the snapshot (no source transaction) is cut in steps of snapshot_chunk_rows
    snapshot = [sum(c["offsets"]["idle.changes"].values()) for c in cuts if c["position"] == "snapshot"]
    assert len(snapshot) == 3 and snapshot[-1] == ROWS and snapshot == sorted(snapshot), snapshot

    # A restart from there goes on publishing cuts past what it writes
    again = MySqlCapture(
        spec, ["accounts"], lambda _t: "idle.changes", bootstrap, name="idle",
        start=recover_position(bootstrap, ["idle.changes"]), transactions_topic="idle.transactions",
    )  # fmt: skip
    with running(again):
        mariadb.execute("UPDATE accounts SET batch = 1 WHERE id = 1", database="txidle")
        wait_until(lambda: again.stats.changes == 1, 30, "the change captured")

        def cut_covers_the_change() -> bool:
            last = orjson.loads(read_all(bootstrap, "idle.transactions", 1)["value"].to_pylist()[-1])
            return bool(last["offsets"]["idle.changes"] != newest and last["type"] == "cut")

        wait_until(cut_covers_the_change, 30, "a cut over the change")


def test_the_part_of_a_transaction_a_crash_left_is_applied_only_with_its_copy(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster]
) -> None:
    """A capture died while a transaction was half in the log: the restarted capture captures it
    again from the resume position, and publishes no cut over the half left before its whole
    copy is in the log too."""
    from confluent_kafka import Producer

    from tests.integration.test_pipeline import end_offsets

    bootstrap, spec = _setup(mariadb, make_cluster(1), "crash", "txcrash")

    def capture(start: str | None) -> MySqlCapture:
        return MySqlCapture(spec, ["accounts"], lambda _t: "crash.changes", bootstrap, name="crash",
                            start=start, transactions_topic="crash.transactions")  # fmt: skip

    with running(capture(None)):
        wait_until(lambda: recover_position(bootstrap, ["crash.changes"]) is not None, 60, "snapshot taken")
    resume = str(recover_position(bootstrap, ["crash.changes"]))
    mariadb.execute("UPDATE accounts SET batch = 7", database="txcrash")  # every row, every partition
    # What the dead capture had written of it: one change, in partition 0
    half = {
        "op": "u", "table": "accounts", "key": {"id": 1}, "before": None,
        "after": {"id": 1, "batch": 7, "balance": BALANCE},
        "source": {"connector": "mariadb", "name": "crash", "db": "txcrash", "pos": 1 << 40,
                   "position": master_position(mariadb), "resume": resume, "ts_ms": 1, "epoch": 0,
                   "execution": "dead"},
        "ts_ms": 1,
    }  # fmt: skip
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 0})
    producer.produce("crash.changes", orjson.dumps(half), partition=0)
    assert producer.flush(30) == 0
    base = end_offsets(bootstrap, "crash.changes")
    left_at = base[("crash.changes", 0)] - 1
    before = len(read_all(bootstrap, "crash.transactions", 1))

    def cut_offsets(cut: dict[str, Any]) -> dict[tuple[str, int], int]:
        return {("crash.changes", int(p)): o for p, o in cut["offsets"]["crash.changes"].items()}

    again = capture(resume)
    with running(again):
        wait_until(lambda: again.stats.changes == ROWS, 30, "the transaction captured again")
        # Captured is not yet in the log (under load the acknowledgements lag): the copy's end is
        # where the log holds all ROWS of it, one record per row.
        ends: dict[tuple[str, int], int] = {}

        def copy_in_log() -> bool:
            ends.update(end_offsets(bootstrap, "crash.changes"))
            return sum(ends.values()) >= sum(base.values()) + ROWS

        wait_until(copy_in_log, 30, "the whole copy in the log")

        def whole() -> bool:
            last = orjson.loads(read_all(bootstrap, "crash.transactions", 1)["value"].to_pylist()[-1])
            return all(cut_offsets(last)[tp] >= end for tp, end in ends.items())

        wait_until(whole, 30, "a cut over the whole copy")
    cuts = [
        orjson.loads(v) for v in read_all(bootstrap, "crash.transactions", 1)["value"].to_pylist()[before:]
    ]
    for cut in cuts:
        offsets = cut_offsets(cut)
        if offsets[("crash.changes", 0)] > left_at:
            assert all(offsets[tp] >= end for tp, end in ends.items()), (
                f"a cut over the half left without the whole copy: {cut}"
            )


class _Alarms:
    def __init__(self) -> None:
        self.raised: list[tuple[str, str, dict[str, Any]]] = []

    def raise_alarm(self, task_id: str, kind: str, detail: dict[str, Any]) -> None:
        self.raised.append((task_id, kind, detail))


class _Stopped:
    """A capture that stopped at `resume` (a paused task's)."""

    def __init__(self, resume: str) -> None:
        self.resume = resume

    def resume_position(self) -> str:
        return self.resume


def test_a_paused_tasks_binlog_is_reported_and_a_purge_risk_alarmed(mariadb: LocalMariaDB) -> None:
    from sluice.security.client import PLAINTEXT
    from sluice.sync.execution import TaskExecution
    from sluice.sync.tasks import Control, TaskSpec

    for _ in range(3):
        mariadb.execute("FLUSH BINARY LOGS")
    logs = [str(r[0]) for r in mariadb.execute("SHOW BINARY LOGS")]
    ex = TaskExecution.__new__(TaskExecution)  # only what _binlog_report reads
    alarms = _Alarms()
    spec = SourceSpec(kind="mariadb", port=mariadb.port, user="root", database="mysql")
    ex.task_id, ex.spec, ex.store, ex.control = (
        "pz",
        TaskSpec("pz", spec, "sqlite:///x"),
        alarms,
        Control(True),
    )
    ex.execution, ex.security, ex._binlog, ex._binlog_alarmed = "e1", PLAINTEXT, {}, ""

    def report(resume: str) -> dict[str, Any]:
        ex.capture, ex._binlog_checked = _Stopped(resume), -1e9
        return ex._binlog_report()

    assert report(f"{logs[-1]}:4") == {"needed_binlog": logs[-1], "oldest_binlog": logs[0]}
    assert alarms.raised == []
    assert report(f"{logs[1]}:4") == {"needed_binlog": logs[1], "oldest_binlog": logs[0]}
    assert [(k, d["needed_binlog"], d["risk"]) for _, k, d in alarms.raised] == [
        ("binlog-purge-risk", logs[1], "oldest")
    ]
    report(f"{logs[1]}:400")  # the same file: alarmed once
    assert len(alarms.raised) == 1
    gone = logs[0].rsplit(".", 1)[0] + ".000000"
    report(f"{gone}:4")
    assert alarms.raised[-1][2]["risk"] == "purged" and alarms.raised[-1][2]["needed_binlog"] == gone

"""`sluice task verify [--repair]` against a running MariaDB -> SQLite task while the source keeps
changing: rows changed, deleted and inserted behind the pipeline's back are found (and only
they: rows the pipeline has yet to apply are re-checked once it has passed the source's
position), and `--repair` re-snapshots exactly those keys through the running capture."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.ops.mariadb import LocalMariaDB
from sluice.pipeline.verify import log_ends, repair, report_lines, verify
from sluice.sync.sources.mysql import MySqlCapture
from sluice.sync.sources.resnapshot import new_request
from sluice.sync.targets import ColumnMapping, open_target
from sluice.sync.tasks import parse_spec
from tests.integration.test_mysql_capture import read_all, running
from tests.integration.test_pipeline import create_topic
from tests.integration.test_resnapshot import Requests
from tests.integration.test_workers import create_task, start_worker, stop_worker
from tests.support.cluster import TestCluster, wait_until

TASK = """
id: {db}
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: {db}}}
tables: [items, parts]
topic: "{db}.changes"
target: {target}
mapping: {{parts: {{table: stock, rename: {{qty: quantity}}}}}}
options: {{trigger: 500ms, partitions: 2, replication_factor: 1}}
"""


def vfy_database(mariadb: LocalMariaDB, db: str) -> None:
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, v INT, price DECIMAL(8,2), day DATE, note VARCHAR(32))",
        "INSERT INTO items SELECT seq, seq % 97, seq / 8, '2026-01-01' + INTERVAL (seq % 300) DAY, "
        "CONCAT('n', seq) FROM seq_1_to_2000",
        "CREATE TABLE parts (sku VARCHAR(16), line INT, qty INT, PRIMARY KEY (sku, line))",
        "INSERT INTO parts SELECT CONCAT('s', LPAD(seq DIV 10, 2, '0')), seq MOD 10, seq FROM seq_0_to_199",
        database=db,
    )


class Writer(threading.Thread):
    """Updates rows 1000..1899 of items, one every 10 ms, until stopped: the pipeline is always a
    little behind on them."""

    def __init__(self, mariadb: LocalMariaDB, db: str) -> None:
        super().__init__(daemon=True)
        self.mariadb, self.db, self.stop = mariadb, db, threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.wait(0.01):
            n += 1
            self.mariadb.execute(f"UPDATE items SET v = v + 1 WHERE id = {1000 + n % 900}", database=self.db)


TAMPER = [
    "UPDATE items SET v = -5 WHERE id = 1",
    "DELETE FROM items WHERE id = 2",
    "INSERT INTO items (id, v, note, _sluice_pos) VALUES (99999, 1, 'stray', 1)",
    "UPDATE stock SET quantity = -1 WHERE sku = 's03' AND line = 4",
]


def tamper(mariadb: LocalMariaDB, db: str, target_url: str) -> None:
    """Behind the pipeline's back: in the target a row updated, one deleted, one inserted and a
    row of parts (the target's `stock`, its qty `quantity`) updated; in the source a row inserted
    without the binlog."""
    if target_url.startswith("sqlite"):
        target = sqlite3.connect(target_url.removeprefix("sqlite:///"), timeout=60)
        with target:
            for sql in TAMPER:
                target.execute(sql)
        target.close()
    elif target_url.startswith("delta:"):
        from pyspark.sql import SparkSession

        from sluice.sync.targets.delta import delta_root

        spark = SparkSession.builder.getOrCreate()
        for sql in TAMPER:  # each table is a Delta table under the root
            spark.sql(re.sub(r"^(UPDATE|DELETE FROM|INSERT INTO) (\w+)",
                             lambda m: f"{m[1]} delta.`{delta_root(target_url)}/{m[2]}`", sql))  # fmt: skip
    elif target_url.startswith("mysql"):
        mariadb.execute(*(sql.replace('"', "`") for sql in TAMPER), database=target_url.rsplit("/", 1)[1])
    else:
        import psycopg

        with psycopg.connect(target_url) as conn:
            for sql in TAMPER:
                conn.execute(sql)
    mariadb.execute("SET SESSION sql_log_bin = 0", "INSERT INTO items VALUES (5000, 1, 2.5, NULL, 'g')",
                    database=db)  # fmt: skip


FOUND = [
    "verify table=items rows=2001 missing=2 extra=1 different=1",
    '  missing items {"id": 2}',
    '  missing items {"id": 5000}',
    '  extra items {"id": 99999}',
    '  different items {"id": 1}',
    "verify table=parts rows=200 missing=0 extra=0 different=1",
    '  different parts {"line": 4, "sku": "s03"}',
]


def target_counts(url: str) -> tuple[int, int]:
    """Rows of items and of parts (the target's `stock`, by the task's mapping)."""
    with open_target(url) as t:
        return len(t.read_rows("items")), len(t.read_rows("stock"))


@pytest.mark.parametrize(
    "kind", ["sqlite", "postgresql", "mysql", pytest.param("delta", marks=pytest.mark.slow)]
)
def test_verify_and_repair_in_key_ranges_while_the_source_changes(
    mariadb: LocalMariaDB,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    spark: Any,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """The verify job in this process's Spark against a capture applied by the test (the status
    callable applies the log to the target and reports the capture's position, as a task's
    status does). Only the rows changed behind the pipeline's back are reported, not those the
    writer keeps changing (seen reported with the re-check after the pipeline passed the
    position turned off), and a repair re-snapshots exactly those keys (the stray target row
    stayed with delete_absent off: seen)."""
    cluster = make_cluster(1)
    db = f"vfq{kind[0]}"
    vfy_database(mariadb, db)
    create_topic(cluster.bootstrap, f"{db}.changes", 2, 1)
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'target.db'}"
    elif kind == "delta":
        url = f"delta://{tmp_path / 'lake'}"
    else:
        url = str(request.getfixturevalue("mysql_url" if kind == "mysql" else "postgres_url"))
    spec = parse_spec(yaml.safe_load(TASK.format(db=db, port=mariadb.port, target=url)))
    requests = Requests()
    cap = MySqlCapture(spec.source, spec.tables, spec.topic_for, cluster.bootstrap, name=db,
                       snapshot_requests=requests, snapshot_done=requests.done)  # fmt: skip
    target = open_target(spec.target, ColumnMapping.from_config(spec.mapping))
    epoch = target.claim(db)

    def status() -> dict[str, Any]:
        """Everything in the log applied, and the status a running task would then publish."""
        position = cap.stats.position
        target.apply(db, epoch, read_all(cluster.bootstrap, f"{db}.changes", partitions=2))
        applied = {f"{t}[{p}]": o for (t, p), o in target.applied_offsets(db).items()}
        return {"captured_position": position, "applied_offsets": applied, "updated": time.time()}

    def ends() -> dict[str, int]:
        return log_ends(cluster.bootstrap, [f"{db}.changes"])

    def ask(table: str, keys: list[dict[str, Any]]) -> str:
        request = new_request(table, keys=keys, delete_absent=True)
        requests.pending.append(request)
        return str(request["id"])

    writer = Writer(mariadb, db)
    try:
        with running(cap):
            wait_until(lambda: status() and target_counts(url) == (2000, 200), 60, "the snapshot applied")
            writer.start()
            tamper(mariadb, db, url)
            found = verify(spark, spec, chunk_rows=300, status=status, ends=ends, wait_s=30)
            assert report_lines(found) == FOUND
            assert not found.ok and found.waited
            fixed = repair(spec, found, request=ask, pending=lambda: [r["id"] for r in requests()],
                           status=status, ends=ends, wait_s=60)  # fmt: skip
            assert fixed.repaired == 5 and fixed.ok, report_lines(fixed)
            writer.stop.set()
            writer.join(10)
            again = verify(spark, spec, chunk_rows=300, status=status, ends=ends, wait_s=30)
            assert again.ok and [t.rows for t in again.tables] == [2001, 200], report_lines(again)
    finally:
        writer.stop.set()
        target.close()


@pytest.mark.slow
def test_verify_finds_rows_changed_behind_the_pipelines_back_and_repair_fixes_them(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """`sluice task verify` and `--repair` against a task run by a worker, while a writer updates
    other rows all along: exit 1 with the differences and their keys, then repaired=5 and
    verified=true, and a later verify finds the tables equal."""
    cluster = make_cluster(1)
    vfy_database(mariadb, "vfy")
    db = tmp_path / "target.db"
    url = f"sqlite:///{db}"
    zk, _store = create_task(
        TASK.format(db="vfy", port=mariadb.port, target=url), tmp_path, cluster.zookeeper
    )
    worker = start_worker("wv1", cluster.bootstrap, cluster.zookeeper, tmp_path)
    writer = Writer(mariadb, "vfy")

    def cli_verify(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sluice.cli", "task", "verify", "vfy", "--chunk-rows", "300",
             "--zookeeper", cluster.zookeeper, "-b", cluster.bootstrap, *extra],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    try:
        wait_until(lambda: target_counts(url) == (2000, 200), 180, "the task's snapshot applied")
        writer.start()
        tamper(mariadb, "vfy", url)

        found = cli_verify()
        assert found.returncode == 1, found.stdout + found.stderr
        assert found.stdout.splitlines() == [*FOUND, "verified=false"], found.stdout

        repaired = cli_verify("--repair")
        assert repaired.returncode == 0, repaired.stdout + repaired.stderr
        assert repaired.stdout.splitlines() == [*FOUND, "repaired=5", "verified=true"], repaired.stdout

        writer.stop.set()
        again = cli_verify("--table", "items")
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.splitlines() == [
            "verify table=items rows=2001 missing=0 extra=0 different=0",
            "verified=true",
        ], again.stdout
    finally:
        writer.stop.set()
        stop_worker(worker)
        zk.stop()

"""Workers sharing a MariaDB -> PostgreSQL task through kill -9 (twice) and a pause past the
session: at the end the target equals the source and the applied offsets never went back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from sluice.cluster.zkstore import ZkStore
from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources.mysql import BinlogPosition
from sluice.sync.targets import open_target
from sluice.sync.tasks import TaskStore
from sluice.sync.truth import Truth, compare
from tests.integration.test_pipeline import end_offsets
from tests.support.cluster import TestCluster, wait_until
from tests.support.mysql_source import KEYS, Writer, create_database, master_position, source_rows

TASK = """
id: shopw
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: shopw}}
tables: [customers, orders, line_items]
topic: "shopw.changes"
target: {target}
options: {{trigger: 1s, partitions: 3}}
"""


def start_worker(name: str, bootstrap: str, zk: str, workdir: Path) -> subprocess.Popen[bytes]:
    log = (workdir / f"{name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "sluice.ops.cli", "worker", "start", "--group", "g", "--name", name,
         "--session-timeout", "6", "-b", bootstrap, "--zookeeper", zk, "--dir", str(workdir)],
        stdout=log, stderr=log, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def test_two_workers_share_a_task_through_kills_and_a_pause(
    mariadb: LocalMariaDB, postgres_url: str, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    cluster = make_cluster(3)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    create_database(mariadb, "shopw")
    with psycopg.connect(postgres_url, autocommit=True) as pg:
        open_target(postgres_url).close()  # the _sluice_* tables
        pg.execute("CREATE TABLE audit_offsets (topic text, p int, old bigint, new bigint)")
        pg.execute(
            "CREATE FUNCTION audit_offsets() RETURNS trigger AS $$ BEGIN INSERT INTO audit_offsets "
            "VALUES (NEW.topic, NEW.partition, CASE WHEN TG_OP = 'UPDATE' THEN OLD.next_offset END, "
            "NEW.next_offset); RETURN NEW; END $$ "
            "LANGUAGE plpgsql"
        )
        pg.execute(
            "CREATE TRIGGER audit AFTER INSERT OR UPDATE ON _sluice_offsets "
            "FOR EACH ROW EXECUTE FUNCTION audit_offsets()"
        )
    spec = tmp_path / "task.yaml"
    spec.write_text(TASK.format(port=mariadb.port, target=postgres_url))
    created = subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", "task", "create", "--file", str(spec),
         "--zookeeper", zk_address],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr

    zk = ZkStore(zk_address)
    zk.start()
    store = TaskStore(zk.client)
    workers = {n: start_worker(n, bootstrap, zk_address, tmp_path) for n in ("wa", "wb")}
    writer = Writer(mariadb, "shopw", transactions=900)
    try:
        wait_until(
            lambda: (store.status("shopw") or {}).get("lag_records") is not None, 180, "the task to run"
        )
        writer.start()

        def owner() -> str:
            return str(
                wait_until(lambda: (store.status("shopw") or {}).get("worker"), 120, "a running execution")
            )

        # Kill -9 the worker running the task, twice (restarting it each time).
        for _ in range(2):
            victim = owner()
            epoch = store.epoch("shopw")
            workers[victim].kill()
            workers[victim].wait()
            wait_until(lambda e=epoch: store.epoch("shopw") > e, 120, "the task to move after kill -9")
            workers[victim] = start_worker(victim, bootstrap, zk_address, tmp_path)
            time.sleep(3)
        # Pause the owner past its session, then let it go on.
        victim = owner()
        epoch = store.epoch("shopw")
        os.kill(workers[victim].pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: store.epoch("shopw") > epoch, 120, "the task to move away from the paused worker"
            )
        finally:
            os.kill(workers[victim].pid, signal.SIGCONT)

        writer.join(300)
        assert writer.error is None, writer.error
        end = BinlogPosition.parse(master_position(mariadb))

        def caught_up() -> bool:
            status = store.status("shopw") or {}
            pos = status.get("captured_position")
            if not pos or BinlogPosition.parse(pos) < end:
                return False
            with open_target(postgres_url) as t:
                return t.applied_offsets("shopw") == end_offsets(bootstrap, "shopw.changes")

        wait_until(caught_up, 240, "the target to catch up with the source")
    finally:
        for proc in workers.values():
            proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        zk.stop()

    with open_target(postgres_url) as t:
        got = {table: t.read_rows(table) for table in KEYS}
    cmp = compare(Truth(tables=source_rows(mariadb, "shopw"), key_columns=KEYS), got)
    assert cmp.ok, cmp.summary()
    with psycopg.connect(postgres_url) as pg:
        backwards = pg.execute("SELECT * FROM audit_offsets WHERE new < old").fetchall()
        updates = pg.execute("SELECT count(*) FROM audit_offsets").fetchone()
        offsets = pg.execute("SELECT * FROM _sluice_offsets").fetchall()
        triggers = pg.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal").fetchall()
    assert backwards == [], f"applied offsets went backwards: {backwards}"
    assert updates is not None and updates[0] >= len(offsets) > 0, (offsets, triggers)

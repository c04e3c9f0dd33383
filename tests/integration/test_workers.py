"""Workers sharing a MariaDB -> PostgreSQL task through kill -9 (twice) and a pause past the
session: at the end the target equals the source and the applied offsets never went back."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sluice.cluster.zkstore import ZkStore
from sluice.ops import launcher
from sluice.ops.mariadb import LocalMariaDB
from sluice.sync.sources.mysql_base import BinlogPosition
from sluice.sync.targets import open_target
from sluice.sync.tasks import TaskStore
from sluice.sync.truth import Truth, compare
from tests.integration.test_pipeline import end_offsets
from tests.support.cluster import TestCluster, wait_until
from tests.support.mysql_source import KEYS, Writer, create_database, master_position, source_rows
from tests.support.processes import CommandTree
from tests.support.spark_faults import CONNECT_BACK_FAILED, ConnectBackFault

TASK = """
id: shopw
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: shopw}}
tables: [customers, orders, line_items]
topic: "shopw.changes"
target: {target}
options: {{trigger: 1s, partitions: 3}}
"""


def start_worker(
    name: str,
    bootstrap: str,
    zk: str,
    workdir: Path,
    env: dict[str, str] | None = None,
    client_config: Path | None = None,
    overrides: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """A worker process logging to workdir/NAME.log; `env` adds to its environment (the variables
    its tasks' secret references name). `client_config`: a worker.properties with Kafka's client
    keys (security on), the worker then in the default group its user's ACLs name. `overrides`:
    more worker settings (`secrets.dir` ...)."""
    log = (workdir / f"{name}.log").open("ab")
    config = ["--config", str(client_config)] if client_config is not None else ["--group", "g"]
    config += [arg for k, v in (overrides or {}).items() for arg in ("--override", f"{k}={v}")]
    return subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "worker", "start", *config, "--name", name,
         "--session-timeout", "6", "-b", bootstrap, "--zookeeper", zk, "--dir", str(workdir)],
        stdout=log, stderr=log, env={**os.environ, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


def worker_client_config(cluster: TestCluster, directory: Path) -> Path | None:
    """Security on: a worker.properties (owner-only) with the workers' own user's client keys and
    the cluster's ZooKeeper credential, as `cluster up` writes for its workers."""
    if cluster.cluster.security == "none":
        return None
    path = cluster.cluster.worker_security().write(directory / "worker-client.properties")
    with path.open("a") as f:
        f.writelines(f"{line}\n" for line in launcher.zookeeper_auth_lines(cluster.cluster))
    return path


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean stop), or, after a minute, kill -9 of it and of what it started (its Spark
    driver JVM and Python workers)."""
    CommandTree(proc).stop(60)


def create_task(
    definition: str, tmp_path: Path, zk_address: str, cluster: TestCluster | None = None
) -> tuple[ZkStore, TaskStore]:
    """`sluice task create --file` with this YAML; then a TaskStore to watch the task with (with
    `cluster`'s ZooKeeper credential, if it has one)."""
    auth = cluster.cluster.zk_auth() if cluster is not None else None
    env = dict(os.environ)
    if auth is not None:
        env["SLUICE_ZOOKEEPER_AUTH_FILE"] = str(Path(cluster.directory) / launcher.ZOOKEEPER_AUTH_FILE)
    spec = tmp_path / "task.yaml"
    spec.write_text(definition)
    created = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "task", "create", "--file", str(spec),
         "--zookeeper", zk_address],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    zk = ZkStore(zk_address, auth=auth)
    zk.start()
    return zk, TaskStore(zk.client)


@pytest.mark.parametrize(
    "security",
    # With security on the workers authenticate as their own user with only its ACLs (group
    # membership, capture producers, apply readers in Spark executors, status reads).
    ["none", "sasl_ssl"],
)
# A long fault run (about 4.5 minutes): the default suite keeps the zombie drill from the CLI
# (tests/integration/test_incidents.py), a worker whose Spark driver was killed, and a failing task.
@pytest.mark.slow
def test_two_workers_share_a_task_through_kills_and_a_pause(
    mariadb: LocalMariaDB,
    postgres_url: str,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    security: str,
) -> None:
    cluster = make_cluster(3, security=security)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    client_config = worker_client_config(cluster, tmp_path)
    client = cluster.client_security().confluent_config()
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
    zk, store = create_task(
        TASK.format(port=mariadb.port, target=postgres_url), tmp_path, zk_address, cluster
    )
    workers = {
        n: start_worker(n, bootstrap, zk_address, tmp_path, client_config=client_config) for n in ("wa", "wb")
    }
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
            workers[victim] = start_worker(
                victim, bootstrap, zk_address, tmp_path, client_config=client_config
            )
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
                return t.applied_offsets("shopw") == end_offsets(bootstrap, "shopw.changes", client=client)

        wait_until(caught_up, 240, "the target to catch up with the source")
    finally:
        trees = [CommandTree(proc) for proc in workers.values()]
        for proc in workers.values():
            proc.send_signal(signal.SIGTERM)  # side by side: each has a minute to stop
        for tree in trees:
            tree.stop(60)
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


LAG_TASK = """
id: lagt
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: lagt}}
tables: [items]
topic: "lagt.changes"
target: {target}
options: {{trigger: 500ms, partitions: 2, replication_factor: 1}}
"""


def task_status_cli(task_id: str, zk_address: str) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "task", "status", task_id, "--zookeeper", zk_address],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    fields = {}
    for line in out.stdout.splitlines():
        name, _, value = line.strip().partition(" ")
        fields[name] = value.strip()
    return fields


def test_task_status_reports_the_lag_the_test_measures(
    mariadb: LocalMariaDB, postgres_url: str, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """The apply is held still by a lock on the target table while the source changes K rows:
    `sluice task status` must report exactly the records the log holds beyond the target's
    applied offsets (K), and a lag in seconds matching the time since the first of them."""
    cluster = make_cluster(1)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    mariadb.execute("DROP DATABASE IF EXISTS lagt", "CREATE DATABASE lagt")
    mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, v INT NOT NULL)",
        "INSERT INTO items VALUES " + ", ".join(f"({i}, 0)" for i in range(1, 51)),
        database="lagt",
    )
    zk, store = create_task(LAG_TASK.format(port=mariadb.port, target=postgres_url), tmp_path, zk_address)
    worker = start_worker("wl", bootstrap, zk_address, tmp_path)
    topic = "lagt.changes"

    def applied() -> dict[tuple[str, int], int]:
        with psycopg.connect(postgres_url) as pg:
            rows = pg.execute("SELECT topic, partition, next_offset FROM _sluice_offsets").fetchall()
        return {(t, int(p)): int(o) for t, p, o in rows}

    def lag_now() -> int:
        ends, done = end_offsets(bootstrap, topic, 2), applied()
        return sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items())

    try:
        wait_until(lambda: (store.status("lagt") or {}).get("lag_records") == 0 and lag_now() == 0
                   and end_offsets(bootstrap, topic, 2) != {}, 180, "the snapshot to be applied")  # fmt: skip
        changes = 120
        with psycopg.connect(postgres_url) as lock:
            # Writers wait on this lock; readers (the status's offsets read) do not.
            lock.execute("LOCK TABLE items IN EXCLUSIVE MODE")
            before = applied()
            first_sent = time.time()
            for i in range(changes):
                mariadb.execute(f"UPDATE items SET v = v + 1 WHERE id = {i % 50 + 1}", database="lagt")
                if i == 0:
                    first_done = time.time()
            end = BinlogPosition.parse(master_position(mariadb))

            def captured() -> bool:
                pos = (store.status("lagt") or {}).get("captured_position")
                return bool(pos) and BinlogPosition.parse(pos) >= end and lag_now() == changes

            wait_until(captured, 60, "the capture to put every change into the log")
            measured = lag_now()
            logged = time.time()
            status = wait_until(
                lambda: (s := store.status("lagt") or {}) and s.get("updated", 0) > logged + 0.5 and s, 30,
                "a status published after the log was complete",
            )  # fmt: skip
            shown = task_status_cli("lagt", zk_address)
            assert measured == changes
            assert int(shown["lag_records"]) == status["lag_records"] == measured, shown
            # The oldest unapplied record is stamped with its binlog event time, whole seconds,
            # taken by the server between `first_sent` and `first_done` (a new connection and an
            # UPDATE: 0.3 s once on a loaded CI run, which a bound from `first_sent` alone failed).
            # The lag is measured against the status the CLI read: a worker republishes while the
            # CLI starts (4 s under a loaded CI run), so `status` above may be an older one.
            assert float(shown["updated"]) >= status["updated"], (shown, status)
            shortest_s = float(shown["updated"]) - first_done
            longest_s = float(shown["updated"]) - first_sent + 1.0
            lag_s = float(shown["lag_seconds"])  # rounded to 0.1 s
            assert shortest_s - 0.1 <= lag_s <= longest_s + 0.1, (shown, shortest_s, longest_s)
            assert applied() == before  # the apply was held still throughout
            lock.rollback()
        wait_until(lambda: lag_now() == 0 and (store.status("lagt") or {}).get("lag_records") == 0, 60,
                   "the apply to catch up once the lock is gone")  # fmt: skip
        assert task_status_cli("lagt", zk_address)["lag_records"] == "0"
    finally:
        stop_worker(worker)
        zk.stop()


ITEMS_TASK = """
id: {id}
source: {{kind: mariadb, host: 127.0.0.1, port: {port}, user: root, database: {db}}}
tables: [items]
topic: "{id}.changes"
target: {target}
options: {{trigger: 500ms, partitions: 1, replication_factor: 1}}
"""


def items_database(mariadb: LocalMariaDB, db: str) -> None:
    """A source database `db` with one table, items (id, v), holding rows 1 and 2."""
    mariadb.execute(f"DROP DATABASE IF EXISTS {db}", f"CREATE DATABASE {db}")
    mariadb.execute(
        "CREATE TABLE items (id INT PRIMARY KEY, v INT)",
        "INSERT INTO items VALUES (1, 1), (2, 2)",
        database=db,
    )


def items_in_target(url: str) -> dict[str, object]:
    with open_target(url) as t:
        return {k: r["v"] for k, r in t.read_rows("items").items()}


def items_in_source(mariadb: LocalMariaDB, db: str) -> dict[str, object]:
    return {f'{{"id":{i}}}': v for i, v in mariadb.execute("SELECT id, v FROM items", database=db)}


def test_a_failing_task_leaves_the_worker_running_and_a_task_created_again_commits(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """One worker, two tasks. `bad` has a target nobody listens on, with a password (a reference to
    the worker's environment): it fails to start, again and again (a task-failed alarm each time,
    the password nowhere), while `good` runs on the same worker. `bad` is then fixed with
    `sluice task update` and runs. `good` is restarted (epoch 2), deleted and created again: its
    new execution must take an epoch past the target's and commit (it used to start at epoch 1
    and be refused forever). Failing run before the fix: the worker process exited with the
    ConnectionError."""
    from sluice.ops.ports import free_port

    cluster = make_cluster(1)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    items_database(mariadb, "wf")
    good_url, fixed_url = f"sqlite:///{tmp_path / 'good.db'}", f"sqlite:///{tmp_path / 'fixed.db'}"
    bad_port = free_port()
    bad_target = (
        f"{{url: 'postgresql://sync@127.0.0.1:{bad_port}/nowhere', password: {{env: SLUICE_SECRET_WF_BAD}}}}"
    )
    good_yaml = ITEMS_TASK.format(id="good", port=mariadb.port, db="wf", target=good_url)
    zk, store = create_task(good_yaml, tmp_path, zk_address)
    create_task(
        ITEMS_TASK.format(id="bad", port=mariadb.port, db="wf", target=bad_target), tmp_path, zk_address
    )[0].stop()
    worker = start_worker("wf1", bootstrap, zk_address, tmp_path, env={"SLUICE_SECRET_WF_BAD": "hunter2"})

    rows = items_in_target

    def source() -> dict[str, object]:
        return items_in_source(mariadb, "wf")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sluice.cli", *args, "--zookeeper", zk_address],
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    try:
        wait_until(lambda: rows(good_url) == source(), 180, "the good task to apply the snapshot")
        failed = wait_until(
            lambda: (f := [a for a in store.alarms("bad") if a["kind"] == "task-failed"])[1:] and f, 120,
            "the bad task to fail twice",
        )  # fmt: skip
        assert worker.poll() is None, "the worker exited"
        assert all("hunter2" not in str(a) for a in store.alarms("bad")), failed
        # the URL as the definition gives it (no password in it), the password nowhere
        assert "cannot connect" in failed[0]["error"], failed[0]
        assert f"postgresql://sync@127.0.0.1:{bad_port}/nowhere" in failed[0]["error"], failed[0]
        assert failed[1]["attempts"] == 2 and failed[1]["retry_in_s"] > failed[0]["retry_in_s"] * 1.2

        fixed = tmp_path / "fixed.yaml"
        fixed.write_text(ITEMS_TASK.format(id="bad", port=mariadb.port, db="wf", target=fixed_url))
        assert cli("task", "update", "--file", str(fixed)).returncode == 0
        mariadb.execute("UPDATE items SET v = 20 WHERE id = 2", database="wf")
        wait_until(lambda: rows(fixed_url) == source() == rows(good_url), 120, "both tasks to apply")

        epoch = store.epoch("good")
        assert cli("task", "restart", "good").returncode == 0
        wait_until(lambda: (store.status("good") or {}).get("epoch", 0) > epoch, 60, "a restart of good")
        assert cli("task", "delete", "good").returncode == 0
        wait_until(lambda: store.status("good") is None, 60, "good to stop")
        spec = tmp_path / "good.yaml"
        spec.write_text(good_yaml)
        assert cli("task", "create", "--file", str(spec)).returncode == 0
        mariadb.execute("INSERT INTO items VALUES (3, 3)", database="wf")
        wait_until(lambda: rows(good_url) == source(), 120, "the task created again to commit")
        assert worker.poll() is None
    finally:
        stop_worker(worker)
        zk.stop()
    assert "hunter2" not in (tmp_path / "wf1.log").read_text()


def test_a_worker_whose_spark_driver_was_killed_runs_its_task_on_a_new_one(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """kill -9 of the worker's Spark driver JVM alone (as an out-of-memory kill would do it): the
    worker process lives on, the task's apply fails, and its retry runs on a new JVM, so the
    target catches up with the changes made after the kill.

    Failing run with the worker's session not replaced (a plain `spark_session()` at start):
    the retries failed for ever ("apply failed: [Errno 111] Connection refused", then
    "ConnectionRefusedError" at each start) and the wait for the target timed out."""
    from sluice.chaos.sync_faults import spark_driver_pid

    cluster = make_cluster(1)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    items_database(mariadb, "wdrv")
    url = f"sqlite:///{tmp_path / 'drv.db'}"
    task = ITEMS_TASK.format(id="drv", port=mariadb.port, db="wdrv", target=url)
    zk, store = create_task(task, tmp_path, zk_address)
    worker = start_worker("wd1", bootstrap, zk_address, tmp_path)

    def rows() -> dict[str, object]:
        return items_in_target(url)

    def source() -> dict[str, object]:
        return items_in_source(mariadb, "wdrv")

    try:
        wait_until(lambda: rows() == source(), 180, "the snapshot to be applied")
        jvm = spark_driver_pid(worker.pid)
        assert jvm is not None, "no Spark driver JVM under the worker"
        os.kill(jvm, signal.SIGKILL)
        mariadb.execute(
            "UPDATE items SET v = 20 WHERE id = 2", "INSERT INTO items VALUES (3, 3)", database="wdrv"
        )
        wait_until(lambda: rows() == source(), 180, "the task to apply the changes made after the kill")
        assert worker.poll() is None, "the worker exited"
        assert spark_driver_pid(worker.pid) not in (None, jvm)
        assert [a["kind"] for a in store.alarms("drv")].count("task-failed") >= 1
    finally:
        stop_worker(worker)
        zk.stop()
    assert "event=spark_driver_lost" in (tmp_path / "wd1.log").read_text()


def task_failures_shown(task_id: str, zk_address: str) -> tuple[list[tuple[int, float]], str]:
    """`sluice task status`'s failures in a row: (attempt, seconds before its retry) of each,
    and the whole output."""
    out = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "task", "status", task_id, "--zookeeper", zk_address],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.strip().startswith("failures ")] or [""]
    shown = re.findall(r"(\d+) \(retried after ([\d.]+) s\)", line)
    return [(int(n), float(d)) for n, d in shown], out.stdout


@pytest.mark.timeout(420)  # a worker's first start took 60 s under load 14 (other suites beside it)
def test_a_task_whose_spark_python_worker_does_not_connect_back_is_retried_counting_up(
    mariadb: LocalMariaDB, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """Issue 32: under CPU starvation the apply query's Python source runner did not connect back
    within Spark's fixed 10 s; the task failed and was retried every second as `attempts=1`, on a
    machine its retries kept loaded. Here the first three runners the worker's Spark starts do not
    connect back (tests/support/spark_faults.py): `sluice task status` shows the task-failed
    failures in a row counting up, 1, 2, 3, each retry waiting about twice as long as the one
    before; the fourth start runs, and the target ends equal to the source.

    Failing run with the worker's old count (reset by every start that succeeded): attempts
    [1, 1, 1], each retry_in_s under 1 s."""
    cluster = make_cluster(1)
    bootstrap, zk_address = cluster.bootstrap, cluster.zookeeper
    items_database(mariadb, "wcb")
    url = f"sqlite:///{tmp_path / 'cb.db'}"
    zk, _ = create_task(
        ITEMS_TASK.format(id="cb", port=mariadb.port, db="wcb", target=url), tmp_path, zk_address
    )
    # Hanging up at once, not after Spark's 10 s: the same failure, 30 s sooner.
    fault = ConnectBackFault.arm(tmp_path / "fault", times=3, hang_up=True)
    worker = start_worker("wcb1", bootstrap, zk_address, tmp_path, env=fault.env())
    try:
        mariadb.execute(
            "UPDATE items SET v = 20 WHERE id = 2", "INSERT INTO items VALUES (3, 3)", database="wcb"
        )
        wait_until(lambda: items_in_target(url) == items_in_source(mariadb, "wcb"), 360,
                   "the task to apply the source once its runners connect back")  # fmt: skip
        assert worker.poll() is None, "the worker exited"
        shown, status = task_failures_shown("cb", zk_address)
    finally:
        stop_worker(worker)
        zk.stop()
    assert fault.injected() == 3
    # A loaded machine may add failures of its own (the same one, after Spark's 10 s): they count on.
    assert [n for n, _ in shown][:3] == [1, 2, 3] and [n for n, _ in shown] == list(range(1, len(shown) + 1))
    assert all(later >= 1.5 * earlier for (_, earlier), (_, later) in itertools.pairwise(shown[:3])), status
    assert CONNECT_BACK_FAILED in status, status

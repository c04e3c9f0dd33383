"""`sluice apply --spark-master spark://...` on a Spark standalone cluster whose worker is killed
with kill -9 in the middle of the run (issue 15, acceptance 3).

A master and one worker (1 core, 1g) are started with pyspark's own `spark-class`
(`sluice.ops.spark_standalone`); the topic is filled by the generator before the query starts,
and `sluice apply` runs as a subprocess, as an operator would run it, with small batches so the
run takes many of them. Once the target holds at least one batch and not yet the whole log, the
worker's process group (the worker JVM and the executor JVM it launched) is killed with SIGKILL;
a new worker, with a new work directory, is started a few seconds later. The driver lives on,
its executor lost; the master gives the application an executor on the new worker and the query
goes on. The target must then hold the whole log (its offsets equal the log's end) and equal the
generator's ground truth, with no row version written twice and no offset going back: the same
checks as the pipeline tests' (`tests/integration/test_pipeline.py`).

The test also checks what running on a standalone cluster needs: the driver lost its executor
("Lost executor 0" in its log) and the new worker ran one for it; that executor was told to
reach the driver on a loopback name (the session binds the driver to 127.0.0.1 for a loopback
master: before, the driver advertised this machine's non-loopback address); its Python workers
run the driver's interpreter, though the daemons' environment holds no PYSPARK_* setting; the
killed executor's Python workers exit by themselves. About 50 s here on two loaded cores, most
of it the driver JVM's start (15-25 s) and the new executor's.

With a PostgreSQL target (`test_two_workers_staging_into_postgresql_survive_kill_9_of_one_mid_batch`)
the executors stage each batch's rows in the target and the driver commits them
(sync/targets/staging.py). The cluster has two workers from the start. The kill lands in the
middle of a batch by construction, not by polling for a short-lived state (polling once caught
the rows and then, a moment later, found them merged and gone): `stall_after_staging` locks the
staging table until a task's COPY waits for it, stops (SIGSTOP) the executor JVM of the worker
whose Python worker runs that COPY, and releases the lock. The task's rows are then committed in
the staging table while its result can never reach the driver; that worker is killed with
SIGKILL, the batch runs again on the other worker under new tokens and commits. The target must
equal the truth, its offsets never go back, the stopped task's staged rows are gone once a later
batch has committed, and no staging is left after the stop. Able to fail: with the emptying
after a commit off (`StagingTarget.apply_staged` not calling `_staging_ddl`), it fails "timed
out ... waiting for the stopped task's staged rows to go". That the stopped task's token is never
merged is shown by tests/integration/test_staging.py, where a merged token changes the result;
here its rows equal the rerun's.

Able to fail: with no new worker (`test_without_a_new_worker_the_target_never_catches_up`, slow
suite) the same run fails its check, "timed out ... waiting for the target to reach the end of
the log". Observed: the kill came after the first batch (1,998 of 20,000 records applied); the
master logged "App ... requires more resource than any of Workers could have" and the driver
waited, neither failing the query nor committing anything: 48 s later the target still held
1,998 records.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluice.ops.mariadb import LocalMariaDB
from sluice.ops.spark_standalone import SparkDaemon, StandaloneSpark, pids_in
from sluice.pipeline.session import loopback_master
from sluice.sync.sources.generator import GeneratorConfig, run_generator
from sluice.sync.targets import open_target
from sluice.sync.truth import Truth, compare
from tests.integration.test_pipeline import (
    audited_postgres,
    audited_target,
    create_topic,
    end_offsets,
)
from tests.support.cluster import TestCluster, wait_until
from tests.support.staging import staged, staged_tokens

TOPIC = "standalone.changes"
PIPELINE = "standalone"
EVENTS = 20_000
PER_TRIGGER = 2_000  # ten batches at least: the kill lands well before the end


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneSpark]:
    spark = StandaloneSpark(tmp_path / "spark")
    try:
        yield spark
    finally:
        spark.stop()


def start_apply(
    bootstrap: str, url: str, master: str, tmp_path: Path, env_extra: dict[str, str]
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(env_extra)
    with (tmp_path / "apply.log").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "apply", "-b", bootstrap, "--topics", TOPIC,
             "--target", url, "--pipeline", PIPELINE, "--checkpoint", str(tmp_path / "checkpoint"),
             "--trigger", "500ms", "--max-records-per-trigger", str(PER_TRIGGER), "--spark-master", master],
            stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp_path, start_new_session=True,
        )  # fmt: skip


def stop_apply(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the driver JVM, if it outlived the CLI
    proc.wait(timeout=10)


def applied(url: str) -> dict[tuple[str, int], int]:
    with open_target(url) as t:
        return dict(t.applied_offsets(PIPELINE))


def worker_processes(worker: SparkDaemon, arg: bytes) -> dict[int, list[str]]:
    """The processes running in a worker's executors (their working directory is under the
    worker's) with `arg` among their arguments: pid to command line."""
    assert worker.work_dir is not None
    found = {}
    for pid in pids_in(worker.work_dir):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if arg in cmd:
                found[pid] = [c.decode() for c in cmd if c]
    return found


def python_workers(worker: SparkDaemon) -> list[list[str]]:
    """The command lines of the Python processes running in a worker's executors."""
    return list(worker_processes(worker, b"pyspark.daemon").values())


def socket_owner(client_port: int, candidates: list[int]) -> int | None:
    """Which of the `candidates` pids holds the TCP socket whose local port is `client_port`
    (a PostgreSQL backend's `client_port`), from /proc/net/tcp and each process's fds."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == client_port:
            inodes.add(f"socket:[{fields[9]}]")
    for pid in candidates:
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return pid
    return None


def executor_jvm(worker: SparkDaemon) -> int:
    jvms = worker_processes(worker, b"org.apache.spark.executor.CoarseGrainedExecutorBackend")
    assert jvms, f"{worker.name} runs no executor"
    return next(iter(jvms))


def stall_after_staging(
    url: str, workers: list[SparkDaemon], timeout_s: float = 60
) -> tuple[SparkDaemon, set[int], dict[tuple[str, int], int]]:
    """Hold a batch between an executor's staging and the driver's commit, deterministically.

    The test locks the staging table until a task's COPY waits for it, finds the worker whose
    Python worker holds that COPY's connection, stops (SIGSTOP) that worker's executor JVM and
    lets the COPY go on: the task's rows are committed in the staging table, but its result
    cannot reach the driver, so the batch stays uncommitted. Returns the worker, the tokens
    staged at that moment (the stopped task's among them) and the target's offsets when the
    task was stopped (tries that caught the driver's commit instead let batches commit)."""
    table = wait_until(lambda: next(iter(staged(url)), None), timeout_s, "the execution's staging table")
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as watch:
        caught = None
        while caught is None:
            assert time.monotonic() < deadline, "no task's COPY was caught waiting for the staging table"
            caught = _stop_a_waiting_copy(url, table, watch, workers)
        backend, victim = caught
        at_stop = applied(url)  # the batches before the stopped task's, all committed
        idle = "SELECT state = 'idle' FROM pg_stat_activity WHERE pid = %s"
        wait_until(
            lambda: watch.execute(idle, (backend,)).fetchone()[0], 30, "the stopped task's COPY to commit"
        )
    return victim, staged_tokens(url), at_stop


def _stop_a_waiting_copy(
    url: str, table: str, watch: psycopg.Connection[Any], workers: list[SparkDaemon]
) -> tuple[int, SparkDaemon] | None:
    """One try of `stall_after_staging`: lock the table; if a task's COPY comes to wait for it,
    SIGSTOP its executor JVM and release the lock (returns the COPY's backend pid and the
    worker); if the driver's commit or cleanup waits instead, let it through (returns None)."""
    with psycopg.connect(url) as lock:
        lock.execute("SET lock_timeout = '5s'")
        try:
            lock.execute(f'LOCK TABLE "{table}" IN ACCESS EXCLUSIVE MODE')
        except psycopg.errors.LockNotAvailable:
            return None  # a commit held it for long: try again
        blocked = "SELECT pid, client_port, query FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
        waiter = None
        for _ in range(100):  # the next batch's COPY, or the driver's commit of this one
            waiter = watch.execute(blocked, (lock.info.backend_pid,)).fetchone()
            if waiter is not None:
                break
            time.sleep(0.02)
        if waiter is None or not waiter[2].lstrip().upper().startswith("COPY"):
            lock.rollback()
            time.sleep(0.05)
            return None
        backend, port, _ = waiter
        owners = {w.name: socket_owner(port, pids_in(w.work_dir)) for w in workers if w.work_dir}
        victim = next((w for w in workers if owners.get(w.name)), None)
        assert victim is not None, f"no worker's process holds the COPY's connection (port {port})"
        os.kill(executor_jvm(victim), signal.SIGSTOP)
    return backend, victim  # the block's end committed: the COPY took the lock


def run_with_worker_killed(
    standalone: StandaloneSpark,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
    *,
    new_worker: bool,
    catch_up_s: float,
    seen: dict[str, int] | None = None,
    postgres_url: str | None = None,
) -> None:
    """The scenario of the module docstring; `new_worker=False` leaves the cluster without one.

    With `postgres_url` the target is PostgreSQL, where the executors stage each batch's rows
    for the driver to commit: the cluster has two workers from the start, the one running a
    task whose rows are staged is killed before the batch commits (`stall_after_staging`), and
    the other carries the query on."""
    t0 = time.monotonic()
    stages = postgres_url is not None
    with ThreadPoolExecutor(1) as pool:  # the Spark daemons start while the brokers do

        def daemons() -> tuple[str, SparkDaemon, SparkDaemon | None]:
            master = standalone.start_master()
            return master, standalone.start_worker(), standalone.start_worker() if stages else None

        spark_up = pool.submit(daemons)
        cluster = make_cluster(1)
        bootstrap = cluster.bootstrap
        create_topic(bootstrap, TOPIC, partitions=3, rf=1)
        truth_path = tmp_path / "truth.json"
        stats, _ = run_generator(
            bootstrap, GeneratorConfig(topic=TOPIC, rate=0, duration_s=None, max_events=EVENTS, seed=15),
            truth_path=truth_path,
        )  # fmt: skip
        ends = end_offsets(bootstrap, TOPIC)
        url = audited_postgres(postgres_url) if postgres_url else audited_target(tmp_path / "target.db")
        master, first, second = spark_up.result()
    print(f"setup_s={time.monotonic() - t0:.1f}")

    proc = start_apply(bootstrap, url, master, tmp_path, standalone.driver_env())
    log = tmp_path / "apply.log"
    try:
        wait_until(lambda: applied(url) or proc.poll() is not None, 120, "a first committed batch", 0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        print(f"first_batch_s={time.monotonic() - t0:.1f}")
        victim, survivor = first, second
        stalled: set[int] = set()
        if stages:  # in the middle of a batch: a task's rows staged, the batch not committed
            assert second is not None
            victim, stalled, at_stop = stall_after_staging(url, [first, second])
            survivor = second if victim is first else first
            held = staged(url)
            assert any(held.values()) and stalled, held
            assert applied(url) == at_stop, "the batch whose task is stopped was committed"
        standalone.kill_worker(victim)
        at_kill = sum(applied(url).values())
        if seen is not None:
            seen["at_kill"] = at_kill
        print(f"killed={victim.name} at={at_kill}/{EVENTS} s={time.monotonic() - t0:.1f}")
        assert 0 < at_kill < EVENTS, "the kill did not land in the middle of the run"
        assert victim.work_dir is not None
        wait_until(lambda: not pids_in(victim.work_dir), 30, "the killed executor's Python workers to exit")
        if stages:
            print(f"staged_at_kill={held} tokens={len(stalled)}")
            # the batch runs again on the other worker and commits; the stopped task's rows, under
            # a token no summary names, go with the table's emptying after that commit
            wait_until(lambda: sum(applied(url).values()) > at_kill, 60, "a commit after the kill", 0.1)
            wait_until(
                lambda: not stalled & staged_tokens(url), 30, "the stopped task's staged rows to go", 0.1
            )
        else:
            time.sleep(3)  # the application runs without an executor for a while
            if new_worker:
                survivor = standalone.start_worker()
        wait_until(lambda: applied(url) == ends, catch_up_s, "the target to reach the end of the log", 0.5)
        print(f"caught_up_s={time.monotonic() - t0:.1f}")
        assert proc.poll() is None, "the driver died: " + log.read_text()[-3000:]
        assert survivor is not None
        interpreters = {cmd[0] for cmd in python_workers(survivor)}
    finally:
        stop_apply(proc)
    # SIGTERM stops it cleanly (it used to stop the query from the signal handler, inside a py4j
    # call: "reentrant call" errors and a JVM stack trace)
    tail = log.read_text(errors="replace")[-4000:]
    assert tail.rstrip().endswith("stopped") and "Traceback" not in tail, tail

    # The driver lost its executor with the worker, and went on with one on the other worker,
    # which it reached on the loopback address; that executor's Python is the driver's.
    assert re.search(r"Lost executor \d+", log.read_text()), log.read_text()[-3000:]
    assert survivor.work_dir is not None
    launched = " ".join(p.read_text(errors="replace") for p in survivor.work_dir.glob("app-*/*/stderr"))
    driver_url = re.search(r'"--driver-url" "spark://CoarseGrainedScheduler@([^:"]+):', launched)
    assert driver_url is not None and driver_url[1] in ("localhost", "127.0.0.1"), launched[:3000]
    # the same venv's interpreter however its path is spelled (pip writes `python` or `python3.11`
    # into the launchers' shebangs, as it was run)
    here = Path(sys.executable)
    assert {(Path(c).parent, Path(c).resolve()) for c in interpreters} == {(here.parent, here.resolve())}, (
        interpreters
    )

    truth = Truth.load(truth_path)
    assert truth.events == stats.events == EVENTS
    with open_target(url) as t:
        cmp = compare(truth, {name: t.read_rows(name) for name in truth.tables})
    assert cmp.ok, cmp.summary()
    if stages:
        # Every batch's staged rows went with its commit, the killed batch's too (its orphaned
        # rows were never merged: the target equals the truth), and the table with the clean
        # stop; offsets never went back.
        assert staged(url) == {}
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT * FROM audit_offsets WHERE new < old").fetchall() == []
            assert conn.execute("SELECT count(*) FROM audit_offsets").fetchone()[0] > 0
        return
    db = sqlite3.connect(tmp_path / "target.db")
    try:
        twice = db.execute(
            "SELECT tbl, key, pos, count(*) FROM audit_writes GROUP BY tbl, key, pos "
            "HAVING count(*) > 1 LIMIT 5"
        ).fetchall()
        assert twice == [], f"row versions written more than once: {twice}"
        backwards = db.execute("SELECT * FROM audit_offsets WHERE new < old").fetchall()
        assert backwards == [], f"applied offsets went backwards: {backwards}"
    finally:
        db.close()


# The default suite keeps the same kill -9 of a worker with executors staging into PostgreSQL.
@pytest.mark.slow
def test_apply_on_a_standalone_cluster_survives_kill_9_of_its_worker(
    standalone: StandaloneSpark, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    run_with_worker_killed(standalone, make_cluster, tmp_path, new_worker=True, catch_up_s=120)


def test_two_workers_staging_into_postgresql_survive_kill_9_of_one_mid_batch(
    standalone: StandaloneSpark, make_cluster: Callable[..., TestCluster], tmp_path: Path, postgres_url: str
) -> None:
    run_with_worker_killed(
        standalone, make_cluster, tmp_path, new_worker=False, catch_up_s=120, postgres_url=postgres_url
    )


@pytest.mark.slow
def test_without_a_new_worker_the_target_never_catches_up(
    standalone: StandaloneSpark, make_cluster: Callable[..., TestCluster], tmp_path: Path
) -> None:
    """The test above, able to fail: with no worker started after the kill it does."""
    seen: dict[str, int] = {}
    with pytest.raises(AssertionError, match="the target to reach the end of the log"):
        run_with_worker_killed(standalone, make_cluster, tmp_path, new_worker=False, catch_up_s=45, seen=seen)
    left = sum(applied(f"sqlite:///{tmp_path / 'target.db'}").values())
    print(f"at_kill={seen['at_kill']} left_at={left} of {EVENTS}")
    assert left <= seen["at_kill"] + PER_TRIGGER  # at most the batch in flight at the kill


@pytest.mark.parametrize(
    ("master", "loopback"),
    [
        ("spark://127.0.0.1:7077", True),
        ("spark://localhost:7077", True),
        ("spark://[::1]:7077", True),
        ("spark://127.0.0.1:7077,127.0.0.1:7078", True),
        ("spark://127.0.0.1:7077,10.0.0.2:7077", False),
        ("spark://10.0.0.2:7077", False),
        ("spark://spark-master:7077", False),
        ("local[*]", False),
    ],
)
def test_the_driver_binds_loopback_only_for_a_loopback_master(master: str, loopback: bool) -> None:
    assert loopback_master(master) is loopback


def test_a_tasks_spark_master_option_runs_it_on_the_standalone_cluster(
    standalone: StandaloneSpark,
    mariadb: LocalMariaDB,
    make_cluster: Callable[..., TestCluster],
    tmp_path: Path,
) -> None:
    """A worker started without --spark-master runs a task whose options name the standalone
    master on that master (the option used to be accepted and ignored: the task ran on
    local[*] and the master never saw an application)."""
    from tests.integration.test_workers import (
        ITEMS_TASK,
        create_task,
        items_database,
        items_in_source,
        items_in_target,
        stop_worker,
    )

    master = standalone.start_master()
    standalone.start_worker()
    cluster = make_cluster(1)
    items_database(mariadb, "sm")
    url = f"sqlite:///{tmp_path / 'sm.db'}"
    task = ITEMS_TASK.format(id="sm", port=mariadb.port, db="sm", target=url).replace(
        "replication_factor: 1}", f"replication_factor: 1, spark_master: '{master}'}}"
    )
    assert f"spark_master: '{master}'" in task
    zk, _ = create_task(task, tmp_path, cluster.zookeeper)
    with (tmp_path / "sm-worker.log").open("ab") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "sluice.cli", "worker", "start", "--group", "sm", "--name", "sm1",
             "--session-timeout", "6", "-b", cluster.bootstrap, "--zookeeper", cluster.zookeeper,
             "--dir", str(tmp_path)],
            stdout=log, stderr=log, env={**os.environ, **standalone.driver_env(), "COLUMNS": "200"},
        )  # fmt: skip
    try:
        wait_until(lambda: items_in_target(url) == items_in_source(mariadb, "sm"), 180, "the task's snapshot")
        mariadb.execute("INSERT INTO items VALUES (3, 3)", database="sm")
        wait_until(lambda: items_in_target(url) == items_in_source(mariadb, "sm"), 120, "a change after it")
        apps = standalone.state().get("activeapps", [])
        assert [a["name"] for a in apps] == ["sluice-worker sm1"], apps
    finally:
        stop_worker(worker)
        zk.stop()

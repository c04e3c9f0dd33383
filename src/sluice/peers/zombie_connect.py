"""Incident D on the peer stack (``sluice incident run zombie-task --against connect``, issue 36):
a Kafka Connect worker running Debezium's JDBC sink task is stopped past its group session, the
task moves to the second worker, newer changes are applied, and the first worker resumes.

Real pieces throughout: a private MariaDB with a row binlog (reporting 8.0.2-MariaDB-<version>,
which Debezium's MySQL connector needs; see bench/capture.py), a Kafka 3.9.1 cluster of 3 brokers
(`sluice.peers.kafka`), two Connect workers in one group (`sluice.peers.connect`) running
Debezium's MySQL connector and its JDBC sink connector (one task, upsert on the key, deletes on)
into a private PostgreSQL. The pause is a real SIGSTOP of the whole JVM, as a long GC pause
stops it, sent while the sink is busy: a workload keeps updating a small set of hot rows (each
UPDATE raises the row's ``version``), so the sink task is writing batches all the time.

Connect's default ``scheduled.rebalance.max.delay.ms`` (5 minutes) keeps a departed worker's
tasks unassigned that long; the drill's workers wait ``REBALANCE_DELAY_MS`` instead (a setting
users lower for the same reason), so the task moves within the drill. Nothing else of Connect's
or the sink's behaviour is changed.

Steps: the snapshot is applied; the workload starts; the worker running the sink task is
stopped; the drill waits until the other worker runs the task and the target has moved past
the versions it held at the stop; the workload stops and the target catches up; the stopped
worker resumes and is given ``AFTER_RESUME_S`` to do whatever it still does; then every row of
the target is compared with the source. What the target holds is reported as observed: a row
whose version is older than the source's is a stale overwrite (the zombie's write landing after
a newer one), listed with both versions. The drill runs ``attempts`` times (a stop lands
mid-batch or between batches by chance); the verdict counts what any attempt saw.
"""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.chaos.zombie import DrillStepError, _stopped, _wait
from sluice.ops.mariadb import LocalMariaDB, _binary
from sluice.ops.postgres import LocalPostgres
from sluice.peers.connect import (
    ConnectWorker,
    debezium_jdbc_sink_config,
    debezium_mysql_config,
    jdbc_sink_home,
    schema_converters,
)
from sluice.peers.kafka import peer_down, peer_up

log = logging.getLogger("sluice.peers.zombie_connect")

AGAINST = "connect"
DB = "zombie"
HOT_ROWS = 20
REBALANCE_DELAY_MS = 5000
SESSION_MS = 10000  # Connect's default session.timeout.ms, stated
AFTER_RESUME_S = 30.0
STEP_TIMEOUT_S = 180.0
SOURCE, SINK, PREFIX = "zombie-source", "zombie-sink", "zc"


@dataclass
class Attempt:
    number: int
    stopped_worker: int = -1
    moved_to: int = -1
    stale: list[tuple[int, int, int]] = field(default_factory=list)  # (id, source, target version)
    missing: int = 0
    extra: int = 0
    different: int = 0
    timeline: list[str] = field(default_factory=list)
    error: str | None = None


class _Workload:
    """UPDATEs of random hot rows (version + 1) in transactions of 5, as fast as the source takes
    them (with a short sleep), until stopped."""

    def __init__(self, db: LocalMariaDB, seed: int) -> None:
        self.db = db
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.transactions = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="zombie-workload", daemon=True)

    def _run(self) -> None:
        import pymysql

        try:
            conn = pymysql.connect(**self.db.connect_args(DB), autocommit=False)
            with conn.cursor() as cur:
                while not self.stop.is_set():
                    for key in self.rng.sample(range(1, HOT_ROWS + 1), 5):
                        cur.execute(
                            "UPDATE accounts SET version = version + 1, note = CONCAT('v', version + 1) "
                            "WHERE id = %s",
                            (key,),
                        )
                    conn.commit()
                    self.transactions += 1
                    time.sleep(0.005)
            conn.close()
        except BaseException as exc:  # the drill reports it
            self.error = exc


def _source_versions(db: LocalMariaDB) -> dict[int, int]:
    return {int(r[0]): int(r[1]) for r in db.execute("SELECT id, version FROM accounts", database=DB)}  # type: ignore[call-overload]


def _target_versions(url: str) -> dict[int, int]:
    import psycopg

    with psycopg.connect(url, connect_timeout=5) as conn:
        return {int(r[0]): int(r[1]) for r in conn.execute("SELECT id, version FROM accounts").fetchall()}


def _sink_worker(workers: list[ConnectWorker]) -> int | None:
    """The index of the worker its REST API says runs the sink's task, if one does."""
    ports = [w.port for w in workers]
    for w in workers:
        if not w.running():
            continue
        try:
            status = w.status(SINK)
        except Exception:
            continue
        for t in status.get("tasks", []):
            port = int(str(t.get("worker_id", ":0")).rsplit(":", 1)[1])
            if t.get("state") == "RUNNING" and port in ports:
                return ports.index(port)
    return None


def run_attempt(
    number: int, directory: Path, db: LocalMariaDB, pg: LocalPostgres, seed: int, out: Any = print
) -> Attempt:
    attempt = Attempt(number)
    t0 = time.monotonic()

    def say(text: str) -> None:
        line = f"{time.monotonic() - t0:6.1f}s {text}"
        attempt.timeline.append(line)
        out(f"attempt {number}: {line}")

    target_db = f"zombie_{number}"
    db.execute(f"DROP DATABASE IF EXISTS `{DB}`", f"CREATE DATABASE `{DB}`")
    db.execute(
        "CREATE TABLE accounts (id INT PRIMARY KEY, version INT NOT NULL, note VARCHAR(40))",
        "INSERT INTO accounts SELECT seq, 1, 'v1' FROM seq_1_to_" + str(HOT_ROWS),
        database=DB,
    )
    url = pg.create_database(target_db)
    with ExitStack() as stack:
        peer = peer_up(directory / "kafka", 3)
        stack.callback(peer_down, Path(peer.directory))
        extra = {"scheduled.rebalance.max.delay.ms": str(REBALANCE_DELAY_MS)}
        workers = [
            ConnectWorker(directory / f"connect-{i + 1}", peer.bootstrap_servers, extra=extra) for i in (0, 1)
        ]
        for w in workers:
            stack.callback(_stop_worker, w)
            w.start()
        say(f"Kafka {peer.version} (3 brokers) and two Connect workers up (REST ports {workers[0].port}, "
            f"{workers[1].port}; scheduled.rebalance.max.delay.ms={REBALANCE_DELAY_MS})")  # fmt: skip
        source = debezium_mysql_config(
            host="127.0.0.1", port=db.port, user="root", password="", database=DB, server_id=6100 + number,
            topic_prefix=PREFIX, bootstrap=peer.bootstrap_servers, history_topic=f"{PREFIX}.history",
            tables=["accounts"],
        )  # fmt: skip
        source.update(schema_converters())
        sink = debezium_jdbc_sink_config(
            url=f"jdbc:postgresql://127.0.0.1:{pg.port}/{target_db}", user="postgres", password="",
            topics_regex=rf"{PREFIX}\.{DB}\.accounts", tasks=1,
        )  # fmt: skip
        # The table's topic exists before the sink subscribes to its pattern: one created later
        # is found only at the consumer's next metadata refresh (metadata.max.age.ms, 5 minutes).
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": peer.bootstrap_servers, "log_level": 0})
        topic = f"{PREFIX}.{DB}.accounts"
        admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(60)
        workers[0].put_connector(SOURCE, source)
        workers[0].put_connector(SINK, sink)
        _wait(lambda: _target_versions(url) == _source_versions(db), STEP_TIMEOUT_S, "the snapshot applied")
        say("snapshot applied: the target equals the source")
        workload = _Workload(db, seed)
        workload.thread.start()
        stack.callback(workload.stop.set)
        time.sleep(3 + random.Random(seed).uniform(0, 2))  # the sink is busy writing batches
        found = _wait(
            lambda: (i,) if (i := _sink_worker(workers)) is not None else None,  # index 0 is an answer
            STEP_TIMEOUT_S,
            "the sink task running",
        )
        index = found[0]
        attempt.stopped_worker = index + 1
        zombie = workers[index]
        assert zombie.proc is not None
        before = _target_versions(url)
        zombie.proc.send_signal(signal.SIGSTOP)
        stack.callback(_resume, zombie)
        say(f"SIGSTOP worker {index + 1} (pid {zombie.proc.pid}), which runs the sink task")
        other = workers[1 - index]

        def moved() -> bool:
            status = other.status(SINK)
            port = str(other.port)
            tasks = status.get("tasks", [])
            return bool(tasks) and all(
                t.get("state") == "RUNNING" and str(t.get("worker_id", "")).endswith(f":{port}")
                for t in tasks
            )

        _wait(moved, STEP_TIMEOUT_S, "the sink task moved to the other worker")
        attempt.moved_to = 2 - index
        say(f"the sink task runs on worker {2 - index} (its REST API says so)")
        _wait(
            lambda: any(v > before.get(k, 0) for k, v in _target_versions(url).items()),
            STEP_TIMEOUT_S,
            "newer versions applied by the new worker",
        )
        say("the new worker applied versions newer than the target held at the stop")
        time.sleep(5)
        workload.stop.set()
        workload.thread.join(30)
        if workload.error is not None:
            raise DrillStepError(f"the workload failed: {workload.error!r}")
        say(f"workload stopped after {workload.transactions} transactions")
        _wait(lambda: _target_versions(url) == _source_versions(db), STEP_TIMEOUT_S,
              "the new worker caught up with the source")  # fmt: skip
        say("the target equals the source (written by the new worker)")
        zombie.proc.send_signal(signal.SIGCONT)
        say(f"SIGCONT worker {index + 1}: it resumes where it stopped")
        time.sleep(AFTER_RESUME_S)
        src, tgt = _source_versions(db), _target_versions(url)
        attempt.missing = len(src.keys() - tgt.keys())
        attempt.extra = len(tgt.keys() - src.keys())
        attempt.different = sum(1 for k in src.keys() & tgt.keys() if src[k] != tgt[k])
        attempt.stale = sorted((k, src[k], tgt[k]) for k in src.keys() & tgt.keys() if tgt[k] < src[k])
        say(
            f"{AFTER_RESUME_S:.0f}s after the resume: missing={attempt.missing} extra={attempt.extra} "
            f"different={attempt.different} stale={len(attempt.stale)}"
        )
        for k, s, t in attempt.stale:
            out(f"  stale row id={k}: source version {s}, target version {t}")
    return attempt


def _stop_worker(w: ConnectWorker) -> None:
    _resume(w)
    w.stop(grace_s=20)


def _resume(w: ConnectWorker) -> None:
    if w.proc is not None and w.proc.poll() is None and _stopped(w.proc.pid):
        w.proc.send_signal(signal.SIGCONT)


def mariadb_reporting_mysql8(directory: Path) -> LocalMariaDB:
    """A private MariaDB that reports 8.0.2-MariaDB-<its version> (Debezium's MySQL connector
    stops on MariaDB's own version string)."""
    out = subprocess.run([_binary("mariadbd", "mysqld"), "--version"], capture_output=True, text=True).stdout
    version = out.split("Ver ", 1)[1].split()[0] if "Ver " in out else "10.11"
    return LocalMariaDB(directory, extra_args=(f"--version=8.0.2-MariaDB-{version}",))


def run_zombie_connect(directory: Path, seed: int = 1, attempts: int = 3, out: Any = print) -> list[Attempt]:
    """``attempts`` runs of the drill (fresh Kafka, workers and target each; one MariaDB and
    PostgreSQL); prints as it goes and ends with the ``zombie_connect`` line."""
    jdbc_sink_home()  # fail early, naming the set-up step, without the jars
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    results: list[Attempt] = []
    with ExitStack() as stack:
        db = mariadb_reporting_mysql8(directory / "mariadb")
        stack.callback(db.remove)
        db.start()
        pg = LocalPostgres(directory / "postgres")
        stack.callback(pg.remove)
        pg.start()
        for number in range(1, attempts + 1):
            try:
                results.append(
                    run_attempt(number, directory / f"attempt-{number}", db, pg, seed * 100 + number, out)
                )
            except Exception as exc:
                log.exception("event=zombie_connect_attempt_failed attempt=%d", number)
                failed = Attempt(number, error=f"{type(exc).__name__}: {exc}")
                out(f"attempt {number}: failed: {failed.error}")
                results.append(failed)
    out(f"zombie_connect {summary(results)}")
    return results


def summary(results: list[Attempt]) -> str:
    """The attempts' counts as key=value fields, summed over the attempts that completed."""
    done = [a for a in results if a.error is None]
    stale = sum(len(a.stale) for a in done)
    return (
        f"attempts={len(results)} completed={len(done)} "
        f"attempts_with_stale_rows={sum(1 for a in done if a.stale)} stale_rows={stale} "
        f"missing={sum(a.missing for a in done)} extra={sum(a.extra for a in done)} "
        f"different={sum(a.different for a in done)}"
    )


__all__ = ["AGAINST", "Attempt", "run_zombie_connect", "summary"]

"""The README's main job: the whole platform on one machine.

1. a local cluster: ZooKeeper and 3 brokers;
2. a change topic, replication factor 3, min.insync.replicas 2, and the manager's console
   (its URL printed as `manager=`), which shows the cluster, the topic and the apply lag;
3. a Spark Structured Streaming query applying it to the target (SQLite by default);
4. the generator writing inserts, updates and deletes of three tables for a bounded time, with
   kill -9 of one broker half way (restarted a few seconds later);
5. wait for the target to catch up, then compare it with the generator's ground truth.

Progress is printed live; the report gives changes produced and applied, lag over time and rows
equal / missing / extra / different. The cluster is stopped at the end (unless --keep).

An apply query that fails (under CPU starvation, Spark's Python worker for the query's source
may not connect back within Spark's fixed 10 s) is started again from its checkpoint after the
workers' backoff (pipeline/restarting.py), and the report lists each failure and restart. One
that a restart would only meet again ends the demo, FAILED with the reason. Whatever ends it
(that, a step that raised, SIGTERM or Ctrl-C, which `stop_on_signals` turns into Stopped), the
generator, the query, Spark, the manager and the cluster are stopped before it exits.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sluice.ops import launcher
from sluice.security.client import ClientSecurity

_log = logging.getLogger("sluice.demo")

TOPIC = "demo.changes"
PARTITIONS = 3
BROKERS = 3
PIPELINE = "demo"


@dataclass
class _Progress:
    produced: int = 0
    applied: int = 0
    end_offsets: int = 0
    batches: int = 0
    events: list[str] = field(default_factory=list)
    lag_samples: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, produced, applied, lag
    generator_done: bool = False
    error: str | None = None


def run_demo(
    directory: Path,
    *,
    duration_s: float,
    rate: float,
    target: str | None,
    spark_master: str | None,
    keep: bool,
    console: Console,
    security: str = "none",
) -> bool:
    """``security="sasl_ssl"``: the cluster with TLS, SCRAM users and ACLs; the demo's clients
    (topic creation, generator, apply query and its Spark executors, manager) authenticate as
    its admin."""
    directory = fresh_directory(directory)
    target = target or f"sqlite:///{directory / 'target.db'}"
    console.print(f"[bold]1.[/] starting a local cluster of {BROKERS} brokers in {directory}")
    t0 = time.monotonic()
    cluster = launcher.cluster_up(directory / "cluster", brokers=BROKERS, security=security)
    manager = None
    try:  # from here on, the cluster is stopped whatever ends the demo
        console.print(
            f"   bootstrap.servers={cluster.bootstrap_servers}  zookeeper={cluster.zookeeper}  "
            f"({time.monotonic() - t0:.1f} s)"
        )
        manager = _start_manager(cluster, console)
        return _run(cluster, directory, target, duration_s, rate, spark_master, console)
    finally:
        with signals_held():
            if manager is not None:
                manager.stop()
            if end_cluster(directory, keep, console):
                console.print("[bold]7.[/] cluster stopped")


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the demo (`stop_on_signals`). A BaseException, as
    KeyboardInterrupt is: no `except Exception` on the way (a retry loop, a best-effort read)
    swallows it, and every `finally` and ExitStack on the way stops what it started."""

    #: the first signal seen (the demo ends with 128 + its number), and whether one raised now
    #: would cut short the stopping of what the demo started (`signals_held`)
    _seen: signal.Signals | None = None
    _held = False

    @classmethod
    def seen(cls) -> signal.Signals | None:
        return cls._seen


def stop_on_signals() -> None:
    """SIGTERM and SIGINT raise Stopped in the main thread, once; while the demo stops what it
    started (`signals_held`) they are only noted, so that a signal at that moment cannot leave a
    broker or MariaDB running. SIGKILL is still there for a clean-up that hangs."""

    def stop(signum: int, _frame: Any) -> None:
        if Stopped._seen is not None:
            return  # the first one is being acted on
        Stopped._seen = signal.Signals(signum)
        if not Stopped._held:
            raise Stopped(Stopped._seen.name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


@contextmanager
def signals_held() -> Iterator[None]:
    """Around stopping what the demo started: a signal is noted, not raised (`stop_on_signals`)."""
    held, Stopped._held = Stopped._held, True
    try:
        yield
    finally:
        Stopped._held = held


def fresh_directory(directory: Path) -> Path:
    """A demo's directory, emptied: a cluster an earlier run left in its `cluster/` stopped first."""
    directory = directory.resolve()
    if (directory / "cluster" / launcher.STATE_FILE).exists():
        try:
            launcher.cluster_down(directory / "cluster")
        except Exception:
            pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def end_cluster(directory: Path, keep: bool, console: Console) -> bool:
    """Stop the demo's cluster (True), or with `keep` say how to stop it later (False)."""
    if keep:
        console.print(f"cluster left running: `sluice cluster down --dir {directory / 'cluster'}` stops it")
        return False
    with signals_held():
        launcher.cluster_down(directory / "cluster")
    return True


#: the consumer group the demo commits its applied offsets to, so the manager's console shows the
#: apply lag over time (the target's offsets table stays the truth; this is a mirror for people)
APPLY_GROUP = "demo-apply"


class StepTimeout(RuntimeError):
    """A demo step did not happen within its time."""


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise StepTimeout(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def run_verify(svc: Any, task: str, console: Console) -> bool:
    """`sluice task verify` as a user runs it: its lines printed as they come, its exit status."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "sluice.cli", "task", "verify", task, "--zookeeper", svc.zookeeper,
            "--bootstrap-server", svc.bootstrap]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        console.print(f"   {line}", markup=False, highlight=False, soft_wrap=True)
    if done.returncode not in (0, 1):  # 1: they differ, said above; anything else: it failed
        console.print(f"   verify failed (exit {done.returncode}):\n{done.stderr[-3000:]}", markup=False)
    return done.returncode == 0


def _start_manager(cluster: launcher.LocalCluster, console: Console):  # type: ignore[no-untyped-def]
    """The manager's console on the demo's cluster, serving while the demo runs."""
    from sluice.manager.server import run_manager

    try:
        from sluice.manager.config import ManagerConfig

        config = ManagerConfig(
            bootstrap=cluster.bootstrap_servers, zookeeper=cluster.zookeeper, port=0,
            zk_auth=cluster.zk_auth(), security=cluster.client_security(),
        )  # fmt: skip
        handle = run_manager(cluster.zookeeper, cluster.bootstrap_servers, config=config)
    except Exception as exc:  # the demo goes on without a console
        console.print(f"   [yellow]the manager did not start: {exc}[/]")
        return None
    user, password = handle.initial_admin or ("admin", "(set before)")
    console.print(f"   console: {handle.url}  (user {user}, password {password})")
    print(f"manager={handle.url}", flush=True)
    print(f"manager_user={user}", flush=True)
    print(f"manager_password={password}", flush=True)
    return handle


class _OffsetMirror:
    """Commits the target's applied offsets to a consumer group on its own thread (a commit
    may wait for a coordinator that moved with the killed broker; the demo's loop must not)."""

    def __init__(self, bootstrap: str, group: str, security: ClientSecurity) -> None:
        import queue

        self.bootstrap, self.group, self.security = bootstrap, group, security
        self._queue: queue.Queue[dict[tuple[str, int], int] | None] = queue.Queue(maxsize=1)
        self._thread = threading.Thread(target=self._run, name="offset-mirror", daemon=True)
        self._thread.start()

    def submit(self, offsets: dict[tuple[str, int], int]) -> None:
        import queue

        try:
            self._queue.put_nowait(dict(offsets))
        except queue.Full:  # the previous one is still on its way: this one is skipped
            pass

    def stop(self) -> None:
        import queue

        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=10)

    def _run(self) -> None:
        from sluice.service.admin_client import AdminClient
        from sluice.service.group_view import commit_offsets

        failures = 0
        while (offsets := self._queue.get()) is not None:
            try:
                with AdminClient(self.bootstrap, timeout_s=3.0, security=self.security) as admin:
                    commit_offsets(admin, self.group, offsets)
                failures = 0
            except Exception as exc:  # a mirror for people: the next sample tries again
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    _log.warning(
                        "event=offset_mirror_failed group=%s failures=%d error=%r", self.group, failures, exc
                    )


def _run(
    cluster: launcher.LocalCluster,
    directory: Path,
    target: str,
    duration_s: float,
    rate: float,
    spark_master: str | None,
    console: Console,
) -> bool:
    started = ExitStack()  # what `_apply` starts, stopped whatever ends it
    try:
        return _apply(cluster, directory, target, duration_s, rate, spark_master, console, started)
    finally:
        with signals_held():
            started.close()


def _apply(
    cluster: launcher.LocalCluster, directory: Path, target: str, duration_s: float, rate: float,
    spark_master: str | None, console: Console, started: ExitStack,
) -> bool:  # fmt: skip
    """Steps 2 to 6. Each thing started (Spark, the query, the generator, the watchers) is pushed
    on `started`, which stops them in reverse order when the demo ends, fails or is stopped by a
    signal (Stopped)."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
    from sluice.pipeline.execution import CHANGE_TOPIC_CONFIG
    from sluice.pipeline.restarting import QueryFailure, RestartingQuery, describe_failure
    from sluice.pipeline.session import DriverSession
    from sluice.sync.sources.generator import GeneratorConfig, GeneratorStats, run_generator
    from sluice.sync.targets import open_target
    from sluice.sync.truth import Truth, compare

    bootstrap = cluster.bootstrap_servers
    security = cluster.client_security()
    client = security.confluent_config()
    console.print(
        f"[bold]2.[/] topic {TOPIC}: {PARTITIONS} partitions, replication factor 3, min.insync.replicas 2"
    )
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, **client})
    new_topic = NewTopic(TOPIC, PARTITIONS, 3, config=CHANGE_TOPIC_CONFIG)
    admin.create_topics([new_topic], operation_timeout=30)[TOPIC].result()

    console.print(
        f"[bold]3.[/] starting Spark ({spark_master or 'local[*]'}) and the apply query -> {target}"
    )
    t0 = time.monotonic()
    # One driver for the demo, started again if its JVM dies (the query's next start then runs
    # on a new one).
    spark = DriverSession(spark_master, app="sluice-demo")
    started.callback(_quietly, spark.stop, "stopping Spark")
    progress = _Progress()
    lock = threading.Lock()
    start = t0  # from step 4 on, the generator's start: the events' times count from it

    def on_batch(b: BatchReport) -> None:
        with lock:
            progress.applied += b.result.records - b.result.skipped
            progress.batches += 1

    def on_failure(f: QueryFailure) -> None:
        # A Spark Python worker that did not connect back in time (a starved machine), a lost
        # executor, a dead driver JVM: the query is started again from its checkpoint, with the
        # workers' backoff (pipeline/restarting.py).
        progress.events.append(
            f"{time.monotonic() - start:5.1f} s  the apply query failed (attempt {f.attempt}): {f.error}; "
            f"starting it again from its checkpoint in {f.retry_in_s:.1f} s"
        )

    def on_restart(q: ApplyQuery) -> None:
        progress.events.append(
            f"{time.monotonic() - start:5.1f} s  the apply query started again under fencing epoch {q.epoch}"
        )

    runner = RestartingQuery(
        spark.get,
        ApplyConfig(
            bootstrap=bootstrap, target=target, topics=[TOPIC], pipeline=PIPELINE,
            checkpoint=directory / "checkpoint", trigger_s=1.0, security=security,
        ),
        on_batch=on_batch, on_failure=on_failure, on_restart=on_restart,
    )  # fmt: skip
    query = runner.open()
    started.callback(runner.stop)
    runner.start()
    console.print(f"   query started under fencing epoch {query.epoch} ({time.monotonic() - t0:.1f} s)")

    truth_path = directory / "truth.json"
    console.print(
        f"[bold]4.[/] generator: {rate:,.0f} changes/s for {duration_s:.0f} s (idempotent acks=all); "
        f"kill -9 of a broker at {duration_s / 2:.0f} s"
    )
    truths: list[Truth] = []
    stop_generator = threading.Event()

    def on_gen(stats: GeneratorStats) -> None:
        with lock:
            progress.produced = stats.events

    def generate() -> None:
        try:
            _, truth = run_generator(
                bootstrap,
                GeneratorConfig(topic=TOPIC, rate=rate, duration_s=duration_s, name="demo"),
                truth_path=truth_path,
                stop=stop_generator,
                on_progress=on_gen,
                producer_config=client,
            )
            truths.append(truth)
        except Exception as exc:  # reported below; the demo then fails
            progress.error = str(exc)
        finally:
            progress.generator_done = True

    watcher = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "sluice-demo-watch", "log_level": 0, **client}
    )
    started.callback(_quietly, watcher.close, "closing the lag watcher")
    lag_target = open_target(target)
    mirror = _OffsetMirror(bootstrap, APPLY_GROUP, security)
    started.callback(_quietly, mirror.stop, "stopping the offset mirror")

    def end_offsets() -> int:
        total = 0
        for p in range(PARTITIONS):
            try:
                total += watcher.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=1, cached=False)[1]
            except Exception:
                return -1
        return total

    def applied_offsets() -> int:
        # Nothing applied yet is position 0 of each partition (the topic is new), not "no
        # position": the console shows the whole lag while the first batch is still running
        # (under load that first batch can take most of the run).
        applied = {(TOPIC, p): 0 for p in range(PARTITIONS)} | lag_target.applied_offsets(PIPELINE)
        mirror.submit(applied)
        return sum(applied.values())

    gen_thread = threading.Thread(target=generate, name="generator", daemon=True)
    start = time.monotonic()
    gen_thread.start()
    started.callback(gen_thread.join, 60)
    started.callback(stop_generator.set)  # (run before the join: callbacks run last first)
    victim: launcher.BrokerProcess | None = None
    killed_at = restarted = None
    last_sample = 0.0
    caught_up_deadline: float | None = None
    with Live(_live_table(progress, 0.0), console=console, refresh_per_second=4, transient=True) as live:
        while True:
            now = time.monotonic() - start
            if victim is None and now >= duration_s / 2:
                leader = int(admin.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions[0].leader)
                victim = cluster.broker(leader)
                os.kill(victim.pid, signal.SIGKILL)
                killed_at = now
                progress.events.append(f"{now:5.1f} s  kill -9 of broker {leader} (leader of {TOPIC}[0])")
            if victim is not None and restarted is None and killed_at is not None and now >= killed_at + 8:
                launcher.restart_broker(cluster, victim)
                restarted = time.monotonic() - start
                progress.events.append(
                    f"{restarted:5.1f} s  broker {victim.broker_id} restarted; it catches up"
                )
            if now - last_sample >= 2:
                last_sample = now
                ends = end_offsets()
                if ends >= 0:
                    applied = applied_offsets()
                    progress.end_offsets = ends
                    progress.lag_samples.append(
                        (now, progress.produced, progress.applied, max(0, ends - applied))
                    )
            live.update(_live_table(progress, now))
            try:
                runner.check()  # a failed query is started again after its backoff
            except Exception as exc:  # one a restart would only meet again (restarting.FATAL)
                progress.error = f"the apply query failed: {describe_failure(exc)}"
            if progress.error:
                break
            if progress.generator_done and restarted is not None:
                if caught_up_deadline is None:
                    caught_up_deadline = time.monotonic() + 180
                ends = end_offsets()
                if ends >= 0 and applied_offsets() >= ends:
                    now = time.monotonic() - start
                    progress.lag_samples.append((now, progress.produced, progress.applied, 0))
                    break
                if time.monotonic() > caught_up_deadline:
                    progress.error = "the target did not catch up within 180 s of the generator's end"
                    break
            time.sleep(0.25)
    with signals_held():
        started.close()  # the generator, the query, Spark and the watchers, now
    console.print(
        f"   {progress.produced:,} changes produced, {progress.applied:,} applied "
        f"in {progress.batches} batches"
    )
    for line in progress.events:  # whole lines: scripts and tests read them
        console.print(f"   {line}", markup=False, highlight=False, soft_wrap=True)

    console.print("[bold]5.[/] lag over time (changes in the log not yet applied to the target)")
    lag = Table(show_edge=False)
    for col in ("t (s)", "produced", "applied", "lag"):
        lag.add_column(col, justify="right")
    samples = progress.lag_samples
    step = max(1, len(samples) // 12)
    for t, produced, applied, behind in samples[::step] + (
        [samples[-1]] if samples and len(samples) % step else []
    ):
        lag.add_row(f"{t:.0f}", f"{produced:,}", f"{applied:,}", f"{behind:,}")
    console.print(lag)

    if progress.error or not truths:
        console.print(f"[bold red]FAILED[/]: {progress.error or 'the generator did not finish'}")
        lag_target.close()
        return False
    truth = truths[0]
    console.print(f"[bold]6.[/] comparing the target with the ground truth ({truth_path})")
    cmp = compare(truth, {t: lag_target.read_rows(t) for t in truth.tables})
    lag_target.close()
    report = Table(show_edge=False)
    for col in ("table", "rows equal", "missing", "extra", "different"):
        report.add_column(col, justify="right" if col != "table" else "left")
    for d in cmp.tables:
        report.add_row(
            d.table, f"{d.equal:,}", f"{len(d.missing):,}", f"{len(d.extra):,}", f"{len(d.different):,}"
        )
    console.print(report)
    if cmp.ok:
        console.print(
            f"[bold green]OK[/]: the target equals the source: {cmp.totals()['equal']:,} rows, "
            f"{truth.events:,} changes, through a kill -9 of a broker"
        )
    else:
        console.print(f"[bold red]MISMATCH[/]: {cmp.summary()}")
    return cmp.ok


def _quietly(stop: Any, what: str) -> None:
    """One step of stopping what the demo started: a failure is logged, and the next step runs."""
    try:
        stop()
    except Exception as exc:
        _log.warning("event=demo_stop_step_failed step=%r error=%r", what, exc)


def _live_table(p: _Progress, now: float) -> Table:
    t = Table.grid(padding=(0, 2))
    lag = p.lag_samples[-1][3] if p.lag_samples else 0
    t.add_row(
        f"[bold]{now:5.1f} s[/]",
        f"produced {p.produced:,}",
        f"applied {p.applied:,}",
        f"lag {lag:,}",
        f"batches {p.batches}",
        "generator done" if p.generator_done else "generating",
    )
    for line in p.events[-2:]:
        t.add_row("", line)
    return t

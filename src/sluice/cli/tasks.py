"""`sluice task` and `sluice worker`: sync tasks in ZooKeeper and the workers that run them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from sluice.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CommandConfig,
    ZooKeeperOpt,
    client_security,
    console,
    err,
    fail,
    services,
    task_store,
)
from sluice.ops.logging_setup import REDACTOR
from sluice.ops.logging_setup import configure as configure_logging

task_app = typer.Typer(no_args_is_help=True, help="Sync tasks: defined once in ZooKeeper, run by workers.")
worker_app = typer.Typer(no_args_is_help=True, help="Workers: processes that share and run the sync tasks.")


def _read_spec(file: Path):  # type: ignore[no-untyped-def]
    """A validated task definition from a YAML (or JSON) file, or exit 2 naming the bad field."""
    from sluice.service.errors import ServiceError
    from sluice.service.tasks import parse_definition_text

    try:
        text = file.read_text()
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc}", 2) from None
    try:
        return parse_definition_text(text, what=str(file))
    except ServiceError as exc:
        raise fail(f"{file}: {exc}", 2) from None


def _call(zookeeper: str | None, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """One service-layer call (the functions the manager's API calls), with its refusal shown
    as an error: exit 2 for a bad or unknown task, 1 otherwise."""
    from sluice.service.errors import InvalidError, NotFoundError, ServiceError

    svc = services(zookeeper)
    try:
        return fn(svc, *args, **kwargs)
    except (NotFoundError, InvalidError) as exc:
        raise fail(str(exc), 2) from None
    except ServiceError as exc:
        raise fail(str(exc), 2 if exc.status == 409 else 1) from None
    finally:
        svc.close()


@task_app.command("create")
def task_create(
    file: Annotated[Path, typer.Option("--file", "-f", help="Task definition (YAML)")],
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Validate a task definition and store it; errors name the bad field."""
    from sluice.service.tasks import create_task

    spec = _read_spec(file)
    created = _call(zookeeper, create_task, spec)
    console.print(
        f"task {spec.id} created: {spec.source.kind} -> {', '.join(spec.topics())} -> {created['target']}"
    )


@task_app.command("update")
def task_update(
    file: Annotated[Path, typer.Option("--file", "-f", help="The task's new definition (YAML)")],
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Replace a task's definition (same id) and restart its execution with it, under a new epoch:
    no delete needed, so the target's fence, offsets and rows carry on."""
    from sluice.service.errors import InvalidError, NotFoundError
    from sluice.service.tasks import update_task

    spec = _read_spec(file)
    svc = services(zookeeper)
    try:
        updated = update_task(svc, spec)
    except NotFoundError:
        raise fail(f"no task {spec.id!r}: create it with `sluice task create --file {file}`", 2) from None
    except InvalidError as exc:
        raise fail(f"{file}: {exc}", 2) from None
    finally:
        svc.close()
    console.print(
        f"task {spec.id} updated: {spec.source.kind} -> {', '.join(spec.topics())} -> {updated['target']}; "
        "its execution restarts with it"
    )


_STATE_WORDS = {"waiting": "waiting for a worker"}


@task_app.command("list")
def task_list(zookeeper: ZooKeeperOpt = None) -> None:
    """Tasks with their state: running (worker, epoch), paused, failing or waiting for a worker."""
    from sluice.service.tasks import list_tasks

    table = Table("task", "source", "target", "state", "worker", "epoch")
    for t in _call(zookeeper, list_tasks):
        table.add_row(
            t["id"], t["source"], t["target"], _STATE_WORDS.get(t["state"], t["state"]),
            str(t["worker"] or ""), str(t["latest_epoch"]),
        )  # fmt: skip
    console.print(table)


@task_app.command("status")
def task_status(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    """Worker, execution id, epoch, captured position, applied offsets, lag, executions and alarms."""
    from sluice.service.tasks import task_detail

    t = _call(zookeeper, task_detail, task_id)
    console.print(f"task {t['id']}: {t['source']} -> {', '.join(t['topics'])} -> {t['target']}")
    console.print(f"  state      {_STATE_WORDS.get(t['state'], t['state'])}")
    console.print(f"  epoch      {t['latest_epoch']} (latest taken)")
    if t["execution"]:
        for key in ("worker", "execution", "epoch", "captured_position", "needed_binlog", "oldest_binlog",
                    "pg_wal_retained_bytes", "slot_wal_status", "applied_offsets", "lag_records",
                    "lag_seconds", "updated"):  # fmt: skip
            if t.get(key) is not None:
                console.print(f"  {key:<18} {t[key]}")
    if t["error"]:
        console.print(f"  error      {t['error']}", markup=False, highlight=False)
    run = t.get("failures_in_a_row") or []
    if run:
        # the worker's backoff: each retry about twice as long after the one before (up to 60 s)
        steps = ", ".join(f"{e['attempts']} (retried after {e.get('retry_in_s')} s)" for e in run)
        newest = run[-1]
        console.print(f"  failures   in a row, newest at {_clock(newest.get('at'))}: {steps}; "
                      f"{newest.get('error')}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip
    for name in t.get("plain_text_secrets") or []:
        console.print(f"  warning    {name} is stored in plain text (a definition from before secret "
                      "references): update it with `password: {env: NAME}` or `{file: PATH}`",
                      markup=False, highlight=False)  # fmt: skip
    executions = t["executions"]
    console.print(f"  executions {len(executions)}")
    for e in executions[-5:]:
        console.print(f"    {_describe_execution(e)}", markup=False, highlight=False)
    alarms = t["events"]
    console.print(f"  alarms     {len(alarms)}")
    for alarm in alarms[-5:]:
        console.print(f"    {_describe_alarm(alarm)}", markup=False, highlight=False)


def _clock(t: object) -> str:
    import datetime as dt

    if not isinstance(t, (int, float)):
        return "now"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")


def _describe_execution(e: dict[str, Any]) -> str:
    ended = _clock(e["ended"]) if e.get("ended") else "running"
    text = f"{e.get('execution')} epoch {e.get('epoch')} on {e.get('worker')}: "
    text += f"{_clock(e.get('started'))}..{ended} {e.get('outcome')}"
    return text + (f" ({e['error']})" if e.get("error") else "")


def _describe_alarm(alarm: dict[str, object]) -> str:
    """One line: when, what, and the executions, workers, epochs and window it names."""
    when = _clock
    at = alarm.get("at")
    parts = [f"{when(at) if at else '?'} {alarm.get('kind')}"]
    for name in ("executions", "workers", "epochs"):
        values = alarm.get(name)
        if isinstance(values, list):
            parts.append(f"{name} {' -> '.join(str(x) for x in values)}")
    window = alarm.get("window")
    if isinstance(window, list) and len(window) == 2:
        parts.append(f"both ran {when(window[0])}..{when(window[1])} UTC")
    for name in (
        "execution",
        "worker",
        "epoch",
        "target_epoch",
        "found_by",
        "attempts",
        "retry_in_s",
        "error",
    ):
        if name in alarm:
            parts.append(f"{name} {alarm[name]}")
    if alarm.get("detail"):
        parts.append(f"({alarm['detail']})")
    return "; ".join(parts)


@task_app.command("pause")
def task_pause(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    """Stop the task's execution; it stays assigned but does nothing until resumed."""
    from sluice.service.tasks import pause_task

    _call(zookeeper, pause_task, task_id)
    console.print(f"task {task_id} paused")


@task_app.command("resume")
def task_resume(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    from sluice.service.tasks import resume_task

    _call(zookeeper, resume_task, task_id)
    console.print(f"task {task_id} resumed")


@task_app.command("restart")
def task_restart(
    task_id: str,
    from_position: Annotated[str | None, typer.Option(help="Capture from this source position")] = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Restart the task's execution (under a new epoch), optionally from a source position."""
    from sluice.service.tasks import restart_task

    _call(zookeeper, restart_task, task_id, from_position)
    console.print(f"task {task_id} restarting" + (f" from {from_position}" if from_position else ""))


@task_app.command("snapshot")
def task_snapshot(
    task_id: str,
    table: Annotated[str, typer.Option("--table", help="The table to read again (one of the task's tables)")],
    where: Annotated[
        str | None,
        typer.Option(
            "--where",
            help="Only rows matching this SQL condition on the source table (run in the "
            "capture's SELECT, with the task's source credentials)",
        ),
    ] = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Re-snapshot a table while the task streams: read in key-range chunks, without locks and
    without pausing the binlog; the running capture serves the request."""
    from sluice.service.tasks import request_snapshot

    result = _call(zookeeper, request_snapshot, task_id, table, where)
    console.print(f"snapshot={result['snapshot']['id']} table={table}", markup=False, highlight=False)


@task_app.command("verify")
def task_verify(
    task_id: str,
    table: Annotated[
        list[str] | None,
        typer.Option("--table", help="Only this table (repeatable; default: all the task's)"),
    ] = None,
    repair: Annotated[
        bool, typer.Option("--repair", help="Re-snapshot the differing keys through the running task")
    ] = False,
    chunk_rows: Annotated[
        int, typer.Option(help="Rows per compared key range (one Spark task each)")
    ] = 50_000,
    wait: Annotated[float, typer.Option(help="Seconds to wait for the pipeline to pass a position")] = 60.0,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Compare the task's source and target chunk by chunk (a Spark job): rows missing, extra and
    different, with their keys; exit 1 unless they are equal. Differences are checked again
    once the pipeline has passed the source's position, so a running task is verified as is."""
    from sluice.pipeline import verify as v
    from sluice.pipeline.session import spark_session
    from sluice.security.secrets import SecretError
    from sluice.service.tasks import request_snapshot
    from sluice.sync.sources.mysql_base import CaptureError
    from sluice.sync.tasks import TaskNotFoundError, resolved

    svc = services(zookeeper)
    try:
        try:
            stored = svc.tasks.get(task_id)
        except TaskNotFoundError:
            raise fail(f"no task {task_id!r}", 2) from None
        if stored.source.kind not in ("mysql", "mariadb", "postgresql"):
            raise fail(f"task {task_id} has a {stored.source.kind} source: verify compares mysql, mariadb "
                       "and postgresql sources with their targets", 2)  # fmt: skip
        unknown = [t for t in table or [] if t not in stored.tables]
        if unknown:
            raise fail(f"--table {', '.join(unknown)}: not among task {task_id}'s tables "
                       f"({', '.join(stored.tables)})", 2)  # fmt: skip
        try:
            spec = resolved(stored, svc.tasks.secret_scope())  # read here, within the cluster's scope
        except SecretError as exc:
            raise fail(
                f"{exc} (verify reads the source and the target with the task's credentials)", 2
            ) from None
        REDACTOR.add(stored.secrets())

        def status() -> dict[str, Any] | None:
            return svc.tasks.status(task_id)

        client = client_security(command_config, bootstrap).confluent_config()

        def ends() -> dict[str, int]:
            return v.log_ends(bootstrap, spec.topics(), client)

        try:
            if spec.source.kind == "postgresql":
                from sluice.pipeline.verify_pg import verify_postgres

                result = verify_postgres(spec, tables=table, status=status, ends=ends, wait_s=wait)
            else:
                spark = spark_session(spec.options.get("spark_master"), app=f"sluice-verify {task_id}")
                result = v.verify(
                    spark, spec, tables=table, chunk_rows=chunk_rows, status=status, ends=ends, wait_s=wait
                )
        except CaptureError as exc:
            raise fail(str(exc), 1) from None
        for line in v.report_lines(result):
            console.print(line, markup=False, highlight=False)
        if not result.waited:
            note = (f"note: task {task_id}'s pipeline was not seen past the source's position within "
                    f"{wait:.0f} s (is it running?): differences are reported as found")  # fmt: skip
            err.print(note, markup=False, highlight=False)
        if repair and not result.ok:

            def ask(name: str, keys: list[dict[str, Any]]) -> str:
                return str(
                    request_snapshot(svc, task_id, name, keys=keys, delete_absent=True)["snapshot"]["id"]
                )

            def pending() -> list[str]:
                return [str(r.get("id")) for r in svc.tasks.control(task_id).snapshots]

            recheck = None
            if spec.source.kind == "postgresql":
                from sluice.pipeline.verify_pg import recheck_postgres

                def recheck(suspects: list[Any], out: Any) -> list[Any]:
                    return recheck_postgres(spec, suspects, status=status, ends=ends, wait_s=wait, out=out)

            try:
                result = v.repair(
                    spec,
                    result,
                    request=ask,
                    pending=pending,
                    status=status,
                    ends=ends,
                    wait_s=max(wait, 120),
                    recheck=recheck,
                )
            except TimeoutError as exc:
                raise fail(str(exc), 1) from None
            console.print(f"repaired={result.repaired}", markup=False, highlight=False)
            for line in v.report_lines(result):
                if not line.startswith("verify "):
                    console.print(f"  still{line}", markup=False, highlight=False)
        console.print(f"verified={'true' if result.ok else 'false'}", markup=False, highlight=False)
    finally:
        svc.close()
    if not result.ok:
        raise typer.Exit(1)


@task_app.command("delete")
def task_delete(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    from sluice.service.tasks import delete_task

    result = _call(zookeeper, delete_task, task_id)
    console.print(f"task {task_id} deleted")
    for line in (result or {}).get("source_objects", []):
        console.print(f"source_object {line}", markup=False, highlight=False)


@task_app.command("secret-scope")
def task_secret_scope(
    directory: Annotated[
        str | None, typer.Option("--dir", help="secrets.dir: a `{file:}` secret must be a file under it")
    ] = None,
    env_prefix: Annotated[
        str | None,
        typer.Option("--env-prefix", help="secrets.env.prefix: an `{env:}` secret must be named so"),
    ] = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Show, or with --dir/--env-prefix set, the cluster's secret scope: what the secret references
    of tasks defined from now on may name (the manager and `task create/update` refuse the rest).
    Each worker checks its own secrets.dir and secrets.env.prefix when it starts a task: set them
    alike."""
    from sluice.security.secrets import SecretScope

    zk, store = task_store(zookeeper)
    try:
        scope = store.secret_scope()
        if directory is not None or env_prefix is not None:
            try:
                scope = SecretScope(directory or scope.directory, env_prefix or scope.env_prefix)
            except ValueError as exc:
                raise fail(f"{'--dir' if directory is not None else '--env-prefix'}: {exc}", 2) from None
            store.set_secret_scope(scope)
    finally:
        zk.stop()
    typer.echo(f"secrets.dir={scope.directory} secrets.env.prefix={scope.env_prefix}")


@worker_app.command("start")
def worker_start(
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="A worker.properties file (keys: docs/reference/configuration.md)"),
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value over the file's, repeatable")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="group.id: workers of one group share its tasks [default: sluice-workers]"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="worker.name (default: host name + random suffix)")] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="work.dir: Spark checkpoints [default: .sluice/worker]")
    ] = None,
    spark_master: Annotated[
        str | None, typer.Option(help="spark.master: Spark master URL (default local[*])")
    ] = None,
    session_timeout: Annotated[
        float | None, typer.Option(help="Group session timeout in seconds [default: 10]")
    ] = None,
    bootstrap: Annotated[
        str | None,
        typer.Option(
            "--bootstrap-server",
            "-b",
            envvar="SLUICE_BOOTSTRAP",
            help="bootstrap.servers (default: $SLUICE_BOOTSTRAP, else localhost:9092)",
        ),
    ] = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Join a worker group and run the tasks it assigns to this worker, in the foreground."""
    import logging
    import signal as _signal
    import threading
    import time

    from sluice.pipeline.execution import TaskExecution
    from sluice.pipeline.worker import SPARK_STOP_S, Membership, Worker, worker_name
    from sluice.properties import ConfigError, layered
    from sluice.sync.tasks import scrub
    from sluice.sync.worker_config import WorkerConfig

    try:
        flags = {
            "group.id": group, "worker.name": name, "work.dir": directory, "spark.master": spark_master,
            "session.timeout.ms": None if session_timeout is None else round(session_timeout * 1000),
            "bootstrap.servers": bootstrap, "zookeeper.connect": zookeeper,
        }  # fmt: skip
        values = layered(config_file, flags, override or [])
        values.setdefault("bootstrap.servers", DEFAULT_BOOTSTRAP)
        config = WorkerConfig.from_properties(values, source=str(config_file or "worker settings"))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    group, bootstrap, directory = config.group, config.bootstrap, config.work_dir
    security = config.security
    REDACTOR.add([security.password or ""])  # no log line of the worker's may show it
    spark_master, session_timeout = config.spark_master, config.session_timeout_s
    configure_logging("info")
    from sluice.ops.private_files import private_umask

    private_umask()  # its checkpoints and Spark's files are its owner's alone (Spark's JVM inherits it)
    from sluice import test_switches

    switches = test_switches.for_process()  # all off unless a test harness armed them
    if config.metrics_port is not None:
        from sluice import metrics

        metrics.enable_worker()
        try:
            port = metrics.serve(config.metrics_port, config.metrics_host)
        except metrics.MetricsBindError as exc:
            raise fail(str(exc), 2) from None
        err.print(f"metrics on http://{config.metrics_host}:{port}/metrics")
    zk, store = task_store(config.zookeeper, config.zk_auth)
    me = config.name or worker_name()
    cluster_scope = store.secret_scope()
    if cluster_scope != config.secret_scope:
        # Tasks are checked against the cluster's scope when defined and against this worker's
        # when they start here: references the one allows and the other does not fail here.
        logging.getLogger("sluice.worker").warning(
            "event=secret_scope_differs worker=%s secrets.dir=%s secrets.env.prefix=%s cluster_dir=%s "
            "cluster_env_prefix=%s: a task's secret reference is refused here unless it is in this "
            "worker's scope; set both alike (worker.properties, `sluice task secret-scope`)",
            me, config.secret_scope.directory, config.secret_scope.env_prefix, cluster_scope.directory,
            cluster_scope.env_prefix,
        )  # fmt: skip
    stop = threading.Event()
    changed = threading.Event()

    @zk.client.ChildrenWatch("/tasks")
    def _on_tasks(children: list[str]) -> bool:
        changed.set()
        return not stop.is_set()

    from sluice.pipeline.session import DriverSession

    logging.getLogger("pymysqlreplication").setLevel(logging.WARNING)
    # One Spark driver for the worker's tasks, started again if its JVM dies (the tasks then fail,
    # and their retries run on the new one).
    spark = DriverSession(spark_master, app=f"sluice-worker {me}")
    spark.warm()  # before joining: it takes seconds

    def start_task(task_id: str) -> object:
        REDACTOR.add(store.get(task_id).secrets())  # before anything of the task can be logged
        return TaskExecution(
            task_id, store, worker=me, bootstrap=bootstrap, spark=spark.get, workdir=directory / me,
            switches=switches, security=security, secret_scope=config.secret_scope,
        )  # fmt: skip

    def describe_error(task_id: str, error: BaseException | str) -> str:
        """One line, with the task's passwords scrubbed (a driver's message may quote a URL)."""
        text = (error if isinstance(error, str) else f"{type(error).__name__}: {error}").splitlines()[0]
        try:
            REDACTOR.add(store.get(task_id).secrets())
        except Exception:  # the task is gone or ZooKeeper is out of reach: what we know, and URLs
            pass
        return scrub(text, REDACTOR.secrets)

    def on_failure(task_id: str, error: str, attempts: int, retry_in_s: float) -> None:
        store.raise_alarm(
            task_id, "task-failed",
            {"worker": me, "error": error, "attempts": attempts, "retry_in_s": round(retry_in_s, 1)},
        )  # fmt: skip

    membership = Membership(
        bootstrap, group, me, session_timeout_ms=int(session_timeout * 1000), security=security
    )

    def revision(task_id: str) -> object:
        """What `sluice task update`, `restart`, `pause` and `resume` change: a failing task whose
        revision changed is tried again at once, counting its failures from 1."""
        control = store.control(task_id)
        return (control.restarts, control.paused)

    worker = Worker(
        membership, store.ids, start_task, tasks_changed=changed, stop=stop, on_failure=on_failure,
        describe_error=describe_error, revision=revision, zookeeper=zk,
    )  # fmt: skip
    _signal.signal(_signal.SIGTERM, lambda *_: stop.set())
    _signal.signal(_signal.SIGINT, lambda *_: stop.set())
    err.print(f"worker {me} joining group {group} on {bootstrap}")
    try:
        worker.run()
    finally:
        # The rest of the stop's bound (pipeline.worker.stop_bound_s): the driver, then the session
        # (closed already if ZooKeeper went away; ZooKeeper expires one left closing).
        spark.stop(timeout_s=SPARK_STOP_S)
        zk.stop_by(time.monotonic())
        began = worker.stop_began
        logging.getLogger("sluice.worker").info(
            "event=worker_stopped worker=%s took_ms=%s", me,
            "-" if began is None else f"{(time.monotonic() - began) * 1000:.0f}",
        )  # fmt: skip
    err.print(f"worker {me} stopped")

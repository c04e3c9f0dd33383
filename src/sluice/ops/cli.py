"""The ``sluice`` command line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sluice.ops import launcher
from sluice.ops.logging_setup import configure as configure_logging

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Sluice: change-data sync on a replicated log."
)
cluster_app = typer.Typer(no_args_is_help=True, help="Run a local cluster (ZooKeeper + brokers).")
broker_app = typer.Typer(no_args_is_help=True, help="Run and manage brokers.")
topic_app = typer.Typer(no_args_is_help=True, help="Create, list, describe and delete topics.")
app.add_typer(cluster_app, name="cluster")
app.add_typer(broker_app, name="broker")
app.add_typer(topic_app, name="topic")
group_app = typer.Typer(no_args_is_help=True, help="Consumer groups: list, describe, reset offsets.")
app.add_typer(group_app, name="group")
incident_app = typer.Typer(no_args_is_help=True, help="Replay the incidents Sluice is built against.")
app.add_typer(incident_app, name="incident")
chaos_app = typer.Typer(no_args_is_help=True, help="Random faults under a verifiable load, then a check.")
app.add_typer(chaos_app, name="chaos")

task_app = typer.Typer(no_args_is_help=True, help="Sync tasks: defined once in ZooKeeper, run by workers.")
app.add_typer(task_app, name="task")
worker_app = typer.Typer(no_args_is_help=True, help="Workers: processes that share and run the sync tasks.")
app.add_typer(worker_app, name="worker")

console = Console()
err = Console(stderr=True)


DEFAULT_BOOTSTRAP = "localhost:9092"

Bootstrap = Annotated[
    str,
    typer.Option(
        "--bootstrap-server",
        "-b",
        envvar="SLUICE_BOOTSTRAP",
        help="HOST:PORT of a broker (default: $SLUICE_BOOTSTRAP, else localhost:9092)",
    ),
]
ClusterDir = Annotated[Path, typer.Option("--dir", help="Directory of the local cluster")]


def fail(message: str, code: int = 1) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


# -- cluster ---------------------------------------------------------------------------------------


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int, typer.Option("--brokers", help="Number of brokers")] = 1,
    directory: ClusterDir = launcher.DEFAULT_DIR,
    zookeeper: Annotated[
        str | None,
        typer.Option("--zookeeper", help="Use this ensemble (HOST:PORT/CHROOT) instead of starting one"),
    ] = None,
    zk_session_timeout: Annotated[
        float, typer.Option(help="ZooKeeper session timeout of the brokers, seconds")
    ] = 6.0,
) -> None:
    """Start a local ZooKeeper (unless --zookeeper names one) and N brokers; wait until ready."""
    started = time.monotonic()
    try:
        cluster = launcher.cluster_up(directory, brokers, zookeeper, zk_session_timeout_s=zk_session_timeout)
    except (RuntimeError, TimeoutError, ValueError, FileNotFoundError) as exc:
        raise fail(str(exc)) from None
    print(f"bootstrap.servers={cluster.bootstrap_servers}")
    print(f"zookeeper={cluster.zookeeper}")
    took_s = time.monotonic() - started
    err.print(
        f"[green]cluster up[/] in {took_s:.1f} s: {len(cluster.brokers)} broker(s), dir {cluster.directory}"
    )


@cluster_app.command("status")
def cluster_status(directory: ClusterDir = launcher.DEFAULT_DIR) -> None:
    """Per broker: id, address, pid, alive, controller."""
    from sluice.cluster.zkstore import ZkStore

    try:
        cluster = launcher.LocalCluster.load(directory.resolve())
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    from sluice.ops.health import PartitionHealth, partition_health

    registered: set[int] = set()
    controller = -1
    zk_ok = True
    health: list[PartitionHealth] = []
    store = ZkStore(cluster.zookeeper, connect_timeout_s=5.0)
    try:
        store.start()
        registered = set(store.live_brokers())
        controller = store.controller_id()
        health = partition_health(store)
    except Exception as exc:
        zk_ok = False
        err.print(f"[yellow]ZooKeeper {cluster.zookeeper} is not reachable: {exc}[/]")
    finally:
        try:
            store.stop()
        except Exception:
            pass
    table = Table(title=f"cluster in {cluster.directory}")
    for col in ("id", "address", "pid", "alive", "registered", "controller"):
        table.add_column(col)
    for b in cluster.brokers:
        alive = launcher.pid_alive(b.pid)
        table.add_row(
            str(b.broker_id),
            b.address,
            str(b.pid),
            "yes" if alive else "[red]no[/]",
            ("yes" if b.broker_id in registered else "[red]no[/]") if zk_ok else "?",
            "*" if b.broker_id == controller else "",
        )
    console.print(table)
    problems = [h for h in health if h.status != "ok"]
    if problems:
        ptable = Table(title=f"{len(problems)} partition(s) need attention")
        for col in ("partition", "status", "leader", "replicas", "isr", "why"):
            ptable.add_column(col)
        for h in problems:
            colour = "red" if h.status == "offline" else "yellow"
            ptable.add_row(
                f"{h.topic}-{h.partition}",
                f"[{colour}]{h.status}[/]",
                str(h.leader),
                str(list(h.replicas)),
                str(list(h.isr)),
                h.reason,
            )
        console.print(ptable)
    print(f"zookeeper={cluster.zookeeper}")
    print(f"controller={controller}")
    print(f"offline_partitions={sum(h.status == 'offline' for h in health)}")
    print(f"under_replicated_partitions={sum(h.status == 'under-replicated' for h in health)}")


@cluster_app.command("down")
def cluster_down(directory: ClusterDir = launcher.DEFAULT_DIR) -> None:
    """Stop everything `cluster up` started in DIR."""
    try:
        stopped = launcher.cluster_down(directory)
    except FileNotFoundError as exc:
        raise fail(str(exc)) from None
    err.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


# -- broker ----------------------------------------------------------------------------------------


@broker_app.command("start")
def broker_start(
    broker_id: Annotated[int, typer.Option("--id", help="Broker id (unique in the cluster)")],
    port: Annotated[int, typer.Option("--port")],
    data_dir: Annotated[Path, typer.Option("--data-dir")],
    zookeeper: Annotated[
        str, typer.Option("--zookeeper", help="HOST:PORT[/CHROOT]; chroot defaults to /sluice")
    ],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    zk_session_timeout: Annotated[float, typer.Option(help="seconds")] = 6.0,
    auto_create_topics: Annotated[
        bool, typer.Option(help="Create unknown topics on metadata requests")
    ] = False,
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run one broker in the foreground."""
    from sluice.broker.broker import DataDirInUseError, run_broker
    from sluice.broker.config import BrokerConfig
    from sluice.cluster.zkstore import BrokerIdInUseError

    configure_logging(log_level)
    try:
        config = BrokerConfig(
            broker_id=broker_id,
            data_dir=data_dir.resolve(),
            zookeeper=zookeeper,
            host=host,
            port=port,
            zk_session_timeout_s=zk_session_timeout,
            auto_create_topics=auto_create_topics,
        )
        run_broker(config)
    except (BrokerIdInUseError, DataDirInUseError, ConnectionError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"broker {broker_id} could not start: {exc}") from None


@broker_app.command("stop")
def broker_stop(
    broker_id: Annotated[int, typer.Argument(help="Broker id")],
    directory: ClusterDir = launcher.DEFAULT_DIR,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker to exit")] = 60.0,
) -> None:
    """Controlled shutdown: leadership moves to other in-sync replicas, then the broker exits."""
    try:
        cluster = launcher.LocalCluster.load(directory.resolve())
        b = cluster.broker(broker_id)
    except (FileNotFoundError, KeyError) as exc:
        raise fail(str(exc)) from None
    if not launcher.pid_alive(b.pid):
        raise fail(f"broker {broker_id} (pid {b.pid}) is not running")
    started = time.monotonic()
    launcher.stop_pid(b.pid, timeout_s=timeout)
    err.print(f"broker {broker_id} stopped in {time.monotonic() - started:.1f} s (controlled shutdown)")


@broker_app.command("drain")
def broker_drain(
    broker_id: Annotated[int, typer.Argument(help="Broker id")],
    directory: ClusterDir = launcher.DEFAULT_DIR,
    zookeeper: Annotated[
        str | None, typer.Option("--zookeeper", help="HOST:PORT/CHROOT (default: the local cluster's)")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the moves")] = 300.0,
) -> None:
    """Move every partition replica off a broker (replication factor 1 included) and report when
    it can be stopped with nothing offline."""
    from sluice.cluster.zkstore import ZkStore
    from sluice.ops.drain import DrainError, plan_drain, start_drain, wait_drained

    if zookeeper is None:
        try:
            zookeeper = launcher.LocalCluster.load(directory.resolve()).zookeeper
        except FileNotFoundError as exc:
            raise fail(f"{exc}; or give --zookeeper") from None
    store = ZkStore(zookeeper)
    try:
        store.start()
        plan = plan_drain(store, broker_id)
        start_drain(store, plan)
        err.print(f"moving {len(plan.moves)} replica(s) off broker {broker_id} ...")
        started = time.monotonic()
        pending = wait_drained(store, plan, timeout)
    except (DrainError, ConnectionError) as exc:
        raise fail(str(exc)) from None
    finally:
        store.stop()
    table = Table(title=f"drain of broker {broker_id}")
    for col in ("partition", "now on"):
        table.add_column(col)
    for move in plan.moves:
        where = (
            "[red]still moving[/]" if (move.topic, move.partition) in pending else str(list(move.replicas))
        )
        table.add_row(f"{move.topic}-{move.partition}", where)
    for topic, p, why, online in plan.kept:
        fate = "stays online via other in-sync replicas" if online else "[red]would go offline[/]"
        table.add_row(f"{topic}-{p}", f"kept ({why}); {fate}")
    console.print(table)
    if pending:
        raise fail(f"{len(pending)} move(s) did not finish within {timeout:.0f} s: {pending[:5]}")
    offline = [f"{t}-{p}" for t, p, _, online in plan.kept if not online]
    if offline:
        raise fail(
            f"broker {broker_id} still holds the only in-sync replica of {offline}: stopping it takes "
            "them offline"
        )
    print(f"drained=true broker={broker_id} moved={len(plan.moves)} took_s={time.monotonic() - started:.1f}")
    err.print(
        f"[green]broker {broker_id} can be stopped with nothing offline[/]: `sluice broker stop {broker_id}`"
    )


@broker_app.command("restart")
def broker_restart(
    broker_id: Annotated[int, typer.Argument(help="Broker id")],
    directory: ClusterDir = launcher.DEFAULT_DIR,
) -> None:
    """Start a stopped broker of the local cluster again, with its data."""
    try:
        cluster = launcher.LocalCluster.load(directory.resolve())
        b = cluster.broker(broker_id)
    except (FileNotFoundError, KeyError) as exc:
        raise fail(str(exc)) from None
    if launcher.pid_alive(b.pid):
        raise fail(f"broker {broker_id} is already running (pid {b.pid})")
    launcher.restart_broker(cluster, b)
    err.print(f"broker {broker_id} running again (pid {b.pid})")


# -- topics ----------------------------------------------------------------------------------------


def _admin(bootstrap: str):  # type: ignore[no-untyped-def]
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})


def _parse_configs(configs: list[str]) -> dict[str, str]:
    result = {}
    for item in configs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--config takes key=value, got {item!r}")
        result[key] = value
    return result


@topic_app.command("create")
def topic_create(
    name: str,
    partitions: Annotated[int, typer.Option("--partitions", "-p")] = 1,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", help="-1: cluster default")
    ] = -1,
    config: Annotated[list[str] | None, typer.Option("--config", "-c", help="key=value, repeatable")] = None,
    allow_single_replica: Annotated[
        bool,
        typer.Option(
            "--allow-single-replica", help="Allow replication factor 1 (no copy survives a failure)"
        ),
    ] = False,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    from confluent_kafka.admin import NewTopic

    cfg = _parse_configs(config or [])
    if replication_factor == 1:
        risk = (
            "replication factor 1 keeps one copy of every partition: when its broker stops or fails, "
            "the partition is offline (and its data lost if the disk is); drain the broker "
            "(`sluice broker drain`) before any maintenance"
        )
        if not allow_single_replica:
            raise fail(f"{risk}. Pass --allow-single-replica to create it anyway.")
        err.print(f"[yellow]warning:[/] {risk}")
    admin = _admin(bootstrap)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=cfg)],
        operation_timeout=30,
        request_timeout=40,
    )
    try:
        futures[name].result()
    except Exception as exc:
        raise fail(f"topic {name!r} was not created: {_kafka_error_text(exc)}") from None
    console.print(f"created topic {name} with {partitions} partition(s)")


def _kafka_error_text(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    text = getattr(arg, "str", None)
    return text() if callable(text) else str(arg)


@topic_app.command("list")
def topic_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    md = _admin(bootstrap).list_topics(timeout=15)
    for name in sorted(md.topics):
        print(name)


@topic_app.command("delete")
def topic_delete(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    admin = _admin(bootstrap)
    futures = admin.delete_topics([name], operation_timeout=30, request_timeout=40)
    try:
        futures[name].result()
    except Exception as exc:
        raise fail(f"topic {name!r} was not deleted: {_kafka_error_text(exc)}") from None
    console.print(f"deleted topic {name}")


@topic_app.command("describe")
def topic_describe(name: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Per partition: leader, replicas, ISR, log start and end offsets."""
    from confluent_kafka import Consumer, TopicPartition

    from sluice.cluster.layout import PartitionState
    from sluice.cluster.state_machine import offline_reason

    md = _admin(bootstrap).list_topics(topic=name, timeout=15)
    topic = md.topics.get(name)
    if topic is None or (topic.error is not None and topic.error.code() == 3):
        raise fail(f"topic {name!r} does not exist")
    live = set(md.brokers)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-cli",
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    table = Table(title=f"topic {name} ({len(topic.partitions)} partitions)")
    for col in ("partition", "leader", "replicas", "isr", "log start", "log end", "status"):
        table.add_column(col)
    try:
        for pid in sorted(topic.partitions):
            p = topic.partitions[pid]
            status = "ok"
            start = end = "-"
            if p.leader < 0:
                isr = tuple(p.isrs) or tuple(p.replicas)
                why = offline_reason(PartitionState(-1, 0, isr, 0), p.replicas, live)
                status = f"[red]offline[/]: {why}"
            else:
                try:
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(name, pid), timeout=10)
                    start, end = str(lo), str(hi)
                except Exception as exc:
                    status = f"[yellow]offsets unavailable[/]: {_kafka_error_text(exc)}"
                if len(p.isrs) < len(p.replicas):
                    status = (
                        f"[yellow]under-replicated[/]: out of sync {sorted(set(p.replicas) - set(p.isrs))}"
                    )
            table.add_row(str(pid), str(p.leader), str(p.replicas), str(p.isrs), start, end, status)
    finally:
        consumer.close()
    console.print(table)


# -- groups ----------------------------------------------------------------------------------------


@group_app.command("list")
def group_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """Every group any broker coordinates, with its state and protocol type."""
    from sluice.ops.admin_client import AdminClient

    with AdminClient(bootstrap) as admin:
        groups = admin.list_groups()
    table = Table(title=f"{len(groups)} group(s)")
    for col in ("group", "state", "protocol type", "coordinator"):
        table.add_column(col)
    for g in groups:
        table.add_row(g["group_id"], g["group_state"], g["protocol_type"], str(g["coordinator"]))
    console.print(table)


@group_app.command("describe")
def group_describe(group: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP) -> None:
    """State, members (client id, host, assignment) and per-partition committed offset, end and lag."""
    from sluice.ops.group_view import describe_group

    try:
        view = describe_group(bootstrap, group)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    console.print(
        f"group [bold]{group}[/]: state {view.state}, protocol {view.protocol_type or '-'}"
        f"/{view.protocol or '-'}, coordinator {view.coordinator}"
    )
    members = Table(title=f"{len(view.members)} member(s)")
    for col in ("member", "client id", "host", "assignment"):
        members.add_column(col)
    for m in view.members:
        members.add_row(
            m.member_id, m.client_id, m.client_host, ", ".join(f"{t}-{p}" for t, p in m.assignment) or "-"
        )
    console.print(members)
    offsets = Table(title="offsets")
    for col in ("topic", "partition", "committed", "end", "lag", "member"):
        offsets.add_column(col)
    for row in view.partitions:
        offsets.add_row(
            row.topic,
            str(row.partition),
            str(row.committed) if row.committed >= 0 else "-",
            str(row.end) if row.end >= 0 else "-",
            str(row.lag) if row.lag is not None else "-",
            row.member or "-",
        )
    console.print(offsets)
    print(f"total_lag={view.total_lag}")


@group_app.command("reset-offsets")
def group_reset_offsets(
    group: str,
    topic: Annotated[str, typer.Option("--topic")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Set the group's committed offsets for TOPIC. Refused while the group has members."""
    from sluice.ops.group_view import reset_offsets

    chosen = [to_earliest, to_latest, to_offset is not None]
    if sum(chosen) != 1:
        raise fail("give exactly one of --to-earliest, --to-latest, --to-offset N")
    target = "earliest" if to_earliest else "latest" if to_latest else int(to_offset or 0)
    try:
        result = reset_offsets(bootstrap, group, topic, target)
    except RuntimeError as exc:
        raise fail(str(exc)) from None
    table = Table(title=f"group {group}: offsets of {topic} reset")
    for col in ("partition", "new offset"):
        table.add_column(col)
    for p, off in sorted(result.items()):
        table.add_row(str(p), str(off))
    console.print(table)


# -- incident drills and chaos ----------------------------------------------------------------------


def _print_result(result: object) -> bool:
    from sluice.chaos.incidents import IncidentResult

    assert isinstance(result, IncidentResult)
    if result.timeline and not result.rows:
        steps = Table(title=f"{result.name}: what happened")
        steps.add_column("t (s)", justify="right")
        steps.add_column("step")
        for at, what in result.timeline:
            steps.add_row(f"{at:.1f}", what)
        console.print(steps)
    table = Table(title=f"{result.name}: checker")
    for col in (
        "run",
        "acknowledged",
        "read",
        "lost",
        "duplicated",
        "out of order",
        "failed sends",
        "errors",
    ):
        table.add_column(col)
    for r in result.rows:
        table.add_row(
            r.label,
            f"{r.acknowledged:,}",
            f"{r.read:,}",
            str(r.lost),
            str(r.duplicated),
            str(r.out_of_order),
            str(r.failed_sends),
            ", ".join(f"{k} x{v}" for k, v in r.errors.items()),
        )
    if result.rows:
        console.print(table)
    for r in result.rows:
        for example in r.lost_examples:
            console.print(f"   lost ({r.label}): {example}")
    verdict = Table(title="verdict")
    for col in ("guarantee", "held", "detail"):
        verdict.add_column(col)
    for c in result.checks:
        verdict.add_row(c.guarantee, "[green]yes[/]" if c.passed else "[red]NO[/]", c.detail)
    console.print(verdict)
    print(f"verdict={'pass' if result.ok else 'FAIL'}")
    return result.ok


@incident_app.command("list")
def incident_list() -> None:
    from sluice.chaos.incidents import INCIDENTS

    for name, (about, _) in INCIDENTS.items():
        print(f"{name:26s} {about}")


@incident_app.command("run")
def incident_run(
    name: str,
    local: Annotated[
        bool, typer.Option("--local", help="Run against a fresh local 3-broker cluster")
    ] = False,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="An existing cluster (not supported)")
    ] = None,
    directory: Annotated[Path, typer.Option("--dir")] = Path(".sluice/incident"),
    seed: Annotated[int, typer.Option()] = 1,
) -> None:
    """Replay an incident and print the checker's rows and the verdict; exits 1 if a guarantee broke."""
    from sluice.chaos.incidents import INCIDENTS, run_incident

    if name not in INCIDENTS:
        raise fail(f"unknown incident {name!r}; `sluice incident list` shows them")
    if bootstrap is not None and not local:
        raise fail(
            "drills inject faults into broker processes (kill -9, SIGSTOP, cutting ZooKeeper), which "
            "needs a cluster on this machine that the drill starts itself: use --local"
        )
    configure_logging("WARNING")
    result = run_incident(name, directory / name, seed=seed)
    raise typer.Exit(0 if _print_result(result) else 1)


@chaos_app.command("run")
def chaos_run(
    duration: Annotated[float, typer.Option(help="Seconds of faults")] = 60.0,
    seed: Annotated[str, typer.Option(help="A seed, or a range A..B for several runs")] = "1",
    faults: Annotated[
        str, typer.Option(help="Comma-separated: kill,pause,shutdown,zk-cut")
    ] = "kill,pause,shutdown,zk-cut",
    directory: Annotated[Path, typer.Option("--dir")] = Path(".sluice/chaos"),
) -> None:
    """Random faults against a local 3-broker cluster under an idempotent acks=all load; then heal,
    wait for quiescence and check. Same seed, same fault schedule."""
    from sluice.chaos.random_run import run_chaos

    lo, _, hi = seed.partition("..")
    seeds = range(int(lo), int(hi or lo) + 1)
    kinds = tuple(k.strip() for k in faults.split(",") if k.strip())
    configure_logging("WARNING")
    all_ok = True
    for s in seeds:
        try:
            result, schedule = run_chaos(directory / f"seed-{s}", seed=s, duration_s=duration, kinds=kinds)
        except ValueError as exc:
            raise fail(str(exc)) from None
        console.print(
            f"seed {s}: {len(schedule)} faults: "
            + "; ".join(f"{f.at_s:.0f}s {f.kind} {f.role} {f.duration_s:.0f}s" for f in schedule)
        )
        all_ok &= _print_result(result)
    raise typer.Exit(0 if all_ok else 1)


# -- console producer and consumer ----------------------------------------------------------------


@app.command("produce")
def produce(
    topic: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    key_separator: Annotated[
        str | None, typer.Option(help="Split each line into key and value at this string")
    ] = None,
    acks: Annotated[str, typer.Option()] = "all",
) -> None:
    """Send each line of standard input as one record (idempotent, acks=all by default)."""
    from confluent_kafka import Producer

    failures: list[str] = []
    sent = 0

    def on_delivery(error: object, msg: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": acks,
            "enable.idempotence": acks == "all",
            "linger.ms": 5,
            "log_level": 3,
        }
    )
    for line in sys.stdin:
        line = line.rstrip("\n")
        key: str | None = None
        if key_separator is not None and key_separator in line:
            key, line = line.split(key_separator, 1)
        while True:
            try:
                producer.produce(
                    topic,
                    value=line.encode(),
                    key=key.encode() if key is not None else None,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
        producer.poll(0)
    remaining = producer.flush(60)
    if failures or remaining:
        raise fail(f"{len(failures) + remaining} of {sent} record(s) were not acknowledged: {failures[:3]}")
    err.print(f"{sent} record(s) acknowledged")


@app.command("consume")
def consume(
    topic: str,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    from_beginning: Annotated[bool, typer.Option("--from-beginning")] = False,
    max_messages: Annotated[
        int, typer.Option("--max-messages", help="Stop after N records (0: run until Ctrl-C)")
    ] = 0,
    timeout: Annotated[
        float, typer.Option(help="Stop after this many seconds without a record (0: never)")
    ] = 0,
    print_key: Annotated[bool, typer.Option("--print-key")] = False,
) -> None:
    """Print records of TOPIC by partition assignment (no consumer group)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "sluice-console",
            "enable.auto.commit": False,
            "log_level": 3,
            "enable.partition.eof": False,
        }
    )
    md = consumer.list_topics(topic, timeout=15)
    if topic not in md.topics or md.topics[topic].error is not None:
        consumer.close()
        raise fail(f"topic {topic!r} does not exist")
    start = OFFSET_BEGINNING if from_beginning else OFFSET_END
    consumer.assign([TopicPartition(topic, p, start) for p in sorted(md.topics[topic].partitions)])
    count = 0
    last = time.monotonic()
    try:
        while max_messages <= 0 or count < max_messages:
            msg = consumer.poll(0.5)
            if msg is None:
                if timeout and time.monotonic() - last > timeout:
                    break
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise fail(f"consume failed: {error.str()}")
            last = time.monotonic()
            raw_value, raw_key = msg.value(), msg.key()
            value = raw_value.decode(errors="replace") if raw_value is not None else "null"
            if print_key:
                key = raw_key.decode(errors="replace") if raw_key is not None else "null"
                print(f"{key}\t{value}")
            else:
                print(value)
            count += 1
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    err.print(f"{count} record(s) consumed")


def _seconds(text: str, what: str) -> float:
    from sluice.sync.tasks import parse_duration

    try:
        return parse_duration(text)
    except ValueError:
        raise fail(f"{what} must be a positive duration like 1s, 500ms or 2.5, not {text!r}", 2) from None


@app.command("apply")
def apply(
    target: Annotated[str, typer.Option(help="sqlite:///path/to.db or postgresql://user@host:port/db")],
    topics: Annotated[str | None, typer.Option(help="Comma-separated topics to apply")] = None,
    pattern: Annotated[
        str | None, typer.Option(help="Regular expression over topic names (instead of --topics)")
    ] = None,
    trigger: Annotated[str, typer.Option(help="Micro-batch interval, e.g. 1s or 500ms")] = "1s",
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*])")] = None,
    checkpoint: Annotated[Path | None, typer.Option(help="Spark checkpoint directory")] = None,
    pipeline: Annotated[
        str | None, typer.Option(help="Pipeline name: keys the target's offsets and fence")
    ] = None,
    epoch: Annotated[
        int | None, typer.Option(help="Fencing epoch (default: one more than the target's)")
    ] = None,
    mapping: Annotated[
        Path | None, typer.Option(help="YAML/JSON column mapping: table -> table/rename/drop/casts")
    ] = None,
    available_now: Annotated[bool, typer.Option(help="Apply what is in the log now, then stop")] = False,
    max_records_per_trigger: Annotated[int | None, typer.Option(help="Read limit per micro-batch")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
) -> None:
    """Apply change topics to a target with a Spark Structured Streaming query, in the foreground.

    Each micro-batch is one target transaction: newest change per row, guarded by source
    position, offsets recorded with the rows, fencing epoch checked. Stop with Ctrl-C."""
    import signal as _signal

    from sluice.sync.targets import StaleEpochError
    from sluice.sync.targets.base import ColumnMapping, MappingError

    if bool(topics) == bool(pattern):
        raise fail("give exactly one of --topics and --pattern", 2)
    try:
        column_mapping = ColumnMapping.from_config(_load_mapping(mapping)) if mapping else ColumnMapping()
    except (MappingError, OSError, ValueError) as exc:
        raise fail(f"bad --mapping: {exc}", 2) from None
    from sluice.pipeline.apply import ApplyConfig, ApplyQuery, BatchReport
    from sluice.pipeline.session import spark_session

    config = ApplyConfig(
        bootstrap=bootstrap,
        target=target,
        topics=[t.strip() for t in topics.split(",") if t.strip()] if topics else None,
        pattern=pattern,
        pipeline=pipeline,
        epoch=epoch,
        trigger_s=_seconds(trigger, "--trigger"),
        available_now=available_now,
        max_records_per_trigger=max_records_per_trigger,
        mapping=column_mapping,
    )
    name = config.pipeline_name()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    config.checkpoint = checkpoint or Path(".sluice/checkpoints") / safe

    def on_batch(b: BatchReport) -> None:
        r = b.result
        offsets = " ".join(
            f"{t}[{p}]={o}" for t, parts in r.offsets.items() for p, o in sorted(parts.items())
        )
        err.print(
            f"batch {b.batch_id}: {r.records:,} records ({r.skipped:,} already applied), "
            f"{r.changes:,} row changes, {r.written:,} rows written in {b.took_s:.2f} s; next {offsets}"
        )

    try:
        spark = spark_session(spark_master, app=f"sluice-apply {name}")
        query = ApplyQuery(spark, config, on_batch=on_batch)
    except StaleEpochError as exc:
        raise fail(str(exc), 3) from None
    except (ConnectionError, ValueError) as exc:
        raise fail(str(exc), 2) from None
    err.print(
        f"applying {name} to {target} under fencing epoch {query.epoch}; checkpoint {config.checkpoint}"
    )
    stopping = []

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)
        if query.query is not None:
            query.query.stop()

    _signal.signal(_signal.SIGTERM, on_signal)
    _signal.signal(_signal.SIGINT, on_signal)
    query.start()
    for note in query.notes:
        err.print(note)
    try:
        query.await_termination()
    except StaleEpochError as exc:
        raise fail(str(exc), 3) from None
    except Exception as exc:
        if not stopping:
            raise fail(f"the apply query failed: {_query_error_text(exc)}") from None
    finally:
        query.stop()
        spark.stop()
    err.print("stopped" if stopping else "done")


def _load_mapping(path: Path) -> dict[str, object]:
    import yaml

    doc = yaml.safe_load(path.read_text())
    if isinstance(doc, dict) and "tables" in doc:
        doc = doc["tables"]
    if not isinstance(doc, dict):
        raise ValueError(f"{path} must hold a mapping of table name -> table/rename/drop/casts")
    return doc


def _query_error_text(exc: BaseException) -> str:
    text = str(exc)
    # Spark wraps a Python error from the batch function in a long JVM trace; keep the Python part.
    for marker in ("BadEventError: ", "SluiceSourceError: ", "ValueError: ", "Error: "):
        if marker in text:
            return text[text.index(marker) :].splitlines()[0]
    return text.splitlines()[0] if text else type(exc).__name__


ZooKeeperOpt = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        envvar="SLUICE_ZOOKEEPER",
        help="HOST:PORT/CHROOT (default: $SLUICE_ZOOKEEPER, else the local cluster in .sluice/cluster)",
    ),
]


def _task_store(zookeeper: str | None):  # type: ignore[no-untyped-def]
    """A TaskStore on the given ZooKeeper, or on the local cluster's."""
    from sluice.cluster.zkstore import ZkStore
    from sluice.sync.tasks import TaskStore

    if zookeeper is None:
        try:
            zookeeper = launcher.LocalCluster.load(launcher.DEFAULT_DIR.resolve()).zookeeper
        except FileNotFoundError:
            raise fail("no --zookeeper given and no local cluster in .sluice/cluster", 2) from None
    store = ZkStore(zookeeper, connect_timeout_s=10.0)
    try:
        store.start()
    except ConnectionError as exc:
        raise fail(str(exc)) from None
    return store, TaskStore(store.client)


@task_app.command("create")
def task_create(
    file: Annotated[Path, typer.Option("--file", "-f", help="Task definition (YAML)")],
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Validate a task definition and store it; errors name the bad field."""
    import yaml

    from sluice.sync.tasks import TaskSpecError, parse_spec, redact

    try:
        doc = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise fail(f"cannot read {file}: {exc}", 2) from None
    except yaml.YAMLError as exc:
        raise fail(f"{file} is not valid YAML: {exc}", 2) from None
    try:
        spec = parse_spec(doc)
    except TaskSpecError as exc:
        raise fail(f"{file}: {exc}", 2) from None
    zk, store = _task_store(zookeeper)
    try:
        store.create(spec)
    except TaskSpecError as exc:
        raise fail(str(exc), 2) from None
    finally:
        zk.stop()
    console.print(
        f"task {spec.id} created: {spec.source.kind} -> {', '.join(spec.topics())} -> {redact(spec.target)}"
    )


@task_app.command("list")
def task_list(zookeeper: ZooKeeperOpt = None) -> None:
    """Tasks with their state: running (worker, epoch), paused or waiting for a worker."""
    from sluice.sync.tasks import redact

    zk, store = _task_store(zookeeper)
    try:
        table = Table("task", "source", "target", "state", "worker", "epoch")
        for task_id in store.ids():
            spec = store.get(task_id)
            status = store.status(task_id)
            control = store.control(task_id)
            state = "paused" if control.paused else ("running" if status else "waiting for a worker")
            table.add_row(
                task_id, spec.source.kind, redact(spec.target), state,
                str(status.get("worker", "")) if status else "", str(store.epoch(task_id)),
            )  # fmt: skip
        console.print(table)
    finally:
        zk.stop()


@task_app.command("status")
def task_status(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    """Worker, execution id, epoch, captured position, applied offsets, lag and alarms."""
    from sluice.sync.tasks import TaskNotFoundError, redact

    zk, store = _task_store(zookeeper)
    try:
        try:
            spec = store.get(task_id)
        except TaskNotFoundError:
            raise fail(f"no task {task_id!r}", 2) from None
        status = store.status(task_id)
        control = store.control(task_id)
        console.print(
            f"task {spec.id}: {spec.source.kind} -> {', '.join(spec.topics())} -> {redact(spec.target)}"
        )
        console.print(
            f"  state      {'paused' if control.paused else 'running' if status else 'waiting for a worker'}"
        )
        console.print(f"  epoch      {store.epoch(task_id)} (latest taken)")
        if status:
            for key in ("worker", "execution", "epoch", "captured_position", "applied_offsets",
                        "lag_records", "lag_seconds", "updated"):  # fmt: skip
                if key in status:
                    console.print(f"  {key:<18} {status[key]}")
        alarms = store.alarms(task_id)
        console.print(f"  alarms     {len(alarms)}")
        for alarm in alarms[-5:]:
            console.print(f"    {_describe_alarm(alarm)}", markup=False, highlight=False)
    finally:
        zk.stop()


def _describe_alarm(alarm: dict[str, object]) -> str:
    """One line: when, what, and the executions, workers, epochs and window it names."""
    import datetime as dt

    def when(t: object) -> str:
        if not isinstance(t, (int, float)):
            return "now"
        return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")

    at = alarm.get("at")
    parts = [f"{when(at) if at else '?'} {alarm.get('kind')}"]
    for name in ("executions", "workers", "epochs"):
        values = alarm.get(name)
        if isinstance(values, list):
            parts.append(f"{name} {' -> '.join(str(x) for x in values)}")
    window = alarm.get("window")
    if isinstance(window, list) and len(window) == 2:
        parts.append(f"both ran {when(window[0])}..{when(window[1])} UTC")
    for name in ("execution", "epoch", "target_epoch", "found_by"):
        if name in alarm:
            parts.append(f"{name} {alarm[name]}")
    if alarm.get("detail"):
        parts.append(f"({alarm['detail']})")
    return "; ".join(parts)


def _set_control(task_id: str, zookeeper: str | None, **changes: object) -> None:
    from sluice.sync.tasks import TaskNotFoundError

    zk, store = _task_store(zookeeper)
    try:
        try:
            store.get(task_id)
        except TaskNotFoundError:
            raise fail(f"no task {task_id!r}", 2) from None
        if "restarts" in changes:
            changes["restarts"] = store.control(task_id).restarts + 1
        store.set_control(task_id, **changes)
    finally:
        zk.stop()


@task_app.command("pause")
def task_pause(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    """Stop the task's execution; it stays assigned but does nothing until resumed."""
    _set_control(task_id, zookeeper, paused=True)
    console.print(f"task {task_id} paused")


@task_app.command("resume")
def task_resume(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    _set_control(task_id, zookeeper, paused=False)
    console.print(f"task {task_id} resumed")


@task_app.command("restart")
def task_restart(
    task_id: str,
    from_position: Annotated[str | None, typer.Option(help="Capture from this source position")] = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Restart the task's execution (under a new epoch), optionally from a source position."""
    _set_control(task_id, zookeeper, restarts=True, from_position=from_position)
    console.print(f"task {task_id} restarting" + (f" from {from_position}" if from_position else ""))


@task_app.command("delete")
def task_delete(task_id: str, zookeeper: ZooKeeperOpt = None) -> None:
    from sluice.sync.tasks import TaskNotFoundError

    zk, store = _task_store(zookeeper)
    try:
        store.delete(task_id)
    except TaskNotFoundError:
        raise fail(f"no task {task_id!r}", 2) from None
    finally:
        zk.stop()
    console.print(f"task {task_id} deleted")


@worker_app.command("start")
def worker_start(
    group: Annotated[
        str, typer.Option(help="Worker group: workers of one group share its tasks")
    ] = "sluice-workers",
    name: Annotated[
        str | None, typer.Option(help="This worker's name (default: host name + random suffix)")
    ] = None,
    directory: Annotated[Path, typer.Option("--dir", help="Working directory (Spark checkpoints)")] = Path(
        ".sluice/worker"
    ),
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*])")] = None,
    session_timeout: Annotated[float, typer.Option(help="Group session timeout in seconds")] = 10.0,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Join a worker group and run the tasks it assigns to this worker, in the foreground."""
    import logging
    import signal as _signal
    import threading

    from sluice.sync.execution import TaskExecution
    from sluice.sync.worker import Membership, Worker, worker_name

    configure_logging("info")
    zk, store = _task_store(zookeeper)
    me = name or worker_name()
    stop = threading.Event()
    changed = threading.Event()

    @zk.client.ChildrenWatch("/tasks")
    def _on_tasks(children: list[str]) -> bool:
        changed.set()
        return not stop.is_set()

    from sluice.pipeline.session import spark_session

    logging.getLogger("pymysqlreplication").setLevel(logging.WARNING)
    spark = spark_session(spark_master, app=f"sluice-worker {me}")  # before joining: it takes seconds

    def start_task(task_id: str) -> object:
        return TaskExecution(
            task_id, store, worker=me, bootstrap=bootstrap, spark=spark, workdir=directory / me
        )

    membership = Membership(bootstrap, group, me, session_timeout_ms=int(session_timeout * 1000))
    worker = Worker(membership, store.ids, start_task, tasks_changed=changed, stop=stop)
    _signal.signal(_signal.SIGTERM, lambda *_: stop.set())
    _signal.signal(_signal.SIGINT, lambda *_: stop.set())
    err.print(f"worker {me} joining group {group} on {bootstrap}")
    try:
        worker.run()
    finally:
        spark.stop()
        zk.stop()
    err.print(f"worker {me} stopped")


@app.command("demo")
def demo(
    directory: ClusterDir = Path(".sluice/demo"),
    duration: Annotated[float, typer.Option(help="Seconds the generator writes changes")] = 40.0,
    rate: Annotated[float, typer.Option(help="Changes per second from the generator")] = 2000.0,
    target: Annotated[
        str | None, typer.Option(help="Target URL (default: SQLite in the demo directory)")
    ] = None,
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*])")] = None,
    keep: Annotated[bool, typer.Option(help="Leave the cluster running afterwards")] = False,
) -> None:
    """The whole platform on this machine: a 3-broker cluster, the generator writing changes, a
    Spark query applying them to SQLite, one broker killed with kill -9 in the middle, and a
    comparison of the target with the generator's ground truth. Exits 1 if they differ."""
    from sluice.ops.demo import run_demo

    ok = run_demo(
        directory, duration_s=duration, rate=rate, target=target, spark_master=spark_master,
        keep=keep, console=console,
    )  # fmt: skip
    raise typer.Exit(0 if ok else 1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

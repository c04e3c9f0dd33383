"""`sluice cluster` and `sluice broker`: run a local cluster and its brokers."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sluice.cli.common import (
    ClusterDir,
    console,
    err,
    fail,
    zookeeper_auth,
)
from sluice.cluster.layout import BrokerRegistration
from sluice.ops import launcher
from sluice.ops.logging_setup import configure as configure_logging

cluster_app = typer.Typer(no_args_is_help=True, help="Run a local cluster (ZooKeeper + brokers).")
broker_app = typer.Typer(no_args_is_help=True, help="Run and manage brokers.")


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
    hosts: Annotated[
        str,
        typer.Option(
            "--hosts",
            help="local: every process on 127.0.0.1; netns: every ZooKeeper node, broker and worker "
            "in its own network namespace with its own address on a private bridge (needs root)",
        ),
    ] = "local",
    zookeeper_nodes: Annotated[
        int, typer.Option("--zookeeper-nodes", help="Members of the cluster's own ZooKeeper ensemble")
    ] = 1,
    workers: Annotated[
        int, typer.Option("--workers", help="Sync workers to start (sluice worker start)")
    ] = 0,
    security: Annotated[
        str,
        typer.Option(
            "--security",
            help="none: PLAINTEXT; sasl_ssl: TLS with a local CA, SCRAM users (admin, the brokers'), "
            "ACLs, and client.properties for the admin user",
        ),
    ] = "none",
    override: Annotated[
        list[str] | None,
        typer.Option(
            "--override",
            help="key=value: a broker config key (the broker config file's names, e.g. "
            "auto.create.topics.enable=true, num.partitions=4) for every broker; repeatable",
        ),
    ] = None,
    rack: Annotated[
        list[str] | None,
        typer.Option(
            "--rack",
            help="ID=RACK: broker ID's broker.rack (shown in Metadata and DescribeCluster, sent by "
            "clients with client.rack); repeatable, one per broker, e.g. --rack 1=a --rack 2=b",
        ),
    ] = None,
) -> None:
    """Start ZooKeeper (unless --zookeeper names one), N brokers and K workers; wait until ready."""
    from sluice.ops.netns import NetnsError
    from sluice.properties import ConfigError

    started = time.monotonic()
    try:
        settings = launcher.broker_overrides(override or [])
        racks = launcher.broker_racks(rack or [])
    except ConfigError as exc:
        raise fail(str(exc)) from None
    try:
        cluster = launcher.cluster_up(
            directory, brokers, zookeeper, zk_session_timeout_s=zk_session_timeout, hosts=hosts,
            zookeeper_nodes=zookeeper_nodes, workers=workers, security=security.lower(),
            broker_settings=settings, racks=racks,
        )  # fmt: skip
    except (RuntimeError, TimeoutError, ValueError, FileNotFoundError, NetnsError) as exc:
        raise fail(str(exc)) from None
    print(f"bootstrap.servers={cluster.bootstrap_servers}")
    print(f"metrics={','.join(cluster.metrics_urls())}")
    print(f"zookeeper={cluster.zookeeper}")
    if racks:
        print(f"racks={','.join(f'{b.broker_id}={b.rack}' for b in cluster.brokers if b.rack is not None)}")
    if cluster.client_properties is not None:
        print(f"client.properties={cluster.client_properties}")
    took_s = time.monotonic() - started
    err.print(
        f"[green]cluster up[/] in {took_s:.1f} s: {len(cluster.brokers)} broker(s), "
        f"{max(1, len(cluster.zookeeper_members))} ZooKeeper node(s), {len(cluster.workers)} worker(s), "
        f"hosts {cluster.hosts}, dir {cluster.directory}"
    )


@cluster_app.command("status")
def cluster_status(
    directory: ClusterDir = launcher.DEFAULT_DIR,
    zookeeper: Annotated[
        str | None,
        typer.Option(
            "--zookeeper",
            help="Inspect the cluster registered in this ensemble (HOST:PORT,.../CHROOT) instead of "
            "the local one in --dir",
        ),
    ] = None,
) -> None:
    """Per broker: id, address, pid, alive, controller; then partitions that need attention."""
    from sluice.cluster.zkstore import ZkStore

    cluster: launcher.LocalCluster | None = None
    if zookeeper is None:
        try:
            cluster = launcher.LocalCluster.load(directory.resolve())
        except FileNotFoundError as exc:
            raise fail(f"{exc}; or give --zookeeper") from None
        zookeeper = cluster.zookeeper
    auth = cluster.zk_auth() if cluster is not None else zookeeper_auth(zookeeper)
    from sluice.service.health import PartitionHealth, partition_health

    registered: dict[int, BrokerRegistration] = {}
    controller = -1
    zk_ok = True
    health: list[PartitionHealth] = []
    store = ZkStore(zookeeper, connect_timeout_s=5.0, auth=auth)
    try:
        store.start()
        registered = store.live_brokers()
        controller = store.controller_id()
        health = partition_health(store)
    except Exception as exc:
        zk_ok = False
        err.print(f"[yellow]ZooKeeper {zookeeper} is not reachable: {exc}[/]")
    finally:
        try:
            store.stop()
        except Exception:
            pass
    table = Table(title=f"cluster in {cluster.directory}" if cluster else f"cluster at {zookeeper}")
    for col in ("id", "address", "pid", "alive", "registered", "controller", "metrics port"):
        table.add_column(col)
    if cluster is not None:
        for b in cluster.brokers:
            alive = launcher.pid_alive(b.pid)
            table.add_row(
                str(b.broker_id),
                b.address,
                str(b.pid),
                "yes" if alive else "[red]no[/]",
                ("yes" if b.broker_id in registered else "[red]no[/]") if zk_ok else "?",
                "*" if b.broker_id == controller else "",
                str(b.metrics_port) if b.metrics_port is not None else "-",
            )
    else:  # a cluster on other hosts: what the brokers registered is all there is to see
        for broker_id, reg in sorted(registered.items()):
            # the listeners clients use: the inter-broker one (reg.host:reg.port) may take none
            clients = [(n, h, p) for n, _, h, p in reg.endpoints if (h, p) != (reg.host, reg.port)]
            address = (
                ",".join(f"{n}://{h}:{p}" for n, h, p in clients) if len(clients) > 1
                else f"{clients[0][1]}:{clients[0][2]}" if clients else f"{reg.host}:{reg.port}"
            )  # fmt: skip
            leads = "*" if broker_id == controller else ""
            table.add_row(str(broker_id), address, str(reg.pid), "?", "yes", leads, "?")
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
    print(f"zookeeper={zookeeper}")
    if cluster is not None:
        print(f"metrics={','.join(cluster.metrics_urls())}")
    print(f"live_brokers={len(registered) if zk_ok else '?'}")
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
    config_file: Annotated[
        Path | None,
        typer.Option("--config", help="A broker.properties file (Kafka's server.properties keys)"),
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value over the file's, repeatable")
    ] = None,
    broker_id: Annotated[int | None, typer.Option("--id", help="broker.id")] = None,
    port: Annotated[int | None, typer.Option("--port", help="the listener's port")] = None,
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="log.dirs")] = None,
    zookeeper: Annotated[
        str | None,
        typer.Option(
            "--zookeeper",
            help="zookeeper.connect: HOST:PORT or HOST:PORT/CHROOT (ensemble: comma-separated "
            "HOST:PORT); chroot defaults to /sluice",
        ),
    ] = None,
    host: Annotated[str | None, typer.Option("--host", help="the listener's host")] = None,
    zk_session_timeout: Annotated[float | None, typer.Option(help="seconds")] = None,
    auto_create_topics: Annotated[
        bool | None, typer.Option(help="Create unknown topics on metadata requests")
    ] = None,
    log_level: Annotated[str, typer.Option()] = "INFO",
) -> None:
    """Run one broker in the foreground. Settings come from --config, then the flags, then
    --override; an unknown key, a bad value or a listener that cannot be bound stops it before it
    touches its data directory or ZooKeeper."""
    from sluice.broker.broker import DataDirInUseError, run_broker
    from sluice.broker.config import BrokerConfig
    from sluice.broker.server import ListenerBindError
    from sluice.cluster.zkstore import BrokerIdInUseError
    from sluice.metrics import MetricsBindError
    from sluice.ops.ports import ADDRESS_IN_USE_EXIT
    from sluice.ops.private_files import private_umask
    from sluice.properties import ConfigError

    try:
        values = broker_properties(
            config_file, override or [], broker_id=broker_id, port=port, data_dir=data_dir,
            zookeeper=zookeeper, host=host, zk_session_timeout=zk_session_timeout,
            auto_create_topics=auto_create_topics,
        )  # fmt: skip
        config = BrokerConfig.from_properties(values, source=str(config_file or "broker settings"))
    except ConfigError as exc:
        raise fail(str(exc)) from None
    configure_logging(log_level)
    private_umask()  # its data directory, segments and checkpoints are its owner's alone
    try:
        run_broker(config)
    except (ListenerBindError, MetricsBindError) as exc:
        raise fail(str(exc), ADDRESS_IN_USE_EXIT if exc.errno == errno.EADDRINUSE else 1) from None
    except (BrokerIdInUseError, DataDirInUseError, ConnectionError, ValueError) as exc:
        raise fail(str(exc)) from None
    except OSError as exc:
        raise fail(f"broker {config.broker_id} could not start: {exc}") from None


def broker_properties(
    config_file: Path | None,
    overrides: list[str],
    *,
    broker_id: int | None = None,
    port: int | None = None,
    data_dir: Path | None = None,
    zookeeper: str | None = None,
    host: str | None = None,
    zk_session_timeout: float | None = None,
    auto_create_topics: bool | None = None,
) -> dict[str, str]:
    """The broker's keys: the file's, then the flags', then the overrides'."""
    from sluice.broker.config import parse_listener
    from sluice.properties import ConfigError, layered, parse_overrides

    flags = {
        "broker.id": broker_id,
        "log.dirs": data_dir,
        "zookeeper.connect": zookeeper,
        "zookeeper.session.timeout.ms": None
        if zk_session_timeout is None
        else round(zk_session_timeout * 1000),
        "auto.create.topics.enable": None if auto_create_topics is None else str(auto_create_topics).lower(),
    }
    values = layered(config_file, flags)
    if host is not None or port is not None:
        try:
            file_host, file_port = parse_listener(values.get("listeners", "PLAINTEXT://127.0.0.1:9092"))
        except ValueError as exc:
            raise ConfigError(f"{config_file}: bad value for 'listeners': {exc}") from None
        values["listeners"] = f"PLAINTEXT://{host if host is not None else file_host}:{port or file_port}"
    values.update(parse_overrides(overrides))
    return values


@broker_app.command("stop")
def broker_stop(
    broker_id: Annotated[int, typer.Argument(help="Broker id")],
    directory: ClusterDir = launcher.DEFAULT_DIR,
    timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds to wait for the broker to exit before killing it (default: its stop bound, "
            "the controlled-shutdown timeout + the ZooKeeper session timeout + 15 s)"
        ),
    ] = None,
) -> None:
    """Controlled shutdown: leadership moves to other in-sync replicas, then the broker exits."""
    try:
        cluster = launcher.LocalCluster.load(directory.resolve())
        b = cluster.broker(broker_id)
    except (FileNotFoundError, KeyError) as exc:
        raise fail(str(exc)) from None
    if not launcher.pid_alive(b.pid):
        raise fail(f"broker {broker_id} (pid {b.pid}) is not running")
    timeout_s = launcher.broker_stop_bound_s(cluster) if timeout is None else timeout
    started = time.monotonic()
    if launcher.stop_process(b.pid, timeout_s=timeout_s).killed:
        raise fail(
            f"broker {broker_id} (pid {b.pid}) was still running {timeout_s:.0f} s after SIGTERM and was "
            f"killed (SIGKILL): its logs are recovered at its next start; see {b.log_file} for why it "
            "did not stop"
        )
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

    auth = zookeeper_auth(zookeeper)
    if zookeeper is None:
        try:
            local = launcher.LocalCluster.load(directory.resolve())
        except FileNotFoundError as exc:
            raise fail(f"{exc}; or give --zookeeper") from None
        zookeeper, auth = local.zookeeper, local.zk_auth()
    store = ZkStore(zookeeper, auth=auth)
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

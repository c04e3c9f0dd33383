"""What every command group of the ``sluice`` command line shares: consoles, options, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from sluice.ops import launcher
from sluice.security.client import PLAINTEXT, ClientSecurity

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
CommandConfig = Annotated[
    Path | None,
    typer.Option(
        "--command-config",
        envvar="SLUICE_COMMAND_CONFIG",
        help="Kafka client properties (security.protocol, sasl.mechanism, sasl.username, sasl.password, "
        "ssl.ca.location) [default: the local cluster's client.properties when -b names its brokers]",
    ),
]


def client_security(command_config: Path | None, bootstrap: str | None) -> ClientSecurity:
    """How the command authenticates to the brokers: ``--command-config``'s properties; without
    one, the local cluster's (.sluice/cluster) client.properties if ``bootstrap`` names one of
    its brokers (the admin's password goes to no other address); else PLAINTEXT."""
    from sluice.properties import ConfigError

    try:
        if command_config is not None:
            return ClientSecurity.from_file(command_config)
        try:
            cluster = launcher.LocalCluster.load(launcher.DEFAULT_DIR.resolve())
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            return PLAINTEXT
        ours = {b.address for b in cluster.brokers}
        if cluster.client_properties is not None and ours & set((bootstrap or DEFAULT_BOOTSTRAP).split(",")):
            return cluster.client_security()
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    return PLAINTEXT


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` to stderr and give the exit to raise. The message is printed as
    it is: never read as markup (it may quote a file name or a value with brackets) and never
    broken into lines at the terminal's width (scripts and tests read it whole)."""
    err.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    return typer.Exit(code)


ZooKeeperOpt = Annotated[
    str | None,
    typer.Option(
        "--zookeeper",
        envvar="SLUICE_ZOOKEEPER",
        help="HOST:PORT/CHROOT (default: $SLUICE_ZOOKEEPER, else the local cluster in .sluice/cluster)",
    ),
]


ZK_AUTH_ENV = "SLUICE_ZOOKEEPER_AUTH_FILE"


def zookeeper_auth(zookeeper: str | None):  # type: ignore[no-untyped-def]
    """The ZooKeeper credentials of a command (`sluice.cluster.zkstore.ZkAuth`, None: none):
    ``$SLUICE_ZOOKEEPER_AUTH_FILE``'s (a properties file with zookeeper.auth.username and
    zookeeper.auth.password); else the local cluster's (.sluice/cluster) when ``zookeeper`` is
    None or names its ZooKeeper (the password goes to no other address); else none."""
    import os

    from sluice.cluster.zkstore import load_zk_auth_file, parse_zookeeper_connect
    from sluice.properties import ConfigError

    try:
        if os.environ.get(ZK_AUTH_ENV):
            return load_zk_auth_file(Path(os.environ[ZK_AUTH_ENV]).expanduser())
        try:
            cluster = launcher.LocalCluster.load(launcher.DEFAULT_DIR.resolve())
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            return None
        if zookeeper is None or parse_zookeeper_connect(zookeeper) == parse_zookeeper_connect(
            cluster.zookeeper
        ):
            return cluster.zk_auth()
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    except ValueError:
        return None
    return None


def local_zookeeper() -> str:
    """The local cluster's ZooKeeper (in .sluice/cluster), or exit 2 saying to give one."""
    try:
        return launcher.LocalCluster.load(launcher.DEFAULT_DIR.resolve()).zookeeper
    except FileNotFoundError:
        raise fail("no --zookeeper given and no local cluster in .sluice/cluster", 2) from None


def services(  # type: ignore[no-untyped-def]
    zookeeper: str | None, bootstrap: str | None = None, command_config: Path | None = None
):
    """The service layer's connections (`sluice.service.context.Services`), as the manager's API
    has them: the CLI and the API call the same functions."""
    from sluice.service.context import open_services
    from sluice.service.errors import ServiceError

    security = client_security(command_config, bootstrap)
    try:
        return open_services(
            zookeeper or local_zookeeper(),
            bootstrap or DEFAULT_BOOTSTRAP,
            security=security,
            zk_auth=zookeeper_auth(zookeeper),
        )
    except ServiceError as exc:
        raise fail(str(exc)) from None


def task_store(zookeeper: str | None, auth: object = None):  # type: ignore[no-untyped-def]
    """A TaskStore on the given ZooKeeper, or on the local cluster's; ``auth`` (a ZkAuth) or
    else :func:`zookeeper_auth`'s credentials."""
    from sluice.cluster.zkstore import ZkAuth, ZkStore
    from sluice.sync.tasks import TaskStore

    if auth is None:
        auth = zookeeper_auth(zookeeper)
    assert auth is None or isinstance(auth, ZkAuth)
    if zookeeper is None:
        zookeeper = local_zookeeper()
    store = ZkStore(zookeeper, connect_timeout_s=10.0, auth=auth)
    try:
        store.start()
    except ConnectionError as exc:
        raise fail(str(exc)) from None
    return store, TaskStore(store.client)


def parse_seconds(text: str, what: str) -> float:
    from sluice.sync.tasks import parse_duration

    try:
        return parse_duration(text)
    except ValueError:
        raise fail(f"{what} must be a positive duration like 1s, 500ms or 2.5, not {text!r}", 2) from None

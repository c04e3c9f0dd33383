"""`sluice manager`: the web console, REST API, metrics and alarms; and its users."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sluice.cli.common import (
    DEFAULT_BOOTSTRAP,
    ZooKeeperOpt,
    console,
    err,
    fail,
    local_zookeeper,
    zookeeper_auth,
)

manager_app = typer.Typer(no_args_is_help=True, help="The manager: web console, REST API, metrics, alarms.")
user_app = typer.Typer(no_args_is_help=True, help="Users of the manager and their roles.")
manager_app.add_typer(user_app, name="user")


@manager_app.command("start")
def manager_start(
    config_file: Annotated[
        Path | None, typer.Option("--config", help="A manager.properties file (deploy/config/)")
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value over the file's, repeatable")
    ] = None,
    port: Annotated[int | None, typer.Option("--port", help="manager.port [default: 8090]")] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="manager.host [default: 127.0.0.1]; 0.0.0.0 for all")
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
    """Serve the console and the API (FastAPI on uvicorn) in the foreground; prints
    `manager=http://HOST:PORT` once it serves. On a cluster without users it creates `admin`
    with a random password and prints it once."""
    import signal
    import threading

    from sluice.manager.config import ManagerConfig
    from sluice.manager.server import ManagerBindError, run_manager
    from sluice.ops.logging_setup import configure as configure_logging
    from sluice.properties import ConfigError, layered
    from sluice.service.errors import ServiceError

    try:
        flags = {"manager.port": port, "manager.host": host, "bootstrap.servers": bootstrap,
                 "zookeeper.connect": zookeeper}  # fmt: skip
        values = layered(config_file, flags, override or [])
        values.setdefault("bootstrap.servers", DEFAULT_BOOTSTRAP)
        if "zookeeper.connect" not in values:
            values["zookeeper.connect"] = local_zookeeper()
        if not any(k.startswith("zookeeper.auth.") for k in values):
            auth = zookeeper_auth(values["zookeeper.connect"])  # the local cluster's, or the env's
            if auth is not None:
                values.update(auth.properties())
        config = ManagerConfig.from_properties(values, source=str(config_file or "manager settings"))
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    configure_logging("info")
    try:
        handle = run_manager(config.zookeeper, config.bootstrap, config=config)
    except (ManagerBindError, ServiceError) as exc:
        raise fail(str(exc)) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if handle.initial_admin:
        user, password = handle.initial_admin
        err.print(f"no users yet: created {user!r} (admin); change the password after logging in")
        print(f"manager_user={user}")
        print(f"manager_password={password}")
    print(f"manager={handle.url}", flush=True)
    if handle.metrics_url:
        print(f"metrics={handle.metrics_url}", flush=True)
    try:
        stop.wait()
    finally:
        handle.stop()
    err.print("manager stopped")


def _users(zookeeper: str | None):  # type: ignore[no-untyped-def]
    from sluice.cli.common import task_store
    from sluice.manager.auth import UserStore

    zk, _ = task_store(zookeeper)
    return zk, UserStore(zk.client)


def _read_password(prompt: bool) -> str:
    if prompt and sys.stdin.isatty():
        return typer.prompt("password", hide_input=True, confirmation_prompt=True)
    line = sys.stdin.readline().rstrip("\n")
    if not line:
        raise fail("no password on standard input", 2)
    return line


@user_app.command("add")
def user_add(
    user: str,
    role: Annotated[str, typer.Option(help="viewer, operator or admin")] = "viewer",
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Add a user; the password is read from the terminal (or one line of standard input)."""
    from sluice.manager.auth import UserError

    password = _read_password(prompt=True)
    zk, users = _users(zookeeper)
    try:
        users.add(user, password, role)
    except UserError as exc:
        raise fail(str(exc), 2) from None
    finally:
        zk.stop()
    console.print(f"user {user} added with role {role}")


@user_app.command("passwd")
def user_passwd(user: str, zookeeper: ZooKeeperOpt = None) -> None:
    """Set a user's password (read like `add`); the user's existing logins end."""
    from sluice.manager.auth import UserError

    password = _read_password(prompt=True)
    zk, users = _users(zookeeper)
    try:
        users.update(user, password=password)
    except KeyError:
        raise fail(f"no user {user!r}", 2) from None
    except UserError as exc:
        raise fail(str(exc), 2) from None
    finally:
        zk.stop()
    console.print(f"password of {user} changed")


@user_app.command("list")
def user_list(zookeeper: ZooKeeperOpt = None) -> None:
    zk, users = _users(zookeeper)
    try:
        table = Table("user", "role")
        for u in users.list():
            table.add_row(u["user"], u["role"])
    finally:
        zk.stop()
    console.print(table)


@user_app.command("delete")
def user_delete(user: str, zookeeper: ZooKeeperOpt = None) -> None:
    zk, users = _users(zookeeper)
    try:
        users.delete(user)
    except KeyError:
        raise fail(f"no user {user!r}", 2) from None
    finally:
        zk.stop()
    console.print(f"user {user} deleted")

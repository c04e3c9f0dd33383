"""`sluice user add|delete|list`: SASL users (SCRAM credentials in ZooKeeper), as Kafka's
``kafka-configs --alter --add-config 'SCRAM-SHA-512=[password=...]' --entity-type users``.

The password is read from ``--password-file``, the ``SLUICE_USER_PASSWORD`` variable or a
prompt, never from the command line (anyone on the host can read a command line). Brokers read
credentials at each authentication: a change applies to the next connection."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from sluice.cli.common import ZooKeeperOpt, console, fail, local_zookeeper, zookeeper_auth
from sluice.security.scram import DEFAULT_ITERATIONS, MECHANISMS, CredentialError

user_app = typer.Typer(
    no_args_is_help=True, help="SASL users: SCRAM credentials brokers check clients against."
)

MechanismOpt = Annotated[
    list[str] | None,
    typer.Option("--mechanism", help="SCRAM-SHA-256 or SCRAM-SHA-512, repeatable (default: both)"),
]
PASSWORD_ENV = "SLUICE_USER_PASSWORD"


def _store(zookeeper: str | None):  # type: ignore[no-untyped-def]
    from sluice.cluster.zkstore import connect
    from sluice.security.credentials import CredentialStore

    try:
        client = connect(
            zookeeper or local_zookeeper(), auth=zookeeper_auth(zookeeper), connect_timeout_s=10.0
        )
    except ConnectionError as exc:
        raise fail(str(exc)) from None
    return client, CredentialStore(client)


def _mechanisms(given: list[str] | None) -> tuple[str, ...]:
    names = tuple(m.upper() for m in given or MECHANISMS)
    unknown = [m for m in names if m not in MECHANISMS]
    if unknown:
        raise fail(f"--mechanism {', '.join(unknown)}: use SCRAM-SHA-256 or SCRAM-SHA-512", 2)
    return names


def _password(password_file: Path | None) -> str:
    if password_file is not None:
        try:
            return password_file.read_text().rstrip("\n")
        except OSError as exc:
            raise fail(f"--password-file {password_file}: {exc.strerror or exc}", 2) from None
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    return str(typer.prompt("password", hide_input=True, confirmation_prompt=True))


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="the user name (principal User:<name>)")],
    password_file: Annotated[
        Path | None,
        typer.Option("--password-file", help=f"read the password from this file (or {PASSWORD_ENV})"),
    ] = None,
    mechanism: MechanismOpt = None,
    iterations: Annotated[
        int, typer.Option("--iterations", help="SCRAM iterations (4096..16384)")
    ] = DEFAULT_ITERATIONS,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Create a user or change its password."""
    mechanisms = _mechanisms(mechanism)
    password = _password(password_file)
    client, store = _store(zookeeper)
    try:
        store.set_password(name, password, mechanisms, iterations)
    except CredentialError as exc:
        raise fail(str(exc), 2) from None
    finally:
        client.stop()
        client.close()
    console.print(f"user={name} mechanisms={','.join(mechanisms)} iterations={iterations}", highlight=False)


@user_app.command("delete")
def user_delete(
    name: Annotated[str, typer.Argument(help="the user name")],
    mechanism: MechanismOpt = None,
    zookeeper: ZooKeeperOpt = None,
) -> None:
    """Remove a user's credentials (all, or the mechanisms given). Open connections stay; new
    ones are refused."""
    client, store = _store(zookeeper)
    try:
        removed = store.delete(name, _mechanisms(mechanism) if mechanism else None)
    except CredentialError as exc:
        raise fail(str(exc), 2) from None
    finally:
        client.stop()
        client.close()
    if not removed:
        raise fail(f"user {name!r} has no such credentials; `sluice user list` shows the users", 1)
    console.print(f"user={name} deleted=true", highlight=False)


@user_app.command("list")
def user_list(zookeeper: ZooKeeperOpt = None) -> None:
    """Every user and its mechanisms (never a credential)."""
    client, store = _store(zookeeper)
    try:
        users = store.users()
    finally:
        client.stop()
        client.close()
    for u in users:
        mechs = ",".join(f"{m}:{c.iterations}" for m, c in sorted(u.scram.items()))
        console.print(f"user={u.user} mechanisms={mechs}", highlight=False)
    console.print(f"users={len(users)}", highlight=False)

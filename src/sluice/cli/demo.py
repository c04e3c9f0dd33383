"""`sluice demo`: the whole platform on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sluice.cli.common import (
    ClusterDir,
    console,
)


def demo(
    directory: ClusterDir = Path(".sluice/demo"),
    duration: Annotated[float, typer.Option(help="Seconds the generator writes changes")] = 40.0,
    rate: Annotated[float, typer.Option(help="Changes per second from the generator")] = 2000.0,
    target: Annotated[
        str | None,
        typer.Option(help="Target URL without a password (PGPASSWORD in the environment; default: SQLite)"),
    ] = None,
    spark_master: Annotated[str | None, typer.Option(help="Spark master URL (default local[*])")] = None,
    keep: Annotated[bool, typer.Option(help="Leave the cluster running afterwards")] = False,
    security: Annotated[
        str,
        typer.Option(
            help="none, or sasl_ssl: TLS, SCRAM users and ACLs; every client of the demo authenticates"
        ),
    ] = "none",
    source: Annotated[
        str,
        typer.Option(
            help="generator (the built-in generator); mariadb: a private MariaDB captured by two "
            "workers through schema changes, a re-snapshot, an added table and a refused row, then verified; "
            "postgresql: a private PostgreSQL captured from a logical slot through a key change, an ALTER "
            "TABLE, a TRUNCATE and a TOASTed column left alone, then verified"
        ),
    ] = "generator",
) -> None:
    """The whole platform on this machine: a 3-broker cluster, the generator writing changes, a
    Spark query applying them to SQLite, one broker killed with kill -9 in the middle, and a
    comparison of the target with the generator's ground truth. Exits 1 if they differ or a step
    failed; SIGTERM or Ctrl-C stops everything it started and exits 128 + the signal's number."""
    from sluice.cli.apply import PASSWORD_IN_URL
    from sluice.cli.common import fail
    from sluice.ops.demo import Stopped, run_demo, stop_on_signals
    from sluice.security.secrets import url_has_password

    if target and url_has_password(target):
        raise fail(PASSWORD_IN_URL, 2)
    from sluice.ops.launcher import SECURITY_MODES

    if security not in SECURITY_MODES:
        raise fail(f"--security must be one of {', '.join(SECURITY_MODES)}, not {security!r}", 2)
    if source not in ("generator", "mariadb", "postgresql"):
        raise fail(f"--source must be generator, mariadb or postgresql, not {source!r}", 2)
    if source != "generator" and (security != "none" or spark_master):
        raise fail(
            f"--source {source} runs without --security and --spark-master (its workers use local Spark)", 2
        )
    stop_on_signals()
    try:
        if source == "mariadb":
            from sluice.ops.demo_mariadb import run_mariadb_demo

            ok = run_mariadb_demo(directory, duration_s=duration, target=target, keep=keep, console=console)
        elif source == "postgresql":
            from sluice.ops.demo_postgres import run_postgres_demo

            ok = run_postgres_demo(directory, duration_s=duration, target=target, keep=keep, console=console)
        else:
            ok = run_demo(
                directory, duration_s=duration, rate=rate, target=target, spark_master=spark_master,
                keep=keep, console=console, security=security,
            )  # fmt: skip
    except Stopped:
        ok = False
    stopped = Stopped.seen()
    if stopped is not None:  # raised, or noted while the demo was stopping what it started
        what = "the cluster left running (--keep)" if keep else "everything it started is stopped"
        console.print(f"demo stopped by {stopped.name}: {what}", markup=False, highlight=False)
        raise typer.Exit(128 + stopped.value)
    raise typer.Exit(0 if ok else 1)

"""`sluice incident` and `sluice chaos`: replay the incidents, random faults with a check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sluice.cli.common import (
    console,
    fail,
)
from sluice.ops.logging_setup import configure as configure_logging

incident_app = typer.Typer(no_args_is_help=True, help="Replay the incidents Sluice is built against.")
chaos_app = typer.Typer(no_args_is_help=True, help="Random faults under a verifiable load, then a check.")


def _print_result(result: object) -> bool:
    from sluice.chaos.results import IncidentResult

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
        if len(r.acknowledged_by_writer) > 1:
            console.print(
                f"   by writer ({r.label}): "
                + "; ".join(
                    f"{w} {n:,} acknowledged, {r.lost_by_writer.get(w, 0):,} lost"
                    for w, n in sorted(r.acknowledged_by_writer.items())
                )
            )
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


#: Other names an incident answers to (issue 20 calls C rf1-maintenance).
ALIASES = {"rf1-maintenance": "single-replica-shutdown"}
AGAINST = ("sluice", "kafka", "connect")


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
    hosts: Annotated[
        str,
        typer.Option(
            help="local (127.0.0.1; a ZooKeeper cut goes through a proxy) or netns (each broker and "
            "ZooKeeper member in its own network namespace; faults are dropped packets; needs root)"
        ),
    ] = "local",
    security: Annotated[
        str, typer.Option(help="none, or sasl_ssl: TLS, SCRAM users and ACLs; every client authenticates")
    ] = "none",
    against: Annotated[
        str,
        typer.Option(
            help="sluice, or kafka: the same drill on a local Apache Kafka 3.9.1 cluster it starts and "
            "stops (A and C; for B and D it prints what of them applies to Kafka and exits 0), or "
            "connect: D on Sluice and then on Kafka Connect with Debezium's JDBC sink (zombie-task "
            "only; a line per stack; what Connect's target holds is reported as observed)"
        ),
    ] = "sluice",
    attempts: Annotated[
        int,
        typer.Option(
            help="--against connect: how many times the drill runs (a stop lands mid-batch by chance)"
        ),
    ] = 3,
    target: Annotated[
        str,
        typer.Option(
            help="zombie-task: where its task applies: sqlite, mysql (a database on the drill's MariaDB) "
            "or delta (Delta tables under the drill's directory)"
        ),
    ] = "sqlite",
) -> None:
    """Replay an incident and print the checker's rows and the verdict; exits 1 if a guarantee broke."""
    from sluice.chaos.incidents import INCIDENTS, run_incident
    from sluice.chaos.zombie import TARGETS

    name = ALIASES.get(name, name)
    if name not in INCIDENTS:
        raise fail(f"unknown incident {name!r}; `sluice incident list` shows them")
    if against not in AGAINST:
        raise fail(f"--against must be one of {', '.join(AGAINST)}, not {against!r}", 2)
    if target not in TARGETS or (target != "sqlite" and (name != "zombie-task" or against != "sluice")):
        raise fail(f"--target ({', '.join(TARGETS)}) is the zombie-task drill's target, on Sluice", 2)
    if against == "connect":
        if name != "zombie-task" or hosts != "local" or security != "none" or bootstrap is not None:
            raise fail(
                "--against connect runs incident D (zombie-task) on a Kafka Connect stack the drill starts "
                "itself: name zombie-task, and leave out --hosts, --security and --bootstrap",
                2,
            )
        _drill_logging()
        raise typer.Exit(_run_against_connect(directory, seed, attempts))
    if against == "kafka":
        if hosts != "local" or security != "none" or bootstrap is not None:
            raise fail(
                "--against kafka runs on 127.0.0.1 without security on a Kafka cluster the drill starts "
                "itself: leave out --hosts, --security and --bootstrap",
                2,
            )
        _drill_logging()
        raise typer.Exit(_run_against_kafka(name, directory / f"{name}-kafka", seed))
    if bootstrap is not None and not local:
        raise fail(
            "drills inject faults into broker processes (kill -9, SIGSTOP, cutting ZooKeeper), which "
            "needs a cluster on this machine that the drill starts itself: use --local"
        )
    _drill_logging()
    try:
        result = run_incident(
            name, directory / name, seed=seed, hosts=hosts, security=security, target=target
        )
    except ValueError as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(0 if _print_result(result) else 1)


def _run_against_connect(directory: Path, seed: int, attempts: int) -> int:
    """Incident D on both stacks, one after the other: Sluice's drill (`--local`, its checks and
    verdict), then Kafka Connect with Debezium's JDBC sink (each attempt's timeline and what its
    target held, the ``zombie_connect`` line); then a ``zombie stack=S ... missing= extra=
    different=`` line per stack. Exit 0 when both ran: what Connect's target holds is an
    observation, not a guarantee; exit 1 when Sluice's drill failed or no Connect attempt ran."""
    from sluice.chaos.incidents import run_incident
    from sluice.peers.connect import CONNECT_VERSION, DEBEZIUM_VERSION, JDBC_SINK_VERSION, ConnectError
    from sluice.peers.kafka import KAFKA_VERSION, PeerError
    from sluice.peers.zombie_connect import run_zombie_connect, summary

    if attempts < 1:
        raise fail("--attempts must be at least 1", 2)
    print("stack=sluice: sluice incident run zombie-task --local")
    try:
        ours = run_incident("zombie-task", directory / "zombie-task", seed=seed)
    except ValueError as exc:
        raise fail(str(exc)) from None
    ours_ok = _print_result(ours)
    print(
        f"stack=connect: against=connect kafka={KAFKA_VERSION} connect={CONNECT_VERSION} "
        f"debezium_mysql={DEBEZIUM_VERSION} jdbc_sink={JDBC_SINK_VERSION}"
    )
    try:
        results = run_zombie_connect(directory / "zombie-task-connect", seed=seed, attempts=attempts)
    except (ConnectError, PeerError) as exc:
        raise fail(str(exc)) from None
    m, e, d = ours.target_rows_wrong if ours.target_rows_wrong is not None else ("?", "?", "?")
    print(f"zombie stack=sluice verdict={'pass' if ours_ok else 'fail'} missing={m} extra={e} different={d}")
    print(f"zombie stack=connect {summary(results)}")
    return 0 if ours_ok and any(a.error is None for a in results) else 1


def _run_against_kafka(name: str, directory: Path, seed: int) -> int:
    """Drill ``name`` on Apache Kafka: the checker's rows and verdict as for Sluice (exit 0 or 1);
    for an incident with no Kafka drill, what of it applies to Kafka (exit 0)."""
    from sluice.peers.incidents_kafka import AGAINST as KAFKA
    from sluice.peers.incidents_kafka import NOT_APPLICABLE, run_incident_kafka
    from sluice.peers.kafka import PeerError

    print(f"against={KAFKA}")
    if name in NOT_APPLICABLE:
        console.print(NOT_APPLICABLE[name])
        print("verdict=not-applicable")
        return 0
    try:
        result = run_incident_kafka(name, directory, seed=seed)
    except PeerError as exc:
        raise fail(str(exc)) from None
    for line in figure_lines(result):
        print(line)
    return 0 if _print_result(result) else 1


def figure_lines(result: object) -> list[str]:
    """The checker's rows and the checks as key=value lines (quoted where a value has spaces),
    printed by --against kafka before the tables so a script or docs/guide/drills.md can take them."""
    import shlex

    from sluice.chaos.results import IncidentResult

    assert isinstance(result, IncidentResult)
    lines = [
        f"incident_row run={shlex.quote(r.label)} acknowledged={r.acknowledged} read={r.read} lost={r.lost} "
        f"duplicated={r.duplicated} out_of_order={r.out_of_order} failed_sends={r.failed_sends} "
        f"errors={shlex.quote(','.join(f'{k} x{v}' for k, v in r.errors.items()) or 'none')}"
        for r in result.rows
    ]
    lines += [
        f"incident_check held={'yes' if c.passed else 'no'} guarantee={shlex.quote(c.guarantee)}"
        for c in result.checks
    ]
    return lines


@chaos_app.command("run")
def chaos_run(
    duration: Annotated[float, typer.Option(help="Seconds of faults")] = 60.0,
    seed: Annotated[str, typer.Option(help="A seed, or a range A..B for several runs")] = "1",
    faults: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated: kill,pause,shutdown,zk-cut; with --hosts netns also "
            "partition,zk-partition,one-way,netem,zk-kill [default: every kind the hosts allow]"
        ),
    ] = None,
    hosts: Annotated[
        str, typer.Option(help="local (127.0.0.1) or netns (each process in its own network namespace)")
    ] = "local",
    zookeeper_nodes: Annotated[
        int | None, typer.Option(help="Members of the ZooKeeper ensemble [default: 1 local, 3 netns]")
    ] = None,
    directory: Annotated[Path, typer.Option("--dir")] = Path(".sluice/chaos"),
    java_client: Annotated[
        bool,
        typer.Option(
            "--java-client",
            help="Kafka's Java client also produces and reads beside librdkafka, and is checked "
            "(needs the jars of scripts/peers.sh, and javac)",
        ),
    ] = False,
) -> None:
    """Random faults against a 3-broker cluster under an idempotent acks=all load; then heal,
    wait for quiescence and check. Same seed, same fault schedule."""
    import collections

    from sluice.chaos.random_run import FAULT_KINDS, LOCAL_FAULT_KINDS, run_chaos
    from sluice.peers.kafka import PeerError

    seeds = _seed_range(seed)
    default = FAULT_KINDS if hosts == "netns" else LOCAL_FAULT_KINDS
    kinds = tuple(k.strip() for k in (faults or ",".join(default)).split(",") if k.strip())
    nodes = zookeeper_nodes if zookeeper_nodes is not None else (3 if hosts == "netns" else 1)
    _drill_logging()
    all_ok = True
    total: collections.Counter[str] = collections.Counter()
    for s in seeds:
        try:
            run = run_chaos(
                directory / f"seed-{s}", seed=s, duration_s=duration, kinds=kinds, hosts=hosts,
                zookeeper_nodes=nodes, java_client=java_client,
            )  # fmt: skip
        except (ValueError, PeerError) as exc:
            raise fail(str(exc)) from None
        console.print(
            f"seed {s}: {len(run.schedule)} faults: "
            + "; ".join(f"{f.at_s:.0f}s {f.kind} {f.role} {f.duration_s:.0f}s" for f in run.schedule)
        )
        all_ok &= _print_result(run.result)
        row = run.result.rows[0]
        print(
            f"chaos seed={s} hosts={hosts} verdict={'pass' if run.result.ok else 'fail'} "
            f"acknowledged={row.acknowledged} lost={row.lost} duplicated={row.duplicated} "
            f"faults={sum(run.happened.values())}"
        )
        for extra in run.result.rows[1:]:  # Kafka's Java client's, with --java-client
            print(
                f"chaos seed={s} client=java acknowledged={extra.acknowledged} lost={extra.lost} "
                f"duplicated={extra.duplicated} out_of_order={extra.out_of_order}"
            )
        total.update(run.happened)
    for kind in sorted(total):
        print(f"faults_{kind.split(' ')[0]}{_variant(kind)}={total[kind]}")
    missing = [k for k in kinds if not any(h.split(" ")[0] == k for h in total)]
    print(f"fault_kinds_missing={','.join(missing) or 'none'}")
    raise typer.Exit(0 if all_ok else 1)


def _variant(kind: str) -> str:
    """'zk-kill (leader)' -> '[leader]': a printable key suffix for a fault's variant."""
    _, _, rest = kind.partition(" (")
    return f"[{rest.rstrip(')').replace(' ', '-')}]" if rest else ""


def _drill_logging() -> None:
    """Warnings only; and the drills' own ZooKeeper sessions lose their server on purpose, so
    kazoo's reconnect warnings are noise here."""
    import logging

    configure_logging("WARNING")
    logging.getLogger("kazoo").setLevel(logging.ERROR)


def _seed_range(text: str) -> list[int]:
    lo, _, hi = text.partition("..")
    try:
        first, last = int(lo), int(hi or lo)
    except ValueError:
        raise fail(f"--seed must be a number or a range like 1..10, not {text!r}", 2) from None
    if last < first:
        raise fail(f"--seed range {text!r} is empty: write the lower seed first", 2)
    return list(range(first, last + 1))


@chaos_app.command("sync")
def chaos_sync(
    duration: Annotated[float, typer.Option(help="Seconds of workload and faults, per seed")] = 60.0,
    seed: Annotated[str, typer.Option(help="A seed, or a range A..B for several runs")] = "1",
    faults: Annotated[
        str,
        typer.Option(
            help="Comma-separated fault kinds, 'all', -KIND to leave one out, or 'none': worker-kill "
            "(also kills the worker's Spark driver), worker-pause, broker-kill, broker-pause, "
            "target-pg-down, target-sqlite-lock"
        ),
    ] = "all",
    statements: Annotated[
        str,
        typer.Option(
            help="Statement kinds of the workload: 'all', a comma-separated list, or -KIND to leave one "
            "out (e.g. -truncate): insert, update, update-key, delete, multi-insert, multi-update, "
            "multi-delete, upsert-dup, replace, tx-same-row, truncate, idle"
        ),
    ] = "all",
    values: Annotated[
        str,
        typer.Option(
            help="Value kinds that can be left out: nul-text, non-utf8-binary, invalid-date ('all' or -KIND)"
        ),
    ] = "all",
    types: Annotated[
        str,
        typer.Option(
            help="Column types of the tables that hold every type: 'all', a comma-separated list, or -TYPE "
            "to leave one out (e.g. -geometry,-point); names are the type catalog's columns without c_: "
            "tinyint, bigint_u, dec65, float, bit64, date, timestamp6, time6, year, char, latin1, "
            "binary, blob, enum, set, json, geometry, ... (chaos/type_catalog.py)"
        ),
    ] = "all",
    directory: Annotated[Path, typer.Option("--dir", help="Working directory (removed afterwards)")] = Path(
        ".sluice/chaos-sync"
    ),
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the directory: logs, task.yaml, targets")
    ] = False,
    catch_up_timeout: Annotated[
        float, typer.Option(help="Seconds allowed for the targets to catch up")
    ] = 240.0,
    source: Annotated[
        str,
        typer.Option(
            help="mariadb, or postgresql: a PostgreSQL source captured by two tasks (two slots) into two "
            "PostgreSQL targets, with its own workload (--statements: insert, multi-insert, update, "
            "update-key, update-toast, update-other, delete, truncate, alter, rollback) and its own fault, "
            "source-walsender-kill"
        ),
    ] = "mariadb",
    target: Annotated[
        str,
        typer.Option(
            help="The target of the task beside the PostgreSQL one (MariaDB source): sqlite, mysql "
            "(a database of its own on the MariaDB server) or delta (Delta tables under the seed's "
            "directory, written by the workers' Spark); the fault target-sqlite-lock is only for sqlite"
        ),
    ] = "sqlite",
) -> None:
    """MariaDB under a seeded workload, captured by two tasks (SQLite and PostgreSQL targets) on two
    workers through seeded faults; then quiescence and a row-by-row comparison of the source with
    each target. Same seed, same statements and fault schedule. Exits 1 unless every row matches."""
    from sluice.chaos.sync_faults import SYNC_FAULT_KINDS
    from sluice.chaos.sync_run import SECOND_TARGETS, run_sync_chaos
    from sluice.chaos.sync_workload import STATEMENT_KINDS, VALUE_KINDS, parse_kinds
    from sluice.chaos.workload_values import TYPE_NAMES

    seeds = _seed_range(seed)
    if source == "postgresql" and target != "sqlite":
        raise fail(
            "--target applies to the MariaDB source (a PostgreSQL source's run has two PostgreSQL targets)", 2
        )
    if source == "postgresql":
        from sluice.chaos.pg_workload import PG_STATEMENT_KINDS
        from sluice.chaos.sync_pg import PG_SOURCE_FAULT_KINDS, run_pg_sync_chaos

        try:
            pg_faults = (
                () if faults.strip() == "none" else parse_kinds(faults, PG_SOURCE_FAULT_KINDS, "fault")
            )
            pg_statements = parse_kinds(statements, PG_STATEMENT_KINDS, "statement kind")
        except ValueError as exc:
            raise fail(str(exc), 2) from None
        _drill_logging()
        reports = run_pg_sync_chaos(
            directory, seeds, duration_s=duration, fault_kinds=pg_faults, statement_kinds=pg_statements,
            keep=keep, catch_up_timeout_s=catch_up_timeout, out=lambda line: print(line, flush=True),
        )  # fmt: skip
        raise typer.Exit(0 if reports and all(r.ok for r in reports) else 1)
    if source != "mariadb":
        raise fail(f"--source must be mariadb or postgresql, not {source!r}", 2)
    try:
        fault_kinds = () if faults.strip() == "none" else parse_kinds(faults, SYNC_FAULT_KINDS, "fault")
        statement_kinds = parse_kinds(statements, STATEMENT_KINDS, "statement kind")
        value_kinds = () if values.strip() == "none" else parse_kinds(values, VALUE_KINDS, "value kind")
        type_names = parse_kinds(types, TYPE_NAMES, "column type")
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    if target not in SECOND_TARGETS:
        raise fail(f"--target must be one of {', '.join(SECOND_TARGETS)}, not {target!r}", 2)
    if target != "sqlite":
        fault_kinds = tuple(k for k in fault_kinds if k != "target-sqlite-lock")
    _drill_logging()
    reports = run_sync_chaos(
        directory, seeds, duration_s=duration, fault_kinds=fault_kinds, statement_kinds=statement_kinds,
        value_kinds=value_kinds, types=type_names, keep=keep, catch_up_timeout_s=catch_up_timeout,
        out=lambda line: print(line, flush=True), second_target=target,
    )  # fmt: skip
    raise typer.Exit(0 if reports and all(r.ok for r in reports) else 1)

"""`sluice incident` and `sluice chaos`: replay the incidents, random faults with a check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sluice.ops.cli.common import (
    console,
    fail,
)
from sluice.ops.logging_setup import configure as configure_logging

incident_app = typer.Typer(no_args_is_help=True, help="Replay the incidents Sluice is built against.")
chaos_app = typer.Typer(no_args_is_help=True, help="Random faults under a verifiable load, then a check.")


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

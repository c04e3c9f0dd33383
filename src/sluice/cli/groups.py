"""`sluice group`: consumer groups."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from sluice.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CommandConfig,
    client_security,
    console,
    fail,
)

group_app = typer.Typer(no_args_is_help=True, help="Consumer groups: list, describe, reset offsets.")


@group_app.command("list")
def group_list(bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, command_config: CommandConfig = None) -> None:
    """Every group any broker coordinates, with its state and protocol type."""
    from sluice.service.admin_client import AdminClient

    with AdminClient(bootstrap, security=client_security(command_config, bootstrap)) as admin:
        groups = admin.list_groups()
    table = Table(title=f"{len(groups)} group(s)")
    for col in ("group", "state", "protocol type", "coordinator"):
        table.add_column(col)
    for g in groups:
        table.add_row(g["group_id"], g["group_state"], g["protocol_type"], str(g["coordinator"]))
    console.print(table)


@group_app.command("describe")
def group_describe(
    group: str, bootstrap: Bootstrap = DEFAULT_BOOTSTRAP, command_config: CommandConfig = None
) -> None:
    """State, members (client id, host, assignment) and per-partition committed offset, end and lag."""
    from sluice.service.context import Services
    from sluice.service.errors import ServiceError
    from sluice.service.groups import group_view

    try:
        view = group_view(
            Services(None, bootstrap, security=client_security(command_config, bootstrap)), group
        )
    except ServiceError as exc:
        raise fail(str(exc)) from None
    console.print(
        f"group [bold]{group}[/]: state {view['state']}, protocol {view['protocol_type'] or '-'}"
        f"/{view['protocol'] or '-'}, coordinator {view['coordinator']}"
    )
    members = Table(title=f"{len(view['members'])} member(s)")
    for col in ("member", "client id", "host", "assignment"):
        members.add_column(col)
    for m in view["members"]:
        members.add_row(
            m["member_id"],
            m["client_id"],
            m["host"],
            ", ".join(f"{t}-{p}" for t, p in m["assignment"]) or "-",
        )
    console.print(members)
    offsets = Table(title="offsets")
    for col in ("topic", "partition", "committed", "end", "lag", "member"):
        offsets.add_column(col)
    for row in view["partitions"]:
        offsets.add_row(
            row["topic"],
            str(row["partition"]),
            str(row["committed"]) if row["committed"] is not None else "-",
            str(row["end"]) if row["end"] is not None else "-",
            str(row["lag"]) if row["lag"] is not None else "-",
            row["member"] or "-",
        )
    console.print(offsets)
    print(f"total_lag={view['total_lag']}")


@group_app.command("reset-offsets")
def group_reset_offsets(
    group: str,
    topic: Annotated[str, typer.Option("--topic")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    command_config: CommandConfig = None,
) -> None:
    """Set the group's committed offsets for TOPIC. Refused while the group has members."""
    from sluice.service.context import Services
    from sluice.service.errors import ServiceError
    from sluice.service.groups import reset_group_offsets

    chosen = [to_earliest, to_latest, to_offset is not None]
    if sum(chosen) != 1:
        raise fail("give exactly one of --to-earliest, --to-latest, --to-offset N")
    target = "earliest" if to_earliest else "latest" if to_latest else int(to_offset or 0)
    try:
        svc = Services(None, bootstrap, security=client_security(command_config, bootstrap))
        reset = reset_group_offsets(svc, group, topic, target)
    except ServiceError as exc:
        raise fail(str(exc).replace("to: must be", "--to-offset must be")) from None
    result = {int(p): off for p, off in reset["offsets"].items()}
    table = Table(title=f"group {group}: offsets of {topic} reset")
    for col in ("partition", "new offset"):
        table.add_column(col)
    for p, off in sorted(result.items()):
        table.add_row(str(p), str(off))
    console.print(table)

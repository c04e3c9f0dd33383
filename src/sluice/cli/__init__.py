"""The ``sluice`` command line: one module per command group, assembled here."""

from __future__ import annotations

import typer

from sluice.cli.acl import acl_app
from sluice.cli.apply import apply
from sluice.cli.cluster import broker_app, cluster_app
from sluice.cli.demo import demo
from sluice.cli.dlq import dlq_app
from sluice.cli.drills import chaos_app, incident_app
from sluice.cli.groups import group_app
from sluice.cli.manager import manager_app
from sluice.cli.peers import peer_app
from sluice.cli.tasks import task_app, worker_app
from sluice.cli.topics import consume, produce, topic_app
from sluice.cli.users import user_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="Sluice: change-data sync on a replicated log.",
    # a traceback must never print local variables: they hold task definitions and passwords
    pretty_exceptions_show_locals=False,
)  # fmt: skip
for _sub, _name in (
    (cluster_app, "cluster"), (broker_app, "broker"), (topic_app, "topic"), (group_app, "group"),
    (incident_app, "incident"), (chaos_app, "chaos"), (task_app, "task"), (worker_app, "worker"),
    (manager_app, "manager"), (acl_app, "acl"), (user_app, "user"), (dlq_app, "dlq"),
    (peer_app, "peer"),
):  # fmt: skip
    app.add_typer(_sub, name=_name)
for _fn, _name in ((produce, "produce"), (consume, "consume"), (apply, "apply"), (demo, "demo")):
    app.command(_name)(_fn)


def main() -> None:
    app()

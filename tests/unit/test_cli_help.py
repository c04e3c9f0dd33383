"""Every command and sub-command's ``--help`` renders: a reader on a new host starts there.

Before the fix, ``sluice broker start --help`` crashed: its help text held ``[/CHROOT]``, which
the help renderer reads as a closing markup tag (MarkupError)."""

from __future__ import annotations

import typer
import typer.main
from typer.testing import CliRunner

from sluice.cli import app


def _command_paths() -> list[list[str]]:
    root = typer.main.get_command(app)
    paths: list[list[str]] = []

    def walk(cmd: object, path: list[str]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(root, [])
    return paths


def test_every_command_and_sub_command_renders_its_help() -> None:
    paths = _command_paths()
    assert ["broker", "start"] in paths and ["cluster", "up"] in paths  # the walk reaches sub-commands
    runner = CliRunner()
    broken = {}
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], terminal_width=100)
        if result.exit_code != 0 or "Usage" not in result.output:
            broken[" ".join(path) or "sluice"] = repr(result.exception) or result.output[-300:]
    assert not broken, broken

"""The README and the user guide say what the code does: every `sluice ...` command in their
shell blocks is a command the CLI has, with options it takes; the README stays a door (at most
250 lines) whose links lead somewhere; the guide's landing page shows the README's picture.
`mkdocs build --strict` (scripts/test.sh) checks the guide's own links and anchors."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from sluice.cli import app

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
GUIDE = sorted((ROOT / "docs").rglob("*.md"))
SHELL_BLOCK = re.compile(r"^```(?:sh|bash)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def shell_commands(path: Path) -> list[str]:
    """The `sluice ...` commands of a page's sh/bash blocks, continuation lines joined, comments
    and what comes before `sluice` on the line (a pipe, variables) dropped."""
    found = []
    for block in SHELL_BLOCK.findall(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("#"):
                continue
            match = re.search(r"(?:^|[\s|;&])sluice\s+(.*)$", line)
            if match:
                found.append(match.group(1))
    return found


@functools.cache
def cli() -> Any:
    return typer.main.get_command(app)


def check_command(words: list[str]) -> str | None:
    """None if the CLI has this command and each of its --options; else what is wrong."""
    command = cli()  # typer's own click: a group is what has commands
    path = ["sluice"]
    while hasattr(command, "commands") and words:
        # `pause|resume|restart` in the docs: each alternative must be a command
        names = words[0].split("|")
        subs = [command.commands.get(n) for n in names]
        if any(s is None for s in subs):
            return f"{' '.join(path)} has no command {words[0]!r}"
        command, path, words = subs[0], [*path, names[0]], words[1:]
    options = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
    for word in words:
        for flag in re.findall(r"(?:^|\[|\|)(--[a-z][a-z0-9-]*)", word):
            if flag not in options:
                return f"{' '.join(path)} has no option {flag}"
    return None


def test_a_command_or_option_the_cli_lacks_is_caught() -> None:
    assert check_command(["task", "create", "--file", "t.yaml"]) is None
    assert check_command(["task", "pause|resume", "t"]) is None
    assert check_command(["task", "create", "--fiel", "t.yaml"]) == "sluice task create has no option --fiel"
    assert check_command(["task", "pause|stop", "t"]) == "sluice task has no command 'pause|stop'"
    assert check_command(["topic", "describe", "[--bogus]"]) == "sluice topic describe has no option --bogus"


def test_the_readme_is_a_door_not_the_house() -> None:
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", [README, *GUIDE], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_sluice_command_shown_is_one_the_cli_has(page: Path) -> None:
    wrong = []
    for text in shell_commands(page):
        words = shlex.split(text.replace("[", " [").replace("]", "] "), comments=False)
        words = [w for w in words if w not in ("[", "]", "...")]
        problem = check_command(words)
        if problem:
            wrong.append(f"sluice {text}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_the_readme_quickstart_runs_a_task_and_kills_a_broker() -> None:
    commands = shell_commands(README)
    for expected in ("cluster up", "task create", "task status", "task verify", "broker restart"):
        assert any(c.startswith(expected) for c in commands), expected
    assert "kill -9" in README.read_text()


def test_the_readmes_links_lead_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_guides_landing_page_shows_the_readmes_picture() -> None:
    def picture(text: str) -> str:
        start = text.index("```text\n")
        return text[start : text.index("```\n", start + 8)]

    assert picture((ROOT / "docs" / "index.md").read_text()) == picture(README.read_text())

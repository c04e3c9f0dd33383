"""Stopping a command a test started, and every process it started.

A command such as `sluice demo` starts ZooKeeper, brokers, MariaDB and a Spark driver JVM,
several in sessions of their own (they outlive a `sluice cluster up`): killing the command, or
its process group, leaves them running after the test, and after the suite (issue 32: a demo
killed at the test's deadline left ZooKeeper and three brokers behind). `CommandTree` notes the
command's descendants while it runs (a child is its descendant only until the command exits:
then it is re-parented), and `stop` gives the command SIGTERM and time to stop them itself,
then SIGKILLs whatever of them is still running. A pid is noted with its start time, so a pid
the system gave to another process since is never killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19]), fields[0]


def descendants(pid: int) -> dict[int, int]:
    """The processes below `pid` now (children, theirs, ...): pid to start time."""
    children: dict[int, list[int]] = {}
    started: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                children.setdefault(found[0], []).append(int(entry))
                started[int(entry)] = found[1]
    out: dict[int, int] = {}
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        if child not in out and child in started:
            out[child] = started[child]
            stack.extend(children.get(child, []))
    return out


def _running(pid: int, start: int) -> bool:
    found = _stat(pid)
    return found is not None and found[1] == start and found[2] not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


class CommandTree:
    """A command a test started (`proc`) and the processes it started, as far as seen."""

    def __init__(self, proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
        self.proc = proc
        self.seen: dict[int, int] = {}
        self.note()

    def note(self) -> None:
        """Note the command's descendants now (call it while the command runs: at each poll)."""
        if self.proc.poll() is None:
            self.seen.update(descendants(self.proc.pid))

    def left_running(self) -> list[str]:
        """The command lines of the processes it started that still run."""
        return [f"{pid} {_cmdline(pid)}" for pid, start in sorted(self.seen.items()) if _running(pid, start)]

    def stop(self, grace_s: float = 60.0, linger_s: float = 10.0) -> list[str]:
        """SIGTERM, and `grace_s` for the command to stop what it started; then SIGKILL for the
        command, and for every process it started still running `linger_s` after it ended (a
        Spark driver JVM ends by itself when the Python process that started it is gone, a
        moment later). Returns what had to be killed (empty when the command cleaned up)."""
        self.note()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self.proc.poll() is None and time.monotonic() < deadline:
                self.note()
                time.sleep(0.2)
        killed = []
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)  # no new children while we look
            self.note()
            killed.append(f"{self.proc.pid} {_cmdline(self.proc.pid)}")
            self.proc.kill()
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + linger_s
        while self.left_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid, start in sorted(self.seen.items()):
            if _running(pid, start):
                killed.append(f"{pid} {_cmdline(pid)}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return killed


def run_command(
    argv: list[str], timeout_s: float, *, env: dict[str, str] | None = None, grace_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)` for a command
    that starts processes of its own (`sluice demo`, `sluice chaos sync`, `sluice incident run`):
    at the timeout, `subprocess.run` kills the command alone; this stops it and every process it
    started (CommandTree.stop), then raises TimeoutExpired with its output so far. The output
    goes through files, so that a command stopping slowly never blocks on a full pipe."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env)
        tree = CommandTree(proc)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            tree.note()
            time.sleep(0.5)
        timed_out = proc.poll() is None
        if timed_out:
            tree.stop(grace_s, linger_s=min(10.0, grace_s))
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout_s, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(argv, proc.wait(), stdout, stderr)
